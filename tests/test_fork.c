/*
 * Fork safety: a child forked while loom's threads (the application's, the bootstrap root) hold
 * loom's process-wide locks must still be able to use loom, and must not keep the sockets of
 * its parent's root thread. Every wait has a deadline: a child that blocks is killed and fails
 * the test instead of hanging the suite.
 */
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base.h"
#include "comm.h"
#include "harness.h"
#include "loom.h"
#include "param.h"

#define FORKS 200
#define CHILD_LIMIT_MS 5000

static atomic_bool hammer_stop;

/* Takes the log, error-text and parameter locks as often as it can. */
static void *hammer(void *arg)
{
    (void)arg;
    while (!atomic_load(&hammer_stop)) {
        TRACE(LOG_INIT, "fork test: hammering the log lock");
        base_error(loomInternalError, LOG_INIT, "fork test: hammering the error lock");
        param_forget(PARAM_TIMEOUT);
        (void)param_double(PARAM_TIMEOUT);
        (void)loomGetLastError(NULL);
    }
    return NULL;
}

/* Waits for pid up to limit_ms; kills it past that. Returns its status, or -1 when killed. */
static int wait_bounded(pid_t pid, int limit_ms)
{
    for (int waited = 0; waited < limit_ms; waited++) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

START_TEST(fork_while_locks_are_held)
{
    char logfile[] = "/tmp/loom-fork-test-XXXXXX";
    int lfd = mkstemp(logfile);
    ck_assert_int_ge(lfd, 0);
    close(lfd);
    setenv("LOOM_DEBUG", "TRACE", 1);
    setenv("LOOM_DEBUG_FILE", logfile, 1);
    param_reset_cache();
    loomUniqueId id;
    ck_assert_int_eq(loomGetUniqueId(&id), loomSuccess);
    pthread_t t;
    atomic_store(&hammer_stop, false);
    ck_assert_int_eq(pthread_create(&t, NULL, hammer, NULL), 0);
    int hung = 0, failed = 0;
    for (int i = 0; i < FORKS; i++) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            /* Each of these takes one of the locks the hammer holds. */
            TRACE(LOG_INIT, "fork test: child %d logs", i);
            base_error(loomInternalError, LOG_INIT, "fork test: child %d sets an error", i);
            param_forget(PARAM_TIMEOUT);
            (void)param_double(PARAM_TIMEOUT);
            (void)loomGetLastError(NULL);
            _exit(0);
        }
        int st = wait_bounded(pid, CHILD_LIMIT_MS);
        if (st == -1)
            hung++;
        else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
        if (hung) break;
    }
    atomic_store(&hammer_stop, true);
    pthread_join(t, NULL);
    unlink(logfile);
    unsetenv("LOOM_DEBUG");
    unsetenv("LOOM_DEBUG_FILE");
    param_reset_cache();
    ck_assert_msg(hung == 0, "a forked child blocked on one of loom's locks for %d ms",
                  CHILD_LIMIT_MS);
    ck_assert_msg(failed == 0, "%d forked children failed", failed);
}
END_TEST

/* Counts the listening sockets among the process's descriptors. */
static int listening_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
        int on = 0;
        socklen_t len = sizeof(on);
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on) n++;
    }
    closedir(d);
    return n;
}

START_TEST(child_keeps_no_root_listener)
{
    int before = listening_sockets();
    loomUniqueId id;
    ck_assert_int_eq(loomGetUniqueId(&id), loomSuccess);
    ck_assert_int_eq(listening_sockets(), before + 1);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    /* Exit codes: 0 fine, 1 the root's listener is still open in the child. */
    if (pid == 0) _exit(listening_sockets() == before ? 0 : 1);
    int st = wait_bounded(pid, CHILD_LIMIT_MS);
    ck_assert_msg(st != -1, "the child did not exit");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "the forked child still holds its parent's bootstrap root listener");
    /* The parent's root is untouched by the child's closing its copy. */
    ck_assert_int_eq(listening_sockets(), before + 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fork");
    TCase *tc = tcase_create("fork");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fork_while_locks_are_held);
    tcase_add_test(tc, child_keeps_no_root_listener);
    suite_add_tcase(s, tc);
    return h_check_main(s, false, CK_NORMAL);
}
