/*
 * Failure tests: what a job sees when a rank dies, stalls or disagrees, when a caller passes bad
 * arguments, when strangers talk to loom's sockets, at 128 ranks, and when another thread aborts
 * a communicator. Every wait here has a deadline (LOOM_TIMEOUT is short, the harness kills
 * leftovers, threads poll with limits), so a loom that hangs fails a test instead of the suite.
 *
 * Ranks that run as processes report through exit codes (RC_*) and a shared mapping, since
 * Check's assertions only work in the process that runs the test.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "harness.h"
#include "loom.h"
#include "param.h"
#include "sock.h"

#define TIMEOUT_S 3   /* LOOM_TIMEOUT for most tests */
#define TEXT_MAX 2200 /* two loom error texts joined */

/* Exit codes of rank processes. */
enum {
    RC_OK = 0,
    RC_BAD_TEXT = 1,
    RC_NO_ERROR = 2,
    RC_TOO_SLOW = 3,
    RC_WRONG_DATA = 4,
    RC_LOOM_ERROR = 5,
    RC_TOO_MANY_FDS = 6
};

/* ---- helpers ------------------------------------------------------------------------------ */

/* ---- 1, 2: a rank killed or stopped in the middle of a run -------------------------------- */

#define FR_NRANKS 4
#define FR_COUNT (1u << 20)
#define FR_AT 3 /* the victim disappears before this iteration */
#define FR_MAX_ITERS 200

typedef struct {
    atomic_int done[FR_NRANKS]; /* set by a survivor once it has its verdict */
    atomic_int victim_pid;      /* the stopped victim, for the survivor that kills it */
    int res[FR_NRANKS];
    int iter[FR_NRANKS];
    double call_s[FR_NRANKS]; /* how long the failing call took */
    char text[FR_NRANKS][TEXT_MAX];
} fail_report_t;

typedef struct {
    int victim;
    int sig;      /* SIGKILL or SIGSTOP */
    size_t count; /* FR_COUNT, or FR_SMALL: through the node segment (one node, host memory) */
    fail_report_t *rep;
} fail_arg_t;
#define FR_SMALL 16

static int fail_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    fail_arg_t *a = p;
    fail_report_t *rep = a->rep;
    float *send = malloc(a->count * sizeof(float)), *recv = malloc(a->count * sizeof(float));
    if (send == NULL || recv == NULL) return RC_LOOM_ERROR;
    for (size_t i = 0; i < a->count; i++)
        send[i] = (float)(rank + 1);
    int rc = RC_NO_ERROR;
    for (int it = 0; it < FR_MAX_ITERS; it++) {
        if (rank == a->victim && it == FR_AT) {
            if (a->sig == SIGKILL) kill(getpid(), SIGKILL);
            atomic_store(&rep->victim_pid, (int)getpid());
            raise(SIGSTOP);
            _exit(RC_OK); /* continued only to be killed */
        }
        double t0 = h_now_s();
        loomResult_t r = loomAllReduce(send, recv, a->count, loomFloat, loomSum, comm, NULL);
        double dt = h_now_s() - t0;
        if (r == loomSuccess) continue;
        rep->res[rank] = r;
        rep->iter[rank] = it;
        rep->call_s[rank] = dt;
        h_collect_text(comm, rep->text[rank], TEXT_MAX);
        fprintf(stderr, "rank %d: iteration %d failed after %.2f s with %d: %s\n", rank, it, dt,
                (int)r, rep->text[rank]);
        const char *t = rep->text[rank];
        if (!h_names_rank(t, a->victim) || strstr(t, "seq") == NULL)
            rc = RC_BAD_TEXT;
        else if (dt > TIMEOUT_S + 3)
            rc = RC_TOO_SLOW;
        else
            rc = RC_OK;
        break;
    }
    atomic_store(&rep->done[rank], 1);
    /* The stopped victim is killed by the first survivor once every survivor has its verdict,
     * so that h_run_procs does not wait for its own timeout (SIGKILL works on a stopped
     * process). A survivor, not a thread of the test's process: no thread may exist there
     * when it forks the ranks (ThreadSanitizer). */
    if (a->sig == SIGSTOP && rank == (a->victim == 0 ? 1 : 0)) {
        for (double t0 = h_now_s(); h_now_s() - t0 < 30;) {
            bool all = true;
            for (int r = 0; r < FR_NRANKS; r++)
                if (r != a->victim && !atomic_load(&rep->done[r])) all = false;
            if (all) break;
            usleep(20000);
        }
        usleep(200000);
        if (atomic_load(&rep->victim_pid) > 0) kill((pid_t)atomic_load(&rep->victim_pid), SIGKILL);
    }
    free(send);
    free(recv);
    return rc;
}

static void check_survivors(const fail_arg_t *a, const int *status, double wall)
{
    const fail_report_t *rep = a->rep;
    for (int r = 0; r < FR_NRANKS; r++) {
        if (r == a->victim) {
            ck_assert_msg(status[r] == 128 + SIGKILL, "victim rank %d: status %d", r, status[r]);
            continue;
        }
        ck_assert_msg(status[r] != -1, "rank %d hung (killed by the harness)", r);
        ck_assert_msg(status[r] != RC_NO_ERROR, "rank %d: %d allreduces succeeded without rank %d",
                      r, FR_MAX_ITERS, a->victim);
        ck_assert_msg(status[r] == RC_OK,
                      "rank %d: status %d: iteration %d failed after %.2f s with %d: '%s' "
                      "(wanted 'rank %d' and 'seq' within %d s)",
                      r, status[r], rep->iter[r], rep->call_s[r], rep->res[r], rep->text[r],
                      a->victim, TIMEOUT_S + 3);
    }
    ck_assert_msg(wall < 20, "the job took %.1f s", wall);
}

/* Loop 0: 4 MiB allreduces over the links; loop 1: 64-byte ones, which go through the node
 * segment, where no connection closes when a rank dies (its pidfd says so). */
START_TEST(test_killed_rank)
{
    fail_arg_t a = {.victim = 2,
                    .sig = SIGKILL,
                    .count = _i ? FR_SMALL : FR_COUNT,
                    .rep = h_shared_map(sizeof(fail_report_t))};
    int status[FR_NRANKS];
    double t0 = h_now_s();
    h_run_procs(FR_NRANKS, fail_rank, &a, 30, status);
    check_survivors(&a, status, h_now_s() - t0);
}
END_TEST

START_TEST(test_stalled_rank)
{
    fail_arg_t a = {.victim = 1,
                    .sig = SIGSTOP,
                    .count = _i ? FR_SMALL : FR_COUNT,
                    .rep = h_shared_map(sizeof(fail_report_t))};
    int status[FR_NRANKS];
    double t0 = h_now_s();
    h_run_procs(FR_NRANKS, fail_rank, &a, 30, status);
    double wall = h_now_s() - t0;
    check_survivors(&a, status, wall);
}
END_TEST

/* ---- 3: ranks that disagree on the operation ---------------------------------------------- */

#define MM_NRANKS 3
#define MM_COUNT 1000
/* The first three run after a good allreduce (connections up: the test is about detection and
 * forwarding); the last mismatches the communicator's very first operation, while the
 * connections are still being made. */
enum { MM_COUNT_KIND, MM_TYPE_KIND, MM_ROOT_KIND, MM_COLD_TYPE_KIND, MM_NKINDS };
static const char *const mm_names[] = {"count", "type", "root", "first-operation type"};

typedef struct {
    int kind;
    loomResult_t res[MM_NRANKS];
    loomResult_t follow[MM_NRANKS]; /* a later call, on ranks whose call succeeded */
    bool own_data[MM_NRANKS];       /* a broadcast that succeeded left this rank's own data */
    char text[MM_NRANKS][TEXT_MAX];
} mismatch_t;

