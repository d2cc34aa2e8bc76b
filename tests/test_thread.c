/*
 * One thread per communicator at a time (NCCL's rule): two threads calling into one
 * communicator at once must get loomInvalidUsage naming both calls, never a silent wrong result
 * or a hang; one thread per communicator, with several communicators, keeps working. Ranks are
 * processes with a deadline (h_run_procs), and LOOM_TIMEOUT is short.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"

#define CALLS 3000
#define COUNT 256

typedef struct {
    loomComm_t comm;
    int nranks;
    atomic_int *stop;
    int wrong;          /* successful calls with a wrong sum */
    loomResult_t first; /* the first error this thread saw */
    char text[512];
} racer_t;

static void *racer(void *arg)
{
    racer_t *r = arg;
    float buf[COUNT];
    float want = (float)(r->nranks * (r->nranks + 1) / 2);
    for (int i = 0; i < CALLS && !atomic_load(r->stop); i++) {
        int rank;
        loomCommUserRank(r->comm, &rank);
        for (int k = 0; k < COUNT; k++)
            buf[k] = (float)(rank + 1);
        loomResult_t res = loomAllReduce(buf, buf, COUNT, loomFloat32, loomSum, r->comm, NULL);
        if (res != loomSuccess) {
            r->first = res;
            snprintf(r->text, sizeof(r->text), "%s", loomGetLastError(NULL));
            atomic_store(r->stop, 1);
            break;
        }
        for (int k = 0; k < COUNT; k++)
            if (buf[k] != want) {
                r->wrong++;
                break;
            }
    }
    return NULL;
}

/* Exit codes: 0 detected, 1 a wrong sum, 2 no error at all, 3 reported but not naming both, 4 no
 * misuse seen here but the call failed (the peer, which saw it, left: a rank whose calls are
 * fast, as through the node segment, may finish both threads' calls without ever overlapping). */
