/*
 * Schedules: an algorithm's output. A schedule is one rank's program of steps ("send slice s of
 * buffer b to peer q", "receive from q and reduce into ...", "copy"), built by a pure generator
 * from (rank, ranks, count, chunking) and run by an executor over transports.
 *
 * Buffers are named by small integers (SCHED_BUF_SEND, SCHED_BUF_RECV, SCHED_BUF_TMP, then any
 * added with sched_add_buf); offsets and counts are in elements. The builder derives each step's
 * dependencies from the element ranges it reads and writes (read after write, write after read,
 * write after write), with an interval map per buffer, so that generators composed one after
 * another (a node-local phase, then a cross-node one on part of the same buffer) may slice the
 * buffer differently and still get exact dependencies.
 *
 * Matching: the k-th send from rank a to rank b meets the k-th receive of b from a. A generator
 * must emit them in the same order on both sides; the symbolic checker (tests) proves it.
 */
#ifndef LOOM_SCHED_SCHEDULE_H
#define LOOM_SCHED_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

enum { SCHED_BUF_SEND = 0, SCHED_BUF_RECV = 1, SCHED_BUF_TMP = 2, SCHED_BUF_FIRST_FREE = 3 };

typedef enum {
    STEP_SEND = 0,        /* send src to peer */
    STEP_RECV = 1,        /* receive from peer into dst */
    STEP_RECV_REDUCE = 2, /* receive from peer into staging, then dst = src op staging */
    STEP_COPY = 3,        /* dst = src, locally */
    STEP_REDUCE = 4,      /* dst = dst op src, locally (a fold's own operand) */
} sched_step_kind_t;

/* The steps that touch no peer (copy, reduce): run where they are issued, peer -1. */
static inline bool sched_step_local(uint8_t kind)
{
    return kind == STEP_COPY || kind == STEP_REDUCE;
}

/* After this step's result is in dst, divide it by the number of ranks (the last reduction of an
 * avg). */
#define STEP_F_AVG 0x1

typedef struct {
    uint8_t kind;
    uint8_t flags;
    uint16_t desc;    /* index of the operation this step belongs to (sched->descs) */
    int32_t peer;     /* for send and receive steps */
    uint32_t src_buf; /* buffer ids */
    uint32_t dst_buf;
    uint64_t src_off; /* element offsets */
    uint64_t dst_off;
    uint64_t count;     /* elements, > 0 */
    uint32_t dep_first; /* this step waits for steps deps[dep_first .. dep_first + ndeps) */
    uint32_t ndeps;
} sched_step_t;

/* What an operation is, carried in every message so that a mismatch between ranks is caught. */
typedef enum {
    OPK_ALLREDUCE = 1,
    OPK_BROADCAST,
    OPK_REDUCE,
    OPK_ALLGATHER,
    OPK_REDUCESCATTER,
    OPK_ALLTOALL,
    OPK_SEND,
    OPK_RECV,
    OPK_SPLIT, /* internal allgathers: split, device setup, direct allreduce handles */
} sched_opkind_t;

/* "allreduce", "reduce-scatter", ... for messages. */
const char *sched_opkind_name(int kind);

typedef struct {
    uint8_t kind;  /* sched_opkind_t */
    uint8_t dtype; /* loomDataType_t */
    uint8_t op;    /* red_op_t, or the public op for avg/premul reporting */
    uint8_t pad;
    int32_t root; /* root, or peer for point to point */
    uint64_t count;
    uint64_t seq;   /* collective sequence number, or per-pair p2p sequence */
    uint64_t shape; /* how the operation is cut (algorithm, slice, channels): ranks must agree */
} sched_desc_t;

typedef struct sched_imap sched_imap_t;

/* Where ranks live, for algorithms that use nodes. */
typedef struct {
    int nnodes;
    const int *node_of;    /* [nranks] node index of each rank */
    const int *node_start; /* [nnodes + 1] where each node's ranks start in node_ranks */
    const int *node_ranks; /* the ranks of node 0, then node 1, ..., each in ascending order */
} sched_topo_t;

typedef struct {
    int rank, nranks;
    uint32_t nbufs;
    sched_step_t *steps;
    size_t nsteps, cap;
    uint32_t *deps;
    size_t ndeps, depcap;
    sched_desc_t *descs;
    size_t ndescs, desccap;
    uint64_t tmp_elems; /* size the executor must give SCHED_BUF_TMP */
    /* In-place aliasing: elements of buffer alias_from at offset x are those of alias_to at
     * x + alias_delta (alias_from == alias_to means none). */
    uint32_t alias_from, alias_to;
    int64_t alias_delta;
    /* range tracking used while building: one interval map per buffer */
    sched_imap_t *imaps;
    size_t nimaps;
    uint32_t *readers; /* pool of reader lists: (step, next) pairs */
    size_t nreaders, readercap;
    bool oom;
} sched_t;

void sched_init(sched_t *s, int rank, int nranks);
void sched_free(sched_t *s);
/* Forget all steps, keep the allocations (for reuse). */
void sched_reset(sched_t *s, int rank, int nranks);
uint32_t sched_add_buf(sched_t *s);
/* Frees what only building needs (the range tables); the steps stay valid. */
void sched_drop_tracking(sched_t *s);
void sched_set_alias(sched_t *s, uint32_t from, uint32_t to, int64_t delta);
/* Adds an operation descriptor; returns its index. */
uint16_t sched_add_desc(sched_t *s, const sched_desc_t *d);

/* Step builders. count == 0 adds nothing. They record allocation failure in s->oom; check it
 * once with sched_status after building. */
void sched_send(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off, uint64_t count);
void sched_recv(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off, uint64_t count);
void sched_recv_reduce(sched_t *s, uint16_t desc, int peer, uint32_t src_buf, uint64_t src_off,
                       uint32_t dst_buf, uint64_t dst_off, uint64_t count, uint8_t flags);
void sched_copy(sched_t *s, uint16_t desc, uint32_t src_buf, uint64_t src_off, uint32_t dst_buf,
                uint64_t dst_off, uint64_t count, uint8_t flags);
/* dst = dst op src: folds a local operand into an accumulator (the caller's data, or a received
 * one already in place) at the place the fold's order wants it. */
void sched_reduce(sched_t *s, uint16_t desc, uint32_t src_buf, uint64_t src_off, uint32_t dst_buf,
                  uint64_t dst_off, uint64_t count, uint8_t flags);
loomResult_t sched_status(const sched_t *s);

/* Cuts [0, len) into fixed slices of `slice` elements starting at 0: the number of slices, and
 * the offset and length of slice j. */
static inline uint64_t sched_nslices(uint64_t len, uint64_t slice)
{
    return len == 0 ? 0 : (len + slice - 1) / slice;
}
static inline uint64_t sched_slice_len(uint64_t len, uint64_t slice, uint64_t j)
{
    uint64_t start = j * slice;
    return start >= len ? 0 : (len - start < slice ? len - start : slice);
}
/* Offset of part k of n in an even split of len elements (parts differ by at most one). */
static inline uint64_t sched_part_off(uint64_t len, uint64_t n, uint64_t k)
{
    return (uint64_t)(((unsigned __int128)len * k) / n);
}

#endif
