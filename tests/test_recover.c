/*
 * Recovery and agreement: ranks that disagree on a broadcast's or reduce's root; restarting
 * (abort, destroy, a new communicator in the same process, in a loop, with nothing growing);
 * loomCommShrink after a killed rank, with and without its abort flag; survivors that disagree
 * on whom to exclude. Loopback only (LOOM_SOCKET_IFNAME=lo), every case with a timeout.
 */
#include <check.h>
#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
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

#include "comm.h"
#include "harness.h"
#include "loom.h"
#include "param.h"
#include "sock.h"

#define TEXT_MAX 2200

static bool names_root(const char *text, int root)
{
    char want[32];
    int n = snprintf(want, sizeof(want), "root %d", root);
    for (const char *p = strstr(text, want); p; p = strstr(p + 1, want))
        if (p[n] < '0' || p[n] > '9') return true;
    return false;
}

/* ---- ranks that disagree on the root --------------------------------------------------- */

#define RM_MAX 4
#define RM_COUNT 3000 /* several slices: the chain is pipelined */

typedef struct {
    int reduce;     /* 0 broadcast, 1 reduce */
    int all_differ; /* every rank names itself; else the last rank alone names itself */
    loomResult_t res[RM_MAX], follow[RM_MAX];
    bool right_data[RM_MAX]; /* a call that succeeded left what rank 0, the root, sent */
    char text[RM_MAX][TEXT_MAX];
} rootmm_t;

static int rootmm_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    rootmm_t *m = p;
    int32_t *send = malloc(RM_COUNT * sizeof(int32_t)), *recv = malloc(RM_COUNT * sizeof(int32_t));
    for (int i = 0; i < RM_COUNT; i++)
        send[i] = rank * 100000 + i;
    memset(recv, 0xa5, RM_COUNT * sizeof(int32_t));
    /* A warm-up, so that the connections are up and the test is about the check. */
    loomResult_t r = loomAllReduce(send, recv, 8, loomInt32, loomSum, comm, NULL);
    if (r != loomSuccess) {
        fprintf(stderr, "rank %d: warm-up failed: %s\n", rank, loomGetLastError(NULL));
        free(send);
        free(recv);
        return 1;
    }
    int root = m->all_differ || rank == nranks - 1 ? rank : 0;
    if (m->reduce)
        r = loomReduce(send, recv, RM_COUNT, loomInt32, loomSum, root, comm, NULL);
    else
        r = loomBroadcast(send, recv, RM_COUNT, loomInt32, root, comm, NULL);
    m->res[rank] = r;
    m->follow[rank] = loomSuccess;
    if (r == loomSuccess) {
        bool ok = true;
        for (int i = 0; i < RM_COUNT && !m->reduce; i++)
            ok = ok && recv[i] == i; /* rank 0's data */
        m->right_data[rank] = ok;
        m->follow[rank] = loomAllReduce(send, recv, 1, loomInt32, loomSum, comm, NULL);
    }
    h_collect_text(comm, m->text[rank], TEXT_MAX);
    free(send);
    free(recv);
    return 0;
}

static const int rm_ranks[] = {2, 3, 4};

START_TEST(test_root_mismatch)
{
    int nranks = rm_ranks[_i % 3];
    rootmm_t *m = calloc(1, sizeof(*m));
    m->reduce = (_i / 3) % 2;
    m->all_differ = _i / 6;
    const char *what = m->reduce ? "reduce" : "broadcast";
    int nfail = h_run_threads(nranks, rootmm_rank, m);
    ck_assert_msg(nfail == 0, "%s: %d ranks failed their warm-up", what, nfail);
    for (int r = 0; r < nranks; r++) {
        int root = m->all_differ || r == nranks - 1 ? r : 0;
        fprintf(stderr, "%s on %d ranks (%s): rank %d (root %d): %d then %d: %s\n", what, nranks,
                m->all_differ ? "every rank its own root" : "the last rank disagrees", r, root,
                (int)m->res[r], (int)m->follow[r], m->text[r]);
        /* A rank that believes itself the root, and every rank whose predecessor on the ring
         * disagrees with it, must fail the call itself. */
        bool must = m->all_differ || root == r || r == 0 || r == nranks - 1;
        if (m->res[r] == loomSuccess) {
            ck_assert_msg(!must, "%s on %d ranks: rank %d (root %d) returned success", what, nranks,
                          r, root);
            /* Anyone else may finish only with the right data (rank 0's broadcast, which it
             * agreed on with its predecessor), and then its next call fails. */
            ck_assert_msg(m->reduce || m->right_data[r],
                          "%s on %d ranks: rank %d succeeded with wrong data", what, nranks, r);
            ck_assert_msg(m->follow[r] != loomSuccess,
                          "%s on %d ranks: rank %d kept working on a broken communicator", what,
                          nranks, r);
            continue;
        }
        const char *t = m->text[r];
        if (strstr(t, "mismatch") == NULL) continue; /* told by a peer that aborted */
        ck_assert_msg(h_names_rank(t, r) && names_root(t, root),
                      "%s on %d ranks: rank %d's error does not name it and its root %d: '%s'",
                      what, nranks, r, root, t);
        ck_assert_msg(strstr(t, what) != NULL, "%s: rank %d's error does not name the operation",
                      what, r);
    }
    /* The rank that believes itself the root names the other root it met. */
    int believer = nranks - 1;
    const char *t = m->text[believer];
    ck_assert_msg(strstr(t, "mismatch") != NULL && names_root(t, believer) &&
                      (names_root(t, 0) || names_root(t, believer - 1)),
                  "%s on %d ranks: rank %d's error does not name both roots: '%s'", what, nranks,
                  believer, t);
    free(m);
}
END_TEST

