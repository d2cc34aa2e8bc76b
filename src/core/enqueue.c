/*
 * Collective and point-to-point entry points, and groups: the public API's side of a call.
 *
 * Every call is checked completely before anything happens (a bad argument changes nothing),
 * then queued on the calling thread's group queue; outside a group the queue is run at once.
 * Running it hands device-buffer operations to the device executor (ordered on their streams,
 * nothing to wait for) and the host ones to core's internal entry (coll.h), which turns each
 * communicator's operations into schedules and drives them together on this thread.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coll.h"
#include "comm.h"
#include "fuse.h"
#include "memtype.h"
#ifdef LOOM_HAVE_CUDA
#include "dev.h"
#endif

static _Thread_local int group_depth;
/* Inside an open group: calls made so far, and the first that failed (its code, its position,
 * its text). The group's end then runs none of the queued operations and returns that error:
 * a group that ran without one of its sends or receives would pair the rest wrongly, and the
 * caller, who checks the end's result, would read a buffer nothing was written to. */
static _Thread_local int group_calls;
static _Thread_local loomResult_t group_err;
static _Thread_local int group_err_at;
static _Thread_local char group_err_text[384];
/* The memory kinds the current call's buffers were found to be (check_buf). */
static _Thread_local loomComm_t call_comm;
static _Thread_local const char *call_fn; /* the public call now checked, for the claim */
static _Thread_local bool call_dev, call_host;
static _Thread_local const void *call_seen; /* the buffer this call already classified */
static _Thread_local coll_op_t *gq;
/* The communicator each queued operation holds a reference on (gq[i].comm is cleared when an
 * operation is taken or dropped; this is not). */
static _Thread_local loomComm_t *gq_owner;
static _Thread_local int gq_len, gq_cap;

/* ---- argument checks ---- */

static bool mul_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

static bool ranges_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

static loomResult_t check_op(loomComm_t comm, const char *fn, loomRedOp_t op, loomDataType_t type)
{
    if ((int)op >= 0 && op < loomNumOps) return loomSuccess;
    int i = base_premul_index(op);
    if (i >= 0 && i < COMM_MAX_PREMUL && comm->premul[i].used) {
        if (comm->premul[i].type != type)
            return base_error(loomInvalidArgument, LOG_COLL,
                              "%s: pre-multiplied sum %d was created for %s, called with %s", fn,
                              (int)op, red_type_name(comm->premul[i].type), red_type_name(type));
        return loomSuccess;
    }
    return base_error(loomInvalidArgument, LOG_COLL,
                      "%s: invalid reduction op %d (sum, prod, max, min, avg, or one made by "
                      "loomRedOpCreatePreMulSum on this communicator)",
                      fn, (int)op);
}

static loomResult_t check_common(loomComm_t comm, const char *fn, loomDataType_t type, size_t count,
                                 size_t mult, size_t *bytes)
{
    LOOM_CHECK(comm_check(comm, fn));
    log_set_rank(comm->rank);
    call_comm = comm;
    call_fn = fn;
    call_dev = call_host = false;
    call_seen = NULL;
    if ((int)type < 0 || type >= loomNumTypes)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: invalid datatype %d (expected 0..%d)",
                          fn, (int)type, loomNumTypes - 1);
    size_t elems;
    if (mul_overflows(count, mult, &elems) || mul_overflows(elems, red_type_size(type), bytes) ||
        *bytes > (size_t)INT64_MAX)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "%s: count %zu of %s overflows the address space", fn, count,
                          red_type_name(type));
    return loomSuccess;
}

