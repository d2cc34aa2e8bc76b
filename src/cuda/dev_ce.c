/*
 * The copy-engine path (see dev_impl.h): large same-node allreduce, reduce-scatter, allgather
 * and broadcast whose bytes the GPU's copy engines move (cuMemcpyAsync between this rank's
 * buffers and the peers' buffers mapped here through CUDA IPC), so that the SMs stay free for
 * the caller's kernels: only the reduction of what landed runs on a few of them.
 *
 * An allreduce of S bytes over n local ranks, rank `me` owning segment me (dev_seg_of):
 *   1. meet (DEV_MEET): every rank's input is written and its output is free;
 *   2. reduce-scatter: my segment of each peer's input is copied, piece by piece, into my
 *      scratch (double-buffered, the copies spread over several streams, so several engines and
 *      links work at once) and each piece is reduced with mine into my output in rank order as
 *      soon as its copies landed (DEV_CE_REDUCE), while the next piece's copies run;
 *   3. meet: every rank's segment is reduced (and nobody reads my input any more);
 *   4. allgather: each peer's reduced segment is copied from its output into mine;
 *   5. meet: nobody reads my output any more, so the call is over on every rank.
 * Per rank (n-1)S/n bytes come in at each of steps 2 and 4, as on the SM paths. A
 * reduce-scatter is steps 1-3 (its segment is the whole output), an allgather and a broadcast
 * steps 1, 4 and 5. The reductions are the direct path's (the same order, so bit-identical
 * results); the copies carry no arithmetic. The meetings are one block each, on lane 0 of the
 * direct path's counters.
 *
 * Ordering across streams is by events only (no host waits), so the whole call, streams and
 * all, can be captured in a CUDA graph: the side streams join the capture through the first
 * event and are joined back to the caller's stream before the call returns.
 */
#include <stdio.h>
#include <string.h>

#include "dev_impl.h"
#include "param.h"
#include "reduce.h"

#define CE_MIN_PIECE (1ull << 20) /* smallest piece of a peer's segment in the scratch */

bool dev_ce_wanted(const dev_state_t *s, int kind, size_t total)
{
    if (s->ce.min == 0 || total < s->ce.min || s->lay.n < 2 || !s->ipc.direct_ok) return false;
    return kind == OPK_ALLREDUCE || kind == OPK_REDUCESCATTER || kind == OPK_ALLGATHER ||
           kind == OPK_BROADCAST;
}

static loomResult_t ce_fail(dev_state_t *s, const dev_op_t *o, const char *what, CUresult cr)
{
    return base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: %s on the copy engines: %s: %s",
                      s->h->rank, dev_kind_name(o->kind), what, cudrv_err(cr));
}

void dev_ce_free(dev_state_t *s)
{
    struct dev_ce *c = &s->ce;
    const cudrv_t *d = s->drv.d;
    for (int q = 0; q < DEV_CE_STREAMS; q++) {
        if (c->st[q]) d->cuStreamDestroy(c->st[q]);
        if (c->copied[q]) d->cuEventDestroy(c->copied[q]);
        c->st[q] = NULL;
        c->copied[q] = NULL;
    }
    for (int i = 0; i < 2; i++) {
        if (c->reduced[i]) d->cuEventDestroy(c->reduced[i]);
        c->reduced[i] = NULL;
    }
    if (c->fork) d->cuEventDestroy(c->fork);
    c->fork = NULL;
    if (c->scratch) d->cuMemFree(c->scratch);
    c->scratch = 0;
    c->ready = false;
}