/* ---- loomCommShrink after a killed rank ------------------------------------------------- */

#define SH_MAX 8

typedef struct {
    int victim;    /* killed after the warm-up */
    int flags;     /* LOOM_SHRINK_* */
    int bad_list;  /* 1: rank 2 also excludes rank 1; 2: rank 1 also excludes rank 0 */
    int strangers; /* silent connections each survivor opens to its own meeting point first */
    int second;    /* > 0: parent rank second - 1 is killed too, on the shrunk communicator */
    int second_pid;
    atomic_int warm, second_warm; /* ranks past the warm-up; past the shrunk comm's 3rd call */
    loomResult_t second_res[SH_MAX];
    double second_s[SH_MAX];
    char second_text[SH_MAX][TEXT_MAX];
    loomResult_t broken[SH_MAX], shrunk[SH_MAX];
    int new_rank[SH_MAX], new_size[SH_MAX];
    int exact[SH_MAX]; /* allreduces on the shrunk communicator that were exact */
    double shrink_s[SH_MAX];
    bool seg[SH_MAX], parent_seg[SH_MAX]; /* the node segment: the shrunk one's, the parent's */
    char text[SH_MAX][TEXT_MAX];
} shrink_t;

static const size_t sh_counts[] = {1, 1000, 100003};
#define SH_NCOUNTS (sizeof(sh_counts) / sizeof(sh_counts[0]))

/* Exact allreduces of every count on comm whose members are the parent ranks in members[]:
 * element i of parent rank q is q * 1000003 + i, so each sum is known and fits an int64. */
static int exact_allreduces(loomComm_t comm, const int *members, int n, int parent_rank)
{
    int ok = 0;
    for (size_t c = 0; c < SH_NCOUNTS; c++) {
        size_t cnt = sh_counts[c];
        int64_t *buf = malloc(cnt * sizeof(int64_t));
        for (size_t i = 0; i < cnt; i++)
            buf[i] = (int64_t)parent_rank * 1000003 + (int64_t)i;
        loomResult_t r = loomAllReduce(buf, buf, cnt, loomInt64, loomSum, comm, NULL);
        bool good = r == loomSuccess;
        for (size_t i = 0; i < cnt && good; i++) {
            int64_t want = 0;
            for (int k = 0; k < n; k++)
                want += (int64_t)members[k] * 1000003 + (int64_t)i;
            good = buf[i] == want;
        }
        if (!good)
            fprintf(stderr, "parent rank %d: allreduce of %zu on the shrunk comm: %d %s\n",
                    parent_rank, cnt, (int)r, r ? loomGetLastError(NULL) : "(wrong sum)");
        ok += good;
        free(buf);
    }
    return ok;
}

#define RS_WAIT_S 30 /* every bounded wait of this file */

/* Waits (at most RS_WAIT_S) until *v reaches want. */
static bool wait_at_least(atomic_int *v, int want)
{
    for (double t0 = h_now_s(); atomic_load(v) < want; usleep(1000))
        if (h_now_s() - t0 > RS_WAIT_S) return false;
    return true;
}

