/*
 * loom-perf: collective benchmarks that speak nccl-tests: its flags (perf_args.c), its header,
 * table and summary lines, its JSON (-J), and its program names (all_reduce_perf, ... are links
 * to this program; argv[0] picks the collective), so results read beside NCCL's.
 *
 * time   per call of the timed loop (-n iterations of -m calls), in microseconds: the mean over
 *        ranks (-a: rank 0's, min or max); -C 1: the host's time to issue the calls
 * algbw  bytes / time, bytes being the size column (GB/s = 1e9 bytes/s)
 * busbw  algbw scaled to what each link carries: allreduce 2(p-1)/p; reduce-scatter, allgather,
 *        alltoall, gather, scatter (p-1)/p; broadcast, reduce, sendrecv 1
 * #wrong elements differing from the exact expected result, summed over ranks, after the timed
 *        loop (-c N checked runs from fresh inputs; the first with any wrong element ends them)
 *
 * Ranks: `-P k` forks k local ranks as children of this process (no launcher needed); otherwise
 * one rank per process from the launcher's environment (mpirun, srun, torchrun, or
 * LOOM_RANK/LOOM_WORLD_SIZE with an id file; see --help and README.md's "Launching").
 *
 * Memory (--mem): host buffers (malloc) by default. `--mem device` puts the buffers in CUDA
 * device memory (cuMemAlloc). The CUDA driver is used through src/base/cudrv.h, found at run time
 * with dlopen: nothing here links libcuda or libcudart. Each rank process takes one GPU (rank mod
 * GPU count under -P; LOCAL_RANK if set, else rank mod GPU count, under a launcher), makes the
 * GPU's primary context current (the one the CUDA runtime, loom and NCCL use) and creates one
 * non-blocking stream that every collective is enqueued on.
 *
 * Device timing, as nccl-tests does it: the warm-up calls are enqueued and the stream
 * synchronised, the ranks meet (a one-element allreduce on the same stream), then `iters` calls
 * are enqueued back to back and the stream is synchronised once; the time is host wall time
 * (CLOCK_MONOTONIC) from before the first call to the return of cuStreamSynchronize, divided by
 * iters. No CUDA events are used. With -G N (nccl-tests' --cudagraph), the timed loop's calls are
 * captured once into a CUDA graph (thread-local capture), instantiated, the ranks meet, and the
 * clock covers N launches of the graph and the synchronize: the time per call is divided by
 * N x iters x agg, as nccl-tests divides it.
 *
 * Device checking uses the host scheme (exact inputs, every element compared), outside the timed
 * loop: inputs are copied in from a host pattern (the inputs are periodic in the element index,
 * see tape_ready), outputs are copied back through a 16 MiB host staging buffer, so host memory
 * stays bounded at any size (8 GiB and more). Outputs up to 256 MiB per rank are checked whole;
 * larger ones on 16 windows of 16 MiB spread evenly from the first element to the last
 * (256 MiB checked per rank and size), so #wrong then counts the sampled elements only.
 *
 * Backends (--backend): loom (default), or nccl: the machine's NCCL, loaded at run time
 * (dlopen, --nccl-lib), running the identical sweep on device memory (nccl implies
 * --mem device). Under -P the parent touches neither CUDA nor NCCL before fork: rank 0's child
 * makes NCCL's unique id and hands it to its siblings through a shared anonymous mapping; under a
 * launcher rank 0 writes it to LOOM_ID_FILE.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"
#include "loom_internal.h"
#include "perf_args.h"
#include "perf_json.h"
#include "reduce.h"

static const char *const loom_fn[C_NUM] = {"loomAllReduce",
                                           "loomBroadcast",
                                           "loomReduce",
                                           "loomAllGather",
                                           "loomReduceScatter",
                                           "loomAlltoAll",
                                           "loomSend/loomRecv (sendrecv)",
                                           "loomSend/loomRecv (gather)",
                                           "loomSend/loomRecv (scatter)"};

/* -P with --backend nccl: rank 0's child publishes NCCL's unique id here (state 1), or says that
 * it failed before it could (state -1); mapped MAP_SHARED before fork. */
#define NCCL_ID_BYTES 128
typedef struct {
    int state;
    char id[NCCL_ID_BYTES];
} id_shm_t;

/* --gpu-time under -P: one page shared by the rank processes (MAP_SHARED before fork) and
 * mapped into each GPU. Each rank's stream first waits (cuStreamWaitValue32) until `release`
 * reaches the round's number; the ranks queue their timed calls behind that wait, say so in
 * `queued`, and rank 0 opens every gate at once when all have, at the host time t0. What is
 * timed is then the GPUs' own time per call, without the host's cost of launching. */
typedef struct {
    volatile uint32_t release; /* first: the word the streams wait on */
    uint32_t pad;
    volatile int queued; /* ranks done queueing, over all rounds */
    volatile int late;   /* rank 0 opened a round before every rank had queued (5 s) */
    volatile double t0;
} gate_shm_t;
#define GATE_WAIT_S 5

/* Set in rank 0 while its siblings wait for it: a fatal error marks it failed. */
static int *g_fail_flag;

_Noreturn static void fatal(void)
{
    if (g_fail_flag) __atomic_store_n(g_fail_flag, -1, __ATOMIC_RELEASE);
    fflush(stdout);
    fflush(stderr);
    _exit(2);
}

_Noreturn static void die(int rank, const char *what, loomResult_t r, loomComm_t comm)
{
    fprintf(stderr, "loom-perf: rank %d: %s failed: %s (%s)\n", rank, what, loomGetErrorString(r),
            loomGetLastError(comm));
    fatal();
}

#define CHECK(rank, comm, call)                                                                    \
    do {                                                                                           \
        loomResult_t r_ = (call);                                                                  \
        if (r_ != loomSuccess) die(rank, #call, r_, comm);                                         \
    } while (0)

/* ---- exact inputs ---- */

/* Rank r's value at element i for op: chosen so that any order of the reduction is exact. */
static double input_value(int type, int op, int r, size_t i, int p)
{
    (void)p;
    switch (op) {
    case loomProd:
        /* at most one rank contributes 2 or -1 per element: products stay tiny */
        return ((size_t)r == i % (size_t)p) ? ((i / (size_t)p) % 3 == 0 ? -1 : 2) : 1;
    case loomMax:
    case loomMin: {
        int v = (int)((i * 7 + (size_t)r * 13) % 31);
        bool is_unsigned = type == loomUint8 || type == loomUint32 || type == loomUint64;
        return is_unsigned ? v : v - 15;
    }
    default: {
        int span = (type == loomHalf || type == loomBfloat16 || type == loomInt8 ||
                    type == loomUint8 || type == loomFloat8e4m3 || type == loomFloat8e5m2)
                       ? 3
                       : 17;
        int v = (int)((i * 5 + (size_t)r * 3) % (size_t)span);
        bool is_unsigned = type == loomUint8 || type == loomUint32 || type == loomUint64;
        return is_unsigned ? v : v - span / 2;
    }
    }
}

static void store(int type, void *buf, size_t i, double v)
{
    switch (type) {
    case loomInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case loomUint8: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
    case loomInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case loomUint32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case loomInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case loomUint64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case loomHalf: ((uint16_t *)buf)[i] = red_float_to_half((float)v); break;
    case loomFloat: ((float *)buf)[i] = (float)v; break;
    case loomDouble: ((double *)buf)[i] = v; break;
    case loomBfloat16: ((uint16_t *)buf)[i] = red_float_to_bf16((float)v); break;
    case loomFloat8e4m3:
    case loomFloat8e5m2: ((uint8_t *)buf)[i] = red_float_to_fp8(type, (float)v); break;
    }
}

static double load(int type, const void *buf, size_t i)
{
    switch (type) {
    case loomInt8: return ((const int8_t *)buf)[i];
    case loomUint8: return ((const uint8_t *)buf)[i];
    case loomInt32: return ((const int32_t *)buf)[i];
    case loomUint32: return ((const uint32_t *)buf)[i];
    case loomInt64: return (double)((const int64_t *)buf)[i];
    case loomUint64: return (double)((const uint64_t *)buf)[i];
    case loomHalf: return red_half_to_float(((const uint16_t *)buf)[i]);
    case loomFloat: return ((const float *)buf)[i];
    case loomDouble: return ((const double *)buf)[i];
    case loomBfloat16: return red_bf16_to_float(((const uint16_t *)buf)[i]);
    case loomFloat8e4m3:
    case loomFloat8e5m2: return red_fp8_to_float(type, ((const uint8_t *)buf)[i]);
    }
    return 0;
}

/* What element i must hold after a reduction over p ranks (inputs of input_value). */
/* -o mulsum: rank r's inputs are multiplied by 1 + r % 2 before the sum (exact: small
 * integers in every type). */
static double premul_scalar(int r)
{
    return 1.0 + (double)(r % 2);
}

static double expected_reduced(int type, int op, size_t i, int p)
{
    if (op == PERF_OP_MULSUM) {
        double acc = 0;
        for (int r = 0; r < p; r++)
            acc += premul_scalar(r) * input_value(type, op, r, i, p);
        return acc;
    }
    double acc = input_value(type, op, 0, i, p);
    for (int r = 1; r < p; r++) {
        double v = input_value(type, op, r, i, p);
        switch (op) {
        case loomProd: acc *= v; break;
        case loomMax: acc = v > acc ? v : acc; break;
        case loomMin: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (op == loomAvg) {
        bool integer = type <= loomUint64;
        if (integer)
            acc = trunc(acc / p);
        else if (type == loomDouble)
            acc = acc / p;
        else /* float32 arithmetic for float and the narrower floats */
            acc = (double)((float)acc / (float)p);
    }
    return acc;
}

/* The value the type holds for v (inputs and exact results are small integers, so this is
 * exact; avg of float16/bfloat16 and the 8-bit floats are compared with a tolerance below). */
static double as_type(int type, double v)
{
    uint8_t tmp[8];
    store(type, tmp, 0, v);
    return load(type, tmp, 0);
}

/* ---- NCCL, loaded at run time ---- */

#ifdef LOOM_HAVE_CUDA
typedef struct {
    char internal[NCCL_ID_BYTES];
} nccl_uid_t;
typedef struct nccl_comm_opaque *nccl_comm_t;

/* NCCL's entry points as this program calls them. ncclResult_t, ncclDataType_t and ncclRedOp_t
 * are int-sized C enums whose values are loom's, so they travel as int. */
typedef struct {
    int (*GetUniqueId)(nccl_uid_t *);
    int (*CommInitRank)(nccl_comm_t *, int, nccl_uid_t, int);
    int (*CommDestroy)(nccl_comm_t);
    int (*AllReduce)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t);
    int (*Broadcast)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t);
    int (*Reduce)(const void *, void *, size_t, int, int, int, nccl_comm_t, cudaStream_t);
    int (*AllGather)(const void *, void *, size_t, int, nccl_comm_t, cudaStream_t);
    int (*ReduceScatter)(const void *, void *, size_t, int, int, nccl_comm_t, cudaStream_t);
    const char *(*GetErrorString)(int);
    int (*GetVersion)(int *);
    /* optional: ncclAlltoAll (NCCL 2.28), else grouped send/receive as nccl-tests does */
    int (*AlltoAll)(const void *, void *, size_t, int, nccl_comm_t, cudaStream_t);
    int (*Send)(const void *, size_t, int, int, nccl_comm_t, cudaStream_t);
    int (*Recv)(void *, size_t, int, int, nccl_comm_t, cudaStream_t);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    const char *(*GetLastError)(nccl_comm_t);
    int (*CommRegister)(nccl_comm_t, void *, size_t, void **);
    /* ncclRedOpCreatePreMulSum(op, scalar, type, residence, comm), ncclRedOpDestroy */
    int (*RedOpCreatePreMulSum)(int *, void *, int, int, nccl_comm_t);
    int (*RedOpDestroy)(int, nccl_comm_t);
    int (*CommDeregister)(nccl_comm_t, void *);
    /* optional (NCCL 2.27): -R 2 */
    int (*CommWindowRegister)(nccl_comm_t, void *, size_t, void **, int);
    int (*CommWindowDeregister)(nccl_comm_t, void *);
    int version;
    char path[4096]; /* the file dlopen found */
} nccl_t;

static nccl_t g_nccl;

/* Loads NCCL from `lib` (a name the dynamic loader searches, or a path). NULL, with the reason in
 * why, if it cannot be loaded or lacks a required function. */
static const nccl_t *nccl_load(const char *lib, char *why, size_t whylen)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why, whylen, "cannot load %s: %s", lib, dlerror());
        return NULL;
    }
    nccl_t *n = &g_nccl;
    void *anchor = NULL;
