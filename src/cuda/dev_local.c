/*
 * The device executor's same-node collectives (see dev.h, dev_impl.h): one launch of
 * loom_exchange (loom_lla_* for the latency path) per collective (two for a two-shot allreduce)
 * on the caller's stream; the plans below say which byte ranges go to which peer. Cost for n
 * local ranks and S bytes, per rank: one-shot allreduce (n-1)S out over the links; two-shot,
 * reduce-scatter and allgather 2(n-1)S/n; broadcast S from the root to each peer.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev_impl.h"
#include "param.h"
#include "reduce.h"

/* ---- launching ---- */

static bool capturing(dev_state_t *s, CUstream st)
{
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    s->drv.d->cuStreamIsCapturing(st, &cs);
    return cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Under capture, whether a launch on st may be a programmatic dependent of what precedes it in
 * the graph: only when every node it will depend on is a kernel (the programmatic edge is one
 * between kernels; the first node of a graph, or one after a copy, launches plainly). */
static bool capture_pdl_ok(dev_state_t *s, CUstream st)
{
    const cudrv_t *d = s->drv.d;
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *edges = NULL;
    size_t nd = 0;
    bool ok = false;
    /* queries only; relaxed, so that nothing here can end a global-mode capture */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    d->cuThreadExchangeStreamCaptureMode(&mode);
    if (d->cuStreamGetCaptureInfo3(st, &cs, NULL, NULL, &deps, &edges, &nd) == CUDA_SUCCESS &&
        cs == CU_STREAM_CAPTURE_STATUS_ACTIVE && nd > 0 && deps != NULL) {
        ok = true;
        for (size_t i = 0; i < nd && ok; i++) {
            CUgraphNodeType t;
            ok = d->cuGraphNodeGetType(deps[i], &t) == CUDA_SUCCESS &&
                 t == CU_GRAPH_NODE_TYPE_KERNEL;
        }
    }
    d->cuThreadExchangeStreamCaptureMode(&mode);
    return ok;
}

/* Orders work of this communicator on `st` after its previous work on another stream: the
 * lane counters in device memory must see one kernel at a time. A stream handle may be
 * destroyed by its owner after the call, so nothing is ever recorded on an earlier stream: the
 * last call left its mark when it was made. A latency-path call's mark is the count of its
 * finished blocks in device memory (a stream wait on it here); any other call's is an event
 * recorded after it (cuEventRecord costs the host ~0.2-0.3 us, a twentieth of a small call). */
static loomResult_t order_stream(dev_state_t *s, CUstream st, bool cap)
{
    if (cap || !s->run.have_last || s->run.last == st) return loomSuccess;
    CUresult cr = s->run.last_counted
                      ? s->drv.d->cuStreamWaitValue64(st, s->xg.mem[s->lay.me].ptr + DEV_OFF_LDONE,
                                                      s->run.ldone_want, CU_STREAM_WAIT_VALUE_GEQ)
                      : s->drv.d->cuStreamWaitEvent(st, s->run.ev, 0);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: ordering after the previous stream (%s): %s", s->h->rank,
                          s->run.last_counted ? "cuStreamWaitValue64" : "cuStreamWaitEvent",
                          cudrv_err(cr));
    return loomSuccess;
}

static loomResult_t mark_stream(dev_state_t *s, CUstream st, bool cap)
{
    if (cap) return loomSuccess;
    if (!s->run.counted) {
        CUresult cr = s->drv.d->cuEventRecord(s->run.ev, st);
        if (cr != CUDA_SUCCESS)
            return base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: cuEventRecord: %s",
                              s->h->rank, cudrv_err(cr));
        s->run.ev_valid = true;
    }
    s->run.last_counted = s->run.counted;
    s->run.last = st;
    s->run.have_last = true;
    return loomSuccess;
}

/* Waits on the host for every kernel of this communicator launched so far. */
void dev_drain(dev_state_t *s)
{
    if (!s->run.have_last) return;
    if (!s->run.last_counted) {
        s->drv.d->cuEventSynchronize(s->run.ev);
        return;
    }
    /* every counted kernel adds its blocks, also one that gave up (abort, timeout) */
    for (;;) {
        uint64_t v = 0;
        if (s->drv.d->cuMemcpyDtoH(&v, s->xg.mem[s->lay.me].ptr + DEV_OFF_LDONE, sizeof(v)) !=
                CUDA_SUCCESS ||
            v >= s->run.ldone_want)
            return;
        usleep(20);
    }
}

void dev_args_init(dev_state_t *s, dev_args_t *a, int mode, int kind, const void *send, void *recv)
{
    memset(a, 0, sizeof(*a));
    a->n = s->lay.n;
    a->me = s->lay.me;
    a->mode = mode;
    a->nblocks = s->lay.nblocks;
    a->slot = s->lay.slot;
    a->nslot = s->lay.nslot;
    a->push_threads = s->lay.push_threads;
    a->empty = s->lay.empty;
    a->timeout_ns = (unsigned long long)(s->h->timeout_s * 1e9);
    a->send = send;
    a->recv = recv;
    a->err = (dev_err_t *)(uintptr_t)s->xg.err_dev;
    for (int j = 0; j < s->lay.n; j++)
        a->region[j] = (char *)(uintptr_t)s->xg.mem[j].ptr;
    a->seq = ++s->run.seq;
    s->run.opkind[a->seq % 64] = kind;
}

