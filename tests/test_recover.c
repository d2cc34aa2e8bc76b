/*
 * Recovery and agreement: ranks that disagree on a broadcast's or reduce's root; restarting
 * (abort, destroy, a new communicator in the same process, in a loop, with nothing growing);
 * loomCommShrink after a killed rank, with and without its abort flag; survivors that disagree
 * on whom to exclude. Loopback only (LOOM_SOCKET_IFNAME=lo), every case with a timeout.
 */
#include <check.h>
#include <dirent.h>
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

#include "harness.h"
#include "loom.h"

#define TEXT_MAX 2200

__attribute__((unused)) static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((unused)) static void *shared_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(p != MAP_FAILED);
    memset(p, 0, bytes);
    return p;
}

static void collect_text(loomComm_t comm, char *out, size_t len)
{
    const char *c = comm ? loomGetLastError(comm) : "";
    const char *t = loomGetLastError(NULL);
    if (c[0] && strcmp(c, t) != 0)
        snprintf(out, len, "%s || %s", c, t);
    else
        snprintf(out, len, "%s", t);
}

/* Whether text names rank r as "rank <r>" (and not as the start of "rank <r>5"). */
static bool names_rank(const char *text, int r)
{
    char want[32];
    int n = snprintf(want, sizeof(want), "rank %d", r);
    for (const char *p = strstr(text, want); p; p = strstr(p + 1, want))
        if (p[n] < '0' || p[n] > '9') return true;
    return false;
}

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
    collect_text(comm, m->text[rank], TEXT_MAX);
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
        ck_assert_msg(names_rank(t, r) && names_root(t, root),
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

int main(void)
{
    setenv("LOOM_TIMEOUT", "5", 1);
    Suite *s = suite_create("recover");
    const h_case_t cases[] = {
        {.name = "root_mismatch", .test = test_root_mismatch, .timeout_s = 30, .loops = 12},
    };
    h_add_cases(s, cases, sizeof(cases) / sizeof(cases[0]), 60);
    return h_check_main(s, true, CK_VERBOSE);
}