static loomResult_t check_buf(const char *fn, const char *name, const void *p, size_t bytes)
{
    if (bytes > 0 && p == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: %s is NULL with %zu bytes to move",
                          fn, name, bytes);
    if (bytes == 0) return loomSuccess;
    if (p == call_seen) return loomSuccess; /* in place: one driver query, not two */
#ifdef LOOM_HAVE_CUDA
    int ord = -1;
    mem_type_t mt = mem_type_dev(p, &ord);
#else
    mem_type_t mt = mem_type_of(p);
#endif
    if (mt == MEM_HOST) {
        call_host = true;
        call_seen = p;
        return loomSuccess;
    }
    if (mt == MEM_MANAGED)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: %s (%p) is CUDA managed memory, which loom does not move (use "
                          "device or host memory)",
                          fn, name, p);
#ifdef LOOM_HAVE_CUDA
    call_dev = true;
    /* the communicator binds to the first device buffer's GPU (or its config's) */
    if (call_comm->dev.cuda_dev >= 0 && ord != call_comm->dev.cuda_dev)
        return base_error(loomInvalidUsage, LOG_CUDA,
                          "%s: %s (%p) is on GPU %d, but rank %d of this communicator is bound "
                          "to GPU %d",
                          fn, name, p, ord, call_comm->rank, call_comm->dev.cuda_dev);
    call_comm->dev.cuda_dev = ord;
    call_seen = p;
    return loomSuccess;
#else
    return base_error(loomInvalidUsage, LOG_COLL,
                      "%s: %s (%p) is CUDA device memory, and this build of loom has no device "
                      "executor (it was built without the CUDA toolkit)",
                      fn, name, p);
#endif
}

/* Fills o->dev from the call's buffers; host and device buffers in one call are refused. */
static loomResult_t check_mem_kind(const char *fn, coll_op_t *o)
{
    if (call_dev && call_host)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: one buffer is CUDA device memory and another host memory; a "
                          "call takes one kind",
                          fn);
    o->dev = call_dev;
    /* LOOM_DETERMINISTIC=1: the device kernels reduce in an order of their own (node-local
     * paths chosen by size, then staged shards across nodes), not the rank-order fold of
     * src/algo/determ.c, so a reduction of device memory is refused rather than run
     * non-deterministically. One rank is a copy, the same bits anyway. */
    bool reduces =
        o->kind == OPK_ALLREDUCE || o->kind == OPK_REDUCE || o->kind == OPK_REDUCESCATTER;
    if (o->dev && reduces && o->comm && o->comm->tune.deterministic && o->comm->nranks > 1)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: LOOM_DETERMINISTIC=1 covers host memory only; this call reduces "
                          "CUDA device memory, whose kernels fold in their own order (rank %d "
                          "of %d): copy the data to host memory for a reproducible result, or "
                          "unset LOOM_DETERMINISTIC",
                          fn, o->comm->rank, o->comm->nranks);
    return loomSuccess;
}

static loomResult_t check_root(loomComm_t comm, const char *fn, const char *what, int root)
{
    if (root < 0 || root >= comm->nranks)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: %s %d is outside [0, %d)", fn, what,
                          root, comm->nranks);
    return loomSuccess;
}

static loomResult_t check_no_partial_overlap(const char *fn, const void *s, size_t sb,
                                             const void *r, size_t rb, const void *inplace_at)
{
    if (s == inplace_at) return loomSuccess;
    if (ranges_overlap(s, sb, r, rb))
        return base_error(loomInvalidArgument, LOG_COLL,
                          "%s: send and receive buffers overlap without being in place", fn);
    return loomSuccess;
}
/* ---- one thread per communicator ---- */

/* The claim's token: the address of a thread-local byte, distinct among live threads. */
static _Thread_local char claim_self;
static _Thread_local int claim_tid;

static int self_tid(void)
{
    if (claim_tid == 0) claim_tid = (int)syscall(SYS_gettid);
    return claim_tid;
}

/* Claims c for the calling thread until its call (or group) has run: one compare-exchange, no
 * lock. The same thread may claim again (several calls in one group). The public entry points
 * claim; loom's own threads (progress, device staging) enter below them, through coll.h. */
