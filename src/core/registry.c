/* The allreduce algorithm table, and selection over it (registry.h). */
#include "registry.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/*
 * The alpha-beta model: a step costs the slowest link's latency, a byte its inverse bandwidth,
 * plus gamma for reducing it on the host; the constants are the communicator's (comm.c's
 * comm_model: measured ones from the tuning file, else the built-in defaults). A flat algorithm
 * crosses nodes on every step once there are several; the hierarchy pays node-local steps at the
 * fast link's price and only 2(n-1)/n of the buffer on each node's network link.
 */
typedef struct {
    double p, n, g;        /* ranks, nodes, ranks per node */
    double a_flat, b_flat; /* the slowest link a flat algorithm crosses */
    double a_loc, a_net;   /* per-step latencies, a wake-up included where ranks block */
} model_terms_t;

/* A dependent step on a node with more ranks than cores: the waiting rank blocks (it does not
 * spin, comm.c) and the step waits for the scheduler to run it again. Measured on the 2-core
 * dev VM, 4 ranks, shared memory (perf/RESULTS.md, the sweep): (ring 211 - rd 112 us at 8 B) /
 * (6 - 2 steps) = 25 us per step, against the transport's 5 us hint. */
static const double c_wake = 25e-6;

/* A message past the first of one step, as a fraction of the step's latency: the sender posts
 * them one after another, the receiver takes them one after another (oneshot.c's p - 1).
 * Measured on 16 idle cores, shm, 8 B (perf/RESULTS.md, session 11): oneshot 6.7 us against
 * rd's 5.9 at 4 ranks (a(1 + 2c) against 2a), 11.9 against 7.9 at 8 (a(1 + 6c) against 3a):
 * c = 0.6 both times. So on shm it wins only where rd folds extra ranks (3, 5-7 ranks). */
static const double c_msg = 0.6;

static model_terms_t terms(const registry_model_t *m)
{
    bool multi = m->nnodes > 1;
    double wake = m->oversubscribed ? c_wake : 0;
    model_terms_t t = {.p = m->nranks,
                       .n = m->nnodes,
                       .g = (double)m->nranks / m->nnodes,
                       .a_loc = m->a_loc + wake,
                       .a_net = m->a_net + wake,
                       .b_flat = multi ? m->b_net : m->b_loc};
    t.a_flat = multi ? t.a_net : t.a_loc;
    return t;
}

/* log2 of the largest power of two <= p, and the fold's extra steps (before and after) for the
 * ranks beyond it (rd, rabenseifner): algo.h's algo_pow2, the generators' own arithmetic. */
static void pow2_terms(double p, double *lg, double *folds)
{
    algo_pow2_t f = algo_pow2((int)p);
    *lg = f.L;
    *folds = f.extra > 0 ? 2 : 0;
}

/* The flat algorithms over p ranks on links of latency a and inverse bandwidth b, n bytes:
 * steps x a + bytes sent per rank x b + bytes reduced per rank x gamma. The hierarchy reuses
 * them for its cross-node level. */
typedef enum { FLAT_RING, FLAT_RD, FLAT_RAB, FLAT_TREE } flat_kind_t;

static double flat_cost(flat_kind_t k, double p, double a, double b, double gamma, double nb)
{
    double lg, folds;
    pow2_terms(p, &lg, &folds);
    double q = pow(2, lg);
    switch (k) {
    case FLAT_RING: return 2 * (p - 1) * a + 2 * (p - 1) / p * nb * b + (p - 1) / p * nb * gamma;
    case FLAT_RD: {
        double s = lg + folds;
        return s * a + s * nb * b + (lg + folds / 2) * nb * gamma;
    }
    case FLAT_RAB:
        /* 2 log2(q) steps moving 2(q-1)/q of the buffer, and the fold's whole buffer twice */
        return (2 * lg + folds) * a + (2 * (q - 1) / q + folds) * nb * b +
               ((q - 1) / q + folds / 2) * nb * gamma;
    case FLAT_TREE: {
        /* floor(log2 p) hops up and as many down; an interior rank of one tree takes two
         * children's halves and sends two halves down, a leaf of the other one half each way:
         * about 2n through each rank's link */
        double hops = p > 1 ? lg : 0;
        return 2 * hops * a + (p > 1 ? 2 : 0) * nb * b + (p - 1) / p * nb * gamma;
    }
    }
    return 0;
}