static int mismatch_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    mismatch_t *m = p;
    float *send = malloc((MM_COUNT + 1) * sizeof(float));
    float *recv = malloc((MM_COUNT + 1) * sizeof(float));
    for (int i = 0; i <= MM_COUNT; i++)
        send[i] = (float)(rank * 1000 + i);
    memset(recv, 0xa5, (MM_COUNT + 1) * sizeof(float));
    loomResult_t r = loomSuccess;
    int root = rank == 1 ? 1 : 0;
    if (m->kind != MM_COLD_TYPE_KIND) {
        r = loomAllReduce(send, recv, 16, loomFloat, loomSum, comm, NULL);
        if (r != loomSuccess) {
            m->res[rank] = loomNumResults; /* reported as a failed warm-up */
            h_collect_text(comm, m->text[rank], TEXT_MAX);
            free(send);
            free(recv);
            return 1;
        }
    }
    switch (m->kind) {
    case MM_COUNT_KIND:
        r = loomAllReduce(send, recv, rank == 1 ? MM_COUNT + 1 : MM_COUNT, loomFloat, loomSum, comm,
                          NULL);
        break;
    case MM_TYPE_KIND:
    case MM_COLD_TYPE_KIND:
        /* Same element size, so only the operation's description can tell them apart. */
        r = loomAllReduce(send, recv, MM_COUNT, rank == 1 ? loomInt32 : loomFloat, loomSum, comm,
                          NULL);
        break;
    default: r = loomBroadcast(send, recv, MM_COUNT, loomFloat, root, comm, NULL); break;
    }
    m->res[rank] = r;
    if (r != loomSuccess) {
        h_collect_text(comm, m->text[rank], TEXT_MAX);
    } else {
        m->own_data[rank] = m->kind == MM_ROOT_KIND && rank == root &&
                            memcmp(send, recv, MM_COUNT * sizeof(float)) == 0;
        /* A rank can only finish its part of a broken operation without noticing if it only
         * sent; its next call must then fail instead of running on a broken communicator. */
        m->follow[rank] = loomAllReduce(send, recv, 1, loomFloat, loomSum, comm, NULL);
        h_collect_text(comm, m->text[rank], TEXT_MAX);
    }
    fprintf(stderr, "%s mismatch, rank %d: %d then %d: %s\n", mm_names[m->kind], rank, (int)r,
            (int)m->follow[rank], m->text[rank]);
    free(send);
    free(recv);
    return 0;
}

START_TEST(test_mismatch)
{
    mismatch_t *m = calloc(1, sizeof(*m));
    m->kind = _i;
    const char *what = mm_names[_i];
    h_run_threads(MM_NRANKS, mismatch_rank, m);
    int detected = 0;
    for (int r = 0; r < MM_NRANKS; r++)
        ck_assert_msg(m->res[r] != loomNumResults, "%s mismatch: rank %d: the warm-up failed: %s",
                      what, r, m->text[r]);
    for (int r = 0; r < MM_NRANKS; r++) {
        if (m->res[r] == loomSuccess) {
            /* Only the root of a broadcast may finish without hearing from anyone: it keeps its
             * own data, which is the right result for a root. */
            ck_assert_msg(m->kind == MM_ROOT_KIND && m->own_data[r],
                          "%s mismatch: rank %d's call succeeded", what, r);
            ck_assert_msg(m->follow[r] != loomSuccess,
                          "%s mismatch: rank %d kept working on a broken communicator", what, r);
            continue;
        }
        if (r == 1) continue; /* the odd rank's text may be any peer's view */
        const char *t = m->text[r];
        if (m->kind == MM_COLD_TYPE_KIND && strstr(t, "mismatch") == NULL) {
            /* On the very first operation a rank may still be connecting when the rank that
             * detected the mismatch has already left: then it can only report that peer. */
            ck_assert_msg(h_names_rank(t, 0) || h_names_rank(t, 1) || h_names_rank(t, 2),
                          "%s mismatch: rank %d's error names no peer: '%s'", what, r, t);
            continue;
        }
        ck_assert_msg(strstr(t, "mismatch") != NULL && h_names_rank(t, 1) &&
                          (h_names_rank(t, 0) || h_names_rank(t, 2)),
                      "%s mismatch: rank %d's error does not say 'mismatch' naming rank 1 and "
                      "another: '%s'",
                      what, r, t);
        detected++;
    }
    ck_assert_msg(detected > 0, "%s mismatch: no rank detected it", what);
    free(m);
}
END_TEST

/* ---- 4: bad arguments on a live communicator ---------------------------------------------- */

#define BA_NRANKS 2
#define BA_COUNT 256

typedef struct {
    int checked[BA_NRANKS];
    char fail[BA_NRANKS][TEXT_MAX];
} badarg_t;

/* One bad call: loomInvalidArgument, a text naming the function, the receive buffer intact. */
static void expect_invalid(badarg_t *b, int rank, loomResult_t r, const char *fn, const char *what,
                           const void *buf, const void *ref, size_t bytes)
{
    b->checked[rank]++;
    if (b->fail[rank][0]) return; /* the first failure is the useful one */
    const char *t = loomGetLastError(NULL);
    if (r != loomInvalidArgument)
        snprintf(b->fail[rank], TEXT_MAX, "%s (%s): returned %d, not loomInvalidArgument: '%s'", fn,
                 what, (int)r, t);
    else if (t[0] == '\0')
        snprintf(b->fail[rank], TEXT_MAX, "%s (%s): no error text", fn, what);
    else if (strstr(t, fn) == NULL)
        snprintf(b->fail[rank], TEXT_MAX, "%s (%s): the text does not name the function: '%s'", fn,
                 what, t);
    else if (memcmp(buf, ref, bytes) != 0)
        snprintf(b->fail[rank], TEXT_MAX, "%s (%s): the receive buffer was changed", fn, what);
}

