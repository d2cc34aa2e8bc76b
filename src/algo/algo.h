/*
 * The algorithms: pure generators that turn one call into one rank's schedule. They see only the
 * schedule IR (src/sched) and base, never core: which one runs is core's registry's business.
 * Each family lives in its own file, which opens with its cost (steps and bytes per rank):
 *   ring.c         ring allreduce, reduce-scatter, allgather, broadcast, reduce (and their group
 *                  and region forms, the building blocks of the hierarchical ones)
 *   rd.c           recursive doubling allreduce (latency-bound sizes)
 *   rabenseifner.c recursive-halving reduce-scatter + recursive-doubling allgather (middle sizes)
 *   tree.c         pipelined double binary tree allreduce, reduce and broadcast (latency at
 *                  many ranks)
 *   alltoall.c     direct all-to-all
 *   hier.c         hierarchical allreduce: node-local reduce-scatter, a cross-node allreduce per
 *                  shard (ring, tree, rabenseifner or rd), node-local allgather
 *   hier_leader.c  hierarchical allreduce through one leader per node (baseline)
 *   ps.c           parameter server allreduce (baseline)
 *   oneshot.c      one-shot allreduce: every input to every rank, each folds them all in rank
 *                  order (the smallest buffers on a few ranks)
 *   determ.c       deterministic allreduce, reduce-scatter and reduce (LOOM_DETERMINISTIC=1):
 *                  every element the left fold of the inputs in rank order
 *
 * Buffers: SCHED_BUF_SEND (input), SCHED_BUF_RECV (output), SCHED_BUF_TMP (s->tmp_elems set by
 * the generator where it needs scratch). `inplace` says the caller aliased the buffers with
 * sched_set_alias; in place, copies of the rank's own data are left out. `avg` marks the last
 * reduction of each element with STEP_F_AVG.
 */
#ifndef LOOM_ALGO_H
#define LOOM_ALGO_H

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

/* The global rank of member i. */
static inline int grp_rank(const ring_group_t *g, int i)
{
    return g->ranks ? g->ranks[i] : i;
}

/* Peer arithmetic wraps around the ring; C's % keeps the sign of a negative a. */
static inline int algo_mod(int a, int p)
{
    return ((a % p) + p) % p;
}

/* This rank's node as a ring group: its ranks, their number, and this rank's place. */
ring_group_t algo_node_group(const sched_t *s, const sched_topo_t *t);

/* ---- ring.c ---- */

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
/* A range of elements. */
typedef struct {
    uint64_t off, len;
} ring_span_t;

/* The pieces (channel, chunk, slice) that ring_allreduce_region cuts `count` elements into, as
 * offsets from the region's start, covering it once, in the order member `me` of a ring of p
 * uses them: finish false, the order its reduce-scatter first reads them (its own chunk's slice
 * j is sent at step 0, chunk me-1-i's slice j is reduced at step i, one slice later per step);
 * finish true, the order in which their final values are there (chunk me+1 after the last
 * reduction, the others as the allgather brings them). A phase feeding the ring, or fed by it,
 * that goes through its region in this order meets it slice by slice. Returns the number of
 * pieces in *out (malloc'ed by the call, freed by the caller); 0 with *out NULL when count is 0
 * or memory ran out (then *oom is set). */
size_t ring_allreduce_pieces(uint64_t count, const ring_params_t *prm, int p, int me, bool finish,
                             ring_span_t **out, bool *oom);

/* The root sends from root_buf (SCHED_BUF_SEND for a plain broadcast). */
void ring_broadcast_group(sched_t *s, uint16_t desc, const ring_group_t *g, uint64_t count,
                          int root, uint32_t root_buf, const ring_params_t *prm, bool inplace);
void ring_reduce_group(sched_t *s, uint16_t desc, const ring_group_t *g, uint64_t count, int root,
                       const ring_params_t *prm, bool inplace, bool avg);

/* An allreduce of elements [base, base+count) over a group, in the form of
 * ring_allreduce_region: what the hierarchy runs across nodes. Those that need scratch use
 * SCHED_BUF_TMP elements [2·base, 2·(base+count)) and raise s->tmp_elems to cover them. */
typedef void (*algo_region_fn)(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                               uint32_t out_buf, uint64_t base, uint64_t count,
                               const ring_params_t *prm, bool inplace, bool avg);

/* The power-of-two fold of recursive doubling and Rabenseifner (and of their cost rows): q is
 * the largest power of two <= p, L = log2(q); among the first 2·extra = 2(p - q) members each
 * odd one hands its whole input to the even one below before the power-of-two part and takes
 * the result back after it, the even one standing for both. The q members that stay have
 * virtual ranks 0 .. q-1. */
typedef struct {
    int q, L, extra;
} algo_pow2_t;

