/* The allreduce algorithm table, and selection over it (registry.h). */
#include "registry.h"

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
    double lg, folds;      /* recursive doubling: log2 of the largest power of two <= p, and the
                              extra steps (fold and unfold) for the ranks beyond it */
} model_terms_t;

static model_terms_t terms(const registry_model_t *m)
{
    bool multi = m->nnodes > 1;
    model_terms_t t = {.p = m->nranks,
                       .n = m->nnodes,
                       .g = (double)m->nranks / m->nnodes,
                       .a_flat = multi ? m->a_net : m->a_loc,
                       .b_flat = multi ? m->b_net : m->b_loc};
    while ((1 << (int)(t.lg + 1)) <= m->nranks)
        t.lg++;
    t.folds = (1 << (int)t.lg) < m->nranks ? 2 : 0;
    return t;
}

static double ring_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    double p = t.p;
    return 2 * (p - 1) * t.a_flat + 2 * (p - 1) / p * nb * t.b_flat + (p - 1) / p * nb * m->gamma;
}

static double rd_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    double s = t.lg + t.folds;
    return s * t.a_flat + s * nb * t.b_flat + (t.lg + t.folds / 2) * nb * m->gamma;
}

static double hier_cost(const registry_model_t *m, double nb)
{
    model_terms_t t = terms(m);
    double g = t.g, n = t.n;
    return 2 * (g - 1) * m->a_loc + 2 * (g - 1) / g * nb * m->b_loc + 2 * (n - 1) * m->a_net +
           2 * (n - 1) / n * nb * m->b_net + ((g - 1) / g + (n - 1) / n) * nb * m->gamma;
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
static const char *rd_preferred(const registry_model_t *m)
{
    if (m->nranks == 2 && m->nnodes <= 1 && m->shared_mem)
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

static void gen_ps(sched_t *s, uint16_t desc, const sched_topo_t *topo, uint64_t count,
                   const ring_params_t *prm, bool inplace, bool avg)
{
    (void)topo;
    ps_allreduce(s, desc, count, prm, inplace, avg);
}

/* Row order breaks ties between equal predictions: the earlier row wins. */
const registry_algo_t registry_algos[ALGO_COUNT] = {
    [ALGO_RING] = {.name = "ring",
                   .applies = "any layout",
                   .doc = "reduce-scatter then allgather around one ring: 2(p-1) steps, "
                          "2(p-1)/p of the buffer per rank",
                   .cost = ring_cost,
                   .gen = gen_ring},
    [ALGO_HIER] = {.name = "hier",
                   .applies = "several nodes",
                   .doc = "node-local reduce-scatter, a cross-node ring per shard, node-local "
                          "allgather: 2(g-1) + 2(n-1) steps",
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
};

const registry_algo_t *registry_get(int id)
{
    return id >= 0 && id < ALGO_COUNT ? &registry_algos[id] : NULL;
}

loomResult_t registry_parse(const char *name, int *algo)
{
    *algo = ALGO_AUTO;
    if (name[0] == '\0') return loomSuccess;
    char names[256];
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

/* Whether automatic selection may take row i, and why not (NULL: it may). */
static const char *row_unfit(const registry_model_t *m, int i)
{
    const registry_algo_t *a = &registry_algos[i];
    if (a->unfit && a->unfit(m)) return a->unfit(m);
    if (a->cost == NULL) return "no cost model";
    return NULL;
}

static const char *row_preferred(const registry_model_t *m, int i)
{
    const registry_algo_t *a = &registry_algos[i];
    return row_unfit(m, i) == NULL && a->preferred ? a->preferred(m) : NULL;
}

int registry_pick(const registry_model_t *m, uint64_t bytes)
{
    for (int i = 0; i < ALGO_COUNT; i++)
        if (row_preferred(m, i)) return i;
    int pick = -1;
    double best = 0;
    for (int i = 0; i < ALGO_COUNT; i++) {
        if (row_unfit(m, i)) continue;
        double c = registry_algos[i].cost(m, (double)bytes);
        if (pick < 0 || c < best) pick = i, best = c;
    }
    return pick < 0 ? ALGO_RING : pick;
}

const char *registry_explain(const registry_model_t *m, uint64_t bytes, int pick, char *buf,
                             size_t len)
{
    size_t o = 0;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (o < len) o += (size_t)snprintf(buf + o, len - o, __VA_ARGS__);                         \
    } while (0)
    double nb = (double)bytes;
    const registry_algo_t *pa = &registry_algos[pick];
    const char *why = row_preferred(m, pick);
    bool costed = row_unfit(m, pick) == NULL;
    double pc = costed ? pa->cost(m, nb) : 0;
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
        const char *unfit = row_unfit(m, i);
        if (unfit) {
            PUT("; %s n/a (%s)", a->name, unfit);
            continue;
        }
        double c = a->cost(m, nb);
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