static void bad_calls(loomComm_t comm, int rank, int nranks, badarg_t *b)
{
    size_t rbytes = (size_t)BA_COUNT * (size_t)nranks * sizeof(float);
    float *send = malloc(rbytes), *recv = malloc(rbytes), *ref = malloc(rbytes);
    for (size_t i = 0; i < (size_t)BA_COUNT * (size_t)nranks; i++)
        send[i] = (float)i;
    memset(recv, 0x5a, rbytes);
    memcpy(ref, recv, rbytes);
    /* Something that is not a communicator, but readable (the check must read it, not crash). */
    _Alignas(64) unsigned char fake[sizeof(struct loomComm)];
    memset(fake, 0, sizeof(fake));
    loomComm_t bogus = (loomComm_t)(void *)fake;
    const size_t n = BA_COUNT, huge = SIZE_MAX / 2;
    const loomDataType_t badtype = (loomDataType_t)99;
    const loomRedOp_t badop = (loomRedOp_t)99;
#define BAD(fn, what, call) expect_invalid(b, rank, (call), fn, what, recv, ref, rbytes)
    BAD("loomAllReduce", "NULL sendbuff",
        loomAllReduce(NULL, recv, n, loomFloat, loomSum, comm, NULL));
    BAD("loomAllReduce", "NULL recvbuff",
        loomAllReduce(send, NULL, n, loomFloat, loomSum, comm, NULL));
    BAD("loomAllReduce", "datatype 99", loomAllReduce(send, recv, n, badtype, loomSum, comm, NULL));
    BAD("loomAllReduce", "datatype -1",
        loomAllReduce(send, recv, n, (loomDataType_t)-1, loomSum, comm, NULL));
    BAD("loomAllReduce", "op 99", loomAllReduce(send, recv, n, loomFloat, badop, comm, NULL));
    BAD("loomAllReduce", "op -1",
        loomAllReduce(send, recv, n, loomFloat, (loomRedOp_t)-1, comm, NULL));
    loomRedOp_t pm;
    float two = 2.0f;
    if (loomRedOpCreatePreMulSum(&pm, &two, loomFloat, loomScalarHostImmediate, comm) !=
            loomSuccess ||
        loomRedOpDestroy(pm, comm) != loomSuccess) {
        snprintf(b->fail[rank], TEXT_MAX, "creating/destroying a pre-multiplied sum failed: %s",
                 loomGetLastError(NULL));
    } else {
        BAD("loomAllReduce", "destroyed op",
            loomAllReduce(send, recv, n, loomFloat, pm, comm, NULL));
        BAD("loomReduceScatter", "destroyed op",
            loomReduceScatter(send, recv, n, loomFloat, pm, comm, NULL));
    }
    BAD("loomAllReduce", "count SIZE_MAX/2",
        loomAllReduce(send, recv, huge, loomFloat, loomSum, comm, NULL));
    BAD("loomBroadcast", "root nranks",
        loomBroadcast(send, recv, n, loomFloat, nranks, comm, NULL));
    BAD("loomBroadcast", "root -1", loomBroadcast(send, recv, n, loomFloat, -1, comm, NULL));
    BAD("loomBroadcast", "count SIZE_MAX/2",
        loomBroadcast(send, recv, huge, loomFloat, 0, comm, NULL));
    BAD("loomReduce", "root nranks",
        loomReduce(send, recv, n, loomFloat, loomSum, nranks, comm, NULL));
    BAD("loomReduce", "root -1", loomReduce(send, recv, n, loomFloat, loomSum, -1, comm, NULL));
    BAD("loomReduce", "NULL sendbuff",
        loomReduce(NULL, recv, n, loomFloat, loomSum, 0, comm, NULL));
    BAD("loomAllGather", "count SIZE_MAX/2",
        loomAllGather(send, recv, huge, loomFloat, comm, NULL));
    BAD("loomAllGather", "NULL recvbuff", loomAllGather(send, NULL, n, loomFloat, comm, NULL));
    BAD("loomReduceScatter", "op 99",
        loomReduceScatter(send, recv, n, loomFloat, badop, comm, NULL));
    BAD("loomAlltoAll", "datatype 99", loomAlltoAll(send, recv, n, badtype, comm, NULL));
    BAD("loomSend", "peer nranks", loomSend(send, n, loomFloat, nranks, comm, NULL));
    BAD("loomSend", "peer -1", loomSend(send, n, loomFloat, -1, comm, NULL));
    BAD("loomSend", "NULL sendbuff", loomSend(NULL, n, loomFloat, 1 - rank, comm, NULL));
    BAD("loomRecv", "peer nranks", loomRecv(recv, n, loomFloat, nranks, comm, NULL));
    BAD("loomRecv", "peer -1", loomRecv(recv, n, loomFloat, -1, comm, NULL));
    BAD("loomRecv", "datatype 99", loomRecv(recv, n, badtype, 1 - rank, comm, NULL));
    BAD("loomAllReduce", "bogus comm",
        loomAllReduce(send, recv, n, loomFloat, loomSum, bogus, NULL));
    BAD("loomBroadcast", "bogus comm", loomBroadcast(send, recv, n, loomFloat, 0, bogus, NULL));
    BAD("loomRecv", "bogus comm", loomRecv(recv, n, loomFloat, 0, bogus, NULL));
    BAD("loomAllReduce", "NULL comm", loomAllReduce(send, recv, n, loomFloat, loomSum, NULL, NULL));
    BAD("loomAllGather", "NULL comm", loomAllGather(send, recv, n, loomFloat, NULL, NULL));
    BAD("loomSend", "NULL comm", loomSend(send, n, loomFloat, 0, NULL, NULL));
#undef BAD
    free(send);
    free(recv);
    free(ref);
}

static int badarg_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    badarg_t *b = p;
    /* Rank 0 makes the bad calls twice: if any of them consumed a sequence number, the ranks'
     * counts would differ and the good call below would fail as a mismatch. */
    for (int k = 0; k < (rank == 0 ? 2 : 1); k++)
        bad_calls(comm, rank, nranks, b);
    loomResult_t async = loomNumResults;
    loomCommGetAsyncError(comm, &async);
    if (async != loomSuccess && !b->fail[rank][0])
        snprintf(b->fail[rank], TEXT_MAX, "bad calls broke the communicator: %d: %s", (int)async,
                 loomGetLastError(comm));
    const size_t n = 4099;
    int32_t *send = malloc(n * sizeof(int32_t)), *recv = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        send[i] = (int32_t)(rank * 100003 + (int)i);
    memset(recv, 0xee, n * sizeof(int32_t));
    loomResult_t r = loomAllReduce(send, recv, n, loomInt32, loomSum, comm, NULL);
    if (r != loomSuccess) {
        if (!b->fail[rank][0])
            snprintf(b->fail[rank], TEXT_MAX, "the good allreduce failed: %d: %s", (int)r,
                     loomGetLastError(comm));
    } else {
        for (size_t i = 0; i < n; i++) {
            int32_t want = 0;
            for (int q = 0; q < nranks; q++)
                want += (int32_t)(q * 100003 + (int)i);
            if (recv[i] != want) {
                if (!b->fail[rank][0])
                    snprintf(b->fail[rank], TEXT_MAX, "good allreduce: [%zu] = %d, want %d", i,
                             recv[i], want);
                break;
            }
        }
    }
    free(send);
    free(recv);
    return b->fail[rank][0] ? 1 : 0;
}

START_TEST(test_bad_arguments)
{
    badarg_t *b = calloc(1, sizeof(*b));
    int bad = h_run_threads(BA_NRANKS, badarg_rank, b);
    for (int r = 0; r < BA_NRANKS; r++)
        ck_assert_msg(b->fail[r][0] == '\0', "rank %d: %s", r, b->fail[r]);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_ge(b->checked[1], 30);
    free(b);
}
END_TEST

/* ---- 5: strangers on the listeners -------------------------------------------------------- */

#define AT_NRANKS 3
#define AT_COUNT 65536
#define AT_MIN_ITERS 200
#define AT_CLOSE_S 5.0 /* how long loom may take to drop a stranger (handshake timeout is 1 s) */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int naddrs; /* 0 until rank 0 has published the listeners */
    sock_addr_t addr[AT_NRANKS];
    uint64_t comm_id;
    atomic_int attacker_done;
    int attacks; /* attacks that ended as they should */
    char fail[TEXT_MAX];
    char job_fail[AT_NRANKS][TEXT_MAX];
    int iters[AT_NRANKS];
} attack_t;