#define NCCL_SYM(field, name, required)                                                            \
    do {                                                                                           \
        void *s_ = dlsym(h, name);                                                                 \
        if (s_ == NULL && (required)) {                                                            \
            snprintf(why, whylen, "%s has no %s (not an NCCL library?)", lib, name);               \
            return NULL;                                                                           \
        }                                                                                          \
        memcpy(&n->field, &s_, sizeof(s_));                                                        \
        if (anchor == NULL) anchor = s_;                                                           \
    } while (0)
    NCCL_SYM(GetVersion, "ncclGetVersion", 1);
    NCCL_SYM(GetUniqueId, "ncclGetUniqueId", 1);
    NCCL_SYM(CommInitRank, "ncclCommInitRank", 1);
    NCCL_SYM(CommDestroy, "ncclCommDestroy", 1);
    NCCL_SYM(AllReduce, "ncclAllReduce", 1);
    NCCL_SYM(Broadcast, "ncclBroadcast", 1);
    NCCL_SYM(Reduce, "ncclReduce", 1);
    NCCL_SYM(AllGather, "ncclAllGather", 1);
    NCCL_SYM(ReduceScatter, "ncclReduceScatter", 1);
    NCCL_SYM(GetErrorString, "ncclGetErrorString", 1);
    NCCL_SYM(AlltoAll, "ncclAlltoAll", 0);
    NCCL_SYM(Send, "ncclSend", 0);
    NCCL_SYM(Recv, "ncclRecv", 0);
    NCCL_SYM(GroupStart, "ncclGroupStart", 0);
    NCCL_SYM(GroupEnd, "ncclGroupEnd", 0);
    NCCL_SYM(GetLastError, "ncclGetLastError", 0);
    NCCL_SYM(CommRegister, "ncclCommRegister", 0);
    NCCL_SYM(RedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", 0);
    NCCL_SYM(RedOpDestroy, "ncclRedOpDestroy", 0);
    NCCL_SYM(CommDeregister, "ncclCommDeregister", 0);
    NCCL_SYM(CommWindowRegister, "ncclCommWindowRegister", 0);
    NCCL_SYM(CommWindowDeregister, "ncclCommWindowDeregister", 0);
#undef NCCL_SYM
    Dl_info di;
    if (dladdr(anchor, &di) && di.dli_fname && di.dli_fname[0])
        snprintf(n->path, sizeof(n->path), "%s", di.dli_fname);
    else
        snprintf(n->path, sizeof(n->path), "%s", lib);
    n->version = 0;
    if (n->GetVersion(&n->version) != 0) {
        snprintf(why, whylen, "ncclGetVersion of %s failed", n->path);
        return NULL;
    }
    return n;
}

static bool nccl_has_alltoall(const nccl_t *n)
{
    return n->AlltoAll || (n->Send && n->Recv && n->GroupStart && n->GroupEnd);
}

/* NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + ... before. */
static void nccl_version_str(int code, char *buf, size_t n)
{
    if (code >= 10000)
        snprintf(buf, n, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
    else
        snprintf(buf, n, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}
#endif

/* ---- ranks ---- */

typedef struct {
    loomComm_t comm;
    int rank, nranks;
    const opts_t *o;
    cudaStream_t stream; /* NULL for host memory */
    /* this rank's input pattern (tape_ready) */
    uint8_t *tape;
    size_t period, tape_chunk, tape_maxn;
    int tape_type, tape_op;
    /* device memory */
    uint8_t *stage; /* host staging for reading outputs back */
    size_t stage_bytes;
    int gpu;
    char gpu_name[256];
    int64_t pci; /* domain << 16 | bus << 8 | device */
#ifdef LOOM_HAVE_CUDA
    const cudrv_t *d;
    CUdevice cudev;
    CUcontext cuctx;
    int ctx_retained;
    CUdeviceptr scratch; /* the ranks' own small allreduces */
    size_t scratch_bytes;
    const nccl_t *nccl; /* --backend nccl */
    nccl_comm_t ncomm;
    bool nccl_skip_inplace; /* in-place alltoall is not valid NCCL usage */
    gate_shm_t *gate;       /* --gpu-time (-P): the shared gate, mapped at gate_dev */
    CUdeviceptr gate_dev;
    uint32_t gate_round;
#endif
} ctx_t;

/* Host staging for device outputs; the largest run of elements one copy moves. */
#define STAGE_BYTES ((size_t)16 << 20)
/* Device outputs over CHECK_FULL_BYTES per rank are checked on CHECK_WINDOWS windows of
 * CHECK_WINDOW_BYTES, spread evenly from the first element to the last. */
#define CHECK_FULL_BYTES ((size_t)256 << 20)
#define CHECK_WINDOWS 16
#define CHECK_WINDOW_BYTES ((size_t)16 << 20)
/* How long ranks wait for rank 0's NCCL unique id (-P), and how long the parent of -P ranks
 * on device memory lets the others run on once one has failed (a rank blocked in a collective
 * with a dead peer would wait for ever). */
#define ID_WAIT_S 120
#define FAIL_GRACE_S 10

#ifdef LOOM_HAVE_CUDA
_Noreturn static void cu_fail(const ctx_t *x, const char *what, CUresult r)
{
    fprintf(stderr, "loom-perf: rank %d: GPU %d: %s failed: %s\n", x->rank, x->gpu, what,
            cudrv_err(r));
    fatal();
}

#define CU(x, what, call)                                                                          \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) cu_fail((x), (what), r_);                                          \
    } while (0)

static CUdeviceptr dptr(const void *p)
{
    return (CUdeviceptr)(uintptr_t)p;
}
static void *hptr(CUdeviceptr p)
{
    return (void *)(uintptr_t)p;
}

_Noreturn static void nccl_fail(const ctx_t *x, const char *what, int r)
{
    const char *last = x->nccl->GetLastError ? x->nccl->GetLastError(x->ncomm) : NULL;
    bool has = last && last[0];
    fprintf(stderr, "loom-perf: rank %d: %s failed: %s%s%s%s\n", x->rank, what,
            x->nccl->GetErrorString(r), has ? " (" : "", has ? last : "", has ? ")" : "");
    fatal();
}
#endif

/* Host to buffer and buffer to host: memcpy for host memory; for device memory an asynchronous
 * copy on the rank's stream (ordered with the collectives; see stream_sync). */
static void put_bytes(ctx_t *x, void *dst, const void *src, size_t n)
{
    (void)x;
#ifdef LOOM_HAVE_CUDA
    if (x->o->mem_device) {
        CU(x, "cuMemcpyHtoDAsync", x->d->cuMemcpyHtoDAsync(dptr(dst), src, n, x->stream));
        return;
    }
#endif
    memcpy(dst, src, n);
}

static void get_bytes(ctx_t *x, void *dst, const void *src, size_t n)
{
    (void)x;
#ifdef LOOM_HAVE_CUDA
    if (x->o->mem_device) {
        CU(x, "cuMemcpyDtoHAsync", x->d->cuMemcpyDtoHAsync(dst, dptr(src), n, x->stream));
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* Waits for everything enqueued on the rank's stream (nothing to do for host memory). */
static void stream_sync(ctx_t *x)
{
#ifdef LOOM_HAVE_CUDA
    if (x->o->mem_device) CU(x, "cuStreamSynchronize", x->d->cuStreamSynchronize(x->stream));
#else
    (void)x;
#endif
}

/* Elements in the output and input buffers for `count` (nccl-tests' counts: gather's root and
 * scatter's root hold count per rank; the others' buffers are as large, unused). */
static size_t out_count(coll_t c, size_t count, int p)
{
    return (c == C_ALLGATHER || c == C_ALLTOALL || c == C_GATHER) ? count * (size_t)p : count;
}
static size_t in_count(coll_t c, size_t count, int p)
{
    return (c == C_REDUCESCATTER || c == C_ALLTOALL || c == C_SCATTER) ? count * (size_t)p : count;
}

/* size column semantics as nccl-tests: bytes of the larger buffer */
static size_t count_for_bytes(coll_t c, uint64_t bytes, size_t es, int p)
{
    size_t n = (size_t)(bytes / es);
    if (c == C_ALLGATHER || c == C_REDUCESCATTER || c == C_ALLTOALL || c == C_GATHER ||
        c == C_SCATTER)
        n /= (size_t)p;
    return n;
}

static bool coll_reduces(coll_t c)
{
    return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER;
}

/* nccl-tests' bus bandwidth factors */
static double bus_factor(coll_t c, int p)
{
    switch (c) {
    case C_ALLREDUCE: return p > 1 ? 2.0 * (p - 1) / p : 0;
    case C_ALLGATHER:
    case C_REDUCESCATTER:
    case C_ALLTOALL:
    case C_GATHER:
    case C_SCATTER: return p > 1 ? (double)(p - 1) / p : 0;
    default: return 1;
    }
}

/* Point to point and groups with the backend under test; a failure is fatal, naming the call
 * and the peer. */
static void xgroup_start(ctx_t *x)
{
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        int r = x->nccl->GroupStart();
        if (r != 0) nccl_fail(x, "ncclGroupStart", r);
        return;
    }
#endif
    CHECK(x->rank, x->comm, loomGroupStart());
}

static void xgroup_end(ctx_t *x)
{
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        int r = x->nccl->GroupEnd();
        if (r != 0) nccl_fail(x, "ncclGroupEnd", r);
        return;
    }
#endif
    CHECK(x->rank, x->comm, loomGroupEnd());
}

static void xsend(ctx_t *x, const void *buf, size_t count, int type, int peer)
{
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        int r = x->nccl->Send(buf, count, type, peer, x->ncomm, x->stream);
        if (r != 0) {
            char what[64];
            snprintf(what, sizeof(what), "ncclSend to rank %d", peer);
            nccl_fail(x, what, r);
        }
        return;
    }
#endif
    loomResult_t r = loomSend(buf, count, type, peer, x->comm, x->stream);
    if (r != loomSuccess) {
        char what[64];
        snprintf(what, sizeof(what), "loomSend to rank %d", peer);
        die(x->rank, what, r, x->comm);
    }
}