/* Blocks with work: lanes are independent, so a rank launches only the blocks its streams
 * use (its peers cut the same streams the same way). */
static unsigned grid_of(const dev_state_t *s, const dev_args_t *a)
{
    unsigned long long most = 0;
    unsigned long long lens[2 * DEV_MAX_LOCAL + 1];
    int k = 0;
    lens[k++] = a->self_len;
    for (int j = 0; j < a->n; j++) {
        if (j == a->me) continue;
        lens[k++] = a->io[j].send_len;
        lens[k++] = a->io[j].recv_len;
    }
    for (int i = 0; i < k; i++) {
        if (lens[i] == 0) continue;
        unsigned long long ch = dev_piece_bytes(lens[i], s->lay.nblocks, s->lay.slot);
        unsigned long long used = (lens[i] + ch - 1) / ch;
        if (used > most) most = used;
    }
    return (unsigned)LOOM_MAX(1, LOOM_MIN(most, (unsigned long long)s->lay.nblocks));
}

/* Whether anything the kernel writes may overlap what it reads (in place). */
static int aliases(const dev_args_t *a)
{
    uintptr_t slo = UINTPTR_MAX, shi = 0, rlo = UINTPTR_MAX, rhi = 0;
    for (int j = 0; j < a->n; j++) {
        if (j == a->me) continue;
        if (a->io[j].send_len) {
            uintptr_t lo = (uintptr_t)a->send + a->io[j].send_off;
            slo = LOOM_MIN(slo, lo), shi = LOOM_MAX(shi, lo + a->io[j].send_len);
        }
        if (a->io[j].recv_len) {
            uintptr_t lo = (uintptr_t)a->recv + a->io[j].recv_off;
            rlo = LOOM_MIN(rlo, lo), rhi = LOOM_MAX(rhi, lo + a->io[j].recv_len);
        }
    }
    if (a->self_len) {
        uintptr_t lo = (uintptr_t)a->send + a->self_src;
        slo = LOOM_MIN(slo, lo), shi = LOOM_MAX(shi, lo + a->self_len);
        lo = (uintptr_t)a->recv + a->self_dst;
        rlo = LOOM_MIN(rlo, lo), rhi = LOOM_MAX(rhi, lo + a->self_len);
    }
    return slo < rhi && rlo < shi;
}

/* One launch of the kernel with a's arguments, as a programmatic dependent launch if pdl;
 * `path` names the way it moves data, for the error. */
static loomResult_t go(dev_state_t *s, dev_args_t *a, unsigned grid, unsigned threads, CUstream st,
                       bool pdl, const char *path)
{
    void *params[] = {a};
    CUfunction fn = a->mode == DEV_LLA ? s->drv.fn_lla[a->dtype][a->op]
                    : a->mode == DEV_MEET || a->mode == DEV_CE_REDUCE ? s->drv.fn_ce
                                                                      : s->drv.fn;
    CUresult cr;
    if (pdl) {
        CUlaunchAttribute at;
        memset(&at, 0, sizeof(at));
        at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at.value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig cfg = {.gridDimX = grid,
                              .gridDimY = 1,
                              .gridDimZ = 1,
                              .blockDimX = threads,
                              .blockDimY = 1,
                              .blockDimZ = 1,
                              .hStream = st,
                              .attrs = &at,
                              .numAttrs = 1};
        cr = s->drv.d->cuLaunchKernelEx(&cfg, fn, params, NULL);
    } else {
        cr = s->drv.d->cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, st, params, NULL);
    }
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: launching the kernel of %s (%s, device operation %llu): %s",
                          s->h->rank, dev_kind_name(s->run.opkind[a->seq % 64]), path, a->seq,
                          cudrv_err(cr));
    return loomSuccess;
}