static void attack_note(attack_t *A, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void attack_note(attack_t *A, const char *fmt, ...)
{
    pthread_mutex_lock(&A->mu);
    if (A->fail[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(A->fail, sizeof(A->fail), fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&A->mu);
}

static int connect_to(const sock_addr_t *a)
{
    int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)&a->sa, a->len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads and drops whatever arrives until the peer closes (recv returns 0 or an error). Returns
 * the seconds that took, or -1 if the socket was still open after limit_s. */
static double wait_closed(int fd, double limit_s)
{
    double t0 = h_now_s();
    char buf[4096];
    for (;;) {
        double left = limit_s - (h_now_s() - t0);
        if (left <= 0) return -1;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int n = poll(&pf, 1, (int)(left * 1000) + 1);
        if (n < 0 && errno != EINTR) return h_now_s() - t0;
        if (n <= 0) continue;
        ssize_t got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (got == 0) return h_now_s() - t0;
        if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return h_now_s() - t0;
    }
}

/* (a) The real handshake with a made-up secret: loom must refuse it and close. */
static void attack_wrong_secret(attack_t *A, const char *who, const sock_addr_t *addr,
                                const hs_hello_t *hello)
{
    char as[SOCK_ADDR_STRLEN];
    sock_addr_str(addr, as, sizeof(as));
    int fd;
    if (sock_connect_start(addr, &fd) != loomSuccess) {
        attack_note(A, "%s %s: connect failed: %s", who, as, loomGetLastError(NULL));
        return;
    }
    uint8_t secret[16];
    if (getrandom(secret, sizeof(secret), 0) != (ssize_t)sizeof(secret)) memset(secret, 7, 16);
    hs_t h;
    hs_connect_init(&h, fd, addr, secret, hello);
    loomResult_t r = hs_run_blocking(&h);
    if (r == loomSuccess) {
        attack_note(A, "%s %s: a handshake with a wrong secret succeeded", who, as);
    } else if (strstr(h.err, "failed to prove") != NULL) {
        /* The listener answered with a WELCOME: it accepted an unproven HELLO. */
        attack_note(A, "%s %s: loom welcomed a wrong secret (%s)", who, as, h.err);
    } else if (wait_closed(fd, AT_CLOSE_S) < 0) {
        attack_note(A, "%s %s: connection with a wrong secret still open after %.0f s", who, as,
                    AT_CLOSE_S);
    } else {
        pthread_mutex_lock(&A->mu);
        A->attacks++;
        pthread_mutex_unlock(&A->mu);
    }
    close(fd);
}

/* (b) 4 KiB of random bytes instead of a HELLO. */
static void attack_garbage(attack_t *A, const char *who, const sock_addr_t *addr)
{
    char as[SOCK_ADDR_STRLEN];
    sock_addr_str(addr, as, sizeof(as));
    int fd = connect_to(addr);
    if (fd < 0) {
        attack_note(A, "%s %s: connect failed: %s", who, as, strerror(errno));
        return;
    }
    uint8_t junk[4096];
    if (getrandom(junk, sizeof(junk), 0) != (ssize_t)sizeof(junk)) memset(junk, 0x3c, 4096);
    ssize_t n = send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
    (void)n; /* loom may close before it all arrives: that is fine */
    if (wait_closed(fd, AT_CLOSE_S) < 0) {
        attack_note(A, "%s %s: garbage connection still open after %.0f s", who, as, AT_CLOSE_S);
    } else {
        pthread_mutex_lock(&A->mu);
        A->attacks++;
        pthread_mutex_unlock(&A->mu);
    }
    close(fd);
}

/* All three attacks on n listeners. The silent connections (c) are opened first, so that their
 * handshake timeout runs while the other attacks go on. */
static void attack_targets(attack_t *A, const char *who, const sock_addr_t *addr,
                           const hs_hello_t *hello, int n)
{
    int silent[AT_NRANKS];
    for (int i = 0; i < n; i++)
        silent[i] = connect_to(&addr[i]);
    for (int i = 0; i < n; i++) {
        attack_wrong_secret(A, who, &addr[i], &hello[i]);
        attack_garbage(A, who, &addr[i]);
    }
    for (int i = 0; i < n; i++) {
        char as[SOCK_ADDR_STRLEN];
        sock_addr_str(&addr[i], as, sizeof(as));
        if (silent[i] < 0) {
            attack_note(A, "%s %s: connect failed: %s", who, as, strerror(errno));
            continue;
        }
        double t = wait_closed(silent[i], AT_CLOSE_S);
        if (t < 0) {
            attack_note(A,
                        "%s %s: a silent connection was not dropped within %.0f s "
                        "(LOOM_HANDSHAKE_TIMEOUT=1)",
                        who, as, AT_CLOSE_S);
        } else {
            pthread_mutex_lock(&A->mu);
            A->attacks++;
            pthread_mutex_unlock(&A->mu);
        }
        close(silent[i]);
    }
}

static void *attacker_main(void *p)
{
    attack_t *A = p;
    /* Wait (bounded) for rank 0 to publish the listeners' addresses. */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 20;
    pthread_mutex_lock(&A->mu);
    while (A->naddrs == 0)
        if (pthread_cond_timedwait(&A->cv, &A->mu, &dl) == ETIMEDOUT) break;
    int n = A->naddrs;
    pthread_mutex_unlock(&A->mu);
    if (n == 0) {
        attack_note(A, "rank 0 never published the listeners");
    } else {
        hs_hello_t hello[AT_NRANKS];
        for (int r = 0; r < n; r++)
            hello[r] = (hs_hello_t){.comm_id = A->comm_id,
                                    .from_rank = r == 0 ? 1 : 0,
                                    .to_rank = r,
                                    .chan = 0,
                                    .nchan = 2};
        attack_targets(A, "data listener", A->addr, hello, n);
    }
    atomic_store(&A->attacker_done, 1);
    return NULL;
}

/* Allreduces of AT_COUNT ints, checked bit for bit, at least min_iters of them and, with `until`,
 * until *until is set on every rank (agreed through a max-allreduce, so all stop together). */
static int checked_loop(loomComm_t comm, int rank, int nranks, int min_iters, atomic_int *until,
                        char *fail, int *iters)
{
    int32_t *send = malloc(AT_COUNT * sizeof(int32_t)), *recv = malloc(AT_COUNT * sizeof(int32_t));
    int rc = 0;
    double give_up = h_now_s() + 30;
    for (int it = 0;; it++) {
        for (uint32_t i = 0; i < AT_COUNT; i++)
            send[i] = (int32_t)((uint32_t)(rank + 1) * ((i ^ (uint32_t)it * 2654435761u) & 0xffff));
        memset(recv, 0xa5, AT_COUNT * sizeof(int32_t));
        loomResult_t r = loomAllReduce(send, recv, AT_COUNT, loomInt32, loomSum, comm, NULL);
        if (r != loomSuccess) {
            char t[TEXT_MAX];
            h_collect_text(comm, t, sizeof(t));
            snprintf(fail, TEXT_MAX, "iteration %d: allreduce failed with %d: %.2100s", it, (int)r,
                     t);
            rc = 1;
            break;
        }
        int32_t tri = nranks * (nranks + 1) / 2;
        for (uint32_t i = 0; i < AT_COUNT; i++) {
            int32_t want = tri * (int32_t)((i ^ (uint32_t)it * 2654435761u) & 0xffff);
            if (recv[i] != want) {
                snprintf(fail, TEXT_MAX, "iteration %d: [%u] = %d, want %d", it, i, recv[i], want);
                rc = 1;
                break;
            }
        }
        if (rc) break;
        *iters = it + 1;
        int32_t more = it + 1 < min_iters || (until && !atomic_load(until));
        if (h_now_s() > give_up) more = 0;
        int32_t any = 0;
        r = loomAllReduce(&more, &any, 1, loomInt32, loomMax, comm, NULL);
        if (r != loomSuccess) {
            snprintf(fail, TEXT_MAX, "iteration %d: flag allreduce failed: %s", it,
                     loomGetLastError(comm));
            rc = 1;
            break;
        }
        if (!any) break;
    }
    free(send);
    free(recv);
    return rc;
}

static int attack_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    attack_t *A = p;
    if (rank == 0) {
        pthread_mutex_lock(&A->mu);
        for (int r = 0; r < nranks; r++)
            sock_addr_unpack(comm->lay.peers[r].handle[TP_TCP], &A->addr[r]);
        A->comm_id = comm->lay.comm_id;
        A->naddrs = nranks;
        pthread_cond_broadcast(&A->cv);
        pthread_mutex_unlock(&A->mu);
    }
    return checked_loop(comm, rank, nranks, AT_MIN_ITERS, &A->attacker_done, A->job_fail[rank],
                        &A->iters[rank]);
}

/* A rank of a job made by hand (the bootstrap attack and the abort test need control over when
 * each rank joins and what happens to its communicator). */
typedef struct {
    loomUniqueId id;
    int rank, nranks;
    atomic_int *gate; /* join once this is set (NULL: at once) */
    h_rank_fn fn;     /* NULL: keep the communicator in `comm` */
    void *arg;
    loomComm_t comm;
    loomResult_t init_res;
    int rc;
    char err[TEXT_MAX];
} mjob_t;

static void *mjob_main(void *p)
{
    mjob_t *j = p;
    double give_up = h_now_s() + 20;
    while (j->gate && !atomic_load(j->gate) && h_now_s() < give_up)
        usleep(1000);
    j->init_res = loomCommInitRank(&j->comm, j->nranks, j->id, j->rank);
    if (j->init_res != loomSuccess) {
        snprintf(j->err, sizeof(j->err), "init failed with %d: %s", (int)j->init_res,
                 loomGetLastError(NULL));
        j->comm = NULL;
        j->rc = 1;
        return NULL;
    }
    if (j->fn) {
        j->rc = j->fn(j->comm, j->rank, j->nranks, j->arg);
        loomCommDestroy(j->comm);
        j->comm = NULL;
    }
    return NULL;
}

static int boot_job_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    attack_t *A = p;
    return checked_loop(comm, rank, nranks, 5, NULL, A->job_fail[rank], &A->iters[rank]);
}

/* A job of AT_NRANKS rank threads whose last rank waits at `gate` before it joins: the first
 * ones wait at the bootstrap root meanwhile. *u and *root: the id's fields and root address. */
typedef struct {
    loomUniqueId id;
    uid_layout_t u;
    sock_addr_t root;
    atomic_int gate;
    mjob_t j[AT_NRANKS];
    pthread_t t[AT_NRANKS];
} gated_job_t;

static void gated_start(gated_job_t *g, int (*fn)(loomComm_t, int, int, void *), void *arg)
{
    ck_assert_int_eq(loomGetUniqueId(&g->id), loomSuccess);
    memcpy(&g->u, &g->id, sizeof(g->u));
    ck_assert(sock_addr_unpack(g->u.root_addr, &g->root));
    atomic_init(&g->gate, 0);
    for (int r = 0; r < AT_NRANKS; r++) {
        g->j[r] = (mjob_t){.id = g->id,
                           .rank = r,
                           .nranks = AT_NRANKS,
                           .fn = fn,
                           .arg = arg,
                           .gate = r == AT_NRANKS - 1 ? &g->gate : NULL};
        ck_assert_int_eq(pthread_create(&g->t[r], NULL, mjob_main, &g->j[r]), 0);
    }
    usleep(100000);
}

/* Lets the last rank join and waits for every rank. */
static void gated_finish(gated_job_t *g)
{
    atomic_store(&g->gate, 1);
    for (int r = 0; r < AT_NRANKS; r++)
        pthread_join(g->t[r], NULL);
}

START_TEST(test_strangers)
{
    /* The bootstrap attack keeps the first ranks waiting at the root: leave them room. */
    setenv("LOOM_TIMEOUT", "8", 1);
    param_reset_cache();
    attack_t *A = calloc(1, sizeof(*A));
    pthread_mutex_init(&A->mu, NULL);
    pthread_cond_init(&A->cv, NULL);

    /* Data listeners, attacked while the job runs. */
    pthread_t at;
    ck_assert_int_eq(pthread_create(&at, NULL, attacker_main, A), 0);
    int bad = h_run_threads(AT_NRANKS, attack_rank, A);
    pthread_join(at, NULL);
    for (int r = 0; r < AT_NRANKS; r++)
        ck_assert_msg(A->job_fail[r][0] == '\0', "data job, rank %d: %s", r, A->job_fail[r]);
    ck_assert_int_eq(bad, 0);
    ck_assert_msg(A->fail[0] == '\0', "%s", A->fail);
    ck_assert_int_eq(A->attacks, 3 * AT_NRANKS);
    ck_assert_int_ge(A->iters[0], AT_MIN_ITERS);

    /* The bootstrap root, attacked while two of three ranks wait there for the third. */
    memset(A->job_fail, 0, sizeof(A->job_fail));
    A->attacks = 0;
    static gated_job_t g;
    gated_start(&g, boot_job_rank, A);
    /* Claims to be the rank that has not joined yet. */
    hs_hello_t hello = {.comm_id = g.u.job_id,
                        .from_rank = AT_NRANKS - 1,
                        .to_rank = -1,
                        .chan = 0,
                        .nchan = AT_NRANKS};
    attack_targets(A, "bootstrap root", &g.root, &hello, 1);
    gated_finish(&g);
    for (int r = 0; r < AT_NRANKS; r++) {
        ck_assert_msg(g.j[r].init_res == loomSuccess, "bootstrap job, rank %d: %s", r, g.j[r].err);
        ck_assert_msg(A->job_fail[r][0] == '\0', "bootstrap job, rank %d: %s", r, A->job_fail[r]);
    }
    ck_assert_msg(A->fail[0] == '\0', "%s", A->fail);
    ck_assert_int_eq(A->attacks, 3);
    free(A);
}
END_TEST

/* The bootstrap root during the rendezvous, flooded: 300 connections that never say a word
 * while two of three ranks wait there for the third (LOOM_HANDSHAKE_TIMEOUT=1, so they time
 * out while the job waits). The root keeps at most HS_PENDING_MAX of them (the oldest dropped
 * first) and says so in a few lines with a count, where it used to keep every one and write a
 * line per refusal; the job still starts. */
START_TEST(test_root_flood)
{
    char logp[64];
    snprintf(logp, sizeof(logp), "/tmp/loom-rootflood-%d.log", (int)getpid());
    unlink(logp);
    setenv("LOOM_DEBUG_FILE", logp, 1);
    setenv("LOOM_DEBUG", "WARN", 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    setenv("LOOM_HANDSHAKE_TIMEOUT", "1", 1);
    param_reset_cache();
    log_reset();
    static gated_job_t g;
    gated_start(&g, NULL, NULL);
    enum { NFLOOD = 300 };
    int fds[NFLOOD], opened = 0;
    for (int i = 0; i < NFLOOD; i++) {
        fds[i] = socket(g.root.sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fds[i] < 0) break;
        (void)connect(fds[i], (struct sockaddr *)&g.root.sa, g.root.len);
        opened++;
    }
    ck_assert_int_ge(opened, 200);
    usleep(2500000); /* past the handshake timeout of the first ones */
    gated_finish(&g);
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    for (int r = 0; r < AT_NRANKS; r++) {
        ck_assert_msg(g.j[r].init_res == loomSuccess, "rank %d: %s", r, g.j[r].err);
        loomCommDestroy(g.j[r].comm);
    }
    FILE *f = fopen(logp, "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    int lines = 0;
    bool counted = false;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, "bootstrap root")) {
            lines++;
            counted |= strstr(line, "connections from") != NULL;
        }
    fclose(f);
    unlink(logp);
    ck_assert_msg(lines <= 4, "%d lines about the flood (one per refusal?)", lines);
    ck_assert_msg(lines == 0 || counted, "no line with the count of refusals");
    unsetenv("LOOM_DEBUG_FILE");
    unsetenv("LOOM_HANDSHAKE_TIMEOUT");
    param_reset_cache();
    log_reset();
}
END_TEST

/* ---- 6: 128 ranks --------------------------------------------------------------------------- */

#define BIG_NRANKS 128
#define BIG_MAX_FDS 32

typedef struct {
    int nfds[BIG_NRANKS];     /* this rank's own descriptors */
    int nfds_all[BIG_NRANKS]; /* inherited ones included */
    char fail[BIG_NRANKS][256];
} big_report_t;

/* Open descriptors of this process; with `skip`, not counting sockets bound to that address.
 * The ranks are forked from the process that runs the bootstrap root, so each inherits the
 * root's listener and the sockets it had accepted from earlier ranks: those are not this rank's. */
static int count_fds(const sock_addr_t *skip)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd == dirfd(d)) continue;
        if (skip) {
            sock_addr_t a = {.len = sizeof(a.sa)};
            if (getsockname(fd, (struct sockaddr *)&a.sa, &a.len) == 0 && a.len == skip->len &&
                memcmp(&a.sa, &skip->sa, a.len) == 0)
                continue;
        }
        n++;
    }
    closedir(d);
    return n;
}

