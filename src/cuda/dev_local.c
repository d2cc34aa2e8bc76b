/*
 * The device executor (see dev.h).
 *
 * Same node: one launch of loom_exchange (loom_lla_* for the latency path) per collective (two for
 * a two-shot allreduce) on the caller's stream; the plans below say which byte ranges go to
 * which peer. Cost for n local ranks and S bytes, per rank: one-shot allreduce (n-1)S out over
 * the links; two-shot, reduce-scatter and allgather 2(n-1)S/n; broadcast S from the root to
 * each peer.
 *
 * Across nodes: pinned host memory and the host transports, driven by a proxy thread per
 * communicator. An allreduce on several nodes with the same number of GPUs each runs
 * hierarchically: reduce-scatter inside the node on the GPUs, an allreduce of this rank's shard
 * across nodes (pieces of LOOM_CUDA_STAGE_CHUNK: the copy of piece k+1 to the host overlaps the
 * network for piece k and the copy back of piece k-1), then an allgather inside the node.
 */
#include "dev.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cuda_tp.h"
#include "cudrv.h"
#include "kernels.h"
#include "param.h"
#include "reduce.h"
#include "schedule.h"

extern const unsigned char loom_kernels_fatbin[];
extern const size_t loom_kernels_fatbin_size;

#define STAGE_RING 4      /* pinned pieces in flight per communicator (allreduce pipeline) */
#define DEV_IPC_CACHE 32  /* mapped user allocations per peer (LRU) */
#define DEV_TEXT_MAX 1024 /* error texts */

typedef struct stage_job {
    struct stage_job *next;
    uint32_t val;
    int nops;
    host_op_t ops[];
} stage_job_t;

struct dev_state {
    dev_host_t *h; /* the communicator, as core shows it */
    const cudrv_t *d;
    int dev;
    CUdevice cudev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn, fn_lla[10][4]; /* loom_exchange; loom_lla_<dtype>_<op> */
    int n, me;                    /* ranks of this node in the exchange, and my index */
    int lrank[DEV_MAX_LOCAL];     /* their communicator ranks */
    int nblocks, nslot, threads, push_threads, empty, couple;
    uint64_t slot, oneshot;
    uint64_t lla_max, lla_cap; /* DEV_LLA: largest S*(n-1), chunks per writer and parity */
    uint64_t lla_step;         /* DEV_LLA: the last step the host numbered */
    bool lla_lanes;            /* DEV_LLA: since a captured call, the lanes count their steps */
    bool pdl;                  /* DEV_LLA: programmatic dependent launches */
    cuda_mem_t mem[DEV_MAX_LOCAL];
    dev_err_t *err; /* host-mapped */
    CUdeviceptr err_dev;
    CUevent ev;
    CUstream last;
    bool have_last;       /* a call was ordered on `last`, its completion marked by ... */
    bool last_counted;    /* ... the DEV_OFF_LDONE count reaching ldone_want, else by ev */
    bool ev_valid;        /* ev was recorded (after the last call that was not counted) */
    uint64_t counted_max; /* LOOM_CUDA_COUNTED (0 without 64-bit stream waits on this GPU) */
    bool counted;         /* this call's launch was counted (set by run_lla) */
    uint64_t ldone_want;  /* blocks of the counted DEV_LLA launches so far */
    uint64_t seq;
    int opkind[64]; /* kind of the last launches, by seq, for error texts */
    /* direct allreduce: user buffers mapped through CUDA IPC, cached by allocation identity
     * (CU_POINTER_ATTRIBUTE_BUFFER_ID: a caching allocator reuses addresses, never ids) */
    bool direct_ok;
    uint64_t direct_min, ipc_clock;
    struct ipc_out {
        uint64_t id, use;
        CUipcMemHandle h;
    } ipc_out[DEV_IPC_CACHE];
    struct ipc_in {
        uint64_t id, use;
        CUdeviceptr base;
    } ipc_in[DEV_MAX_LOCAL][DEV_IPC_CACHE];
    /* watchdog: peers' process exits and kernel failures */
    pthread_t wd;
    bool wd_live;
    atomic_int stop;
    int wake_fd;
    int pidfd[DEV_MAX_LOCAL];
    int pid[DEV_MAX_LOCAL];
    /* across nodes */
    bool multinode, hier_ok;
    bool staged;     /* the host side's communicators are open */
    uint32_t *flags; /* host-mapped: [0] ready (stream -> proxy), [1] done (proxy -> stream) */
    CUdeviceptr flags_dev;
    uint32_t next_val;
    uint8_t *ring[STAGE_RING];
    size_t ring_bytes;
    int ring_next;
    uint8_t *arena;
    size_t arena_bytes;
    void **retired;
    int nretired;
    pthread_t proxy;
    bool proxy_live;
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    stage_job_t *qhead, *qtail;
};

static const char *kind_name(int k)
{
    return sched_opkind_name(k);
}

/* ---- context ---- */

static CUcontext ctx_enter(dev_state_t *s)
{
    CUcontext prev = NULL;
    s->d->cuCtxGetCurrent(&prev);
    if (prev != s->ctx) s->d->cuCtxSetCurrent(s->ctx);
    return prev;
}

static void ctx_leave(dev_state_t *s, CUcontext prev)
{
    if (prev != s->ctx) s->d->cuCtxSetCurrent(prev);
}

/* ---- errors ---- */

/* The kernel's failure record as the communicator's error. */
void dev_poll(dev_host_t *h)
{
    dev_state_t *s = h->state;
    if (s == NULL || s->err == NULL || s->err->code == DEV_ERR_NONE) return;
    if (h->error(h, NULL) != loomSuccess) return;
    __sync_synchronize();
    dev_err_t e = *(dev_err_t *)s->err;
    int peer = e.peer >= 0 && e.peer < s->n ? s->lrank[e.peer] : -1;
    char text[DEV_TEXT_MAX];
    if (e.code == DEV_ERR_TIMEOUT)
        snprintf(text, sizeof(text),
                 "rank %d: the GPU kernel of %s (device operation %llu) waited %.1f s for rank "
                 "%d (block %d, %s step %llu, saw %llu) and gave up (LOOM_TIMEOUT=%g s): that "
                 "rank died, stalled, or did not make the same call",
                 h->rank, kind_name(s->opkind[e.seq % 64]), e.seq, e.waited_ns / 1e9, peer, e.block,
                 e.wait_kind == DEV_WAIT_ACK ? "acknowledgement of" : "data of", e.step, e.seen,
                 h->timeout_s);
    else
        snprintf(text, sizeof(text),
                 "rank %d: the GPU kernel of %s (device operation %llu) stopped while waiting for "
                 "rank %d: the communicator was aborted",
                 h->rank, kind_name(s->opkind[e.seq % 64]), e.seq, peer);
    WARN(LOG_CUDA, "%s", text);
    h->set_error(h, e.code == DEV_ERR_TIMEOUT ? loomRemoteError : loomInvalidUsage, text);
}

