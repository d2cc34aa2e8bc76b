/* Test harnesses: a job of n ranks as threads of this process (fast grids) or as forked
 * processes (failure tests: a rank can be killed or stopped). */
#ifndef LOOM_TEST_HARNESS_H
#define LOOM_TEST_HARNESS_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "loom.h"

/* A rank's body: returns 0 on success; anything else is a failure (message printed by it). */
typedef int (*h_rank_fn)(loomComm_t comm, int rank, int nranks, void *arg);

/* Runs fn on nranks threads, each with its own communicator of one job (created and destroyed
 * by the harness). Returns the number of ranks that failed (init included). */
int h_run_threads(int nranks, h_rank_fn fn, void *arg);

/* Runs fn in nranks forked processes (communicators made inside the children). Waits at most
 * timeout_s seconds, then kills every child that is left (counted as status -1). status[r] is
 * the child's exit code, or 128+signal. Returns the number of ranks with a non-zero status. */
int h_run_procs(int nranks, h_rank_fn fn, void *arg, int timeout_s, int *status);

/* Forks n processes that each run body(i, the job's unique id, arg) and exit with its result
 * (the id is made after the forks, so that no child inherits a lock of the root's thread: use
 * this, not fork() after loomGetUniqueId). Waits and kills as h_run_procs does. */
typedef int (*h_proc_fn)(int index, const loomUniqueId *id, void *arg);
int h_fork_procs(int n, h_proc_fn body, void *arg, int timeout_s, int *status);

/* Like h_run_procs without communicators: fn gets comm == NULL and the job's unique id in arg
 * position through h_job_id(). */
const loomUniqueId *h_job_id(void);

/* pids of the children of the current h_run_procs call (for killing one from another). */
pid_t h_child_pid(int rank);

/* One Check test case per row: its name, its test, optional tags (tests/meson.build runs some tags
 * again under valgrind), its timeout (0: the table's default) and, for a loop test, the loop
 * count (0: a plain test). */
typedef struct {
    const char *name;
    const TTest *test;
    const char *tags;
    int timeout_s;
    int loops;
} h_case_t;
void h_add_cases(Suite *s, const h_case_t *cases, size_t n, int default_timeout_s);

/* Runs the suite (fork_each: every test in a process of its own even where CK_FORK=no) and
 * returns main's exit status. */
int h_check_main(Suite *s, bool fork_each, enum print_output mode);

/* Small helpers of the failure suites (fail, jobstate, recover, secure). */
double h_now_s(void); /* CLOCK_MONOTONIC in seconds */
/* Zeroed memory that forked ranks write and the test process reads after they exit. */
void *h_shared_map(size_t bytes);
/* The texts of a failed call: the communicator's (the first error that broke it, possibly a
 * peer's forwarded reason) and the thread's (this call's own), joined by " || " when they differ;
 * either may carry the cause. comm may be NULL. */
void h_collect_text(loomComm_t comm, char *out, size_t len);
/* Whether text names rank r as "rank <r>" (and not as the start of "rank <r>5"). */
bool h_names_rank(const char *text, int r);

#endif
