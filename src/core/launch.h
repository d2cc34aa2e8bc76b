/*
 * Launch from a launcher's environment (launch.c): which launcher started this process, its rank,
 * size and local rank, and how the ranks meet (PMIx, MASTER_ADDR/MASTER_PORT, or alone).
 */
#ifndef LOOM_LAUNCH_H
#define LOOM_LAUNCH_H

#include <stdbool.h>

#include "base.h"
#include "loom.h"

/* How the environment is read: getenv in the library, a table in the tests. Returns NULL for an
 * unset variable. */
typedef const char *(*launch_env_fn)(void *arg, const char *name);

typedef enum {
    LAUNCH_MEET_ALONE,   /* one rank: a local unique id */
    LAUNCH_MEET_MASTER,  /* rank 0 serves the rendezvous at MASTER_ADDR:MASTER_PORT */
    LAUNCH_MEET_PMIX,    /* rank 0's unique id travels through the launcher's PMIx server */
    LAUNCH_MEET_ID_FILE, /* LOOM_RANK's ranks: rank 0 writes the id to LOOM_ID_FILE (loom-perf) */
    LAUNCH_MEET_MPI,     /* rank 0's unique id broadcast over MPI_COMM_WORLD (loom_mpi.c) */
    LAUNCH_MEET_PMI1,    /* rank 0's unique id through a PMI-1 server: MPICH's Hydra (pmi1.c) */
} launch_meet_t;

typedef struct {
    bool found;       /* a launcher's variables are present */
    const char *name; /* the launcher that gives rank and size: "Open MPI", "Slurm", ... */
    const char *vars; /* the variables they came from: "SLURM_PROCID/SLURM_NTASKS" */
    int rank, nranks; /* nranks -1: only the PMIx server knows it (PMIX_RANK alone) */
    int local_rank;   /* -1 when the launcher gives none */
    launch_meet_t meet;
    const char *master_addr, *master_port; /* LAUNCH_MEET_MASTER: the environment's strings */
} launch_env_t;

/* Reads the launchers' variables through env in the order of precedence documented in launch.c,
 * validates every number and checks that launchers describing the same job agree. Without any
 * launcher variable, out->found is false and the result is loomSuccess. Errors are logged here;
 * the strings in out point into env's storage. */
loomResult_t launch_detect(launch_env_fn env, void *arg, launch_env_t *out);

/* The unique id, rank and size of a process started by a launcher (loomCommInitFromEnv):
 * launch_detect on the process environment, then the rendezvous it chose. Collective over the
 * launcher's job under PMIx (a fence). */
loomResult_t launch_uid_from_env(loomUniqueId *id, int *rank, int *nranks);

/* pmi1.c: the rendezvous through the PMI-1 server at PMI_FD or PMI_PORT (collective over the
 * launcher's job: a barrier), and the reset of its lock in a forked child. */
loomResult_t launch_pmi1_meet(const launch_env_t *e, loomUniqueId *id, int *nranks);
void pmi1_atfork_child(void);

#ifdef LOOM_HAVE_MPI
/* loom_mpi.c: whether MPI runs (initialised, not finalised), and the rendezvous over
 * MPI_COMM_WORLD (initialising MPI unless the program did), checked against the launcher's
 * rank and size (want_size -1: unknown). */
bool launch_mpi_running(void);
loomResult_t launch_mpi_meet(const char *launcher, const char *vars, int want_rank, int want_size,
                             loomUniqueId *id, int *nranks);
#endif

#endif