static int big_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    big_report_t *rep = p;
    static const size_t counts[] = {1, 127, 128, 129};
    const size_t maxc = 129;
    int32_t *send = malloc(maxc * sizeof(int32_t));
    int32_t *recv = malloc(maxc * (size_t)nranks * sizeof(int32_t));
    char *fail = rep->fail[rank];
    int rc = RC_OK;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]) && rc == RC_OK; k++) {
        size_t c = counts[k];
        loomResult_t r;
        for (size_t i = 0; i < c; i++)
            send[i] = rank * 1000 + (int32_t)(i * 3 + k);
        memset(recv, 0xa5, maxc * sizeof(int32_t));
        r = loomAllReduce(send, recv, c, loomInt32, loomSum, comm, NULL);
        if (r != loomSuccess) {
            snprintf(fail, 256, "allreduce %zu: %.200s", c, loomGetLastError(comm));
            rc = RC_LOOM_ERROR;
            break;
        }
        for (size_t i = 0; i < c; i++) {
            int32_t want = 1000 * (nranks * (nranks - 1) / 2) + nranks * (int32_t)(i * 3 + k);
            if (recv[i] != want) {
                snprintf(fail, 256, "allreduce %zu: [%zu] = %d, want %d", c, i, recv[i], want);
                rc = RC_WRONG_DATA;
                break;
            }
        }
        if (rc) break;
        /* A different root per count, so that the chain starts in different places. */
        int root = (int)((c * 37) % (size_t)nranks);
        for (size_t i = 0; i < c; i++)
            send[i] = rank * 1000 + (int32_t)i;
        memset(recv, 0xa5, maxc * sizeof(int32_t));
        r = loomBroadcast(send, recv, c, loomInt32, root, comm, NULL);
        if (r != loomSuccess) {
            snprintf(fail, 256, "broadcast %zu: %.200s", c, loomGetLastError(comm));
            rc = RC_LOOM_ERROR;
            break;
        }
        for (size_t i = 0; i < c; i++)
            if (recv[i] != root * 1000 + (int32_t)i) {
                snprintf(fail, 256, "broadcast %zu from %d: [%zu] = %d", c, root, i, recv[i]);
                rc = RC_WRONG_DATA;
                break;
            }
        if (rc) break;
        memset(recv, 0xa5, c * (size_t)nranks * sizeof(int32_t));
        r = loomAllGather(send, recv, c, loomInt32, comm, NULL);
        if (r != loomSuccess) {
            snprintf(fail, 256, "allgather %zu: %.200s", c, loomGetLastError(comm));
            rc = RC_LOOM_ERROR;
            break;
        }
        for (size_t q = 0; q < (size_t)nranks && rc == RC_OK; q++)
            for (size_t i = 0; i < c; i++)
                if (recv[q * c + i] != (int32_t)q * 1000 + (int32_t)i) {
                    snprintf(fail, 256, "allgather %zu: [%zu][%zu] = %d", c, q, i, recv[q * c + i]);
                    rc = RC_WRONG_DATA;
                    break;
                }
    }
    uid_layout_t u;
    sock_addr_t root_addr;
    memcpy(&u, h_job_id(), sizeof(u));
    bool have_root = sock_addr_unpack(u.root_addr, &root_addr);
    rep->nfds[rank] = count_fds(have_root ? &root_addr : NULL);
    rep->nfds_all[rank] = count_fds(NULL);
    if (rc == RC_OK && rep->nfds[rank] > BIG_MAX_FDS) {
        snprintf(fail, 256, "%d open descriptors", rep->nfds[rank]);
        rc = RC_TOO_MANY_FDS;
    }
    free(send);
    free(recv);
    return rc;
}