static double ring_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return flat_cost(FLAT_RING, t.p, t.a_flat, t.b_flat, m->gamma, nb);
}

static double rd_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return flat_cost(FLAT_RD, t.p, t.a_flat, t.b_flat, m->gamma, nb);
}

static double rab_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return flat_cost(FLAT_RAB, t.p, t.a_flat, t.b_flat, m->gamma, nb);
}

static double tree_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return flat_cost(FLAT_TREE, t.p, t.a_flat, t.b_flat, m->gamma, nb);
}

/*
 * Reduce and broadcast. The ring's is a chain of p - 1 hops, pipelined: p - 1 steps before the
 * last rank (reduce: the root) has the first slice, then n through every rank's link (and n
 * reduced per rank). The tree's (tree.c) climbs or descends two trees over the other p - 1
 * ranks, the root above both tops: tree_rooted_hops(p) hops, the generator's own shape (about
 * log2 p; one more where the second tree hangs below one member), and each rank still receives
 * (reduce) or sends (broadcast) about n: an interior rank of one tree handles two children's
 * halves, a leaf of the other one half. So the tree wins by its steps alone from 5 ranks on
 * (3 hops against 4), ties the ring up to 4 (the earlier row, ring, is taken: the tree's two
 * halves are twice the messages per hop), and the model sees no difference in bandwidth. On
 * oversubscribed nodes the ring is taken at every size (tree_steps).
 */
static double ring_reduce_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return (t.p - 1) * t.a_flat + nb * t.b_flat + nb * m->gamma;
}

static double ring_bcast_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return (t.p - 1) * t.a_flat + nb * t.b_flat;
}

/* The tree's steps. A tree hop is two messages (one per half) where the ring's is one; on
 * separate links they overlap, and the tree's hops count. But where ranks outnumber cores (and
 * block: c_wake) the cores set the pace, every message a wake-up after another: the time goes
 * with the job's messages, 2(p - 1) for the tree, p - 1 for the ring, whatever the depth.
 * Measured on the 2-core VM, shm, 8 B (perf/RESULTS.md): ring 233, 230, 654 us at 4, 8, 16
 * ranks, tree 439, 753, 1323 us. */
static double tree_steps(const registry_model_t *m)
{
    return m->oversubscribed ? 2.0 * (m->nranks - 1) : tree_rooted_hops(m->nranks);
}

static double tree_reduce_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return tree_steps(m) * t.a_flat + nb * t.b_flat + nb * m->gamma;
}

static double tree_bcast_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    return tree_steps(m) * t.a_flat + nb * t.b_flat;
}

static void gen_ring_reduce(sched_t *s, uint16_t desc, uint64_t count, int root,
                            const ring_params_t *prm, bool inplace, bool avg)
{
    ring_reduce(s, desc, count, root, prm, inplace, avg);
}

static void gen_ring_bcast(sched_t *s, uint16_t desc, uint64_t count, int root,
                           const ring_params_t *prm, bool inplace, bool avg)
{
    (void)avg;
    ring_broadcast(s, desc, count, root, prm, inplace);
}

static void gen_tree_reduce(sched_t *s, uint16_t desc, uint64_t count, int root,
                            const ring_params_t *prm, bool inplace, bool avg)
{
    tree_reduce(s, desc, count, root, prm, inplace, avg);
}

static void gen_tree_bcast(sched_t *s, uint16_t desc, uint64_t count, int root,
                           const ring_params_t *prm, bool inplace, bool avg)
{
    (void)avg;
    tree_broadcast(s, desc, count, root, prm, inplace);
}

/* The node-local reduce-scatter and allgather at the fast link's price, then the cross-node
 * algorithm over n nodes on each node's network link, which carries every shard of its node. */
static double hier_x_cost(const registry_model_t *m, double nb, flat_kind_t cross)
{
    model_terms_t t = terms(m);
    double g = t.g;
    return 2 * (g - 1) * t.a_loc + 2 * (g - 1) / g * nb * m->b_loc + (g - 1) / g * nb * m->gamma +
           flat_cost(cross, t.n, t.a_net, m->b_net, m->gamma, nb);
}

static double hier_cost(const registry_model_t *m, double nb)
{
    return hier_x_cost(m, nb, FLAT_RING);
}

