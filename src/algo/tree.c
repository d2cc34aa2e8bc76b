/*
 * Pipelined double binary tree allreduce (the shape NCCL uses): the buffer is cut in two halves,
 * each reduced up one binary tree and broadcast back down it, slice by slice, so that a slice
 * climbs while the next is still being reduced below it. The two trees are placed so that the
 * interior nodes of one are (as far as the rank count allows) leaves of the other: every rank
 * then sends and receives about the same amount, and no rank is interior in both.
 *
 * Costs per rank, n bytes, depth D = ceil(log2(p+1)): 2D hops on the critical path of a slice,
 * plus one slice time per further slice; an interior rank of one tree receives two children's
 * halves and sends one up, then receives one and sends two down, a leaf of the other tree sends
 * and receives one half: about 2n in and out in all, like the ring, in 2D steps instead of
 * 2(p-1). With S slices per half the time is about (2D + S - 1) slice times.
 *
 * Tree shape: an in-order tree over positions 0..p-1, the root of [lo, hi) its middle m with
 * subtrees [lo, m) and [m+1, hi); so a node's subtree is a run of consecutive positions and each
 * partial sum is over consecutive ranks (the symbolic checker's interval values follow it).
 * Tree 0 puts rank r at position r; tree 1 either shifts positions by one or mirrors them,
 * whichever leaves fewer ranks interior in both trees (for p = 2^k - 1 the shift leaves one).
 * An interior node reduces its left child's sum into its own, then its right child's.
 *
 * Order of emission: iteration i reduces slice i of both trees and broadcasts slice i - lag,
 * lag = 2D + 1 slices behind, by when slice i - lag has come back to the root; sends to one
 * peer start in schedule order, and a peer that is parent in one tree and child in the other
 * would otherwise hold its next reduction behind a broadcast that is not ready.
 */
#include "algo.h"

#include <stdlib.h>

#include "base.h"

typedef struct {
    int parent, child[2]; /* positions; -1 for none */
} tnode_t;

/* The node at position pos of the in-order tree over [0, n). */
static tnode_t tree_node(int n, int pos)
{
    int lo = 0, hi = n, parent = -1;
    for (;;) {
        int m = lo + (hi - lo) / 2;
        if (pos == m) {
            tnode_t t = {
                parent,
                {m > lo ? lo + (m - lo) / 2 : -1, hi > m + 1 ? m + 1 + (hi - m - 1) / 2 : -1}};
            return t;
        }
        parent = m;
        if (pos < m)
            hi = m;
        else
            lo = m + 1;
    }
}

static int tree_depth(int n)
{
    int d = 0;
    while ((1 << d) - 1 < n)
        d++;
    return d;
}

static bool interior(int n, int pos)
{
    tnode_t t = tree_node(n, pos);
    return t.child[0] >= 0 || t.child[1] >= 0;
}

/* Tree 1's placement: 0 shifts (position r+1 mod n), 1 mirrors (position n-1-r). The same for
 * every rank: a function of n alone. */
static int second_tree_kind(int n)
{
    int both[2] = {0, 0};
    for (int r = 0; r < n; r++) {
        if (!interior(n, r)) continue;
        both[0] += interior(n, (r + 1) % n);
        both[1] += interior(n, n - 1 - r);
    }
    return both[1] < both[0] ? 1 : 0;
}

static int to_pos(int n, int kind, int tree, int r)
{
    if (tree == 0) return r;
    return kind ? n - 1 - r : (r + 1) % n;
}

static int to_rank(int n, int kind, int tree, int pos)
{
    if (pos < 0) return -1;
    if (tree == 0) return pos;
    return kind ? n - 1 - pos : algo_mod(pos - 1, n);
}

void tree_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                           uint32_t out_buf, uint64_t base, uint64_t count,
                           const ring_params_t *prm, bool inplace, bool avg)
{
    int p = g->n, r = g->me;
    if (count == 0) return;
    if (p == 1) {
        if (!inplace) sched_copy(s, desc, in_buf, base, out_buf, base, count, 0);
        return;
    }
    int kind = second_tree_kind(p);
    /* this rank's parent and children in each tree, as global ranks */
    int par[2], ch[2][2];
    uint64_t hoff[2], hlen[2], nsl[2];
    uint64_t sl = prm->slice_elems;
    for (int t = 0; t < 2; t++) {
        tnode_t nd = tree_node(p, to_pos(p, kind, t, r));
        int pr = to_rank(p, kind, t, nd.parent);
        par[t] = pr < 0 ? -1 : grp_rank(g, pr);
        for (int c = 0; c < 2; c++) {
            int cr = to_rank(p, kind, t, nd.child[c]);
            ch[t][c] = cr < 0 ? -1 : grp_rank(g, cr);
        }
        hoff[t] = base + sched_part_off(count, 2, (uint64_t)t);
        hlen[t] = sched_part_off(count, 2, (uint64_t)t + 1) - sched_part_off(count, 2, (uint64_t)t);
        nsl[t] = sched_nslices(hlen[t], sl);
    }
    uint64_t lag = (uint64_t)(2 * tree_depth(p) + 1), S = LOOM_MAX(nsl[0], nsl[1]);
    for (uint64_t i = 0; i < S + lag; i++) {
        for (int t = 0; t < 2; t++) {
            if (i < nsl[t]) {
                /* reduce slice i up tree t */
                uint64_t off = hoff[t] + i * sl, len = sched_slice_len(hlen[t], sl, i);
                uint32_t src = in_buf;
                int nch = (ch[t][0] >= 0) + (ch[t][1] >= 0), k = 0;
                for (int c = 0; c < 2; c++) {
                    if (ch[t][c] < 0) continue;
                    k++;
                    uint8_t flags = (avg && par[t] < 0 && k == nch) ? STEP_F_AVG : 0;
                    sched_recv_reduce(s, desc, ch[t][c], src, off, out_buf, off, len, flags);
                    src = out_buf;
                }
                if (par[t] >= 0) sched_send(s, desc, par[t], src, off, len);
            }
            if (i >= lag && i - lag < nsl[t]) {
                /* broadcast slice i - lag down tree t */
                uint64_t j = i - lag, off = hoff[t] + j * sl, len = sched_slice_len(hlen[t], sl, j);
                if (par[t] >= 0) sched_recv(s, desc, par[t], out_buf, off, len);
                for (int c = 0; c < 2; c++)
                    if (ch[t][c] >= 0) sched_send(s, desc, ch[t][c], out_buf, off, len);
            }
        }
    }
}

void tree_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                    bool inplace, bool avg)
{
    ring_group_t g = {.n = s->nranks, .me = s->rank, .ranks = NULL};
    tree_allreduce_region(s, desc, &g, SCHED_BUF_SEND, SCHED_BUF_RECV, 0, count, prm, inplace, avg);
}
