/*
 * loom from MPI: a communicator made of the ranks of an MPI communicator. Needs loom built with
 * MPI (meson option mpi) and an initialised MPI. loom.h does not need this header (nor mpi.h).
 */
#ifndef LOOM_MPI_H
#define LOOM_MPI_H

#include <mpi.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates *comm with the ranks of mpiComm, in its order (rank r of mpiComm is loom's rank r).
 * Collective over mpiComm: rank 0 makes the unique id (which carries the job's secret) and
 * broadcasts it; loom also duplicates mpiComm for its mpi transport (LOOM_TRANSPORT=mpi), which
 * then reaches these ranks. The transports are chosen as for loomCommInitRank. config may be
 * NULL. mpiComm may be freed afterwards. */
loomResult_t loomCommInitMpi(loomComm_t *comm, MPI_Comm mpiComm);
loomResult_t loomCommInitMpiConfig(loomComm_t *comm, MPI_Comm mpiComm, loomConfig_t *config);

#ifdef __cplusplus
}
#endif

#endif