static int shrink_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    shrink_t *m = p;
    int32_t x = rank;
    if (loomAllReduce(&x, &x, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) return 1;
    /* Killed once every rank is past the warm-up: a rank still finishing it would otherwise get
     * the job's verdict there (the victim's own part of it can end first). */
    atomic_fetch_add(&m->warm, 1);
    if (rank == m->victim) {
        (void)wait_at_least(&m->warm, nranks);
        raise(SIGKILL);
    }
    /* The survivors' next call fails: the victim is gone. */
    m->broken[rank] = loomAllReduce(&x, &x, 1, loomInt32, loomSum, comm, NULL);
    int excl[3] = {m->victim}, nex = 1;
    if (m->bad_list == 1 && rank == 2) excl[nex++] = 1;
    if (m->bad_list == 2 && rank == 1) excl[nex++] = 0;
    int sfd[64], ns = 0;
    if (m->strangers > 0) {
        sock_addr_t a = {.len = sizeof(a.sa)};
        if (getsockname(comm->net.shrink_fd, (struct sockaddr *)&a.sa, &a.len) != 0) return 1;
        for (; ns < m->strangers && ns < 64; ns++) {
            sfd[ns] = socket(a.sa.ss_family, SOCK_STREAM, 0);
            if (sfd[ns] < 0 || connect(sfd[ns], (struct sockaddr *)&a.sa, a.len) != 0) return 1;
        }
    }
    loomComm_t nc = NULL;
    double t0 = h_now_s();
    m->shrunk[rank] = loomCommShrink(comm, excl, nex, &nc, NULL, m->flags);
    m->shrink_s[rank] = h_now_s() - t0;
    while (ns > 0)
        close(sfd[--ns]);
    h_collect_text(comm, m->text[rank], TEXT_MAX);
    if (m->shrunk[rank] == loomSuccess) {
        loomCommCount(nc, &m->new_size[rank]);
        loomCommUserRank(nc, &m->new_rank[rank]);
        m->seg[rank] = nc->net.seg != NULL;
        m->parent_seg[rank] = comm->net.seg != NULL;
        int members[SH_MAX], n = 0;
        for (int q = 0; q < nranks; q++)
            if (q != m->victim) members[n++] = q;
        m->exact[rank] = exact_allreduces(nc, members, n, rank);
        for (int it = 0; m->second > 0 && it < 50; it++) {
            if (it == 3) atomic_fetch_add(&m->second_warm, 1);
            if (rank == m->second - 1 && it == 3) {
                (void)wait_at_least(&m->second_warm, n);
                m->second_pid = (int)getpid();
                raise(SIGKILL);
            }
            double t1 = h_now_s();
            loomResult_t r = loomAllReduce(&x, &x, 1, loomInt32, loomSum, nc, NULL);
            if (r == loomSuccess) continue;
            m->second_res[rank] = r;
            m->second_s[rank] = h_now_s() - t1;
            h_collect_text(nc, m->second_text[rank], TEXT_MAX);
            break;
        }
        loomCommDestroy(nc);
    }
    return 0;
}

/* 4 and 8 ranks, over tcp, over shm and with the transports loom picks (loops 4 and 5: the
 * node segment too, which the shrunk communicator of ranks of one node must have whenever its
 * parent had one); the last rank or a middle one killed. */
START_TEST(test_shrink_killed)
{
    int nranks = _i & 1 ? 8 : 4;
    const char *tp = _i >= 4 ? "auto" : _i & 2 ? "shm" : "tcp";
    if (_i >= 4)
        unsetenv("LOOM_TRANSPORT");
    else
        setenv("LOOM_TRANSPORT", tp, 1);
    shrink_t *m = h_shared_map(sizeof(*m));
    m->victim = _i & 1 ? 3 : nranks - 1;
    m->flags = _i & 2 ? LOOM_SHRINK_ABORT : LOOM_SHRINK_DEFAULT;
    int status[SH_MAX];
    h_run_procs(nranks, shrink_rank, m, 40, status);
    for (int r = 0, want = 0; r < nranks; r++) {
        if (r == m->victim) {
            ck_assert_int_eq(status[r], 128 + SIGKILL);
            continue;
        }
        fprintf(stderr,
                "%s, %d ranks: rank %d: broken %d, shrink %d in %.2f s -> rank %d of %d: %s\n", tp,
                nranks, r, (int)m->broken[r], (int)m->shrunk[r], m->shrink_s[r], m->new_rank[r],
                m->new_size[r], m->text[r]);
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        ck_assert_msg(m->broken[r] != loomSuccess, "rank %d: an allreduce without rank %d worked",
                      r, m->victim);
        ck_assert_msg(m->shrunk[r] == loomSuccess, "%s, %d ranks: rank %d: shrink failed: %s", tp,
                      nranks, r, m->text[r]);
        ck_assert_int_eq(m->new_size[r], nranks - 1);
        ck_assert_int_eq(m->new_rank[r], want++);
        ck_assert_msg(m->exact[r] == (int)SH_NCOUNTS, "rank %d: %d of %zu allreduces exact", r,
                      m->exact[r], SH_NCOUNTS);
        ck_assert_msg(m->shrink_s[r] < 5, "rank %d: shrink took %.2f s", r, m->shrink_s[r]);
        ck_assert_msg(m->seg[r] == m->parent_seg[r],
                      "%s, %d ranks: rank %d: the shrunk communicator %s a node segment, the "
                      "parent %s",
                      tp, nranks, r, m->seg[r] ? "has" : "lacks",
                      m->parent_seg[r] ? "had" : "lacked");
        if (_i >= 4) ck_assert_msg(m->parent_seg[r], "rank %d: no node segment to test", r);
    }
    if (_i >= 4) unsetenv("LOOM_TRANSPORT");
}
END_TEST

