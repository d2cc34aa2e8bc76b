/*
 * The progress engine (src/core/progress.c) and core's non-blocking internal entry (coll.h):
 * the process's progress thread calls what is attached, sleeps when told, wakes when woken, and
 * detach returns only once a poll function has stopped; host collectives started on it by
 * coll_start and advanced by coll_test from a poll function give exact results and the same
 * errors as blocking calls, with the ranks' own threads doing nothing but wait.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"
#include "comm.h"
#include "harness.h"
#include "progress.h"
#include "schedule.h"

/* ---- the thread itself ---- */

typedef struct {
    atomic_int calls;
    atomic_int on_thread; /* calls made on the progress thread */
    uint64_t hint;
    atomic_int inside; /* set while the poll function runs */
    int hold_us;       /* how long each call takes */
} counter_t;

static uint64_t count_poll(void *arg, bool *progressed)
{
    counter_t *c = arg;
    atomic_store(&c->inside, 1);
    atomic_fetch_add(&c->calls, 1);
    if (progress_on_thread()) atomic_fetch_add(&c->on_thread, 1);
    if (c->hold_us) usleep((useconds_t)c->hold_us);
    *progressed = false;
    atomic_store(&c->inside, 0);
    return c->hint;
}

START_TEST(thread_calls_attached)
{
    counter_t c = {.hint = 1000000}; /* every millisecond */
    ck_assert_int_eq(progress_attach(count_poll, &c, 0, 0), loomSuccess);
    usleep(100000);
    progress_detach(&c);
    int n = atomic_load(&c.calls);
    /* ~100 calls in 100 ms; a loose bound both ways (a loaded machine) */
    ck_assert_msg(n >= 10 && n <= 2000, "%d calls in 100 ms at 1 ms intervals", n);
    ck_assert_int_eq(atomic_load(&c.on_thread), n);
    usleep(20000);
    ck_assert_int_eq(atomic_load(&c.calls), n); /* detached: never again */
    ck_assert(!progress_on_thread());
}
END_TEST

START_TEST(thread_sleeps_until_woken)
{
    counter_t c = {.hint = UINT64_MAX};
    ck_assert_int_eq(progress_attach(count_poll, &c, 0, 0), loomSuccess);
    usleep(50000);
    int idle = atomic_load(&c.calls);
    usleep(100000);
    /* asleep: no call without a wake-up (a stray one from another attachment is allowed) */
    ck_assert_int_le(atomic_load(&c.calls) - idle, 2);
    for (int i = 0; i < 5; i++) {
        int before = atomic_load(&c.calls);
        progress_wake();
        for (int t = 0; t < 2000 && atomic_load(&c.calls) == before; t++)
            usleep(1000);
        ck_assert_int_gt(atomic_load(&c.calls), before);
    }
    progress_detach(&c);
}
END_TEST

START_TEST(detach_waits_for_running_poll)
{
    counter_t c = {.hint = 0, .hold_us = 20000};
    ck_assert_int_eq(progress_attach(count_poll, &c, 0, 0), loomSuccess);
    for (int t = 0; t < 2000 && atomic_load(&c.calls) == 0; t++)
        usleep(1000);
    for (int i = 0; i < 20; i++) {
        usleep(3000);
        progress_detach(&c);
        ck_assert_int_eq(atomic_load(&c.inside), 0);
        ck_assert_int_eq(progress_attach(count_poll, &c, 0, 0), loomSuccess);
    }
    progress_detach(&c);
    ck_assert_int_eq(atomic_load(&c.inside), 0);
}
END_TEST

/* A poll function that detaches itself from the progress thread. */
static uint64_t self_detach_poll(void *arg, bool *progressed)
{
    counter_t *c = arg;
    atomic_fetch_add(&c->calls, 1);
    progress_detach(c);
    *progressed = true;
    return 0;
}

START_TEST(poll_detaches_itself)
{
    counter_t c = {0};
    counter_t other = {.hint = 1000000};
    ck_assert_int_eq(progress_attach(count_poll, &other, 0, 0), loomSuccess);
    ck_assert_int_eq(progress_attach(self_detach_poll, &c, 0, 0), loomSuccess);
    usleep(50000);
    ck_assert_int_eq(atomic_load(&c.calls), 1);
    int n = atomic_load(&other.calls);
    usleep(20000);
    ck_assert_int_gt(atomic_load(&other.calls), n); /* the others still run */
    progress_detach(&other);
}
END_TEST

/* Work whose descriptors never fire, watched by the thread. */
static int silent_pollfds(prog_work_t *w, struct pollfd *fds, int max)
{
    (void)w;
    (void)fds;
    (void)max;
    return 0;
}

/* One poll function asks to be called again at once (it waits on watched work, the network)
 * while another asks for a short sleep (it waits on the GPU): the short sleep is kept, the
 * thread does not block for PROGRESS_BLOCK_MS on the watched descriptors. */
