/*
 * Smoke test of loom's NCCL shim (libnccl.so.2 from src/shim), host memory only, compiled
 * against the shim's own nccl.h. Every exported name is called at least once through the NCCL
 * API: versions and errors with NULL arguments, 2-rank jobs (one thread per rank) running every
 * collective and op, gather and scatter, point to point in a group, split, non-blocking init,
 * InitAll, the scalable init, abort, revoke, ncclResetDebugInit, and the calls loom does not
 * support (ncclInvalidUsage with a text). It also checks that the process maps no other libnccl
 * than the shim, that loom's own names are not exported, and that the first call logs the
 * shim's INFO line.
 *
 * `test_shim_smoke --expect-loom-run` additionally checks what tools/loom-run sets up.
 * Plain main(): exit 0 on success, 1 on failure.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define NRANKS 2
/* Elements per buffer: enough to cross a few slices' worth of code paths; this tests the
 * translation, not loom's algorithms (tests/test_coll.c does). */
#define N 1000

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                        \
    } while (0)
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) FAIL(__VA_ARGS__);                                                            \
    } while (0)
/* A call that must succeed; on failure the rank gives up (its peer then fails too, promptly,
 * as the communicator is destroyed under it). */
#define OK(call)                                                                                   \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) {                                                                   \
            FAIL("%s -> %d (%s): %s", #call, (int)r_, ncclGetErrorString(r_),                      \
                 ncclGetLastError(NULL));                                                          \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
/* A call that must fail with `want` and leave a non-empty error text containing `text`. */
#define REFUSED(call, want, text)                                                                  \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        const char *e_ = ncclGetLastError(NULL);                                                   \
        EXPECT(r_ == (want), "%s -> %d, expected %d", #call, (int)r_, (int)(want));                \
        EXPECT(e_ != NULL && e_[0] != '\0', "%s: empty ncclGetLastError", #call);                  \
        EXPECT(e_ == NULL || strstr(e_, text) != NULL, "%s: last error \"%s\" lacks \"%s\"",       \
               #call, e_ ? e_ : "(null)", text);                                                   \
    } while (0)

/* The exported names, from the same list the ABI test uses. */
static const char *const exported[] = {
#define ABI_VALUE(expr)
#define ABI_PROTO(ret, name, args) #name,
#define ABI_PROTO_NOP(ret, name, args) #name,
#include "nccl_abi.def"
#undef ABI_VALUE
#undef ABI_PROTO
#undef ABI_PROTO_NOP
};

/* ---- a job of NRANKS threads ---- */

typedef int (*body_fn)(ncclComm_t *comm, int rank, int nranks, void *arg);

typedef struct {
    int rank, nranks;
    ncclUniqueId id;
    body_fn fn;
    void *arg;
    int rc;
} rank_t;

static void *rank_main(void *p)
{
    rank_t *t = p;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRank(&comm, t->nranks, t->id, t->rank);
    if (r != ncclSuccess) {
        FAIL("rank %d: ncclCommInitRank -> %d: %s", t->rank, (int)r, ncclGetLastError(NULL));
        t->rc = 1;
        return NULL;
    }
    t->rc = t->fn(&comm, t->rank, t->nranks, t->arg);
    /* The body sets comm to NULL when it freed it (abort); destroying NULL is a no-op. */
    if (ncclCommDestroy(comm) != ncclSuccess) FAIL("rank %d: ncclCommDestroy", t->rank);
    return NULL;
}

/* Runs fn on every rank of a fresh job (fn == NULL: the threads run `raw` and make their own
 * communicators). Returns the number of ranks that failed. */
static int run_job(const char *name, body_fn fn, void *(*raw)(void *), void *arg)
{
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) {
        FAIL("%s: ncclGetUniqueId: %s", name, ncclGetLastError(NULL));
        return NRANKS;
    }
    rank_t t[NRANKS];
    pthread_t th[NRANKS];
    for (int r = 0; r < NRANKS; r++) {
        t[r] = (rank_t){.rank = r, .nranks = NRANKS, .id = id, .fn = fn, .arg = arg};
        pthread_create(&th[r], NULL, raw ? raw : rank_main, &t[r]);
    }
    int bad = 0;
    for (int r = 0; r < NRANKS; r++) {
        pthread_join(th[r], NULL);
        if (t[r].rc) bad++;
    }
    printf("%-28s %s\n", name, bad ? "FAILED" : "ok");
    fflush(stdout);
    return bad;
}

/* ---- checks of results ---- */

static int check_f(const char *what, int rank, const float *got, int n, float (*want)(int, int))
{
    for (int i = 0; i < n; i++)
        if (got[i] != want(rank, i)) {
            FAIL("rank %d: %s[%d] = %g, expected %g", rank, what, i, (double)got[i],
                 (double)want(rank, i));
            return 1;
        }
    return 0;
}

static float in_f(int rank, int i)
{
    return (float)(rank + 1 + i % 50);
}
static float sum_f(int rank, int i)
{
    (void)rank;
    float s = 0;
    for (int r = 0; r < NRANKS; r++)
        s += in_f(r, i);
    return s;
}
static float avg_f(int rank, int i)
{
    return sum_f(rank, i) / NRANKS;
}
/* Pre-multiplied by rank+1 on each rank, then summed. */
static float premul_f(int rank, int i)
{
    (void)rank;
    float s = 0;
    for (int r = 0; r < NRANKS; r++)
        s += (float)(r + 1) * in_f(r, i);
    return s;
}
static float bcast_f(int rank, int i)
{
    (void)rank;
    return in_f(NRANKS - 1, i); /* root is the last rank */
}

/* ---- the 2-rank bodies ---- */

/* ncclGather and ncclScatter: to and from each root, out of place and in place, NULL where
 * NCCL leaves a buffer unused, inside a group of the caller's, count 0, and the refusals. */
static int gather_scatter(ncclComm_t comm, int rank, int nranks)
{
    int rc = 0;
    int32_t *all = malloc((size_t)nranks * N * sizeof(int32_t));
    int32_t *part = malloc(N * sizeof(int32_t));
    for (int root = 0; root < nranks; root++) {
        /* Gather out of place: rank r's part, r*10^6 + i, lands at all[r*N + i] on the root. */
        for (int i = 0; i < N; i++)
            part[i] = rank * 1000000 + i;
        for (int j = 0; j < nranks * N; j++)
            all[j] = -1;
        OK(ncclGather(part, rank == root ? all : NULL, N, ncclInt32, root, comm, NULL));
        for (int j = 0; rank == root && j < nranks * N; j++)
            if (all[j] != (j / N) * 1000000 + j % N) {
                FAIL("rank %d: gather to %d: [%d] = %d", rank, root, j, (int)all[j]);
                rc = 1;
                break;
            }
        /* Gather in place: the root's part is already at all[root*N]. */
        for (int j = 0; j < nranks * N; j++)
            all[j] = j / N == rank ? 7 * rank + j % N : -1;
        const int32_t *mine = all + (size_t)rank * N;
        OK(ncclGather(mine, rank == root ? all : NULL, N, ncclInt32, root, comm, NULL));
        for (int j = 0; rank == root && j < nranks * N; j++)
            if (all[j] != 7 * (j / N) + j % N) {
                FAIL("rank %d: gather in place to %d: [%d] = %d", rank, root, j, (int)all[j]);
                rc = 1;
                break;
            }
        /* Scatter out of place: block r of the root's buffer goes to rank r. */
        for (int j = 0; j < nranks * N; j++)
            all[j] = rank == root ? root * 1000000 + j : -1;
        for (int i = 0; i < N; i++)
            part[i] = -1;
        OK(ncclScatter(rank == root ? all : NULL, part, N, ncclInt32, root, comm, NULL));
        for (int i = 0; i < N; i++)
            if (part[i] != root * 1000000 + rank * N + i) {
                FAIL("rank %d: scatter from %d: [%d] = %d", rank, root, i, (int)part[i]);
                rc = 1;
                break;
            }
        /* Scatter in place on the root: its block stays where it is. */
        int32_t *recv = rank == root ? all + (size_t)root * N : part;
        OK(ncclScatter(rank == root ? all : NULL, recv, N, ncclInt32, root, comm, NULL));
        for (int i = 0; i < N; i++)
            if (recv[i] != root * 1000000 + rank * N + i) {
                FAIL("rank %d: scatter in place from %d: [%d] = %d", rank, root, i, (int)recv[i]);
                rc = 1;
                break;
            }
    }
    /* Inside the caller's group, with another collective; then a float gather to the last
     * rank. Nothing moves before ncclGroupEnd. */
    {
        float f[3] = {(float)rank + 0.5f, -1.0f * (float)rank, 2.0f}, g[3 * NRANKS] = {0};
        int32_t x = rank + 1, y = 0;
        int root = nranks - 1;
        OK(ncclGroupStart());
        OK(ncclGather(f, g, 3, ncclFloat32, root, comm, NULL));
        OK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL));
        OK(ncclGroupEnd());
        EXPECT(y == nranks * (nranks + 1) / 2, "rank %d: allreduce grouped with gather: %d", rank,
               (int)y);
        for (int r = 0; rank == root && r < nranks; r++)
            if (g[3 * r] != (float)r + 0.5f || g[3 * r + 1] != -1.0f * (float)r ||
                g[3 * r + 2] != 2.0f) {
                FAIL("rank %d: grouped gather: block %d = %g %g %g", rank, r, (double)g[3 * r],
                     (double)g[3 * r + 1], (double)g[3 * r + 2]);
                rc = 1;
            }
    }
    /* Count 0 moves nothing and needs no buffers. */
    OK(ncclGather(NULL, NULL, 0, ncclFloat32, 0, comm, NULL));
    OK(ncclScatter(NULL, NULL, 0, ncclFloat32, 0, comm, NULL));
    /* Refused before anything is queued (every rank refuses alike, so nothing waits). */
    REFUSED(ncclGather(part, all, N, ncclInt32, nranks, comm, NULL), ncclInvalidArgument, "root");
    REFUSED(ncclScatter(all, part, N, ncclInt32, -1, comm, NULL), ncclInvalidArgument, "root");
    REFUSED(ncclGather(part, all, N, (ncclDataType_t)12, 0, comm, NULL), ncclInvalidArgument,
            "datatype");
    REFUSED(ncclScatter(all, part, N, (ncclDataType_t)99, 0, comm, NULL), ncclInvalidArgument,
            "datatype");
    REFUSED(ncclGather(part, NULL, N, ncclInt32, rank, comm, NULL), ncclInvalidArgument,
            "recvbuff is NULL");
    REFUSED(ncclScatter(NULL, part, N, ncclInt32, rank, comm, NULL), ncclInvalidArgument,
            "sendbuff is NULL");
    /* The root's own part overlapping the whole buffer without being in place. */
    REFUSED(ncclGather(all + (size_t)rank * N + 1, all, N, ncclInt32, rank, comm, NULL),
            ncclInvalidArgument, "overlaps");
    free(all);
    free(part);
    return rc;
}