static double hier_tree_cost(const registry_model_t *m, double nb)
{
    return hier_x_cost(m, nb, FLAT_TREE);
}

static double hier_rab_cost(const registry_model_t *m, double nb)
{
    return hier_x_cost(m, nb, FLAT_RAB);
}

static double hier_rd_cost(const registry_model_t *m, double nb)
{
    return hier_x_cost(m, nb, FLAT_RD);
}

static const char *one_node(const registry_model_t *m)
{
    /* on one node the hierarchy is just its node-local ring */
    return m->nnodes > 1 ? NULL : "one node";
}

static const char *baseline(const registry_model_t *m)
{
    (void)m;
    return "a baseline, LOOM_ALGO only";
}

static const char *baseline_nodes(const registry_model_t *m)
{
    return one_node(m) ? one_node(m) : baseline(m);
}

/* Two ranks sharing memory: recursive doubling is one exchange of the whole buffer, pulled by
 * cross-memory attach while the peer does the same, whereas the ring's second half waits slice
 * by slice for the peer's reductions, which the model does not see. Measured (64 MiB float,
 * 2-core VM, real data): rd 36-40 ms, ring 54-61 ms out of place, in place alike
 * (perf/RESULTS.md). Over TCP the ring stays ahead (34-41 against 53-58 ms), so the model
 * decides there. */
static const char *rd_preferred(const registry_model_t *m, uint64_t bytes)
{
    /* (not where the node segment takes the size: it has no messages to send) */
    if (m->nranks == 2 && m->nnodes <= 1 && m->shared_mem && bytes > m->seg_bytes)
        return "two ranks sharing memory, measured";
    return NULL;
}

/* The generators in one signature; the flat ones need no layout. */
static void gen_ring(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                     const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    ring_allreduce(s, desc, count, prm, inplace, avg);
}

static void gen_rd(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                   const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    rd_allreduce(s, desc, count, prm, inplace, avg);
}

static void gen_rab(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                    const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    rab_allreduce(s, desc, count, prm, inplace, avg);
}

static void gen_tree(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                     const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    tree_allreduce(s, desc, count, prm, inplace, avg);
}

static void gen_hier_tree(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                          const ring_params_t *prm, bool inplace, bool avg)
{
    hier_allreduce_with(s, desc, topo, count, prm, inplace, avg, tree_allreduce_region);
}

static void gen_hier_rab(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                         const ring_params_t *prm, bool inplace, bool avg)
{
    hier_allreduce_with(s, desc, topo, count, prm, inplace, avg, rab_allreduce_region);
}

static void gen_hier_rd(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                        const ring_params_t *prm, bool inplace, bool avg)
{
    hier_allreduce_with(s, desc, topo, count, prm, inplace, avg, rd_allreduce_region);
}

static void gen_ps(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                   const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    ps_allreduce(s, desc, count, prm, inplace, avg);
}

/* ---- oneshot (src/algo/oneshot.c) ---- */
/* The full mesh it connects: each rank reaches every other one, p - 1 connections apiece. Past
 * this many ranks the mesh (and p - 1 copies of the buffer per rank) costs more than the steps
 * it saves: recursive doubling or the tree take those sizes. */
#define ONESHOT_MAX_RANKS 16

static const char *oneshot_unfit(const registry_model_t *m)
{
    return m->nranks > ONESHOT_MAX_RANKS ? "more than 16 ranks (a full mesh of connections)" : NULL;
}

/* One dependent step; its p - 1 messages leave one after another, each costing the sender (and
 * the receiver) c_msg of the step's latency on top of the first; p - 1 buffers through each
 * rank's link and p - 1 reductions of the whole buffer. */
static double oneshot_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    double extra = t.p - 2 > 0 ? t.p - 2 : 0;
    return t.a_flat * (1 + c_msg * extra) + (t.p - 1) * nb * t.b_flat + (t.p - 1) * nb * m->gamma;
}

static void gen_oneshot(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                        const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    oneshot_allreduce(s, desc, count, prm, inplace, avg);
}
/* ---- end oneshot ---- */

/* ---- segment (core/nodeseg.c: the one-shot fold through one shared segment) ---- */
/* The fixed cost of one exchange through the segment: every rank's arrival word crosses to
 * every other core once (a cache line each) and the waiter notices it; no system call, no
 * message. Measured: perf/RESULTS.md, session 13. */