/* The shrunk communicator has a job-state service of its own: 6 ranks, rank 5 killed, the 5
 * survivors shrink (a ring of ranks 0..4), then rank 2 is killed on it. Every rank names it
 * dead, with its pid, within seconds (LOOM_TIMEOUT=30), and the shrunk communicator's service
 * delivered its verdict (without a service no child rank's text has one). Not every rank's
 * text starts with the verdict: rank 4, which has no link with rank 2, sometimes hears rank 3's
 * forwarded abort first (1 run in 5), which names the cause too. */
START_TEST(test_shrink_child_killed)
{
    setenv("LOOM_TIMEOUT", "30", 1);
    setenv("LOOM_ALGO", "ring", 1);
    param_reset_cache();
    shrink_t *m = h_shared_map(sizeof(*m));
    m->victim = 5;
    m->second = 2 + 1;
    int status[SH_MAX];
    h_run_procs(6, shrink_rank, m, 40, status);
    unsetenv("LOOM_ALGO");
    setenv("LOOM_TIMEOUT", "5", 1);
    param_reset_cache();
    char pid[32];
    snprintf(pid, sizeof(pid), "pid %d", m->second_pid);
    int from_service = 0;
    for (int r = 0; r < 5; r++) {
        if (r == 2) {
            ck_assert_int_eq(status[r], 128 + SIGKILL);
            continue;
        }
        const char *t = m->second_text[r];
        fprintf(stderr, "rank %d: after %.2f s: %s\n", r, m->second_s[r], t);
        ck_assert_msg(status[r] == 0 && m->shrunk[r] == loomSuccess, "rank %d: status %d: %s", r,
                      status[r], m->text[r]);
        ck_assert_msg(m->second_res[r] != loomSuccess && h_names_rank(t, 2) && strstr(t, "died") &&
                          strstr(t, pid),
                      "rank %d: '%s' (wanted 'rank 2', 'died' and '%s')", r, t, pid);
        ck_assert_msg(m->second_s[r] < 6, "rank %d: its call failed after %.1f s", r,
                      m->second_s[r]);
        from_service += strstr(t, "saw its connection close") != NULL;
    }
    ck_assert_msg(from_service > 0, "no rank has the shrunk communicator's verdict");
}
END_TEST

/* Strangers at the meeting points: 16 silent connections to each survivor's, made before the
 * survivors meet. The meeting point used to run one blocking handshake at a time, so each
 * stranger ahead of a survivor held the shrink for LOOM_HANDSHAKE_TIMEOUT (5 s); now they wait in
 * the bounded pending list while the survivors' handshakes finish. */
START_TEST(test_shrink_strangers)
{
    setenv("LOOM_TRANSPORT", "tcp", 1);
    shrink_t *m = h_shared_map(sizeof(*m));
    m->victim = 3;
    m->strangers = 16;
    int status[SH_MAX];
    h_run_procs(4, shrink_rank, m, 40, status);
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        ck_assert_msg(m->shrunk[r] == loomSuccess, "rank %d: shrink failed: %s", r, m->text[r]);
        ck_assert_msg(m->shrink_s[r] < 4, "rank %d: shrink took %.2f s beside 16 strangers", r,
                      m->shrink_s[r]);
        ck_assert_int_eq(m->exact[r], (int)SH_NCOUNTS);
    }
}
END_TEST

