/*
 * Starting from MPI: loomCommInitMpi (include/loom_mpi.h), and the rendezvous of
 * loomCommInitFromEnv in a program that runs under MPI (launch.c). Both broadcast rank 0's
 * unique id, and with it the job's secret, over loom's duplicate of the communicator.
 */
#include <string.h>

#include "comm.h"
#include "launch.h"
#include "loom_mpi.h"
#include "mpi_lib.h"

/* The unique id of the ranks of c: made by rank 0, broadcast with its result so that a failure
 * there fails every rank instead of leaving them waiting. */
static loomResult_t mpi_meet(MPI_Comm c, const char *what, loomUniqueId *id, int *rank, int *size)
{
    LOOM_CHECK(mpi_lib_up());
    LOOM_CHECK(mpi_lib_thread_ok(what));
    MPI_Comm dup;
    LOOM_CHECK(mpi_lib_add_base(c, &dup));
    struct {
        int32_t res;
        loomUniqueId id;
    } msg;
    memset(&msg, 0, sizeof(msg));
    mpi_lib_lock();
    MPI_Comm_rank(dup, rank);
    MPI_Comm_size(dup, size);
    mpi_lib_unlock();
    if (*rank == 0) msg.res = boot_uid_create(&msg.id);
    mpi_lib_lock();
    int rc = MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, 0, dup);
    mpi_lib_unlock();
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING];
        return base_error(loomSystemError, LOG_BOOT, "%s: MPI_Bcast of the unique id: %s", what,
                          mpi_lib_error_string(rc, e, sizeof(e)));
    }
    if (msg.res != loomSuccess)
        return *rank == 0 ? (loomResult_t)msg.res
                          : base_error((loomResult_t)msg.res, LOG_BOOT,
                                       "%s: rank 0 could not make the unique id", what);
    *id = msg.id;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommInitMpiConfig(loomComm_t *comm, MPI_Comm mpiComm,
                                               loomConfig_t *config)
{
    base_clear_error();
    if (comm == NULL)
        return base_error(loomInvalidArgument, LOG_INIT, "loomCommInitMpi: comm is NULL");
    if (!mpi_lib_running())
        return base_error(loomInvalidUsage, LOG_INIT,
                          "loomCommInitMpi: MPI is not initialised (call MPI_Init or "
                          "MPI_Init_thread first), or already finalised");
    if (mpiComm == MPI_COMM_NULL)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommInitMpi: mpiComm is MPI_COMM_NULL");
    loomUniqueId id;
    int rank, size;
    LOOM_CHECK(mpi_meet(mpiComm, "loomCommInitMpi", &id, &rank, &size));
    INFO(LOG_BOOT, "loomCommInitMpi: rank %d of %d met through MPI", rank, size);
    return loomCommInitRankConfig(comm, size, id, rank, config);
}

LOOM_EXPORT loomResult_t loomCommInitMpi(loomComm_t *comm, MPI_Comm mpiComm)
{
    return loomCommInitMpiConfig(comm, mpiComm, NULL);
}

bool launch_mpi_running(void)
{
    return mpi_lib_running();
}

loomResult_t launch_mpi_meet(const char *launcher, const char *vars, int want_rank, int want_size,
                             loomUniqueId *id, int *nranks)
{
    int rank, size;
    LOOM_CHECK(mpi_meet(MPI_COMM_WORLD, "loomCommInitFromEnv", id, &rank, &size));
    if (rank != want_rank || (want_size > 0 && size != want_size))
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "launchers disagree: %s says rank %d of %d (%s) but MPI_COMM_WORLD "
                          "says rank %d of %d",
                          launcher, want_rank, want_size, vars, rank, size);
    INFO(LOG_BOOT, "rank %d of %d met through MPI (MPI_COMM_WORLD, %s)", rank, size,
         mpi_lib_level_name());
    *nranks = size;
    return loomSuccess;
}