START_TEST(test_128_ranks)
{
    /* 128 processes on a few cores: give rendezvous and scheduling delays room. */
    setenv("LOOM_TIMEOUT", "10", 1);
    param_reset_cache();
    big_report_t *rep = h_shared_map(sizeof(*rep));
    int *status = calloc(BIG_NRANKS, sizeof(int));
    int before = count_fds(NULL);
    double t0 = h_now_s();
    int bad = h_run_procs(BIG_NRANKS, big_rank, rep, 55, status);
    double wall = h_now_s() - t0;
    int maxfd = 0, maxall = 0;
    for (int r = 0; r < BIG_NRANKS; r++) {
        maxfd = rep->nfds[r] > maxfd ? rep->nfds[r] : maxfd;
        maxall = rep->nfds_all[r] > maxall ? rep->nfds_all[r] : maxall;
    }
    fprintf(stderr,
            "128 ranks: %.1f s; at most %d descriptors per rank besides the bootstrap root's "
            "(%d with them; %d open in the test process before)\n",
            wall, maxfd, maxall, before);
    for (int r = 0; r < BIG_NRANKS; r++)
        ck_assert_msg(status[r] == 0, "rank %d: status %d: %s", r, status[r], rep->fail[r]);
    ck_assert_int_eq(bad, 0);
    ck_assert_msg(wall < 45, "128 ranks took %.1f s", wall);
    free(status);
}
END_TEST

/* ---- 7: loomCommAbort from another thread ------------------------------------------------- */

typedef struct {
    loomComm_t comm;
    atomic_int started;
    double t_start, t_end;
    loomResult_t res;
    char text[TEXT_MAX];
} blocked_t;

static void *blocked_main(void *p)
{
    blocked_t *b = p;
    int32_t send[1024], recv[1024];
    for (int i = 0; i < 1024; i++)
        send[i] = i;
    b->t_start = h_now_s();
    atomic_store(&b->started, 1);
    b->res = loomAllReduce(send, recv, 1024, loomInt32, loomSum, b->comm, NULL);
    b->t_end = h_now_s();
    /* Not loomGetLastError(comm): the communicator was freed by the abort. */
    snprintf(b->text, sizeof(b->text), "%s", loomGetLastError(NULL));
    return NULL;
}

