/*
 * The device executor's setup and teardown (see dev.h, dev_impl.h), and loomMemAlloc.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "dev_impl.h"
#include "param.h"

extern const unsigned char loom_kernels_fatbin[];
extern const size_t loom_kernels_fatbin_size;

/* ---- context ---- */

CUcontext dev_ctx_enter(dev_state_t *s)
{
    return cudrv_ctx_enter(s->drv.d, s->drv.ctx);
}

void dev_ctx_leave(dev_state_t *s, CUcontext prev)
{
    cudrv_ctx_leave(s->drv.d, s->drv.ctx, prev);
}

/* ---- setup ---- */

typedef struct {
    cuda_export_t exp;
    uint8_t uuid[16];
    int32_t dev, nblocks;
    uint64_t slot, oneshot, lla_max, ce_min;
    int32_t pid, nslot, threads, push_threads;
    /* local rank 0's segment for comparing the ranks' collectives (dev_calls.c) */
    int32_t calls_pid, calls_fd;
    uint64_t calls_nonce;
} dev_rec_t;

/* Setup runs in three local phases separated by two allgathers. Several communicators that
 * one thread drives (loomCommInitAll) meet their first device buffers in one group, so the
 * phases run for all of them together and each allgather is one group across them. */
typedef struct {
    dev_state_t *s;
    dev_rec_t mine;
    dev_rec_t *all;
} setup_t;