static void *wd_main(void *arg)
{
    dev_state_t *s = arg;
    dev_host_t *h = s->h;
    log_set_rank(h->rank);
    struct pollfd fds[DEV_MAX_LOCAL + 1];
    while (!atomic_load(&s->stop)) {
        int nf = 0, who[DEV_MAX_LOCAL + 1];
        fds[nf] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
        who[nf++] = -1;
        for (int j = 0; j < s->n; j++)
            if (s->pidfd[j] >= 0) {
                fds[nf] = (struct pollfd){.fd = s->pidfd[j], .events = POLLIN};
                who[nf++] = j;
            }
        int k = poll(fds, (nfds_t)nf, 100);
        if (atomic_load(&s->stop)) break;
        for (int i = 1; k > 0 && i < nf; i++) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            int j = who[i];
            close(s->pidfd[j]);
            s->pidfd[j] = -1;
            char text[DEV_TEXT_MAX];
            snprintf(text, sizeof(text),
                     "rank %d: rank %d (pid %d, GPU peer on this node) exited; its GPU memory "
                     "flags will never move again, so device collectives on this communicator "
                     "stop with this error (kernels in flight were told to give up)",
                     h->rank, s->lrank[j], s->pid[j]);
            s->err->abort = 1;
            WARN(LOG_CUDA, "%s", text);
            h->set_error(h, loomRemoteError, text);
        }
        dev_poll(h);
    }
    return NULL;
}

/* ---- setup ---- */

typedef struct {
    cuda_export_t exp;
    uint8_t uuid[16];
    int32_t dev, nblocks;
    uint64_t slot, oneshot, lla_max;
    int32_t pid, nslot, threads, push_threads;
} dev_rec_t;

static loomResult_t stage_start(dev_state_t *s);

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
    s->d = d;
    s->dev = dev;
    s->wake_fd = -1;
    for (int j = 0; j < DEV_MAX_LOCAL; j++)
        s->pidfd[j] = -1;
    pthread_mutex_init(&s->qlock, NULL);
    pthread_cond_init(&s->qcond, NULL);
    h->state = s;
    CUresult cr = d->cuDeviceGet(&s->cudev, dev);
    if (cr == CUDA_SUCCESS) cr = d->cuDevicePrimaryCtxRetain(&s->ctx, s->cudev);
    if (cr != CUDA_SUCCESS) {
        s->ctx = NULL;
        return base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: GPU %d: %s", h->rank, dev,
                          cudrv_err(cr));
    }
    CUcontext prev = ctx_enter(s);
    cr = d->cuModuleLoadData(&s->mod, loom_kernels_fatbin);
    if (cr == CUDA_SUCCESS) cr = d->cuModuleGetFunction(&s->fn, s->mod, "loom_exchange");
    for (int t = 0; t < 10 && cr == CUDA_SUCCESS; t++)
        for (int o = 0; o < 4 && cr == CUDA_SUCCESS; o++) {
            char name[32];
            snprintf(name, sizeof(name), "loom_lla_%d_%d", t, o);
            cr = d->cuModuleGetFunction(&s->fn_lla[t][o], s->mod, name);
        }
    if (cr == CUDA_SUCCESS) cr = d->cuEventCreate(&s->ev, CU_EVENT_DISABLE_TIMING);
    if (cr == CUDA_SUCCESS)
        cr = d->cuMemHostAlloc((void **)&s->err, 4096,
                               CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
    if (cr == CUDA_SUCCESS) {
        memset((void *)s->err, 0, 4096);
        s->flags = (uint32_t *)((char *)s->err + 2048);
        cr = d->cuMemHostGetDevicePointer(&s->err_dev, (void *)s->err, 0);
    }
    ctx_leave(s, prev);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: loading loom's kernels on GPU %d: %s (this build's kernels are "
                          "for sm_90 with PTX for newer GPUs)",
                          h->rank, dev, cudrv_err(cr));
    s->flags_dev = s->err_dev + 2048;
    /* The node's ranks, in communicator order. */
    s->n = h->local_size;
    s->me = h->local_rank;
    if (s->n > DEV_MAX_LOCAL)
        return base_error(loomInvalidUsage, LOG_CUDA,
                          "rank %d: %d ranks of this communicator are on one node; the device "
                          "executor takes at most %d GPUs per node",
                          h->rank, s->n, DEV_MAX_LOCAL);
    for (int j = 0; j < s->n; j++)
        s->lrank[j] = h->node_ranks[h->node_start[h->node] + j];
    /* Sizes: rank 0's parameters hold for the job (the layout must match everywhere). */
    dev_rec_t *m = &u->mine;
    memset(m, 0, sizeof(*m));
    m->dev = dev;
    m->pid = (int32_t)getpid();
    m->nblocks = (int32_t)LOOM_MAX(1, LOOM_MIN(param_int(PARAM_CUDA_BLOCKS), DEV_MAX_BLOCKS));
    m->slot = LOOM_MAX(DEV_MIN_PIECE, LOOM_MIN(param_size(PARAM_CUDA_SLOT), 16ull << 20)) & ~15ull;
    m->oneshot = param_size(PARAM_CUDA_ONESHOT);
    m->lla_max = LOOM_MIN(param_size(PARAM_CUDA_LL), 64ull << 20);
    m->nslot = (int32_t)LOOM_MAX(2, LOOM_MIN(param_int(PARAM_CUDA_NSLOT), 16));
    m->threads =
        (int32_t)LOOM_MAX(64, LOOM_MIN(param_int(PARAM_CUDA_THREADS), DEV_MAX_THREADS)) / 64 * 64;
    /* the receive side does more memory traffic (it reads two inputs when it reduces) */
    m->push_threads =
        (int32_t)LOOM_MAX(32, LOOM_MIN(param_int(PARAM_CUDA_PUSH_THREADS), m->threads - 32)) / 32 *
        32;
    CUuuid uu;
    if (d->cuDeviceGetUuid(&uu, s->cudev) == CUDA_SUCCESS) memcpy(m->uuid, uu.bytes, 16);
    return loomSuccess;
}