/* Every collective, op and query on one communicator. */
static int body_collectives(ncclComm_t *commp, int rank, int nranks, void *arg)
{
    (void)arg;
    ncclComm_t comm = *commp;
    int v = -2;
    OK(ncclCommCount(comm, &v));
    EXPECT(v == nranks, "rank %d: ncclCommCount = %d", rank, v);
    OK(ncclCommUserRank(comm, &v));
    EXPECT(v == rank, "rank %d: ncclCommUserRank = %d", rank, v);
    OK(ncclCommCuDevice(comm, &v));
    EXPECT(v == -1, "rank %d: ncclCommCuDevice = %d on a host-only communicator", rank, v);
    ncclResult_t async = ncclInternalError;
    OK(ncclCommGetAsyncError(comm, &async));
    EXPECT(async == ncclSuccess, "rank %d: async error %d", rank, (int)async);

    float *in = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));
    float *big = malloc((size_t)nranks * N * sizeof(float));
    int rc = 0;
    for (int i = 0; i < N; i++)
        in[i] = in_f(rank, i);

    /* Allreduce: sum (out of place and in place), avg, max, pre-multiplied sum. */
    OK(ncclAllReduce(in, out, N, ncclFloat32, ncclSum, comm, NULL));
    rc |= check_f("allreduce sum", rank, out, N, sum_f);
    memcpy(out, in, N * sizeof(float));
    OK(ncclAllReduce(out, out, N, ncclFloat, ncclSum, comm, NULL));
    rc |= check_f("allreduce sum in place", rank, out, N, sum_f);
    OK(ncclAllReduce(in, out, N, ncclFloat32, ncclAvg, comm, NULL));
    rc |= check_f("allreduce avg", rank, out, N, avg_f);
    {
        int32_t a[N], b[N];
        for (int i = 0; i < N; i++)
            a[i] = rank * 1000 - i;
        OK(ncclAllReduce(a, b, N, ncclInt32, ncclMax, comm, NULL));
        for (int i = 0; i < N; i++)
            if (b[i] != (nranks - 1) * 1000 - i) {
                FAIL("rank %d: allreduce max[%d] = %d", rank, i, (int)b[i]);
                rc = 1;
                break;
            }
    }
    {
        float scalar = (float)(rank + 1);
        ncclRedOp_t op = ncclSum;
        OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
        EXPECT((int)op >= ncclNumOps, "rank %d: premulsum handle %d", rank, (int)op);
        scalar = 1000; /* host-immediate: read at creation, so this must not matter */
        OK(ncclAllReduce(in, out, N, ncclFloat32, op, comm, NULL));
        rc |= check_f("allreduce premulsum", rank, out, N, premul_f);
        OK(ncclRedOpDestroy(op, comm));
    }

    /* Broadcast from the last rank (out of place), then in place with ncclBcast from rank 0. */
    memset(out, 0, N * sizeof(float));
    OK(ncclBroadcast(in, out, N, ncclFloat32, nranks - 1, comm, NULL));
    rc |= check_f("broadcast", rank, out, N, bcast_f);
    {
        int64_t x[N];
        for (int i = 0; i < N; i++)
            x[i] = rank == 0 ? (int64_t)i * 7 : -1;
        OK(ncclBcast(x, N, ncclInt64, 0, comm, NULL));
        for (int i = 0; i < N; i++)
            if (x[i] != (int64_t)i * 7) {
                FAIL("rank %d: bcast[%d] = %lld", rank, i, (long long)x[i]);
                rc = 1;
                break;
            }
    }

    /* Reduce to rank 0 (recvbuff may be NULL elsewhere, as in NCCL). */
    memset(out, 0, N * sizeof(float));
    OK(ncclReduce(in, rank == 0 ? out : NULL, N, ncclFloat32, ncclSum, 0, comm, NULL));
    if (rank == 0) rc |= check_f("reduce", rank, out, N, sum_f);

    /* Allgather: rank r's block lands at r*N. */
    OK(ncclAllGather(in, big, N, ncclFloat32, comm, NULL));
    for (int r = 0; r < nranks && rc == 0; r++)
        for (int i = 0; i < N; i++)
            if (big[(size_t)r * N + i] != in_f(r, i)) {
                FAIL("rank %d: allgather[%d][%d] = %g", rank, r, i, (double)big[r * N + i]);
                rc = 1;
                break;
            }

    /* Reduce-scatter: this rank gets the sum of everyone's block `rank`. */
    for (int j = 0; j < nranks * N; j++)
        big[j] = (float)(j % 97 + rank);
    OK(ncclReduceScatter(big, out, N, ncclFloat32, ncclSum, comm, NULL));
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++)
            want += (float)((rank * N + i) % 97 + r);
        if (out[i] != want) {
            FAIL("rank %d: reducescatter[%d] = %g, expected %g", rank, i, (double)out[i],
                 (double)want);
            rc = 1;
            break;
        }
    }

    /* All-to-all: block j of the send buffer goes to rank j. */
    {
        int32_t *s = malloc((size_t)nranks * N * sizeof(int32_t));
        int32_t *d = malloc((size_t)nranks * N * sizeof(int32_t));
        for (int j = 0; j < nranks; j++)
            for (int i = 0; i < N; i++)
                s[j * N + i] = rank * 100000 + j * 1000 + i;
        OK(ncclAlltoAll(s, d, N, ncclInt32, comm, NULL));
        for (int r = 0; r < nranks && rc == 0; r++)
            for (int i = 0; i < N; i++)
                if (d[r * N + i] != r * 100000 + rank * 1000 + i) {
                    FAIL("rank %d: alltoall[%d][%d] = %d", rank, r, i, (int)d[r * N + i]);
                    rc = 1;
                    break;
                }
        free(s);
        free(d);
    }

    /* Send/recv around the ring, both in one group so that they progress together. */
    {
        double s[N], d[N];
        int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
        for (int i = 0; i < N; i++)
            s[i] = rank + i * 0.5;
        OK(ncclGroupStart());
        OK(ncclSend(s, N, ncclFloat64, next, comm, NULL));
        OK(ncclRecv(d, N, ncclDouble, prev, comm, NULL));
        OK(ncclGroupEnd());
        for (int i = 0; i < N; i++)
            if (d[i] != prev + i * 0.5) {
                FAIL("rank %d: recv[%d] = %g", rank, i, d[i]);
                rc = 1;
                break;
            }
    }

    /* Registration of host memory: accepted, and nothing changes. */
    {
        void *h = NULL;
        OK(ncclCommRegister(comm, in, N * sizeof(float), &h));
        EXPECT(h != NULL, "rank %d: ncclCommRegister gave no handle", rank);
        OK(ncclCommDeregister(comm, h));
    }

    /* 8-bit floats, numbered as NCCL's: E4M3 1.0 is 0x38, 2.0 0x40; E5M2 1.0 is 0x3c. Every
     * rank adds 1.0 (and rank 1 also 1.0, so the sum is 2.0 exactly); max of 1.0 and 2.0 is 2.0;
     * a pre-multiplied sum by 2.0 gives 4.0 (E4M3 0x48). */
    {
        static uint8_t a8s[NRANKS][N], b8s[NRANKS][N];
        uint8_t *a8 = a8s[rank], *b8 = b8s[rank];
        for (int i = 0; i < N; i++)
            a8[i] = 0x38;
        OK(ncclAllReduce(a8, b8, N, ncclFloat8e4m3, ncclSum, comm, NULL));
        for (int i = 0; i < N; i++)
            if (b8[i] != 0x40) {
                FAIL("rank %d: fp8 e4m3 sum[%d] = 0x%02x, want 0x40", rank, i, b8[i]);
                break;
            }
        for (int i = 0; i < N; i++)
            a8[i] = rank ? 0x40 : 0x38;
        OK(ncclAllReduce(a8, b8, N, ncclFloat8e4m3, ncclMax, comm, NULL));
        EXPECT(b8[0] == 0x40 && b8[N - 1] == 0x40, "rank %d: fp8 max = 0x%02x", rank, b8[0]);
        for (int i = 0; i < N; i++)
            a8[i] = 0x3c;
        OK(ncclAllReduce(a8, b8, N, ncclFloat8e5m2, ncclSum, comm, NULL));
        EXPECT(b8[0] == 0x40 && b8[N - 1] == 0x40, "rank %d: fp8 e5m2 sum = 0x%02x", rank, b8[0]);
        uint8_t two = 0x40;
        ncclRedOp_t op = ncclSum;
        OK(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat8e4m3, ncclScalarHostImmediate, comm));
        for (int i = 0; i < N; i++)
            a8[i] = 0x38;
        OK(ncclAllReduce(a8, b8, N, ncclFloat8e4m3, op, comm, NULL));
        EXPECT(b8[0] == 0x48 && b8[N - 1] == 0x48, "rank %d: fp8 premul sum = 0x%02x", rank, b8[0]);
        OK(ncclRedOpDestroy(op, comm));
    }

    /* What loom 0.1 lacks: ncclInvalidUsage, a text, and outputs cleared. */
    {
        /* windows are device memory: host buffers, bad flags, empty buffers and handles that
         * are not windows are refused, each rank on its own (nothing collective starts) */
        ncclWindow_t win = (ncclWindow_t)(uintptr_t)1;
        ncclResult_t wr =
            ncclCommWindowRegister(comm, in, N * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC);
        const char *we = ncclGetLastError(NULL);
        EXPECT((wr == ncclInvalidArgument || wr == ncclInvalidUsage) && we &&
                   strstr(we, "device memory"),
               "rank %d: ncclCommWindowRegister on host memory -> %d: \"%s\"", rank, (int)wr,
               we ? we : "(null)");
        EXPECT(win == NULL, "rank %d: ncclCommWindowRegister left *win set", rank);
        win = (ncclWindow_t)(uintptr_t)1;
        REFUSED(ncclCommWindowRegister(comm, in, N * sizeof(float), &win, 0x4), ncclInvalidArgument,
                "unknown flags 0x4");
        EXPECT(win == NULL, "rank %d: ncclCommWindowRegister (bad flags) left *win set", rank);
        REFUSED(ncclCommWindowRegister(comm, in, 0, &win, NCCL_WIN_DEFAULT), ncclInvalidArgument,
                "a window is a non-empty buffer");
        REFUSED(ncclCommWindowDeregister(comm, NULL), ncclInvalidArgument, "win is NULL");
        REFUSED(ncclCommWindowDeregister(comm, (ncclWindow_t)(uintptr_t)16), ncclInvalidArgument,
                "not a window");
        REFUSED(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage,
                "ncclDevCommCreate is not supported by loom");
        REFUSED(ncclDevCommDestroy(comm, NULL), ncclInvalidUsage,
                "ncclDevCommDestroy is not supported by loom");
        /* Simulation leaves the group open: the allreduce queued in it still runs at End. */
        ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
        OK(ncclGroupStart());
        OK(ncclAllReduce(in, out, N, ncclFloat32, ncclSum, comm, NULL));
        REFUSED(ncclGroupSimulateEnd(&sim), ncclInvalidUsage,
                "ncclGroupSimulateEnd is not supported by loom");
        OK(ncclGroupEnd());
        rc |= check_f("allreduce after simulate", rank, out, N, sum_f);
    }

    /* Gather and scatter (loom has neither: the shim builds them from send/recv). */
    rc |= gather_scatter(comm, rank, nranks);

    /* Finalize: later collectives are refused; the harness destroys. */
    OK(ncclCommFinalize(comm));
    REFUSED(ncclAllReduce(in, out, N, ncclFloat32, ncclSum, comm, NULL), ncclInvalidUsage,
            "finalized");
    free(in);
    free(out);
    free(big);
    return rc;
}

