/*
 * soak: a bounded random test against a reference. Jobs one after another until the time is up;
 * each job draws its rank count (2-5), LOOM_TRANSPORT (tcp, shm, or unset: shm and the node
 * segment; LOOM_SOAK_TRANSPORTS, a list of names such as "tcp shm default ucx", changes the set),
 * LOOM_ALGO (ring, rd, rabenseifner, tree, oneshot, segment, or the automatic choice), a run of
 * collectives of random counts, types and ops (half allreduces, the rest reduce, reduce-scatter,
 * allgather, broadcast with a random root, and a group of sends and receives around a ring; in
 * place and out of place; exact integer-valued inputs, so every order gives the reference's bits)
 * and, in some jobs, one fault: a rank arriving late at init, a rank reaching its first collective
 * 5-7 s after init (beyond LOOM_TIMEOUT=4: the others must wait for it), a rank killed (SIGKILL),
 * stopped (SIGSTOP beyond LOOM_TIMEOUT, then SIGCONT) or calling loomCommAbort midway. The mpi
 * transport (named in LOOM_SOAK_TRANSPORTS) runs its jobs under Open MPI's mpirun, each rank this
 * program again ("soak mpi-rank ...", loomCommInitFromEnv), with --enable-recovery where a fault
 * is drawn, so that mpirun lets the others run on; its ranks write their counts into a file the
 * job maps (LOOM_SOAK_REPORT) instead of memory shared by fork. A quarter of
 * the jobs run with LOOM_SECURE=1 (sealed TCP frames), and a quarter with LOOM_DETERMINISTIC=1,
 * where float sums get inputs whose sums are not exact and must equal, bit for bit, the left fold
 * of the ranks' inputs in rank order. Every job is a fresh process tree (parameters are read once
 * per process). Checked: no successful call returns a wrong result; a job without a fault, or
 * whose fault is a late rank (at init or at its first call), ends with every call a success; in
 * the other faulty jobs the other ranks end with an error or success, within the deadline; no
 * rank is left running at the deadline.
 * usage: soak [SECONDS (default 120)] [SEED (default: time)]
 *        soak job SEED RANKS FAULT TRANSPORT ALGO SECURE DETERM COUNT  (one job, COUNT times:
 *        the line a failed job prints at the end of a run)
 * Prints the seed, then operations checked, faults injected, wrong results and hung ranks; exit
 * status 0 only when both of the last are 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

#define MAX_RANKS 5
#define JOB_DEADLINE_S 40

enum { F_NONE, F_LATE, F_KILL, F_STOP, F_ABORT, F_LATE_CALL, F_N };
static const char *fault_name[] = {"none", "late rank", "kill", "stop", "abort", "late first call"};

typedef struct {
    atomic_int ops;   /* collectives that returned success and were checked */
    atomic_int wrong; /* of those, wrong results */
    atomic_int progress;
    atomic_int pid;  /* the rank's process (mpi: the job's leader kills or stops it by this) */
    atomic_int done; /* the rank returned, with status rc (mpi: mpirun's own status says less) */
    atomic_int rc;
    char note[600]; /* the rank's failures, in words (the job reprints them at the end) */
} rank_report_t;