/* After the first allgather: check the layout, allocate and clear the exchange region. */
static loomResult_t setup_region(setup_t *u)
{
    dev_state_t *s = u->s;
    dev_host_t *h = s->h;
    const cudrv_t *d = s->d;
    dev_rec_t *all = u->all;
    s->nblocks = all[0].nblocks;
    s->slot = all[0].slot;
    s->oneshot = all[0].oneshot;
    s->lla_max = s->n > 1 ? all[0].lla_max : 0;
    s->lla_cap = (s->lla_max / (uint64_t)LOOM_MAX(1, s->n - 1) + 7) / 8;
    if (s->lla_cap == 0) s->lla_max = 0;
    s->nslot = all[0].nslot;
    s->threads = all[0].threads;
    s->push_threads = all[0].push_threads;
    s->empty = (int)param_int(PARAM_CUDA_EMPTY);
    s->pdl = param_int(PARAM_CUDA_PDL) != 0;
    s->couple = (int)param_int(PARAM_CUDA_COUPLE);
    int memop64 = 0; /* stream waits on 64-bit counts */
    s->d->cuDeviceGetAttribute(&memop64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                               s->cudev);
    s->counted_max = memop64 ? param_size(PARAM_CUDA_COUNTED) : 0;
    for (int j = 0; j < s->n; j++) {
        int q = s->lrank[j];
        if (q != h->rank && memcmp(all[q].uuid, u->mine.uuid, 16) == 0 &&
            !param_int(PARAM_CUDA_SHARE_GPU))
            return base_error(loomInvalidUsage, LOG_CUDA,
                              "rank %d and rank %d of this communicator both use the same GPU "
                              "(device %d here, device %d there): one rank per GPU",
                              h->rank, q, s->dev, all[q].dev);
    }
    size_t bytes = DEV_REGION_BYTES(s->n, s->nblocks, s->nslot, s->slot, s->lla_cap);
    CUcontext prev = ctx_enter(s);
    loomResult_t res = cuda_tp_alloc(d, s->dev, bytes, &s->mem[s->me], &u->mine.exp);
    if (res == loomSuccess) {
        /* A private stream: the first call may come while the caller's stream is being
         * captured, where work on the legacy stream is not allowed. */
        CUstream st = NULL;
        CUresult cr = d->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
        if (cr == CUDA_SUCCESS)
            cr = d->cuMemsetD8Async(s->mem[s->me].ptr, 0, s->mem[s->me].size, st);
        if (cr == CUDA_SUCCESS) cr = d->cuStreamSynchronize(st);
        if (st) d->cuStreamDestroy(st);
        if (cr != CUDA_SUCCESS)
            res = base_error(loomUnhandledCudaError, LOG_CUDA,
                             "rank %d: clearing the exchange memory: %s", h->rank, cudrv_err(cr));
    }
    ctx_leave(s, prev);
    return res;
}

/* After the second allgather: map the node's other regions and start the watchdog. */
static loomResult_t setup_peers(setup_t *u)
{
    dev_state_t *s = u->s;
    dev_rec_t *all = u->all;
    CUcontext prev = ctx_enter(s);
    loomResult_t res = loomSuccess;
    for (int j = 0; j < s->n && res == loomSuccess; j++) {
        if (j == s->me) continue;
        int q = s->lrank[j];
        res = cuda_tp_import(s->d, s->dev, &all[q].exp, q, &s->mem[j]);
        s->pid[j] = all[q].exp.pid;
        if (all[q].exp.pid != (int32_t)getpid())
            s->pidfd[j] = (int)syscall(SYS_pidfd_open, (pid_t)all[q].exp.pid, 0);
    }
    ctx_leave(s, prev);
    LOOM_CHECK(res);
    /* Direct mapping of user buffers needs CUDA IPC between processes: every local rank in its
     * own process (the same answer on every rank: all know all pids). */
    s->direct_min = param_size(PARAM_CUDA_DIRECT);
    s->direct_ok = s->direct_min > 0;
    for (int j = 0; j < s->n; j++)
        for (int k = 0; k < j; k++) {
            int pj = j == s->me ? (int)getpid() : s->pid[j];
            int pk = k == s->me ? (int)getpid() : s->pid[k];
            if (pj == pk) s->direct_ok = false;
        }
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0 || pthread_create(&s->wd, NULL, wd_main, s) != 0)
        return base_error(loomSystemError, LOG_CUDA, "starting the GPU watchdog thread failed");
    s->wd_live = true;
    INFO(
        LOG_CUDA,
        "device executor on GPU %d: %d GPU rank(s) on this node, %d blocks, %d slots of %llu "
        "bytes, "
        "%zu bytes of exchange memory; one shot up to %llu bytes, low-latency allreduce up to %llu",
        s->dev, s->n, s->nblocks, s->nslot, (unsigned long long)s->slot, s->mem[s->me].size,
        (unsigned long long)s->oneshot,
        (unsigned long long)(s->lla_max / (uint64_t)LOOM_MAX(1, s->n - 1)));
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

loomResult_t dev_setup(dev_host_t *const *hs, int k)
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
        s->multinode = s->h->nnodes > 1;
        if (!s->multinode) continue;
        if (k > 1)
            res = base_error(loomInvalidUsage, LOG_CUDA,
                             "device buffers across nodes need one thread per rank (one "
                             "thread drives %d communicators here)",
                             k);
        else
            res = stage_start(s);
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

/* ---- launching ---- */

static bool capturing(dev_state_t *s, CUstream st)
{
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    s->d->cuStreamIsCapturing(st, &cs);
    return cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Orders work of this communicator on `st` after its previous work on another stream: the
 * lane counters in device memory must see one kernel at a time. A stream handle may be
 * destroyed by its owner after the call, so nothing is ever recorded on an earlier stream: the
 * last call left its mark when it was made. A latency-path call's mark is the count of its
 * finished blocks in device memory (a stream wait on it here); any other call's is an event
 * recorded after it (cuEventRecord costs the host ~0.2-0.3 us, a twentieth of a small call). */
static loomResult_t order_stream(dev_state_t *s, CUstream st, bool cap)
{
    if (cap || !s->have_last || s->last == st) return loomSuccess;
    CUresult cr = s->last_counted
                      ? s->d->cuStreamWaitValue64(st, s->mem[s->me].ptr + DEV_OFF_LDONE,
                                                  s->ldone_want, CU_STREAM_WAIT_VALUE_GEQ)
                      : s->d->cuStreamWaitEvent(st, s->ev, 0);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: ordering after the previous stream (%s): %s", s->h->rank,
                          s->last_counted ? "cuStreamWaitValue64" : "cuStreamWaitEvent",
                          cudrv_err(cr));
    return loomSuccess;
}

