/* Replayed training steps (replay.h). */
#include "replay.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#ifdef LOOM_HAVE_CUDA
#include "cudrv.h"
#endif
#include "ranks.h"

#ifndef LOOM_DATA_DIR
#define LOOM_DATA_DIR "data/fusion"
#endif

int replay_load(const char *what, replay_model_t *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    char path[1024];
    if (strchr(what, '/') || strstr(what, ".csv"))
        snprintf(path, sizeof(path), "%s", what);
    else
        snprintf(path, sizeof(path), "%s/%s.csv",
                 getenv("LOOM_FUSION_DATA") ? getenv("LOOM_FUSION_DATA") : LOOM_DATA_DIR, what);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s (a model name of data/fusion, or a path)", path,
                 strerror(errno));
        return -1;
    }
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(m->name, sizeof(m->name), "%.*s", (int)strcspn(base, "."), base);
    char line[512];
    int lineno = 0, cap = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        if (line[0] == '#' || line[0] == '\n' || strncmp(line, "name,", 5) == 0) continue;
        char name[96], dtype[32];
        unsigned long long count;
        double flops;
        if (sscanf(line, "%95[^,],%llu,%31[^,],%lf", name, &count, dtype, &flops) != 4 ||
            count == 0) {
            snprintf(err, errlen, "%s:%d: not name,count,dtype,flops", path, lineno);
            fclose(f);
            replay_free_model(m);
            return -1;
        }
        if (strcmp(dtype, "float32") != 0) {
            snprintf(err, errlen, "%s:%d: dtype %s (only float32 lists are replayed)", path, lineno,
                     dtype);
            fclose(f);
            replay_free_model(m);
            return -1;
        }
        if (m->n == cap) {
            cap = cap ? cap * 2 : 256;
            replay_tensor_t *nt = realloc(m->t, sizeof(*nt) * (size_t)cap);
            if (!nt) {
                fclose(f);
                replay_free_model(m);
                return snprintf(err, errlen, "out of memory"), -1;
            }
            m->t = nt;
        }
        replay_tensor_t *t = &m->t[m->n++];
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->count = (size_t)count;
        t->flops = flops;
        m->total += t->count;
        m->flops += flops;
    }
    fclose(f);
    if (m->n == 0) return snprintf(err, errlen, "%s: no tensors", path), -1;
    return 0;
}

void replay_free_model(replay_model_t *m)
{
    free(m->t);
    m->t = NULL;
    m->n = 0;
}

/* Exact-sum inputs: small integers, so that every order of summation gives the same float. */
static float input(int rank, int i, size_t j)
{
    return (float)((rank + 1) * (int)(j % 7 + 1) + i % 5);
}

static float expected(int nranks, int i, size_t j)
{
    return (float)((int)(j % 7 + 1) * nranks * (nranks + 1) / 2 + nranks * (i % 5));
}

static void fill(replay_t *r)
{
    for (int i = 0; i < r->m->n; i++) {
        float *p = r->flat + r->off[i];
        for (size_t j = 0; j < r->m->t[i].count; j++)
            p[j] = input(r->rank, i, j);
    }
}

/* Elements that are not the exact sum, or, with a relative bound tol > 0 (a compressed wire),
 * that are further from it than tol times the largest expected magnitude. */
static uint64_t check(replay_t *r, double tol)
{
    uint64_t bad = 0;
    double scale = (double)expected(r->nranks, 4, 6); /* the largest expected value */
    for (int i = 0; i < r->m->n; i++) {
        const float *p = r->flat + r->off[i];
        for (size_t j = 0; j < r->m->t[i].count; j++)
            if (tol > 0 ? fabs((double)p[j] - (double)expected(r->nranks, i, j)) > tol * scale
                        : p[j] != expected(r->nranks, i, j)) {
                if (bad == 0)
                    fprintf(stderr, "rank %d: tensor %d (%s) element %zu: %g, expected %g\n",
                            r->rank, i, r->m->t[i].name, j, (double)p[j],
                            (double)expected(r->nranks, i, j));
                bad++;
            }
    }
    return bad;
}

