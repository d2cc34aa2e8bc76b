/*
 * The ranks of loom-fusion-bench and loom-tune: under a launcher (mpirun, srun, torchrun: the
 * variables loomCommInitFromEnv reads) this process is one rank; otherwise `-P k` forks k local
 * ranks on loopback, which meet through a unique id made before the fork and die with their
 * parent (PR_SET_PDEATHSIG), as loom-perf's do.
 */
#ifndef LOOM_TOOLS_RANKS_H
#define LOOM_TOOLS_RANKS_H

#include "loom.h"

/* One rank's work on its communicator; returns its exit status (0 fine, 1 results wrong, 2 an
 * error). */
typedef int (*ranks_fn)(loomComm_t comm, int rank, int nranks, void *arg);

/* Runs fn on every rank (k: local ranks to fork when no launcher started this process; 0
 * means 1). The communicator is destroyed after fn. Returns the worst rank's status. */
int ranks_run(const char *prog, int k, ranks_fn fn, void *arg);

/* The maximum of x over the ranks (an allreduce of one double): the number every rank agrees
 * on for a timed section. Negative on a failed call. */
double ranks_max(loomComm_t comm, double x);

/* Wall-clock seconds (CLOCK_MONOTONIC). */
double ranks_now(void);

#endif
