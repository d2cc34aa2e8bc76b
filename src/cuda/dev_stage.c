/*
 * Device data crossing nodes (see dev_impl.h): pinned host memory and the host transports,
 * driven from core's progress thread (one per process) by a poll function per communicator
 * that never blocks. An allreduce on several nodes with the same number of GPUs each runs
 * hierarchically: reduce-scatter inside the node on the GPUs, an allreduce of this rank's shard
 * across nodes (pieces of LOOM_CUDA_STAGE_CHUNK: the copy of piece k+1 to the host overlaps the
 * network for piece k and the copy back of piece k-1), then an allgather inside the node.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev_impl.h"
#include "param.h"
#include "reduce.h"

/* ---- across nodes: pinned host memory, and the host part on core's progress thread ---- */

#define STAGE_POLL_JOBS 8      /* jobs one call of the poll function may finish */
#define STAGE_SPIN_NS 20000ull /* how long the poll spins for the stream, then its interval */

static uint64_t stage_poll(void *arg, bool *progressed);

loomResult_t dev_stage_open(dev_state_t *s)
{
    dev_host_t *h = s->h;
    /* Equal GPUs per node: the hierarchical allreduce (shards cross nodes between the ranks of
     * the same local index). Otherwise the whole buffer crosses through the staging copy of
     * the communicator, whose host algorithms know the layout. */
    s->stg.hier_ok = s->lay.n > 1;
    for (int nd = 0; nd < h->nnodes; nd++)
        if (h->node_start[nd + 1] - h->node_start[nd] != s->lay.n) s->stg.hier_ok = false;
    s->stg.staged = true; /* closed at dev_free even if opening fails half way */
    LOOM_CHECK(h->stage_open(h, s->stg.hier_ok ? s->lay.me : -1));
    if (h->progress_attach == NULL)
        return base_error(loomInternalError, LOG_CUDA,
                          "rank %d: core offers the device executor no progress thread", h->rank);
    LOOM_CHECK(h->progress_attach(h, stage_poll, s));
    s->stg.attached = true;
    INFO(LOG_CUDA, "device buffers cross %d nodes through pinned host memory (%s)", h->nnodes,
         s->stg.hier_ok ? "hierarchical allreduce" : "whole buffers");
    return loomSuccess;
}

static loomResult_t pinned(dev_state_t *s, uint8_t **p, size_t *have, size_t want)
{
    if (*have >= want && *p) return loomSuccess;
    if (*p) { /* an earlier job may still read it until the stream passes it: keep it */
        void **r = realloc(s->stg.retired, (size_t)(s->stg.nretired + 1) * sizeof(void *));
        if (r == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
        s->stg.retired = r;
        s->stg.retired[s->stg.nretired++] = *p;
        *p = NULL;
    }
    size_t sz = LOOM_MAX(want, (size_t)1 << 20);
    CUresult cr = s->drv.d->cuMemHostAlloc((void **)p, sz, CU_MEMHOSTALLOC_PORTABLE);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: pinning %zu bytes of host memory for staging: %s", s->h->rank,
                          sz, cudrv_err(cr));
    *have = sz;
    return loomSuccess;
}

static loomResult_t post_job(dev_state_t *s, const host_op_t *ops, int nops, uint32_t *val)
{
    stage_job_t *j = calloc(1, sizeof(*j) + (size_t)nops * sizeof(host_op_t));
    if (j == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
    j->val = ++s->stg.next_val;
    j->nops = nops;
    memcpy(j->ops, ops, (size_t)nops * sizeof(host_op_t));
    pthread_mutex_lock(&s->stg.qlock);
    FIFO_PUSH(&s->stg.q, j);
    pthread_mutex_unlock(&s->stg.qlock);
    s->h->progress_wake(s->h);
    *val = j->val;
    return loomSuccess;
}

#define STREAM_CU(call)                                                                            \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: %s: %s", s->h->rank,     \
                              #call, cudrv_err(r_));                                               \
    } while (0)

static loomResult_t stream_handoff(dev_state_t *s, CUstream st, uint32_t val)
{
    STREAM_CU(s->drv.d->cuStreamWriteValue32(st, s->xg.flags_dev, val, 0));
    return loomSuccess;
}

static loomResult_t stream_wait(dev_state_t *s, CUstream st, uint32_t val)
{
    STREAM_CU(
        s->drv.d->cuStreamWaitValue32(st, s->xg.flags_dev + 4, val, CU_STREAM_WAIT_VALUE_GEQ));
    return loomSuccess;
}

static loomResult_t refuse_capture(dev_state_t *s, const dev_op_t *o)
{
    return base_error(loomInvalidUsage, LOG_CUDA,
                      "rank %d: %s on device buffers across nodes cannot be captured in a CUDA "
                      "graph (its network part runs on a host proxy); capture same-node "
                      "communicators only",
                      s->h->rank, dev_kind_name(o->kind));
}