/* Streams, events and the scratch, at the first call that takes this path. */
static loomResult_t ce_init(dev_state_t *s, const dev_op_t *o)
{
    struct dev_ce *c = &s->ce;
    const cudrv_t *d = s->drv.d;
    const int n = s->lay.n;
    c->nst = (int)LOOM_MAX(param_int(PARAM_CUDA_CE_STREAMS), LOOM_MIN(n - 1, DEV_CE_STREAMS));
    c->nst = LOOM_MAX(1, LOOM_MIN(c->nst, DEV_CE_STREAMS));
    c->blocks = (int)LOOM_MAX(1, LOOM_MIN(param_int(PARAM_CUDA_CE_BLOCKS), DEV_MAX_BLOCKS));
    size_t budget = param_size(PARAM_CUDA_CE_SCRATCH);
    c->chunk_max = budget / (2 * (size_t)(n - 1)) & ~(size_t)4095;
    if (c->chunk_max < 65536) c->chunk_max = 65536;
    c->scratch_bytes = 2 * (size_t)(n - 1) * c->chunk_max;
    CUresult cr = d->cuMemAlloc(&c->scratch, c->scratch_bytes);
    const char *what = "allocating its scratch";
    for (int q = 0; q < c->nst && cr == CUDA_SUCCESS; q++) {
        what = "creating its streams and events";
        cr = d->cuStreamCreate(&c->st[q], CU_STREAM_NON_BLOCKING);
        if (cr == CUDA_SUCCESS) cr = d->cuEventCreate(&c->copied[q], CU_EVENT_DISABLE_TIMING);
    }
    for (int i = 0; i < 2 && cr == CUDA_SUCCESS; i++)
        cr = d->cuEventCreate(&c->reduced[i], CU_EVENT_DISABLE_TIMING);
    if (cr == CUDA_SUCCESS) cr = d->cuEventCreate(&c->fork, CU_EVENT_DISABLE_TIMING);
    if (cr != CUDA_SUCCESS) {
        if (cr == CUDA_ERROR_OUT_OF_MEMORY && c->scratch == 0)
            what = "allocating its scratch of LOOM_CUDA_CE_SCRATCH bytes";
        loomResult_t res = ce_fail(s, o, what, cr);
        dev_ce_free(s);
        return res;
    }
    c->ready = true;
    INFO(LOG_CUDA,
         "copy-engine path (from %llu bytes): %d streams, pieces of up to %zu bytes per peer, "
         "%zu bytes of scratch; its reductions occupy %d SMs (blocks) and each meeting one, "
         "where the SM paths' kernels occupy %d",
         (unsigned long long)c->min, c->nst, c->chunk_max, c->scratch_bytes, c->blocks,
         s->lay.nblocks);
    return loomSuccess;
}

/* One side of a phase: which streams joined it since the caller's stream forked. */
typedef struct {
    dev_state_t *s;
    const dev_op_t *o;
    CUstream st;
    bool forked[DEV_CE_STREAMS];
    bool fork_recorded;
} ce_phase_t;

/* Stream q, ordered after everything on the caller's stream so far (once per phase). */
static loomResult_t ce_stream(ce_phase_t *p, int q, CUstream *out)
{
    struct dev_ce *c = &p->s->ce;
    const cudrv_t *d = p->s->drv.d;
    CUresult cr = CUDA_SUCCESS;
    if (!p->fork_recorded) {
        cr = d->cuEventRecord(c->fork, p->st);
        if (cr != CUDA_SUCCESS) return ce_fail(p->s, p->o, "cuEventRecord", cr);
        p->fork_recorded = true;
    }
    if (!p->forked[q]) {
        cr = d->cuStreamWaitEvent(c->st[q], c->fork, 0);
        if (cr != CUDA_SUCCESS) return ce_fail(p->s, p->o, "cuStreamWaitEvent", cr);
        p->forked[q] = true;
    }
    *out = c->st[q];
    return loomSuccess;
}

/* The caller's stream waits for what stream q did so far. */
static loomResult_t ce_join_one(ce_phase_t *p, int q)
{
    struct dev_ce *c = &p->s->ce;
    const cudrv_t *d = p->s->drv.d;
    CUresult cr = d->cuEventRecord(c->copied[q], c->st[q]);
    if (cr == CUDA_SUCCESS) cr = d->cuStreamWaitEvent(p->st, c->copied[q], 0);
    return cr == CUDA_SUCCESS ? loomSuccess : ce_fail(p->s, p->o, "joining its streams", cr);
}

/* Every stream of the phase joined back (a capture needs it). */
static loomResult_t ce_join(ce_phase_t *p)
{
    for (int q = 0; q < p->s->ce.nst; q++)
        if (p->forked[q]) {
            LOOM_CHECK(ce_join_one(p, q));
            p->forked[q] = false;
        }
    p->fork_recorded = false;
    return loomSuccess;
}

