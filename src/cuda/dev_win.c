/*
 * Registered windows (loomCommWindowRegister; see dev.h, dev_impl.h, docs/device.md): a rank's
 * device buffer that every other rank of its node maps once, at registration, so that later
 * collectives on buffers inside windows read and write the peers' buffers where they are.
 *
 * Registration is collective: every rank sends its buffer's CUDA IPC handle (the allocation's,
 * with the buffer's offset in it) through core's allgather, checks what the others sent (flags,
 * sizes of a symmetric window), and maps each local peer's allocation through the executor's
 * IPC cache (dev_ipc.c), pinned there until the window is deregistered. A window whose buffers
 * cannot all be mapped (a rank's memory from the VMM API, which has no legacy IPC handle; ranks
 * of one process; a communicator across nodes) is still a window, on every rank alike, and its
 * calls take the paths of unregistered memory.
 *
 * A call whose buffers lie in symmetric windows (LOOM_WIN_COLL_SYMMETRIC: the same size on every
 * rank, and every rank passes the same offsets, as NCCL requires) finds a peer's buffer by one
 * addition and launches DEV_DIRECT with no exchange on the host, so it also runs inside a CUDA
 * graph. Buffers in windows without the flag save the direct path the export and mapping of
 * handles, but not its per-call exchange of offsets (dev_local.c's run_direct).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev_impl.h"
#include "reduce.h"

enum { WERR_NONE = 0, WERR_NOTDEV = 1, WERR_RANGE = 2 };

/* What every rank sends at registration. */
typedef struct {
    int32_t err;      /* WERR_*: this rank's buffer cannot be a window */
    int32_t flags;    /* DEV_WIN_* as passed */
    int32_t mappable; /* the buffer's allocation has a CUDA IPC handle (and may be mapped) */
    int32_t pad;
    uint64_t addr, size; /* the buffer, in its owner's address space */
    uint64_t id, off;    /* its allocation (CU_POINTER_ATTRIBUTE_BUFFER_ID), its offset there */
    uint64_t alloc_size;
    CUipcMemHandle h;
} win_rec_t;

static loomResult_t gather(dev_state_t *s, const void *mine, void *all, size_t bytes)
{
    const void *sp = mine;
    void *rp = all;
    return s->h->allgather(&s->h, &sp, &rp, bytes, 1);
}

static loomResult_t broken(dev_host_t *h)
{
    dev_poll(h);
    const char *why = NULL;
    loomResult_t r = h->error(h, &why);
    return r == loomSuccess ? r : base_error(r, LOG_CUDA, "%s", why);
}

/* The checks every rank makes on what all sent: the same answer everywhere. */
static loomResult_t check_recs(dev_state_t *s, const win_rec_t *all, int flags)
{
    const uint64_t seq = (unsigned long long)s->win.next_seq;
    for (int r = 0; r < s->h->nranks; r++) {
        const win_rec_t *q = &all[r];
        if (q->err == WERR_NOTDEV)
            return base_error(loomInvalidArgument, LOG_CUDA,
                              "loomCommWindowRegister (window %llu): rank %d's buffer 0x%llx is "
                              "not CUDA device memory",
                              (unsigned long long)seq, r, (unsigned long long)q->addr);
        if (q->err == WERR_RANGE)
            return base_error(loomInvalidArgument, LOG_CUDA,
                              "loomCommWindowRegister (window %llu): rank %d's buffer [0x%llx, "
                              "+%llu) runs past the end of its allocation (%llu bytes, the buffer "
                              "starting %llu bytes in)",
                              (unsigned long long)seq, r, (unsigned long long)q->addr,
                              (unsigned long long)q->size, (unsigned long long)q->alloc_size,
                              (unsigned long long)q->off);
        if (q->flags != flags)
            return base_error(loomInvalidArgument, LOG_CUDA,
                              "loomCommWindowRegister (window %llu): rank %d passes flags 0x%x, "
                              "rank %d flags 0x%x: every rank passes the same flags",
                              (unsigned long long)seq, s->h->rank, flags, r, q->flags);
        if ((flags & DEV_WIN_SYMMETRIC) && q->size != all[0].size)
            return base_error(loomInvalidArgument, LOG_CUDA,
                              "loomCommWindowRegister (symmetric window %llu): rank %d registers "
                              "%llu bytes at 0x%llx, rank 0 %llu bytes at 0x%llx: a symmetric "
                              "window has the same size on every rank",
                              (unsigned long long)seq, r, (unsigned long long)q->size,
                              (unsigned long long)q->addr, (unsigned long long)all[0].size,
                              (unsigned long long)all[0].addr);
    }
    return loomSuccess;
}