static void host_reduction(host_op_t *h, const dev_op_t *o)
{
    h->op = o->op;
    if (base_premul_index(o->op) >= 0) {
        h->scaled = true;
        memcpy(h->scale, o->scale_host, 8);
        h->op = loomSum;
    }
}

loomResult_t dev_stage_allreduce(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap)
{
    if (cap) return refuse_capture(s, o);
    int pm = base_premul_index(o->op);
    if (pm >= 0 && o->scale_dev && !s->stg.hier_ok)
        return base_error(loomInvalidUsage, LOG_CUDA,
                          "rank %d: a pre-multiplied sum with a device-resident scalar cannot "
                          "cross nodes with this layout (uneven GPUs per node)",
                          s->h->rank);
    size_t es = red_type_size(o->type);
    size_t off = 0, len = o->count;
    const char *src = o->send;
    char *dst = o->recv;
    if (s->stg.hier_ok) {
        /* reduce-scatter inside the node (sum; premul scaled there) */
        dev_args_t a;
        dev_seg_of(o->count, es, s->lay.n, s->lay.me, &off, &len);
        dev_args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        dev_set_reduction(&a, o, o->op == loomAvg ? loomSum : o->op);
        for (int j = 0; j < s->lay.n; j++) {
            if (j == s->lay.me) continue;
            size_t oj, lj;
            dev_seg_of(o->count, es, s->lay.n, j, &oj, &lj);
            a.io[j] = (dev_io_t){oj * es, lj * es, 0, len * es};
        }
        a.self_src = a.self_dst = off * es;
        a.self_len = len * es;
        LOOM_CHECK(dev_launch(s, &a, st));
        src = o->recv;
    }
    /* the shard (or the whole buffer) through the pinned ring, piece by piece */
    size_t chunk = LOOM_MAX(param_size(PARAM_CUDA_STAGE_CHUNK), 4096) / es * es;
    LOOM_CHECK(pinned(s, &s->stg.ring[0], &s->stg.ring_bytes, chunk));
    for (int i = 1; i < STAGE_RING; i++) {
        size_t have = s->stg.ring[i] ? s->stg.ring_bytes : 0;
        LOOM_CHECK(pinned(s, &s->stg.ring[i], &have, s->stg.ring_bytes));
    }
    size_t bytes = len * es, npieces = (bytes + chunk - 1) / chunk;
    uint32_t vals[STAGE_RING];
    for (size_t k = 0; npieces && k < npieces + STAGE_RING - 1; k++) {
        if (k < npieces) {
            size_t pos = k * chunk, pl = LOOM_MIN(chunk, bytes - pos);
            uint8_t *h = s->stg.ring[k % STAGE_RING];
            STREAM_CU(s->drv.d->cuMemcpyDtoHAsync(h, (CUdeviceptr)(uintptr_t)(src + off * es + pos),
                                                  pl, st));
            host_op_t hop = {.kind = OPK_ALLREDUCE,
                             .count = pl / es,
                             .type = o->type,
                             .root = -1,
                             .hsend = h,
                             .hrecv = h,
                             .cross = s->stg.hier_ok};
            if (!s->stg.hier_ok) {
                host_reduction(&hop, o);
            } else {
                /* the node's reduce-scatter already scaled a premul sum; avg divides once, by
                 * all ranks, after the sum across nodes */
                hop.op = pm >= 0 || o->op == loomAvg ? loomSum : o->op;
                if (o->op == loomAvg) hop.div = s->h->nranks;
            }
            LOOM_CHECK(post_job(s, &hop, 1, &vals[k % STAGE_RING]));
            LOOM_CHECK(stream_handoff(s, st, vals[k % STAGE_RING]));
        }
        long back = (long)k - (STAGE_RING - 1); /* the piece that left STAGE_RING-1 ago */
        if (back >= 0 && (size_t)back < npieces) {
            size_t pos = (size_t)back * chunk, pl = LOOM_MIN(chunk, bytes - pos);
            LOOM_CHECK(stream_wait(s, st, vals[back % STAGE_RING]));
            STREAM_CU(s->drv.d->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)(dst + off * es + pos),
                                                  s->stg.ring[back % STAGE_RING], pl, st));
        }
    }
    if (s->stg.hier_ok) {
        dev_args_t a;
        dev_args_init(s, &a, DEV_COPY, o->kind, o->recv, o->recv);
        for (int j = 0; j < s->lay.n; j++) {
            if (j == s->lay.me) continue;
            size_t oj, lj;
            dev_seg_of(o->count, es, s->lay.n, j, &oj, &lj);
            a.io[j] = (dev_io_t){off * es, len * es, oj * es, lj * es};
        }
        LOOM_CHECK(dev_launch(s, &a, st));
    }
    return loomSuccess;
}

