/*
 * Hierarchical allreduce: use the fast links inside a node and the slow ones across nodes only
 * for what must cross them.
 *
 * n nodes of up to g ranks; the buffer cut into g shards:
 *   1. node-local reduce-scatter: local rank j ends with its node's sum of shards j, j+g_node...
 *   2. each shard allreduced across nodes by the ranks that own it, all shards at once, so every
 *      local rank (and every NIC) carries traffic; by a ring (hier), or by any region allreduce
 *      (hier_allreduce_with: tree, rabenseifner or rd, so that 128 nodes cost 2·7 tree hops or
 *      2·7 halving/doubling steps instead of 2·127 ring steps)
 *   3. node-local allgather
 *   steps 2(g-1) + 2(n-1) with a ring across nodes; bytes across each node's link 2(n-1)/n of
 *   the buffer (a flat ring carries 2(p-1)/p). Uneven nodes: a node with fewer ranks gives several
 * shards to a rank.
 */
#include "algo.h"

#include <stdlib.h>

#include "base.h"

typedef struct {
    uint64_t off, len;
} span_t;

static span_t shard_span(uint64_t count, int nshards, int k)
{
    uint64_t a = sched_part_off(count, (uint64_t)nshards, (uint64_t)k);
    uint64_t b = sched_part_off(count, (uint64_t)nshards, (uint64_t)k + 1);
    span_t s = {a, b - a};
    return s;
}

static int max_local(const sched_topo_t *t)
{
    int m = 1;
    for (int n = 0; n < t->nnodes; n++)
        m = LOOM_MAX(m, t->node_start[n + 1] - t->node_start[n]);
    return m;
}

/* Local chunk c is made of shards c, c+ls, c+2ls... each cut into pieces: its "units", in the
 * order they pass the node-local ring. Alone on one node (N == 1), a shard's units are its slices
 * in order. Across nodes, a shard is cut as its cross-node ring cuts it, and its units come in
 * the order that ring, as run by this node, reads them (before it: the reduce-scatter, finish
 * false) or finishes them (after it: the allgather, finish true). The cross-node ring starts on
 * every chunk and channel of its region at once; node-local slices in plain order would hand it
 * its second piece only halfway through the node-local reduce-scatter, and the node-local
 * allgather would wait for the ring's last slice before most of its own. Which rank reduces what,
 * and in which order, does not change: only when and in which cut. */
typedef struct {
    ring_span_t *u;
    uint64_t n;
} units_t;

static bool chunk_units(units_t *out, uint64_t count, int nshards, int ls, int c,
                        const ring_params_t *prm, int N, int node, bool finish)
{
    uint64_t sl = prm->slice_elems, n = 0;
    out->u = NULL;
    out->n = 0;
    for (int k = c; k < nshards; k += ls) {
        span_t sp = shard_span(count, nshards, k);
        ring_span_t *pc = NULL;
        uint64_t np;
        if (N > 1) {
            bool oom = false;
            np = ring_allreduce_pieces(sp.len, prm, N, node, finish, &pc, &oom);
            if (oom) return false;
        } else {
            np = sched_nslices(sp.len, sl);
        }
        ring_span_t *u = realloc(out->u, (size_t)(n + np) * sizeof(*u) + 1);
        if (u == NULL) {
            free(pc);
            return false;
        }
        out->u = u;
        for (uint64_t j = 0; j < np; j++) {
            if (pc) {
                u[n + j].off = sp.off + pc[j].off;
                u[n + j].len = pc[j].len;
            } else {
                u[n + j].off = sp.off + j * sl;
                u[n + j].len = sched_slice_len(sp.len, sl, j);
            }
        }
        free(pc);
        n += np;
    }
    out->n = n;
    return true;
}

static ring_span_t unit_at(const units_t *cu, uint64_t u)
{
    ring_span_t none = {0, 0};
    return u < cu->n ? cu->u[u] : none;
}

/* A node-local ring over chunks of shards, emitted by wavefront (step + unit) like the flat
 * ring, so that each unit's last step (and the cross-node phase waiting for it) comes early.
 * reduce: reduce-scatter (step k sends chunk li-k-1, reduces chunk li-k-2, ending with chunk
 * li complete here); else allgather (step k forwards chunk li-k, receives chunk li-k-1). */