static loomResult_t ce_copy(ce_phase_t *p, int q, CUdeviceptr dst, CUdeviceptr src, size_t len)
{
    CUstream sq = NULL;
    LOOM_CHECK(ce_stream(p, q, &sq));
    CUresult cr = p->s->drv.d->cuMemcpyAsync(dst, src, len, sq);
    return cr == CUDA_SUCCESS ? loomSuccess : ce_fail(p->s, p->o, "cuMemcpyAsync", cr);
}

static loomResult_t ce_meet(dev_state_t *s, const dev_op_t *o, CUstream st)
{
    dev_args_t a;
    dev_args_init(s, &a, DEV_MEET, o->kind, NULL, NULL);
    return dev_launch_grid(s, &a, 1, 32, st, "copy engines (meeting)");
}

/* Copies of whole ranges (dst[i] <- src[i], len[i] bytes), each cut into enough pieces that
 * every stream has work, spread over the streams. */
static loomResult_t ce_copies(ce_phase_t *p, int k, const CUdeviceptr *dst, const CUdeviceptr *src,
                              const size_t *len)
{
    const int nst = p->s->ce.nst;
    int parts = LOOM_MAX(1, nst / LOOM_MAX(k, 1)), q = 0;
    for (int i = 0; i < k; i++) {
        if (len[i] == 0) continue;
        size_t piece = ((len[i] + (size_t)parts - 1) / (size_t)parts + 4095) & ~(size_t)4095;
        for (size_t pos = 0; pos < len[i]; pos += piece) {
            size_t l = LOOM_MIN(piece, len[i] - pos);
            LOOM_CHECK(ce_copy(p, q, dst[i] + pos, src[i] + pos, l));
            q = (q + 1) % nst;
        }
    }
    return ce_join(p);
}

/* Steps 2 of the header: my segment of every input ([src_off, src_off + len) of each rank's
 * send buffer) reduced into recv + dst_off. */
static loomResult_t ce_reduce_seg(ce_phase_t *p, const char *const *psend, size_t src_off,
                                  size_t dst_off, size_t len)
{
    dev_state_t *s = p->s;
    struct dev_ce *c = &s->ce;
    const cudrv_t *d = s->drv.d;
    const dev_op_t *o = p->o;
    const int n = s->lay.n, me = s->lay.me, nst = c->nst;
    if (len == 0) return loomSuccess;
    /* eight pieces or more, each at least CE_MIN_PIECE, at most what the scratch holds */
    size_t chunk = ((len + 7) / 8 + 4095) & ~(size_t)4095;
    chunk = LOOM_MIN(LOOM_MAX(chunk, CE_MIN_PIECE), c->chunk_max);
    const size_t nch = (len + chunk - 1) / chunk;
    for (size_t ci = 0; ci < nch; ci++) {
        const size_t pos = ci * chunk, plen = LOOM_MIN(chunk, len - pos);
        const int buf = (int)(ci & 1);
        bool used[DEV_CE_STREAMS] = {false}, waited[DEV_CE_STREAMS] = {false};
        dev_args_t a;
        dev_args_init(s, &a, DEV_CE_REDUCE, o->kind, o->send, o->recv);
        dev_set_reduction(&a, o, o->op);
        a.self_src = src_off + pos;
        a.self_dst = dst_off + pos;
        a.self_len = plen;
        for (int j = 0, k = 0; j < n; j++) {
            if (j == me) continue;
            const int q = (int)((ci * (size_t)(n - 1) + (size_t)k) % (size_t)nst);
            CUdeviceptr slot =
                c->scratch + ((size_t)buf * (size_t)(n - 1) + (size_t)k) * c->chunk_max;
            CUstream sq = NULL;
            LOOM_CHECK(ce_stream(p, q, &sq));
            /* the slot's last reduction (two pieces ago) is done before it is written again */
            if (ci >= 2 && !waited[q]) {
                CUresult cr = d->cuStreamWaitEvent(sq, c->reduced[buf], 0);
                if (cr != CUDA_SUCCESS) return ce_fail(s, o, "cuStreamWaitEvent", cr);
                waited[q] = true;
            }
            LOOM_CHECK(ce_copy(p, q, slot, (CUdeviceptr)(uintptr_t)psend[j] + src_off + pos, plen));
            used[q] = true;
            a.peer_send[j] = (const char *)(uintptr_t)slot;
            k++;
        }
        for (int q = 0; q < nst; q++)
            if (used[q]) LOOM_CHECK(ce_join_one(p, q));
        unsigned grid = (unsigned)LOOM_MAX(1, LOOM_MIN((size_t)c->blocks, plen / 65536));
        LOOM_CHECK(dev_launch_grid(s, &a, grid, (unsigned)s->lay.threads, p->st,
                                   "copy engines (reduction of the landed pieces)"));
        CUresult cr = d->cuEventRecord(c->reduced[buf], p->st);
        if (cr != CUDA_SUCCESS) return ce_fail(s, o, "cuEventRecord", cr);
    }
    return ce_join(p);
}

