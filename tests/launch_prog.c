/*
 * One rank of a job that a launcher started (tests/launch_mpirun.sh runs it under mpirun): init
 * from the environment twice in a row (each init meets the others afresh), an allreduce whose
 * result is exact, and "launch_prog: rank R of N ok" on success. Built with LAUNCH_PROG_MPI it
 * calls MPI_Init first (or, with LAUNCH_PROG_MPI_LATE set, after the first job) and MPI_Finalize
 * last, so that loom and MPI share the launcher's PMIx client in one process, and checks that
 * loom's ranks are MPI's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "loom.h"
#ifdef LAUNCH_PROG_MPI
#include <mpi.h>
#endif

static int one_job(int round)
{
    loomComm_t comm;
    if (loomCommInitFromEnv(&comm, NULL) != loomSuccess) {
        fprintf(stderr, "launch_prog: loomCommInitFromEnv: %s\n", loomGetLastError(NULL));
        return 1;
    }
    int rank = -1, n = 0;
    loomCommUserRank(comm, &rank);
    loomCommCount(comm, &n);
    /* small integers: the sum is exact in any order */
    enum { COUNT = 1000 };
    static int32_t v[COUNT];
    for (int i = 0; i < COUNT; i++)
        v[i] = (rank + 1) * (i % 7 + 1) + round;
    loomResult_t r = loomAllReduce(v, v, COUNT, loomInt32, loomSum, comm, NULL);
    int bad = r != loomSuccess;
    for (int i = 0; i < COUNT && !bad; i++)
        bad = v[i] != n * (n + 1) / 2 * (i % 7 + 1) + n * round;
    if (bad)
        fprintf(stderr, "launch_prog: rank %d of %d round %d: wrong result (%s)\n", rank, n, round,
                r != loomSuccess ? loomGetLastError(comm) : "values");
    else if (round == 1)
        printf("launch_prog: rank %d of %d ok\n", rank, n);
#ifdef LAUNCH_PROG_MPI
    int mrank = -1, msize = 0, up = 0;
    MPI_Initialized(&up);
    if (!up) goto out;
    MPI_Comm_rank(MPI_COMM_WORLD, &mrank);
    MPI_Comm_size(MPI_COMM_WORLD, &msize);
    if (mrank != rank || msize != n) {
        fprintf(stderr, "launch_prog: loom says rank %d of %d, MPI %d of %d\n", rank, n, mrank,
                msize);
        bad = 1;
    }
out:
#endif
    loomCommDestroy(comm);
    return bad;
}

int main(int argc, char **argv)
{
#ifdef LAUNCH_PROG_MPI
    /* LAUNCH_PROG_MPI_LATE: loom starts the PMIx client, MPI_Init joins it between the jobs */
    int late = getenv("LAUNCH_PROG_MPI_LATE") != NULL;
    int rc = late ? one_job(0) : 0;
    MPI_Init(&argc, &argv);
    rc = rc || (!late && one_job(0)) || one_job(1);
#else
    (void)argc;
    (void)argv;
    int rc = one_job(0) || one_job(1);
#endif
    fflush(stdout);
#ifdef LAUNCH_PROG_MPI
    MPI_Finalize();
#endif
    return rc;
}
