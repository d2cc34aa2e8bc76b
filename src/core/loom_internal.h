/*
 * loom's internal interface for the programs built beside the library that sit above core: the
 * NCCL shim (src/shim, linked with loom's objects), loom-perf and loom-info. They reach the
 * public API through include/loom.h and everything else through this header, never through
 * core's own headers (comm.h is core's alone). What it offers:
 *
 * - base's vocabulary: result texts and logging (base.h), type sizes and names (reduce.h), the
 *   parameter table (param.h) and, in CUDA builds, the driver table found at run time
 *   (cudrv.h: self-contained; a program that links only libloom.so compiles src/base/cudrv.c
 *   into itself, as loom-perf does);
 * - a communicator's liveness and its revocation (NCCL's ncclCommRevoke);
 * - what loom-info lists: the algorithm registry (registry.h), the transports built
 *   (transport.h's transport_all), the interface the sockets would use (sock.h) and this
 *   process's node identity.
 *
 * Functions here are loom's internal (hidden) symbols: only programs linked with loom's objects
 * (the shim, loom-info) may call them; loom-perf uses only the vocabulary above, and
 * loom_launch_detect, the one exported: a benchmark must read its ranks the way
 * loomCommInitFromEnv does, or it measures a different job than the one launched.
 */
#ifndef LOOM_INTERNAL_H
#define LOOM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "launch.h"
#include "loom.h"
#include "param.h"
#include "reduce.h"
#include "registry.h"
#include "sock.h"
#include "transport.h"
#ifdef LOOM_HAVE_CUDA
#include "cudrv.h"
#endif

/* Whether comm is a live communicator of this process (not destroyed, not something else). */
bool loom_comm_live(loomComm_t comm);
/* Stops comm without freeing it: calls inside it leave with an error, later ones fail, peers
 * learn `reason`; returns once no call is inside it (false if one still was after 10 s). */
bool loom_comm_revoke(loomComm_t comm, const char *reason);
/* The communicator's rank and size (for log lines of callers that hold only the handle). */
int loom_comm_rank(loomComm_t comm);
int loom_comm_size(loomComm_t comm);

/* launch.c's detection on the process environment (see launch.h): whether a launcher started
 * this process, its rank, size and local rank, and how the ranks will meet. Logs its error. */
LOOM_EXPORT loomResult_t loom_launch_detect(launch_env_t *out);

/* The node identity this process has (host name + boot id + network namespace, or
 * LOOM_NODE_ID), writing the host name. */
uint64_t loom_node_identity(char *host, size_t hostlen);

#endif