static const double c_seg = 1.0e-6;

static const char *segment_unfit(const registry_model_t *m)
{
    return m->seg_bytes ? NULL
                        : "no node segment (several nodes, a split communicator, LOOM_TRANSPORT, "
                          "LOOM_SEGMENT=0, or a rank could not map it)";
}

static uint64_t segment_max(const registry_model_t *m)
{
    return m->seg_bytes;
}

/* The segment's bytes cost less than the same bytes through a transport: its inputs are read
 * from the peers' slots, hot in the shared cache, not copied through a ring of buffers with its
 * flags. Measured on the reference host (perf/RESULTS.md, session 17's nofile sweep, the segment
 * forced): from 8 to 32 KiB its time grows by 0.43 (8 ranks) and 0.35 (4 ranks) of what b_loc
 * and gamma predict below, from 32 to 128 KiB by 0.67 and 0.41; and on the 2-core dev VM, 8
 * ranks (session 20), 85 us at 64 KiB against 233 predicted. Without it the model took rd at
 * 32 and 64 KiB on the dev VM, 1.4-2.9x slower than the segment there. */
static const double c_seg_bytes = 0.5;

/* One dependent step of c_seg (plus the wake-up where ranks block); the input copied in once
 * and p inputs read by every rank, p - 1 reductions of the whole buffer, at c_seg_bytes of the
 * transport's cost. */
static double segment_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    double wake = m->oversubscribed ? c_wake : 0;
    return c_seg + wake + c_seg_bytes * ((t.p + 1) * nb * m->b_loc + (t.p - 1) * nb * m->gamma);
}
/* ---- end segment ---- */

/* ---- determ (src/algo/determ.c) ---- */
static const char *determ_only(const registry_model_t *m)
{
    (void)m;
    return "LOOM_DETERMINISTIC=1 (or LOOM_ALGO) only";
}

static void gen_determ(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                       const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    determ_allreduce(s, desc, count, prm, inplace, avg);
}
/* ---- end determ ---- */

