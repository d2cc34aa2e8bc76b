/*
 * One rank of a job under mpirun (tests/mpi_test.sh, and the test bed's namespaces:
 * scripts/testbed.sh grid --transport mpi): loom started from MPI, and the collective grid
 * compared bit for bit with values computed here.
 *
 * mpi_prog grid [env]: loomCommInitMpi(MPI_COMM_WORLD) (env: loomCommInitFromEnv, which meets
 *   over MPI since MPI runs), then every collective over every type, the exact operations,
 *   counts 0, 1, odd and large, in place and out of place, then an allreduce on each half of a
 *   loomCommSplit.
 * mpi_prog thread: (with MPI_PROG_LEVEL=funneled) a loom call from a second thread is refused,
 *   naming the thread level.
 * mpi_prog split: loomCommInitMpi on MPI_Comm_split(world, rank % 2): the grid on each half.
 * mpi_prog stall: the last rank stops itself (SIGSTOP) while the others allreduce: each of them
 *   must fail naming it ("no progress from rank N-1 (...)", with the operation's seq); then rank
 *   0 continues it and its own call fails too (its peers gave up).
 * mpi_prog mismatch: rank 0 sends 10 int32 where rank 1 receives 12: rank 1's error names both
 *   calls (the length in the header, the metadata tell which), as over tcp.
 * mpi_prog kill: the last rank is killed (SIGKILL) in the middle of the job: the others must
 *   fail naming it (mpirun --enable-recovery lets them run on).
 * mpi_prog late: the last rank computes beyond LOOM_TIMEOUT before its first call and between
 *   calls: every allreduce must succeed, exact (see late()).
 * The stall and kill checks read the same over every LOOM_TRANSPORT (see fault()).
 *
 * Prints "mpi_prog: rank R of N: <mode> ok (K checks)" on success, or the error with "mpi_prog:
 * rank R: ..." and exits 1. The inputs are small integers, so every sum, product, maximum and
 * minimum is exact in any order and any type; averages are checked where they are exact
 * (integers, and floating point over a power-of-two number of ranks).
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <mpi.h>

#include "loom.h"
#include "loom_mpi.h"

static int me = -1;
static long nchecks;

#define DIE(...)                                                                                   \
    do {                                                                                           \
        fprintf(stderr, "mpi_prog: rank %d: ", me);                                                \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

static size_t type_size(loomDataType_t t)
{
    switch (t) {
    case loomInt8:
    case loomUint8: return 1;
    case loomFloat16:
    case loomBfloat16: return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32: return 4;
    default: return 8;
    }
}

/* The types whose sums of these inputs are exact (the 8-bit floats are not, beyond 16: their
 * reductions are test_coll's and test_reduce's; this transport moves bytes of any type). */
static const loomDataType_t types[] = {loomInt8,    loomUint8,   loomInt32,   loomUint32,
                                       loomInt64,   loomUint64,  loomFloat16, loomFloat32,
                                       loomFloat64, loomBfloat16};
#define NTYPES ((int)(sizeof(types) / sizeof(types[0])))

static const char *type_name(loomDataType_t t)
{
    static const char *n[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                              "uint64", "float16", "float32", "float64", "bfloat16"};
    return n[t];
}

static uint16_t f16_of(double v) /* v: a small non-negative integer or dyadic fraction */
{
    if (v == 0) return 0;
    int e;
    double m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
    /* half: 1.f * 2^(E-15), 10 bits of fraction */
    int E = e - 1 + 15;
    uint32_t frac = (uint32_t)((m * 2 - 1) * 1024 + 0.5);
    return (uint16_t)((E << 10) | frac);
}

