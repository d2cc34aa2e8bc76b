/*
 * Core's internal entry to collectives: operations already checked (by the public entry points
 * in enqueue.c, or built by core itself for its own exchanges), run as one group without the
 * public validation and without the calling thread's group queue.
 *
 * Users inside core: the public entry points (enqueue.c), communicator split's allgathers
 * (split.c), the device executor's setup exchange and the host side of its staged work
 * (devhost.c). Nothing below the public API calls a loom* entry point.
 */
#ifndef LOOM_CORE_COLL_H
#define LOOM_CORE_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"
#include "progress.h"

/* One queued operation. Buffers are host memory unless `dev`. */
typedef struct coll_op_s {
    loomComm_t comm;
    int kind; /* sched_opkind_t */
    const void *send;
    void *recv;
    size_t count;
    loomDataType_t type;
    loomRedOp_t op;
    int root; /* root, or peer for point to point */
    cudaStream_t stream;
    bool dev; /* device buffers: the device executor orders it on the stream */
    /* Mixed into the operation's descriptor, which peers check: ranks whose tags differ fail
     * with a mismatch instead of combining unlike data (a fused group's digest of its calls;
     * 0 for plain calls). */
    uint64_t tag;
} coll_op_t;

/* Runs host operations (in call order per communicator; several communicators progress
 * together) to completion on the calling thread. The first failure's text is the thread's
 * error text. */
loomResult_t coll_run(const coll_op_t *ops, int n);

/* The same without blocking, for the progress thread: coll_start begins the group; coll_test
 * advances it and, once *done, returns its result and frees it. While it runs, the group's
 * descriptors are watched by the progress thread. */
typedef struct coll_group coll_group_t;
loomResult_t coll_start(const coll_op_t *ops, int n, coll_group_t **out);
loomResult_t coll_test(coll_group_t *g, bool *done);
/* coll_test that also says whether anything moved (a poll function's *progressed: the progress
 * thread keeps spinning while the network delivers). */
loomResult_t coll_advance(coll_group_t *g, bool *done, bool *progressed);

/* Allgathers `bytes` of raw bytes on k communicators at once, as one group (split, the device
 * executor's setup). */
loomResult_t coll_allgather_many(loomComm_t *comms, const void *const *send, void *const *recv,
                                 size_t bytes, int k);

/* ---- for src/fusion: a communicator used from loom's own threads ---- */

/* Checks comm as a public call would (live, not finalized, no error, not aborting) and takes a
 * reference that keeps its memory until coll_drop, even across loomCommDestroy/Abort. */
loomResult_t coll_hold(loomComm_t comm, const char *fn);
void coll_drop(loomComm_t comm);
/* comm_check for a held communicator: its error text is the thread's when it is not usable. */
loomResult_t coll_usable(loomComm_t comm, const char *fn);
/* Claims comm for `owner` (not a thread: a fusion context) until coll_unclaim: every public call
 * on comm meanwhile, from any thread, is refused naming `what`. Fails if a thread holds it. */
loomResult_t coll_claim(loomComm_t comm, const void *owner, const char *what);
void coll_unclaim(loomComm_t comm, const void *owner);
/* The public calls' check of a reduction op (a pre-multiplied sum must be comm's, for type). */
loomResult_t coll_check_op(loomComm_t comm, const char *fn, loomRedOp_t op, loomDataType_t type);
/* How long a waiter of comm spins before it blocks (LOOM_SPIN_US; COMM_SPIN_SHARED_NS on nodes
 * with more ranks than cores), and how much of it without yielding the core. */
uint64_t coll_spin_ns(loomComm_t comm);
uint64_t coll_hot_ns(loomComm_t comm);
/* Rank and size of a held communicator. */
int coll_rank(loomComm_t comm);
int coll_nranks(loomComm_t comm);

/* Fusion's bucket and segment sizes for host or device memory: LOOM_FUSION_BUCKET/SEGMENT when
 * set, else the tuning file's for that memory (LOOM_TUNE_FILE, written by loom-tune --fusion
 * [--mem device]), else the defaults. */
void coll_fusion_sizes(loomComm_t comm, bool device, uint64_t *bucket, uint64_t *segment);

/* The node layout of a held communicator (sched_topo_t's arrays, valid while it is held):
 * returns the number of nodes. */
int coll_layout(loomComm_t comm, const int **node_of, const int **node_start,
                const int **node_ranks);

/* ---- for src/fusion: device buckets (builds with CUDA only) ----
 * coll_dev_prepare binds comm to the GPU `ord` of device buffer p and sets the device executor
 * up on its first use (collective over comm, as a first device call is); from the caller's
 * thread. coll_dev_allreduce orders an allreduce of device memory on `stream`, as a public
 * call with that stream would (never from the progress thread: a large one may exchange
 * buffer handles over the host, which the progress thread drives). coll_dev_copy orders byte
 * copies between device buffers on `stream` (pack and unpack). */
loomResult_t coll_dev_prepare(loomComm_t comm, const void *p, int ord, const char *fn);
loomResult_t coll_dev_allreduce(loomComm_t comm, void *buf, size_t count, loomDataType_t type,
                                loomRedOp_t op, cudaStream_t stream);
typedef struct {
    const void *src;
    void *dst;
    size_t bytes;
} coll_copy_t;
loomResult_t coll_dev_copy(loomComm_t comm, const coll_copy_t *c, int n, cudaStream_t stream);

/* Whether the communicator runs in deterministic mode (LOOM_DETERMINISTIC=1, read at init). */
bool coll_deterministic(loomComm_t comm);

#endif