/* Split: first one rank out (NCCL_SPLIT_NOCOLOR), then all in with the order reversed. */
static int body_split(ncclComm_t *commp, int rank, int nranks, void *arg)
{
    (void)arg;
    ncclComm_t comm = *commp, child = (ncclComm_t)(uintptr_t)1;
    OK(ncclCommSplit(comm, rank == 0 ? NCCL_SPLIT_NOCOLOR : 5, rank, &child, NULL));
    if (rank == 0) {
        EXPECT(child == NULL, "rank 0: NCCL_SPLIT_NOCOLOR gave a communicator");
    } else {
        int n = 0;
        OK(ncclCommCount(child, &n));
        EXPECT(n == nranks - 1, "rank %d: split size %d", rank, n);
        float x = 3, y = 0;
        OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, child, NULL));
        EXPECT(y == 3.0f * (float)(nranks - 1), "rank %d: split allreduce %g", rank, (double)y);
        OK(ncclCommDestroy(child));
    }
    /* With a config (named), keys reversing the order. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "smoke-split";
    OK(ncclCommSplit(comm, 7, nranks - rank, &child, &cfg));
    int cr = -1;
    OK(ncclCommUserRank(child, &cr));
    EXPECT(cr == nranks - 1 - rank, "rank %d: split by reversed key gave rank %d", rank, cr);
    int x = rank + 1, y = 0;
    OK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, child, NULL));
    EXPECT(y == nranks * (nranks + 1) / 2, "rank %d: split allreduce %d", rank, y);
    OK(ncclCommDestroy(child));
    return 0;
}

/* Abort: after one good allreduce the last rank aborts; the others' next call fails (the
 * connections close) instead of hanging, with a text, and then they abort too. */
