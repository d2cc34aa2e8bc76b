/*
 * The device executor: collectives on CUDA device buffers, ordered on the caller's stream.
 *
 * Ranks of one node run one kernel per collective (src/cuda/kernels.cu) that moves data through
 * each other's GPU memory (src/transport/cuda) with flags in device memory: no host thread is
 * involved and the host never waits for the stream, so the calls are capturable in CUDA graphs.
 * Ranks on other nodes are reached through pinned host memory and the host transports, by a
 * proxy thread that the stream hands each piece to through memory flags (cuStreamWriteValue32 /
 * cuStreamWaitValue32), again without a host wait on the stream.
 *
 * A communicator touches CUDA only here, and only once a device buffer is seen (or its config
 * names a device): host-only jobs on GPU machines create no CUDA context.
 */
#ifndef LOOM_CUDA_DEV_H
#define LOOM_CUDA_DEV_H

#include <stdbool.h>
#include <stddef.h>

#include "loom.h"

typedef struct dev_state dev_state_t;

typedef struct {
    int kind; /* sched_opkind_t */
    const void *send;
    void *recv;
    size_t count;
    loomDataType_t type;
    loomRedOp_t op;
    int root; /* root, or peer for send/recv */
    cudaStream_t stream;
} dev_op_t;

/* Called for each device buffer of a call (ordinal: its GPU): binds the communicator to the
 * buffer's device (a
 * buffer on another device is refused). */
loomResult_t dev_attach(loomComm_t comm, const void *ptr, int ordinal, const char *fn,
                        const char *name);
/* Whether the exchange is set up; dev_setup sets it up for k communicators together
 * (collective: every rank meets its first device call at the same point). On failure each
 * communicator is marked broken with the reason. */
bool dev_ready(loomComm_t comm);
loomResult_t dev_setup(loomComm_t *comms, int k);
/* Orders ops (all on comm, all with device buffers, in call order) on their streams. */
loomResult_t dev_run(loomComm_t comm, const dev_op_t *ops, int nops);
/* Turns a failure seen by a kernel or the watchdog into the communicator's error. */
void dev_poll(loomComm_t comm);
/* Stops kernels in flight (abort) and frees the device state. */
void dev_abort(loomComm_t comm);
void dev_free(loomComm_t comm);
/* loomMemAlloc / loomMemFree: plain device memory on the current context's device. */
loomResult_t dev_mem_alloc(void **ptr, size_t size);
loomResult_t dev_mem_free(void *ptr);

#endif