static void xrecv(ctx_t *x, void *buf, size_t count, int type, int peer)
{
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        int r = x->nccl->Recv(buf, count, type, peer, x->ncomm, x->stream);
        if (r != 0) {
            char what[64];
            snprintf(what, sizeof(what), "ncclRecv from rank %d", peer);
            nccl_fail(x, what, r);
        }
        return;
    }
#endif
    loomResult_t r = loomRecv(buf, count, type, peer, x->comm, x->stream);
    if (r != loomSuccess) {
        char what[64];
        snprintf(what, sizeof(what), "loomRecv from rank %d", peer);
        die(x->rank, what, r, x->comm);
    }
}

/* sendrecv, gather and scatter as nccl-tests builds them: send/receive pairs in one group.
 * sendrecv: each rank sends to the next and receives from the previous; gather: every rank
 * sends its count to the root, which receives rank r's into block r; scatter: the root sends
 * block r to rank r. */
static void run_p2p(ctx_t *x, coll_t c, const void *s, void *r, size_t count, int type)
{
    int p = x->nranks, me = x->rank, root = x->o->root;
    size_t bytes = count * perf_type_sizes[type];
    xgroup_start(x);
    switch (c) {
    case C_SENDRECV:
        xsend(x, s, count, type, (me + 1) % p);
        xrecv(x, r, count, type, (me + p - 1) % p);
        break;
    case C_GATHER:
        xsend(x, s, count, type, root);
        if (me == root)
            for (int peer = 0; peer < p; peer++)
                xrecv(x, (uint8_t *)r + (size_t)peer * bytes, count, type, peer);
        break;
    case C_SCATTER:
        if (me == root)
            for (int peer = 0; peer < p; peer++)
                xsend(x, (const uint8_t *)s + (size_t)peer * bytes, count, type, peer);
        xrecv(x, r, count, type, root);
        break;
    default: break;
    }
    xgroup_end(x);
}

/* Runs collective c (host memory), or enqueues it on the rank's stream (device memory), with the
 * chosen backend; dies on an error. */
static void run_coll_op(ctx_t *x, coll_t c, const void *s, void *r, size_t count, int type, int op);

/* -o mulsum as nccl-tests runs it: this rank's pre-multiplied sum is created (the scalar read
 * from host memory at once), used for the one call and destroyed. */
static void run_coll(ctx_t *x, coll_t c, const void *s, void *r, size_t count, int type, int op)
{
    if (op != PERF_OP_MULSUM || !coll_reduces(c)) {
        run_coll_op(x, c, s, r, count, type, op == PERF_OP_MULSUM ? loomSum : op);
        return;
    }
    uint8_t scalar[8];
    store(type, scalar, 0, premul_scalar(x->rank));
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        int nop = 0, res = x->nccl->RedOpCreatePreMulSum(&nop, scalar, type, 1, x->ncomm);
        if (res != 0) nccl_fail(x, "ncclRedOpCreatePreMulSum", res);
        run_coll_op(x, c, s, r, count, type, nop);
        res = x->nccl->RedOpDestroy(nop, x->ncomm);
        if (res != 0) nccl_fail(x, "ncclRedOpDestroy", res);
        return;
    }
#endif
    loomRedOp_t lop;
    CHECK(x->rank, x->comm,
          loomRedOpCreatePreMulSum(&lop, scalar, type, loomScalarHostImmediate, x->comm));
    run_coll_op(x, c, s, r, count, type, (int)lop);
    CHECK(x->rank, x->comm, loomRedOpDestroy(lop, x->comm));
}

static void run_coll_op(ctx_t *x, coll_t c, const void *s, void *r, size_t count, int type, int op)
{
    const opts_t *o = x->o;
    if (c == C_SENDRECV || c == C_GATHER || c == C_SCATTER) {
        run_p2p(x, c, s, r, count, type);
        return;
    }
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        const nccl_t *n = x->nccl;
        nccl_comm_t nc = x->ncomm;
        cudaStream_t st = x->stream;
        const char *what = "?";
        int res = 0;
        switch (c) {
        case C_ALLREDUCE:
            what = "ncclAllReduce";
            res = n->AllReduce(s, r, count, type, op, nc, st);
            break;
        case C_BROADCAST:
            what = "ncclBroadcast";
            res = n->Broadcast(s, r, count, type, o->root, nc, st);
            break;
        case C_REDUCE:
            what = "ncclReduce";
            res = n->Reduce(s, r, count, type, op, o->root, nc, st);
            break;
        case C_ALLGATHER:
            what = "ncclAllGather";
            res = n->AllGather(s, r, count, type, nc, st);
            break;
        case C_REDUCESCATTER:
            what = "ncclReduceScatter";
            res = n->ReduceScatter(s, r, count, type, op, nc, st);
            break;
        case C_ALLTOALL: {
            if (n->AlltoAll) {
                what = "ncclAlltoAll";
                res = n->AlltoAll(s, r, count, type, nc, st);
                break;
            }
            /* NCCL before 2.28: grouped send/receive, as nccl-tests does */
            size_t bytes = count * perf_type_sizes[type];
            what = "ncclGroupStart";
            res = n->GroupStart();
            for (int peer = 0; res == 0 && peer < x->nranks; peer++) {
                what = "ncclSend";
                res = n->Send((const uint8_t *)s + (size_t)peer * bytes, count, type, peer, nc, st);
                if (res == 0) {
                    what = "ncclRecv";
                    res = n->Recv((uint8_t *)r + (size_t)peer * bytes, count, type, peer, nc, st);
                }
            }
            if (res == 0) {
                what = "ncclGroupEnd";
                res = n->GroupEnd();
            }
            break;
        }
        default: break;
        }
        if (res != 0) nccl_fail(x, what, res);
        return;
    }
#endif
    loomResult_t res = loomInvalidArgument;
    cudaStream_t st = x->stream;
    switch (c) {
    case C_ALLREDUCE: res = loomAllReduce(s, r, count, type, op, x->comm, st); break;
    case C_BROADCAST: res = loomBroadcast(s, r, count, type, o->root, x->comm, st); break;
    case C_REDUCE: res = loomReduce(s, r, count, type, op, o->root, x->comm, st); break;
    case C_ALLGATHER: res = loomAllGather(s, r, count, type, x->comm, st); break;
    case C_REDUCESCATTER: res = loomReduceScatter(s, r, count, type, op, x->comm, st); break;
    case C_ALLTOALL: res = loomAlltoAll(s, r, count, type, x->comm, st); break;
    default: break;
    }
    if (res != loomSuccess) die(x->rank, loom_fn[c], res, x->comm);
}

/* Sums n 8-byte words (loomFloat64 or loomInt64) over the ranks, in place: the ranks' own
 * bookkeeping (barrier, results, layout). Host memory: a loom allreduce on the host buffer. Device
 * memory: through a small device buffer on the rank's stream, with the backend under test,
 * synchronised. */
static void allreduce_words(ctx_t *x, void *v, size_t n, int type)
{
#ifdef LOOM_HAVE_CUDA
    if (x->o->mem_device) {
        size_t bytes = n * 8;
        if (bytes > x->scratch_bytes) {
            fprintf(stderr,
                    "loom-perf: rank %d: internal error: %zu bytes for a %zu-byte scratch "
                    "buffer\n",
                    x->rank, bytes, x->scratch_bytes);
            fatal();
        }
        CU(x, "cuMemcpyHtoDAsync", x->d->cuMemcpyHtoDAsync(x->scratch, v, bytes, x->stream));
        run_coll(x, C_ALLREDUCE, hptr(x->scratch), hptr(x->scratch), n, type, loomSum);
        CU(x, "cuMemcpyDtoHAsync", x->d->cuMemcpyDtoHAsync(v, x->scratch, bytes, x->stream));
        stream_sync(x);
        return;
    }
#endif
    CHECK(x->rank, x->comm, loomAllReduce(v, v, n, type, loomSum, x->comm, NULL));
}