static int body_abort(ncclComm_t *commp, int rank, int nranks, void *arg)
{
    (void)arg;
    float x = 1, y = 0;
    OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, *commp, NULL));
    EXPECT(y == (float)nranks, "rank %d: allreduce before abort %g", rank, (double)y);
    if (rank == nranks - 1) {
        OK(ncclCommAbort(*commp));
        *commp = NULL;
        return 0;
    }
    ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, *commp, NULL);
    EXPECT(r != ncclSuccess, "rank %d: allreduce with an aborted peer succeeded", rank);
    const char *e = ncclGetLastError(*commp);
    EXPECT(e && e[0], "rank %d: no error text after the peer aborted", rank);
    ncclResult_t async = ncclSuccess;
    OK(ncclCommGetAsyncError(*commp, &async));
    OK(ncclCommAbort(*commp));
    *commp = NULL;
    return 0;
}

/* Shrink: after one good allreduce the last rank revokes (as a rank that fails would stop); rank
 * 0's next call fails, and it shrinks to itself with NCCL_SHRINK_ABORT (no new unique id); the
 * revoked rank shrinks its revoked communicator to itself too. Bad flags and a rank excluding
 * itself are refused, changing nothing. */
static int body_shrink(ncclComm_t *commp, int rank, int nranks, void *arg)
{
    (void)arg;
    ncclComm_t comm = *commp, nc = (ncclComm_t)(uintptr_t)1;
    int x = rank + 1, y = 0;
    OK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL));
    EXPECT(y == nranks * (nranks + 1) / 2, "rank %d: allreduce before shrink %d", rank, y);
    int other = rank == 0 ? nranks - 1 : 0, self = rank;
    REFUSED(ncclCommShrink(comm, &other, 1, &nc, NULL, 2), ncclInvalidArgument, "flags");
    EXPECT(nc == NULL, "rank %d: a refused ncclCommShrink left *newcomm set", rank);
    REFUSED(ncclCommShrink(comm, &self, 1, &nc, NULL, NCCL_SHRINK_DEFAULT), ncclInvalidArgument,
            "excludes itself");
    if (rank == nranks - 1) {
        OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
        OK(ncclCommShrink(comm, &other, 1, &nc, NULL, NCCL_SHRINK_DEFAULT));
    } else {
        EXPECT(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL) != ncclSuccess,
               "rank %d: allreduce with a revoked peer succeeded", rank);
        OK(ncclCommShrink(comm, &other, 1, &nc, NULL, NCCL_SHRINK_ABORT));
    }
    int n = 0, me = -1;
    OK(ncclCommCount(nc, &n));
    OK(ncclCommUserRank(nc, &me));
    EXPECT(n == nranks - 1 && me == 0, "rank %d: shrunk communicator: count %d, rank %d", rank, n,
           me);
    y = 0;
    OK(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, nc, NULL));
    EXPECT(y == x, "rank %d: allreduce on the shrunk communicator %d", rank, y);
    OK(ncclCommDestroy(nc));
    return 0;
}