loomResult_t dev_copy(dev_host_t *h, const dev_copy_t *c, int n, cudaStream_t stream)
{
    dev_state_t *s = h->state;
    if (s == NULL) return base_error(loomInternalError, LOG_CUDA, "device executor not set up");
    CUcontext prev = dev_ctx_enter(s);
    CUresult cr = CUDA_SUCCESS;
    for (int i = 0; i < n && cr == CUDA_SUCCESS;) {
        dev_copies_t a;
        memset(&a, 0, sizeof(a));
        size_t most = 0;
        for (; i < n && a.n < DEV_COPY_MAX; i++) {
            if (c[i].bytes == 0) continue;
            a.src[a.n] = (unsigned long long)(uintptr_t)c[i].src;
            a.dst[a.n] = (unsigned long long)(uintptr_t)c[i].dst;
            a.bytes[a.n++] = c[i].bytes;
            most = LOOM_MAX(most, c[i].bytes);
        }
        if (a.n == 0) break;
        /* 16 bytes a thread per pass, four passes for the largest range, at most 64 blocks a
         * range */
        const unsigned threads = 256;
        size_t per_block = (size_t)threads * 16 * 4;
        unsigned gx = (unsigned)LOOM_MAX(1, LOOM_MIN(64, (most + per_block - 1) / per_block));
        void *params[] = {&a};
        cr = s->drv.d->cuLaunchKernel(s->drv.fn_copy, gx, (unsigned)a.n, 1, threads, 1, 1, 0,
                                      (CUstream)stream, params, NULL);
    }
    dev_ctx_leave(s, prev);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: launching the copies of a fused bucket (%d ranges): %s",
                          h->rank, n, cudrv_err(cr));
    return loomSuccess;
}

/* DEV_DIRECT: every block, on every rank (blocks meet their peers' blocks of the same index). */
loomResult_t dev_launch_direct(dev_state_t *s, dev_args_t *a, CUstream st, const char *path)
{
    return go(s, a, (unsigned)s->lay.nblocks, (unsigned)s->lay.threads, st, false, path);
}

/* A launch of `grid` blocks of `threads` (the copy-engine path's meetings and reductions). */
loomResult_t dev_launch_grid(dev_state_t *s, dev_args_t *a, unsigned grid, unsigned threads,
                             CUstream st, const char *path)
{
    return go(s, a, grid, threads, st, false, path);
}

/* The slot path: only the blocks whose lanes carry pieces. */
loomResult_t dev_launch(dev_state_t *s, dev_args_t *a, CUstream st)
{
    a->alias = s->lay.couple || aliases(a);
    return go(s, a, grid_of(s, a), (unsigned)s->lay.threads, st, false, "slots");
}

/* The reduction fields of a kernel's arguments (op: o's, or another that replaces it). */
void dev_set_reduction(dev_args_t *a, const dev_op_t *o, loomRedOp_t op)
{
    loomDataType_t type = o->type;
    a->dtype = (int)type;
    a->op = op == loomProd ? 1 : op == loomMax ? 2 : op == loomMin ? 3 : 0;
    a->avg = op == loomAvg;
    if (base_premul_index(op) < 0) return;
    a->premul = 1;
    if (o->scale_dev) {
        a->scale_dev = o->scale_dev;
        return;
    }
    const uint8_t *v = o->scale_host;
    switch (type) {
    case loomFloat16: a->scale_f = red_half_to_float(*(const uint16_t *)v); break;
    case loomBfloat16: a->scale_f = red_bf16_to_float(*(const uint16_t *)v); break;
    case loomFloat8e4m3:
    case loomFloat8e5m2: a->scale_f = red_fp8_to_float(type, *v); break;
    case loomFloat32: a->scale_f = *(const float *)v; break;
    case loomFloat64: a->scale_f = *(const double *)v; break;
    case loomInt8: a->scale_i = *(const int8_t *)v; break;
    case loomUint8: a->scale_i = *(const uint8_t *)v; break;
    case loomInt32: a->scale_i = *(const int32_t *)v; break;
    case loomUint32: a->scale_i = *(const uint32_t *)v; break;
    default: memcpy(&a->scale_i, v, 8); break;
    }
}

/* Element ranges of a two-shot split: boundaries on 16 bytes, so that pieces stay aligned. */
void dev_seg_of(size_t count, size_t es, int n, int j, size_t *start, size_t *len)
{
    size_t unit = 16 / es, per = (count + (size_t)n - 1) / (size_t)n;
    per = (per + unit - 1) / unit * unit;
    size_t st = LOOM_MIN((size_t)j * per, count);
    *start = st;
    *len = LOOM_MIN(per, count - st);
}

/* Same-node collectives: the plans of the exchange. */
typedef struct {
    int32_t ok, ce_ok; /* buffers exportable; the copy-engine path set up (if wanted) */
    uint64_t sid, soff, rid, roff;
    uint64_t swin, rwin; /* buffer inside a mapped window: its seq + 1, *off the offset in it */
    CUipcMemHandle sh, rh;
} direct_rec_t;

/* One buffer of a direct call: inside a mapped window (its number and offset, no handle), else
 * its allocation's handle. */
static bool direct_export(dev_state_t *s, const void *p, size_t len, uint64_t *win, uint64_t *id,
                          uint64_t *off, CUipcMemHandle *h, loomResult_t *res)
{
    dev_win_t *w = NULL;
    *res = dev_win_find(s, p, len, "buffer", &w);
    if (*res != loomSuccess) return false;
    if (w) {
        *win = w->seq + 1;
        *off = (CUdeviceptr)(uintptr_t)p - w->base;
        return true;
    }
    return dev_ipc_export(s, p, id, off, h);
}