static void allreduce_doubles(ctx_t *x, double *v, size_t n)
{
    allreduce_words(x, v, n, loomFloat64);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

#ifdef LOOM_HAVE_CUDA
/* --gpu-time: the stream waits for this round's opening before the timed calls. */
static void gate_shut(ctx_t *x)
{
    x->gate_round++;
    CU(x, "cuStreamWaitValue32 (the --gpu-time gate)",
       x->d->cuStreamWaitValue32(x->stream, x->gate_dev, x->gate_round, CU_STREAM_WAIT_VALUE_GEQ));
}

/* Every rank has queued its calls: rank 0 opens all gates at once. The opening time. */
static double gate_open(ctx_t *x)
{
    gate_shm_t *g = x->gate;
    __atomic_add_fetch(&g->queued, 1, __ATOMIC_ACQ_REL);
    if (x->rank == 0) {
        int want = (int)x->gate_round * x->nranks;
        double give_up = now_us() + GATE_WAIT_S * 1e6;
        while (__atomic_load_n(&g->queued, __ATOMIC_ACQUIRE) < want)
            if (now_us() > give_up) { /* a rank blocked on a full launch queue */
                g->late = 1;
                break;
            }
        double t0 = now_us();
        g->t0 = t0;
        __atomic_store_n(&g->release, x->gate_round, __ATOMIC_RELEASE);
        return t0;
    }
    double give_up = now_us() + 4 * GATE_WAIT_S * 1e6;
    while (__atomic_load_n(&g->release, __ATOMIC_ACQUIRE) < x->gate_round)
        if (now_us() > give_up) {
            fprintf(stderr,
                    "loom-perf: rank %d: --gpu-time: rank 0 did not open round %u's "
                    "gate within %d s\n",
                    x->rank, x->gate_round, 4 * GATE_WAIT_S);
            fatal();
        }
    return g->t0;
}
#endif

/*
 * This rank's inputs for (type, op), as a tape that fills any buffer by copies. input_value(type,
 * op, rank, g, p) depends on the element index g only through g mod 3 or 17 (sum, avg), g mod 31
 * (max, min) and g mod 3p (prod), so it is periodic in g with period 3*17*31*p. The tape holds
 * elements 0 .. period + chunk - 1: a run of up to `chunk` elements starting at global index g is
 * the tape from element g mod period. chunk is at most STAGE_BYTES, at least the largest fill
 * (tape_maxn) when that is smaller.
 */
static void tape_ready(ctx_t *x, int type, int op)
{
    if (x->tape && x->tape_type == type && x->tape_op == op) return;
    size_t es = perf_type_sizes[type];
    size_t chunk = STAGE_BYTES / es;
    if (x->tape_maxn < chunk) chunk = x->tape_maxn > 0 ? x->tape_maxn : 1;
    size_t period = (size_t)3 * 17 * 31 * (size_t)x->nranks;
    size_t n = period + chunk;
    free(x->tape);
    x->tape = malloc(n * es);
    if (!x->tape) {
        fprintf(stderr, "loom-perf: rank %d: out of memory for %zu bytes\n", x->rank, n * es);
        fatal();
    }
    for (size_t i = 0; i < n; i++)
        store(type, x->tape, i, input_value(type, op, x->rank, i, x->nranks));
    x->period = period;
    x->tape_chunk = chunk;
    x->tape_type = type;
    x->tape_op = op;
}

/* Writes elements g .. g+n-1 of this rank's inputs to dst. */
static void fill_seg(ctx_t *x, uint8_t *dst, size_t g, size_t n, size_t es)
{
    while (n > 0) {
        size_t m = n < x->tape_chunk ? n : x->tape_chunk;
        put_bytes(x, dst, x->tape + (g % x->period) * es, m * es);
        dst += m * es;
        g += m;
        n -= m;
    }
}

/* Fills this rank's input; for in place the input lives inside the output buffer. */
static void fill_input(ctx_t *x, void *buf, size_t count, int type, int op)
{
    int p = x->nranks, r = x->rank;
    size_t es = perf_type_sizes[type];
    tape_ready(x, type, op);
    if (x->o->coll == C_ALLTOALL) {
        /* the block bound for rank b holds global indices r*count + 7b + 0 .. count-1 */
        for (int b = 0; b < p; b++)
            fill_seg(x, (uint8_t *)buf + (size_t)b * count * es, (size_t)r * count + (size_t)b * 7,
                     count, es);
    } else {
        fill_seg(x, buf, 0, in_count(x->o->coll, count, p), es);
    }
    stream_sync(x);
}

/* Compares output elements i0 .. i0+m-1, held at buf[0 .. m-1], with their exact values. */
static long check_range(ctx_t *x, const void *buf, size_t i0, size_t m, size_t count, int type,
                        int op)
{
    int p = x->nranks, r = x->rank;
    long wrong = 0;
    coll_t c = x->o->coll;
    for (size_t j = 0; j < m; j++) {
        size_t i = i0 + j;
        double want;
        switch (c) {
        case C_ALLREDUCE:
        case C_REDUCE: want = expected_reduced(type, op, i, p); break;
        case C_REDUCESCATTER: want = expected_reduced(type, op, (size_t)r * count + i, p); break;
        case C_BROADCAST: want = input_value(type, op, x->o->root, i, p); break;
        case C_ALLGATHER:
        case C_GATHER: want = input_value(type, op, (int)(i / count), i % count, p); break;
        case C_SCATTER: want = input_value(type, op, x->o->root, (size_t)r * count + i, p); break;
        case C_SENDRECV: want = input_value(type, op, (r + p - 1) % p, i, p); break;
        case C_ALLTOALL: {
            /* rank `from` filled the element bound for rank r with this index */
            int from = (int)(i / count);
            size_t gi = (i % count) + (size_t)from * count + (size_t)r * 7;
            want = input_value(type, op, from, gi, p);
            break;
        }
        default: want = 0;
        }
        want = as_type(type, want);
        double got = load(type, buf, j);
        double tol = 0;
        if (op == loomAvg && (type == loomHalf || type == loomBfloat16))
            tol = fabs(want) * (type == loomHalf ? 1e-3 : 8e-3);
        /* the 8-bit floats hold integers exactly only up to 8 (E5M2) or 16 (E4M3): past that a
         * partial sum rounds, wherever the algorithm's order puts it; one unit in the last
         * place of the result is allowed */
        if (type == loomFloat8e4m3 || type == loomFloat8e5m2)
            tol = fabs(want) * (type == loomFloat8e4m3 ? 0.125 : 0.25);
        if (fabs(got - want) > tol) wrong++;
    }
    return wrong;
}

/* Elements of this rank's output differing from the exact result. Host memory: all of them, in
 * place. Device memory: read back through the staging buffer after the stream's work; all of
 * them up to CHECK_FULL_BYTES, else CHECK_WINDOWS windows (see the top of the file). */
static long check_output(ctx_t *x, const void *buf, size_t count, int type, int op)
{
    coll_t c = x->o->coll;
    if ((c == C_REDUCE || c == C_GATHER) && x->rank != x->o->root) return 0;
    size_t n = out_count(c, count, x->nranks);
    if (!x->o->mem_device) return check_range(x, buf, 0, n, count, type, op);
    size_t es = perf_type_sizes[type], chunk = x->stage_bytes / es;
    size_t nwin = 1, win = n;
    if (n * es > CHECK_FULL_BYTES) {
        nwin = CHECK_WINDOWS;
        win = CHECK_WINDOW_BYTES / es;
    }
    long wrong = 0;
    for (size_t w = 0; w < nwin; w++) {
        size_t start = nwin > 1 ? (n - win) * w / (nwin - 1) : 0, end = start + win;
        for (size_t i = start; i < end;) {
            size_t m = end - i < chunk ? end - i : chunk;
            get_bytes(x, x->stage, (const uint8_t *)buf + i * es, m * es);
            stream_sync(x);
            wrong += check_range(x, x->stage, i, m, count, type, op);
            i += m;
        }
    }
    return wrong;
}

/* The time the table shows for each of the nt placements, from every rank's own (-a: rank 0's,
 * the mean, the smallest or the largest). Collective. */
static void combine_times(ctx_t *x, double *t, int nt)
{
    int p = x->nranks;
    size_t n = (size_t)p * (size_t)nt;
    double *v = calloc(n, sizeof(double));
    if (!v) {
        fprintf(stderr, "loom-perf: rank %d: out of memory\n", x->rank);
        fatal();
    }
    for (int i = 0; i < nt; i++)
        v[(size_t)i * p + x->rank] = t[i];
    allreduce_words(x, v, n, loomFloat64);
    for (int i = 0; i < nt; i++) {
        const double *r = v + (size_t)i * p;
        double acc = r[0];
        for (int k = 1; k < p; k++) {
            switch (x->o->average) {
            case AVG_MIN: acc = r[k] < acc ? r[k] : acc; break;
            case AVG_MAX: acc = r[k] > acc ? r[k] : acc; break;
            case AVG_MEAN: acc += r[k]; break;
            default: break;
            }
        }
        t[i] = x->o->average == AVG_MEAN ? acc / p : acc;
    }
    free(v);
}
/* A benchmark buffer of `bytes` (zeroed), in the memory under test; NULL if out of memory. */
static void *buf_alloc(ctx_t *x, size_t bytes)
{
    (void)x;
#ifdef LOOM_HAVE_CUDA
    if (x->o->mem_device) {
        CUdeviceptr p = 0;
        CUresult r = x->d->cuMemAlloc(&p, bytes);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "loom-perf: rank %d: GPU %d: cuMemAlloc of %zu bytes failed: %s\n",
                    x->rank, x->gpu, bytes, cudrv_err(r));
            return NULL;
        }
        CU(x, "cuMemsetD8Async", x->d->cuMemsetD8Async(p, 0, bytes, x->stream));
        stream_sync(x);
        return hptr(p);
    }
#endif
    void *p = malloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static void buf_free(ctx_t *x, void *p)
{
    if (!p) return;
#ifdef LOOM_HAVE_CUDA
    if (x->o->mem_device) {
        x->d->cuMemFree(dptr(p));
        return;
    }
#else
    (void)x;
#endif
    free(p);
}

/* ---- -T: a wait that lasts longer than the timeout ends the rank, naming what it waited for ----
 */

static char g_timeout_msg[512];
static size_t g_timeout_len;

static void on_timeout(int sig)
{
    (void)sig;
    ssize_t w = write(2, g_timeout_msg, g_timeout_len);
    (void)w;
    _exit(2);
}

static void timeout_arm(ctx_t *x, const char *what, size_t bytes, int type)
{
    const opts_t *o = x->o;
    if (o->timeout_s <= 0) return;
    int n = snprintf(g_timeout_msg, sizeof(g_timeout_msg),
                     "%s: rank %d: -T %d: %s %s of %zu bytes (%s) did not complete within "
                     "%d s\n",
                     o->prog, x->rank, o->timeout_s, perf_coll_names[o->coll], what, bytes,
                     perf_type_names[type], o->timeout_s);
    g_timeout_len = n > 0 && (size_t)n < sizeof(g_timeout_msg) ? (size_t)n : 0;
    alarm((unsigned)o->timeout_s);
}

static void timeout_disarm(const ctx_t *x)
{
    if (x->o->timeout_s > 0) alarm(0);
}

/* ---- the header, the table, the JSON file ---- */

/* A number in `width` columns as nccl-tests shows it: two decimals while they fit, then one,
 * then none, then an exponent. */
static void fmt_num(double v, int width, char *out, size_t n)
{
    int digits = 0;
    for (double lim = 1; v >= lim && digits < 40; lim *= 10)
        digits++;
    if (digits < width - 2)
        snprintf(out, n, "%*.2f", width, v);
    else if (digits < width - 1)
        snprintf(out, n, "%*.1f", width, v);
    else if (digits <= width)
        snprintf(out, n, "%*.0f", width, v);
    else
        snprintf(out, n, "%*.1e", width, v);
}

static bool coll_rooted(coll_t c)
{
    return c == C_BROADCAST || c == C_REDUCE || c == C_GATHER || c == C_SCATTER;
}

static void now_str(char *buf, size_t n)
{
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%d %H:%M:%S", &tm);
}