static loomResult_t setup_local(dev_host_t *h, setup_t *u)
{
    const int dev = h->cuda_dev;
    const char *why = NULL;
    const cudrv_t *d = cudrv_get(&why);
    if (d == NULL)
        return base_error(loomInvalidUsage, LOG_CUDA, "rank %d: device buffer but %s", h->rank,
                          why);
    dev_state_t *s = calloc(1, sizeof(*s));
    u->all = calloc((size_t)h->nranks, sizeof(dev_rec_t));
    if (s == NULL || u->all == NULL) {
        free(s);
        return base_error(loomSystemError, LOG_CUDA, "out of memory");
    }
    u->s = s;
    s->h = h;
    s->drv.d = d;
    s->drv.dev = dev;
    for (int j = 0; j < DEV_MAX_LOCAL; j++)
        s->wd.pidfd[j] = -1;
    pthread_mutex_init(&s->stg.qlock, NULL);
    s->calls.fd = -1;
    pthread_mutex_init(&s->calls.lock, NULL);
    h->state = s;
    CUresult cr = d->cuDeviceGet(&s->drv.cudev, dev);
    if (cr == CUDA_SUCCESS) cr = d->cuDevicePrimaryCtxRetain(&s->drv.ctx, s->drv.cudev);
    if (cr != CUDA_SUCCESS) {
        s->drv.ctx = NULL;
        return base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: GPU %d: %s", h->rank, dev,
                          cudrv_err(cr));
    }
    CUcontext prev = dev_ctx_enter(s);
    cr = d->cuModuleLoadData(&s->drv.mod, loom_kernels_fatbin);
    if (cr == CUDA_SUCCESS) cr = d->cuModuleGetFunction(&s->drv.fn, s->drv.mod, "loom_exchange");
    if (cr == CUDA_SUCCESS) cr = d->cuModuleGetFunction(&s->drv.fn_ce, s->drv.mod, "loom_ce");
    if (cr == CUDA_SUCCESS)
        cr = d->cuModuleGetFunction(&s->drv.fn_copy, s->drv.mod, "loom_fuse_copy");
    for (int t = 0; t < loomNumTypes && cr == CUDA_SUCCESS; t++)
        for (int o = 0; o < 4 && cr == CUDA_SUCCESS; o++) {
            char name[32];
            snprintf(name, sizeof(name), "loom_lla_%d_%d", t, o);
            cr = d->cuModuleGetFunction(&s->drv.fn_lla[t][o], s->drv.mod, name);
        }
    if (cr == CUDA_SUCCESS) cr = d->cuEventCreate(&s->run.ev, CU_EVENT_DISABLE_TIMING);
    if (cr == CUDA_SUCCESS)
        cr = d->cuMemHostAlloc((void **)&s->xg.err, 4096,
                               CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
    if (cr == CUDA_SUCCESS) {
        memset((void *)s->xg.err, 0, 4096);
        s->xg.flags = (uint32_t *)((char *)s->xg.err + 2048);
        cr = d->cuMemHostGetDevicePointer(&s->xg.err_dev, (void *)s->xg.err, 0);
    }
    dev_ctx_leave(s, prev);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: loading loom's kernels on GPU %d: %s (this build's kernels are "
                          "for sm_90 with PTX for newer GPUs)",
                          h->rank, dev, cudrv_err(cr));
    s->xg.flags_dev = s->xg.err_dev + 2048;
    /* The node's ranks, in communicator order. */
    s->lay.n = h->local_size;
    s->lay.me = h->local_rank;
    if (s->lay.n > DEV_MAX_LOCAL)
        return base_error(loomInvalidUsage, LOG_CUDA,
                          "rank %d: %d ranks of this communicator are on one node; the device "
                          "executor takes at most %d GPUs per node",
                          h->rank, s->lay.n, DEV_MAX_LOCAL);
    for (int j = 0; j < s->lay.n; j++)
        s->lay.lrank[j] = h->node_ranks[h->node_start[h->node] + j];
    /* Sizes: rank 0's parameters hold for the job (the layout must match everywhere). */
    dev_rec_t *m = &u->mine;
    memset(m, 0, sizeof(*m));
    m->dev = dev;
    m->pid = (int32_t)getpid();
    m->nblocks = (int32_t)LOOM_MAX(1, LOOM_MIN(param_int(PARAM_CUDA_BLOCKS), DEV_MAX_BLOCKS));
    m->slot = LOOM_MAX(DEV_MIN_PIECE, LOOM_MIN(param_size(PARAM_CUDA_SLOT), 16ull << 20)) & ~15ull;
    m->oneshot = param_size(PARAM_CUDA_ONESHOT);
    m->ce_min = param_size(PARAM_CUDA_CE);
    m->lla_max = LOOM_MIN(param_size(PARAM_CUDA_LL), 64ull << 20);
    m->nslot = (int32_t)LOOM_MAX(2, LOOM_MIN(param_int(PARAM_CUDA_NSLOT), 16));
    m->threads =
        (int32_t)LOOM_MAX(64, LOOM_MIN(param_int(PARAM_CUDA_THREADS), DEV_MAX_THREADS)) / 64 * 64;
    /* the receive side does more memory traffic (it reads two inputs when it reduces) */
    m->push_threads =
        (int32_t)LOOM_MAX(32, LOOM_MIN(param_int(PARAM_CUDA_PUSH_THREADS), m->threads - 32)) / 32 *
        32;
    CUuuid uu;
    if (d->cuDeviceGetUuid(&uu, s->drv.cudev) == CUDA_SUCCESS) memcpy(m->uuid, uu.bytes, 16);
    return loomSuccess;
}