/* Rank j's buffer of a direct call, mapped here: through its window, or its handle. */
static loomResult_t direct_import(dev_state_t *s, int j, uint64_t win, uint64_t id, uint64_t off,
                                  const CUipcMemHandle *h, bool pin, CUdeviceptr *p)
{
    if (win) {
        for (dev_win_t *w = s->win.list; w; w = w->next)
            if (w->seq == win - 1 && w->mapped) {
                *p = w->peer[j] + off;
                return loomSuccess;
            }
        return base_error(loomInternalError, LOG_CUDA,
                          "rank %d: rank %d's buffer lies in window %llu, which is not mapped here",
                          s->h->rank, s->lay.lrank[j], (unsigned long long)(win - 1));
    }
    CUdeviceptr base = 0;
    LOOM_CHECK(dev_ipc_import(s, j, id, h, &base, pin));
    *p = base + off;
    return loomSuccess;
}

/* A large allreduce or reduce-scatter reading the peers' inputs where they are (DEV_DIRECT),
 * or, from LOOM_CUDA_CE bytes, one of those or an allgather or broadcast on the copy engines
 * (dev_ce.c) through the same mappings.
 * Every rank enters on the same conditions; what only a rank knows (its buffers exportable)
 * travels in the exchange, and all go direct only if all can. An allreduce writes each reduced
 * segment into every rank's output; a reduce-scatter's segment is the rank's own output, so
 * only the inputs are mapped (a broadcast's: only the root's).
 * Under capture (every rank captures its call, as it makes every call) the exchange happens
 * once, now, on the host; the kernel captured carries the peers' addresses, and the peers'
 * allocations stay mapped (pinned in the IPC cache) for as long as CUDA keeps the graph or an
 * instance of it (dev_ipc_hold): a replay does no host work. As with NCCL, the buffers a graph
 * captured must stay allocated while it may be replayed. */
static loomResult_t direct_exchange(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap,
                                    bool *done);
static loomResult_t run_direct(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap, bool *done)
{
    if (!cap) return direct_exchange(s, o, st, cap, done);
    /* opening IPC handles (and evicting from the cache) is not allowed under a global-mode
     * capture unless this thread captures relaxed, as NCCL does for its own setup */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->drv.d->cuThreadExchangeStreamCaptureMode(&mode);
    loomResult_t res = direct_exchange(s, o, st, cap, done);
    s->drv.d->cuThreadExchangeStreamCaptureMode(&mode);
    return res;
}