static uint16_t bf16_of(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static void put(loomDataType_t t, void *buf, size_t i, double v)
{
    switch (t) {
    case loomInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case loomUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case loomInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case loomUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case loomInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case loomUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case loomFloat16: ((uint16_t *)buf)[i] = f16_of(v); break;
    case loomFloat32: ((float *)buf)[i] = (float)v; break;
    case loomFloat64: ((double *)buf)[i] = v; break;
    default: ((uint16_t *)buf)[i] = bf16_of(v); break;
    }
}

static bool is_int(loomDataType_t t)
{
    return t <= loomUint64;
}

/* Rank r's input at element i for operation op. */
static double input(int r, int n, size_t i, loomRedOp_t op)
{
    if (op == loomProd) return (int)(i % (size_t)n) == r ? 2 : 1;
    return (double)((r * 3 + i) % 5 + 1);
}

static double reduced(int n, size_t i, loomRedOp_t op, loomDataType_t t)
{
    double acc = input(0, n, i, op);
    for (int r = 1; r < n; r++) {
        double v = input(r, n, i, op);
        if (op == loomSum || op == loomAvg) acc += v;
        if (op == loomProd) acc *= v;
        if (op == loomMax) acc = fmax(acc, v);
        if (op == loomMin) acc = fmin(acc, v);
    }
    if (op == loomAvg) acc = is_int(t) ? floor(acc / n) : acc / n;
    return acc;
}

static void check_bytes(const char *what, const void *got, const void *want, size_t bytes)
{
    nchecks++;
    if (memcmp(got, want, bytes) == 0) return;
    const uint8_t *g = got, *w = want;
    size_t k = 0;
    while (g[k] == w[k])
        k++;
    DIE("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, k, bytes, g[k], w[k]);
}

static void ok(loomResult_t r, loomComm_t comm, const char *what)
{
    if (r != loomSuccess) DIE("%s: %s", what, loomGetLastError(comm));
}

/* The grid on comm. `large`: the count for the large cases. */
static void grid(loomComm_t comm, size_t large)
{
    int r, n;
    loomCommUserRank(comm, &r);
    loomCommCount(comm, &n);
    size_t counts[] = {0, 1, 7, 1001, large};
    size_t maxc = large;
    size_t maxbytes = maxc * 8 * (size_t)n;
    uint8_t *send = malloc(maxbytes), *recv = malloc(maxbytes), *want = malloc(maxbytes);
    if (!send || !recv || !want) DIE("out of memory");
    char what[160];
    bool pow2 = (n & (n - 1)) == 0;
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        size_t c = counts[ci];
        for (int t = 0; t < NTYPES; t++) {
            loomDataType_t ty = types[t];
            size_t es = type_size(ty);
            /* the large count for a few types only: CI time */
            if (c == large && ty != loomInt32 && ty != loomFloat32 && ty != loomFloat16) continue;
            for (int o = 0; o < loomNumOps; o++) {
                loomRedOp_t op = (loomRedOp_t)o;
                if (op == loomAvg && !is_int(ty) && !pow2) continue;
                if (c == large && op != loomSum && op != loomMax) continue;
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (size_t i = 0; i < c; i++) {
                        put(ty, send, i, input(r, n, i, op));
                        put(ty, want, i, reduced(n, i, op, ty));
                    }
                    memset(recv, 0xee, c * es);
                    void *dst = inplace ? send : recv;
                    snprintf(what, sizeof(what), "allreduce %s op %d count %zu %s", type_name(ty),
                             o, c, inplace ? "in place" : "out of place");
                    ok(loomAllReduce(send, dst, c, ty, op, comm, NULL), comm, what);
                    check_bytes(what, dst, want, c * es);
                    /* reduce-scatter: each rank's slice of n*c */
                    if (o != loomProd && (size_t)t % 3 == ci % 3) {
                        for (size_t i = 0; i < c * (size_t)n; i++)
                            put(ty, send, i, input(r, n, i, op));
                        for (size_t i = 0; i < c; i++)
                            put(ty, want, i, reduced(n, (size_t)r * c + i, op, ty));
                        void *rdst = inplace ? send + (size_t)r * c * es : recv;
                        snprintf(what, sizeof(what), "reduce-scatter %s op %d count %zu %s",
                                 type_name(ty), o, c, inplace ? "in place" : "out of place");
                        ok(loomReduceScatter(send, rdst, c, ty, op, comm, NULL), comm, what);
                        check_bytes(what, rdst, want, c * es);
                    }
                    /* reduce to a root that moves with the count */
                    if (o == loomSum || o == loomMin) {
                        int root = (int)(ci % (size_t)n);
                        for (size_t i = 0; i < c; i++) {
                            put(ty, send, i, input(r, n, i, op));
                            put(ty, want, i, reduced(n, i, op, ty));
                        }
                        void *rdst = inplace ? send : recv;
                        snprintf(what, sizeof(what), "reduce %s op %d count %zu root %d %s",
                                 type_name(ty), o, c, root, inplace ? "in place" : "out of place");
                        ok(loomReduce(send, rdst, c, ty, op, root, comm, NULL), comm, what);
                        if (r == root) check_bytes(what, rdst, want, c * es);
                    }
                }
            }
            for (int inplace = 0; inplace < 2; inplace++) {
                const char *ip = inplace ? "in place" : "out of place";
                /* allgather */
                for (size_t i = 0; i < c; i++)
                    put(ty, inplace ? send + (size_t)r * c * es : send, i, input(r, n, i, 0));
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < c; i++)
                        put(ty, want + (size_t)q * c * es, i, input(q, n, i, 0));
                void *src = inplace ? send + (size_t)r * c * es : send;
                void *dst = inplace ? send : recv;
                snprintf(what, sizeof(what), "allgather %s count %zu %s", type_name(ty), c, ip);
                ok(loomAllGather(src, dst, c, ty, comm, NULL), comm, what);
                check_bytes(what, dst, want, c * es * (size_t)n);
                /* broadcast */
                int root = (int)((ci + (size_t)t) % (size_t)n);
                for (size_t i = 0; i < c; i++) {
                    put(ty, send, i, r == root ? input(root, n, i, 0) : 0);
                    put(ty, want, i, input(root, n, i, 0));
                }
                dst = inplace ? send : recv;
                snprintf(what, sizeof(what), "broadcast %s count %zu root %d %s", type_name(ty), c,
                         root, ip);
                ok(loomBroadcast(send, dst, c, ty, root, comm, NULL), comm, what);
                check_bytes(what, dst, want, c * es);
            }
            /* alltoall (out of place), and a ring of sends and receives */
            if (c != large || ty == loomInt32) {
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < c; i++) {
                        put(ty, send + (size_t)q * c * es, i, (double)((r * 7 + q + i) % 100));
                        put(ty, want + (size_t)q * c * es, i, (double)((q * 7 + r + i) % 100));
                    }
                snprintf(what, sizeof(what), "alltoall %s count %zu", type_name(ty), c);
                ok(loomAlltoAll(send, recv, c, ty, comm, NULL), comm, what);
                check_bytes(what, recv, want, c * es * (size_t)n);
                int to = (r + 1) % n, from = (r + n - 1) % n;
                for (size_t i = 0; i < c; i++) {
                    put(ty, send, i, (double)((r + i) % 100));
                    put(ty, want, i, (double)((from + i) % 100));
                }
                snprintf(what, sizeof(what), "send/recv ring %s count %zu", type_name(ty), c);
                ok(loomGroupStart(), comm, what);
                ok(loomSend(send, c, ty, to, comm, NULL), comm, what);
                ok(loomRecv(recv, c, ty, from, comm, NULL), comm, what);
                ok(loomGroupEnd(), comm, what);
                check_bytes(what, recv, want, c * es);
            }
        }
    }
    free(send);
    free(recv);
    free(want);
}