static loomResult_t mark_stream(dev_state_t *s, CUstream st, bool cap)
{
    if (cap) return loomSuccess;
    if (!s->counted) {
        CUresult cr = s->d->cuEventRecord(s->ev, st);
        if (cr != CUDA_SUCCESS)
            return base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: cuEventRecord: %s",
                              s->h->rank, cudrv_err(cr));
        s->ev_valid = true;
    }
    s->last_counted = s->counted;
    s->last = st;
    s->have_last = true;
    return loomSuccess;
}

/* Waits on the host for every kernel of this communicator launched so far. */
static void drain(dev_state_t *s)
{
    if (!s->have_last) return;
    if (!s->last_counted) {
        s->d->cuEventSynchronize(s->ev);
        return;
    }
    /* every counted kernel adds its blocks, also one that gave up (abort, timeout) */
    for (;;) {
        uint64_t v = 0;
        if (s->d->cuMemcpyDtoH(&v, s->mem[s->me].ptr + DEV_OFF_LDONE, sizeof(v)) != CUDA_SUCCESS ||
            v >= s->ldone_want)
            return;
        usleep(20);
    }
}

static void args_init(dev_state_t *s, dev_args_t *a, int mode, int kind, const void *send,
                      void *recv)
{
    memset(a, 0, sizeof(*a));
    a->n = s->n;
    a->me = s->me;
    a->mode = mode;
    a->nblocks = s->nblocks;
    a->slot = s->slot;
    a->nslot = s->nslot;
    a->push_threads = s->push_threads;
    a->empty = s->empty;
    a->timeout_ns = (unsigned long long)(s->h->timeout_s * 1e9);
    a->send = send;
    a->recv = recv;
    a->err = (dev_err_t *)(uintptr_t)s->err_dev;
    for (int j = 0; j < s->n; j++)
        a->region[j] = (char *)(uintptr_t)s->mem[j].ptr;
    a->seq = ++s->seq;
    s->opkind[a->seq % 64] = kind;
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
        unsigned long long ch = dev_piece_bytes(lens[i], s->nblocks, s->slot);
        unsigned long long used = (lens[i] + ch - 1) / ch;
        if (used > most) most = used;
    }
    return (unsigned)LOOM_MAX(1, LOOM_MIN(most, (unsigned long long)s->nblocks));
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
    CUfunction fn = a->mode == DEV_LLA ? s->fn_lla[a->dtype][a->op] : s->fn;
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
        cr = s->d->cuLaunchKernelEx(&cfg, fn, params, NULL);
    } else {
        cr = s->d->cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, st, params, NULL);
    }
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: launching the kernel of %s (%s, device operation %llu): %s",
                          s->h->rank, kind_name(s->opkind[a->seq % 64]), path, a->seq,
                          cudrv_err(cr));
    return loomSuccess;
}

/* The slot path: only the blocks whose lanes carry pieces. */
static loomResult_t launch(dev_state_t *s, dev_args_t *a, CUstream st)
{
    a->alias = s->couple || aliases(a);
    return go(s, a, grid_of(s, a), (unsigned)s->threads, st, false, "slots");
}

/* The reduction fields of a kernel's arguments (op: o's, or another that replaces it). */
static void set_reduction(dev_args_t *a, const dev_op_t *o, loomRedOp_t op)
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
static void seg_of(size_t count, size_t es, int n, int j, size_t *start, size_t *len)
{
    size_t unit = 16 / es, per = (count + (size_t)n - 1) / (size_t)n;
    per = (per + unit - 1) / unit * unit;
    size_t st = LOOM_MIN((size_t)j * per, count);
    *start = st;
    *len = LOOM_MIN(per, count - st);
}

static loomResult_t stage_allreduce(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap);
static loomResult_t stage_generic(dev_state_t *s, const dev_op_t *o, int nops, CUstream st,
                                  bool cap);

/* Same-node collectives: the plans of the exchange. */
typedef struct {
    int32_t ok, pad;
    uint64_t sid, soff, rid, roff;
    CUipcMemHandle sh, rh;
} direct_rec_t;

/* The IPC handle of the allocation holding p, and p's offset in it. */
static bool ipc_export(dev_state_t *s, const void *p, uint64_t *id, uint64_t *off,
                       CUipcMemHandle *h)
{
    const cudrv_t *d = s->d;
    CUdeviceptr base = 0, dp = (CUdeviceptr)(uintptr_t)p;
    size_t size = 0;
    unsigned long long bid = 0;
    if (d->cuPointerGetAttribute(&bid, CU_POINTER_ATTRIBUTE_BUFFER_ID, dp) != CUDA_SUCCESS ||
        d->cuMemGetAddressRange(&base, &size, dp) != CUDA_SUCCESS)
        return false;
    *id = bid;
    *off = dp - base;
    struct ipc_out *lru = &s->ipc_out[0];
    for (int i = 0; i < DEV_IPC_CACHE; i++) {
        struct ipc_out *e = &s->ipc_out[i];
        if (e->use && e->id == bid) {
            e->use = ++s->ipc_clock;
            *h = e->h;
            return true;
        }
        if (e->use < lru->use) lru = e;
    }
    /* memory from the VMM API (expandable segments) has no legacy handle: the slot path */
    if (d->cuIpcGetMemHandle(h, base) != CUDA_SUCCESS) return false;
    *lru = (struct ipc_out){.id = bid, .use = ++s->ipc_clock, .h = *h};
    return true;
}

/* Rank j's allocation `id`, mapped here (opened once, then from the cache). */
static loomResult_t ipc_import(dev_state_t *s, int j, uint64_t id, const CUipcMemHandle *h,
                               CUdeviceptr *base)
{
    struct ipc_in *lru = &s->ipc_in[j][0];
    for (int i = 0; i < DEV_IPC_CACHE; i++) {
        struct ipc_in *e = &s->ipc_in[j][i];
        if (e->use && e->id == id) {
            e->use = ++s->ipc_clock;
            *base = e->base;
            return loomSuccess;
        }
        if (e->use < lru->use) lru = e;
    }
    if (lru->use) { /* evict: kernels already queued may still read through it */
        if (s->ev_valid) s->d->cuEventSynchronize(s->ev); /* only direct kernels read there */
        s->d->cuIpcCloseMemHandle(lru->base);
        lru->use = 0;
    }
    CUresult cr = s->d->cuIpcOpenMemHandle(base, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: mapping rank %d's buffer (allocation %llu): "
                          "cuIpcOpenMemHandle: %s",
                          s->h->rank, s->lrank[j], (unsigned long long)id, cudrv_err(cr));
    *lru = (struct ipc_in){.id = id, .use = ++s->ipc_clock, .base = *base};
    return loomSuccess;
}