/* Row order breaks ties between equal predictions: the earlier row wins. */
const registry_algo_t registry_algos[ALGO_COUNT] = {
    [ALGO_RING] = {.name = "ring",
                   .applies = "any layout",
                   .doc = "reduce-scatter then allgather around one ring: 2(p-1) steps, "
                          "2(p-1)/p of the buffer per rank (reduce, broadcast: a pipelined "
                          "chain of p-1 hops)",
                   .cost = ring_cost,
                   .gen = gen_ring,
                   .rooted = {[ROOTED_REDUCE] = {ring_reduce_cost, gen_ring_reduce},
                              [ROOTED_BROADCAST] = {ring_bcast_cost, gen_ring_bcast}}},
    [ALGO_HIER] = {.name = "hier",
                   .applies = "several nodes",
                   .doc = "node-local reduce-scatter, a cross-node ring per shard, node-local "
                          "allgather: 2(g-1) + 2(n-1) steps (hier:X: X across nodes)",
                   .unfit = one_node,
                   .cost = hier_cost,
                   .gen = hier_allreduce},
    [ALGO_HIER_LEADER] = {.name = "hier_leader",
                          .applies = "LOOM_ALGO only (a baseline for several nodes)",
                          .doc = "reduce to each node's first rank, allreduce among those, "
                                 "broadcast back: the leader's link carries everything",
                          .unfit = baseline_nodes,
                          .gen = hier_leader_allreduce},
    [ALGO_PS] = {.name = "ps",
                 .applies = "LOOM_ALGO only (a baseline)",
                 .doc = "parameter server: everyone to rank 0 and back; rank 0 moves 2(p-1) "
                        "buffers",
                 .unfit = baseline,
                 .gen = gen_ps},
    [ALGO_RD] = {.name = "rd",
                 .applies = "any layout; preferred for two ranks sharing memory",
                 .doc = "recursive doubling: log2(p) steps of the whole buffer, for small "
                        "buffers",
                 .cost = rd_cost,
                 .preferred = rd_preferred,
                 .gen = gen_rd},
    [ALGO_RAB] = {.name = "rabenseifner",
                  .applies = "any layout",
                  .doc = "recursive-halving reduce-scatter then recursive-doubling allgather: "
                         "2 log2(p) steps, 2(p-1)/p of the buffer (extra ranks folded)",
                  .cost = rab_cost,
                  .gen = gen_rab},
    [ALGO_TREE] = {.name = "tree",
                   .applies = "any layout",
                   .doc = "pipelined double binary tree, half the buffer on each: 2 log2(p) "
                          "hops, about 2x the buffer per rank (reduce, broadcast: log2(p) "
                          "hops, the root above both trees)",
                   .cost = tree_cost,
                   .gen = gen_tree,
                   .rooted = {[ROOTED_REDUCE] = {tree_reduce_cost, gen_tree_reduce},
                              [ROOTED_BROADCAST] = {tree_bcast_cost, gen_tree_bcast}}},
    [ALGO_HIER_TREE] = {.name = "hier:tree",
                        .applies = "several nodes",
                        .doc = "hier with a double binary tree across nodes: 2(g-1) + "
                               "2 log2(n) steps",
                        .unfit = one_node,
                        .cost = hier_tree_cost,
                        .gen = gen_hier_tree},
    [ALGO_HIER_RAB] = {.name = "hier:rabenseifner",
                       .applies = "several nodes",
                       .doc = "hier with halving/doubling across nodes: 2(g-1) + 2 log2(n) steps",
                       .unfit = one_node,
                       .cost = hier_rab_cost,
                       .gen = gen_hier_rab},
    [ALGO_HIER_RD] = {.name = "hier:rd",
                      .applies = "several nodes",
                      .doc = "hier with recursive doubling across nodes: 2(g-1) + log2(n) steps "
                             "of the node's whole shard",
                      .unfit = one_node,
                      .cost = hier_rd_cost,
                      .gen = gen_hier_rd},
    [ALGO_DETERM] = {.name = "determ",
                     .applies = "LOOM_DETERMINISTIC=1 (every reducing collective), else LOOM_ALGO "
                                "only",
                     .doc = "each element the left fold of the inputs in rank order: per block "
                            "an owner folds all p in order, then allgather; bitwise the same "
                            "for any algorithm, channels, slice or layout",
                     .unfit = determ_only,
                     .gen = gen_determ},
    [ALGO_ONESHOT] = {.name = "oneshot",
                      .applies = "up to 16 ranks",
                      .doc = "every input to every rank at once, each folds all p in rank order: "
                             "1 step, p-1 buffers in and out per rank, for the smallest buffers",
                      .unfit = oneshot_unfit,
                      .cost = oneshot_cost,
                      .gen = gen_oneshot},
    [ALGO_SEGMENT] = {.name = "segment",
                      .applies = "one node, host memory, up to LOOM_SEGMENT bytes",
                      .doc = "oneshot's fold through the node's shared segment: each rank "
                             "copies its input in once, waits for every rank's arrival word, "
                             "folds all p in rank order; no messages (without a segment: "
                             "oneshot's schedule)",
                      .unfit = segment_unfit,
                      .max_bytes = segment_max,
                      .cost = segment_cost,
                      .gen = gen_oneshot},
};

const registry_algo_t *registry_get(int id)
{
    return id >= 0 && id < ALGO_COUNT ? &registry_algos[id] : NULL;
}

int registry_find(const char *name)
{
    for (int i = 0; i < ALGO_COUNT; i++)
        if (strcmp(name, registry_algos[i].name) == 0) return i;
    return -1;
}

loomResult_t registry_parse(const char *name, int *algo)
{
    *algo = ALGO_AUTO;
    if (name[0] == '\0') return loomSuccess;
    char names[512];
    int o = 0;
    for (int i = 0; i < ALGO_COUNT; i++) {
        if (strcmp(name, registry_algos[i].name) == 0) {
            *algo = i;
            return loomSuccess;
        }
        o += snprintf(names + o, sizeof(names) - (size_t)o, "%s%s", i ? ", " : "",
                      registry_algos[i].name);
        if (o >= (int)sizeof(names)) o = (int)sizeof(names) - 1;
    }
    return base_error(loomInvalidUsage, LOG_INIT, "LOOM_ALGO=%s: unknown algorithm (%s)", name,
                      names);
}

static const char *const rooted_none[ROOTED_COUNT] = {"no reduce form", "no broadcast form"};

/* Whether automatic selection may take row i for op (-1: allreduce, else ROOTED_*), and why not
 * (NULL: it may). */
