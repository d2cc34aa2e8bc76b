/*
 * Hierarchical allreduce through leaders, the classic hierarchical synchronisation, kept as a
 * baseline for hier:
 *   1. node-local reduce to the node's first rank (a pipelined chain)
 *   2. allreduce among those leaders (a ring across nodes)
 *   3. node-local broadcast from the leader
 *   steps about 2(g-1) + 2(n-1) for n nodes of g ranks; the leader's link carries 2(n-1)/n of the
 *   whole buffer while the other ranks' links stay idle (hier spreads it over every rank).
 */
#include "algo.h"

#include <stdlib.h>

#include "base.h"

void hier_leader_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *t, uint64_t count,
                           const ring_params_t *prm, bool inplace, bool avg)
{
    if (count == 0) return;
    int node = t->node_of[s->rank], N = t->nnodes;
    ring_group_t lg = algo_node_group(s, t);
    int ls = lg.n, li = lg.me;
    /* 1. reduce to the node's leader (local rank 0) */
    ring_reduce_group(s, desc, &lg, count, 0, prm, inplace, avg && N == 1);
    /* 2. allreduce among leaders */
    if (N > 1 && li == 0) {
        int *leaders = malloc((size_t)N * sizeof(int));
        if (leaders == NULL) {
            s->oom = true;
            return;
        }
        for (int n = 0; n < N; n++)
            leaders[n] = t->node_ranks[t->node_start[n]];
        ring_group_t g = {.n = N, .me = node, .ranks = leaders};
        ring_allreduce_region(s, desc, &g, SCHED_BUF_RECV, SCHED_BUF_RECV, 0, count, prm, true,
                              avg);
        free(leaders);
    }
    /* 3. broadcast from the leader's result */
    if (ls > 1) ring_broadcast_group(s, desc, &lg, count, 0, SCHED_BUF_RECV, prm, true);
}