static loomResult_t comm_claim(loomComm_t c, const char *fn)
{
    uintptr_t me = (uintptr_t)&claim_self, cur = 0;
    if (atomic_compare_exchange_strong(&c->st.owner, &cur, me) || cur == me) {
        atomic_store_explicit(&c->st.owner_call, fn, memory_order_relaxed);
        atomic_store_explicit(&c->st.owner_tid, self_tid(), memory_order_relaxed);
        return loomSuccess;
    }
    const char *other = atomic_load_explicit(&c->st.owner_call, memory_order_relaxed);
    return base_error(loomInvalidUsage, LOG_COLL,
                      "%s on thread %d while %s runs on thread %d (communicator %p): a "
                      "communicator is used by one thread at a time; give each thread its own "
                      "communicator (loomCommSplit)",
                      fn, self_tid(), other ? other : "another call",
                      atomic_load_explicit(&c->st.owner_tid, memory_order_relaxed), (void *)c);
}

static void comm_release(loomComm_t c)
{
    uintptr_t me = (uintptr_t)&claim_self;
    atomic_compare_exchange_strong(&c->st.owner, &me, 0);
}

loomResult_t comm_enter(loomComm_t c, const char *fn, int wait_ms, bool *held)
{
    uintptr_t me = (uintptr_t)&claim_self;
    /* after an abort the aborted call lets go of its claim moments after it left */
    uint64_t dl = base_now_ns() + (uint64_t)wait_ms * 1000000ull;
    for (uintptr_t o; (o = atomic_load(&c->st.owner)) != 0 && o != me && base_now_ns() < dl;)
        usleep(1000);
    *held = atomic_load_explicit(&c->st.owner, memory_order_relaxed) == me;
    const char *prev = atomic_load_explicit(&c->st.owner_call, memory_order_relaxed);
    LOOM_CHECK(comm_claim(c, fn));
    /* inside this thread's open group the group keeps the claim, under its own call's name */
    if (*held) atomic_store_explicit(&c->st.owner_call, prev, memory_order_relaxed);
    return loomSuccess;
}

void comm_leave(loomComm_t c, bool held)
{
    if (!held) comm_release(c);
}

loomResult_t coll_check_op(loomComm_t comm, const char *fn, loomRedOp_t op, loomDataType_t type)
{
    return check_op(comm, fn, op, type);
}

/* A fusion context claims its communicator while tensors are in flight: a public call on it then
 * is refused by comm_claim, naming the context (owner_call) and the thread that created it. */
loomResult_t coll_claim(loomComm_t c, const void *owner, const char *what)
{
    uintptr_t cur = 0;
    if (atomic_compare_exchange_strong(&c->st.owner, &cur, (uintptr_t)owner) ||
        cur == (uintptr_t)owner) {
        atomic_store_explicit(&c->st.owner_call, what, memory_order_relaxed);
        atomic_store_explicit(&c->st.owner_tid, self_tid(), memory_order_relaxed);
        return loomSuccess;
    }
    const char *other = atomic_load_explicit(&c->st.owner_call, memory_order_relaxed);
    return base_error(loomInvalidUsage, LOG_COLL,
                      "%s: communicator %p is inside %s on thread %d; wait for it first", what,
                      (void *)c, other ? other : "another call",
                      atomic_load_explicit(&c->st.owner_tid, memory_order_relaxed));
}

void coll_unclaim(loomComm_t c, const void *owner)
{
    uintptr_t me = (uintptr_t)owner;
    atomic_compare_exchange_strong(&c->st.owner, &me, 0);
}

/* ---- the queue ---- */

static loomResult_t run_group(void);

/* A thread's queue is freed when the thread ends; operations of a group it left open let go
 * of their communicators (which a destroy may be waiting on). */
static pthread_key_t gq_key;
static pthread_once_t gq_key_once = PTHREAD_ONCE_INIT;
static bool gq_key_ok;

