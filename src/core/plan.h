/*
 * The planner: one collective call on one rank to its schedule, a pure function of the call and
 * of what planning needs from the communicator (no communicator, no buffers, no state), so that
 * the symbolic tests build every rank's schedule exactly as a communicator would. The caller
 * keeps what is specific to one call: its sequence number, the buffers and scratch, and the
 * schedule cache.
 */
#ifndef LOOM_CORE_PLAN_H
#define LOOM_CORE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algo.h"
#include "base.h"
#include "schedule.h"

/* What planning needs from a communicator. */
typedef struct {
    int rank, nranks;
    sched_topo_t topo; /* the node layout, for hierarchical algorithms */
    int nchannels;
    uint64_t slice_bytes;
} plan_ctx_t;

/* One call. */
typedef struct {
    /* The operation as every message carries it (kind, dtype, op code, root, count, seq,
     * shape); it becomes the schedule's descriptor 0. */
    sched_desc_t desc;
    int algo;     /* allreduce: its registry row (ALGO_*, chosen by the caller); reduce and
                   * reduce-scatter: ALGO_DETERM for LOOM_DETERMINISTIC=1, else the ring */
    bool inplace; /* in place as the API means it (plan_inplace) */
    bool avg;     /* the last reduction of each element divides by the ranks */
} plan_call_t;

/* How the generator sees the buffers: its in-place flag, and the aliasing of one buffer's
 * elements onto another's (alias_from == alias_to: none). */
typedef struct {
    bool inplace;
    uint32_t alias_from, alias_to;
    int64_t alias_delta;
} plan_alias_t;

/* In place as the API means it for this kind of call: allreduce, reduce and broadcast when the
 * buffers are one; allgather when the input is this rank's block of the output; reduce-scatter
 * when the output is this rank's block of the input. */
bool plan_inplace(int kind, int rank, uint64_t count, size_t elem_size, const void *send,
                  const void *recv);
plan_alias_t plan_alias(const plan_ctx_t *ctx, const plan_call_t *call);
/* Channels and slice length (in elements of type) for the generators. */
ring_params_t plan_ring_params(const plan_ctx_t *ctx, loomDataType_t type);

/* Builds the schedule of `call` on this rank into s (freshly initialised or reset for
 * ctx->rank, ctx->nranks): the descriptor, the aliasing, then the generator (the registry's row
 * for an allreduce). The range tables stay; the caller drops them once it keeps the schedule. */
loomResult_t plan_build(const plan_ctx_t *ctx, const plan_call_t *call, sched_t *s);

#endif