#ifdef LOOM_HAVE_CUDA
/* The device side: the rank's GPU made current, a stream, the buffer. 0, or -1 with r->err. */
static int dev_init(replay_t *r)
{
    const char *why = NULL;
    const cudrv_t *d = cudrv_get(&why);
    if (d == NULL) {
        snprintf(r->err, sizeof(r->err), "--mem device: %s", why ? why : "no usable GPU");
        return -1;
    }
    int local = r->comm->lay.local_rank;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    CUresult cr = d->cuDeviceGet(&dev, local % d->ndev);
    if (cr == CUDA_SUCCESS) cr = d->cuDevicePrimaryCtxRetain(&ctx, dev);
    if (cr == CUDA_SUCCESS) cr = d->cuCtxSetCurrent(ctx);
    if (cr == CUDA_SUCCESS) cr = d->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
    if (cr != CUDA_SUCCESS) {
        snprintf(r->err, sizeof(r->err), "rank %d: --mem device: GPU %d: %s", r->rank,
                 local % d->ndev, cudrv_err(cr));
        return -1;
    }
    r->stream = (cudaStream_t)st;
    if (loomMemAlloc(&r->dflat, r->m->total * sizeof(float)) != loomSuccess) {
        snprintf(r->err, sizeof(r->err), "rank %d: loomMemAlloc(%zu floats): %s", r->rank,
                 r->m->total, loomGetLastError(NULL));
        return -1;
    }
    return 0;
}

/* Host buffer to the GPU (to_dev) or back, on the replay's stream, waited for. */
static int host_dev_copy(replay_t *r, bool to_dev)
{
    const cudrv_t *d = cudrv_get(NULL);
    size_t b = r->m->total * sizeof(float);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)r->dflat;
    CUresult cr = to_dev ? d->cuMemcpyHtoDAsync(p, r->flat, b, (CUstream)r->stream)
                         : d->cuMemcpyDtoHAsync(r->flat, p, b, (CUstream)r->stream);
    if (cr == CUDA_SUCCESS) cr = d->cuStreamSynchronize((CUstream)r->stream);
    if (cr != CUDA_SUCCESS) {
        snprintf(r->err, sizeof(r->err), "rank %d: copying the tensors %s the GPU: %s", r->rank,
                 to_dev ? "to" : "from", cudrv_err(cr));
        return -1;
    }
    return 0;
}

static int dev_sync(replay_t *r)
{
    CUresult cr = cudrv_get(NULL)->cuStreamSynchronize((CUstream)r->stream);
    if (cr == CUDA_SUCCESS) return 0;
    snprintf(r->err, sizeof(r->err), "rank %d: waiting for the step's stream: %s", r->rank,
             cudrv_err(cr));
    return -1;
}
#endif

int replay_init(replay_t *r, loomComm_t comm, const replay_model_t *m, double spf, bool dev)
{
    memset(r, 0, sizeof(*r));
    r->comm = comm, r->m = m, r->spf = spf, r->dev = dev;
    loomCommUserRank(comm, &r->rank);
    loomCommCount(comm, &r->nranks);
    r->off = calloc((size_t)m->n, sizeof(size_t));
    r->flat = malloc(m->total * sizeof(float));
    if (!r->off || !r->flat) {
        snprintf(r->err, sizeof(r->err), "out of memory (%zu floats)", m->total);
        return -1;
    }
    size_t o = 0;
    for (int i = 0; i < m->n; i++)
        r->off[i] = o, o += m->t[i].count;
    fill(r);
    if (dev) {
#ifdef LOOM_HAVE_CUDA
        return dev_init(r);
#else
        snprintf(r->err, sizeof(r->err), "--mem device: this build has no CUDA support");
        return -1;
#endif
    }
    return 0;
}

void replay_free(replay_t *r)
{
#ifdef LOOM_HAVE_CUDA
    if (r->dflat) loomMemFree(r->dflat);
    if (r->stream) cudrv_get(NULL)->cuStreamDestroy((CUstream)r->stream);
    r->dflat = NULL, r->stream = NULL;
#endif
    free(r->flat);
    free(r->off);
    r->flat = NULL, r->off = NULL;
}