/* After the first allgather: check the layout, allocate and clear the exchange region. */
static loomResult_t setup_region(setup_t *u)
{
    dev_state_t *s = u->s;
    dev_host_t *h = s->h;
    const cudrv_t *d = s->drv.d;
    dev_rec_t *all = u->all;
    s->lay.nblocks = all[0].nblocks;
    s->lay.slot = all[0].slot;
    s->lay.oneshot = all[0].oneshot;
    s->ce.min = all[0].ce_min;
    s->lla.max = s->lay.n > 1 ? all[0].lla_max : 0;
    s->lla.cap = (s->lla.max / (uint64_t)LOOM_MAX(1, s->lay.n - 1) + 7) / 8;
    if (s->lla.cap == 0) s->lla.max = 0;
    s->lay.nslot = all[0].nslot;
    s->lay.threads = all[0].threads;
    s->lay.push_threads = all[0].push_threads;
    s->lay.empty = (int)param_int(PARAM_CUDA_EMPTY);
    s->lla.pdl = param_int(PARAM_CUDA_PDL) != 0;
    s->lay.couple = (int)param_int(PARAM_CUDA_COUPLE);
    int memop64 = 0; /* stream waits on 64-bit counts */
    s->drv.d->cuDeviceGetAttribute(&memop64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                   s->drv.cudev);
    s->run.counted_max = memop64 ? param_size(PARAM_CUDA_COUNTED) : 0;
    for (int j = 0; j < s->lay.n; j++) {
        int q = s->lay.lrank[j];
        if (q != h->rank && memcmp(all[q].uuid, u->mine.uuid, 16) == 0 &&
            !param_int(PARAM_CUDA_SHARE_GPU))
            return base_error(loomInvalidUsage, LOG_CUDA,
                              "rank %d and rank %d of this communicator both use the same GPU "
                              "(device %d here, device %d there): one rank per GPU",
                              h->rank, q, s->drv.dev, all[q].dev);
    }
    if (s->lay.n > 1 && s->lay.me == 0) {
        uint64_t nonce = 0;
        int fd = dev_calls_offer(s->lay.n, &nonce);
        u->mine.calls_pid = (int32_t)getpid();
        u->mine.calls_fd = fd;
        u->mine.calls_nonce = fd >= 0 ? nonce : 0;
    }
    size_t bytes =
        DEV_REGION_BYTES(s->lay.n, s->lay.nblocks, s->lay.nslot, s->lay.slot, s->lla.cap);
    CUcontext prev = dev_ctx_enter(s);
    loomResult_t res = cuda_tp_alloc(d, s->drv.dev, bytes, &s->xg.mem[s->lay.me], &u->mine.exp);
    if (res == loomSuccess) {
        /* A private stream: the first call may come while the caller's stream is being
         * captured, where work on the legacy stream is not allowed. */
        CUstream st = NULL;
        CUresult cr = d->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
        if (cr == CUDA_SUCCESS)
            cr = d->cuMemsetD8Async(s->xg.mem[s->lay.me].ptr, 0, s->xg.mem[s->lay.me].size, st);
        if (cr == CUDA_SUCCESS) cr = d->cuStreamSynchronize(st);
        if (st) d->cuStreamDestroy(st);
        if (cr != CUDA_SUCCESS)
            res = base_error(loomUnhandledCudaError, LOG_CUDA,
                             "rank %d: clearing the exchange memory: %s", h->rank, cudrv_err(cr));
    }
    dev_ctx_leave(s, prev);
    return res;
}

/* After the second allgather: map the node's other regions and start the watchdog. */
static loomResult_t setup_peers(setup_t *u)
{
    dev_state_t *s = u->s;
    dev_rec_t *all = u->all;
    CUcontext prev = dev_ctx_enter(s);
    loomResult_t res = loomSuccess;
    for (int j = 0; j < s->lay.n && res == loomSuccess; j++) {
        if (j == s->lay.me) continue;
        int q = s->lay.lrank[j];
        res = cuda_tp_import(s->drv.d, s->drv.dev, &all[q].exp, q, &s->xg.mem[j]);
        s->wd.pid[j] = all[q].exp.pid;
        if (all[q].exp.pid != (int32_t)getpid())
            s->wd.pidfd[j] = (int)syscall(SYS_pidfd_open, (pid_t)all[q].exp.pid, 0);
    }
    dev_ctx_leave(s, prev);
    LOOM_CHECK(res);
    if (s->lay.n > 1) {
        const dev_rec_t *r0 = &all[s->lay.lrank[0]];
        dev_calls_attach(s, r0->calls_pid, r0->calls_fd, r0->calls_nonce);
    }
    /* Direct mapping of user buffers needs CUDA IPC between processes: every local rank in its
     * own process (the same answer on every rank: all know all pids). */
    s->ipc.direct_min = param_size(PARAM_CUDA_DIRECT);
    s->ipc.direct_ok = s->ipc.direct_min > 0;
    for (int j = 0; j < s->lay.n; j++)
        for (int k = 0; k < j; k++) {
            int pj = j == s->lay.me ? (int)getpid() : s->wd.pid[j];
            int pk = k == s->lay.me ? (int)getpid() : s->wd.pid[k];
            if (pj == pk) s->ipc.direct_ok = false;
        }
    LOOM_CHECK(dev_watch_start(s));
    INFO(
        LOG_CUDA,
        "device executor on GPU %d: %d GPU rank(s) on this node, %d blocks, %d slots of %llu "
        "bytes, "
        "%zu bytes of exchange memory; one shot up to %llu bytes, low-latency allreduce up to %llu",
        s->drv.dev, s->lay.n, s->lay.nblocks, s->lay.nslot, (unsigned long long)s->lay.slot,
        s->xg.mem[s->lay.me].size, (unsigned long long)s->lay.oneshot,
        (unsigned long long)(s->lla.max / (uint64_t)LOOM_MAX(1, s->lay.n - 1)));
    return loomSuccess;
}