static loomResult_t direct_exchange(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap,
                                    bool *done)
{
    const bool rs = o->kind == OPK_REDUCESCATTER, ag = o->kind == OPK_ALLGATHER,
               bc = o->kind == OPK_BROADCAST, reduces = !ag && !bc;
    size_t es = red_type_size(o->type), S = o->count * es, n = (size_t)s->lay.n;
    /* the larger buffer, and my input: every rank maps the others' inputs (a broadcast only the
     * root's), and an allreduce the outputs too */
    size_t total = rs || ag ? S * n : S, sendlen = rs ? S * n : S;
    *done = false;
    if (reduces && base_premul_index(o->op) >= 0) return loomSuccess;
    /* the copy engines for the largest (allgather and broadcast take no other direct path) */
    bool ce = dev_ce_wanted(s, o->kind, total);
    /* a reduce-scatter moves half an allreduce's bytes for the same exchange of handles on the
     * host (tens of us): measured on 2 H200s, direct lost to NCCL at 4 MiB of input (0.6x) and
     * won from 64 MiB (1.3x), so it starts at four times the allreduce's size */
    const bool direct =
        reduces && s->ipc.direct_ok && total >= (rs ? 4 : 1) * s->ipc.direct_min && s->lay.n >= 2;
    if (!ce && !direct) return loomSuccess;
    const bool export_send = !bc || s->lay.me == o->root, want_recv = !rs && !ag && !bc;
    CUgraph graph = NULL;
    if (cap) {
        CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
        const CUgraphNode *deps = NULL;
        const CUgraphEdgeData *edges = NULL;
        size_t nd = 0;
        if (s->drv.d->cuStreamGetCaptureInfo3(st, &cs, NULL, &graph, &deps, &edges, &nd) !=
                CUDA_SUCCESS ||
            cs != CU_STREAM_CAPTURE_STATUS_ACTIVE)
            graph = NULL; /* no graph to tie the mappings to: the slots, on every rank */
    }
    direct_rec_t mine = {.ok = !cap || graph != NULL, .ce_ok = ce && dev_ce_prepare(s, o)},
                 *all = calloc((size_t)s->h->nranks, sizeof(*all));
    if (all == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
    loomResult_t xres = loomSuccess;
    if (mine.ok)
        mine.ok = (!export_send || direct_export(s, o->send, sendlen, &mine.swin, &mine.sid,
                                                 &mine.soff, &mine.sh, &xres)) &&
                  (!want_recv || direct_export(s, o->recv, S, &mine.rwin, &mine.rid, &mine.roff,
                                               &mine.rh, &xres));
    if (xres != loomSuccess) {
        free(all);
        return xres;
    }
    const void *sp = &mine;
    void *rp = all;
    loomResult_t res = s->h->allgather(&s->h, &sp, &rp, sizeof(mine), 1);
    bool ok = res == loomSuccess;
    for (int j = 0; j < s->lay.n && ok; j++) {
        ok = all[s->lay.lrank[j]].ok;
        ce = ce && all[s->lay.lrank[j]].ce_ok;
    }
    /* a rank without the copy engines: the direct kernel where it applies, else the slots */
    if (!ce && !direct) ok = false;
    dev_args_t a;
    /* under capture: the handles opened for the graph, held until it is gone */
    struct dev_hold_pin pins[2 * DEV_MAX_LOCAL];
    int npin = 0;
    if (ok) {
        /* (the copy-engine path takes the peers' addresses from here, and launches its own) */
        dev_args_init(s, &a, DEV_DIRECT, o->kind, o->send, o->recv);
        dev_set_reduction(&a, o, o->op);
        a.direct_fanout = !rs;
        for (int j = 0; j < s->lay.n && res == loomSuccess; j++) {
            if (j == s->lay.me || (bc && j != o->root)) continue;
            const direct_rec_t *r = &all[s->lay.lrank[j]];
            CUdeviceptr sp = 0, rp = 0;
            res = direct_import(s, j, r->swin, r->sid, r->soff, &r->sh, cap, &sp);
            if (res == loomSuccess && cap && !r->swin)
                pins[npin++] = (struct dev_hold_pin){j, r->sid};
            if (res == loomSuccess && want_recv) {
                res = direct_import(s, j, r->rwin, r->rid, r->roff, &r->rh, cap, &rp);
                if (res == loomSuccess && cap && !r->rwin)
                    pins[npin++] = (struct dev_hold_pin){j, r->rid};
            }
            a.peer_send[j] = (const char *)(uintptr_t)sp;
            a.peer_recv[j] = want_recv ? (char *)(uintptr_t)rp : NULL;
        }
    }
    free(all);
    if (res != loomSuccess) {
        for (int i = 0; i < npin; i++)
            dev_ipc_unpin(s, pins[i].j, pins[i].id);
        return res;
    }
    if (!ok) return loomSuccess;
    /* (a buffer in a window is the window's to keep mapped: deregistering it ends the replays) */
    if (cap && npin) LOOM_CHECK(dev_ipc_hold(s, graph, a.seq, pins, npin));
    if (ce) {
        LOOM_CHECK(dev_ce_run(s, o, st, a.peer_send, a.peer_recv));
        *done = true;
        return loomSuccess;
    }
    if (rs) {
        a.self_src = (size_t)s->lay.me * S;
        a.self_dst = 0;
        a.self_len = S;
    } else {
        size_t off, len;
        dev_seg_of(o->count, es, s->lay.n, s->lay.me, &off, &len);
        a.self_src = a.self_dst = off * es;
        a.self_len = len * es;
    }
    LOOM_CHECK(dev_launch_direct(s, &a, st, "direct reads of the peers' buffers"));
    *done = true;
    return loomSuccess;
}

/* A small or medium allreduce or reduce-scatter in low-latency words (DEV_LLA): one launch, no
 * flags. */
static loomResult_t run_lla(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap)
{
    dev_args_t a;
    size_t S = o->count * red_type_size(o->type);
    dev_args_init(s, &a, DEV_LLA, o->kind, o->send, o->recv);
    dev_set_reduction(&a, o, o->op);
    a.self_len = S;
    a.lla_seg = o->kind == OPK_REDUCESCATTER ? S : 0;
    a.lla_base = DEV_LLA_BASE(s->lay.n, s->lay.nblocks, s->lay.nslot, s->lay.slot);
    a.lla_cap = s->lla.cap;
    /* a graph replays its launches with the step it captured: from the first capture on,
     * the lanes number their own steps (kernels.h) */
    if (cap) s->lla.lanes = true;
    a.lla_step = s->lla.lanes ? 0 : ++s->lla.step;
    /* graph replays are never counted; from a few KiB the kernel's fence before the count
     * costs more GPU time than the event costs the host (perf/RESULTS.md) */
    a.lla_count = a.lla_step && S <= s->run.counted_max;
    unsigned grid, threads;
    dev_lla_launch(S, s->lay.nblocks, &grid, &threads);
    /* captured: a programmatic edge from the kernel before, kept by every replay */
    bool pdl = s->lla.pdl && (!cap || capture_pdl_ok(s, st));
    LOOM_CHECK(go(s, &a, grid, threads, st, pdl, "low-latency words"));
    if (a.lla_count) { /* the kernel counts its blocks (kernels.h) */
        s->run.ldone_want += grid;
        s->run.counted = true;
    }
    return loomSuccess;
}

static loomResult_t run_local(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap)
{
    size_t es = red_type_size(o->type), S = o->count * es;
    int n = s->lay.n, me = s->lay.me;
    dev_args_t a;
    /* buffers in symmetric windows: read and written where they are, no exchange (the latency
     * path keeps the calls it takes: one launch, no meeting of blocks) */
    if (s->win.list) {
        bool lla = S > 0 && (uint64_t)S * (uint64_t)(n - 1) <= s->lla.max &&
                   (o->kind == OPK_ALLREDUCE || o->kind == OPK_REDUCESCATTER);
        bool win = false;
        LOOM_CHECK(dev_win_run(s, o, st, !lla, &win));
        if (win) return loomSuccess;
    }
    switch (o->kind) {
    case OPK_ALLREDUCE: {
        if (S > 0 && (uint64_t)S * (uint64_t)(n - 1) <= s->lla.max) return run_lla(s, o, st, cap);
        bool done = false;
        LOOM_CHECK(run_direct(s, o, st, cap, &done));
        if (done) return loomSuccess;
        bool oneshot = n <= 2 || S <= s->lay.oneshot;
        if (oneshot) {
            dev_args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
            dev_set_reduction(&a, o, o->op);
            for (int j = 0; j < n; j++)
                if (j != me) a.io[j] = (dev_io_t){0, S, 0, S};
            a.self_len = S;
            return dev_launch(s, &a, st);
        }
        size_t off, len, offj, lenj;
        dev_seg_of(o->count, es, n, me, &off, &len);
        dev_args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        dev_set_reduction(&a, o, o->op);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            dev_seg_of(o->count, es, n, j, &offj, &lenj);
            a.io[j] = (dev_io_t){offj * es, lenj * es, 0, len * es};
        }
        a.self_src = a.self_dst = off * es;
        a.self_len = len * es;
        LOOM_CHECK(dev_launch(s, &a, st));
        dev_args_init(s, &a, DEV_COPY, o->kind, o->recv, o->recv);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            dev_seg_of(o->count, es, n, j, &offj, &lenj);
            a.io[j] = (dev_io_t){off * es, len * es, offj * es, lenj * es};
        }
        return dev_launch(s, &a, st);
    }
    case OPK_BROADCAST: {
        int root = o->root; /* same node: communicator rank = local index */
        bool done = false;
        LOOM_CHECK(run_direct(s, o, st, cap, &done)); /* the copy engines, if that large */
        if (done) return loomSuccess;
        dev_args_init(s, &a, DEV_COPY, o->kind, o->send, o->recv);
        if (me == root) {
            for (int j = 0; j < n; j++)
                if (j != me) a.io[j].send_len = S;
            a.self_len = o->send != o->recv ? S : 0;
        } else {
            a.io[root].recv_len = S;
        }
        return dev_launch(s, &a, st);
    }
    case OPK_REDUCE: {
        int root = o->root;
        dev_args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        dev_set_reduction(&a, o, o->op);
        if (me == root) {
            for (int j = 0; j < n; j++)
                if (j != me) a.io[j].recv_len = S;
            a.self_len = S;
        } else {
            a.io[root].send_len = S;
        }
        return dev_launch(s, &a, st);
    }
    case OPK_ALLGATHER: {
        bool done = false;
        LOOM_CHECK(run_direct(s, o, st, cap, &done)); /* the copy engines, if that large */
        if (done) return loomSuccess;
        dev_args_init(s, &a, DEV_COPY, o->kind, o->send, o->recv);
        for (int j = 0; j < n; j++)
            if (j != me) a.io[j] = (dev_io_t){0, S, (size_t)j * S, S};
        a.self_dst = (size_t)me * S;
        a.self_len = S;
        return dev_launch(s, &a, st);
    }
    case OPK_REDUCESCATTER: {
        if (S > 0 && (uint64_t)S * (uint64_t)(n - 1) <= s->lla.max) return run_lla(s, o, st, cap);
        bool done = false;
        LOOM_CHECK(run_direct(s, o, st, cap, &done));
        if (done) return loomSuccess;
        dev_args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        dev_set_reduction(&a, o, o->op);
        for (int j = 0; j < n; j++)
            if (j != me) a.io[j] = (dev_io_t){(size_t)j * S, S, 0, S};
        a.self_src = (size_t)me * S;
        a.self_len = S;
        return dev_launch(s, &a, st);
    }
    case OPK_ALLTOALL:
        dev_args_init(s, &a, DEV_COPY, o->kind, o->send, o->recv);
        for (int j = 0; j < n; j++)
            if (j != me) a.io[j] = (dev_io_t){(size_t)j * S, S, (size_t)j * S, S};
        a.self_src = a.self_dst = (size_t)me * S;
        a.self_len = S;
        return dev_launch(s, &a, st);
    default:
        return base_error(loomInternalError, LOG_CUDA, "device executor: operation kind %d",
                          o->kind);
    }
}

