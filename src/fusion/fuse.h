/*
 * Fusion's pure pieces (no communicator, no waiting): the digest of what a bucket holds, the
 * low-precision wire codec, and the fusion of a group's allreduces (used by core's group queue,
 * src/core/enqueue.c). The fusion context itself is fusion.c.
 */
#ifndef LOOM_FUSION_FUSE_H
#define LOOM_FUSION_FUSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "loom.h"

/* ---- digest of a bucket's contents ---- */

/* One segment as every rank must see it: which tensor (its id and whole count), where the
 * segment lies in it, the type and the op. 40 bytes, sent as they are in a mismatch report. */
typedef struct {
    uint64_t id;
    uint64_t count; /* the whole tensor's */
    uint64_t off, len;
    uint32_t type, op;
} fuse_segdesc_t;

/* The running digest after `d`, from the digest `h` before it. */
uint64_t fuse_chain(uint64_t h, const fuse_segdesc_t *d);

/* ---- the low-precision wire format (docs/fusion.md) ---- */

#define FUSE_CHUNK 256 /* values per scale */

/* Bytes one shard of `elems` values (a multiple of FUSE_CHUNK) takes on the wire: per chunk a
 * header of two floats (the power-of-two scale, and an error figure) and 16-bit values. */
size_t fuse_wire_bytes(size_t elems);

/*
 * Encodes n float32 values (n <= elems; the rest of the shard is zero) as bf16 or fp16
 * (wire = loomFusionWireBf16/Fp16). Each chunk's scale is the power of two that puts the chunk's
 * largest magnitude in [2^14, 2^15): no value overflows (fp16's largest is 65504) and the rest
 * keep as many bits as the format has. The chunk header's second float is `err[c]` when err is
 * given, else the largest absolute rounding error the encoding made in that chunk.
 */
void fuse_encode(int wire, const float *src, size_t n, size_t elems, const float *err,
                 uint8_t *out);
/* Decodes a shard: dst[i] (+)= value (accumulate: add into dst, in float32). Writes, per chunk,
 * the header's error figure to hdr_err[c] and the largest decoded magnitude to maxabs[c] (either
 * may be NULL). */
void fuse_decode(int wire, const uint8_t *in, size_t elems, float *dst, bool accumulate,
                 float *hdr_err, float *maxabs);

/* The error figure in chunk c's header of an encoded shard, read and written. */
float fuse_chunk_err(const uint8_t *in, size_t c);
void fuse_set_chunk_err(uint8_t *out, size_t c, float v);

/* ---- fusing a group's allreduces (core's group queue) ---- */

typedef struct {
    int *idx, n;   /* the fused operations: positions in *orig */
    void *scratch; /* the packed values, one in-place allreduce */
    uint64_t tag;  /* digest of the run's calls */
} fuse_run_t;

/*
 * Rewrites q[0..n) in place: each run of at least two host allreduces on one communicator that
 * are consecutive among that communicator's operations, with one type and one op, each of at
 * most LOOM_FUSION_GROUP bytes, is replaced by one in-place allreduce of their packed values
 * (placed where the run's first operation was; the others are removed); *nq is the new length.
 * The fused operation's tag is a digest of the run's counts, so ranks that grouped different
 * calls fail with a mismatch. The runs (and their copies of the original operations, *orig)
 * are returned for fuse_group_finish. Without anything to fuse, *nruns is 0 and nothing is
 * allocated.
 */
loomResult_t fuse_group(coll_op_t *q, int *nq, fuse_run_t **runs, int *nruns, coll_op_t **orig);
/* Unpacks the fused results into the original receive buffers (when res is success) and frees
 * what fuse_group allocated. */
void fuse_group_finish(loomResult_t res, fuse_run_t *runs, int nruns, coll_op_t *orig);

#endif
