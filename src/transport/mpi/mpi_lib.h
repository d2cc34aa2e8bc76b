/*
 * The process's MPI as loom uses it (src/transport/mpi/mpi.c): initialised by the application or
 * by loom, its thread level, the lock that serialises loom's MPI calls where the level is below
 * MPI_THREAD_MULTIPLE, and the communicators that loom duplicated to carry its messages.
 *
 * Thread rule: at MPI_THREAD_MULTIPLE loom calls MPI from any thread, its progress thread
 * included. Below it, loom calls MPI only inside a loom call, on the calling thread, holding
 * one process-wide lock; its progress thread never calls MPI (device collectives, which need
 * it, are refused on the mpi transport); under MPI_THREAD_FUNNELED and MPI_THREAD_SINGLE the
 * loom call must come from the thread that initialised MPI; under MPI_THREAD_SERIALIZED the
 * application must not call MPI from another thread while a loom call runs.
 */
#ifndef LOOM_TRANSPORT_MPI_LIB_H
#define LOOM_TRANSPORT_MPI_LIB_H

#include <mpi.h>
#include <stdbool.h>

#include "loom.h"

/* Whether MPI is initialised and not yet finalised (by anyone). */
bool mpi_lib_running(void);
/* Makes MPI usable: initialises it (asking for MPI_THREAD_MULTIPLE, finalised at exit) unless
 * the application did, and reads the granted thread level. */
loomResult_t mpi_lib_up(void);
/* Checks that this thread may call MPI now (see the rule above); `what` names the caller. */
loomResult_t mpi_lib_thread_ok(const char *what);
/* The lock around each of loom's MPI calls (no-op at MPI_THREAD_MULTIPLE). */
void mpi_lib_lock(void);
void mpi_lib_unlock(void);
/* "MPI_THREAD_MULTIPLE" etc. for the granted level. */
const char *mpi_lib_level_name(void);
/* Duplicates `comm` for loom's messages, collectively over its ranks (at most once per
 * communicator's group; later calls with the same group reuse it); *dup (may be NULL) gets the
 * duplicate, which loom keeps until MPI is finalised. */
loomResult_t mpi_lib_add_base(MPI_Comm comm, MPI_Comm *dup);
/* The text of an MPI error code. */
const char *mpi_lib_error_string(int code, char *buf, int len);

#endif