/* A run of send/recv calls: layer k pairs the k-th send to each peer with the k-th receive
 * from it, as the host executor matches them in order. Buffers are absolute addresses (base
 * NULL), since every call has its own. */
static loomResult_t run_p2p(dev_state_t *s, const dev_op_t *ops, int nops, CUstream st)
{
    int layer = 0;
    for (;;) {
        dev_args_t a;
        dev_args_init(s, &a, DEV_COPY, OPK_SEND, NULL, NULL);
        bool any = false;
        int sends[DEV_MAX_LOCAL] = {0}, recvs[DEV_MAX_LOCAL] = {0};
        const dev_op_t *self_send = NULL, *self_recv = NULL;
        for (int i = 0; i < nops; i++) {
            const dev_op_t *o = &ops[i];
            int j = o->root;
            size_t bytes = o->count * red_type_size(o->type);
            if (j < 0 || j >= s->lay.n) continue;
            if (o->kind == OPK_SEND && sends[j]++ == layer) {
                if (j == s->lay.me)
                    self_send = o;
                else
                    a.io[j].send_off = (uintptr_t)o->send, a.io[j].send_len = bytes;
                any = true;
            } else if (o->kind == OPK_RECV && recvs[j]++ == layer) {
                if (j == s->lay.me)
                    self_recv = o;
                else
                    a.io[j].recv_off = (uintptr_t)o->recv, a.io[j].recv_len = bytes;
                any = true;
            }
        }
        if (!any) return loomSuccess;
        if ((self_send != NULL) != (self_recv != NULL))
            return base_error(loomInvalidUsage, LOG_P2P,
                              "rank %d: a device send to itself needs a matching receive from "
                              "itself in the same group",
                              s->h->rank);
        if (self_send) {
            size_t sb = self_send->count * red_type_size(self_send->type);
            size_t rb = self_recv->count * red_type_size(self_recv->type);
            if (sb != rb)
                return base_error(loomInvalidUsage, LOG_P2P,
                                  "rank %d: send to self of %zu bytes meets a receive of %zu",
                                  s->h->rank, sb, rb);
            a.self_src = (uintptr_t)self_send->send;
            a.self_dst = (uintptr_t)self_recv->recv;
            a.self_len = sb;
        }
        if (any && a.self_len == 0) {
            bool peers = false;
            for (int j = 0; j < s->lay.n; j++)
                peers |= a.io[j].send_len || a.io[j].recv_len;
            if (!peers) {
                layer++;
                continue; /* zero-byte calls only */
            }
        }
        LOOM_CHECK(dev_launch(s, &a, st));
        layer++;
    }
}