START_TEST(test_abort_other_thread)
{
    loomUniqueId id;
    ck_assert_int_eq(loomGetUniqueId(&id), loomSuccess);
    mjob_t j[2];
    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        j[r] = (mjob_t){.id = id, .rank = r, .nranks = 2};
        ck_assert_int_eq(pthread_create(&t[r], NULL, mjob_main, &j[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(j[r].init_res == loomSuccess, "rank %d: %s", r, j[r].err);

    blocked_t b = {.comm = j[0].comm};
    pthread_t bt;
    ck_assert_int_eq(pthread_create(&bt, NULL, blocked_main, &b), 0);
    while (!atomic_load(&b.started))
        usleep(1000);
    usleep(200000);
    double t_abort = h_now_s();
    loomResult_t ra = loomCommAbort(j[0].comm);
    double t_abort_done = h_now_s();
    pthread_join(bt, NULL);
    ck_assert_msg(ra == loomSuccess, "loomCommAbort returned %d: %s", (int)ra,
                  loomGetLastError(NULL));
    ck_assert_msg(b.res != loomSuccess, "the blocked allreduce succeeded without its peer");
    ck_assert_msg(b.t_end - t_abort < 1.0,
                  "the blocked allreduce returned %.2f s after the abort (LOOM_TIMEOUT=%d): %s",
                  b.t_end - t_abort, TIMEOUT_S, b.text);
    ck_assert_msg(t_abort_done - t_abort < 1.5, "loomCommAbort took %.2f s",
                  t_abort_done - t_abort);
    ck_assert_msg(b.text[0] != '\0', "no error text after the abort");
    fprintf(stderr, "abort: call returned %d after %.3f s: %s\n", (int)b.res, b.t_end - b.t_start,
            b.text);
    ck_assert_int_eq(loomCommDestroy(j[1].comm), loomSuccess);
}
END_TEST

/* ---- 9: liveness: late ranks, busy ranks, LOOM_OP_TIMEOUT, two communicators ------------- */

/* A rank that is alive is never an error, however long it computes between calls or before its
 * first one: its progress thread heartbeats and answers its peers' connections. LOOM_TIMEOUT
 * names only ranks that show no sign of life; LOOM_OP_TIMEOUT, when set, bounds the wait. */

#define LV_NRANKS 3
#define LV_COUNT 65536
/* "segment": no transport forced, LOOM_ALGO=segment, and allreduces that fit the segment */
static const char *const lv_transports[] = {"tcp", "shm", "segment"};
static size_t lv_count = LV_COUNT;
/* LOOM_TRANSPORT as the suite was started with it (fail-ucx: ucx): the live cases then run over
 * that transport, once, instead of their three */
static char lv_forced[32];
#define LV_NAME(i) (lv_forced[0] ? lv_forced : lv_transports[i])
#define LV_ONCE()                                                                                  \
    do {                                                                                           \
        if (lv_forced[0] && _i > 0) return;                                                        \
    } while (0)

typedef struct {
    int sleeper;            /* the rank that computes */
    int sleep_before;       /* ... before this iteration (0: before its first collective) */
    double sleep_s;         /* for this long */
    int iters;              /* allreduces each rank runs */
    int res[LV_NRANKS];     /* the first failing call's result, loomSuccess if none */
    int iter[LV_NRANKS];    /* its iteration */
    double secs[LV_NRANKS]; /* how long it took */
    char text[LV_NRANKS][TEXT_MAX];
} live_t;

/* One allreduce of LV_COUNT int32 with exact sums (iteration `it` salts the input); returns 0,
 * or 1 with *res and text set (also for a wrong value). */
static int live_allreduce(loomComm_t comm, int rank, int nranks, int it, int32_t *send,
                          int32_t *recv, size_t count, loomResult_t *res, char *text)
{
    uint32_t salt = (uint32_t)it * 2654435761u;
    for (size_t i = 0; i < count; i++)
        send[i] = (int32_t)((uint32_t)(rank + 1) * ((i ^ salt) & 0xffff));
    memset(recv, 0xa5, count * sizeof(int32_t));
    *res = loomAllReduce(send, recv, count, loomInt32, loomSum, comm, NULL);
    if (*res != loomSuccess) {
        h_collect_text(comm, text, TEXT_MAX);
        return 1;
    }
    int32_t tri = nranks * (nranks + 1) / 2;
    for (size_t i = 0; i < count; i++)
        if (recv[i] != tri * (int32_t)((i ^ salt) & 0xffff)) {
            snprintf(text, TEXT_MAX, "iteration %d: [%zu] = %d, want %d", it, i, recv[i],
                     tri * (int32_t)((i ^ salt) & 0xffff));
            *res = loomNumResults;
            return 1;
        }
    return 0;
}

static int live_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    live_t *L = p;
    int32_t *send = malloc(lv_count * sizeof(int32_t)), *recv = malloc(lv_count * sizeof(int32_t));
    if (send == NULL || recv == NULL) return RC_LOOM_ERROR;
    L->res[rank] = loomSuccess;
    for (int it = 0; it < L->iters; it++) {
        if (rank == L->sleeper && it == L->sleep_before) usleep((useconds_t)(L->sleep_s * 1e6));
        double t0 = h_now_s();
        loomResult_t r;
        int bad = live_allreduce(comm, rank, nranks, it, send, recv, lv_count, &r, L->text[rank]);
        if (bad) {
            L->res[rank] = r;
            L->iter[rank] = it;
            L->secs[rank] = h_now_s() - t0;
            fprintf(stderr, "rank %d: iteration %d failed after %.2f s with %d: %s\n", rank, it,
                    L->secs[rank], (int)r, L->text[rank]);
            break;
        }
    }
    free(send);
    free(recv);
    return 0;
}

static live_t *live_setup(int transport, const char *timeout, const char *op_timeout)
{
    bool seg = strcmp(LV_NAME(transport), "segment") == 0;
    if (seg) {
        unsetenv("LOOM_TRANSPORT");
        setenv("LOOM_ALGO", "segment", 1);
        lv_count = 4096;
    } else {
        setenv("LOOM_TRANSPORT", LV_NAME(transport), 1);
        unsetenv("LOOM_ALGO");
        lv_count = LV_COUNT;
    }
    setenv("LOOM_TIMEOUT", timeout, 1);
    if (op_timeout)
        setenv("LOOM_OP_TIMEOUT", op_timeout, 1);
    else
        unsetenv("LOOM_OP_TIMEOUT");
    param_reset_cache();
    return h_shared_map(sizeof(live_t));
}

static void live_expect_success(const live_t *L, const int *status, const char *what)
{
    for (int r = 0; r < LV_NRANKS; r++) {
        ck_assert_msg(status[r] == 0, "%s: rank %d: status %d", what, r, status[r]);
        ck_assert_msg(L->res[r] == loomSuccess, "%s: rank %d: iteration %d failed with %d: %s",
                      what, r, L->iter[r], L->res[r], L->text[r]);
    }
}

START_TEST(test_late_rank)
{
    LV_ONCE();
    /* Rank 1 reaches its first collective 7 s after the others, with LOOM_HANDSHAKE_TIMEOUT=1:
     * rank 0 connects to it (and used to give up after the handshake timeout: nobody accepted),
     * rank 2 waits for its connection. A link the late rank has not made yet carries no
     * heartbeats, so LOOM_TIMEOUT (10 s here) bounds that wait. */
    live_t *L = live_setup(_i, "10", NULL);
    *L = (live_t){.sleeper = 1, .sleep_before = 0, .sleep_s = 7, .iters = 3};
    int status[LV_NRANKS];
    double t0 = h_now_s();
    h_run_procs(LV_NRANKS, live_rank, L, 40, status);
    double wall = h_now_s() - t0;
    live_expect_success(L, status, LV_NAME(_i));
    ck_assert_msg(wall >= 7 && wall < 25, "the job took %.1f s", wall);
}
END_TEST

START_TEST(test_late_first_call)
{
    LV_ONCE();
    /* A rank reaches its first collective 5 s after init with LOOM_TIMEOUT=2: over tcp the
     * lower rank of a pair dials, so the ranks above the late one had no link to it, no
     * heartbeats, and blamed it as stalled or dead after 2 s. Now they dial it themselves after
     * a heartbeat interval and its progress thread answers between calls. Rank 0 (everyone
     * waits for its dial) and rank 1 (rank 2 does) in turn. */
    for (int late = 0; late < 2; late++) {
        live_t *L = live_setup(_i, "2", NULL);
        *L = (live_t){.sleeper = late, .sleep_before = 0, .sleep_s = 5, .iters = 3};
        int status[LV_NRANKS];
        double t0 = h_now_s();
        h_run_procs(LV_NRANKS, live_rank, L, 30, status);
        double wall = h_now_s() - t0;
        live_expect_success(L, status, LV_NAME(_i));
        ck_assert_msg(wall >= 5 && wall < 20, "late rank %d: the job took %.1f s", late, wall);
    }
}
END_TEST

START_TEST(test_crossing_dials)
{
    LV_ONCE();
    /* A first call about one heartbeat interval late (LOOM_TIMEOUT=2: 0.5 s): the late rank's
     * own dial and the others' dials of it cross, at some of these delays on both sides at
     * once. The lower rank's socket must win on both sides, with nothing lost. */
    for (int k = 0; k < 8; k++) {
        live_t *L = live_setup(_i, "2", NULL);
        *L = (live_t){.sleeper = k % 2, .sleep_before = 0, .sleep_s = 0.42 + 0.025 * k, .iters = 3};
        int status[LV_NRANKS];
        h_run_procs(LV_NRANKS, live_rank, L, 30, status);
        live_expect_success(L, status, LV_NAME(_i));
    }
}
END_TEST

START_TEST(test_busy_rank)
{
    LV_ONCE();
    /* Rank 2 computes for 5 s between two collectives with LOOM_TIMEOUT=2 while the others
     * wait inside the next one. (LOOM_TIMEOUT=1 can be too short for a first connection on a
     * machine loaded ten times over.) */
    live_t *L = live_setup(_i, "2", NULL);
    *L = (live_t){.sleeper = 2, .sleep_before = 2, .sleep_s = 5, .iters = 4};
    int status[LV_NRANKS];
    h_run_procs(LV_NRANKS, live_rank, L, 30, status);
    live_expect_success(L, status, LV_NAME(_i));
}
END_TEST

START_TEST(test_op_timeout)
{
    LV_ONCE();
    /* LOOM_OP_TIMEOUT=3 (LOOM_TIMEOUT=2): the ranks waiting on a rank that computes for 9 s
     * give up after about 3 s, naming the operation, its seq, and the peers they wait on. */
    live_t *L = live_setup(_i, "2", "3");
    *L = (live_t){.sleeper = 2, .sleep_before = 1, .sleep_s = 9, .iters = 3};
    int status[LV_NRANKS];
    h_run_procs(LV_NRANKS, live_rank, L, 30, status);
    bool named = false;
    for (int r = 0; r < LV_NRANKS; r++) {
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        if (r == L->sleeper) continue;
        const char *t = L->text[r];
        ck_assert_msg(L->res[r] == loomRemoteError && L->iter[r] == 1,
                      "rank %d: iteration %d gave %d: %s", r, L->iter[r], L->res[r], t);
        ck_assert_msg(strstr(t, "LOOM_OP_TIMEOUT=3") && strstr(t, "allreduce seq 1"),
                      "rank %d: '%s'", r, t);
        ck_assert_msg(L->secs[r] >= 2.8 && L->secs[r] < 6, "rank %d gave up after %.2f s", r,
                      L->secs[r]);
        named |= h_names_rank(t, L->sleeper) && strstr(t, "outside calls") != NULL;
    }
    ck_assert_msg(named, "no survivor named rank %d as outside calls", L->sleeper);
    /* The sleeper learns why when it comes back. */
    ck_assert_msg(L->res[L->sleeper] != loomSuccess, "rank %d: its call succeeded", L->sleeper);
}
END_TEST

/* Two communicators per process, each driven by its own thread: one without pauses, one that
 * computes longer than LOOM_TIMEOUT between calls. The progress thread heartbeats on each while
 * its thread is outside a call, and must never step on the other's (or its own) connections:
 * every result exact, nobody blamed. */
typedef struct {
    loomComm_t comm;
    int rank, nranks, iters;
    useconds_t pause_us;
    loomResult_t res;
    char text[TEXT_MAX];
} lv_driver_t;

static void *lv_drive(void *p)
{
    lv_driver_t *d = p;
    size_t count = lv_count / 4;
    int32_t *send = malloc(count * sizeof(int32_t)), *recv = malloc(count * sizeof(int32_t));
    d->res = loomSuccess;
    for (int it = 0; it < d->iters && send && recv; it++) {
        if (d->pause_us && it % 2 == 1) usleep(d->pause_us);
        if (live_allreduce(d->comm, d->rank, d->nranks, it, send, recv, count, &d->res, d->text))
            break;
    }
    free(send);
    free(recv);
    return NULL;
}

static int two_comms_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    live_t *L = p;
    loomComm_t other = NULL;
    if (loomCommSplit(comm, 0, nranks - rank, &other, NULL) != loomSuccess) {
        h_collect_text(comm, L->text[rank], TEXT_MAX);
        L->res[rank] = loomNumResults;
        return 0;
    }
    int orank = nranks - 1 - rank; /* the key reversed the order */
    lv_driver_t busy = {.comm = comm, .rank = rank, .nranks = nranks, .iters = 150};
    lv_driver_t slow = {
        .comm = other, .rank = orank, .nranks = nranks, .iters = 6, .pause_us = 2300000};
    pthread_t t;
    pthread_create(&t, NULL, lv_drive, &busy);
    lv_drive(&slow);
    pthread_join(t, NULL);
    loomCommDestroy(other);
    L->res[rank] = busy.res != loomSuccess ? busy.res : slow.res;
    snprintf(L->text[rank], TEXT_MAX, "%.1000s | %.1000s", busy.text, slow.text);
    if (L->res[rank] != loomSuccess)
        fprintf(stderr, "rank %d: %d: %s\n", rank, L->res[rank], L->text[rank]);
    return 0;
}

START_TEST(test_two_comms)
{
    LV_ONCE();
    live_t *L = live_setup(_i, "1.5", NULL);
    int status[LV_NRANKS];
    h_run_procs(LV_NRANKS, two_comms_rank, L, 60, status);
    live_expect_success(L, status, LV_NAME(_i));
}
END_TEST

/* ---- main ----------------------------------------------------------------------------------- */

/* ---- 8: an application deadlock ---------------------------------------------------------- */

/* Both ranks receive from each other and nobody sends: every peer is alive (heartbeats) and
 * nothing can finish. That is the application's doing, reported as invalid usage saying what
 * this rank waits for, not as an internal error of loom. */
typedef struct {
    int code[2];
    double secs[2];
    char text[2][1024];
} deadlock_report_t;

static int deadlock_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    deadlock_report_t *rep = p;
    int32_t x = 0;
    double t0 = h_now_s();
    loomResult_t r = loomRecv(&x, 1, loomInt32, 1 - rank, comm, NULL);
    rep->secs[rank] = h_now_s() - t0;
    rep->code[rank] = (int)r;
    snprintf(rep->text[rank], sizeof(rep->text[rank]), "%s", loomGetLastError(NULL));
    return 0;
}

