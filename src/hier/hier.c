/* Hierarchical allreduce schedules (costs in hier.h). */
#include "hier.h"

#include <stdlib.h>

#include "base.h"

static inline int mod(int a, int p) { return ((a % p) + p) % p; }

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
    for (int n = 0; n < t->nnodes; n++) m = LOOM_MAX(m, t->node_start[n + 1] - t->node_start[n]);
    return m;
}

/* Sends (kind 0), receive-and-reduces (1) or receives (2) every slice of the shards that make up
 * local chunk `chunk` (shards k with k mod ls == chunk). */
static void chunk_steps(sched_t *s, uint16_t desc, int kind, int peer, uint32_t src, uint32_t dst,
                        uint64_t count, int nshards, int ls, int chunk, uint64_t sl, uint8_t fl)
{
    for (int k = chunk; k < nshards; k += ls) {
        span_t sp = shard_span(count, nshards, k);
        uint64_t S = sched_nslices(sp.len, sl);
        for (uint64_t j = 0; j < S; j++) {
            uint64_t o = sp.off + j * sl, len = sched_slice_len(sp.len, sl, j);
            if (kind == 0) sched_send(s, desc, peer, src, o, len);
            else if (kind == 1) sched_recv_reduce(s, desc, peer, src, o, dst, o, len, fl);
            else sched_recv(s, desc, peer, dst, o, len);
        }
    }
}

void hier_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *t, uint64_t count,
                    const ring_params_t *prm, bool inplace, bool avg)
{
    if (count == 0) return;
    int me = s->rank, node = t->node_of[me], N = t->nnodes;
    const int *local = t->node_ranks + t->node_start[node];
    int ls = t->node_start[node + 1] - t->node_start[node], li = 0;
    while (local[li] != me) li++;
    int S = max_local(t);
    uint64_t sl = prm->slice_elems;
    int next = local[mod(li + 1, ls)], prev = local[mod(li - 1, ls)];
    /* 1. node-local reduce-scatter: at step k send chunk li-k-1 and reduce chunk li-k-2, so that
     * the last reduction completes chunk li. Partial sums go to the output buffer. */
    if (ls == 1) {
        if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, 0, SCHED_BUF_RECV, 0, count, 0);
    } else {
        for (int k = 0; k < ls - 1; k++) {
            int sc = mod(li - k - 1, ls), rc = mod(li - k - 2, ls);
            uint8_t fl = (avg && N == 1 && k == ls - 2) ? STEP_F_AVG : 0;
            chunk_steps(s, desc, 0, next, k == 0 ? SCHED_BUF_SEND : SCHED_BUF_RECV, 0, count, S,
                        ls, sc, sl, 0);
            chunk_steps(s, desc, 1, prev, SCHED_BUF_SEND, SCHED_BUF_RECV, count, S, ls, rc, sl,
                        fl);
        }
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
            ring_allreduce_region(s, desc, &g, SCHED_BUF_RECV, SCHED_BUF_RECV, sp.off, sp.len,
                                  prm, true, avg);
        }
        free(ranks);
    }
    /* 3. node-local allgather of the owned chunks */
    for (int k = 0; k < ls - 1; k++) {
        int sc = mod(li - k, ls), rc = mod(li - k - 1, ls);
        chunk_steps(s, desc, 0, next, SCHED_BUF_RECV, 0, count, S, ls, sc, sl, 0);
        chunk_steps(s, desc, 2, prev, 0, SCHED_BUF_RECV, count, S, ls, rc, sl, 0);
    }
}

void hier_leader_allreduce(sched_t *s, uint16_t desc, const sched_topo_t *t, uint64_t count,
                           const ring_params_t *prm, bool inplace, bool avg)
{
    if (count == 0) return;
    int me = s->rank, node = t->node_of[me], N = t->nnodes;
    const int *local = t->node_ranks + t->node_start[node];
    int ls = t->node_start[node + 1] - t->node_start[node], li = 0;
    while (local[li] != me) li++;
    ring_group_t lg = {.n = ls, .me = li, .ranks = local};
    /* 1. reduce to the node's leader (local rank 0) */
    ring_reduce_group(s, desc, &lg, count, 0, prm, inplace, avg && N == 1);
    /* 2. allreduce among leaders */
    if (N > 1 && li == 0) {
        int *leaders = malloc((size_t)N * sizeof(int));
        if (leaders == NULL) {
            s->oom = true;
            return;
        }
        for (int n = 0; n < N; n++) leaders[n] = t->node_ranks[t->node_start[n]];
        ring_group_t g = {.n = N, .me = node, .ranks = leaders};
        ring_allreduce_region(s, desc, &g, SCHED_BUF_RECV, SCHED_BUF_RECV, 0, count, prm, true,
                              avg);
        free(leaders);
    }
    /* 3. broadcast from the leader's result */
    if (ls > 1) ring_broadcast_group(s, desc, &lg, count, 0, SCHED_BUF_RECV, prm, true);
}

void ps_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                  bool inplace, bool avg)
{
    int p = s->nranks, r = s->rank;
    if (count == 0) return;
    uint64_t sl = prm->slice_elems, S = sched_nslices(count, sl);
    if (p == 1) {
        if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, 0, SCHED_BUF_RECV, 0, count, 0);
        return;
    }
    if (r != 0) {
        for (uint64_t j = 0; j < S; j++)
            sched_send(s, desc, 0, SCHED_BUF_SEND, j * sl, sched_slice_len(count, sl, j));
        for (uint64_t j = 0; j < S; j++)
            sched_recv(s, desc, 0, SCHED_BUF_RECV, j * sl, sched_slice_len(count, sl, j));
        return;
    }
    /* The server folds the workers in rank order, slice by slice. */
    for (uint64_t j = 0; j < S; j++)
        for (int q = 1; q < p; q++)
            sched_recv_reduce(s, desc, q, q == 1 ? SCHED_BUF_SEND : SCHED_BUF_RECV, j * sl,
                              SCHED_BUF_RECV, j * sl, sched_slice_len(count, sl, j),
                              (avg && q == p - 1) ? STEP_F_AVG : 0);
    for (int q = 1; q < p; q++)
        for (uint64_t j = 0; j < S; j++)
            sched_send(s, desc, q, SCHED_BUF_RECV, j * sl, sched_slice_len(count, sl, j));
}