/* Backward's work on tensor i's layer: a busy loop (the core is busy, as a framework's compute
 * thread would be). */
static void compute(const replay_t *r, int i)
{
    double until = ranks_now() + r->m->t[i].flops * r->spf;
    while (ranks_now() < until) {
    }
}

#define FAIL(what)                                                                                 \
    do {                                                                                           \
        snprintf(r->err, sizeof(r->err), "rank %d: %s: %s", r->rank, what,                         \
                 loomGetLastError(r->comm));                                                       \
        return -1;                                                                                 \
    } while (0)

double replay_step(replay_t *r, replay_mode_t mode, loomFusion_t fx, bool compute_on)
{
    fill(r);
#ifdef LOOM_HAVE_CUDA
    if (r->dev && host_dev_copy(r, true) != 0) return -1;
#endif
    if (ranks_max(r->comm, 0) < 0) FAIL("barrier (allreduce of one double)");
    double t0 = ranks_now();
    const replay_model_t *m = r->m;
    float *base = r->dev ? (float *)r->dflat : r->flat;
    for (int i = 0; i < m->n; i++) {
        if (compute_on && r->spf > 0) compute(r, i);
        float *p = base + r->off[i];
        if (mode == REPLAY_PER_TENSOR) {
            if (loomAllReduce(p, p, m->t[i].count, loomFloat32, loomSum, r->comm, r->stream) !=
                loomSuccess)
                FAIL("loomAllReduce");
        } else if (mode == REPLAY_FUSED) {
            if (loomFusionEnqueue(fx, p, m->t[i].count, loomFloat32, loomSum, (uint64_t)i,
                                  r->stream, NULL, NULL, NULL) != loomSuccess)
                FAIL("loomFusionEnqueue");
        }
    }
    if (mode == REPLAY_FUSED && loomFusionWaitAll(fx) != loomSuccess) FAIL("loomFusionWaitAll");
    if (mode == REPLAY_MONOLITHIC && loomAllReduce(base, base, m->total, loomFloat32, loomSum,
                                                   r->comm, r->stream) != loomSuccess)
        FAIL("loomAllReduce (monolithic)");
#ifdef LOOM_HAVE_CUDA
    if (r->dev && dev_sync(r) != 0) return -1; /* all-reduced means the GPU is done */
#endif
    double t = ranks_now() - t0;
#ifdef LOOM_HAVE_CUDA
    if (r->dev && host_dev_copy(r, false) != 0) return -1;
#endif
    double tol = 0;
    loomFusionConfig_t c = LOOM_FUSION_CONFIG_INITIALIZER;
    loomFusionStats_t st;
    if (mode == REPLAY_FUSED && loomFusionGetConfig(fx, &c) == loomSuccess &&
        c.wire != loomFusionWireExact && loomFusionGetStats(fx, &st) == loomSuccess)
        tol = st.maxRelError > 0 ? st.maxRelError : 1e-300; /* 0 reported: exact after all */
    if (mode != REPLAY_COMPUTE_ONLY) r->wrong += check(r, tol);
    double all = ranks_max(r->comm, t);
    if (all < 0) FAIL("allreduce of the step time");
    return all;
}

loomFusion_t replay_fusion(replay_t *r, size_t bucket, size_t first, size_t segment,
                           uint64_t cycle_us, int wire)
{
    loomFusionConfig_t c = LOOM_FUSION_CONFIG_INITIALIZER;
    c.wire = wire;
    c.bucketBytes = bucket;
    c.firstBucketBytes = first;
    c.segmentBytes = segment;
    c.cycleUs = cycle_us;
    loomFusion_t fx = NULL;
    if (loomFusionCreate(&fx, r->comm, &c) != loomSuccess) {
        snprintf(r->err, sizeof(r->err), "rank %d: loomFusionCreate: %s", r->rank,
                 loomGetLastError(r->comm));
        return NULL;
    }
    return fx;
}