/* loomCommSplit of comm (halves by parity, ranks reversed): an exact allreduce on each half. */
static void split_child(loomComm_t comm)
{
    int r, n;
    loomCommUserRank(comm, &r);
    loomCommCount(comm, &n);
    loomComm_t child;
    ok(loomCommSplit(comm, r % 2, -r, &child, NULL), comm, "loomCommSplit");
    int cr, cn;
    loomCommUserRank(child, &cr);
    loomCommCount(child, &cn);
    /* keys -r: the half's ranks in reverse order */
    int want_n = 0, want_r = 0;
    for (int q = r % 2; q < n; q += 2) {
        want_n++;
        if (q > r) want_r++;
    }
    if (cn != want_n || cr != want_r)
        DIE("split: rank %d of %d in my half, expected %d of %d", cr, cn, want_r, want_n);
    enum { COUNT = 4097 };
    static int32_t v[COUNT], want[COUNT];
    for (int i = 0; i < COUNT; i++) {
        v[i] = r * 1000 + i;
        want[i] = 0;
        for (int q = r % 2; q < n; q += 2)
            want[i] += q * 1000 + i;
    }
    ok(loomAllReduce(v, v, COUNT, loomInt32, loomSum, child, NULL), child, "allreduce on a split");
    check_bytes("allreduce on a split half", v, want, sizeof(v));
    ok(loomCommDestroy(child), NULL, "loomCommDestroy (split)");
}