static bool one_process(const dev_state_t *s)
{
    for (int j = 0; j < s->lay.n; j++)
        if (j != s->lay.me && s->wd.pid[j] == (int)getpid()) return true;
    return false;
}

static void unmap_peers(dev_state_t *s, dev_win_t *w, const bool *pinned)
{
    for (int j = 0; j < s->lay.n; j++)
        if (pinned[j]) dev_ipc_unpin(s, j, w->peer_id[j]);
}

static loomResult_t win_register(dev_state_t *s, void *buff, size_t size, int flags,
                                 dev_win_t **out)
{
    const cudrv_t *d = s->drv.d;
    const int n = s->lay.n, me = s->lay.me;
    CUdeviceptr dp = (CUdeviceptr)(uintptr_t)buff, base = 0;
    size_t asize = 0;
    win_rec_t mine = {.flags = flags, .addr = dp, .size = size};
    if (d->cuMemGetAddressRange(&base, &asize, dp) != CUDA_SUCCESS) {
        mine.err = WERR_NOTDEV;
    } else if (dp - base > asize || size > asize - (dp - base)) {
        mine.err = WERR_RANGE;
        mine.alloc_size = asize;
        mine.off = dp - base;
    }
    /* mapping a peer's buffer needs CUDA IPC between processes on one node (whatever
     * LOOM_CUDA_DIRECT says about the direct path of unregistered buffers) */
    const bool local = !s->stg.multinode && n > 1 && !one_process(s);
    if (mine.err == WERR_NONE && local)
        mine.mappable = dev_ipc_export(s, buff, &mine.id, &mine.off, &mine.h);
    win_rec_t *all = calloc((size_t)s->h->nranks, sizeof(*all));
    if (all == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
    /* ranks of one process (loomCommInitAll) may be driven by one thread, which cannot meet
     * itself: their windows are never mapped, so there is nothing to exchange */
    const bool alone = !s->stg.multinode && one_process(s);
    loomResult_t res = alone ? loomSuccess : gather(s, &mine, all, sizeof(mine));
    if (alone)
        for (int r = 0; r < s->h->nranks; r++)
            all[r] = mine;
    if (res == loomSuccess) res = check_recs(s, all, flags);
    bool mapped = local;
    int unmappable = -1;
    for (int j = 0; j < n && res == loomSuccess; j++)
        if (!all[s->lay.lrank[j]].mappable) {
            mapped = false;
            if (unmappable < 0) unmappable = s->lay.lrank[j];
        }
    dev_win_t *w = res == loomSuccess ? calloc(1, sizeof(*w)) : NULL;
    if (res == loomSuccess && w == NULL)
        res = base_error(loomSystemError, LOG_CUDA, "out of memory");
    if (res != loomSuccess) {
        free(all);
        return res;
    }
    w->seq = s->win.next_seq;
    w->base = dp;
    w->size = size;
    w->flags = flags;
    w->peer[me] = dp;
    w->peer_size[me] = size;
    bool pinned[DEV_MAX_LOCAL] = {false};
    if (mapped) {
        /* each peer's allocation, mapped once and held; then every rank learns whether all
         * could, so that they agree on the window's paths */
        int32_t ok = 1, *oks = calloc((size_t)s->h->nranks, sizeof(*oks));
        for (int j = 0; j < n && ok; j++) {
            if (j == me) continue;
            const win_rec_t *q = &all[s->lay.lrank[j]];
            CUdeviceptr pb = 0;
            if (dev_ipc_import(s, j, q->id, &q->h, &pb, true) != loomSuccess) {
                ok = 0;
                break;
            }
            pinned[j] = true;
            w->peer[j] = pb + q->off;
            w->peer_size[j] = q->size;
            w->peer_id[j] = q->id;
        }
        if (oks == NULL) {
            unmap_peers(s, w, pinned);
            free(w);
            free(all);
            return base_error(loomSystemError, LOG_CUDA, "out of memory");
        }
        char mytext[DEV_TEXT_MAX] = "";
        if (!ok) snprintf(mytext, sizeof(mytext), "%s", base_last_error());
        res = gather(s, &ok, oks, sizeof(ok));
        for (int j = 0; j < n && res == loomSuccess; j++) {
            int q = s->lay.lrank[j];
            if (oks[q]) continue;
            if (q == s->h->rank)
                res = base_error(loomUnhandledCudaError, LOG_CUDA, "%s", mytext);
            else
                res = base_error(loomUnhandledCudaError, LOG_CUDA,
                                 "loomCommWindowRegister (window %llu): rank %d could not map "
                                 "the other ranks' windows (its error says why)",
                                 (unsigned long long)w->seq, q);
        }
        free(oks);
        if (res != loomSuccess) {
            unmap_peers(s, w, pinned);
            free(w);
            free(all);
            return res;
        }
    } else if (local && unmappable >= 0) {
        WARN(LOG_CUDA,
             "window %llu: rank %d's buffer has no CUDA IPC handle (memory from the VMM API, "
             "e.g. expandable segments): calls on this window take the paths of unregistered "
             "memory",
             (unsigned long long)w->seq, unmappable);
    }
    w->mapped = mapped;
    free(all);
    s->win.next_seq++;
    w->next = s->win.list;
    s->win.list = w;
    INFO(LOG_CUDA, "rank %d: window %llu [%p, +%zu)%s, %s", s->h->rank, (unsigned long long)w->seq,
         buff, size, (flags & DEV_WIN_SYMMETRIC) ? " symmetric" : "",
         mapped ? "mapped by every local rank" : "not mapped (plain paths)");
    *out = w;
    return loomSuccess;
}

loomResult_t dev_win_register(dev_host_t *h, void *buff, size_t size, int flags, dev_win_t **win)
{
    dev_state_t *s = h->state;
    *win = NULL;
    if (s == NULL) return base_error(loomInternalError, LOG_CUDA, "device executor not set up");
    LOOM_CHECK(broken(h));
    CUcontext prev = dev_ctx_enter(s);
    loomResult_t res = win_register(s, buff, size, flags, win);
    dev_ctx_leave(s, prev);
    return res;
}

static void win_release(dev_state_t *s, dev_win_t *w)
{
    if (w->mapped)
        for (int j = 0; j < s->lay.n; j++)
            if (j != s->lay.me) dev_ipc_unpin(s, j, w->peer_id[j]);
    free(w);
}

loomResult_t dev_win_deregister(dev_host_t *h, dev_win_t *win)
{
    dev_state_t *s = h->state;
    dev_win_t **pp = s ? &s->win.list : NULL;
    while (pp && *pp && *pp != win)
        pp = &(*pp)->next;
    if (pp == NULL || *pp == NULL)
        return base_error(loomInvalidArgument, LOG_CUDA,
                          "loomCommWindowDeregister: rank %d: %p is not a window registered on "
                          "this communicator (never registered, or deregistered already)",
                          h->rank, (void *)win);
    CUcontext prev = dev_ctx_enter(s);
    /* Calls queued on any stream that may use the window (a communicator's calls run one at a
     * time, in call order, so the last one's end is every one's), here and, since every rank
     * meets below after its own wait, on the peers that read this rank's buffer. */
    dev_drain(s);
    loomResult_t res = loomSuccess;
    const char *why = NULL;
    if (h->error(h, &why) == loomSuccess && (s->stg.multinode || !one_process(s))) {
        /* every rank deregisters the same window */
        uint64_t mine = win->seq, *all = calloc((size_t)h->nranks, sizeof(*all));
        res = all ? gather(s, &mine, all, sizeof(mine))
                  : base_error(loomSystemError, LOG_CUDA, "out of memory");
        for (int r = 0; r < h->nranks && res == loomSuccess; r++)
            if (all[r] != mine)
                res = base_error(loomInvalidUsage, LOG_CUDA,
                                 "loomCommWindowDeregister: rank %d deregisters window %llu "
                                 "[0x%llx, +%zu), rank %d window %llu: windows are deregistered "
                                 "collectively, every rank the same one",
                                 h->rank, (unsigned long long)mine, (unsigned long long)win->base,
                                 win->size, r, (unsigned long long)all[r]);
        free(all);
    }
    /* a broken communicator meets nobody: the window is only let go here */
    if (res == loomSuccess) {
        *pp = win->next;
        win_release(s, win);
    }
    dev_ctx_leave(s, prev);
    return res;
}

void dev_win_free_all(dev_state_t *s)
{
    while (s->win.list) {
        dev_win_t *w = s->win.list;
        s->win.list = w->next;
        free(w); /* the mappings go with the IPC cache */
    }
}

loomResult_t dev_win_find(dev_state_t *s, const void *p, size_t len, const char *what,
                          dev_win_t **out)
{
    *out = NULL;
    if (len == 0 || s->win.list == NULL) return loomSuccess;
    const CUdeviceptr lo = (CUdeviceptr)(uintptr_t)p, hi = lo + len;
    const dev_win_t *partly = NULL;
    for (dev_win_t *w = s->win.list; w; w = w->next) {
        if (lo >= w->base && hi <= w->base + w->size) {
            if (w->mapped) *out = w;
            return loomSuccess;
        }
        if (lo < w->base + w->size && w->base < hi && partly == NULL) partly = w;
    }
    if (partly)
        return base_error(loomInvalidArgument, LOG_CUDA,
                          "rank %d: %s [%p, +%zu) lies partly inside window %llu [0x%llx, +%zu): "
                          "a buffer lies inside one window or outside every window",
                          s->h->rank, what, p, len, (unsigned long long)partly->seq,
                          (unsigned long long)partly->base, partly->size);
    return loomSuccess;
}

/* Rank j's buffer at the offset of p in my window w. */
static char *peer_at(const dev_win_t *w, int j, const void *p)
{
    return (char *)(uintptr_t)(w->peer[j] + ((CUdeviceptr)(uintptr_t)p - w->base));
}

loomResult_t dev_win_run(dev_state_t *s, const dev_op_t *o, CUstream st, bool launch, bool *done)
{
    *done = false;
    const int n = s->lay.n, me = s->lay.me;
    const size_t es = red_type_size(o->type), S = o->count * es;
    size_t sb = S, rb = S;
    switch (o->kind) {
    case OPK_ALLREDUCE:
    case OPK_BROADCAST: break;
    case OPK_REDUCESCATTER: sb = S * (size_t)n; break;
    case OPK_ALLGATHER: rb = S * (size_t)n; break;
    default: return loomSuccess;
    }
    if (S == 0 || n < 2) return loomSuccess;
    dev_win_t *ws = NULL, *wr = NULL;
    LOOM_CHECK(dev_win_find(s, o->send, sb, "sendbuff", &ws));
    LOOM_CHECK(dev_win_find(s, o->recv, rb, "recvbuff", &wr));
    if (!launch || ws == NULL || wr == NULL || !(ws->flags & DEV_WIN_SYMMETRIC) ||
        !(wr->flags & DEV_WIN_SYMMETRIC))
        return loomSuccess;
    const bool reduces = o->kind == OPK_ALLREDUCE || o->kind == OPK_REDUCESCATTER;
    if (reduces && base_premul_index(o->op) >= 0) return loomSuccess; /* scaled: slots */
    dev_args_t a;
    dev_args_init(s, &a, DEV_DIRECT, o->kind, o->send, o->recv);
    if (reduces) dev_set_reduction(&a, o, o->op);
    for (int j = 0; j < n; j++)
        if (j != me) {
            a.peer_send[j] = peer_at(ws, j, o->send);
            a.peer_recv[j] = peer_at(wr, j, o->recv);
        }
    const char *path = "";
    switch (o->kind) {
    case OPK_ALLREDUCE: {
        /* one shot below the direct path's size (each block's share must fit its scratch, for
         * in place), else two: every rank decides alike from the size alone */
        uint64_t nb = (uint64_t)s->lay.nblocks, ch = ((S + nb - 1) / nb + 15) & ~15ull;
        bool one = (s->ipc.direct_min == 0 || S < s->ipc.direct_min) &&
                   ch <= (uint64_t)s->lay.nslot * s->lay.slot;
        if (one) {
            uintptr_t sp = (uintptr_t)o->send, rp = (uintptr_t)o->recv;
            a.self_len = S;
            a.direct_stage = sp < rp + S && rp < sp + S;
            path = "one shot on windows";
        } else {
            size_t off, len;
            dev_seg_of(o->count, es, n, me, &off, &len);
            a.self_src = a.self_dst = off * es;
            a.self_len = len * es;
            a.direct_fanout = 1;
            path = "two shots on windows";
        }
        break;
    }
    case OPK_REDUCESCATTER:
        a.self_src = (size_t)me * S;
        a.self_len = S;
        path = "reduce-scatter on windows";
        break;
    case OPK_ALLGATHER: {
        /* in place, every rank's input is its own slice of its output: rank j's at j * S */
        const bool ip = (uintptr_t)o->send == (uintptr_t)o->recv + (size_t)me * S;
        a.direct_copy = 1;
        for (int j = 0; j < n; j++) {
            a.io[j] = (dev_io_t){0, 0, (size_t)j * S, S};
            if (ip && j != me)
                a.peer_send[j] = peer_at(wr, j, (const char *)o->recv + (size_t)j * S);
        }
        path = "allgather on windows";
        break;
    }
    default: /* broadcast: every rank copies the root's buffer (the root its own, unless in place)
              */
        a.direct_copy = 1;
        a.io[o->root] = (dev_io_t){0, 0, 0, S};
        path = "broadcast on windows";
        break;
    }
    LOOM_CHECK(dev_launch_direct(s, &a, st, path));
    *done = true;
    return loomSuccess;
}