/* How many allreduces from ops[0] fuse into one (0 or 1: none): consecutive, on one stream,
 * one type and op, each of at most LOOM_FUSION_GROUP bytes, together at most the larger of
 * that and LOOM_FUSION_BUCKET; *total their elements. */
static int fuse_span(const dev_op_t *ops, int n, size_t *total)
{
    size_t max = param_size(PARAM_FUSION_GROUP), es = red_type_size(ops[0].type);
    size_t cap = LOOM_MAX(param_size(PARAM_FUSION_BUCKET), max);
    int k = 0;
    *total = 0;
    for (; k < n; k++) {
        const dev_op_t *o = &ops[k];
        if (o->kind != OPK_ALLREDUCE || o->stream != ops[0].stream || o->type != ops[0].type ||
            o->op != ops[0].op || o->count * es > max || (*total + o->count) * es > cap)
            break;
        *total += o->count;
    }
    return k;
}

/* A run of fuse_span's allreduces as one: ordered after the communicator's previous work, the
 * inputs packed into the communicator's fusion buffer (one copy kernel), one allreduce in
 * place, the results unpacked, and the run's end marked by an event after the unpack (so the
 * next call on any stream, which may pack into the same buffer, comes after it). */
static loomResult_t run_fused(dev_state_t *s, const dev_op_t *ops, int k, size_t total, CUstream st)
{
    const cudrv_t *d = s->drv.d;
    size_t es = red_type_size(ops[0].type), bytes = total * es;
    LOOM_CHECK(order_stream(s, st, false));
    s->run.counted = false;
    if (bytes > s->fz.cap) { /* cuMemFree waits for the kernels that still use the old one */
        size_t want = LOOM_MAX(bytes, 2 * s->fz.cap);
        if (s->fz.buf) d->cuMemFree(s->fz.buf);
        s->fz.buf = 0;
        s->fz.cap = 0;
        CUresult cr = d->cuMemAlloc(&s->fz.buf, want);
        if (cr != CUDA_SUCCESS) {
            s->fz.buf = 0;
            return base_error(loomUnhandledCudaError, LOG_CUDA,
                              "rank %d: allocating %zu bytes for a group's fused allreduces: %s",
                              s->h->rank, want, cudrv_err(cr));
        }
        s->fz.cap = want;
    }
    dev_copy_t few[32] = {{0}}, *c = few;
    if (k > (int)LOOM_ARRAY_SIZE(few) && (c = malloc((size_t)k * sizeof(*c))) == NULL)
        return base_error(loomSystemError, LOG_CUDA, "out of memory (group fusion)");
    size_t off = 0;
    for (int i = 0; i < k; i++) {
        size_t b = ops[i].count * es;
        c[i] =
            (dev_copy_t){.src = ops[i].send, .dst = (char *)(uintptr_t)s->fz.buf + off, .bytes = b};
        off += b;
    }
    loomResult_t res = dev_copy(s->h, c, k, (cudaStream_t)st);
    dev_op_t fo = ops[0];
    fo.send = fo.recv = (void *)(uintptr_t)s->fz.buf;
    fo.count = total;
    if (res == loomSuccess)
        res = s->stg.multinode ? dev_stage_allreduce(s, &fo, st, false)
                               : run_local(s, &fo, st, false);
    for (int i = 0; i < k; i++) { /* the same ranges, the other way */
        const void *src = c[i].dst;
        c[i].dst = ops[i].recv;
        c[i].src = src;
    }
    if (res == loomSuccess) res = dev_copy(s->h, c, k, (cudaStream_t)st);
    if (c != few) free(c);
    s->run.counted = false; /* the event after the unpack marks the run's end */
    if (res == loomSuccess) res = mark_stream(s, st, false);
    return res;
}

