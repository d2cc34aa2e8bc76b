/*
 * The device executor: collectives on CUDA device buffers, ordered on the caller's stream.
 *
 * Ranks of one node run one kernel per collective (src/cuda/kernels.cu) that moves data through
 * each other's GPU memory (src/transport/cuda) with flags in device memory: no host thread is
 * involved and the host never waits for the stream, so the calls are capturable in CUDA graphs.
 * Ranks on other nodes are reached through pinned host memory and the host transports, from
 * core's progress thread, which the stream hands each piece to through memory flags
 * (cuStreamWriteValue32 / cuStreamWaitValue32), again without a host wait on the stream.
 *
 * A communicator touches CUDA only here, and only once a device buffer is seen (or its config
 * names a device): host-only jobs on GPU machines create no CUDA context.
 */
#ifndef LOOM_CUDA_DEV_H
#define LOOM_CUDA_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
    /* a pre-multiplied sum (op >= loomNumOps): the scalar, host bytes or device memory */
    const void *scale_host, *scale_dev;
} dev_op_t;

/* A collective that the host side runs on host memory for work crossing nodes. */
typedef struct {
    int kind;
    size_t count;
    loomDataType_t type;
    loomRedOp_t op;
    int root;
    void *hsend, *hrecv;
    int div;          /* divide the result by this (hierarchical avg), 0: no */
    bool cross;       /* between the ranks of one local index across nodes (else all ranks) */
    uint8_t scale[8]; /* pre-multiplied sum: scale the input first */
    bool scaled;
} host_op_t;

/*
 * The communicator as the device executor sees it. The executor sits below core: it never sees
 * core's communicator, only this, which core fills in before the first device call and keeps
 * inside the communicator. The services are core's: the communicator's error, an allgather
 * among its ranks, and the host collectives of work that crosses nodes.
 */
typedef struct dev_host dev_host_t;
struct dev_host {
    int rank, nranks, node, nnodes;
    int local_rank, local_size;
    const int *node_ranks, *node_start; /* ranks by node; node k's are [start[k], start[k+1]) */
    double timeout_s;
    int cuda_dev;       /* the GPU this rank is bound to */
    dev_state_t *state; /* the executor's, NULL until set up */
    /* the communicator's asynchronous error (loomSuccess: none) and its text */
    loomResult_t (*error)(dev_host_t *h, const char **text);
    void (*set_error)(dev_host_t *h, loomResult_t res, const char *text);
    /* allgather of `bytes` from every rank, for k communicators driven by this thread at once */
    loomResult_t (*allgather)(dev_host_t *const *hs, const void *const *send, void *const *recv,
                              size_t bytes, int k);
    /* Work crossing nodes: stage_open makes the host side's communicators (all ranks, and
     * the ranks of local index `cross_color` on every node, or none if negative). The host
     * collectives never block a thread: stage_start begins ops on them as one group (pre-scaled
     * inputs, `div` and `scaled` are the executor's to apply) and returns at once with a job;
     * stage_test advances the job and sets *done when it finished, freeing it (an error is
     * returned once, the job freed too, and the communicator broken). Both run only on core's
     * progress thread, from a poll function attached below. stage_stop aborts what runs
     * there; stage_close frees the communicators (after every job was tested to the end). */
    loomResult_t (*stage_open)(dev_host_t *h, int cross_color);
    loomResult_t (*stage_start)(dev_host_t *h, const host_op_t *ops, int nops, void **job);
    loomResult_t (*stage_test)(dev_host_t *h, void *job, bool *done);
    void (*stage_stop)(dev_host_t *h, const char *why);
    void (*stage_close)(dev_host_t *h);
    /* Core's progress thread (one per process, src/core/progress.c) calls poll(arg) again and
     * again while it is attached: poll does a bounded piece of work, sets *progressed when
     * anything moved, and returns how long the thread may sleep before the next call, in ns (0:
     * call again at once; UINT64_MAX: not before progress_wake). progress_detach returns once
     * poll is not running and will not run again. progress_wake may be called from any thread
     * (it is how new work reaches a sleeping poll). */
    loomResult_t (*progress_attach)(dev_host_t *h, uint64_t (*poll)(void *arg, bool *progressed),
                                    void *arg);
    void (*progress_detach)(dev_host_t *h, void *arg);
    void (*progress_wake)(dev_host_t *h);
};

/* Whether the exchange is set up; dev_setup sets it up for k communicators together
 * (collective: every rank meets its first device call at the same point). On failure each
 * communicator is marked broken with the reason. */
bool dev_ready(const dev_host_t *h);
loomResult_t dev_setup(dev_host_t *const *hs, int k);
/* Orders ops (all on one communicator, all with device buffers, in call order) on their
 * streams. */
loomResult_t dev_run(dev_host_t *h, const dev_op_t *ops, int nops);
/* Byte ranges copied between device buffers on `stream`, in as few launches as fit (a fusion
 * context's pack and unpack of a bucket); after dev_setup. */
typedef struct {
    const void *src;
    void *dst;
    size_t bytes;
} dev_copy_t;
loomResult_t dev_copy(dev_host_t *h, const dev_copy_t *c, int n, cudaStream_t stream);
/* Turns a failure seen by a kernel or the watchdog into the communicator's error. */
void dev_poll(dev_host_t *h);
/* Stops kernels in flight (abort) and frees the device state. */
void dev_abort(dev_host_t *h);
void dev_free(dev_host_t *h);
/* Registered windows (loomCommWindowRegister; src/cuda/dev_win.c). Both are collective over
 * the communicator, after dev_setup. DEV_WIN_SYMMETRIC is LOOM_WIN_COLL_SYMMETRIC. */
#define DEV_WIN_SYMMETRIC 0x01
typedef struct dev_win dev_win_t;
loomResult_t dev_win_register(dev_host_t *h, void *buff, size_t size, int flags, dev_win_t **win);
/* Waits for the communicator's queued calls (which may use the window), then unmaps it. */
loomResult_t dev_win_deregister(dev_host_t *h, dev_win_t *win);

/* loomMemAlloc / loomMemFree: plain device memory on the current context's device. */
loomResult_t dev_mem_alloc(void **ptr, size_t size);
loomResult_t dev_mem_free(void *ptr);

#endif