/* -J FILE: created new (never over a file there: FILE.0, FILE.1, ... are tried, as nccl-tests
 * does); NULL with a line on stderr if it cannot be. */
static FILE *json_open(const char *prog, const char *path, char *used, size_t n)
{
    snprintf(used, n, "%s", path);
    for (int i = 0; i < 1000; i++) {
        int fd = open(used, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            FILE *f = fdopen(fd, "w");
            if (!f) close(fd);
            return f;
        }
        if (errno != EEXIST) break;
        snprintf(used, n, "%s.%d", path, i);
    }
    fprintf(stderr, "%s: -J %s: cannot create %s: %s\n", prog, path, used, strerror(errno));
    return NULL;
}

/* What each rank tells rank 0 for the "Using devices" lines: pid, GPU, PCI, host name, GPU
 * name (int64 words, so that a sum over ranks, each filling its own slot, gathers them). */
#define INFO_NAME_WORDS 8
#define INFO_WORDS (3 + 2 * INFO_NAME_WORDS)

static void version_str(int code, char *buf, size_t n)
{
    snprintf(buf, n, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
}

/* The header block (collective: every rank sends its line to rank 0) and the JSON file's
 * start. */
static int header(ctx_t *x, jw_t *jw)
{
    const opts_t *o = x->o;
    int p = x->nranks;
    int64_t *v = calloc((size_t)p * INFO_WORDS, sizeof(int64_t));
    if (!v) {
        fprintf(stderr, "loom-perf: rank %d: out of memory\n", x->rank);
        fatal();
    }
    int64_t *mine = v + (size_t)x->rank * INFO_WORDS;
    char host[INFO_NAME_WORDS * 8] = {0}, gpu[INFO_NAME_WORDS * 8] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0) snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = 0;
    memcpy(gpu, x->gpu_name, strnlen(x->gpu_name, sizeof(gpu) - 1));
    mine[0] = (int64_t)getpid();
    mine[1] = x->gpu;
    mine[2] = x->pci;
    memcpy(mine + 3, host, sizeof(host));
    memcpy(mine + 3 + INFO_NAME_WORDS, gpu, sizeof(gpu));
    allreduce_words(x, v, (size_t)p * INFO_WORDS, loomInt64);
    if (x->rank != 0) {
        free(v);
        return 0;
    }
    int lver = 0;
    loomGetVersion(&lver);
    char hv[32], lv[32];
    version_str(LOOM_VERSION_CODE, hv, sizeof(hv));
    version_str(lver, lv, sizeof(lv));
    char be[4400];
    snprintf(be, sizeof(be), "loom %s", lv);
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        char nv[32];
        nccl_version_str(x->nccl->version, nv, sizeof(nv));
        snprintf(be, sizeof(be), "nccl %s (%s)", nv, x->nccl->path);
    }
#endif
    printf("# loom-perf: loom version %s (library %s), backend %s, %s memory\n", hv, lv, be,
           o->mem_device ? "device" : "host");
    printf("# Collective test starting: %s (%s, %d ranks)\n", o->prog, perf_coll_names[o->coll], p);
    printf("# nThread %d nGpus %d minBytes %llu maxBytes %llu step: %llu(%s) warmup iters: %d "
           "iters: %d agg iters: %d validation: %d graph: %d\n",
           o->nthreads, o->ngpus, (unsigned long long)o->minb, (unsigned long long)o->maxb,
           (unsigned long long)(o->factor > 1 ? o->factor : o->step),
           o->factor > 1 ? "factor" : "bytes", o->warmup, o->iters, o->agg, o->check, o->graphs);
    if (o->blocking)
        printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
    if (o->parallel_init)
        printf("# Parallel Init Enabled: one rank per process, so each initialises on its own\n");
    printf("#\n# Using devices\n");
    if (jw->f) {
        jw_obj(jw, "config");
        jw_int(jw, "nthreads", o->nthreads);
        jw_int(jw, "ngpus", o->ngpus);
        jw_u64(jw, "minimum_bytes", o->minb);
        jw_u64(jw, "maximum_bytes", o->maxb);
        if (o->factor > 1)
            jw_u64(jw, "step_factor", o->factor);
        else
            jw_u64(jw, "step_bytes", o->step);
        jw_int(jw, "warmup_iters", o->warmup);
        jw_int(jw, "iterations", o->iters);
        jw_int(jw, "aggregated_iterations", o->agg);
        jw_int(jw, "validation", o->check);
        jw_int(jw, "graph", o->graphs);
        jw_bool_str(jw, "blocking_collectives", o->blocking != 0);
        jw_bool_str(jw, "per_iter_timing", false);
        jw_bool_str(jw, "parallel_init", o->parallel_init != 0);
        jw_list(jw, "devices");
    }
    for (int r = 0; r < p; r++) {
        const int64_t *e = v + (size_t)r * INFO_WORDS;
        char h[INFO_NAME_WORDS * 8 + 1] = {0}, g[INFO_NAME_WORDS * 8 + 1] = {0}, hex[32];
        memcpy(h, e + 3, INFO_NAME_WORDS * 8);
        memcpy(g, e + 3 + INFO_NAME_WORDS, INFO_NAME_WORDS * 8);
        int64_t pci = e[2];
        if (o->mem_device)
            snprintf(hex, sizeof(hex), "%04x:%02x:%02x", (unsigned)(pci >> 16) & 0xffffu,
                     (unsigned)(pci >> 8) & 0xffu, (unsigned)pci & 0xffu);
        else
            snprintf(hex, sizeof(hex), "host");
        const char *info = o->mem_device ? g : "host memory";
        printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", r, 0, (int)e[0], h,
               (int)e[1], hex, info);
        if (jw->f) {
            jw_obj(jw, NULL);
            jw_int(jw, "rank", r);
            jw_int(jw, "group", 0);
            jw_int(jw, "pid", e[0]);
            jw_str(jw, "hostname", h);
            jw_int(jw, "device", e[1]);
            jw_str(jw, "device_hex", hex);
            jw_str(jw, "device_info", info);
            jw_end(jw, '}');
        }
    }
    if (jw->f) {
        jw_end(jw, ']');
        jw_end(jw, '}');
    }
    free(v);
    if (o->mem_device) {
        if (o->gpu_time)
            printf("# memory: device (cuMemAlloc), one non-blocking stream per rank; time: GPU "
                   "time, host clock from opening the gate the calls queued behind to the end "
                   "of cuStreamSynchronize, / iterations\n");
        else
            printf("# memory: device (cuMemAlloc), one non-blocking stream per rank; time: host "
                   "clock from the first timed call to the end of cuStreamSynchronize, / "
                   "iterations\n");
        if (o->check && o->maxb > CHECK_FULL_BYTES)
            printf("# check: outputs over %zu MiB per rank are checked on %d windows of %zu MiB "
                   "spread over the buffer\n",
                   CHECK_FULL_BYTES >> 20, CHECK_WINDOWS, CHECK_WINDOW_BYTES >> 20);
        if (o->graphs > 0)
            printf("# graphs: each size's %d x %d timed calls captured in one CUDA graph, "
                   "launched %d times; time per call = total / (%d launches x %d calls)\n",
                   o->iters, o->agg, o->graphs, o->graphs, o->iters * o->agg);
#ifdef LOOM_HAVE_CUDA
        if (x->nccl_skip_inplace)
            printf("# in-place alltoall is not valid NCCL usage: not run (N/A in its columns)\n");
#endif
    }
    if (o->coll == C_SENDRECV)
        printf("# in-place sendrecv would send from the buffer it receives into: not run (N/A "
               "in its columns)\n");
    const char *tl = o->cputime ? "cputime" : "time";
    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place  "
           "        \n",
           "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count",
           "type", "redop", "root", tl, "algbw", "busbw", "#wrong", tl, "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "");
    fflush(stdout);
    if (jw->f) jw_list(jw, "results");
    return 0;
}

/* The JSON file's first fields: nccl-tests' (version 2 of its layout, times, arguments,
 * environment) and loom's. Only LOOM_* and NCCL_* variables are listed; LOOM_JOB_SECRET's value
 * is not written. */
extern char **environ;
static void json_start(ctx_t *x, jw_t *jw)
{
    const opts_t *o = x->o;
    char ts[64];
    now_str(ts, sizeof(ts));
    jw_obj(jw, NULL);
    jw_int(jw, "version", 2);
    jw_str(jw, "start_time", ts);
    jw_list(jw, "args");
    for (int i = 0; i < o->argc; i++)
        jw_str(jw, NULL, o->argv[i]);
    jw_end(jw, ']');
    jw_list(jw, "env");
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "LOOM_", 5) && strncmp(*e, "NCCL_", 5)) continue;
        if (!strncmp(*e, "LOOM_JOB_SECRET=", 16))
            jw_str(jw, NULL, "LOOM_JOB_SECRET=(set; not written)");
        else
            jw_str(jw, NULL, *e);
    }
    jw_end(jw, ']');
#ifdef LOOM_HAVE_CUDA
    if (x->nccl)
        jw_int(jw, "nccl_version", x->nccl->version);
    else
#endif
        jw_null(jw, "nccl_version");
    int lver = 0;
    loomGetVersion(&lver);
    char hv[32], lv[32];
    version_str(LOOM_VERSION_CODE, hv, sizeof(hv));
    version_str(lver, lv, sizeof(lv));
    jw_obj(jw, "loom");
    jw_str(jw, "version", hv);
    jw_str(jw, "library_version", lv);
    jw_int(jw, "library_version_code", lver);
    jw_str(jw, "program", o->prog);
    jw_str(jw, "collective", perf_coll_names[o->coll]);
    jw_str(jw, "backend", o->backend == BE_NCCL ? "nccl" : "loom");
    jw_str(jw, "memory", o->mem_device ? "device" : "host");
    jw_int(jw, "ranks", x->nranks);
    jw_int(jw, "local_ranks", o->nranks_local);
    jw_str(jw, "average", (const char *[]){"rank0", "mean", "min", "max"}[o->average]);
    jw_end(jw, '}');
}

static void json_placement(jw_t *jw, const char *key, const opts_t *o, bool ran, double t,
                           double alg, double bus, long wrong)
{
    if (!ran) {
        jw_null(jw, key);
        return;
    }
    jw_obj(jw, key);
    jw_double(jw, o->cputime ? "cpu_time" : "time", t);
    jw_double(jw, "alg_bw", alg);
    jw_double(jw, "bus_bw", bus);
    if (o->check)
        jw_double(jw, "nwrong", (double)wrong);
    else
        jw_null(jw, "nwrong");
    jw_end(jw, '}');
}