/* A large allreduce or reduce-scatter reading the peers' inputs where they are (DEV_DIRECT).
 * Every rank enters on the same conditions; what only a rank knows (its buffers exportable,
 * its stream not being captured) travels in the exchange, and all go direct only if all can.
 * An allreduce writes each reduced segment into every rank's output; a reduce-scatter's
 * segment is the rank's own output, so only the inputs are mapped. */
static loomResult_t run_direct(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap, bool *done)
{
    const bool rs = o->kind == OPK_REDUCESCATTER;
    size_t es = red_type_size(o->type), S = o->count * es, total = rs ? S * (size_t)s->n : S;
    *done = false;
    /* a reduce-scatter moves half an allreduce's bytes for the same exchange of handles on the
     * host (tens of us): measured on 2 H200s, direct lost to NCCL at 4 MiB of input (0.6x) and
     * won from 64 MiB (1.3x), so it starts at four times the allreduce's size */
    if (!s->direct_ok || total < (rs ? 4 : 1) * s->direct_min || base_premul_index(o->op) >= 0 ||
        s->n < 2)
        return loomSuccess;
    direct_rec_t mine = {.ok = !cap}, *all = calloc((size_t)s->h->nranks, sizeof(*all));
    if (all == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
    if (mine.ok)
        mine.ok = ipc_export(s, o->send, &mine.sid, &mine.soff, &mine.sh) &&
                  (rs || ipc_export(s, o->recv, &mine.rid, &mine.roff, &mine.rh));
    const void *sp = &mine;
    void *rp = all;
    loomResult_t res = s->h->allgather(&s->h, &sp, &rp, sizeof(mine), 1);
    bool ok = res == loomSuccess;
    for (int j = 0; j < s->n && ok; j++)
        ok = all[s->lrank[j]].ok;
    dev_args_t a;
    if (ok) {
        args_init(s, &a, DEV_DIRECT, o->kind, o->send, o->recv);
        set_reduction(&a, o, o->op);
        a.direct_fanout = !rs;
        for (int j = 0; j < s->n && res == loomSuccess; j++) {
            if (j == s->me) continue;
            const direct_rec_t *r = &all[s->lrank[j]];
            CUdeviceptr sb = 0, rb = 0;
            res = ipc_import(s, j, r->sid, &r->sh, &sb);
            if (res == loomSuccess && !rs) res = ipc_import(s, j, r->rid, &r->rh, &rb);
            a.peer_send[j] = (const char *)(uintptr_t)(sb + r->soff);
            a.peer_recv[j] = rs ? NULL : (char *)(uintptr_t)(rb + r->roff);
        }
    }
    free(all);
    LOOM_CHECK(res);
    if (!ok) return loomSuccess;
    if (rs) {
        a.self_src = (size_t)s->me * S;
        a.self_dst = 0;
        a.self_len = S;
    } else {
        size_t off, len;
        seg_of(o->count, es, s->n, s->me, &off, &len);
        a.self_src = a.self_dst = off * es;
        a.self_len = len * es;
    }
    LOOM_CHECK(go(s, &a, (unsigned)s->nblocks, (unsigned)s->threads, st, false,
                  "direct reads of the peers' buffers"));
    *done = true;
    return loomSuccess;
}

/* A small or medium allreduce or reduce-scatter in low-latency words (DEV_LLA): one launch, no
 * flags. */
static loomResult_t run_lla(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap)
{
    dev_args_t a;
    size_t S = o->count * red_type_size(o->type);
    args_init(s, &a, DEV_LLA, o->kind, o->send, o->recv);
    set_reduction(&a, o, o->op);
    a.self_len = S;
    a.lla_seg = o->kind == OPK_REDUCESCATTER ? S : 0;
    a.lla_base = DEV_LLA_BASE(s->n, s->nblocks, s->nslot, s->slot);
    a.lla_cap = s->lla_cap;
    /* a graph replays its launches with the step it captured: from the first capture on,
     * the lanes number their own steps (kernels.h) */
    if (cap) s->lla_lanes = true;
    a.lla_step = s->lla_lanes ? 0 : ++s->lla_step;
    /* graph replays are never counted; from a few KiB the kernel's fence before the count
     * costs more GPU time than the event costs the host (perf/RESULTS.md) */
    a.lla_count = a.lla_step && S <= s->counted_max;
    unsigned grid, threads;
    dev_lla_launch(S, s->nblocks, &grid, &threads);
    LOOM_CHECK(go(s, &a, grid, threads, st, s->pdl && !cap, "low-latency words"));
    if (a.lla_count) { /* the kernel counts its blocks (kernels.h) */
        s->ldone_want += grid;
        s->counted = true;
    }
    return loomSuccess;
}

static loomResult_t run_local(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap)
{
    size_t es = red_type_size(o->type), S = o->count * es;
    int n = s->n, me = s->me;
    dev_args_t a;
    switch (o->kind) {
    case OPK_ALLREDUCE: {
        if (S > 0 && (uint64_t)S * (uint64_t)(n - 1) <= s->lla_max) return run_lla(s, o, st, cap);
        bool done = false;
        LOOM_CHECK(run_direct(s, o, st, cap, &done));
        if (done) return loomSuccess;
        bool oneshot = n <= 2 || S <= s->oneshot;
        if (oneshot) {
            args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
            set_reduction(&a, o, o->op);
            for (int j = 0; j < n; j++)
                if (j != me) a.io[j] = (dev_io_t){0, S, 0, S};
            a.self_len = S;
            return launch(s, &a, st);
        }
        size_t off, len, offj, lenj;
        seg_of(o->count, es, n, me, &off, &len);
        args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        set_reduction(&a, o, o->op);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            seg_of(o->count, es, n, j, &offj, &lenj);
            a.io[j] = (dev_io_t){offj * es, lenj * es, 0, len * es};
        }
        a.self_src = a.self_dst = off * es;
        a.self_len = len * es;
        LOOM_CHECK(launch(s, &a, st));
        args_init(s, &a, DEV_COPY, o->kind, o->recv, o->recv);
        for (int j = 0; j < n; j++) {
            if (j == me) continue;
            seg_of(o->count, es, n, j, &offj, &lenj);
            a.io[j] = (dev_io_t){off * es, len * es, offj * es, lenj * es};
        }
        return launch(s, &a, st);
    }
    case OPK_BROADCAST: {
        int root = o->root; /* same node: communicator rank = local index */
        args_init(s, &a, DEV_COPY, o->kind, o->send, o->recv);
        if (me == root) {
            for (int j = 0; j < n; j++)
                if (j != me) a.io[j].send_len = S;
            a.self_len = o->send != o->recv ? S : 0;
        } else {
            a.io[root].recv_len = S;
        }
        return launch(s, &a, st);
    }
    case OPK_REDUCE: {
        int root = o->root;
        args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        set_reduction(&a, o, o->op);
        if (me == root) {
            for (int j = 0; j < n; j++)
                if (j != me) a.io[j].recv_len = S;
            a.self_len = S;
        } else {
            a.io[root].send_len = S;
        }
        return launch(s, &a, st);
    }
    case OPK_ALLGATHER:
        args_init(s, &a, DEV_COPY, o->kind, o->send, o->recv);
        for (int j = 0; j < n; j++)
            if (j != me) a.io[j] = (dev_io_t){0, S, (size_t)j * S, S};
        a.self_dst = (size_t)me * S;
        a.self_len = S;
        return launch(s, &a, st);
    case OPK_REDUCESCATTER: {
        if (S > 0 && (uint64_t)S * (uint64_t)(n - 1) <= s->lla_max) return run_lla(s, o, st, cap);
        bool done = false;
        LOOM_CHECK(run_direct(s, o, st, cap, &done));
        if (done) return loomSuccess;
        args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        set_reduction(&a, o, o->op);
        for (int j = 0; j < n; j++)
            if (j != me) a.io[j] = (dev_io_t){(size_t)j * S, S, 0, S};
        a.self_src = (size_t)me * S;
        a.self_len = S;
        return launch(s, &a, st);
    }
    case OPK_ALLTOALL:
        args_init(s, &a, DEV_COPY, o->kind, o->send, o->recv);
        for (int j = 0; j < n; j++)
            if (j != me) a.io[j] = (dev_io_t){(size_t)j * S, S, (size_t)j * S, S};
        a.self_src = a.self_dst = (size_t)me * S;
        a.self_len = S;
        return launch(s, &a, st);
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
        args_init(s, &a, DEV_COPY, OPK_SEND, NULL, NULL);
        bool any = false;
        int sends[DEV_MAX_LOCAL] = {0}, recvs[DEV_MAX_LOCAL] = {0};
        const dev_op_t *self_send = NULL, *self_recv = NULL;
        for (int i = 0; i < nops; i++) {
            const dev_op_t *o = &ops[i];
            int j = o->root;
            size_t bytes = o->count * red_type_size(o->type);
            if (j < 0 || j >= s->n) continue;
            if (o->kind == OPK_SEND && sends[j]++ == layer) {
                if (j == s->me)
                    self_send = o;
                else
                    a.io[j].send_off = (uintptr_t)o->send, a.io[j].send_len = bytes;
                any = true;
            } else if (o->kind == OPK_RECV && recvs[j]++ == layer) {
                if (j == s->me)
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
            for (int j = 0; j < s->n; j++)
                peers |= a.io[j].send_len || a.io[j].recv_len;
            if (!peers) {
                layer++;
                continue; /* zero-byte calls only */
            }
        }
        LOOM_CHECK(launch(s, &a, st));
        layer++;
    }
}

loomResult_t dev_run(dev_host_t *h, const dev_op_t *ops, int nops)
{
    dev_state_t *s = h->state;
    if (s == NULL) return base_error(loomInternalError, LOG_CUDA, "device executor not set up");
    dev_poll(h);
    const char *why = NULL;
    loomResult_t broken = h->error(h, &why);
    if (broken != loomSuccess) return base_error(broken, LOG_CUDA, "%s", why);
    CUcontext prev = ctx_enter(s);
    loomResult_t res = loomSuccess;
    for (int i = 0; i < nops && res == loomSuccess;) {
        const dev_op_t *o = &ops[i];
        CUstream st = (CUstream)o->stream;
        bool cap = capturing(s, st);
        int k = 1;
        if (o->kind == OPK_SEND || o->kind == OPK_RECV)
            while (i + k < nops && (ops[i + k].kind == OPK_SEND || ops[i + k].kind == OPK_RECV))
                k++;
        res = order_stream(s, st, cap);
        s->counted = false;
        /* the other streams of a point-to-point run wait for the first, and it for them */
        for (int q = 1; q < k && res == loomSuccess; q++) {
            CUstream sq = (CUstream)ops[i + q].stream;
            if (sq == st || cap) continue;
            if (s->d->cuEventRecord(s->ev, sq) != CUDA_SUCCESS ||
                s->d->cuStreamWaitEvent(st, s->ev, 0) != CUDA_SUCCESS)
                res = base_error(loomUnhandledCudaError, LOG_CUDA,
                                 "rank %d: joining the streams of a group", h->rank);
        }
        if (res != loomSuccess) break;
        if (s->multinode) {
            if (o->kind == OPK_ALLREDUCE)
                res = stage_allreduce(s, o, st, cap);
            else
                res = stage_generic(s, o, k, st, cap);
        } else if (k > 1 || o->kind == OPK_SEND || o->kind == OPK_RECV) {
            res = run_p2p(s, o, k, st);
        } else {
            res = run_local(s, o, st, cap);
        }
        if (res == loomSuccess) res = mark_stream(s, st, cap);
        for (int q = 1; q < k && res == loomSuccess; q++) {
            CUstream sq = (CUstream)ops[i + q].stream;
            if (sq == st || cap) continue;
            CUresult cr = s->d->cuStreamWaitEvent(sq, s->ev, 0); /* recorded on st above */
            if (cr != CUDA_SUCCESS)
                res = base_error(loomUnhandledCudaError, LOG_CUDA,
                                 "rank %d: joining the streams of a group: %s", h->rank,
                                 cudrv_err(cr));
        }
        i += k;
    }
    ctx_leave(s, prev);
    return res;
}

/* ---- across nodes: pinned host memory and a proxy thread ---- */

static void *proxy_main(void *arg);

static loomResult_t stage_start(dev_state_t *s)
{
    dev_host_t *h = s->h;
    /* Equal GPUs per node: the hierarchical allreduce (shards cross nodes between the ranks of
     * the same local index). Otherwise the whole buffer crosses through the staging copy of
     * the communicator, whose host algorithms know the layout. */
    s->hier_ok = s->n > 1;
    for (int nd = 0; nd < h->nnodes; nd++)
        if (h->node_start[nd + 1] - h->node_start[nd] != s->n) s->hier_ok = false;
    s->staged = true; /* closed at dev_free even if opening fails half way */
    LOOM_CHECK(h->stage_open(h, s->hier_ok ? s->me : -1));
    if (pthread_create(&s->proxy, NULL, proxy_main, s) != 0)
        return base_error(loomSystemError, LOG_CUDA, "starting the GPU proxy thread failed");
    s->proxy_live = true;
    INFO(LOG_CUDA, "device buffers cross %d nodes through pinned host memory (%s)", h->nnodes,
         s->hier_ok ? "hierarchical allreduce" : "whole buffers");
    return loomSuccess;
}

static loomResult_t pinned(dev_state_t *s, uint8_t **p, size_t *have, size_t want)
{
    if (*have >= want && *p) return loomSuccess;
    if (*p) { /* an earlier job may still read it until the stream passes it: keep it */
        void **r = realloc(s->retired, (size_t)(s->nretired + 1) * sizeof(void *));
        if (r == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
        s->retired = r;
        s->retired[s->nretired++] = *p;
        *p = NULL;
    }
    size_t sz = LOOM_MAX(want, (size_t)1 << 20);
    CUresult cr = s->d->cuMemHostAlloc((void **)p, sz, CU_MEMHOSTALLOC_PORTABLE);
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
    j->val = ++s->next_val;
    j->nops = nops;
    memcpy(j->ops, ops, (size_t)nops * sizeof(host_op_t));
    pthread_mutex_lock(&s->qlock);
    if (s->qtail)
        s->qtail->next = j;
    else
        s->qhead = j;
    s->qtail = j;
    pthread_cond_signal(&s->qcond);
    pthread_mutex_unlock(&s->qlock);
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
    STREAM_CU(s->d->cuStreamWriteValue32(st, s->flags_dev, val, 0));
    return loomSuccess;
}

static loomResult_t stream_wait(dev_state_t *s, CUstream st, uint32_t val)
{
    STREAM_CU(s->d->cuStreamWaitValue32(st, s->flags_dev + 4, val, CU_STREAM_WAIT_VALUE_GEQ));
    return loomSuccess;
}

static loomResult_t refuse_capture(dev_state_t *s, const dev_op_t *o)
{
    return base_error(loomInvalidUsage, LOG_CUDA,
                      "rank %d: %s on device buffers across nodes cannot be captured in a CUDA "
                      "graph (its network part runs on a host proxy); capture same-node "
                      "communicators only",
                      s->h->rank, kind_name(o->kind));
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

static loomResult_t stage_allreduce(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap)
{
    if (cap) return refuse_capture(s, o);
    int pm = base_premul_index(o->op);
    if (pm >= 0 && o->scale_dev && !s->hier_ok)
        return base_error(loomInvalidUsage, LOG_CUDA,
                          "rank %d: a pre-multiplied sum with a device-resident scalar cannot "
                          "cross nodes with this layout (uneven GPUs per node)",
                          s->h->rank);
    size_t es = red_type_size(o->type);
    size_t off = 0, len = o->count;
    const char *src = o->send;
    char *dst = o->recv;
    if (s->hier_ok) {
        /* reduce-scatter inside the node (sum; premul scaled there) */
        dev_args_t a;
        seg_of(o->count, es, s->n, s->me, &off, &len);
        args_init(s, &a, DEV_REDUCE, o->kind, o->send, o->recv);
        set_reduction(&a, o, o->op == loomAvg ? loomSum : o->op);
        for (int j = 0; j < s->n; j++) {
            if (j == s->me) continue;
            size_t oj, lj;
            seg_of(o->count, es, s->n, j, &oj, &lj);
            a.io[j] = (dev_io_t){oj * es, lj * es, 0, len * es};
        }
        a.self_src = a.self_dst = off * es;
        a.self_len = len * es;
        LOOM_CHECK(launch(s, &a, st));
        src = o->recv;
    }
    /* the shard (or the whole buffer) through the pinned ring, piece by piece */
    size_t chunk = LOOM_MAX(param_size(PARAM_CUDA_STAGE_CHUNK), 4096) / es * es;
    LOOM_CHECK(pinned(s, &s->ring[0], &s->ring_bytes, chunk));
    for (int i = 1; i < STAGE_RING; i++) {
        size_t have = s->ring[i] ? s->ring_bytes : 0;
        LOOM_CHECK(pinned(s, &s->ring[i], &have, s->ring_bytes));
    }
    size_t bytes = len * es, npieces = (bytes + chunk - 1) / chunk;
    uint32_t vals[STAGE_RING];
    for (size_t k = 0; npieces && k < npieces + STAGE_RING - 1; k++) {
        if (k < npieces) {
            size_t pos = k * chunk, pl = LOOM_MIN(chunk, bytes - pos);
            uint8_t *h = s->ring[k % STAGE_RING];
            STREAM_CU(
                s->d->cuMemcpyDtoHAsync(h, (CUdeviceptr)(uintptr_t)(src + off * es + pos), pl, st));
            host_op_t hop = {.kind = OPK_ALLREDUCE,
                             .count = pl / es,
                             .type = o->type,
                             .root = -1,
                             .hsend = h,
                             .hrecv = h,
                             .cross = s->hier_ok};
            if (!s->hier_ok) {
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
            STREAM_CU(s->d->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)(dst + off * es + pos),
                                              s->ring[back % STAGE_RING], pl, st));
        }
    }
    if (s->hier_ok) {
        dev_args_t a;
        args_init(s, &a, DEV_COPY, o->kind, o->recv, o->recv);
        for (int j = 0; j < s->n; j++) {
            if (j == s->me) continue;
            size_t oj, lj;
            seg_of(o->count, es, s->n, j, &oj, &lj);
            a.io[j] = (dev_io_t){off * es, len * es, oj * es, lj * es};
        }
        LOOM_CHECK(launch(s, &a, st));
    }
    return loomSuccess;
}

/* Any other collective, or a run of send/recv, across nodes: whole buffers through pinned
 * memory, the host executor doing the network part. */
static loomResult_t stage_generic(dev_state_t *s, const dev_op_t *o, int nops, CUstream st,
                                  bool cap)
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
    res = pinned(s, &s->arena, &s->arena_bytes, need);
    for (int i = 0; i < nops && res == loomSuccess; i++) {
        const dev_op_t *q = &o[i];
        size_t S = q->count * red_type_size(q->type);
        uint8_t *h = s->arena + in_off[i];
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
            if (r == q->root) cr = s->d->cuMemcpyDtoHAsync(h, dsend, S, st);
            break;
        case OPK_REDUCE:
        case OPK_REDUCESCATTER:
        case OPK_SEND:
            if (q->kind == OPK_REDUCESCATTER) {
                cr = s->d->cuMemcpyDtoHAsync(h, dsend, S * (size_t)p, st);
                hp->hrecv = h + (size_t)r * S;
            } else {
                cr = s->d->cuMemcpyDtoHAsync(h, dsend, S, st);
            }
            break;
        case OPK_ALLGATHER:
            hp->hsend = h + (size_t)r * S;
            cr = s->d->cuMemcpyDtoHAsync(hp->hsend, dsend, S, st);
            break;
        case OPK_ALLTOALL:
            hp->hrecv = h + S * (size_t)p;
            cr = s->d->cuMemcpyDtoHAsync(h, dsend, S * (size_t)p, st);
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
        CUresult cr = s->d->cuMemcpyHtoDAsync(drecv, hops[i].hrecv, out, st);
        if (cr != CUDA_SUCCESS)
            res = base_error(loomUnhandledCudaError, LOG_CUDA, "rank %d: copy to device: %s", r,
                             cudrv_err(cr));
    }
    free(in_off);
    free(hops);
    return res;
}

/* A job's host part: scale pre-multiplied inputs, run the collectives on the host side, divide
 * hierarchical averages. */
static loomResult_t proxy_run(dev_state_t *s, stage_job_t *j)
{
    for (int i = 0; i < j->nops; i++) {
        host_op_t *o = &j->ops[i];
        /* the cross-node communicator has one rank per node, the staging one every rank */
        size_t ranks = (size_t)(o->cross ? s->h->nnodes : s->h->nranks);
        if (o->scaled && o->hsend)
            red_host_scale(o->type, o->hsend, o->hsend, o->scale,
                           o->kind == OPK_REDUCESCATTER ? o->count * ranks : o->count);
    }
    LOOM_CHECK(s->h->stage_run(s->h, j->ops, j->nops));
    for (int i = 0; i < j->nops; i++)
        if (j->ops[i].div > 1)
            red_host_div(j->ops[i].type, j->ops[i].hrecv, j->ops[i].hrecv, j->ops[i].div,
                         j->ops[i].count);
    return loomSuccess;
}

static void *proxy_main(void *arg)
{
    dev_state_t *s = arg;
    dev_host_t *h = s->h;
    log_set_rank(h->rank);
    for (;;) {
        pthread_mutex_lock(&s->qlock);
        while (s->qhead == NULL && !atomic_load(&s->stop))
            pthread_cond_wait(&s->qcond, &s->qlock);
        stage_job_t *j = s->qhead;
        if (j) {
            s->qhead = j->next;
            if (s->qhead == NULL) s->qtail = NULL;
        }
        pthread_mutex_unlock(&s->qlock);
        if (j == NULL) break; /* stopping */
        /* the stream hands the piece over once its copy to the host is done */
        volatile uint32_t *ready = &s->flags[0];
        uint64_t t0 = base_now_ns();
        bool ok = true;
        while ((int32_t)(*ready - j->val) < 0) {
            if (atomic_load(&s->stop) || s->err->abort) {
                ok = false;
                break;
            }
            if (base_now_ns() - t0 > 20000) usleep(20);
        }
        __sync_synchronize();
        if (ok && h->error(h, NULL) == loomSuccess) {
            loomResult_t r = proxy_run(s, j);
            if (r != loomSuccess) {
                char text[DEV_TEXT_MAX];
                snprintf(text, sizeof(text),
                         "rank %d: the network part of a device collective failed: %s", h->rank,
                         base_last_error());
                h->set_error(h, r, text);
            }
        }
        /* released even after a failure, so that the stream never waits forever; the
         * communicator's error says the results are void */
        __sync_synchronize();
        s->flags[1] = j->val;
        free(j);
    }
    return NULL;
}

/* ---- teardown ---- */

static void dev_stop_threads(dev_state_t *s)
{
    atomic_store(&s->stop, 1);
    if (s->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(s->wake_fd, &one, sizeof(one));
        (void)w;
    }
    if (s->wd_live) pthread_join(s->wd, NULL);
    s->wd_live = false;
    pthread_mutex_lock(&s->qlock);
    pthread_cond_broadcast(&s->qcond);
    pthread_mutex_unlock(&s->qlock);
    if (s->proxy_live) pthread_join(s->proxy, NULL);
    s->proxy_live = false;
}

void dev_abort(dev_host_t *h)
{
    dev_state_t *s = h->state;
    if (s == NULL) return;
    if (s->err) s->err->abort = 1;
    /* the proxy may be blocked in a host collective of the staging communicators */
    if (s->staged) h->stage_stop(h, "the parent communicator was aborted");
}

void dev_free(dev_host_t *h)
{
    dev_state_t *s = h->state;
    if (s == NULL) return;
    const cudrv_t *d = s->d;
    CUcontext prev = s->ctx ? ctx_enter(s) : NULL;
    /* Kernels in flight read the memory below: wait for the last one (an aborted one ends
     * within its poll interval). */
    drain(s);
    dev_stop_threads(s);
    for (stage_job_t *j = s->qhead, *n; j; j = n) {
        n = j->next;
        free(j);
    }
    if (s->staged) h->stage_close(h);
    for (int j = 0; j < DEV_MAX_LOCAL; j++)
        for (int i = 0; i < DEV_IPC_CACHE; i++)
            if (s->ipc_in[j][i].use) d->cuIpcCloseMemHandle(s->ipc_in[j][i].base);
    for (int j = 0; j < DEV_MAX_LOCAL; j++) {
        if (s->mem[j].mapped || s->mem[j].fd > 0) cuda_tp_release(d, &s->mem[j]);
        if (s->pidfd[j] >= 0) close(s->pidfd[j]);
    }
    for (int i = 0; i < STAGE_RING; i++)
        if (s->ring[i]) d->cuMemFreeHost(s->ring[i]);
    if (s->arena) d->cuMemFreeHost(s->arena);
    for (int i = 0; i < s->nretired; i++)
        d->cuMemFreeHost(s->retired[i]);
    free(s->retired);
    if (s->err) d->cuMemFreeHost((void *)s->err);
    if (s->ev) d->cuEventDestroy(s->ev);
    if (s->mod) d->cuModuleUnload(s->mod);
    if (s->ctx) {
        ctx_leave(s, prev);
        d->cuDevicePrimaryCtxRelease(s->cudev);
    }
    if (s->wake_fd >= 0) close(s->wake_fd);
    pthread_mutex_destroy(&s->qlock);
    pthread_cond_destroy(&s->qcond);
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