/* Prints one line, and appends it to the rank's note while there is room. */
static void rank_note(rank_report_t *rep, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void rank_note(rank_report_t *rep, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char line[600];
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
    size_t used = strlen(rep->note);
    if (used + strlen(line) + 3 < sizeof rep->note)
        snprintf(rep->note + used, sizeof rep->note - used, "%s%s", used ? "; " : "", line);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const loomDataType_t types[] = {loomInt32, loomInt64, loomFloat32, loomFloat64, loomUint8};

static double in_val(int op, int r, size_t i)
{
    if (op == loomSum) return (double)((i * 5 + (size_t)r * 3) % 7);
    return (double)((i * 7 + (size_t)r * 13) % 31);
}

/* Deterministic mode's float sums: values whose sums round (a fold in another order differs). */
static double inexact_val(int r, size_t i)
{
    return 1.0 / (double)(3 + (i * 7 + (size_t)r * 11) % 97) + (double)(r % 3) * 1e3;
}

static bool is_float(loomDataType_t t)
{
    return t == loomFloat32 || t == loomFloat64;
}

static void put(loomDataType_t t, void *b, size_t i, double v)
{
    switch (t) {
    case loomInt32: ((int32_t *)b)[i] = (int32_t)v; break;
    case loomInt64: ((int64_t *)b)[i] = (int64_t)v; break;
    case loomFloat32: ((float *)b)[i] = (float)v; break;
    case loomFloat64: ((double *)b)[i] = v; break;
    default: ((uint8_t *)b)[i] = (uint8_t)v; break;
    }
}

static double get(loomDataType_t t, const void *b, size_t i)
{
    switch (t) {
    case loomInt32: return ((const int32_t *)b)[i];
    case loomInt64: return (double)((const int64_t *)b)[i];
    case loomFloat32: return ((const float *)b)[i];
    case loomFloat64: return ((const double *)b)[i];
    default: return ((const uint8_t *)b)[i];
    }
}

static size_t tsize(loomDataType_t t)
{
    return t == loomUint8 ? 1 : t == loomInt32 || t == loomFloat32 ? 4 : 8;
}

enum { K_ALLREDUCE, K_REDUCE, K_REDUCESCATTER, K_ALLGATHER, K_BROADCAST, K_RING, K_N };
static const char *kind_name[] = {"allreduce", "reduce",    "reduce-scatter",
                                  "allgather", "broadcast", "send/recv ring"};

/* The reduction of in_val over the ranks at element i. */
static double folded(int op, int p, size_t i)
{
    double w = in_val(op, 0, i);
    for (int q = 1; q < p; q++) {
        double v = in_val(op, q, i);
        w = op == loomSum ? w + v : op == loomMax ? (v > w ? v : w) : (v < w ? v : w);
    }
    return w;
}

/* One call of kind k: fills the inputs, runs it, and checks what this rank must hold (the
 * receive buffer on every rank, except reduce's off the root). n: elements per rank. */
static loomResult_t soak_call(int k, loomComm_t comm, int r, int p, loomDataType_t t, int op,
                              size_t n, bool inplace, int root, bool fold, bool *ok,
                              rank_report_t *me)
{
    size_t es = tsize(t), tot = n * (size_t)p;
    uint8_t *in = malloc(tot * es + 8), *out = malloc(tot * es + 8), *want = malloc(tot * es + 8);
    size_t nout = n; /* elements of out checked */
    loomResult_t res = loomSuccess;
    uint8_t *send = in, *recv = inplace ? in : out;
    switch (k) {
    case K_ALLREDUCE:
    case K_REDUCE:
        for (size_t i = 0; i < n; i++) {
            if (fold) {
                /* the left fold in rank order, one rounding per step in the type's arithmetic */
                put(t, in, i, inexact_val(r, i));
                float wf = (float)inexact_val(0, i);
                double wd = inexact_val(0, i);
                for (int q = 1; q < p; q++) {
                    wf = wf + (float)inexact_val(q, i);
                    wd = wd + inexact_val(q, i);
                }
                put(t, want, i, t == loomFloat32 ? (double)wf : wd);
                continue;
            }
            put(t, in, i, in_val(op, r, i));
            put(t, want, i, folded(op, p, i));
        }
        if (k == K_ALLREDUCE)
            res = loomAllReduce(send, recv, n, t, (loomRedOp_t)op, comm, NULL);
        else
            res = loomReduce(send, recv, n, t, (loomRedOp_t)op, root, comm, NULL);
        if (k == K_REDUCE && r != root) nout = 0;
        break;
    case K_REDUCESCATTER:
        /* rank q's input element j is in_val(op, q, j); this rank gets the block r */
        for (size_t j = 0; j < tot; j++)
            put(t, in, j, in_val(op, r, j));
        for (size_t i = 0; i < n; i++)
            put(t, want, i, folded(op, p, (size_t)r * n + i));
        if (inplace) recv = in + (size_t)r * n * es; /* the block it keeps */
        res = loomReduceScatter(send, recv, n, t, (loomRedOp_t)op, comm, NULL);
        break;
    case K_ALLGATHER:
        recv = out;
        send = inplace ? out + (size_t)r * n * es : in;
        for (size_t i = 0; i < n; i++)
            put(t, send, i, in_val(loomMax, r, i));
        for (int q = 0; q < p; q++)
            for (size_t i = 0; i < n; i++)
                put(t, want, (size_t)q * n + i, in_val(loomMax, q, i));
        nout = tot;
        res = loomAllGather(send, recv, n, t, comm, NULL);
        break;
    case K_BROADCAST:
        for (size_t i = 0; i < n; i++) {
            put(t, in, i, in_val(loomMax, r, i));
            put(t, want, i, in_val(loomMax, root, i));
        }
        res = loomBroadcast(send, recv, n, t, root, comm, NULL);
        break;
    default: /* K_RING: each rank sends to the next and receives from the previous, one group */
        for (size_t i = 0; i < n; i++) {
            put(t, in, i, in_val(loomMax, r, i));
            put(t, want, i, in_val(loomMax, (r + p - 1) % p, i));
        }
        recv = out;
        loomGroupStart();
        loomSend(in, n, t, (r + 1) % p, comm, NULL);
        loomRecv(out, n, t, (r + p - 1) % p, comm, NULL);
        res = loomGroupEnd();
        break;
    }
    *ok = res != loomSuccess || memcmp(recv, want, nout * es) == 0;
    if (!*ok) {
        size_t i = 0;
        while (i < nout && memcmp(recv + i * es, want + i * es, es) == 0)
            i++;
        size_t bad = 0;
        for (size_t j = i; j < nout; j++)
            bad += memcmp(recv + j * es, want + j * es, es) != 0;
        /* what came instead, from the first wrong element on: a wrong sender, a stale or
         * shifted buffer, or bytes never written show here */
        char got[160] = "";
        for (size_t j = i, len = 0; j < nout && j < i + 6 && len < sizeof got - 40; j++)
            len += (size_t)snprintf(got + len, sizeof got - len, "%s%g/%g", j > i ? " " : "",
                                    get(t, recv, j), get(t, want, j));
        rank_note(me,
                  "soak: rank %d of %d: %s (%s) of %zu x %zu-byte elements, op %d, root %d: %zu "
                  "of %zu elements wrong, the first at %zu (got/want from there: %s)",
                  r, p, kind_name[k], inplace ? "in place" : "out of place", n, es, op, root, bad,
                  nout, i, got);
    }
    free(in);
    free(out);
    free(want);
    return res;
}

/* One rank: nops collectives drawn from the job's seed (the same on every rank). id NULL: the
 * rank meets its peers through the launcher (loomCommInitFromEnv, under mpirun). */
static int rank_main(const loomUniqueId *id, int r, int p, uint64_t seed, int nops, int fault,
                     int victim, int fault_at, bool determ, rank_report_t *rep)
{
    atomic_store(&rep[r].pid, (int)getpid());
    if (fault == F_LATE && r == victim) usleep(1000000 + (useconds_t)(seed % 2000000));
    loomComm_t comm;
    loomResult_t init = id ? loomCommInitRank(&comm, p, *id, r) : loomCommInitFromEnv(&comm, NULL);
    if (init != loomSuccess) {
        /* A rank killed or stopped beyond LOOM_TIMEOUT during init fails everyone's init: that
         * is the expected end. Without such a fault (a late rank included) init must work. */
        if (fault == F_KILL || fault == F_STOP || fault == F_ABORT) return 0;
        rank_note(&rep[r], "soak: rank %d: init failed: %s", r, loomGetLastError(NULL));
        return 3;
    }
    if (fault == F_LATE_CALL && r == victim) usleep(5000000 + (useconds_t)(seed % 2000000));
    uint64_t s = seed;
    int rc = 0;
    for (int k = 0; k < nops; k++) {
        if (fault == F_ABORT && r == victim && k == fault_at) {
            loomCommAbort(comm);
            return 0;
        }
        atomic_store(&rep[r].progress, k);
        loomDataType_t t = types[rng_next(&s) % 5];
        int op = (int)(rng_next(&s) % 3); /* sum, prod excluded, max, min below */
        op = op == 0 ? loomSum : op == 1 ? loomMax : loomMin;
        size_t n = (size_t)(rng_next(&s) % 4 ? rng_next(&s) % 5000 : rng_next(&s) % 300000);
        if (t == loomUint8 && op == loomSum) n = n % 1000; /* 7 * ranks fits a byte */
        bool inplace = rng_next(&s) & 1;
        /* half of the calls are allreduces, the rest the other kinds alike */
        uint64_t kd = rng_next(&s) % (2 * (K_N - 1));
        int kind = kd < K_N - 1 ? K_ALLREDUCE : (int)(kd - (K_N - 1)) + 1;
        int root = (int)(rng_next(&s) % (uint64_t)p);
        if (kind != K_ALLREDUCE && kind != K_REDUCE) n = n % 60000; /* p blocks of it */
        bool fold = determ && op == loomSum && is_float(t) && kind == K_ALLREDUCE;
        bool ok = true;
        loomResult_t res = soak_call(kind, comm, r, p, t, op, n, inplace, root, fold, &ok, &rep[r]);
        if (res == loomSuccess) {
            atomic_fetch_add(&rep[r].ops, 1);
            if (!ok) {
                atomic_fetch_add(&rep[r].wrong, 1);
                rank_note(&rep[r], "soak: rank %d op %d: wrong result (%s, count %zu, %s)", r, k,
                          kind_name[kind], n, inplace ? "in place" : "out of place");
            }
        } else {
            /* an error is a failure without a fault, and after a late one: the others must
             * wait for a late rank, however long it computes */
            rc = fault == F_NONE || fault == F_LATE || fault == F_LATE_CALL ? 4 : 0;
            if (rc)
                rank_note(&rep[r], "soak: rank %d op %d (%s): %s", r, k, kind_name[kind],
                          loomGetLastError(comm));
            break;
        }
    }
    /* after a kill, stop or abort the communicator may have failed; a late rank's job ends
     * like one without a fault */
    if (rc == 0 && fault != F_NONE && fault != F_LATE && fault != F_LATE_CALL)
        loomCommAbort(comm);
    else
        loomCommDestroy(comm);
    return rc;
}

/* One job in a process of its own; returns hung ranks, and adds to *ops and *wrong. */
typedef struct {
    bool secure, determ;
} job_mode_t;

static char failures[16384]; /* every failed job, reprinted at the end of the run */

static const char *mode_name(job_mode_t m)
{
    return m.secure && m.determ ? "secure, deterministic"
           : m.secure           ? "secure"
           : m.determ           ? "deterministic"
                                : "plain";
}

/* The job's ranks under mpirun, each this program in its mpi-rank mode; returns mpirun's pid.
 * The ranks' pids come back through the report file. */
static pid_t mpi_launch(const char *report, int p, uint64_t seed, int nops, int fault, int victim,
                        int fault_at, bool determ)
{
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return -1;
    self[len] = 0;
    char np[16], a[5][32];
    snprintf(np, sizeof np, "%d", p);
    snprintf(a[0], sizeof a[0], "%llu", (unsigned long long)seed);
    snprintf(a[1], sizeof a[1], "%d", nops);
    snprintf(a[2], sizeof a[2], "%d", fault);
    snprintf(a[3], sizeof a[3], "%d", victim);
    snprintf(a[4], sizeof a[4], "%d", fault_at);
    setenv("LOOM_SOAK_REPORT", report, 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    const char *argv[40];
    int n = 0;
    const char *fixed[] = {
        "mpirun", "--oversubscribe", "--bind-to",          "none", "--mca", "btl_tcp_if_include",
        "lo",     "--mca",           "oob_tcp_if_include", "lo"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[n++] = fixed[i];
    static const char *vars[] = {"LOOM_SOCKET_IFNAME", "LOOM_TRANSPORT", "LOOM_ALGO",
                                 "LOOM_TIMEOUT",       "LOOM_SECURE",    "LOOM_DETERMINISTIC",
                                 "LOOM_SOAK_REPORT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) argv[n++] = "-x", argv[n++] = vars[i];
    /* a rank that dies or leaves without MPI_Finalize makes mpirun kill the others at once,
     * before they could say anything, unless it is told to let them run on */
    if (fault != F_NONE) argv[n++] = "--enable-recovery";
    argv[n++] = "-np", argv[n++] = np, argv[n++] = self, argv[n++] = "mpi-rank";
    for (int i = 0; i < 5; i++)
        argv[n++] = a[i];
    argv[n++] = determ ? "1" : "0";
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        execvp("mpirun", (char **)argv);
        fprintf(stderr, "soak: cannot run mpirun: %s\n", strerror(errno));
        _exit(127);
    }
    return pid;
}

/* soak mpi-rank SEED NOPS FAULT VICTIM FAULT_AT DETERM: one rank of an mpi job, started by
 * mpirun; its rank and the job's size come from Open MPI's variables. */
static int mpi_rank(char **argv)
{
    const char *rs = getenv("OMPI_COMM_WORLD_RANK"), *ns = getenv("OMPI_COMM_WORLD_SIZE");
    const char *report = getenv("LOOM_SOAK_REPORT");
    if (!rs || !ns || !report) {
        fprintf(stderr, "soak mpi-rank: runs under mpirun with LOOM_SOAK_REPORT set\n");
        return 2;
    }
    int r = atoi(rs), p = atoi(ns), fault = atoi(argv[2]);
    int fd = open(report, O_RDWR);
    rank_report_t *rep = fd < 0 ? MAP_FAILED
                                : mmap(NULL, sizeof(rank_report_t) * MAX_RANKS,
                                       PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    if (rep == MAP_FAILED || r < 0 || r >= p || p > MAX_RANKS) {
        fprintf(stderr, "soak mpi-rank: rank %d of %d, report %s: %s\n", r, p, report,
                strerror(errno));
        return 2;
    }
    int rc = rank_main(NULL, r, p, strtoull(argv[0], NULL, 0), atoi(argv[1]), fault, atoi(argv[3]),
                       atoi(argv[4]), atoi(argv[5]) != 0, rep);
    atomic_store(&rep[r].rc, rc);
    atomic_store(&rep[r].done, 1);
    fflush(NULL);
    /* After a fault a departed peer never reaches MPI_Finalize (which loom's exit handler
     * calls, having started MPI), and would keep this rank waiting for it. */
    if (fault != F_NONE) _exit(rc);
    return rc;
}

static int run_job(uint64_t seed, int p, int fault, const char *transport, const char *algo,
                   job_mode_t mode, int *ops, int *wrong, int *failed)
{
    /* the ranks' reports, in a file so that ranks mpirun starts can map it too */
    char report[] = "/tmp/loom-soak-XXXXXX";
    int fd = mkstemp(report);
    if (fd < 0 || ftruncate(fd, sizeof(rank_report_t) * MAX_RANKS) != 0) {
        fprintf(stderr, "soak: cannot create %s: %s\n", report, strerror(errno));
        exit(2);
    }
    rank_report_t *rep =
        mmap(NULL, sizeof(rank_report_t) * MAX_RANKS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (rep == MAP_FAILED) {
        fprintf(stderr, "soak: cannot map %s: %s\n", report, strerror(errno));
        exit(2);
    }
    bool mpi = strcmp(transport, "mpi") == 0;
    pid_t leader = fork();
    if (leader == 0) {
        setpgid(0, 0);
        if (strcmp(transport, "default") != 0) setenv("LOOM_TRANSPORT", transport, 1);
        if (algo) setenv("LOOM_ALGO", algo, 1);
        setenv("LOOM_TIMEOUT", "4", 1);
        setenv("LOOM_SECURE", mode.secure ? "1" : "0", 1);
        setenv("LOOM_DETERMINISTIC", mode.determ ? "1" : "0", 1);
        uint64_t s = seed;
        int nops = 5 + (int)(rng_next(&s) % 40);
        int victim = (int)(rng_next(&s) % (uint64_t)p), fault_at = (int)(rng_next(&s) % nops);
        pid_t pids[MAX_RANKS], run = -1;
        loomUniqueId id;
        if (mpi) {
            run = mpi_launch(report, p, seed * 31 + 7, nops, fault, victim, fault_at, mode.determ);
            if (run < 0) _exit(11);
        } else {
            if (loomGetUniqueId(&id) != loomSuccess) _exit(10);
            for (int r = 0; r < p; r++) {
                pids[r] = fork();
                if (pids[r] == 0)
                    _exit(rank_main(&id, r, p, seed * 31 + 7, nops, fault, victim, fault_at,
                                    mode.determ, rep));
            }
        }
        if (fault == F_KILL || fault == F_STOP) {
            /* Once the victim reaches its fault_at-th call, or a little later (mpirun's start
             * included). */
            for (int i = 0;
                 i < (mpi ? 1000 : 200) && (atomic_load(&rep[victim].progress) < fault_at ||
                                            atomic_load(&rep[victim].pid) == 0);
                 i++)
                usleep(10000);
            pid_t v = mpi ? (pid_t)atomic_load(&rep[victim].pid) : pids[victim];
            if (v > 0) {
                kill(v, fault == F_KILL ? SIGKILL : SIGSTOP);
                if (fault == F_STOP) {
                    sleep(6); /* beyond LOOM_TIMEOUT=4 */
                    kill(v, SIGCONT);
                }
            }
        }
        int bad = 0;
        if (mpi) {
            /* mpirun's status mixes the victim's end in: each rank's own counts */
            waitpid(run, NULL, 0);
            for (int r = 0; r < p; r++) {
                if (r == victim && fault == F_KILL) continue;
                if (!atomic_load(&rep[r].done) || atomic_load(&rep[r].rc) != 0) bad++;
            }
        } else {
            for (int r = 0; r < p; r++) {
                int st;
                waitpid(pids[r], &st, 0);
                if (r == victim && fault == F_KILL) continue;
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
            }
        }
        _exit(bad ? 20 + bad : 0);
    }
    int st = 0, hung = 0;
    for (int i = 0; i < JOB_DEADLINE_S * 10; i++) {
        if (waitpid(leader, &st, WNOHANG) == leader) break;
        usleep(100000);
        if (i == JOB_DEADLINE_S * 10 - 1) {
            hung = p; /* past the deadline: every rank of the job counts as hung */
            kill(-leader, SIGKILL);
            for (int r = 0; r < p; r++) /* mpirun's ranks may be in groups of their own */
                if (atomic_load(&rep[r].pid) > 0) kill((pid_t)atomic_load(&rep[r].pid), SIGKILL);
            waitpid(leader, &st, 0);
        }
    }
    int job_wrong = 0;
    for (int r = 0; r < p; r++) {
        *ops += atomic_load(&rep[r].ops);
        job_wrong += atomic_load(&rep[r].wrong);
    }
    *wrong += job_wrong;
    bool bad_end = !hung && (!WIFEXITED(st) || WEXITSTATUS(st) != 0);
    if (bad_end) (*failed)++;
    if (hung || job_wrong || bad_end) {
        /* The job, what went wrong, each rank's own words, and the command that replays it;
         * printed now and again at the end of the run (where a log's tail keeps it). */
        char line[4096];
        int len = snprintf(
            line, sizeof line,
            "soak: job seed %llu (%d ranks, %s, %s, %s, fault %s): ", (unsigned long long)seed, p,
            transport, algo ? algo : "default", mode_name(mode), fault_name[fault]);
        if (hung)
            len +=
                snprintf(line + len, sizeof line - (size_t)len, "hung past %d s", JOB_DEADLINE_S);
        else if (job_wrong)
            len += snprintf(line + len, sizeof line - (size_t)len, "%d wrong results", job_wrong);
        else
            len += snprintf(line + len, sizeof line - (size_t)len, "ended with status %d",
                            WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        for (int r = 0; r < p && len < (int)sizeof line; r++)
            if (rep[r].note[0])
                len += snprintf(line + len, sizeof line - (size_t)len, "\n    %s", rep[r].note);
        if (len < (int)sizeof line)
            snprintf(line + len, sizeof line - (size_t)len,
                     "\n    replay: soak job %llu %d %d %s %s %d %d COUNT",
                     (unsigned long long)seed, p, fault, transport, algo ? algo : "default",
                     mode.secure, mode.determ);
        fprintf(stderr, "%s\n", line);
        size_t used = strlen(failures);
        if (used + strlen(line) + 2 < sizeof failures)
            snprintf(failures + used, sizeof failures - used, "%s\n", line);
    }
    munmap(rep, sizeof(rank_report_t) * MAX_RANKS);
    unlink(report);
    return hung;
}

/* soak job SEED RANKS FAULT TRANSPORT ALGO SECURE DETERM COUNT: one job's replay, COUNT times. */
static int replay(char **argv)
{
    uint64_t seed = strtoull(argv[0], NULL, 0);
    int p = atoi(argv[1]), fault = atoi(argv[2]), count = atoi(argv[7]);
    const char *algo = strcmp(argv[4], "default") == 0 ? NULL : argv[4];
    job_mode_t mode = {.secure = atoi(argv[5]) != 0, .determ = atoi(argv[6]) != 0};
    if (p < 2 || p > MAX_RANKS || fault < 0 || fault >= F_N || count < 1) {
        fprintf(stderr, "soak job: ranks 2-%d, fault 0-%d, count 1 or more\n", MAX_RANKS, F_N - 1);
        return 2;
    }
    int ops = 0, wrong = 0, hung = 0, failed = 0;
    for (int i = 0; i < count; i++)
        hung += run_job(seed, p, fault, argv[3], algo, mode, &ops, &wrong, &failed);
    printf("soak job: %d runs, %d operations checked, %d wrong results, %d hung ranks, %d runs "
           "with an unexpected error\n%s",
           count, ops, wrong, hung, failed, failures);
    return wrong || hung || failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    if (argc == 10 && strcmp(argv[1], "job") == 0) return replay(argv + 2);
    if (argc == 8 && strcmp(argv[1], "mpi-rank") == 0) return mpi_rank(argv + 2);
    int secs = argc > 1 ? atoi(argv[1]) : 120;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL);
    /* LOOM_SOAK_TRANSPORTS: the transports drawn from, by name (tests/meson.build adds ucx where
     * loom has it); a rerun needs the same list */
    static char tlist[256];
    const char *transports[8];
    int ntp = 0;
    const char *env = getenv("LOOM_SOAK_TRANSPORTS");
    snprintf(tlist, sizeof tlist, "%s", env && *env ? env : "tcp shm default");
    for (char *save = NULL, *w = strtok_r(tlist, " ,", &save); w && ntp < 8;
         w = strtok_r(NULL, " ,", &save))
        transports[ntp++] = w;
    if (ntp == 0) {
        fprintf(stderr, "soak: LOOM_SOAK_TRANSPORTS names no transport\n");
        return 2;
    }
    printf("soak: seed %llu, %d s, transports", (unsigned long long)seed, secs);
    for (int i = 0; i < ntp; i++)
        printf(" %s", transports[i]);
    printf(" (rerun: LOOM_SOAK_TRANSPORTS='%s' soak %d %llu)\n",
           env && *env ? env : "tcp shm default", secs, (unsigned long long)seed);
    fflush(stdout);
    time_t end = time(NULL) + secs;
    int jobs = 0, ops = 0, wrong = 0, hung = 0, faults = 0, failed = 0;
    int per_fault[F_N] = {0}, nsecure = 0, ndeterm = 0, per_tp[8] = {0};
    static const char *algos[] = {NULL, "ring", "rd", "rabenseifner", "tree", "oneshot", "segment"};
    uint64_t s = seed;
    while (time(NULL) < end) {
        uint64_t job_seed = rng_next(&s);
        int p = 2 + (int)(rng_next(&s) % (MAX_RANKS - 1));
        int fault = rng_next(&s) % 3 == 0 ? 1 + (int)(rng_next(&s) % (F_N - 1)) : F_NONE;
        int tpi = (int)(rng_next(&s) % (uint64_t)ntp);
        const char *tp = transports[tpi];
        /* the automatic choice in a third of the jobs, a forced algorithm in the rest */
        uint64_t a = rng_next(&s) % 9;
        const char *algo = a < 3 ? NULL : algos[1 + (a - 3)];
        uint64_t m = rng_next(&s);
        /* sealing covers tcp only: loom refuses LOOM_SECURE=1 with LOOM_TRANSPORT=ucx or mpi */
        job_mode_t mode = {.secure = m % 4 == 0 && strcmp(tp, "ucx") != 0 && strcmp(tp, "mpi") != 0,
                           .determ = (m >> 8) % 4 == 0};
        hung += run_job(job_seed, p, fault, tp, algo, mode, &ops, &wrong, &failed);
        jobs++;
        per_tp[tpi]++;
        nsecure += mode.secure;
        ndeterm += mode.determ;
        if (fault != F_NONE) faults++, per_fault[fault]++;
    }
    printf("soak: %d jobs (%d with LOOM_SECURE=1, %d with LOOM_DETERMINISTIC=1), %d operations "
           "checked, %d faults injected (late %d, late first call %d, kill %d, stop %d, abort %d), "
           "%d wrong results, %d hung ranks, %d jobs with an unexpected error\n",
           jobs, nsecure, ndeterm, ops, faults, per_fault[F_LATE], per_fault[F_LATE_CALL],
           per_fault[F_KILL], per_fault[F_STOP], per_fault[F_ABORT], wrong, hung, failed);
    printf("soak: jobs by transport:");
    for (int i = 0; i < ntp; i++)
        printf(" %s %d", transports[i], per_tp[i]);
    printf("\n");
    if (failures[0]) {
        /* again at the very end, on both streams: a test log's tail is what a reader sees */
        printf("soak: the failed jobs (run seed %llu):\n%s", (unsigned long long)seed, failures);
        fflush(stdout);
        fprintf(stderr, "soak: the failed jobs (run seed %llu):\n%s", (unsigned long long)seed,
                failures);
    }
    return wrong || hung || failed ? 1 : 0;
}