/* Revoke: after one good allreduce the last rank revokes; the others' next call fails (the
 * connections close) instead of hanging, and they revoke too. A revoked handle stays valid:
 * queries answer, calls are refused, a second revoke is harmless, and the harness destroys it
 * (no use after free, as after ncclCommAbort). */
static int body_revoke(ncclComm_t *commp, int rank, int nranks, void *arg)
{
    (void)arg;
    ncclComm_t comm = *commp;
    float x = 1, y = 0;
    OK(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
    EXPECT(y == (float)nranks, "rank %d: allreduce before revoke %g", rank, (double)y);
    REFUSED(ncclCommRevoke(comm, 1), ncclInvalidArgument, "NCCL_REVOKE_DEFAULT");
    if (rank != nranks - 1) {
        ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL);
        EXPECT(r != ncclSuccess, "rank %d: allreduce with a revoked peer succeeded", rank);
    }
    OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
    OK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
    int n = 0, me = -1;
    OK(ncclCommCount(comm, &n));
    OK(ncclCommUserRank(comm, &me));
    EXPECT(n == nranks && me == rank, "rank %d: revoked communicator: count %d, rank %d", rank, n,
           me);
    ncclResult_t async = ncclInternalError;
    OK(ncclCommGetAsyncError(comm, &async));
    if (rank == nranks - 1) {
        /* Revoked while healthy: every call says so. */
        EXPECT(async == ncclSuccess, "rank %d: async error %d after revoke", rank, (int)async);
        REFUSED(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL), ncclInvalidUsage,
                "aborted");
        REFUSED(ncclGather(&x, &y, 1, ncclFloat32, 0, comm, NULL), ncclInvalidUsage, "aborted");
        REFUSED(ncclCommFinalize(comm), ncclInvalidUsage, "aborted");
    } else {
        /* Broken by the peer first: calls repeat that error (loom reports the first cause). */
        EXPECT(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess,
               "rank %d: allreduce on a revoked communicator succeeded", rank);
        EXPECT(ncclCommFinalize(comm) != ncclSuccess, "rank %d: finalize after revoke", rank);
    }
    ncclComm_t child = NULL;
    EXPECT(ncclCommSplit(comm, 0, rank, &child, NULL) != ncclSuccess && child == NULL,
           "rank %d: split of a revoked communicator", rank);
    return 0;
}

/* ---- jobs that make their own communicators ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Non-blocking init with a 2.28 config on rank 0 and a config as a 2.17 header wrote it (no
 * splitShare and later) on the others: ncclInProgress, then poll. */
static void *raw_nonblocking(void *p)
{
    rank_t *t = p;
    t->rc = 1;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "smoke-nonblocking";
    cfg.maxCTAs = 4; /* accepted, ignored */
    if (t->rank != 0) cfg.size = offsetof(ncclConfig_t, splitShare);
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, t->nranks, t->id, t->rank, &cfg);
    if (r != ncclInProgress && r != ncclSuccess) {
        FAIL("rank %d: non-blocking init -> %d: %s", t->rank, (int)r, ncclGetLastError(NULL));
        return NULL;
    }
    if (comm == NULL) {
        FAIL("rank %d: non-blocking init returned %d without a communicator", t->rank, (int)r);
        return NULL;
    }
    ncclResult_t async = ncclInProgress;
    double dl = now_s() + 30;
    while (now_s() < dl) {
        if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) break;
        if (async != ncclInProgress) break;
        usleep(1000);
    }
    if (async != ncclSuccess) {
        FAIL("rank %d: non-blocking init ended with %d: %s", t->rank, (int)async,
             ncclGetLastError(comm));
    } else {
        int x = 2, y = 0;
        if (ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, NULL) != ncclSuccess ||
            y != 2 * t->nranks)
            FAIL("rank %d: allreduce on the non-blocking communicator: %d, %s", t->rank, y,
                 ncclGetLastError(NULL));
        else
            t->rc = 0;
    }
    ncclCommDestroy(comm);
    return NULL;
}

/* ncclCommInitRankScalable with two ids (made by "two roots"): every rank passes both. */
static ncclUniqueId scalable_ids[2];