loomResult_t dev_run(dev_host_t *h, const dev_op_t *ops, int nops)
{
    dev_state_t *s = h->state;
    if (s == NULL) return base_error(loomInternalError, LOG_CUDA, "device executor not set up");
    dev_poll(h);
    const char *why = NULL;
    loomResult_t broken = h->error(h, &why);
    if (broken != loomSuccess) return base_error(broken, LOG_CUDA, "%s", why);
    /* the node's ranks must be making the same collectives (dev_calls.c) */
    LOOM_CHECK(dev_calls_log(s, ops, nops));
    CUcontext prev = dev_ctx_enter(s);
    loomResult_t res = loomSuccess;
    for (int i = 0; i < nops && res == loomSuccess;) {
        const dev_op_t *o = &ops[i];
        CUstream st = (CUstream)o->stream;
        bool cap = capturing(s, st);
        int k = 1;
        if (o->kind == OPK_SEND || o->kind == OPK_RECV)
            while (i + k < nops && (ops[i + k].kind == OPK_SEND || ops[i + k].kind == OPK_RECV))
                k++;
        /* a group's small allreduces on one stream: one (not under capture, where a replay
         * would share the buffer with calls outside the graph) */
        size_t total = 0;
        int f = cap || o->kind != OPK_ALLREDUCE ? 0 : fuse_span(o, nops - i, &total);
        if (f >= 2) {
            res = run_fused(s, o, f, total, st);
            if (res == loomSuccess) s->run.fused += (uint64_t)f;
            TRACE(LOG_CUDA, "rank %d: %d allreduces of a group fused into one of %zu x %s", h->rank,
                  f, total, red_type_name(o->type));
            i += f;
            continue;
        }
        res = order_stream(s, st, cap);
        s->run.counted = false;
        /* the other streams of a point-to-point run wait for the first, and it for them */
        for (int q = 1; q < k && res == loomSuccess; q++) {
            CUstream sq = (CUstream)ops[i + q].stream;
            if (sq == st || cap) continue;
            if (s->drv.d->cuEventRecord(s->run.ev, sq) != CUDA_SUCCESS ||
                s->drv.d->cuStreamWaitEvent(st, s->run.ev, 0) != CUDA_SUCCESS)
                res = base_error(loomUnhandledCudaError, LOG_CUDA,
                                 "rank %d: joining the streams of a group", h->rank);
        }
        if (res != loomSuccess) break;
        if (s->stg.multinode) {
            if (o->kind == OPK_ALLREDUCE)
                res = dev_stage_allreduce(s, o, st, cap);
            else
                res = dev_stage_generic(s, o, k, st, cap);
        } else if (k > 1 || o->kind == OPK_SEND || o->kind == OPK_RECV) {
            res = run_p2p(s, o, k, st);
        } else {
            res = run_local(s, o, st, cap);
        }
        if (res == loomSuccess) res = mark_stream(s, st, cap);
        for (int q = 1; q < k && res == loomSuccess; q++) {
            CUstream sq = (CUstream)ops[i + q].stream;
            if (sq == st || cap) continue;
            CUresult cr = s->drv.d->cuStreamWaitEvent(sq, s->run.ev, 0); /* recorded on st above */
            if (cr != CUDA_SUCCESS)
                res = base_error(loomUnhandledCudaError, LOG_CUDA,
                                 "rank %d: joining the streams of a group: %s", h->rank,
                                 cudrv_err(cr));
        }
        i += k;
    }
    dev_ctx_leave(s, prev);
    return res;
}