/* Survivors that disagree on the list: every one fails, naming the ranks and their lists,
 * within LOOM_TIMEOUT (and at once when they meet at the same rank). */
START_TEST(test_shrink_disagree)
{
    shrink_t *m = h_shared_map(sizeof(*m));
    m->victim = 3;
    m->bad_list = _i + 1;
    int status[4];
    h_run_procs(4, shrink_rank, m, 40, status);
    for (int r = 0; r < 3; r++) {
        fprintf(stderr, "lists %d: rank %d: shrink %d in %.2f s: %s\n", m->bad_list, r,
                (int)m->shrunk[r], m->shrink_s[r], m->text[r]);
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        ck_assert_msg(m->shrunk[r] == loomInvalidUsage, "rank %d: shrink returned %d: %s", r,
                      (int)m->shrunk[r], m->text[r]);
        const char *t = m->text[r];
        if (m->bad_list == 1) {
            ck_assert_msg(strstr(t, "rank 2 excludes [1 3]") && strstr(t, "excludes [3]"),
                          "rank %d's error does not name both lists: '%s'", r, t);
            ck_assert_msg(m->shrink_s[r] < 3, "rank %d took %.2f s", r, m->shrink_s[r]);
        } else {
            /* Ranks 0 and 2 meet at rank 0, rank 1 waits for rank 2 at itself. */
            ck_assert_msg(strstr(t, "did not call loomCommShrink") && strstr(t, "not agree"),
                          "rank %d's error does not name the missing rank: '%s'", r, t);
            ck_assert_msg(m->shrink_s[r] < 5 + 3, "rank %d took %.2f s", r, m->shrink_s[r]);
        }
    }
}
END_TEST

/* A survivor's shrink record damaged on the way to the meeting point (as by someone injecting
 * into the connection; sock_auth_tamper_nth, the test hook of sock.h): the meeting point refuses
 * it, and tells that rank why, naming it; the others are told that it did not come. No rank is
 * dead here (nothing excluded), so no job-state frame is in flight to take the damage instead. */
typedef struct {
    loomResult_t res[3];
    double secs[3];
    char text[3][TEXT_MAX];
} tampered_t;

static int tampered_shrink_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    tampered_t *m = p;
    int32_t x = rank;
    if (loomAllReduce(&x, &x, 1, loomInt32, loomSum, comm, NULL) != loomSuccess || x != 3) return 1;
    if (rank == 1) sock_auth_tamper_nth = 1; /* its next tag: the shrink record's */
    loomComm_t nc = NULL;
    double t0 = h_now_s();
    m->res[rank] = loomCommShrink(comm, NULL, 0, &nc, NULL, LOOM_SHRINK_DEFAULT);
    m->secs[rank] = h_now_s() - t0;
    h_collect_text(comm, m->text[rank], TEXT_MAX);
    if (nc) loomCommDestroy(nc);
    return 0;
}

START_TEST(test_shrink_tampered)
{
    setenv("LOOM_TIMEOUT", "3", 1);
    tampered_t *m = h_shared_map(sizeof(*m));
    int status[3];
    h_run_procs(3, tampered_shrink_rank, m, 40, status);
    for (int r = 0; r < 3; r++) {
        fprintf(stderr, "rank %d: shrink %d after %.2f s: %s\n", r, (int)m->res[r], m->secs[r],
                m->text[r]);
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        ck_assert_msg(m->res[r] != loomSuccess, "rank %d: the shrink succeeded", r);
        ck_assert_msg(m->secs[r] < 3 + 4, "rank %d: told after %.2f s", r, m->secs[r]);
    }
    ck_assert_msg(strstr(m->text[1], "rank 0 refused rank 1's record") &&
                      strstr(m->text[1], "failed authentication"),
                  "rank 1 was not told why: '%s'", m->text[1]);
    for (int r = 0; r < 3; r += 2)
        ck_assert_msg(strstr(m->text[r], "rank 1 did not call loomCommShrink"), "rank %d: '%s'", r,
                      m->text[r]);
}
END_TEST

/* LOOM_SHRINK_ABORT while another thread is blocked in an allreduce on the parent (its peer is
 * alive but does not call, so nothing fails by itself): the default mode refuses naming both calls
 * (one thread per communicator), the abort mode ends the allreduce at once and builds the child. */
typedef struct {
    loomComm_t comm;
    loomResult_t res;
    double end;
} blocked_t;