static void *raw_scalable(void *p)
{
    rank_t *t = p;
    t->rc = 1;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankScalable(&comm, t->nranks, t->rank, 2, scalable_ids, NULL);
    if (r != ncclSuccess) {
        FAIL("rank %d: ncclCommInitRankScalable -> %d: %s", t->rank, (int)r,
             ncclGetLastError(NULL));
        return NULL;
    }
    int64_t x = t->rank, y = -1;
    if (ncclAllReduce(&x, &y, 1, ncclInt64, ncclMax, comm, NULL) != ncclSuccess ||
        y != t->nranks - 1)
        FAIL("rank %d: allreduce on the scalable communicator: %lld", t->rank, (long long)y);
    else
        t->rc = 0;
    ncclCommDestroy(comm);
    return NULL;
}

/* ncclCommInitAll: both ranks in this thread, driven together by one group. */
static int test_init_all(void)
{
    ncclComm_t comms[NRANKS] = {0};
    OK(ncclCommInitAll(comms, NRANKS, NULL));
    float x[NRANKS][4], y[NRANKS][4];
    for (int r = 0; r < NRANKS; r++)
        for (int i = 0; i < 4; i++)
            x[r][i] = (float)(r * 10 + i);
    OK(ncclGroupStart());
    for (int r = 0; r < NRANKS; r++)
        OK(ncclAllReduce(x[r], y[r], 4, ncclFloat32, ncclSum, comms[r], NULL));
    OK(ncclGroupEnd());
    int bad = 0;
    for (int r = 0; r < NRANKS; r++)
        for (int i = 0; i < 4; i++) {
            float want = 0;
            for (int q = 0; q < NRANKS; q++)
                want += (float)(q * 10 + i);
            if (y[r][i] != want) bad = 1;
        }
    EXPECT(!bad, "ncclCommInitAll: grouped allreduce gave wrong sums");
    for (int r = 0; r < NRANKS; r++)
        OK(ncclCommDestroy(comms[r]));
    printf("%-28s %s\n", "init all + group", bad ? "FAILED" : "ok");
    return bad;
}

/* ---- process-wide checks ---- */

/* Arguments that NCCL programs get wrong: each must be refused, none may crash. */
static int test_nulls(void)
{
    int before = failures;
    float f = 0;
    REFUSED(ncclGetVersion(NULL), ncclInvalidArgument, "NULL");
    REFUSED(ncclGetUniqueId(NULL), ncclInvalidArgument, "NULL");
    ncclUniqueId zero;
    memset(&zero, 0, sizeof(zero));
    EXPECT(ncclCommInitRank(NULL, 2, zero, 0) == ncclInvalidArgument, "InitRank(NULL comm)");
    ncclComm_t c = NULL;
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    REFUSED(ncclCommInitRankConfig(&c, 1, zero, 0, &bad), ncclInvalidArgument,
            "NCCL_CONFIG_INITIALIZER");
    EXPECT(c == NULL, "a refused config still made a communicator");
    bad.magic = NCCL_CONFIG_MAGIC;
    bad.size = 4;
    REFUSED(ncclCommInitRankConfig(&c, 1, zero, 0, &bad), ncclInvalidArgument, "size");
    REFUSED(ncclCommInitRankScalable(&c, 2, 0, 0, NULL, NULL), ncclInvalidArgument, "nId");
    EXPECT(ncclCommInitAll(NULL, 2, NULL) == ncclInvalidArgument, "InitAll(NULL)");
    EXPECT(ncclCommDestroy(NULL) == ncclSuccess, "Destroy(NULL)");
    EXPECT(ncclCommAbort(NULL) == ncclSuccess, "Abort(NULL)");
    EXPECT(ncclCommFinalize(NULL) == ncclInvalidArgument, "Finalize(NULL)");
    EXPECT(ncclCommSplit(NULL, 0, 0, &c, NULL) == ncclInvalidArgument, "Split(NULL)");
    EXPECT(ncclCommGetAsyncError(NULL, NULL) == ncclInvalidArgument, "GetAsyncError(NULL)");
    EXPECT(ncclCommCount(NULL, NULL) == ncclInvalidArgument, "Count(NULL)");
    EXPECT(ncclCommUserRank(NULL, NULL) == ncclInvalidArgument, "UserRank(NULL)");
    EXPECT(ncclCommCuDevice(NULL, NULL) == ncclInvalidArgument, "CuDevice(NULL)");
    EXPECT(ncclCommRegister(NULL, &f, 4, NULL) == ncclInvalidArgument, "Register(NULL)");
    EXPECT(ncclCommDeregister(NULL, NULL) == ncclInvalidArgument, "Deregister(NULL)");
    EXPECT(ncclRedOpCreatePreMulSum(NULL, NULL, ncclFloat, ncclScalarHostImmediate, NULL) ==
               ncclInvalidArgument,
           "PreMulSum(NULL)");
    EXPECT(ncclRedOpDestroy(ncclSum, NULL) == ncclInvalidArgument, "RedOpDestroy(NULL)");
    EXPECT(ncclAllReduce(&f, &f, 1, ncclFloat, ncclSum, NULL, NULL) == ncclInvalidArgument,
           "AllReduce(NULL comm)");
    EXPECT(ncclBroadcast(&f, &f, 1, ncclFloat, 0, NULL, NULL) == ncclInvalidArgument,
           "Broadcast(NULL comm)");
    EXPECT(ncclBcast(&f, 1, ncclFloat, 0, NULL, NULL) == ncclInvalidArgument, "Bcast(NULL)");
    EXPECT(ncclReduce(&f, &f, 1, ncclFloat, ncclSum, 0, NULL, NULL) == ncclInvalidArgument,
           "Reduce(NULL comm)");
    EXPECT(ncclAllGather(&f, &f, 1, ncclFloat, NULL, NULL) == ncclInvalidArgument,
           "AllGather(NULL comm)");
    EXPECT(ncclReduceScatter(&f, &f, 1, ncclFloat, ncclSum, NULL, NULL) == ncclInvalidArgument,
           "ReduceScatter(NULL comm)");
    EXPECT(ncclAlltoAll(&f, &f, 1, ncclFloat, NULL, NULL) == ncclInvalidArgument,
           "AlltoAll(NULL comm)");
    EXPECT(ncclSend(&f, 1, ncclFloat, 0, NULL, NULL) == ncclInvalidArgument, "Send(NULL)");
    EXPECT(ncclRecv(&f, 1, ncclFloat, 0, NULL, NULL) == ncclInvalidArgument, "Recv(NULL)");
    REFUSED(ncclGather(&f, &f, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument, "comm is NULL");
    REFUSED(ncclScatter(&f, &f, 1, ncclFloat, 0, NULL, NULL), ncclInvalidArgument, "comm is NULL");
    REFUSED(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT), ncclInvalidArgument, "comm is NULL");
    REFUSED(ncclGroupEnd(), ncclInvalidUsage, "GroupStart");
    /* Without a usable GPU (a build without CUDA, no driver, no device) ncclMemAlloc is refused
     * with a reason that names CUDA; with one it allocates. Freeing NULL is always fine. */
    void *p = NULL;
    ncclResult_t mr = ncclMemAlloc(&p, 1024);
    if (mr == ncclSuccess) {
        EXPECT(p != NULL, "ncclMemAlloc succeeded without a pointer");
        EXPECT(ncclMemFree(p) == ncclSuccess, "ncclMemFree: %s", ncclGetLastError(NULL));
    } else {
        const char *e = ncclGetLastError(NULL);
        EXPECT(mr == ncclInvalidUsage && e && strstr(e, "CUDA"), "ncclMemAlloc -> %d: \"%s\"",
               (int)mr, e ? e : "(null)");
    }
    EXPECT(ncclMemFree(NULL) == ncclSuccess, "MemFree(NULL)");
    /* Unsupported calls answer the same whatever their arguments. */
    REFUSED(ncclCommShrink(NULL, NULL, 0, NULL, NULL, 0), ncclInvalidArgument, "not a live");
    REFUSED(ncclCommWindowRegister(NULL, NULL, 0, NULL, 0), ncclInvalidArgument, "win is NULL");
    REFUSED(ncclGroupSimulateEnd(NULL), ncclInvalidUsage, "not supported");
    EXPECT(ncclGetLastError(NULL) != NULL, "ncclGetLastError(NULL) is NULL");
    printf("%-28s %s\n", "NULL and bad arguments", failures == before ? "ok" : "FAILED");
    return failures != before;
}