static const char *row_unfit(const registry_model_t *m, int i, int op, uint64_t bytes)
{
    const registry_algo_t *a = &registry_algos[i];
    if (op >= 0 && a->rooted[op].gen == NULL) return rooted_none[op];
    if (a->unfit && a->unfit(m)) return a->unfit(m);
    if (op < 0 && a->max_bytes && bytes > a->max_bytes(m)) return "larger than its limit";
    if ((op < 0 ? a->cost : a->rooted[op].cost) == NULL) return "no cost model";
    return NULL;
}

static double row_cost(const registry_model_t *m, int i, int op, double nb)
{
    const registry_algo_t *a = &registry_algos[i];
    return op < 0 ? a->cost(m, nb) : a->rooted[op].cost(m, nb);
}

/* Preference is measured for allreduce only. */
static const char *row_preferred(const registry_model_t *m, int i, int op, uint64_t bytes)
{
    const registry_algo_t *a = &registry_algos[i];
    return op < 0 && row_unfit(m, i, op, bytes) == NULL && a->preferred ? a->preferred(m, bytes)
                                                                        : NULL;
}

static int pick_op(const registry_model_t *m, int op, uint64_t bytes)
{
    for (int i = 0; i < ALGO_COUNT; i++)
        if (row_preferred(m, i, op, bytes)) return i;
    int pick = -1;
    double best = 0;
    for (int i = 0; i < ALGO_COUNT; i++) {
        if (row_unfit(m, i, op, bytes)) continue;
        double c = row_cost(m, i, op, (double)bytes);
        if (pick < 0 || c < best) pick = i, best = c;
    }
    return pick < 0 ? ALGO_RING : pick;
}

const char *registry_unfit(const registry_model_t *m, int id, uint64_t bytes)
{
    return id >= 0 && id < ALGO_COUNT ? row_unfit(m, id, -1, bytes) : "not an algorithm";
}

int registry_pick(const registry_model_t *m, uint64_t bytes)
{
    return pick_op(m, -1, bytes);
}

int registry_pick_rooted(const registry_model_t *m, int op, uint64_t bytes)
{
    return pick_op(m, op, bytes);
}

int registry_rooted_forced(int forced, int op)
{
    const registry_algo_t *a = registry_get(forced);
    return a && op >= 0 && op < ROOTED_COUNT && a->rooted[op].gen ? forced : -1;
}

static const char *explain_op(const registry_model_t *m, int op, uint64_t bytes, int pick,
                              char *buf, size_t len)
{
    size_t o = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__);                         \
    } while (0)
    double nb = (double)bytes;
    const registry_algo_t *pa = &registry_algos[pick];
    const char *why = row_preferred(m, pick, op, bytes);
    bool costed = row_unfit(m, pick, op, bytes) == NULL;
    double pc = costed ? row_cost(m, pick, op, nb) : 0;
    if (len) buf[0] = '\0';
    if (why)
        PUT("-> %s (preferred: %s; the model predicts %.1f us)", pa->name, why, pc * 1e6);
    else if (costed)
        PUT("-> %s, predicted %.1f us", pa->name, pc * 1e6);
    else
        PUT("-> %s", pa->name);
    for (int i = 0; i < ALGO_COUNT; i++) {
        if (i == pick) continue;
        const registry_algo_t *a = &registry_algos[i];
        const char *unfit = row_unfit(m, i, op, bytes);
        if (unfit) {
            PUT("; %s n/a (%s)", a->name, unfit);
            continue;
        }
        double c = row_cost(m, i, op, nb);
        if (!costed)
            PUT("; %s %.1f us", a->name, c * 1e6);
        else if (c > pc)
            PUT("; %s %.1f us slower", a->name, c * 1e6);
        else if (c < pc)
            PUT("; %s %.1f us faster in the model, not taken", a->name, c * 1e6);
        else
            PUT("; %s %.1f us equal%s", a->name, c * 1e6, why ? "" : ", later in the table");
    }
#undef PUT
    return buf;
}

const char *registry_explain(const registry_model_t *m, uint64_t bytes, int pick, char *buf,
                             size_t len)
{
    return explain_op(m, -1, bytes, pick, buf, len);
}

const char *registry_explain_rooted(const registry_model_t *m, int op, uint64_t bytes, int pick,
                                    char *buf, size_t len)
{
    return explain_op(m, op, bytes, pick, buf, len);
}