START_TEST(short_sleep_kept_beside_watched_work)
{
    prog_work_t silent = {.pollfds = silent_pollfds};
    counter_t net = {.hint = 0}, gpu = {.hint = 1000000};
    progress_watch(&silent);
    ck_assert_int_eq(progress_attach(count_poll, &net, 0, 0), loomSuccess);
    ck_assert_int_eq(progress_attach(count_poll, &gpu, 0, 0), loomSuccess);
    usleep(200000);
    int n = atomic_load(&gpu.calls);
    progress_detach(&gpu);
    progress_detach(&net);
    progress_unwatch(&silent);
    /* ~200 calls at 1 ms; blocking 100 ms at a time would give about 2 */
    ck_assert_msg(n >= 20, "%d calls in 200 ms at 1 ms intervals", n);
}
END_TEST

/* ---- progress_drive ---- */

typedef struct {
    prog_work_t work;
    int advances, checks, steps_left;
    bool fail_check;
} fake_work_t;

static loomResult_t fake_advance(prog_work_t *w, bool *done, bool *progressed)
{
    fake_work_t *f = (fake_work_t *)w;
    f->advances++;
    if (f->steps_left > 0 && f->advances % 3 == 0) {
        f->steps_left--;
        *progressed = true;
    }
    *done = f->steps_left == 0;
    return loomSuccess;
}

static int fake_pollfds(prog_work_t *w, struct pollfd *fds, int max)
{
    (void)w;
    (void)fds;
    (void)max;
    return 0; /* nothing to watch: each blocked wait lasts PROGRESS_BLOCK_MS */
}

static loomResult_t fake_check(prog_work_t *w)
{
    fake_work_t *f = (fake_work_t *)w;
    f->checks++;
    if (f->fail_check)
        return base_error(loomRemoteError, LOG_COLL, "fake: no sign of life from rank 7");
    return loomSuccess;
}

START_TEST(drive_spins_then_checks)
{
    fake_work_t f = {.work = {fake_advance, fake_pollfds, fake_check, 1000000000ull},
                     .steps_left = 4};
    ck_assert_int_eq(progress_drive(&f.work), loomSuccess);
    ck_assert_int_eq(f.steps_left, 0);
    ck_assert_int_eq(f.checks, 0); /* a second of spinning: never idle long enough */
    fake_work_t g = {.work = {fake_advance, fake_pollfds, fake_check, 0}, .steps_left = 2};
    ck_assert_int_eq(progress_drive(&g.work), loomSuccess);
    ck_assert_int_ge(g.checks, 1); /* no spinning: checked at every idle turn */
}
END_TEST

START_TEST(drive_stops_at_check_error)
{
    fake_work_t f = {.work = {fake_advance, fake_pollfds, fake_check, 0},
                     .steps_left = 1000000,
                     .fail_check = true};
    ck_assert_int_eq(progress_drive(&f.work), loomRemoteError);
    ck_assert_int_eq(f.checks, 1);
    ck_assert_ptr_nonnull(strstr(base_last_error(), "rank 7"));
}
END_TEST

/* ---- collectives on the progress thread (coll_start / coll_test) ---- */

typedef struct {
    loomComm_t comm;
    coll_op_t ops[3];
    int nops;
    coll_group_t *g;
    atomic_int state; /* 0 not started, 1 running, 2 done */
    loomResult_t res;
    char err[512];
} async_job_t;

static uint64_t async_poll(void *arg, bool *progressed)
{
    async_job_t *a = arg;
    if (atomic_load(&a->state) == 2) return UINT64_MAX;
    if (atomic_load(&a->state) == 0) {
        a->res = coll_start(a->ops, a->nops, &a->g);
        atomic_store(&a->state, a->res == loomSuccess ? 1 : 2);
        *progressed = true;
        return 0;
    }
    bool done = false;
    loomResult_t r = coll_test(a->g, &done);
    if (done) {
        a->res = r;
        if (r != loomSuccess) snprintf(a->err, sizeof(a->err), "%s", base_last_error());
        atomic_store(&a->state, 2);
        *progressed = true;
        return UINT64_MAX;
    }
    return 0;
}

static loomResult_t async_wait(async_job_t *a)
{
    ck_assert_int_eq(progress_attach(async_poll, a, 0, 0), loomSuccess);
    for (int t = 0; t < 60000 && atomic_load(&a->state) != 2; t++)
        usleep(1000);
    progress_detach(a);
    ck_assert_int_eq(atomic_load(&a->state), 2);
    return a->res;
}

/* Every rank's thread only waits while the progress thread runs its allreduce, broadcast and
 * allgather (one group): exact sums, in place and out of place. */