static void local_ring(sched_t *s, uint16_t desc, const int *local, int ls, int li, uint64_t count,
                       int nshards, const ring_params_t *prm, int N, int node, bool reduce,
                       uint8_t last_flags)
{
    int next = local[algo_mod(li + 1, ls)], prev = local[algo_mod(li - 1, ls)];
    int K = ls - 1;
    units_t *cu = calloc((size_t)ls, sizeof(*cu));
    if (cu == NULL) {
        s->oom = true;
        return;
    }
    uint64_t U = 0;
    for (int c = 0; c < ls; c++) {
        if (!chunk_units(&cu[c], count, nshards, ls, c, prm, N, node, !reduce)) {
            s->oom = true;
            goto out;
        }
        U = LOOM_MAX(U, cu[c].n);
    }
    for (int64_t d = 0; d < (int64_t)K + (int64_t)U - 1; d++) {
        for (int k = (int)LOOM_MIN((int64_t)K - 1, d); k >= 0 && d - k < (int64_t)U; k--) {
            uint64_t u = (uint64_t)(d - k);
            int sc = reduce ? algo_mod(li - k - 1, ls) : algo_mod(li - k, ls);
            int rc = reduce ? algo_mod(li - k - 2, ls) : algo_mod(li - k - 1, ls);
            ring_span_t a = unit_at(&cu[sc], u);
            ring_span_t b = unit_at(&cu[rc], u);
            uint32_t sbuf = reduce && k == 0 ? SCHED_BUF_SEND : SCHED_BUF_RECV;
            sched_send(s, desc, next, sbuf, a.off, a.len);
            if (reduce)
                sched_recv_reduce(s, desc, prev, SCHED_BUF_SEND, b.off, SCHED_BUF_RECV, b.off,
                                  b.len, k == K - 1 ? last_flags : 0);
            else
                sched_recv(s, desc, prev, SCHED_BUF_RECV, b.off, b.len);
        }
    }
out:
    for (int c = 0; c < ls; c++)
        free(cu[c].u);
    free(cu);
}

ring_group_t algo_node_group(const sched_t *s, const sched_topo_t *t)
{
    int node = t->node_of[s->rank];
    ring_group_t g = {.n = t->node_start[node + 1] - t->node_start[node],
                      .me = 0,
                      .ranks = t->node_ranks + t->node_start[node]};
    while (g.ranks[g.me] != s->rank)
        g.me++;
    return g;
}

void hier_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *t, uint64_t count,
                    const ring_params_t *prm, bool inplace, bool avg)
{
    hier_allreduce_with(s, desc, t, count, prm, inplace, avg, ring_allreduce_region);
}

void hier_allreduce_with(sched_t *s, uint16_t desc, const sched_topo_t *t, uint64_t count,
                         const ring_params_t *prm, bool inplace, bool avg, algo_region_fn cross)
{
    if (count == 0) return;
    int node = t->node_of[s->rank], N = t->nnodes;
    ring_group_t lg = algo_node_group(s, t);
    const int *local = lg.ranks;
    int ls = lg.n, li = lg.me;
    int S = max_local(t);
    /* 1. node-local reduce-scatter; partial sums go to the output buffer */
    if (ls == 1) {
        if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, 0, SCHED_BUF_RECV, 0, count, 0);
    } else {
        local_ring(s, desc, local, ls, li, count, S, prm, N, node, true,
                   avg && N == 1 ? STEP_F_AVG : 0);
    }
    /* 2. each owned shard across nodes, by the ranks that own it in every node */
    if (N > 1) {
        int *ranks = malloc((size_t)N * sizeof(int));
        if (ranks == NULL) {
            s->oom = true;
            return;
        }
        for (int k = li; k < S; k += ls) {
            for (int n = 0; n < N; n++) {
                int nls = t->node_start[n + 1] - t->node_start[n];
                ranks[n] = t->node_ranks[t->node_start[n] + k % nls];
            }
            ring_group_t g = {.n = N, .me = node, .ranks = ranks};
            span_t sp = shard_span(count, S, k);
            cross(s, desc, &g, SCHED_BUF_RECV, SCHED_BUF_RECV, sp.off, sp.len, prm, true, avg);
        }
        free(ranks);
    }
    /* 3. node-local allgather of the owned chunks */
    if (ls > 1) local_ring(s, desc, local, ls, li, count, S, prm, N, node, false, 0);
}