/* The ranks meet: the warm-up done (and, for device memory, the stream drained). */
static void meet(ctx_t *x)
{
    if (x->o->mem_device) {
        stream_sync(x);
        double bar = 0;
        allreduce_doubles(x, &bar, 1);
        return;
    }
    double z[1] = {0};
    CHECK(x->rank, x->comm, loomAllReduce(z, z, 0, loomFloat64, loomSum, x->comm, NULL));
    double bar = 0;
    CHECK(x->rank, x->comm, loomAllReduce(&bar, &bar, 1, loomFloat64, loomSum, x->comm, NULL));
}

/* LOOM_PERF_CORRUPT=R (tests): rank R spoils the first element of every output it checks, after
 * the collective, so that the check's counting is seen to work. */
static int corrupt_rank(void)
{
    const char *s = getenv("LOOM_PERF_CORRUPT");
    if (!s || !*s) return -1;
    char *end;
    long v = strtol(s, &end, 10);
    return (*end || v < 0 || v > INT32_MAX) ? -1 : (int)v;
}

static void corrupt_output(ctx_t *x, void *r, int type)
{
    uint8_t bad[8];
    store(type, bad, 0, 101); /* no input or result here is 101 */
    put_bytes(x, r, bad, perf_type_sizes[type]);
    stream_sync(x);
}

/* Registers a buffer for -R: -R 1 locally, -R 2 as a symmetric window (NCCL_WIN_COLL_SYMMETRIC,
 * as nccl-tests does; every rank registers the same size). */
static void *reg_buf(ctx_t *x, void *buf, size_t bytes)
{
    void *h = NULL;
    const bool win = x->o->local_register == 2;
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        int r = win ? x->nccl->CommWindowRegister(x->ncomm, buf, bytes, &h, 0x01)
                    : x->nccl->CommRegister(x->ncomm, buf, bytes, &h);
        if (r != 0) nccl_fail(x, win ? "ncclCommWindowRegister" : "ncclCommRegister", r);
        return h;
    }
#endif
    if (win) {
        loomWindow_t w = NULL;
        CHECK(x->rank, x->comm,
              loomCommWindowRegister(x->comm, buf, bytes, &w, LOOM_WIN_COLL_SYMMETRIC));
        return w;
    }
    CHECK(x->rank, x->comm, loomCommRegister(x->comm, buf, bytes, &h));
    return h;
}

static void dereg_buf(ctx_t *x, void *h)
{
    if (!h) return;
    const bool win = x->o->local_register == 2;
#ifdef LOOM_HAVE_CUDA
    if (x->nccl) {
        if (win)
            x->nccl->CommWindowDeregister(x->ncomm, h);
        else
            x->nccl->CommDeregister(x->ncomm, h);
        return;
    }
#endif
    if (win)
        CHECK(x->rank, x->comm, loomCommWindowDeregister(x->comm, (loomWindow_t)h));
    else
        loomCommDeregister(x->comm, h);
}

#ifdef LOOM_HAVE_CUDA
/* -G: the timed loop's iters x agg calls captured into one CUDA graph on the rank's stream
 * (thread-local capture, as nccl-tests does), instantiated; then the ranks meet, so that no rank
 * times its launches while another still captures. The caller launches it -G times. */