static int test_version_errors(void)
{
    int before = failures;
    int v = 0;
    ncclResult_t r = ncclGetVersion(&v);
    EXPECT(r == ncclSuccess && v == NCCL_VERSION_CODE, "ncclGetVersion -> %d, %d", (int)r, v);
    EXPECT(v / 10000 == 2 && v / 100 % 100 == 28, "claimed version %d is not 2.28.x", v);
    for (int i = 0; i <= ncclNumResults; i++) {
        const char *s = ncclGetErrorString((ncclResult_t)i);
        EXPECT(s && s[0], "ncclGetErrorString(%d) is empty", i);
    }
    EXPECT(ncclGetErrorString((ncclResult_t)12345) != NULL, "ncclGetErrorString(12345) is NULL");
    /* Every name and its profiling twin: present, and the same code. */
    for (size_t i = 0; i < sizeof(exported) / sizeof(exported[0]); i++) {
        char pname[128];
        snprintf(pname, sizeof(pname), "p%s", exported[i]);
        void *a = dlsym(RTLD_DEFAULT, exported[i]), *b = dlsym(RTLD_DEFAULT, pname);
        EXPECT(a != NULL, "%s is not exported", exported[i]);
        EXPECT(b != NULL, "%s is not exported", pname);
        EXPECT(a == b, "%s and %s are different code", exported[i], pname);
    }
    /* beside them only dlopen, which keeps a second NCCL out (shim.c) */
    EXPECT(sizeof(exported) / sizeof(exported[0]) == 43, "%zu names in the list",
           sizeof(exported) / sizeof(exported[0]));
    /* The version script keeps loom's own API inside. */
    EXPECT(dlsym(RTLD_DEFAULT, "loomAllReduce") == NULL, "the shim exports loomAllReduce");
    EXPECT(dlsym(RTLD_DEFAULT, "base_error") == NULL, "the shim exports base_error");
    printf("%-28s %s\n", "versions, errors, symbols", failures == before ? "ok" : "FAILED");
    return failures != before;
}

/* The shim's file, as the dynamic linker loaded it. */
static int shim_path(char *out, size_t len)
{
    Dl_info info;
    if (!dladdr((const void *)(uintptr_t)&ncclGetVersion, &info) || info.dli_fname == NULL) {
        FAIL("dladdr(ncclGetVersion) found no library");
        return 1;
    }
    if (realpath(info.dli_fname, out) == NULL) snprintf(out, len, "%s", info.dli_fname);
    return 0;
}

/* No libnccl but the shim may be mapped: not NVIDIA's in /usr/local/cuda, nor any other. */
static int test_maps(void)
{
    int before = failures;
    char shim[PATH_MAX];
    if (shim_path(shim, sizeof(shim))) return 1;
    const char *base = strrchr(shim, '/');
    EXPECT(base && strcmp(base + 1, "libnccl.so.2") == 0, "the shim is %s, not libnccl.so.2", shim);
    /* A framework that loads NVIDIA's library by path (PyTorch's wheels do) gets the shim. */
    const char *nvidia[] = {"/usr/local/cuda/lib64/libnccl.so.2",
                            "/usr/lib/x86_64-linux-gnu/libnccl.so.2"};
    for (size_t i = 0; i < sizeof(nvidia) / sizeof(nvidia[0]); i++) {
        if (access(nvidia[i], R_OK) != 0) continue;
        void *h = dlopen(nvidia[i], RTLD_NOW | RTLD_LOCAL);
        EXPECT(h != NULL, "dlopen(%s) failed: %s", nvidia[i], dlerror());
        if (h) {
            EXPECT(dlsym(h, "ncclGetVersion") == (void *)(uintptr_t)&ncclGetVersion,
                   "dlopen(%s) gave a library other than the shim", nvidia[i]);
            dlclose(h);
        }
    }
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL) {
        FAIL("cannot read /proc/self/maps");
        return 1;
    }
    char line[PATH_MAX + 256];
    int seen = 0;
    while (fgets(line, sizeof(line), f)) {
        char *path = strchr(line, '/');
        if (path == NULL) continue;
        path[strcspn(path, "\n")] = '\0';
        const char *b = strrchr(path, '/') + 1;
        if (strncmp(b, "libnccl", 7) != 0) continue;
        char real[PATH_MAX];
        if (realpath(path, real) == NULL) snprintf(real, sizeof(real), "%s", path);
        EXPECT(strcmp(real, shim) == 0, "another libnccl is mapped: %s (the shim is %s)", real,
               shim);
        seen++;
    }
    fclose(f);
    EXPECT(seen > 0, "the shim %s is not in /proc/self/maps", shim);
    printf("%-28s %s (%s)\n", "only the shim's libnccl", failures == before ? "ok" : "FAILED",
           shim);
    return failures != before;
}