static int rank_async_group(loomComm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    enum { N = 10007 };
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float));
    int32_t *bc = malloc(N * sizeof(int32_t));
    uint8_t *ag = malloc((size_t)p * 16);
    for (int i = 0; i < N; i++) {
        a[i] = (float)(rank + 1) * (float)(i % 64);
        bc[i] = rank == 1 % p ? i * 3 : -1;
    }
    for (int k = 0; k < 16; k++)
        ag[rank * 16 + k] = (uint8_t)(rank * 16 + k);
    async_job_t job = {.comm = comm, .nops = 3};
    job.ops[0] =
        (coll_op_t){comm, OPK_ALLREDUCE, a, b, N, loomFloat32, loomSum, -1, NULL, false, 0};
    job.ops[1] =
        (coll_op_t){comm, OPK_BROADCAST, bc, bc, N, loomInt32, loomSum, 1 % p, NULL, false, 0};
    job.ops[2] = (coll_op_t){comm, OPK_ALLGATHER, ag + rank * 16, ag, 16, loomUint8, loomSum,
                             -1,   NULL,          false,          0};
    loomResult_t r = async_wait(&job);
    int bad = r != loomSuccess;
    if (bad) fprintf(stderr, "rank %d: %s\n", rank, job.err);
    float total = (float)(p * (p + 1) / 2);
    for (int i = 0; i < N && !bad; i++)
        bad = b[i] != total * (float)(i % 64) || bc[i] != i * 3;
    for (int k = 0; k < p * 16 && !bad; k++)
        bad = ag[k] != (uint8_t)k;
    free(a);
    free(b);
    free(bc);
    free(ag);
    return bad;
}

START_TEST(async_group_exact)
{
    for (int p = 1; p <= 4; p++)
        ck_assert_int_eq(h_run_threads(p, rank_async_group, NULL), 0);
}
END_TEST

/* Ranks that disagree fail on the progress thread with the blocking call's error. */
static int rank_async_mismatch(loomComm_t comm, int rank, int p, void *arg)
{
    (void)p;
    (void)arg;
    int32_t v[64] = {0};
    async_job_t job = {.comm = comm, .nops = 1};
    job.ops[0] = (coll_op_t){comm, OPK_ALLREDUCE, v,     v, rank == 0 ? 64 : 32, loomInt32, loomSum,
                             -1,   NULL,          false, 0};
    loomResult_t r = async_wait(&job);
    if (r == loomSuccess || strstr(job.err, "mismatch") == NULL) {
        fprintf(stderr, "rank %d: expected a mismatch, got %d: %s\n", rank, r, job.err);
        return 1;
    }
    /* the communicator is broken afterwards, as after a blocking failure */
    loomResult_t a = loomSuccess;
    loomCommGetAsyncError(comm, &a);
    return a == loomSuccess;
}

START_TEST(async_mismatch_named)
{
    ck_assert_int_eq(h_run_threads(2, rank_async_mismatch, NULL), 0);
}
END_TEST

/* An aborted communicator runs nothing more: coll_start's group ends with its error. */
static int rank_async_after_abort(loomComm_t comm, int rank, int p, void *arg)
{
    (void)rank;
    (void)p;
    (void)arg;
    comm_set_error(comm, loomRemoteError, "rank 9 died (test)");
    int32_t v[8] = {0};
    async_job_t job = {.comm = comm, .nops = 1};
    job.ops[0] = (coll_op_t){comm, OPK_ALLREDUCE, v, v, 8, loomInt32, loomSum, -1, NULL, false, 0};
    loomResult_t r = async_wait(&job);
    return r != loomRemoteError || strstr(job.err, "rank 9 died") == NULL;
}

START_TEST(async_broken_comm)
{
    ck_assert_int_eq(h_run_threads(2, rank_async_after_abort, NULL), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("progress");
    TCase *t = tcase_create("thread");
    tcase_add_test(t, thread_calls_attached);
    tcase_add_test(t, thread_sleeps_until_woken);
    tcase_add_test(t, detach_waits_for_running_poll);
    tcase_add_test(t, poll_detaches_itself);
    tcase_add_test(t, short_sleep_kept_beside_watched_work);
    tcase_set_timeout(t, 60);
    suite_add_tcase(s, t);
    TCase *d = tcase_create("drive");
    tcase_add_test(d, drive_spins_then_checks);
    tcase_add_test(d, drive_stops_at_check_error);
    tcase_set_timeout(d, 60);
    suite_add_tcase(s, d);
    TCase *c = tcase_create("async");
    tcase_add_test(c, async_group_exact);
    tcase_add_test(c, async_mismatch_named);
    tcase_add_test(c, async_broken_comm);
    tcase_set_timeout(c, 120);
    suite_add_tcase(s, c);
    return h_check_main(s, false, CK_NORMAL);
}