static loomResult_t gather_recs(setup_t *u, int k)
{
    dev_host_t **hs = calloc((size_t)k, sizeof(*hs));
    const void **snd = calloc((size_t)k, sizeof(*snd));
    void **rcv = calloc((size_t)k, sizeof(*rcv));
    loomResult_t r = loomSystemError;
    if (hs && snd && rcv) {
        for (int i = 0; i < k; i++) {
            hs[i] = u[i].s->h;
            snd[i] = &u[i].mine;
            rcv[i] = u[i].all;
        }
        r = hs[0]->allgather(hs, snd, rcv, sizeof(dev_rec_t), k);
    } else {
        base_error(r, LOG_CUDA, "out of memory");
    }
    free(hs);
    free(snd);
    free(rcv);
    return r;
}

static loomResult_t setup_all(dev_host_t *const *hs, int k);

/* The first device call may be made while the caller's stream is being captured (nccl-tests'
 * -G with no warm-up, a framework capturing its first step): the setup allocates and maps
 * memory, which a global or thread-local capture forbids this thread unless it captures
 * relaxed for the while, as NCCL does for its own setup. */
loomResult_t dev_setup(dev_host_t *const *hs, int k)
{
    const cudrv_t *d = cudrv_get(NULL);
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (d) d->cuThreadExchangeStreamCaptureMode(&mode);
    loomResult_t res = setup_all(hs, k);
    if (d) d->cuThreadExchangeStreamCaptureMode(&mode);
    return res;
}