static inline algo_pow2_t algo_pow2(int p)
{
    algo_pow2_t f = {1, 0, 0};
    while (f.q * 2 <= p)
        f.q *= 2, f.L++;
    f.extra = p - f.q;
    return f;
}
/* Member r is folded away (odd, among the first 2·extra) / takes a folded member's input. */
static inline bool algo_pow2_away(const algo_pow2_t *f, int r)
{
    return r < 2 * f->extra && r % 2 == 1;
}
static inline bool algo_pow2_folds(const algo_pow2_t *f, int r)
{
    return r < 2 * f->extra && r % 2 == 0;
}
/* A staying member's virtual rank, and the member of virtual rank v. */
static inline int algo_pow2_vrank(const algo_pow2_t *f, int r)
{
    return r < 2 * f->extra ? r / 2 : r - f->extra;
}
static inline int algo_pow2_member(const algo_pow2_t *f, int v)
{
    return v < f->extra ? v * 2 : v + f->extra;
}
/* rd.c: the fold's steps, in slices of sl. A member folded away sends [base, base+count) of
 * in_buf to the member below and receives the result into out_buf: its whole schedule. The
 * member that folds receive-reduces the one above's input with in_buf into dst (at dst_off),
 * and at the end sends the result back from out_buf. */
void algo_pow2_away_steps(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                          uint32_t out_buf, uint64_t base, uint64_t count, uint64_t sl);
void algo_pow2_fold_steps(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                          uint64_t base, uint32_t dst, uint64_t dst_off, uint64_t count,
                          uint64_t sl);
void algo_pow2_unfold_steps(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t out_buf,
                            uint64_t base, uint64_t count, uint64_t sl);

/* ---- rd.c: recursive doubling allreduce: log2 steps, whole buffer each step (small buffers) */
void rd_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm, bool inplace,
                  bool avg);
void rd_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                         uint32_t out_buf, uint64_t base, uint64_t count, const ring_params_t *prm,
                         bool inplace, bool avg);

/* ---- rabenseifner.c: recursive halving then doubling: 2 log2(p) steps, 2(p-1)/p of the buffer */
void rab_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                   bool inplace, bool avg);
void rab_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                          uint32_t out_buf, uint64_t base, uint64_t count, const ring_params_t *prm,
                          bool inplace, bool avg);

/* ---- tree.c: pipelined double binary tree: 2 ceil(log2(p+1)) hops, half the buffer per tree */
void tree_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                    bool inplace, bool avg);
void tree_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                           uint32_t out_buf, uint64_t base, uint64_t count,
                           const ring_params_t *prm, bool inplace, bool avg);
/* Reduce toward / broadcast from any root: the two trees over the other p - 1 ranks, the root
 * above both tops (one more hop): about log2(p) hops (tree_rooted_hops), about n bytes through
 * every rank. */
void tree_reduce(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                 bool inplace, bool avg);
void tree_broadcast(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                    bool inplace);
/* The hops from the deeper tree's farthest leaf to the root, for p ranks: about log2(p), one
 * more where the second tree hangs below one member (the cost model's step count). */
int tree_rooted_hops(int p);

/* ---- oneshot.c: every input to every rank at once, folded in rank order on each: one step,
 * (p-1) buffers in and out per rank, scratch p·count (the smallest buffers on few ranks) */
void oneshot_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                       bool inplace, bool avg);

/* ---- alltoall.c: direct exchange: all-to-all as p-1 rounds of pairwise send/receive (round i
 * sends to r+i and receives from r-i), count elements per pair. Out of place only. */
void direct_alltoall(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm);

/* ---- hier.c, hier_leader.c, ps.c: allreduces over nodes, and the parameter server. The
 * hierarchical ones take the layout; on one node they reduce to their node-local phases. */
void hier_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                    const ring_params_t *prm, bool inplace, bool avg);
/* The same with `cross` as the allreduce of each shard across nodes (hier_allreduce: the ring). */
void hier_allreduce_with(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                         const ring_params_t *prm, bool inplace, bool avg, algo_region_fn cross);
void hier_leader_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                           const ring_params_t *prm, bool inplace, bool avg);
void ps_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm, bool inplace,
                  bool avg);

/* ---- determ.c: LOOM_DETERMINISTIC=1. Each element is ((x0 op x1) op x2) ... op x(p-1), one
 * rounding per step, whatever the slice and channel settings: the owner of each of p blocks
 * folds the block's contributions in rank order, then (allreduce) sends it to everyone or
 * (reduce) to the root. Reduce-scatter is the fold alone. */
void determ_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                      bool inplace, bool avg);
void determ_reduce_scatter(sched_t *s, uint16_t desc, uint64_t recvcount, const ring_params_t *prm,
                           bool inplace, bool avg);
void determ_reduce(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                   bool inplace, bool avg);

/* The calls with nothing to exchange: no elements, or one rank (whose output is its input: one
 * copy out of place). True when it handled the call. */
static inline bool algo_trivial(sched_t *s, uint16_t desc, int p, uint64_t count, bool inplace)
{
    if (count == 0) return true;
    if (p > 1) return false;
    if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, 0, SCHED_BUF_RECV, 0, count, 0);
    return true;
}

#endif
