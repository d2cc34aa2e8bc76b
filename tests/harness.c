#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int rank, nranks;
    loomUniqueId id;
    h_rank_fn fn;
    void *arg;
    int rc;
} h_thread_t;

static loomUniqueId h_id;
/* Read by other threads of the test (h_child_pid, a killer thread) while h_run_procs forks: atomic,
 * and 0 until rank r's child exists (ThreadSanitizer found the plain array racing; a stale or
 * torn pid there could signal an unrelated process). */
static _Atomic pid_t h_pids[4096];

const loomUniqueId *h_job_id(void)
{
    return &h_id;
}
pid_t h_child_pid(int rank)
{
    return atomic_load(&h_pids[rank]);
}

static void *h_thread_main(void *p)
{
    h_thread_t *t = p;
    loomComm_t comm = NULL;
    loomResult_t r = loomCommInitRank(&comm, t->nranks, t->id, t->rank);
    if (r != loomSuccess) {
        fprintf(stderr, "rank %d: init failed: %s: %s\n", t->rank, loomGetErrorString(r),
                loomGetLastError(NULL));
        t->rc = 1;
        return NULL;
    }
    t->rc = t->fn(comm, t->rank, t->nranks, t->arg);
    loomCommDestroy(comm);
    return NULL;
}

int h_run_threads(int nranks, h_rank_fn fn, void *arg)
{
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess) {
        fprintf(stderr, "loomGetUniqueId failed: %s\n", loomGetLastError(NULL));
        return nranks;
    }
    h_thread_t *t = calloc((size_t)nranks, sizeof(*t));
    pthread_t *th = calloc((size_t)nranks, sizeof(*th));
    for (int r = 0; r < nranks; r++) {
        t[r] = (h_thread_t){.rank = r, .nranks = nranks, .id = id, .fn = fn, .arg = arg};
        pthread_create(&th[r], NULL, h_thread_main, &t[r]);
    }
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        pthread_join(th[r], NULL);
        if (t[r].rc) bad++;
    }
    free(t);
    free(th);
    return bad;
}

/* The processes are forked before the job's id exists: loomGetUniqueId starts the root's
 * service thread in this process, and a child forked while that thread holds an allocator lock
 * inherits it locked. glibc's malloc takes its locks around fork(); the AddressSanitizer allocator
 * of gcc 12 does not, and a child's first allocation then waits on that lock forever (the fail
 * suite's two_comms case, and the secure suite's forked ranks, under ASan: stuck in calloc in
 * comm_alloc). So the children wait on a pipe and read the id from a shared page once the parent
 * has closed the pipe's write end. */
typedef struct {
    loomUniqueId id;
    int ok;
} h_start_t;

int h_fork_procs(int n, h_proc_fn body, void *arg, int timeout_s, int *status)
{
    h_start_t *start = h_shared_map(sizeof(*start));
    int gate[2];
    if (pipe(gate) != 0) {
        perror("h_fork_procs: pipe");
        return n;
    }
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < n; i++)
        atomic_store(&h_pids[i], 0);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm((unsigned)timeout_s + 5);
            close(gate[1]);
            char c;
            while (read(gate[0], &c, 1) < 0 && errno == EINTR) {
            }
            close(gate[0]);
            if (!start->ok) _exit(100);
            h_id = start->id;
            int rc = body(i, &h_id, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc);
        }
        h_pids[i] = pid;
        status[i] = -1;
    }
    close(gate[0]);
    if (loomGetUniqueId(&h_id) != loomSuccess)
        fprintf(stderr, "loomGetUniqueId failed: %s\n", loomGetLastError(NULL));
    else
        start->id = h_id, start->ok = 1;
    close(gate[1]);
    time_t end = time(NULL) + timeout_s;
    int left = n, bad = 0;
    while (left > 0) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid > 0) {
            for (int i = 0; i < n; i++)
                if (h_pids[i] == pid) {
                    status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                    left--;
                }
            continue;
        }
        if (time(NULL) >= end) {
            for (int i = 0; i < n; i++)
                if (status[i] == -1) {
                    fprintf(stderr, "process %d (pid %d) did not finish in %d s: killed\n", i,
                            (int)h_pids[i], timeout_s);
                    kill(h_pids[i], SIGCONT);
                    kill(h_pids[i], SIGKILL);
                    waitpid(h_pids[i], NULL, 0);
                }
            break;
        }
        usleep(5000);
    }
    munmap(start, sizeof(*start));
    for (int i = 0; i < n; i++)
        if (status[i] != 0) bad++;
    return bad;
}

/* h_run_procs' body: a communicator of the job, fn, destroy. */
typedef struct {
    int nranks;
    h_rank_fn fn;
    void *arg;
} h_procs_t;

static int h_rank_body(int r, const loomUniqueId *id, void *p)
{
    const h_procs_t *P = p;
    if (P->fn == NULL) return 0;
    loomComm_t comm = NULL;
    loomResult_t res = loomCommInitRank(&comm, P->nranks, *id, r);
    if (res != loomSuccess) {
        fprintf(stderr, "rank %d: init failed: %s\n", r, loomGetLastError(NULL));
        return 100;
    }
    int rc = P->fn(comm, r, P->nranks, P->arg);
    loomCommDestroy(comm);
    return rc;
}

int h_run_procs(int nranks, h_rank_fn fn, void *arg, int timeout_s, int *status)
{
    h_procs_t P = {.nranks = nranks, .fn = fn, .arg = arg};
    return h_fork_procs(nranks, h_rank_body, &P, timeout_s, status);
}

void h_add_cases(Suite *s, const h_case_t *cases, size_t n, int default_timeout_s)
{
    for (size_t i = 0; i < n; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, cases[i].timeout_s ? cases[i].timeout_s : default_timeout_s);
        if (cases[i].tags) tcase_set_tags(tc, cases[i].tags);
        if (cases[i].loops)
            tcase_add_loop_test(tc, cases[i].test, 0, cases[i].loops);
        else
            tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
}

int h_check_main(Suite *s, bool fork_each, enum print_output mode)
{
    SRunner *sr = srunner_create(s);
    if (fork_each) srunner_set_fork_status(sr, CK_FORK);
    srunner_run_all(sr, mode);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

double h_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *h_shared_map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_msg(p != MAP_FAILED, "mmap: %s", strerror(errno));
    memset(p, 0, bytes);
    return p;
}

void h_collect_text(loomComm_t comm, char *out, size_t len)
{
    const char *c = comm ? loomGetLastError(comm) : "";
    const char *t = loomGetLastError(NULL);
    if (c[0] && strcmp(c, t) != 0)
        snprintf(out, len, "%s || %s", c, t);
    else
        snprintf(out, len, "%s", t);
}

bool h_names_rank(const char *text, int r)
{
    char want[32];
    int n = snprintf(want, sizeof(want), "rank %d", r);
    for (const char *p = strstr(text, want); p; p = strstr(p + 1, want))
        if (p[n] < '0' || p[n] > '9') return true;
    return false;
}