bool dev_ce_prepare(dev_state_t *s, const dev_op_t *o)
{
    if (s->ce.ready || s->ce.failed) return s->ce.ready;
    if (ce_init(s, o) == loomSuccess) return true;
    /* a GPU whose memory the job already holds: the SM paths instead, on every rank (the
     * exchange tells them), and no second try */
    s->ce.failed = true;
    WARN(LOG_CUDA, "%s; this communicator's large calls stay on the SM paths", base_last_error());
    return false;
}

loomResult_t dev_ce_run(dev_state_t *s, const dev_op_t *o, CUstream st, const char *const *psend,
                        char *const *precv)
{
    if (!s->ce.ready)
        return base_error(loomInternalError, LOG_CUDA, "rank %d: copy engines not set up",
                          s->h->rank);
    const int n = s->lay.n, me = s->lay.me;
    const size_t es = red_type_size(o->type), S = o->count * es;
    const CUdeviceptr send = (CUdeviceptr)(uintptr_t)o->send,
                      recv = (CUdeviceptr)(uintptr_t)o->recv;
    ce_phase_t p = {.s = s, .o = o, .st = st};
    CUdeviceptr dst[DEV_MAX_LOCAL], src[DEV_MAX_LOCAL];
    size_t len[DEV_MAX_LOCAL];
    int k = 0;
    LOOM_CHECK(ce_meet(s, o, st));
    switch (o->kind) {
    case OPK_ALLREDUCE: {
        size_t off, l;
        dev_seg_of(o->count, es, n, me, &off, &l);
        LOOM_CHECK(ce_reduce_seg(&p, psend, off * es, off * es, l * es));
        LOOM_CHECK(ce_meet(s, o, st));
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            dev_seg_of(o->count, es, n, j, &off, &l);
            dst[k] = recv + off * es;
            src[k] = (CUdeviceptr)(uintptr_t)precv[j] + off * es;
            len[k++] = l * es;
        }
        LOOM_CHECK(ce_copies(&p, k, dst, src, len));
        break;
    }
    case OPK_REDUCESCATTER: LOOM_CHECK(ce_reduce_seg(&p, psend, (size_t)me * S, 0, S)); break;
    case OPK_ALLGATHER:
        for (int j = 0; j < n; j++) {
            if (j == me && send == recv + (size_t)me * S) continue; /* in place */
            dst[k] = recv + (size_t)j * S;
            src[k] = j == me ? send : (CUdeviceptr)(uintptr_t)psend[j];
            len[k++] = S;
        }
        LOOM_CHECK(ce_copies(&p, k, dst, src, len));
        break;
    case OPK_BROADCAST:
        if (me != o->root || send != recv) {
            dst[k] = recv;
            src[k] = me == o->root ? send : (CUdeviceptr)(uintptr_t)psend[o->root];
            len[k++] = S;
        }
        LOOM_CHECK(ce_copies(&p, k, dst, src, len));
        break;
    default:
        return base_error(loomInternalError, LOG_CUDA, "copy engines: operation kind %d", o->kind);
    }
    return ce_meet(s, o, st);
}