static void *blocked_main(void *p)
{
    blocked_t *b = p;
    int32_t x = 1;
    b->res = loomAllReduce(&x, &x, 1, loomInt32, loomSum, b->comm, NULL);
    b->end = h_now_s();
    return NULL;
}

typedef struct {
    atomic_int done;
    loomResult_t refused[4], shrunk[4], blocked[4];
    double blocked_after[4];
    int exact[4];
    char text[4][TEXT_MAX];
} outstanding_t;

static int outstanding_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    outstanding_t *m = p;
    int32_t x = rank;
    if (loomAllReduce(&x, &x, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) return 1;
    if (rank == 3) {
        /* Alive (it heartbeats between calls) but never calls again until the others are
         * done, so the allreduce they start cannot finish or fail by itself. */
        for (double t0 = h_now_s(); atomic_load(&m->done) < 3 && h_now_s() - t0 < 30;)
            usleep(10000);
        return 0;
    }
    blocked_t b = {.comm = comm};
    pthread_t t;
    pthread_create(&t, NULL, blocked_main, &b);
    usleep(300000);
    int excl = 3;
    loomComm_t nc = NULL;
    m->refused[rank] = loomCommShrink(comm, &excl, 1, &nc, NULL, LOOM_SHRINK_DEFAULT);
    h_collect_text(comm, m->text[rank], TEXT_MAX);
    double t0 = h_now_s();
    m->shrunk[rank] = loomCommShrink(comm, &excl, 1, &nc, NULL, LOOM_SHRINK_ABORT);
    pthread_join(t, NULL);
    m->blocked[rank] = b.res;
    m->blocked_after[rank] = b.end - t0;
    if (m->shrunk[rank] == loomSuccess) {
        int members[3] = {0, 1, 2};
        m->exact[rank] = exact_allreduces(nc, members, 3, rank);
        loomCommDestroy(nc);
    } else {
        h_collect_text(comm, m->text[rank], TEXT_MAX);
    }
    atomic_fetch_add(&m->done, 1);
    return 0;
}

START_TEST(test_shrink_outstanding)
{
    setenv("LOOM_TIMEOUT", "30", 1); /* nothing may end the blocked call but the abort */
    outstanding_t *m = h_shared_map(sizeof(*m));
    int status[4];
    h_run_procs(4, outstanding_rank, m, 40, status);
    for (int r = 0; r < 3; r++) {
        fprintf(stderr, "rank %d: default %d, abort %d, blocked call %d after %.2f s: %s\n", r,
                (int)m->refused[r], (int)m->shrunk[r], (int)m->blocked[r], m->blocked_after[r],
                m->text[r]);
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        ck_assert_msg(m->refused[r] == loomInvalidUsage &&
                          strstr(m->text[r], "loomCommShrink on thread") &&
                          strstr(m->text[r], "while loomAllReduce runs on thread"),
                      "rank %d: the default mode did not refuse the outstanding call: %d '%s'", r,
                      (int)m->refused[r], m->text[r]);
        ck_assert_msg(m->shrunk[r] == loomSuccess, "rank %d: abort mode failed: %s", r, m->text[r]);
        ck_assert_msg(m->blocked[r] == loomRemoteError, "rank %d: the blocked call returned %d", r,
                      (int)m->blocked[r]);
        ck_assert_msg(m->blocked_after[r] < 3, "rank %d: the blocked call left after %.2f s", r,
                      m->blocked_after[r]);
        ck_assert_int_eq(m->exact[r], (int)SH_NCOUNTS);
    }
}
END_TEST

/* ---- restarting in the same process ---------------------------------------------------- */
/* Twenty rounds of: a job of 4 (three processes that live through every round and a new one),
 * an exact allreduce, the new member killed (even rounds) or aborting (odd rounds), the
 * survivors' failed call, a shrink to the three and exact allreduces there, then the parent
 * aborted (even) or destroyed (odd) and a new job with a new unique id. Descriptors, threads and
 * the heap must not grow from round to round. */

#define RS_ROUNDS 20
#define RS_N 4 /* ranks 0-2 live through every round; rank 3 is a new process each round */
#define RS_COUNT 1000