static void gq_release(void *unused)
{
    (void)unused;
    for (int i = 0; i < gq_len; i++)
        if (gq_owner[i]) {
            comm_release(gq_owner[i]);
            comm_unref(gq_owner[i]);
        }
    free(gq);
    free(gq_owner);
    gq = NULL;
    gq_owner = NULL;
    gq_len = gq_cap = 0;
    group_depth = 0;
}

static void gq_key_create(void)
{
    gq_key_ok = pthread_key_create(&gq_key, gq_release) == 0;
}

static loomResult_t gq_grow(void)
{
    int ncap = gq_cap ? gq_cap * 2 : 16;
    if (gq_cap == 0) {
        pthread_once(&gq_key_once, gq_key_create);
        /* the key's value only has to be non-NULL for the destructor to run */
        if (!gq_key_ok || pthread_setspecific(gq_key, &gq_key) != 0)
            return base_error(loomSystemError, LOG_COLL,
                              "cannot register the thread's group queue for release at exit");
    }
    coll_op_t *n = realloc(gq, (size_t)ncap * sizeof(*n));
    if (n == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    gq = n;
    loomComm_t *o = realloc(gq_owner, (size_t)ncap * sizeof(*o));
    if (o == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    gq_owner = o;
    gq_cap = ncap;
    return loomSuccess;
}

static loomResult_t enqueue(const coll_op_t *op)
{
    /* A thread's first operation on a communicator claims it: for the call outside a group,
     * for the group inside one. A failed claim queues nothing and leaves the owner alone. */
    bool mine =
        atomic_load_explicit(&op->comm->st.owner, memory_order_relaxed) == (uintptr_t)&claim_self;
    LOOM_CHECK(comm_claim(op->comm, call_fn));
    if (gq_len == gq_cap) {
        loomResult_t r = gq_grow();
        if (r != loomSuccess) {
            if (!mine) comm_release(op->comm);
            return r;
        }
    }
    comm_ref(op->comm);
    gq_owner[gq_len] = op->comm;
    gq[gq_len++] = *op;
    if (group_depth == 0) return run_group();
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomGroupStart(void)
{
    if (group_depth++ == 0) {
        group_calls = 0;
        group_err = loomSuccess;
    }
    return loomSuccess;
}

/* The queued operations let go of, none run (a group with a failed call). */
static void gq_drop_all(void)
{
    for (int i = 0; i < gq_len; i++)
        if (gq_owner[i]) {
            comm_release(gq_owner[i]);
            comm_unref(gq_owner[i]);
        }
    gq_len = 0;
}

LOOM_EXPORT loomResult_t loomGroupEnd(void)
{
    if (group_depth == 0)
        return base_error(loomInvalidUsage, LOG_COLL, "loomGroupEnd without loomGroupStart");
    if (--group_depth > 0) return loomSuccess;
    if (group_err != loomSuccess) {
        int queued = gq_len;
        gq_drop_all();
        loomResult_t r = group_err;
        group_err = loomSuccess;
        return base_error(r, LOG_COLL,
                          "loomGroupEnd: call %d of the group failed, so none of its %d queued "
                          "operation%s ran: %s",
                          group_err_at, queued, queued == 1 ? "" : "s", group_err_text);
    }
    return run_group();
}
#ifdef LOOM_HAVE_CUDA
/* The device operations of communicator c, from queue entry `first` on, in call order, handed
 * to its device executor at once. A call outside a group is one operation, and it is the
 * latency path's whole host cost besides the launch: no allocation below 8 operations. */
static loomResult_t run_dev_ops(loomComm_t c, int first)
{
    int m = 0;
    for (int q = first; q < gq_len; q++)
        if (gq[q].dev && gq[q].comm == c) m++;
    dev_op_t few[8], *dops = few;
    if (m > (int)LOOM_ARRAY_SIZE(few)) {
        dops = malloc((size_t)m * sizeof(*dops));
        if (dops == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    }
    m = 0;
    for (int q = first; q < gq_len; q++) {
        coll_op_t *o = &gq[q];
        if (!o->dev || o->comm != c) continue;
        comm_dev_op(c, o, &dops[m++]);
        o->comm = NULL; /* taken */
    }
    loomResult_t r = comm_dev_run(c, dops, m);
    if (dops != few) free(dops);
    return r;
}
#endif
/* Operations queued on a communicator that was destroyed (or aborted) inside the group are
 * dropped: running them would touch what the destroy tore down. Returns how many, and the
 * first such communicator; the other communicators' operations still run. */
static int drop_destroyed(int n, loomComm_t *first, int *first_n)
{
    int dropped = 0;
    *first = NULL;
    *first_n = 0;
    for (int i = 0; i < n; i++) {
        loomComm_t c = gq[i].comm;
        if (!atomic_load(&c->st.destroyed)) continue;
        if (*first == NULL) *first = c;
        if (c == *first) ++*first_n;
        dropped++;
        gq[i].comm = NULL;
        gq_owner[i] = NULL;
        comm_release(c);
        comm_unref(c); /* may free it: nothing below reads it */
    }
    return dropped;
}

static loomResult_t run_group(void)
{
    int n = gq_len;
    if (n == 0) return loomSuccess;
    loomResult_t res = loomSuccess;
    loomComm_t dead;
    int dead_n;
    int dropped = drop_destroyed(n, &dead, &dead_n);
#ifdef LOOM_HAVE_CUDA
    /* First device use of communicators: set them up together (one thread may drive several
     * ranks). */
    {
        dev_host_t *fresh[n];
        int nf = 0;
        for (int i = 0; i < n; i++) {
            if (!gq[i].comm || !gq[i].dev || dev_ready(&gq[i].comm->dev.host)) continue;
            int k = 0;
            while (k < nf && fresh[k] != &gq[i].comm->dev.host)
                k++;
            if (k == nf) {
                comm_devhost_fill(gq[i].comm);
                fresh[nf++] = &gq[i].comm->dev.host;
            }
        }
        if (nf) res = dev_setup(fresh, nf);
    }
    /* Device buffers: ordered on their streams by the device executor, per communicator in
     * call order; nothing to drive here. */
    for (int i = 0; i < n && res == loomSuccess; i++)
        if (gq[i].dev && gq[i].comm != NULL) res = run_dev_ops(gq[i].comm, i);
#endif
    if (res == loomSuccess) {
        /* The host operations, in call order (device ones were taken, dropped ones cleared:
         * comm NULL). */
        int m = 0;
        for (int i = 0; i < n; i++)
            if (gq[i].comm != NULL) gq[m++] = gq[i];
        /* Small allreduces of one communicator, type and op become one (src/fusion). */
        fuse_run_t *runs = NULL;
        coll_op_t *orig = NULL;
        int nruns = 0;
        if (m > 1) res = fuse_group(gq, &m, &runs, &nruns, &orig);
        if (res == loomSuccess && m > 0) res = coll_run(gq, m);
        if (nruns > 0) fuse_group_finish(res, runs, nruns, orig);
    }
    for (int i = 0; i < n; i++)
        if (gq_owner[i]) {
            comm_release(gq_owner[i]);
            comm_unref(gq_owner[i]);
        }
    gq_len = 0;
    if (dropped > 0 && res == loomSuccess) {
        char more[64] = "";
        if (dropped > dead_n)
            snprintf(more, sizeof(more), " (and %d on other destroyed communicators)",
                     dropped - dead_n);
        res = base_error(loomInvalidUsage, LOG_COLL,
                         "loomGroupEnd: %d operation%s queued on communicator %p%s dropped: it "
                         "was destroyed (loomCommDestroy or loomCommAbort) inside the group; the "
                         "operations on live communicators ran",
                         dead_n, dead_n == 1 ? "" : "s", (void *)dead, more);
    }
    return res;
}

/* ---- entry points ---- */

/* Every public call's result passes here: inside a group, the first failure is kept for
 * loomGroupEnd. */
static loomResult_t entry_end(loomResult_t r)
{
    if (group_depth == 0) return r;
    group_calls++;
    if (r != loomSuccess && group_err == loomSuccess) {
        group_err = r;
        group_err_at = group_calls;
        snprintf(group_err_text, sizeof group_err_text, "%s", base_last_error());
    }
    return r;
}

#define ENTRY_CHECK(call)                                                                          \
    do {                                                                                           \
        loomResult_t entry_r_ = (call);                                                            \
        if (entry_r_ != loomSuccess) return entry_end(entry_r_);                                   \
    } while (0)

LOOM_EXPORT loomResult_t loomAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                       loomDataType_t type, loomRedOp_t op, loomComm_t comm,
                                       cudaStream_t stream)
{
    const char *fn = "loomAllReduce";
    size_t bytes = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    ENTRY_CHECK(check_op(comm, fn, op, type));
    ENTRY_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    ENTRY_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    ENTRY_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, bytes, recvbuff));
    coll_op_t o = {comm, OPK_ALLREDUCE, sendbuff, recvbuff, count, type, op, -1, stream, false, 0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

LOOM_EXPORT loomResult_t loomBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                       loomDataType_t type, int root, loomComm_t comm,
                                       cudaStream_t stream)
{
    const char *fn = "loomBroadcast";
    size_t bytes = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    ENTRY_CHECK(check_root(comm, fn, "root", root));
    if (comm->rank == root) {
        ENTRY_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
        ENTRY_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, bytes, recvbuff));
    }
    ENTRY_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    coll_op_t o = {comm,    OPK_BROADCAST, sendbuff, recvbuff, count, type,
                   loomSum, root,          stream,   false,    0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

LOOM_EXPORT loomResult_t loomReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    loomDataType_t type, loomRedOp_t op, int root, loomComm_t comm,
                                    cudaStream_t stream)
{
    const char *fn = "loomReduce";
    size_t bytes = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    ENTRY_CHECK(check_op(comm, fn, op, type));
    ENTRY_CHECK(check_root(comm, fn, "root", root));
    ENTRY_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    if (comm->rank == root) {
        ENTRY_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
        ENTRY_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, bytes, recvbuff));
    } else {
        recvbuff = (void *)sendbuff == recvbuff ? recvbuff : NULL;
    }
    coll_op_t o = {comm, OPK_REDUCE, sendbuff, recvbuff, count, type, op, root, stream, false, 0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

LOOM_EXPORT loomResult_t loomAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                       loomDataType_t type, loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomAllGather";
    size_t bytes = 0, total = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, sendcount, 1, &bytes));
    ENTRY_CHECK(check_common(comm, fn, type, sendcount, (size_t)comm->nranks, &total));
    ENTRY_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    ENTRY_CHECK(check_buf(fn, "recvbuff", recvbuff, total));
    ENTRY_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, total,
                                         (uint8_t *)recvbuff + (size_t)comm->rank * bytes));
    coll_op_t o = {comm, OPK_ALLGATHER, sendbuff, recvbuff, sendcount, type, loomSum,
                   -1,   stream,        false,    0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

LOOM_EXPORT loomResult_t loomReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                           loomDataType_t type, loomRedOp_t op, loomComm_t comm,
                                           cudaStream_t stream)
{
    const char *fn = "loomReduceScatter";
    size_t bytes = 0, total = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, recvcount, 1, &bytes));
    ENTRY_CHECK(check_common(comm, fn, type, recvcount, (size_t)comm->nranks, &total));
    ENTRY_CHECK(check_op(comm, fn, op, type));
    ENTRY_CHECK(check_buf(fn, "sendbuff", sendbuff, total));
    ENTRY_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    if ((uint8_t *)recvbuff != (const uint8_t *)sendbuff + (size_t)comm->rank * bytes)
        ENTRY_CHECK(check_no_partial_overlap(fn, sendbuff, total, recvbuff, bytes, NULL));
    coll_op_t o = {
        comm, OPK_REDUCESCATTER, sendbuff, recvbuff, recvcount, type, op, -1, stream, false, 0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

LOOM_EXPORT loomResult_t loomAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                      loomDataType_t type, loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomAlltoAll";
    size_t total = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, count, 1, &total));
    ENTRY_CHECK(check_common(comm, fn, type, count, (size_t)comm->nranks, &total));
    ENTRY_CHECK(check_buf(fn, "sendbuff", sendbuff, total));
    ENTRY_CHECK(check_buf(fn, "recvbuff", recvbuff, total));
    ENTRY_CHECK(check_no_partial_overlap(fn, sendbuff, total, recvbuff, total, recvbuff));
    coll_op_t o = {comm,    OPK_ALLTOALL, sendbuff, recvbuff, count, type,
                   loomSum, -1,           stream,   false,    0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

LOOM_EXPORT loomResult_t loomSend(const void *sendbuff, size_t count, loomDataType_t type, int peer,
                                  loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomSend";
    size_t bytes = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    ENTRY_CHECK(check_root(comm, fn, "peer", peer));
    ENTRY_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    coll_op_t o = {comm, OPK_SEND, sendbuff, NULL, count, type, loomSum, peer, stream, false, 0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

LOOM_EXPORT loomResult_t loomRecv(void *recvbuff, size_t count, loomDataType_t type, int peer,
                                  loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomRecv";
    size_t bytes = 0;
    base_clear_error();
    ENTRY_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    ENTRY_CHECK(check_root(comm, fn, "peer", peer));
    ENTRY_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    coll_op_t o = {comm, OPK_RECV, NULL, recvbuff, count, type, loomSum, peer, stream, false, 0};
    ENTRY_CHECK(check_mem_kind(fn, &o));
    return entry_end(enqueue(&o));
}

/* ---- device memory ---- */

LOOM_EXPORT loomResult_t loomMemAlloc(void **ptr, size_t size)
{
    base_clear_error();
    if (ptr == NULL) return base_error(loomInvalidArgument, LOG_CUDA, "loomMemAlloc: ptr is NULL");
#ifdef LOOM_HAVE_CUDA
    return dev_mem_alloc(ptr, size);
#else
    (void)size;
    return base_error(loomInvalidUsage, LOG_CUDA,
                      "loomMemAlloc: this loom was built without CUDA support");
#endif
}

LOOM_EXPORT loomResult_t loomMemFree(void *ptr)
{
    base_clear_error();
    if (ptr == NULL) return loomSuccess;
#ifdef LOOM_HAVE_CUDA
    if (mem_type_of(ptr) == MEM_DEVICE) return dev_mem_free(ptr);
#endif
    return base_error(loomInvalidUsage, LOG_CUDA,
                      "loomMemFree: %p was not allocated by loomMemAlloc", ptr);
}

LOOM_EXPORT loomResult_t loomCommRegister(const loomComm_t comm, void *buff, size_t size,
                                          void **handle)
{
    LOOM_CHECK(comm_check(comm, "loomCommRegister"));
    if (handle == NULL || (buff == NULL && size > 0))
        return base_error(loomInvalidArgument, LOG_COLL, "loomCommRegister: NULL handle or buffer");
    /* No transport built needs memory registered (tcp and shm move any host memory; device
     * buffers are mapped per allocation by the device executor's IPC cache): the handle only
     * records the range. */
    void **h = malloc(2 * sizeof(void *));
    if (h == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory");
    h[0] = buff;
    h[1] = (void *)(uintptr_t)size;
    *handle = h;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommDeregister(const loomComm_t comm, void *handle)
{
    LOOM_CHECK(comm_check(comm, "loomCommDeregister"));
    if (handle == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "loomCommDeregister: NULL handle");
    free(handle);
    return loomSuccess;
}
