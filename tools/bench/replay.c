/* Replayed training steps (replay.h). */
#include "replay.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int replay_init(replay_t *r, loomComm_t comm, const replay_model_t *m, double spf)
{
    memset(r, 0, sizeof(*r));
    r->comm = comm, r->m = m, r->spf = spf;
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
    return 0;
}

void replay_free(replay_t *r)
{
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
    if (ranks_max(r->comm, 0) < 0) FAIL("barrier (allreduce of one double)");
    double t0 = ranks_now();
    const replay_model_t *m = r->m;
    for (int i = 0; i < m->n; i++) {
        if (compute_on && r->spf > 0) compute(r, i);
        float *p = r->flat + r->off[i];
        if (mode == REPLAY_PER_TENSOR) {
            if (loomAllReduce(p, p, m->t[i].count, loomFloat32, loomSum, r->comm, NULL) !=
                loomSuccess)
                FAIL("loomAllReduce");
        } else if (mode == REPLAY_FUSED) {
            if (loomFusionEnqueue(fx, p, m->t[i].count, loomFloat32, loomSum, (uint64_t)i, NULL,
                                  NULL, NULL, NULL) != loomSuccess)
                FAIL("loomFusionEnqueue");
        }
    }
    if (mode == REPLAY_FUSED && loomFusionWaitAll(fx) != loomSuccess) FAIL("loomFusionWaitAll");
    if (mode == REPLAY_MONOLITHIC && loomAllReduce(r->flat, r->flat, m->total, loomFloat32, loomSum,
                                                   r->comm, NULL) != loomSuccess)
        FAIL("loomAllReduce (monolithic)");
    double t = ranks_now() - t0;
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