typedef struct {
    atomic_int round; /* k + 1 once rank 0 has published round k's id */
    loomUniqueId id[RS_ROUNDS];
    atomic_int ready[RS_ROUNDS];     /* ranks whose first allreduce of the round is done */
    atomic_int gone[RS_ROUNDS];      /* the new member was killed or aborted and exited */
    atomic_int torn_down[RS_ROUNDS]; /* survivors that aborted or destroyed their comm */
    int fds[RS_N][RS_ROUNDS], threads[RS_N][RS_ROUNDS];
    long long heap[RS_N][RS_ROUNDS];
    loomResult_t broken[RS_N][RS_ROUNDS];
    int failed_round[RS_N];
    char text[RS_N][TEXT_MAX];
} restart_t;

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static int count_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

/* One round's communicator: init with that round's id, one exact allreduce. */
static int rs_join(restart_t *m, int k, int rank, loomComm_t *c)
{
    if (!wait_at_least(&m->round, k + 1)) return 1;
    if (loomCommInitRank(c, RS_N, m->id[k], rank) != loomSuccess) return 2;
    int64_t *buf = malloc(RS_COUNT * sizeof(int64_t));
    for (int i = 0; i < RS_COUNT; i++)
        buf[i] = (int64_t)(rank + 1) * 1000003 + i + k;
    loomResult_t r = loomAllReduce(buf, buf, RS_COUNT, loomInt64, loomSum, *c, NULL);
    bool ok = r == loomSuccess;
    for (int i = 0; i < RS_COUNT && ok; i++)
        ok = buf[i] == (int64_t)(1 + 2 + 3 + 4) * 1000003 + (int64_t)RS_N * (i + k);
    free(buf);
    if (!ok) return 3;
    atomic_fetch_add(&m->ready[k], 1);
    return 0;
}

static int rs_survivor(restart_t *m, int rank)
{
    for (int k = 0; k < RS_ROUNDS; k++) {
        if (rank == 0) {
            if (loomGetUniqueId(&m->id[k]) != loomSuccess) return 10;
            atomic_store(&m->round, k + 1);
        }
        loomComm_t c = NULL;
        int rc = rs_join(m, k, rank, &c);
        if (rc == 0 && !wait_at_least(&m->gone[k], 1)) rc = 4;
        if (rc == 0) {
            /* The new member is gone: this call must fail, then the communicator goes. */
            int32_t x = 1;
            m->broken[rank][k] = loomAllReduce(&x, &x, 1, loomInt32, loomSum, c, NULL);
            if (m->broken[rank][k] == loomSuccess) rc = 5;
            snprintf(m->text[rank], TEXT_MAX, "round %d: the call without the member: %s", k,
                     loomGetLastError(NULL));
        }
        if (rc == 0) {
            /* The survivors go on without it too, before they start over. */
            int ex = RS_N - 1, members[RS_N - 1] = {0, 1, 2};
            loomComm_t nc = NULL;
            if (loomCommShrink(c, &ex, 1, &nc, NULL,
                               k % 2 == 0 ? LOOM_SHRINK_ABORT : LOOM_SHRINK_DEFAULT) != loomSuccess)
                rc = 8;
            else if (exact_allreduces(nc, members, RS_N - 1, rank) != (int)SH_NCOUNTS)
                rc = 9;
            loomCommDestroy(nc);
        }
        if (rc) {
            m->failed_round[rank] = k + 1;
            snprintf(m->text[rank], TEXT_MAX, "round %d: step %d: %s", k, rc,
                     loomGetLastError(NULL));
            return rc;
        }
        if (k % 2 == 0 ? loomCommAbort(c) != loomSuccess : loomCommDestroy(c) != loomSuccess)
            return 6;
        atomic_fetch_add(&m->torn_down[k], 1);
        if (!wait_at_least(&m->torn_down[k], RS_N - 1)) return 7;
        /* Threads that are leaving (the rendezvous root's) get a moment to go. */
        int th = count_threads();
        for (int i = 0; i < 50 && k > 0 && th > m->threads[rank][k - 1]; i++) {
            usleep(20000);
            th = count_threads();
        }
        m->threads[rank][k] = th;
        m->fds[rank][k] = count_fds();
        m->heap[rank][k] = (long long)mallinfo2().uordblks;
    }
    return 0;
}

/* Round k's new member: joins, then is killed (even rounds) or aborts and exits (odd). */
static int rs_member(restart_t *m, int k)
{
    loomComm_t c = NULL;
    int rc = rs_join(m, k, RS_N - 1, &c);
    if (rc) return rc;
    if (k % 2 == 0)
        for (;;)
            pause(); /* the test kills it */
    /* Not before every rank finished the call: an abort is a job-wide error, which would fail a
     * survivor still finishing it (its last small message from here may be waiting for it in
     * shared memory, already complete on this side). */
    if (!wait_at_least(&m->ready[k], RS_N)) return 11;
    loomCommAbort(c);
    return 0;
}