/* Any other collective, or a run of send/recv, across nodes: whole buffers through pinned
 * memory, the host executor doing the network part. */
loomResult_t dev_stage_generic(dev_state_t *s, const dev_op_t *o, int nops, CUstream st, bool cap)
{
    if (cap) return refuse_capture(s, o);
    int p = s->h->nranks, r = s->h->rank;
    /* lay out every call's host input and output in the arena */
    size_t need = 0;
    size_t *in_off = calloc((size_t)nops * 2, sizeof(size_t));
    host_op_t *hops = calloc((size_t)nops, sizeof(host_op_t));
    loomResult_t res = loomSuccess;
    if (in_off == NULL || hops == NULL) {
        free(in_off);
        free(hops);
        return base_error(loomSystemError, LOG_CUDA, "out of memory");
    }
    size_t *sizes = in_off + nops;
    for (int i = 0; i < nops; i++) {
        const dev_op_t *q = &o[i];
        size_t S = q->count * red_type_size(q->type);
        size_t total =
            q->kind == OPK_ALLGATHER || q->kind == OPK_REDUCESCATTER || q->kind == OPK_ALLTOALL
                ? S * (size_t)p
                : S;
        sizes[i] = q->kind == OPK_ALLTOALL ? 2 * total : total;
        in_off[i] = need;
        need += (sizes[i] + 255) / 256 * 256;
    }
    res = pinned(s, &s->stg.arena, &s->stg.arena_bytes, need);
    for (int i = 0; i < nops && res == loomSuccess; i++) {
        const dev_op_t *q = &o[i];
        size_t S = q->count * red_type_size(q->type);
        uint8_t *h = s->stg.arena + in_off[i];
        host_op_t *hp = &hops[i];
        *hp = (host_op_t){.kind = q->kind,
                          .count = q->count,
                          .type = q->type,
                          .root = q->root,
                          .hsend = h,
                          .hrecv = h};
        host_reduction(hp, q);
        CUdeviceptr dsend = (CUdeviceptr)(uintptr_t)q->send;
        CUresult cr = CUDA_SUCCESS;
        switch (q->kind) {
        case OPK_BROADCAST:
            if (r == q->root) cr = s->drv.d->cuMemcpyDtoHAsync(h, dsend, S, st);
            break;
        case OPK_REDUCE:
        case OPK_REDUCESCATTER:
        case OPK_SEND:
            if (q->kind == OPK_REDUCESCATTER) {
                cr = s->drv.d->cuMemcpyDtoHAsync(h, dsend, S * (size_t)p, st);
                hp->hrecv = h + (size_t)r * S;
            } else {
                cr = s->drv.d->cuMemcpyDtoHAsync(h, dsend, S, st);
            }
            break;
        case OPK_ALLGATHER:
            hp->hsend = h + (size_t)r * S;
            cr = s->drv.d->cuMemcpyDtoHAsync(hp->hsend, dsend, S, st);
            break;
        case OPK_ALLTOALL:
            hp->hrecv = h + S * (size_t)p;
            cr = s->drv.d->cuMemcpyDtoHAsync(h, dsend, S * (size_t)p, st);
            break;
        default: break; /* receive: nothing goes in */
        }
        if (cr != CUDA_SUCCESS)
            res = base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: copy to host: %s", r,
                             cudrv_err(cr));
    }
    uint32_t val = 0;
    if (res == loomSuccess) res = post_job(s, hops, nops, &val);
    if (res == loomSuccess) res = stream_handoff(s, st, val);
    if (res == loomSuccess) res = stream_wait(s, st, val);
    for (int i = 0; i < nops && res == loomSuccess; i++) {
        const dev_op_t *q = &o[i];
        size_t S = q->count * red_type_size(q->type);
        CUdeviceptr drecv = (CUdeviceptr)(uintptr_t)q->recv;
        size_t out = 0;
        switch (q->kind) {
        case OPK_BROADCAST:
        case OPK_RECV:
        case OPK_REDUCESCATTER: out = S; break;
        case OPK_REDUCE: out = r == q->root ? S : 0; break;
        case OPK_ALLGATHER:
        case OPK_ALLTOALL: out = S * (size_t)p; break;
        default: break;
        }
        if (out == 0 || drecv == 0) continue;
        CUresult cr = s->drv.d->cuMemcpyHtoDAsync(drecv, hops[i].hrecv, out, st);
        if (cr != CUDA_SUCCESS)
            res = base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: copy to device: %s", r,
                             cudrv_err(cr));
    }
    free(in_off);
    free(hops);
    return res;
}

/* ---- the host part of each job, on core's progress thread ---- */

/* A job's host part begins: pre-multiplied inputs scaled, the host collectives started (they
 * return at once; stage_test drives them). */