/* Under MPI_THREAD_FUNNELED, a loom call from another thread is refused with the reason. */
static void *other_thread(void *arg)
{
    loomComm_t comm = arg;
    int32_t v[4] = {0};
    loomResult_t r = loomAllReduce(v, v, 4, loomInt32, loomSum, comm, NULL);
    const char *err = loomGetLastError(comm);
    if (r == loomSuccess) DIE("an allreduce from a second thread succeeded under FUNNELED");
    if (!strstr(err, "from a thread that did not initialise MPI") ||
        !strstr(err, "MPI_THREAD_FUNNELED"))
        DIE("the error does not say why: %s", err);
    printf("mpi_prog: rank %d: second thread refused: %s\n", me, err);
    return NULL;
}

/* Whether process pid is stopped (state T in /proc/PID/stat). */
static bool is_stopped(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t k = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[k] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces */
    return p && p[1] == ' ' && p[2] == 'T';
}

/* A rank stops or leaves while the others allreduce: each of them must name it, in the same
 * words over every transport (tcp, mpi, ucx; only the peer's address in parentheses differs):
 * the operation and its seq, and "no progress from rank V (...) ... stalled or dead" for a
 * stopped rank; for a killed one that, or the job-state service's "rank V (host, pid N) died
 * during ...", or the transport's "connection to rank V (...)" failure. The stopped rank stops
 * itself before the call (as in test_fail's stalled_rank: its peers then wait on a rank that
 * sent nothing, whatever the transport buffers), and rank 0 continues it once its own call has
 * failed and the victim is seen stopped. */
/* The last rank computes (sleeps) MPI_PROG_LATE_S seconds (default 5) before its first call and
 * again between its first and second: beyond LOOM_TIMEOUT, its peers must wait for it, not take
 * it for stalled. Over mpi and ucx, where each side makes its own connection at its first use,
 * the late rank answers its peers' heartbeats before it has made any. */
static void late(loomComm_t comm, int n)
{
    double secs = getenv("MPI_PROG_LATE_S") ? atof(getenv("MPI_PROG_LATE_S")) : 5;
    enum { COUNT = 4099 };
    static int32_t v[COUNT], want[COUNT];
    for (int pass = 0; pass < 3; pass++) {
        if (me == n - 1 && pass < 2) usleep((useconds_t)(secs * 1e6));
        for (int i = 0; i < COUNT; i++) {
            v[i] = (int32_t)((i * 3 + me * 5 + pass) % 11);
            int32_t w = 0;
            for (int q = 0; q < n; q++)
                w += (int32_t)((i * 3 + q * 5 + pass) % 11);
            want[i] = w;
        }
        ok(loomAllReduce(v, v, COUNT, loomInt32, loomSum, comm, NULL), comm,
           pass == 0 ? "the allreduce after the late rank's first call"
                     : "the allreduce after the late rank computed");
        check_bytes("late allreduce", v, want, sizeof(v));
    }
}

