/* Local or launched ranks for the benchmark tools (ranks.h). */
#include "ranks.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom_internal.h"

double ranks_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double ranks_max(loomComm_t comm, double x)
{
    double y = x;
    if (loomAllReduce(&y, &y, 1, loomFloat64, loomMax, comm, NULL) != loomSuccess) return -1;
    return y;
}

static int one_rank(const char *prog, loomComm_t comm, ranks_fn fn, void *arg)
{
    int rank = 0, nranks = 1;
    loomCommUserRank(comm, &rank);
    loomCommCount(comm, &nranks);
    int rc = fn(comm, rank, nranks, arg);
    if (loomCommDestroy(comm) != loomSuccess) {
        fprintf(stderr, "%s: rank %d: loomCommDestroy: %s\n", prog, rank, loomGetLastError(NULL));
        if (rc < 2) rc = 2;
    }
    fflush(stdout);
    return rc;
}

int ranks_run(const char *prog, int k, ranks_fn fn, void *arg)
{
    launch_env_t env = {.found = false};
    if (k == 0 && loom_launch_detect(&env) != loomSuccess) {
        fprintf(stderr, "%s: %s\n", prog, loomGetLastError(NULL));
        return 2;
    }
    if (env.found) {
        loomComm_t comm;
        if (loomCommInitFromEnv(&comm, NULL) != loomSuccess) {
            fprintf(stderr, "%s: loomCommInitFromEnv: %s\n", prog, loomGetLastError(NULL));
            return 2;
        }
        return one_rank(prog, comm, fn, arg);
    }
    if (k < 1) k = 1;
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess) {
        fprintf(stderr, "%s: loomGetUniqueId: %s\n", prog, loomGetLastError(NULL));
        return 2;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid(), *pids = calloc((size_t)k, sizeof(pid_t));
    if (!pids) return 2;
    for (int r = 0; r < k; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            for (int q = 0; q < r; q++)
                kill(pids[q], SIGKILL);
            free(pids);
            return 2;
        }
        if (pid == 0) {
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(2);
            loomComm_t comm;
            if (loomCommInitRank(&comm, k, id, r) != loomSuccess) {
                fprintf(stderr, "%s: rank %d: loomCommInitRank: %s\n", prog, r,
                        loomGetLastError(NULL));
                _exit(2);
            }
            _exit(one_rank(prog, comm, fn, arg));
        }
        pids[r] = pid;
    }
    int rc = 0;
    for (int n = 0; n < k; n++) {
        int st;
        pid_t pid = wait(&st);
        if (pid < 0) break;
        int r = 0;
        while (r < k && pids[r] != pid)
            r++;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 2;
        if (WIFSIGNALED(st))
            fprintf(stderr, "%s: rank %d (pid %d) was killed by signal %d\n", prog, r, (int)pid,
                    WTERMSIG(st));
        if (code > rc) rc = code;
    }
    free(pids);
    return rc;
}