/* What tools/loom-run promises: the flag, and the shim in LD_PRELOAD (last, after the caller's
 * own entries, which keep precedence). */
static int test_loom_run(void)
{
    int before = failures;
    const char *act = getenv("LOOM_SHIM_ACTIVE"), *pre = getenv("LD_PRELOAD");
    EXPECT(act && strcmp(act, "1") == 0, "LOOM_SHIM_ACTIVE is %s", act ? act : "unset");
    char shim[PATH_MAX], last[PATH_MAX] = "", real[PATH_MAX];
    if (shim_path(shim, sizeof(shim))) return 1;
    for (const char *p = pre ? pre : ""; *p;) {
        size_t n = strcspn(p, ": ");
        if (n) snprintf(last, sizeof(last), "%.*s", (int)n, p);
        p += n;
        p += strspn(p, ": ");
    }
    if (realpath(last, real) == NULL) snprintf(real, sizeof(real), "%s", last);
    EXPECT(strcmp(real, shim) == 0, "LD_PRELOAD (%s) does not end with the shim %s",
           pre ? pre : "unset", shim);
    printf("%-28s %s\n", "loom-run environment", failures == before ? "ok" : "FAILED");
    return failures != before;
}

/* Does the log file hold a line containing text? */
static int log_has(const char *log, const char *text)
{
    FILE *f = fopen(log, "r");
    int found = 0;
    char line[4096];
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, text)) found = 1;
    if (f) fclose(f);
    return found;
}

/* ncclResetDebugInit re-reads LOOM_DEBUG: with NONE even warnings stop, with INFO they are back.
 * (The refusals log a warning each; two different ones tell the phases apart.) */
static int test_reset_debug(const char *log)
{
    int before = failures;
    const char *old = getenv("LOOM_DEBUG");
    char saved[64];
    snprintf(saved, sizeof(saved), "%s", old ? old : "");
    setenv("LOOM_DEBUG", "NONE", 1);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* as in NVIDIA's header */
    ncclResetDebugInit();
    REFUSED(ncclGroupSimulateEnd(NULL), ncclInvalidUsage, "not supported");
    EXPECT(!log_has(log, "ncclGroupSimulateEnd is not supported"),
           "LOOM_DEBUG=NONE after ncclResetDebugInit still logged a warning");
    setenv("LOOM_DEBUG", saved, 1);
    pncclResetDebugInit();
#pragma GCC diagnostic pop
    REFUSED(ncclDevCommDestroy(NULL, NULL), ncclInvalidUsage, "not supported");
    EXPECT(log_has(log, "ncclDevCommDestroy is not supported"),
           "LOOM_DEBUG=%s after ncclResetDebugInit logged no warning", saved);
    printf("%-28s %s\n", "ncclResetDebugInit", failures == before ? "ok" : "FAILED");
    return failures != before;
}

/* The INFO line of the first call, read back from the log file set up in main. */
static int test_hello_logged(const char *log)
{
    FILE *f = fopen(log, "r");
    int found = 0;
    char line[4096];
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, "NCCL shim active") && strstr(line, "loom ")) found = 1;
    if (f) fclose(f);
    EXPECT(found, "no \"NCCL shim active\" line in %s", log);
    printf("%-28s %s\n", "shim INFO line", found ? "ok" : "FAILED");
    return !found;
}

int main(int argc, char **argv)
{
    int expect_loom_run = argc > 1 && strcmp(argv[1], "--expect-loom-run") == 0;
    /* Before the first call (loom reads these once): hosts without a routable interface still
     * run the jobs on loopback; a wedged job fails in seconds, not minutes; and INFO goes to a
     * file, so that the shim's first-call line can be checked without flooding the output. */
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    setenv("LOOM_TIMEOUT", "20", 0);
    char log[256] = "";
    if (getenv("LOOM_DEBUG") == NULL && getenv("LOOM_DEBUG_FILE") == NULL) {
        const char *tmp = getenv("TMPDIR");
        snprintf(log, sizeof(log), "%s/loom-shim-smoke-%d.log", tmp && tmp[0] ? tmp : "/tmp",
                 (int)getpid());
        unlink(log);
        setenv("LOOM_DEBUG", "INFO", 1);
        setenv("LOOM_DEBUG_SUBSYS", "SHIM", 1);
        setenv("LOOM_DEBUG_FILE", log, 1);
    }

    test_version_errors();
    if (log[0]) test_hello_logged(log);
    if (log[0]) test_reset_debug(log);
    test_maps();
    if (expect_loom_run) test_loom_run();
    test_nulls();
    run_job("collectives (2 ranks)", body_collectives, NULL, NULL);
    run_job("split", body_split, NULL, NULL);
    run_job("non-blocking init", NULL, raw_nonblocking, NULL);
    if (ncclGetUniqueId(&scalable_ids[0]) == ncclSuccess &&
        ncclGetUniqueId(&scalable_ids[1]) == ncclSuccess)
        run_job("init rank scalable", NULL, raw_scalable, NULL);
    else
        FAIL("ncclGetUniqueId for the scalable init: %s", ncclGetLastError(NULL));
    test_init_all();
    run_job("abort", body_abort, NULL, NULL);
    run_job("revoke", body_revoke, NULL, NULL);
    run_job("shrink", body_shrink, NULL, NULL);
    /* Nothing above loaded another libnccl on the way (dlopen by loom, say). */
    test_maps();

    if (log[0]) {
        if (failures) {
            /* Warnings went to the file too: show them with the failure. */
            fprintf(stderr, "---- %s ----\n", log);
            FILE *f = fopen(log, "r");
            char line[4096];
            while (f && fgets(line, sizeof(line), f))
                fputs(line, stderr);
            if (f) fclose(f);
        }
        unlink(log);
    }
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