static CUgraphExec capture_loop(ctx_t *x, const void *s, void *r, size_t count, int type, int op)
{
    const opts_t *o = x->o;
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    CU(x, "cuStreamBeginCapture (-G)",
       x->d->cuStreamBeginCapture(x->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < o->iters; i++) {
        if (o->agg > 1) xgroup_start(x);
        for (int a = 0; a < o->agg; a++)
            run_coll(x, o->coll, s, r, count, type, op);
        if (o->agg > 1) xgroup_end(x);
    }
    CU(x, "cuStreamEndCapture (-G)", x->d->cuStreamEndCapture(x->stream, &g));
    CU(x, "cuGraphInstantiateWithFlags (-G)", x->d->cuGraphInstantiateWithFlags(&ge, g, 0));
    CU(x, "cuGraphDestroy (-G)", x->d->cuGraphDestroy(g)); /* the instance keeps what it needs */
    meet(x); /* as nccl-tests' barrier between instantiating and starting the clock */
    return ge;
}
#endif

static int run_rank(ctx_t *x)
{
    const opts_t *o = x->o;
    int p = x->nranks;
    if (perf_check_job(o, p, x->rank != 0)) return 2;
    FILE *csv = NULL;
    jw_t jw = {0};
    /* rank 0's files; a failure there ends every rank at once (not after LOOM_TIMEOUT) */
    double cannot = 0;
    if (x->rank == 0) {
        if (o->csv && !(csv = fopen(o->csv, "w"))) {
            fprintf(stderr, "%s: --csv %s: cannot write: %s\n", o->prog, o->csv, strerror(errno));
            cannot = 1;
        }
        if (csv)
            fprintf(csv, "size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
                         "ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
        if (o->json && !cannot) {
            char used[4200];
            jw.f = json_open(o->prog, o->json, used, sizeof(used));
            if (jw.f) {
                printf("# Writing JSON output to %s\n", used);
                json_start(x, &jw);
            } else {
                cannot = 1;
            }
        }
    }
    allreduce_doubles(x, &cannot, 1);
    if (cannot) {
        if (csv) fclose(csv);
        if (jw.f) fclose(jw.f);
        return 2;
    }
    if (o->timeout_s > 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_timeout;
        sigaction(SIGALRM, &sa, NULL);
    }
    header(x, &jw);
    /* the in-place column is not run: sendrecv would send from the buffer it receives into */
    bool skip_ip = o->coll == C_SENDRECV;
#ifdef LOOM_HAVE_CUDA
    skip_ip = skip_ip || x->nccl_skip_inplace;
#endif
    int spoil = corrupt_rank();
    uint64_t maxb = o->maxb;
    long failed = 0; /* results (size, placement) with wrong elements */
    double bw_sum = 0;
    int nbw = 0;
    double per_call = (double)o->iters * (double)o->agg * (o->graphs > 0 ? o->graphs : 1);
    for (int ti = 0; ti < o->ntypes; ti++) {
        int type = o->types[ti];
        size_t es = perf_type_sizes[type];
        size_t maxcount = count_for_bytes(o->coll, maxb, es, p);
        size_t maxin = in_count(o->coll, maxcount, p), maxout = out_count(o->coll, maxcount, p);
        size_t big = maxin > maxout ? maxin : maxout;
        x->tape_maxn = maxin;
        uint8_t *sbuf = buf_alloc(x, maxin * es + 64);
        uint8_t *rbuf = sbuf ? buf_alloc(x, big * es + 64) : NULL;
        if (!sbuf || !rbuf) {
            if (o->mem_device) fatal(); /* said why; the other ranks cannot go on alone */
            fprintf(stderr, "loom-perf: rank %d: out of memory for %zu bytes\n", x->rank, big * es);
            return 2;
        }
        void *hs = NULL, *hr = NULL;
        if (o->local_register) {
            hs = reg_buf(x, sbuf, maxin * es + 64);
            hr = reg_buf(x, rbuf, big * es + 64);
        }
        for (int oi = 0; oi < o->nops; oi++) {
            int op = o->ops[oi];
            const char *opname = coll_reduces(o->coll) ? perf_op_names[op] : "none";
            for (int cyc = 0; o->cycles == 0 || cyc < o->cycles; cyc++) {
                for (uint64_t bytes = o->minb; bytes <= maxb;) {
                    size_t count = count_for_bytes(o->coll, bytes, es, p);
                    size_t sizeb = (in_count(o->coll, count, p) > out_count(o->coll, count, p)
                                        ? in_count(o->coll, count, p)
                                        : out_count(o->coll, count, p)) *
                                   es;
                    double t[2] = {0, 0};
                    long w[2] = {0, 0};
                    for (int ip = 0; ip < 2; ip++) {
                        if (ip && skip_ip) continue;
                        /* in place: the input lives in the output buffer (the rank's block of
                         * the larger buffer for allgather, gather, reduce-scatter, scatter) */
                        void *s = sbuf, *r = rbuf, *inbuf = sbuf;
                        if (ip) {
                            s = r = inbuf = rbuf;
                            uint8_t *mine = rbuf + (size_t)x->rank * count * es;
                            if (o->coll == C_ALLGATHER || o->coll == C_GATHER) s = inbuf = mine;
                            if (o->coll == C_REDUCESCATTER || o->coll == C_SCATTER) r = mine;
                        }
                        /* real data even unchecked: untouched host pages read as the shared
                         * zero page and time far faster than any real buffer */
                        fill_input(x, inbuf, count, type, op);
                        timeout_arm(x, "warm-up", sizeb, type);
                        for (int i = 0; i < o->warmup; i++)
                            run_coll(x, o->coll, s, r, count, type, op);
                        meet(x);
                        timeout_disarm(x);
                        timeout_arm(x, "timed loop", sizeb, type);
#ifdef LOOM_HAVE_CUDA
                        /* -G N: the timed loop's calls captured once, then N launches of
                         * the graph are timed (nccl-tests' -G) */
                        CUgraphExec gexec =
                            o->graphs > 0 ? capture_loop(x, s, r, count, type, op) : NULL;
#endif
                        double t0 = now_us(), ts = t0;
#ifdef LOOM_HAVE_CUDA
                        if (x->gate) gate_shut(x);
                        for (int l = 0; gexec && l < o->graphs; l++)
                            CU(x, "cuGraphLaunch", x->d->cuGraphLaunch(gexec, x->stream));
#endif
                        for (int i = 0; o->graphs == 0 && i < o->iters; i++) {
                            if (o->agg > 1) xgroup_start(x);
                            for (int a = 0; a < o->agg; a++)
                                run_coll(x, o->coll, s, r, count, type, op);
                            if (o->agg > 1) xgroup_end(x);
                            if (o->blocking) meet(x);
                        }
                        double tq = now_us();
#ifdef LOOM_HAVE_CUDA
                        if (x->gate) t0 = gate_open(x);
#endif
                        stream_sync(x);
                        double tend = now_us();
                        timeout_disarm(x);
#ifdef LOOM_HAVE_CUDA
                        if (gexec) CU(x, "cuGraphExecDestroy", x->d->cuGraphExecDestroy(gexec));
#endif
                        t[ip] = ((o->cputime ? tq : tend) - t0) / per_call;
                        /* where the host, not the GPU, bounds a size, this is close to t */
                        if (o->host_time && o->mem_device)
                            fprintf(stderr,
                                    "# rank %d %zu B %s: host %.2f us per call to enqueue, "
                                    "%.2f us per call in all\n",
                                    x->rank, sizeb, ip ? "in place" : "out of place",
                                    (tq - ts) / per_call, (tend - t0) / per_call);
                        /* -c N: N checked runs after the timed loop, from fresh inputs; the
                         * first with wrong elements on any rank ends them */
                        for (int c = 0; c < o->check; c++) {
                            fill_input(x, inbuf, count, type, op);
                            timeout_arm(x, "checked call", sizeb, type);
                            run_coll(x, o->coll, s, r, count, type, op);
                            stream_sync(x);
                            timeout_disarm(x);
                            if (spoil == x->rank && out_count(o->coll, count, p) > 0 &&
                                !((o->coll == C_REDUCE || o->coll == C_GATHER) &&
                                  x->rank != o->root))
                                corrupt_output(x, r, type);
                            double wr = (double)check_output(x, r, count, type, op);
                            allreduce_doubles(x, &wr, 1);
                            w[ip] = (long)wr;
                            if (w[ip]) break;
                        }
                    }
                    combine_times(x, t, 2);
                    if (x->rank == 0) {
                        double alg[2], bus[2];
                        for (int i = 0; i < 2; i++) {
                            alg[i] = t[i] > 0 ? (double)sizeb / t[i] / 1e3 : 0;
                            bus[i] = alg[i] * bus_factor(o->coll, p);
                        }
                        int root = coll_rooted(o->coll) ? o->root : -1;
                        printf("%12zu  %12zu  %8s  %6s  %6d", sizeb, count, perf_type_names[type],
                               opname, root);
                        for (int ip = 0; ip < 2; ip++) {
                            if (ip && skip_ip) {
                                printf("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
                                continue;
                            }
                            char ts_[32], as[32], bs[32], ws[32];
                            fmt_num(t[ip], 7, ts_, sizeof(ts_));
                            fmt_num(alg[ip], 6, as, sizeof(as));
                            fmt_num(bus[ip], 6, bs, sizeof(bs));
                            if (o->check)
                                snprintf(ws, sizeof(ws), "%6ld", w[ip]);
                            else
                                snprintf(ws, sizeof(ws), "%6s", "N/A");
                            printf("  %7s  %6s  %6s  %6s", ts_, as, bs, ws);
                            bw_sum += bus[ip];
                            nbw++;
                            if (w[ip]) failed++;
                        }
                        printf("\n");
                        fflush(stdout);
                        long wip = skip_ip ? -1L : w[1];
                        if (csv)
                            fprintf(csv, "%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%ld,%.3f,%.4f,%.4f,%ld\n",
                                    sizeb, count, perf_type_names[type], opname, root, t[0], alg[0],
                                    bus[0], o->check ? w[0] : -1L, t[1], alg[1], bus[1],
                                    o->check ? wip : -1L);
                        if (jw.f) {
                            char rs[16];
                            snprintf(rs, sizeof(rs), "%d", root);
                            jw_obj(&jw, NULL);
                            jw_u64(&jw, "size", sizeb);
                            jw_u64(&jw, "count", count);
                            jw_str(&jw, "type", perf_type_names[type]);
                            jw_str(&jw, "redop", opname);
                            jw_str(&jw, "root", rs);
                            json_placement(&jw, "out_of_place", o, true, t[0], alg[0], bus[0],
                                           w[0]);
                            json_placement(&jw, "in_place", o, !skip_ip, t[1], alg[1], bus[1],
                                           w[1]);
                            jw_int(&jw, "actual_iterations", o->iters);
                            jw_str(&jw, "experiment_name", o->prog);
                            jw_end(&jw, '}');
                            fflush(jw.f);
                        }
                    }
                    if (o->factor > 1) {
                        uint64_t nb = bytes * o->factor;
                        bytes = nb > bytes && nb / o->factor == bytes ? nb : maxb + 1;
                        if (bytes == 0) bytes = maxb + 1;
                    } else {
                        uint64_t nb = bytes + o->step;
                        bytes = nb > bytes ? nb : maxb + 1;
                    }
                }
            }
        }
        dereg_buf(x, hs);
        dereg_buf(x, hr);
        buf_free(x, sbuf);
        buf_free(x, rbuf);
    }
    if (x->rank == 0) {
#ifdef LOOM_HAVE_CUDA
        if (x->gate && x->gate->late)
            printf("# WARNING: --gpu-time: a gate opened before every rank had queued its calls "
                   "(a launch queue filled?): those times include the host; use a smaller -n\n");
#endif
        double avg = nbw ? bw_sum / nbw : 0.0;
        printf("# %-20s : %ld %s\n", "Out of bounds values", failed, failed ? "FAILED" : "OK");
        printf("# %-20s : %g \n", "Avg bus bandwidth", avg);
        printf("#\n# Collective test concluded: %s\n", o->prog);
        fflush(stdout);
        if (csv) fclose(csv);
        if (jw.f) {
            char ts[64];
            jw_end(&jw, ']');
            jw_obj(&jw, "out_of_bounds");
            jw_int(&jw, "count", failed);
            jw_bool_str(&jw, "okay", failed == 0);
            jw_end(&jw, '}');
            jw_obj(&jw, "average_bus_bandwidth");
            jw_double(&jw, "bandwidth", avg);
            jw_str(&jw, "okay", "unchecked");
            jw_end(&jw, '}');
            jw_list(&jw, "errors");
            jw_end(&jw, ']');
            now_str(ts, sizeof(ts));
            jw_str(&jw, "end_time", ts);
            jw_end(&jw, '}');
            fputc('\n', jw.f);
            fclose(jw.f);
        }
    }
    /* every rank's exit status says whether anything was wrong */
    double f = (double)failed;
    allreduce_doubles(x, &f, 1);
    return f > 0 ? 1 : 0;
}

/* How this rank process was started. */
typedef struct {
    int rank, nranks;     /* under torchrun nranks is then taken from the communicator */
    int local_rank;       /* the GPU to use, or -1: rank mod GPU count */
    int quiet;            /* a -P rank other than 0: errors every rank meets alike are rank 0's */
    int torchrun;         /* loom: loomCommInitFromEnv */
    loomUniqueId loom_id; /* loom, not torchrun */
    id_shm_t *shm;        /* nccl under -P: rank 0 publishes the id here */
    gate_shm_t *gate;     /* --gpu-time under -P */
    const char *id_file;  /* nccl under a launcher: rank 0 writes the id here */
} launch_t;

static int write_id_file(const char *path, const void *id, size_t n)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    /* The id holds the job's secret: owner-only from creation, whatever the umask, and a fresh
     * file (not one someone else left, or a link, under the temporary name). */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f && fd >= 0) close(fd);
    if (!f || fwrite(id, n, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path)) {
        fprintf(stderr, "loom-perf: cannot write %s\n", path);
        return 2;
    }
    return 0;
}

static int read_id_file(const char *path, void *id, size_t n, int rank)
{
    FILE *f = NULL;
    for (int i = 0; i < 600 && !(f = fopen(path, "rb")); i++)
        usleep(100000);
    if (!f || fread(id, n, 1, f) != 1) {
        fprintf(stderr, "loom-perf: rank %d cannot read the id from %s\n", rank, path);
        if (f) fclose(f);
        return 2;
    }
    fclose(f);
    return 0;
}

#ifdef LOOM_HAVE_CUDA
/* Device memory: loads NCCL (--backend nccl), then takes this rank's GPU: its primary context
 * made current, a non-blocking stream, the host staging buffer. */
static int dev_open(ctx_t *x, const launch_t *L)
{
    const opts_t *o = x->o;
    if (o->backend == BE_NCCL) {
        char why[4400];
        x->nccl = nccl_load(o->nccl_lib, why, sizeof(why));
        if (!x->nccl) {
            if (!L->quiet) fprintf(stderr, "loom-perf: --backend nccl: %s\n", why);
            return 2;
        }
        bool p2p = o->coll == C_SENDRECV || o->coll == C_GATHER || o->coll == C_SCATTER;
        const nccl_t *n = x->nccl;
        if ((p2p || o->agg > 1) && !(n->Send && n->Recv && n->GroupStart && n->GroupEnd)) {
            if (!L->quiet)
                fprintf(stderr,
                        "loom-perf: --backend nccl: %s has no "
                        "ncclSend/ncclRecv/ncclGroupStart/ncclGroupEnd (%s needs them)\n",
                        n->path, p2p ? perf_coll_names[o->coll] : "-m");
            return 2;
        }
        bool mulsum = false;
        for (int i = 0; i < o->nops; i++)
            mulsum = mulsum || o->ops[i] == PERF_OP_MULSUM;
        if (mulsum && coll_reduces(o->coll) && !(n->RedOpCreatePreMulSum && n->RedOpDestroy)) {
            if (!L->quiet)
                fprintf(stderr,
                        "loom-perf: --backend nccl: -o mulsum: %s has no ncclRedOpCreatePreMulSum "
                        "(NCCL 2.11)\n",
                        n->path);
            return 2;
        }
        if (o->local_register == 2 && !(n->CommWindowRegister && n->CommWindowDeregister)) {
            if (!L->quiet)
                fprintf(stderr,
                        "loom-perf: --backend nccl: -R 2: %s has no ncclCommWindowRegister "
                        "(NCCL 2.27)\n",
                        n->path);
            return 2;
        }
        if (o->local_register == 1 && !(n->CommRegister && n->CommDeregister)) {
            if (!L->quiet)
                fprintf(stderr,
                        "loom-perf: --backend nccl: -R 1: %s has no ncclCommRegister (NCCL 2.19)\n",
                        n->path);
            return 2;
        }
        if (o->coll == C_ALLTOALL && !nccl_has_alltoall(x->nccl)) {
            if (!L->quiet)
                fprintf(stderr,
                        "loom-perf: --backend nccl: %s has neither ncclAlltoAll nor "
                        "ncclSend/ncclRecv\n",
                        x->nccl->path);
            return 2;
        }
        x->nccl_skip_inplace = o->coll == C_ALLTOALL;
    }
    const char *why = NULL;
    const cudrv_t *d = cudrv_get(&why);
    if (!d) {
        if (!L->quiet)
            fprintf(stderr, "loom-perf: --mem device: %s\n", why ? why : "no usable GPU");
        return 2;
    }
    x->d = d;
    if (L->local_rank >= 0) {
        if (L->local_rank >= d->ndev) {
            fprintf(stderr,
                    "loom-perf: rank %d: --mem device: LOCAL_RANK is %d but the CUDA "
                    "driver sees %d GPU%s\n",
                    x->rank, L->local_rank, d->ndev, d->ndev == 1 ? "" : "s");
            return 2;
        }
        x->gpu = L->local_rank;
    } else {
        x->gpu = x->rank % d->ndev;
    }
    CU(x, "cuDeviceGet", d->cuDeviceGet(&x->cudev, x->gpu));
    CU(x, "cuDevicePrimaryCtxRetain", d->cuDevicePrimaryCtxRetain(&x->cuctx, x->cudev));
    x->ctx_retained = 1;
    CU(x, "cuCtxSetCurrent", d->cuCtxSetCurrent(x->cuctx));
    CUstream s = NULL;
    CU(x, "cuStreamCreate", d->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    x->stream = s;
    if (L->gate) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        CU(x, "cuMemHostRegister (the --gpu-time gate)",
           d->cuMemHostRegister((void *)L->gate, page,
                                CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
        CU(x, "cuMemHostGetDevicePointer",
           d->cuMemHostGetDevicePointer(&x->gate_dev, (void *)L->gate, 0));
        x->gate = L->gate;
    }
    if (d->cuDeviceGetName(x->gpu_name, (int)sizeof(x->gpu_name), x->cudev) != CUDA_SUCCESS)
        snprintf(x->gpu_name, sizeof(x->gpu_name), "?");
    int dom = 0, bus = 0, dev = 0;
    d->cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, x->cudev);
    d->cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, x->cudev);
    d->cuDeviceGetAttribute(&dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, x->cudev);
    x->pci = ((int64_t)dom << 16) | ((int64_t)(bus & 0xff) << 8) | (dev & 0xff);
    x->stage_bytes = STAGE_BYTES;
    x->stage = malloc(x->stage_bytes);
    if (!x->stage) {
        fprintf(stderr, "loom-perf: rank %d: out of memory\n", x->rank);
        return 2;
    }
    return 0;
}

/* The device buffer of allreduce_doubles, once the number of ranks is known. */
static void dev_scratch(ctx_t *x)
{
    /* the largest: header()'s INFO_WORDS per rank */
    x->scratch_bytes = ((size_t)x->nranks * INFO_WORDS + 8) * sizeof(int64_t);
    CU(x, "cuMemAlloc", x->d->cuMemAlloc(&x->scratch, x->scratch_bytes));
}

static void dev_close(ctx_t *x)
{
    if (!x->d) return;
    if (x->scratch) x->d->cuMemFree(x->scratch);
    if (x->stream) x->d->cuStreamDestroy(x->stream);
    if (x->ctx_retained) x->d->cuDevicePrimaryCtxRelease(x->cudev);
    free(x->stage);
}

/* NCCL's unique id: rank 0 makes it and publishes it (shared mapping under -P, else the id
 * file); the others wait for it. */
static int nccl_id(ctx_t *x, const launch_t *L, nccl_uid_t *id)
{
    if (x->rank == 0) {
        int r = x->nccl->GetUniqueId(id);
        if (r != 0) nccl_fail(x, "ncclGetUniqueId", r);
        if (L->shm) {
            memcpy(L->shm->id, id, sizeof(*id));
            __atomic_store_n(&L->shm->state, 1, __ATOMIC_RELEASE);
            g_fail_flag = NULL;
            return 0;
        }
        return write_id_file(L->id_file, id, sizeof(*id));
    }
    if (!L->shm) return read_id_file(L->id_file, id, sizeof(*id), x->rank);
    double deadline = now_us() + ID_WAIT_S * 1e6;
    for (;;) {
        int st = __atomic_load_n(&L->shm->state, __ATOMIC_ACQUIRE);
        if (st == 1) {
            memcpy(id, L->shm->id, sizeof(*id));
            return 0;
        }
        if (st < 0) return 2; /* rank 0 failed and said why */
        if (now_us() > deadline) {
            fprintf(stderr, "loom-perf: rank %d: no NCCL unique id from rank 0 after %d s\n",
                    x->rank, ID_WAIT_S);
            return 2;
        }
        usleep(1000);
    }
}
#endif

static int rank_main(const opts_t *o, const launch_t *L)
{
    ctx_t x = {.rank = L->rank, .nranks = L->nranks, .o = o, .gpu = -1};
    int rc = 0;
    if (L->shm && L->rank == 0) g_fail_flag = &L->shm->state;
    bool inited = false;
#ifdef LOOM_HAVE_CUDA
    if (o->mem_device && (rc = dev_open(&x, L)) != 0) goto fail;
    if (o->backend == BE_NCCL) {
        nccl_uid_t id;
        if ((rc = nccl_id(&x, L, &id)) != 0) goto fail;
        int r = x.nccl->CommInitRank(&x.ncomm, x.nranks, id, x.rank);
        if (r != 0) nccl_fail(&x, "ncclCommInitRank", r);
        inited = true;
    }
#endif
    if (!inited && L->torchrun) {
        CHECK(L->rank, NULL, loomCommInitFromEnv(&x.comm, NULL));
        loomCommUserRank(x.comm, &x.rank);
        loomCommCount(x.comm, &x.nranks);
    } else if (!inited) {
        CHECK(L->rank, NULL, loomCommInitRank(&x.comm, L->nranks, L->loom_id, L->rank));
    }
#ifdef LOOM_HAVE_CUDA
    if (o->mem_device) dev_scratch(&x);
#endif
    rc = run_rank(&x);
#ifdef LOOM_HAVE_CUDA
    if (x.nccl) x.nccl->CommDestroy(x.ncomm);
#endif
    if (x.comm) loomCommDestroy(x.comm);
#ifdef LOOM_HAVE_CUDA
    dev_close(&x);
#endif
    free(x.tape);
    fflush(stdout);
    return rc;
#ifdef LOOM_HAVE_CUDA
fail:
    if (g_fail_flag) __atomic_store_n(g_fail_flag, -1, __ATOMIC_RELEASE);
    fflush(stdout);
    return rc;
#endif
}

int main(int argc, char **argv)
{
    opts_t o;
    perf_parse(argc, argv, &o);
    /* loom-perf's own local launch stays on loopback unless told otherwise. */
    if (o.nranks_local > 0) setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    /* Any launcher's variables: the ranks are the launcher's (loomCommInitFromEnv's detection),
     * so mpirun -np 4 runs one job of 4 ranks, never four jobs of one. */
    launch_env_t env = {.found = false};
    if (o.nranks_local == 0 && loom_launch_detect(&env) != loomSuccess) {
        fprintf(stderr, "loom-perf: %s\n", loomGetLastError(NULL));
        return 2;
    }
    const char *idf = getenv("LOOM_ID_FILE");
    if (env.found && !(!strcmp(env.name, "loom") && idf)) {
        launch_t L = {
            .rank = env.rank, .nranks = env.nranks, .local_rank = env.local_rank, .torchrun = 1};
        if (o.backend == BE_NCCL && (!(L.id_file = idf) || env.nranks < 1)) {
            fprintf(stderr,
                    "loom-perf: --backend nccl under a launcher (%s) needs LOOM_ID_FILE "
                    "(a path every rank can read; rank 0 writes NCCL's unique id there) "
                    "and a launcher that gives the job size\n",
                    env.vars);
            return 2;
        }
        return rank_main(&o, &L);
    }
    if (env.found) {
        /* LOOM_RANK/LOOM_WORLD_SIZE with LOOM_ID_FILE: the id travels through the file */
        launch_t L = {.rank = env.rank, .nranks = env.nranks, .local_rank = env.local_rank};
        if (o.backend == BE_NCCL) {
            L.id_file = idf; /* rank 0 writes NCCL's id once its GPU is set up */
        } else if (L.rank == 0) {
            CHECK(0, NULL, loomGetUniqueId(&L.loom_id));
            if (write_id_file(idf, &L.loom_id, sizeof(L.loom_id))) return 2;
        } else if (read_id_file(idf, &L.loom_id, sizeof(L.loom_id), L.rank)) {
            return 2;
        }
        return rank_main(&o, &L);
    }
    int k = o.nranks_local > 0 ? o.nranks_local : 1;
    launch_t L = {.nranks = k, .local_rank = -1};
    if (o.backend == BE_NCCL) {
        /* No CUDA or NCCL call before fork: rank 0's child makes NCCL's id and publishes it
         * here. */
        void *m =
            mmap(NULL, sizeof(id_shm_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            perror("loom-perf: mmap");
            return 2;
        }
        L.shm = m;
    } else {
        /* loom's id: no CUDA context is made here */
        CHECK(0, NULL, loomGetUniqueId(&L.loom_id));
    }
    if (o.gpu_time) {
        void *m = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            perror("loom-perf: mmap (--gpu-time)");
            return 2;
        }
        L.gate = m; /* zeroed: round 0 is open, rounds count from 1 */
    }
    fflush(stdout);
    pid_t *pids = calloc((size_t)k, sizeof(pid_t));
    bool *killed = calloc((size_t)k, sizeof(bool));
    pid_t parent = getpid();
    for (int r = 0; r < k; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("loom-perf: fork");
            return 2;
        }
        if (pid == 0) {
            /* Children die with the parent, so an interrupted run leaves nothing behind: even
             * a parent killed with SIGKILL, which runs no handler. A parent that died before
             * the request would never send the signal, so look once more after it. */
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(2);
            signal(SIGINT, SIG_DFL);
            L.rank = r;
            L.quiet = r != 0;
            _exit(rank_main(&o, &L));
        }
        pids[r] = pid;
    }
    /* With device memory a rank left waiting on a failed peer may wait for ever (NCCL has no
     * timeout): FAIL_GRACE_S after the first failure the ranks still running are killed. */
    int rc = 0, failed = -1;
    double kill_at = 0;
    for (int n = 0; n < k;) {
        int st;
        pid_t pid;
        if (o.mem_device && failed >= 0) {
            pid = waitpid(-1, &st, WNOHANG);
            if (pid == 0) {
                if (now_us() >= kill_at)
                    for (int r = 0; r < k; r++)
                        if (pids[r] > 0 && !killed[r]) {
                            kill(pids[r], SIGKILL);
                            killed[r] = true;
                        }
                usleep(20000);
                continue;
            }
        } else {
            pid = wait(&st);
        }
        if (pid < 0) break;
        n++;
        int r = 0;
        while (r < k && pids[r] != pid)
            r++;
        if (r < k && killed[r]) {
            fprintf(stderr,
                    "loom-perf: rank %d (pid %d) stopped: still running %d s after rank "
                    "%d failed\n",
                    r, (int)pid, FAIL_GRACE_S, failed);
            rc = 2;
        } else if (WIFSIGNALED(st)) {
            fprintf(stderr, "loom-perf: rank %d (pid %d) was killed by signal %d\n", r, (int)pid,
                    WTERMSIG(st));
            rc = 2;
        } else if (WEXITSTATUS(st) != 0) {
            if (WEXITSTATUS(st) > rc) rc = WEXITSTATUS(st);
        }
        if (r < k) pids[r] = -1;
        if (failed < 0 && r < k && (WIFSIGNALED(st) || WEXITSTATUS(st) >= 2)) {
            failed = r;
            kill_at = now_us() + FAIL_GRACE_S * 1e6;
        }
    }
    free(killed);
    free(pids);
    return rc;
}
