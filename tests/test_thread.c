/*
 * One thread per communicator at a time (NCCL's rule): two threads calling into one
 * communicator at once must get loomInvalidUsage naming both calls, never a silent wrong result
 * or a hang; one thread per communicator, with several communicators, keeps working. Ranks are
 * processes with a deadline (h_run_procs), and LOOM_TIMEOUT is short.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Exit codes: 0 detected, 1 a wrong sum, 2 no misuse reported, 3 reported but not naming both. */
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
    return 2;
}

START_TEST(two_threads_on_one_communicator)
{
    setenv("LOOM_TIMEOUT", "3", 1);
    int status[2];
    int failed = h_run_procs(2, two_threads_one_comm, NULL, 60, status);
    ck_assert_msg(failed == 0, "rank statuses %d %d (1 wrong sum, 2 not reported, 3 text)",
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

int main(void)
{
    Suite *s = suite_create("thread");
    TCase *tc = tcase_create("thread");
    tcase_set_timeout(tc, 150);
    tcase_add_test(tc, two_threads_on_one_communicator);
    tcase_add_test(tc, one_thread_per_communicator);
    suite_add_tcase(s, tc);
    return h_check_main(s, false, CK_NORMAL);
}
