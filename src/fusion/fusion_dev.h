/*
 * The device side of a fusion context (docs/fusion.md, "Device tensors"), in builds with CUDA.
 *
 * The context's rounds, cuts and mismatch checks are the host ones (fusion.c); only a bucket's
 * data differs. A device tensor's enqueue records an event on the caller's stream (what
 * produced the tensor is ordered before it); a bucket is handed to the context's launcher
 * thread, which orders on the context's own stream: a wait for the events of the tensors that
 * start in the bucket, the pack kernel (segments into the context's device stage; none when
 * the segments lie back to back), the allreduce, the unpack kernel, and an event after it. The
 * host never waits for a stream: a tensor is finished when its bucket's work is ordered, and
 * loomFusionWait / loomFusionWaitAll make the tensors' streams wait for it.
 *
 * The launcher is a thread of its own because a large device allreduce may exchange buffer
 * handles over the host, which the progress thread (running the rounds) drives.
 */
#ifndef LOOM_FUSION_DEV_H
#define LOOM_FUSION_DEV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

typedef struct fzd fzd_t;
typedef struct fzd_event fzd_event_t; /* one tensor's event */

/* One segment of a device bucket. */
typedef struct {
    void *ptr; /* its values in the tensor */
    size_t bytes;
    fzd_event_t *ev; /* its tensor's */
    bool first;      /* the tensor's first segment: the bucket waits for the tensor's event */
    bool last;       /* its last: the event is recorded again after the bucket */
} fzd_seg_t;

/*
 * Opens the device side for a context on comm whose first device tensor is p on GPU ord
 * (collective over comm when the communicator's device executor is not set up yet): the
 * launcher thread, the context's stream, and a stage of up to stage_bytes (allocated when a
 * bucket first needs it). From the caller's thread.
 */
loomResult_t fzd_open(loomComm_t comm, const void *p, int ord, size_t stage_bytes, fzd_t **out);
/* Stops the launcher (after the bucket it runs), waits for the context's stream, frees it all. */
void fzd_close(fzd_t *d);

/* A tensor enqueued on `stream`: an event recorded there now. */
loomResult_t fzd_tensor(fzd_t *d, cudaStream_t stream, fzd_event_t **ev);
/* The tensor's work is ordered: `stream` waits for it (no host wait). */
loomResult_t fzd_wait_tensor(fzd_t *d, fzd_event_t *ev, cudaStream_t stream);
/* Every bucket so far is ordered: `stream` waits for the last one. */
loomResult_t fzd_wait_all(fzd_t *d, cudaStream_t stream);
/* The tensor's event goes back to the context's pool (its step ended). */
void fzd_tensor_free(fzd_t *d, fzd_event_t *ev);

/* Segment storage for the next bucket (valid until fzd_submit), NULL when out of memory. */
fzd_seg_t *fzd_segs(fzd_t *d, size_t n);
/* Hands the bucket (the n segments of fzd_segs, `elems` values of type and op in all;
 * contiguous: back to back in memory, reduced where they are) to the launcher. */
void fzd_submit(fzd_t *d, size_t n, size_t elems, loomDataType_t type, loomRedOp_t op,
                bool contiguous);
/* From the progress thread: whether the bucket submitted is ordered; then its result (and on
 * failure its text in buf). The launcher wakes the progress thread when it is. */
bool fzd_done(fzd_t *d, loomResult_t *res, char *buf, size_t len);

#endif