START_TEST(test_app_deadlock)
{
    setenv("LOOM_TIMEOUT", "1", 1);
    param_reset_cache();
    deadlock_report_t *rep = h_shared_map(sizeof(*rep));
    int status[2] = {0};
    h_run_procs(2, deadlock_rank, rep, 25, status);
    /* The rank that gives up first tells the other, whose call then fails with the first
     * one's text as loomRemoteError: both texts carry the cause. */
    int usage = 0;
    for (int r = 0; r < 2; r++) {
        fprintf(stderr, "rank %d: %d after %.1f s: %s\n", r, rep->code[r], rep->secs[r],
                rep->text[r]);
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        ck_assert_msg(rep->code[r] == loomInvalidUsage || rep->code[r] == loomRemoteError,
                      "rank %d: code %d, neither loomInvalidUsage nor loomRemoteError", r,
                      rep->code[r]);
        usage += rep->code[r] == loomInvalidUsage;
        ck_assert_msg(strstr(rep->text[r], "receive from rank") != NULL &&
                          strstr(rep->text[r], "alive") != NULL &&
                          strstr(rep->text[r], "please report") == NULL,
                      "rank %d: text '%s'", r, rep->text[r]);
        ck_assert_msg(rep->secs[r] < 10, "rank %d gave up after %.1f s", r, rep->secs[r]);
    }
    ck_assert_msg(usage >= 1, "no rank reported loomInvalidUsage");
}
END_TEST

int main(void)
{
    /* Before any loom call: parameters are read once per process, and the tests' processes are
     * forks of this one. */
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    setenv("LOOM_TIMEOUT", "3", 1);
    setenv("LOOM_HANDSHAKE_TIMEOUT", "1", 1);
    const char *forced = getenv("LOOM_TRANSPORT");
    if (forced) snprintf(lv_forced, sizeof lv_forced, "%s", forced);

    /* The cases tagged "transport" run again over other transports (tests/meson.build: with
     * LOOM_TRANSPORT=ucx and CK_INCLUDE_TAGS=transport). */
    Suite *s = suite_create("fail");
    const h_case_t cases[] = {
        {.name = "killed_rank",
         .tags = "transport",
         .test = test_killed_rank,
         .timeout_s = 40,
         .loops = 2},
        {.name = "stalled_rank",
         .tags = "transport",
         .test = test_stalled_rank,
         .timeout_s = 40,
         .loops = 2},
        {.name = "mismatch",
         .tags = "transport",
         .test = test_mismatch,
         .timeout_s = 30,
         .loops = MM_NKINDS},
        {.name = "bad_arguments", .test = test_bad_arguments, .timeout_s = 30},
        {.name = "strangers", .test = test_strangers, .tags = "timing", .timeout_s = 60},
        {.name = "128_ranks", .test = test_128_ranks, .tags = "timing", .timeout_s = 90},
        {.name = "abort_other_thread",
         .tags = "transport",
         .test = test_abort_other_thread,
         .timeout_s = 20},
        {.name = "app_deadlock", .tags = "transport", .test = test_app_deadlock, .timeout_s = 30},
        {.name = "late_rank",
         .tags = "transport",
         .test = test_late_rank,
         .timeout_s = 60,
         .loops = 3},
        {.name = "root_flood", .test = test_root_flood, .tags = "timing", .timeout_s = 40},
        {.name = "late_first_call",
         .tags = "transport",
         .test = test_late_first_call,
         .timeout_s = 60,
         .loops = 3},
        {.name = "crossing_dials",
         .tags = "transport",
         .test = test_crossing_dials,
         .timeout_s = 60,
         .loops = 2},
        {.name = "busy_rank",
         .tags = "transport",
         .test = test_busy_rank,
         .timeout_s = 40,
         .loops = 3},
        {.name = "op_timeout",
         .tags = "transport",
         .test = test_op_timeout,
         .timeout_s = 45,
         .loops = 3},
        {.name = "two_comms",
         .tags = "transport",
         .test = test_two_comms,
         .timeout_s = 80,
         .loops = 3},
    };
    h_add_cases(s, cases, sizeof(cases) / sizeof(cases[0]), 30);
    /* Each test in its own process: tests kill and stop children, and set parameters. */
    return h_check_main(s, true, CK_VERBOSE);
}