static int two_threads_one_comm(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    atomic_int stop = 0;
    racer_t r[2] = {{.comm = comm, .nranks = nranks, .stop = &stop},
                    {.comm = comm, .nranks = nranks, .stop = &stop}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, racer, &r[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    if (r[0].wrong || r[1].wrong) {
        fprintf(stderr, "rank %d: %d wrong sums\n", rank, r[0].wrong + r[1].wrong);
        return 1;
    }
    /* The first thread to see an error saw the misuse; the other may then see its partner
     * give up (a timeout), which is fine. */
    for (int i = 0; i < 2; i++)
        if (r[i].first == loomInvalidUsage) {
            if (strstr(r[i].text, "loomAllReduce on thread") &&
                strstr(r[i].text, "while loomAllReduce runs on thread"))
                return 0;
            fprintf(stderr, "rank %d: misuse reported as: %s\n", rank, r[i].text);
            return 3;
        }
    fprintf(stderr, "rank %d: no misuse reported; errors %d (%s), %d (%s)\n", rank, r[0].first,
            r[0].text, r[1].first, r[1].text);
    return r[0].first != loomSuccess || r[1].first != loomSuccess ? 4 : 2;
}

START_TEST(two_threads_on_one_communicator)
{
    setenv("LOOM_TIMEOUT", "3", 1);
    int status[2];
    h_run_procs(2, two_threads_one_comm, NULL, 60, status);
    /* every rank detected it, or failed after its peer did; at least one detected it */
    bool ok = (status[0] == 0 || status[0] == 4) && (status[1] == 0 || status[1] == 4) &&
              (status[0] == 0 || status[1] == 0);
    ck_assert_msg(ok,
                  "rank statuses %d %d (1 wrong sum, 2 not reported, 3 text, 4 failed after "
                  "the peer detected it)",
                  status[0], status[1]);
}
END_TEST

static int one_thread_per_comm(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    loomComm_t other;
    if (loomCommSplit(comm, 0, rank, &other, NULL) != loomSuccess) return 4;
    atomic_int stop = 0;
    racer_t r[2] = {{.comm = comm, .nranks = nranks, .stop = &stop},
                    {.comm = other, .nranks = nranks, .stop = &stop}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, racer, &r[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    loomCommDestroy(other);
    for (int i = 0; i < 2; i++)
        if (r[i].first != loomSuccess || r[i].wrong) {
            fprintf(stderr, "rank %d: communicator %d: %d (%s), %d wrong\n", rank, i, r[i].first,
                    r[i].text, r[i].wrong);
            return 5;
        }
    return 0;
}

START_TEST(one_thread_per_communicator)
{
    setenv("LOOM_TIMEOUT", "20", 1);
    int status[2];
    int failed = h_run_procs(2, one_thread_per_comm, NULL, 120, status);
    ck_assert_msg(failed == 0, "rank statuses %d %d", status[0], status[1]);
}
END_TEST

/* ---- lifecycle calls against a running call ------------------------------------------------ */

/* A lifecycle call on one thread while a collective runs on another is loomInvalidUsage naming
 * both, and leaves the communicator as it was: the collective finishes exact, the next round
 * works. The collective is held running by the peer, which joins it LATE_US late. Then the
 * reverse: an allreduce while a split runs on another thread. Exit codes: 10+k round k's call was
 * not refused, 30+k refused with the wrong text, 50+k the racing allreduce failed or was wrong. */
#define LATE_US 1500000
#define LIFE_CALLS 6

typedef struct {
    loomComm_t comm;
    int nranks;
    atomic_int started;
    loomResult_t res;
    int32_t sum;
    loomComm_t child;
    char text[512];
} runner_t;

static void *run_allreduce(void *p)
{
    runner_t *r = p;
    int32_t x = 1;
    atomic_store(&r->started, 1);
    r->res = loomAllReduce(&x, &r->sum, 1, loomInt32, loomSum, r->comm, NULL);
    if (r->res != loomSuccess) snprintf(r->text, sizeof(r->text), "%s", loomGetLastError(NULL));
    return NULL;
}

static void *run_split(void *p)
{
    runner_t *r = p;
    atomic_store(&r->started, 1);
    r->res = loomCommSplit(r->comm, 0, 0, &r->child, NULL);
    if (r->res != loomSuccess) snprintf(r->text, sizeof(r->text), "%s", loomGetLastError(NULL));
    return NULL;
}

static const char *const life_name[LIFE_CALLS] = {
    "loomCommDestroy",          "loomCommSplit", "loomCommFinalize", "loomCommWindowRegister",
    "loomCommWindowDeregister", "loomCommShrink"};

static loomResult_t life_call(loomComm_t comm, int k, int rank)
{
    static char buf[64];
    loomComm_t nc = NULL;
    loomWindow_t w = NULL;
    int other = 1 - rank;
    switch (k) {
    case 0: return loomCommDestroy(comm);
    case 1: return loomCommSplit(comm, 0, rank, &nc, NULL);
    case 2: return loomCommFinalize(comm);
    case 3: return loomCommWindowRegister(comm, buf, sizeof(buf), &w, LOOM_WIN_DEFAULT);
    case 4: return loomCommWindowDeregister(comm, (loomWindow_t)(void *)buf);
    default: return loomCommShrink(comm, &other, 1, &nc, NULL, LOOM_SHRINK_DEFAULT);
    }
}

static int lifecycle_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    for (int k = 0; k < LIFE_CALLS; k++) {
        if (rank == 1) {
            usleep(LATE_US);
            int32_t x = 1, sum = 0;
            if (loomAllReduce(&x, &sum, 1, loomInt32, loomSum, comm, NULL) != loomSuccess ||
                sum != nranks)
                return 50 + k;
            continue;
        }
        runner_t r = {.comm = comm, .nranks = nranks};
        pthread_t t;
        pthread_create(&t, NULL, run_allreduce, &r);
        while (!atomic_load(&r.started))
            usleep(1000);
        usleep(200000); /* well inside the allreduce, which waits for rank 1 */
        loomResult_t res = life_call(comm, k, rank);
        char text[512];
        snprintf(text, sizeof(text), "%s", loomGetLastError(NULL));
        pthread_join(t, NULL);
        fprintf(stderr, "rank %d: %s against a running loomAllReduce: %d '%s'\n", rank,
                life_name[k], (int)res, text);
        if (res != loomInvalidUsage) return 10 + k;
        char want[96];
        snprintf(want, sizeof(want), "%s on thread", life_name[k]);
        if (!strstr(text, want) || !strstr(text, "while loomAllReduce runs on thread"))
            return 30 + k;
        if (r.res != loomSuccess || r.sum != nranks) {
            fprintf(stderr, "rank %d: the racing allreduce: %d (%s), sum %d\n", rank, (int)r.res,
                    r.text, (int)r.sum);
            return 50 + k;
        }
    }
    /* The reverse: rank 0's split waits for rank 1's; an allreduce on rank 0 meanwhile is
     * refused naming the split, and the split then completes on both. */
    loomComm_t child = NULL;
    if (rank == 1) {
        usleep(LATE_US);
        if (loomCommSplit(comm, 0, 0, &child, NULL) != loomSuccess) return 70;
    } else {
        runner_t r = {.comm = comm, .nranks = nranks};
        pthread_t t;
        pthread_create(&t, NULL, run_split, &r);
        while (!atomic_load(&r.started))
            usleep(1000);
        usleep(200000);
        int32_t x = 1, sum = 0;
        loomResult_t res = loomAllReduce(&x, &sum, 1, loomInt32, loomSum, comm, NULL);
        char text[512];
        snprintf(text, sizeof(text), "%s", loomGetLastError(NULL));
        pthread_join(t, NULL);
        fprintf(stderr, "rank 0: loomAllReduce against a running loomCommSplit: %d '%s'\n",
                (int)res, text);
        if (res != loomInvalidUsage) return 71;
        if (!strstr(text, "loomAllReduce on thread") ||
            !strstr(text, "while loomCommSplit runs on thread"))
            return 72;
        if (r.res != loomSuccess) {
            fprintf(stderr, "rank 0: the split: %d (%s)\n", (int)r.res, r.text);
            return 73;
        }
        child = r.child;
    }
    /* Both communicators still work exactly. */
    loomComm_t cs[2] = {comm, child};
    for (int i = 0; i < 2; i++) {
        int32_t x = rank + 1, sum = 0;
        if (loomAllReduce(&x, &sum, 1, loomInt32, loomSum, cs[i], NULL) != loomSuccess ||
            sum != nranks * (nranks + 1) / 2)
            return 74 + i;
    }
    return loomCommDestroy(child) == loomSuccess ? 0 : 76;
}

START_TEST(lifecycle_against_running_call)
{
    setenv("LOOM_TIMEOUT", "10", 1);
    int status[2];
    int failed = h_run_procs(2, lifecycle_rank, NULL, 60, status);
    ck_assert_msg(failed == 0,
                  "rank statuses %d %d (10+k call k not refused, 30+k wrong text, 50+k the racing "
                  "allreduce, 70s the split/allreduce reverse)",
                  status[0], status[1]);
}
END_TEST

/* loomCommAbort is the call meant for another thread while one hangs: it never claims. The
 * peer never joins; the abort ends the blocked allreduce at once. */
static int abort_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)nranks;
    (void)arg;
    if (rank == 1) {
        usleep(4000000);
        return 0;
    }
    runner_t r = {.comm = comm, .nranks = 2};
    pthread_t t;
    pthread_create(&t, NULL, run_allreduce, &r);
    while (!atomic_load(&r.started))
        usleep(1000);
    usleep(200000);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    loomResult_t res = loomCommAbort(comm);
    pthread_join(t, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "rank 0: abort %d, the blocked allreduce %d after %.2f s: %s\n", (int)res,
            (int)r.res, s, r.text);
    if (res != loomSuccess) return 1;
    if (r.res == loomSuccess) return 2;
    return s < 3 ? 0 : 3;
}

START_TEST(abort_from_another_thread)
{
    setenv("LOOM_TIMEOUT", "20", 1); /* nothing but the abort may end the blocked call */
    int status[2];
    int failed = h_run_procs(2, abort_rank, NULL, 60, status);
    ck_assert_msg(failed == 0, "rank statuses %d %d", status[0], status[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("thread");
    TCase *tc = tcase_create("thread");
    tcase_set_timeout(tc, 150);
    tcase_add_test(tc, two_threads_on_one_communicator);
    tcase_add_test(tc, one_thread_per_communicator);
    tcase_add_test(tc, lifecycle_against_running_call);
    tcase_add_test(tc, abort_from_another_thread);
    suite_add_tcase(s, tc);
    return h_check_main(s, false, CK_NORMAL);
}