static loomResult_t setup_all(dev_host_t *const *hs, int k)
{
    setup_t *u = calloc((size_t)k, sizeof(*u));
    if (u == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
    loomResult_t res = loomSuccess;
    for (int i = 0; i < k && res == loomSuccess; i++)
        res = setup_local(hs[i], &u[i]);
    if (res == loomSuccess) res = gather_recs(u, k);
    for (int i = 0; i < k && res == loomSuccess; i++)
        res = setup_region(&u[i]);
    if (res == loomSuccess) res = gather_recs(u, k);
    for (int i = 0; i < k && res == loomSuccess; i++)
        res = setup_peers(&u[i]);
    for (int i = 0; i < k && res == loomSuccess; i++) {
        dev_state_t *s = u[i].s;
        s->stg.multinode = s->h->nnodes > 1;
        if (!s->stg.multinode) continue;
        if (k > 1)
            res = base_error(loomInvalidUsage, LOG_CUDA,
                             "device buffers across nodes need one thread per rank (one "
                             "thread drives %d communicators here)",
                             k);
        else
            res = dev_stage_open(s);
    }
    if (res != loomSuccess) {
        char text[DEV_TEXT_MAX];
        snprintf(text, sizeof(text), "%s", base_last_error());
        for (int i = 0; i < k; i++)
            hs[i]->set_error(hs[i], res, text);
        base_set_error_text(text);
    }
    for (int i = 0; i < k; i++)
        free(u[i].all);
    free(u);
    return res;
}

bool dev_ready(const dev_host_t *h)
{
    return h->state != NULL;
}

/* ---- teardown ---- */

void dev_abort(dev_host_t *h)
{
    dev_state_t *s = h->state;
    if (s == NULL) return;
    if (s->xg.err) s->xg.err->abort = 1;
    /* a job's host collectives may be waiting for peers on the staging communicators */
    if (s->stg.staged) h->stage_stop(h, "the parent communicator was aborted");
}

void dev_free(dev_host_t *h)
{
    dev_state_t *s = h->state;
    if (s == NULL) return;
    const cudrv_t *d = s->drv.d;
    CUcontext prev = s->drv.ctx ? dev_ctx_enter(s) : NULL;
    /* Kernels in flight read the memory below: wait for the last one (an aborted one ends
     * within its poll interval). */
    dev_drain(s);
    /* Then nothing of this state may run on core's progress thread: stop (the poll functions
     * start nothing more), detach (they are not running and will not run again), free. The
     * staging poll is still attached during the drain: it releases the stream's waits. */
    atomic_store(&s->wd.stop, 1);
    dev_stage_detach(s);
    dev_watch_detach(s);
    if (s->stg.staged) h->stage_close(h);
    dev_win_free_all(s);
    dev_ce_free(s);
    dev_calls_free(s);
    if (s->fz.buf) d->cuMemFree(s->fz.buf);
    dev_ipc_close_all(s);
    for (int j = 0; j < DEV_MAX_LOCAL; j++) {
        if (s->xg.mem[j].mapped || s->xg.mem[j].fd > 0) cuda_tp_release(d, &s->xg.mem[j]);
        if (s->wd.pidfd[j] >= 0) close(s->wd.pidfd[j]);
    }
    for (int i = 0; i < STAGE_RING; i++)
        if (s->stg.ring[i]) d->cuMemFreeHost(s->stg.ring[i]);
    if (s->stg.arena) d->cuMemFreeHost(s->stg.arena);
    for (int i = 0; i < s->stg.nretired; i++)
        d->cuMemFreeHost(s->stg.retired[i]);
    free(s->stg.retired);
    if (s->xg.err) d->cuMemFreeHost((void *)s->xg.err);
    if (s->run.ev) d->cuEventDestroy(s->run.ev);
    if (s->drv.mod) d->cuModuleUnload(s->drv.mod);
    if (s->drv.ctx) {
        dev_ctx_leave(s, prev);
        d->cuDevicePrimaryCtxRelease(s->drv.cudev);
    }
    pthread_mutex_destroy(&s->stg.qlock);
    free(s);
    h->state = NULL;
}

/* ---- loomMemAlloc ---- */

loomResult_t dev_mem_alloc(void **ptr, size_t size)
{
    const char *why = NULL;
    const cudrv_t *d = cudrv_get(&why);
    if (d == NULL) return base_error(loomInvalidUsage, LOG_CUDA, "loomMemAlloc: %s", why);
    CUcontext c = NULL;
    d->cuCtxGetCurrent(&c);
    if (c == NULL)
        return base_error(loomInvalidUsage, LOG_CUDA,
                          "loomMemAlloc: no CUDA context is current on this thread (select a "
                          "device first, e.g. cudaSetDevice)");
    CUdeviceptr p = 0;
    CUresult cr = d->cuMemAlloc(&p, LOOM_MAX(size, 1));
    if (cr != CUDA_SUCCESS)
        return base_error(cr == CUDA_ERROR_OUT_OF_MEMORY ? loomSystemError : loomUnhandledCudaError,
                          LOG_CUDA, "loomMemAlloc of %zu bytes: %s", size, cudrv_err(cr));
    *ptr = (void *)(uintptr_t)p;
    return loomSuccess;
}

loomResult_t dev_mem_free(void *ptr)
{
    const cudrv_t *d = cudrv_get(NULL);
    if (d == NULL)
        return base_error(loomInvalidUsage, LOG_CUDA, "loomMemFree: %p: no CUDA driver", ptr);
    CUresult cr = d->cuMemFree((CUdeviceptr)(uintptr_t)ptr);
    if (cr != CUDA_SUCCESS)
        return base_error(loomInvalidArgument, LOG_CUDA, "loomMemFree(%p): %s", ptr, cudrv_err(cr));
    return loomSuccess;
}