START_TEST(test_restart_loop)
{
    setenv("LOOM_TIMEOUT", "5", 1);
    restart_t *m = h_shared_map(sizeof(*m));
    pid_t surv[RS_N - 1];
    /* This process never calls loom: forking from it is always safe. */
    for (int r = 0; r < RS_N - 1; r++) {
        surv[r] = fork();
        ck_assert(surv[r] >= 0);
        if (surv[r] == 0) _exit(rs_survivor(m, r));
    }
    double t0 = h_now_s();
    for (int k = 0; k < RS_ROUNDS; k++) {
        pid_t v = fork();
        ck_assert(v >= 0);
        if (v == 0) _exit(rs_member(m, k));
        bool joined = wait_at_least(&m->ready[k], RS_N);
        if (!joined || k % 2 == 0) kill(v, SIGKILL);
        int st = 0;
        waitpid(v, &st, 0);
        atomic_store(&m->gone[k], 1);
        if (!joined) {
            for (int r = 0; r < RS_N - 1; r++)
                kill(surv[r], SIGKILL);
            for (int r = 0; r < RS_N - 1; r++)
                waitpid(surv[r], NULL, 0);
            for (int r = 0; r < RS_N - 1; r++)
                fprintf(stderr, "rank %d: %s\n", r, m->text[r]);
            ck_abort_msg("round %d: the job did not form", k);
        }
        ck_assert_msg(k % 2 == 0 || (WIFEXITED(st) && WEXITSTATUS(st) == 0),
                      "round %d: the member that aborted exited with %d", k, st);
    }
    for (int r = 0; r < RS_N - 1; r++) {
        int st = 0;
        waitpid(surv[r], &st, 0);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status %d: %s", r, st,
                      m->text[r]);
    }
    fprintf(stderr, "%d rounds in %.1f s\n", RS_ROUNDS, h_now_s() - t0);
    for (int r = 0; r < RS_N - 1; r++) {
        fprintf(stderr, "rank %d: %s\n", r, m->text[r]);
        fprintf(stderr, "rank %d: fds %d -> %d, threads %d -> %d, heap %lld -> %lld bytes\n", r,
                m->fds[r][2], m->fds[r][RS_ROUNDS - 1], m->threads[r][2],
                m->threads[r][RS_ROUNDS - 1], m->heap[r][2], m->heap[r][RS_ROUNDS - 1]);
        /* The first rounds start what lives for the process (the progress thread). */
        for (int k = 3; k < RS_ROUNDS; k++) {
            ck_assert_msg(m->fds[r][k] <= m->fds[r][2],
                          "rank %d: %d descriptors after round %d, %d after round 2", r,
                          m->fds[r][k], k, m->fds[r][2]);
            ck_assert_msg(m->threads[r][k] <= m->threads[r][2],
                          "rank %d: %d threads after round %d, %d after round 2", r,
                          m->threads[r][k], k, m->threads[r][2]);
        }
        long long grow = m->heap[r][RS_ROUNDS - 1] - m->heap[r][2];
        ck_assert_msg(grow < 64 * 1024, "rank %d: the heap grew by %lld bytes in %d rounds", r,
                      grow, RS_ROUNDS - 3);
    }
}
END_TEST

int main(void)
{
    setenv("LOOM_TIMEOUT", "5", 1);
    Suite *s = suite_create("recover");
    const h_case_t cases[] = {
        {.name = "root_mismatch", .test = test_root_mismatch, .timeout_s = 30, .loops = 12},
        {.name = "shrink_killed", .test = test_shrink_killed, .timeout_s = 60, .loops = 6},
        {.name = "shrink_child_killed", .test = test_shrink_child_killed, .timeout_s = 60},
        {.name = "shrink_disagree", .test = test_shrink_disagree, .timeout_s = 60, .loops = 2},
        {.name = "shrink_strangers", .test = test_shrink_strangers, .timeout_s = 60},
        {.name = "shrink_tampered", .test = test_shrink_tampered, .timeout_s = 60},
        {.name = "shrink_outstanding", .test = test_shrink_outstanding, .timeout_s = 60},
        {.name = "restart_loop", .test = test_restart_loop, .timeout_s = 240},
    };
    h_add_cases(s, cases, sizeof(cases) / sizeof(cases[0]), 60);
    return h_check_main(s, true, CK_VERBOSE);
}
