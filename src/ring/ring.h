/*
 * Ring algorithms: the bandwidth-optimal collectives of a flat ring, as schedules.
 *
 * Allreduce: reduce-scatter then allgather, 2(p-1) steps; every rank sends and receives
 * 2(p-1)/p of the buffer, the lower bound for any allreduce. Each of the C channels (parallel
 * rings) takes 1/C of the buffer; each chunk moves in slices so that sending, receiving and
 * reducing overlap.
 */
#ifndef LOOM_RING_H
#define LOOM_RING_H

#include <stdbool.h>
#include <stdint.h>

#include "schedule.h"

typedef struct {
    int nchannels;        /* parallel rings, >= 1 */
    uint64_t slice_elems; /* elements per pipeline slice, >= 1 */
} ring_params_t;

/* A ring over some of the ranks: member i is global rank ranks[i] (ranks NULL: rank i); this
 * rank is member me. Hierarchical algorithms run rings inside a node and across nodes. */
typedef struct {
    int n, me;
    const int *ranks;
} ring_group_t;

/* Buffers: SCHED_BUF_SEND (input), SCHED_BUF_RECV (output), SCHED_BUF_TMP (s->tmp_elems set by
 * the generator where it needs scratch). `inplace` says the caller aliased the buffers with
 * sched_set_alias; in place, copies of the rank's own data are left out. `avg` marks the last
 * reduction of each element with STEP_F_AVG. */
void ring_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                    bool inplace, bool avg);
void ring_reduce_scatter(sched_t *s, uint16_t desc, uint64_t recvcount, const ring_params_t *prm,
                         bool inplace, bool avg);
void ring_allgather(sched_t *s, uint16_t desc, uint64_t sendcount, const ring_params_t *prm,
                    bool inplace);
void ring_broadcast(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                    bool inplace);
void ring_reduce(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                 bool inplace, bool avg);

/* Group and region forms, for composed algorithms. Allreduce of elements [base, base+count) of
 * in_buf into the same range of out_buf (in place: in_buf == out_buf). */
void ring_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                           uint32_t out_buf, uint64_t base, uint64_t count,
                           const ring_params_t *prm, bool inplace, bool avg);
/* The root sends from root_buf (SCHED_BUF_SEND for a plain broadcast). */
void ring_broadcast_group(sched_t *s, uint16_t desc, const ring_group_t *g, uint64_t count,
                          int root, uint32_t root_buf, const ring_params_t *prm, bool inplace);
void ring_reduce_group(sched_t *s, uint16_t desc, const ring_group_t *g, uint64_t count, int root,
                       const ring_params_t *prm, bool inplace, bool avg);

/* Recursive doubling allreduce: log2 steps, whole buffer each step (small buffers). */
void rd_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                  bool inplace, bool avg);

/* Direct exchange: all-to-all as p-1 rounds of pairwise send/receive (round i sends to r+i and
 * receives from r-i), count elements per pair. Out of place only. */
void direct_alltoall(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm);

#endif