static int fault(loomComm_t comm, bool stop, int n)
{
    int victim = n - 1;
    pid_t *pids = calloc((size_t)n, sizeof(pid_t));
    pid_t mine = getpid();
    MPI_Allgather(&mine, sizeof(mine), MPI_BYTE, pids, sizeof(mine), MPI_BYTE, MPI_COMM_WORLD);
    enum { COUNT = 1 << 16 };
    static float v[COUNT];
    ok(loomAllReduce(v, v, COUNT, loomFloat32, loomSum, comm, NULL), comm, "the first allreduce");
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == victim && !stop) {
        fprintf(stderr, "mpi_prog: rank %d kills itself\n", me);
        kill(getpid(), SIGKILL);
    }
    if (me == victim && stop) raise(SIGSTOP);
    loomResult_t r = loomAllReduce(v, v, COUNT, loomFloat32, loomSum, comm, NULL);
    const char *err = loomGetLastError(comm);
    if (me == 0 && stop) {
        for (int i = 0; i < 1000 && !is_stopped(pids[victim]); i++)
            usleep(10000);
        if (kill(pids[victim], SIGCONT) != 0) DIE("kill(SIGCONT)");
    }
    if (me == victim) {
        /* continued: its peers gave up on it */
        if (r == loomSuccess) DIE("the stopped rank's allreduce succeeded");
        printf("mpi_prog: rank %d of %d: stalled rank failed too: %s\n", me, n, err);
        return 0;
    }
    if (r == loomSuccess)
        DIE("the allreduce succeeded while rank %d was %s", victim, stop ? "stopped" : "gone");
    char want[64], dead[64];
    snprintf(want, sizeof(want), "no progress from rank %d (", victim);
    snprintf(dead, sizeof(dead), "rank %d (", victim);
    /* a stopped rank: the same words over every transport, with the operation and its seq; a
     * killed one: the job-state service's verdict (naming the operation this rank was in, or
     * that it was outside calls: the verdict can come before this rank's call starts), or the
     * transport's own words about the lost peer with the operation's seq, as test_fail asks */
    bool named;
    if (stop)
        named = strstr(err, want) != NULL && strstr(err, "the peer is stalled or dead") != NULL &&
                strstr(err, "seq ") != NULL;
    else
        named = strstr(err, dead) != NULL &&
                (strstr(err, ") died during ") != NULL || strstr(err, "seq ") != NULL);
    if (!named)
        DIE("the error does not name rank %d %s (with the operation's seq): %s", victim,
            stop ? "as stalled" : "as gone", err);
    printf("mpi_prog: rank %d of %d: %s ok: %s\n", me, n, stop ? "stall" : "kill", err);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "grid";
    int level = MPI_THREAD_MULTIPLE;
    const char *lv = getenv("MPI_PROG_LEVEL"); /* single|funneled|serialized|multiple */
    if (lv && strcmp(lv, "funneled") == 0) level = MPI_THREAD_FUNNELED;
    if (lv && strcmp(lv, "serialized") == 0) level = MPI_THREAD_SERIALIZED;
    if (lv && strcmp(lv, "single") == 0) level = MPI_THREAD_SINGLE;
    int provided;
    MPI_Init_thread(&argc, &argv, level, &provided);
    int n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    loomComm_t comm;
    size_t large =
        (size_t)strtoul(getenv("MPI_PROG_LARGE") ? getenv("MPI_PROG_LARGE") : "65539", NULL, 10);
    if (strcmp(mode, "split") == 0) {
        MPI_Comm half;
        MPI_Comm_split(MPI_COMM_WORLD, me % 2, me, &half);
        ok(loomCommInitMpi(&comm, half), NULL, "loomCommInitMpi (split)");
        int lr, ln, mr, mn;
        loomCommUserRank(comm, &lr);
        loomCommCount(comm, &ln);
        MPI_Comm_rank(half, &mr);
        MPI_Comm_size(half, &mn);
        if (lr != mr || ln != mn)
            DIE("loom says rank %d of %d, the MPI half %d of %d", lr, ln, mr, mn);
        MPI_Comm_free(&half); /* loom keeps its own duplicate */
        grid(comm, large);
    } else {
        if (argc > 2 && strcmp(argv[2], "env") == 0)
            ok(loomCommInitFromEnv(&comm, NULL), NULL, "loomCommInitFromEnv");
        else
            ok(loomCommInitMpi(&comm, MPI_COMM_WORLD), NULL, "loomCommInitMpi");
        if (strcmp(mode, "grid") == 0) {
            grid(comm, large);
            split_child(comm);
        } else if (strcmp(mode, "thread") == 0) {
            pthread_t t;
            pthread_create(&t, NULL, other_thread, comm);
            pthread_join(t, NULL);
        } else if (strcmp(mode, "late") == 0) {
            late(comm, n);
        } else if (strcmp(mode, "mismatch") == 0) {
            /* rank 0 sends 10 int32, rank 1 expects 12: rank 1 names the lengths */
            int32_t buf[16] = {0};
            if (me == 0) loomSend(buf, 10, loomInt32, 1, comm, NULL);
            if (me == 1) {
                if (loomRecv(buf, 12, loomInt32, 0, comm, NULL) == loomSuccess)
                    DIE("a receive of 12 int32 took a message of 10");
                const char *err = loomGetLastError(comm);
                if (!strstr(err, "rank 0 called point-to-point #0 (count 10, int32") ||
                    !strstr(err, "rank 1 called point-to-point #0 (count 12, int32"))
                    DIE("the error does not name the lengths: %s", err);
                printf("mpi_prog: rank 1: mismatch reported: %s\n", err);
            }
        } else if (strcmp(mode, "stall") == 0 || strcmp(mode, "kill") == 0) {
            bool stop = strcmp(mode, "stall") == 0;
            fault(comm, stop, n);
            fflush(stdout);
            /* a departed peer never reaches MPI_Finalize, which would wait for it */
            if (!stop) _exit(0);
        } else
            DIE("unknown mode %s", mode);
    }
    ok(loomCommDestroy(comm), NULL, "loomCommDestroy");
    printf("mpi_prog: rank %d of %d: %s ok (%ld checks)\n", me, n, mode, nchecks);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