static loomResult_t job_start(dev_state_t *s, stage_job_t *j, void **job)
{
    for (int i = 0; i < j->nops; i++) {
        host_op_t *o = &j->ops[i];
        /* the cross-node communicator has one rank per node, the staging one every rank */
        size_t ranks = (size_t)(o->cross ? s->h->nnodes : s->h->nranks);
        if (o->scaled && o->hsend)
            red_host_scale(o->type, o->hsend, o->hsend, o->scale,
                           o->kind == OPK_REDUCESCATTER ? o->count * ranks : o->count);
    }
    return s->h->stage_start(s->h, j->ops, j->nops, job);
}

/* A job's host part ends: hierarchical averages divided. */
static void job_divide(stage_job_t *j)
{
    for (int i = 0; i < j->nops; i++)
        if (j->ops[i].div > 1)
            red_host_div(j->ops[i].type, j->ops[i].hrecv, j->ops[i].hrecv, j->ops[i].div,
                         j->ops[i].count);
}

static void job_failed(dev_state_t *s, loomResult_t r)
{
    char text[DEV_TEXT_MAX];
    snprintf(text, sizeof(text), "rank %d: the network part of a device collective failed: %s",
             s->h->rank, base_last_error());
    s->h->set_error(s->h, r, text);
}

/* Released even after a failure, so that the stream never waits forever; the communicator's
 * error says the results are void. */
static void job_release(dev_state_t *s, stage_job_t *j)
{
    __sync_synchronize();
    s->xg.flags[1] = j->val;
    free(j);
}

/*
 * The staging queue's poll function on core's progress thread (dev.h): each call finishes at
 * most STAGE_POLL_JOBS jobs, in order, and never waits. Its sleep hint: while the head job waits
 * for the stream's ready flag, 0 for the first STAGE_SPIN_NS and then STAGE_SPIN_NS (the spin,
 * then usleep(20), of the proxy thread it replaces); while the job's host collectives run, 0
 * (stage_test wants calling); with the queue empty, UINT64_MAX (post_job wakes the thread).
 */
static uint64_t stage_poll(void *arg, bool *progressed)
{
    dev_state_t *s = arg;
    dev_host_t *h = s->h;
    struct dev_stage *g = &s->stg;
    for (int n = 0; n < STAGE_POLL_JOBS; n++) {
        stage_job_t *j = g->cur;
        if (j == NULL) {
            pthread_mutex_lock(&g->qlock);
            j = FIFO_POP(&g->q);
            pthread_mutex_unlock(&g->qlock);
            if (j == NULL) return UINT64_MAX;
            g->cur = j;
            g->started = false;
            g->wait_ns = base_now_ns();
        }
        if (!g->started) {
            /* the stream hands the piece over once its copy to the host is done */
            volatile uint32_t *ready = &s->xg.flags[0];
            bool run = true;
            if ((int32_t)(*ready - j->val) < 0) {
                if (!atomic_load(&s->wd.stop) && !s->xg.err->abort)
                    return base_now_ns() - g->wait_ns > STAGE_SPIN_NS ? STAGE_SPIN_NS : 0;
                run = false; /* stopping or aborted: released without running */
            }
            __sync_synchronize();
            /* busy before stop is read: dev_stage_detach, which sets stop and then reads busy,
             * either sees this job or is seen by it */
            atomic_store(&g->busy, true);
            if (run && !atomic_load(&s->wd.stop) && h->error(h, NULL) == loomSuccess) {
                loomResult_t r = job_start(s, j, &g->job);
                if (r == loomSuccess)
                    g->started = true;
                else
                    job_failed(s, r);
            }
            *progressed = true;
        }
        if (g->started) {
            bool done = false;
            loomResult_t r = h->stage_test(h, g->job, &done);
            if (r == loomSuccess && !done) return 0;
            /* a failed job was freed by core, as a finished one */
            if (r != loomSuccess)
                job_failed(s, r);
            else
                job_divide(j);
            g->started = false;
            g->job = NULL;
        }
        g->cur = NULL;
        job_release(s, j);
        atomic_store(&g->busy, false);
        *progressed = true;
    }
    return 0;
}

/* Teardown (stop comes first): waits until the poll holds no host job that runs (a started one
 * is tested to its end, as stage_close needs; stage_stop makes that quick after an abort), then
 * takes the poll off the progress thread and frees the jobs it left. */
void dev_stage_detach(dev_state_t *s)
{
    struct dev_stage *g = &s->stg;
    if (g->attached) {
        s->h->progress_wake(s->h);
        while (atomic_load(&g->busy))
            usleep(20);
        s->h->progress_detach(s->h, s);
        g->attached = false;
    }
    free(g->cur);
    g->cur = NULL;
    for (stage_job_t *j; (j = FIFO_POP(&g->q)) != NULL;)
        free(j);
}
