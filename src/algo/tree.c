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

/*
 * Reduce and broadcast, toward or from any root R: both trees are built over the p - 1 other
 * ranks, R+1 .. R-1 in that (linear, not cyclic) order, and R sits above their two tops: a
 * reduce climbs each tree and ends with one more hop from its top to R, a broadcast starts
 * with R handing each half to its tree's top.
 *
 * Why the extra hop rather than rotating the trees so that R is at the top: rotating one
 * labelling cannot put R at the top of both trees (their tops are different ranks), and giving
 * each tree its own rotation so that both tops are R makes the two trees the same tree, so
 * every interior rank, R first, takes two children's halves in both: 2n into R and into every
 * interior rank instead of n, the pipeline's rate halved. Putting R at the top of tree 0 only
 * and adding the hop from tree 1's top costs the same hop and still brings 1.5n into R. With R
 * above both trees every rank, R included, receives (reduce) or sends (broadcast) about n, and
 * the critical path is the deeper tree's levels (tree_rooted_hops: about log2 p): cheaper in
 * bandwidth at every size and, at most, a hop dearer (the cost model in registry.c says where
 * that beats the ring's p - 1 hops).
 *
 * Tree 1 must also keep every subtree a run of consecutive ranks (partial sums over
 * consecutive ranks, as in the allreduce), so the cyclic shift of the allreduce, whose wrap
 * would join R - 1 to R + 1 across R, is not one of its shapes; the candidates are the mirror
 * of tree 0, and the in-order tree over all but the first (or the last) member hung below that
 * member, whichever leaves fewest members interior in both trees (a function of p alone). The
 * hung ones are a level deeper; they are taken where the mirror would be the same tree (p - 1
 * = 2^k - 1, a perfect tree, is its own mirror), since a shared interior rank takes 2n, not n:
 * one hop more against half the rate at that rank.
 */

enum { RT_MIRROR, RT_TOP_FIRST, RT_TOP_LAST, RT_KINDS };

/* Member u's node in tree t (t = 0: the in-order tree; t = 1: shape kind) over n members, as
 * member indices; -1 for none. */
static tnode_t rooted_node(int n, int t, int kind, int u)
{
    tnode_t nd;
    if (t == 0 || kind == RT_MIRROR) {
        int m = t == 0 ? u : n - 1 - u;
        nd = tree_node(n, m);
        if (t != 0) {
            nd.parent = nd.parent < 0 ? -1 : n - 1 - nd.parent;
            for (int c = 0; c < 2; c++)
                nd.child[c] = nd.child[c] < 0 ? -1 : n - 1 - nd.child[c];
        }
        return nd;
    }
    /* the top member, and the in-order tree over the other n - 1 below it */
    int top = kind == RT_TOP_FIRST ? 0 : n - 1, shift = kind == RT_TOP_FIRST ? 1 : 0;
    if (u == top) {
        tnode_t t1 = {-1, {n > 1 ? shift + (n - 1) / 2 : -1, -1}};
        return t1;
    }
    nd = tree_node(n - 1, u - shift);
    nd.parent = nd.parent < 0 ? top : nd.parent + shift;
    for (int c = 0; c < 2; c++)
        nd.child[c] = nd.child[c] < 0 ? -1 : nd.child[c] + shift;
    return nd;
}

static bool rooted_interior(int n, int t, int kind, int u)
{
    tnode_t nd = rooted_node(n, t, kind, u);
    return nd.child[0] >= 0 || nd.child[1] >= 0;
}

static int rooted_kind(int n)
{
    int best = RT_MIRROR, least = n + 1;
    for (int k = 0; k < RT_KINDS; k++) {
        int both = 0;
        for (int u = 0; u < n; u++)
            both += rooted_interior(n, 0, k, u) && rooted_interior(n, 1, k, u);
        if (both < least) best = k, least = both;
    }
    return best;
}

int tree_rooted_hops(int p)
{
    if (p <= 1) return 0;
    int n = p - 1, d0 = tree_depth(n);
    int d1 = rooted_kind(n) == RT_MIRROR ? d0 : 1 + tree_depth(n - 1);
    return LOOM_MAX(d0, d1); /* a tree of d levels, then the hop from its top to the root */
}

/* This rank's parent and children in each tree (global ranks; the tops' parent is the root),
 * and the halves' offsets, lengths and slice counts. */
typedef struct {
    int par[2], ch[2][2];
    uint64_t hoff[2], hlen[2], nsl[2];
} rooted_t;

static rooted_t rooted_setup(int p, int r, int root, uint64_t count, uint64_t sl)
{
    rooted_t x;
    int n = p - 1, kind = rooted_kind(n), u = algo_mod(r - root - 1, p);
    for (int t = 0; t < 2; t++) {
        x.hoff[t] = sched_part_off(count, 2, (uint64_t)t);
        x.hlen[t] = sched_part_off(count, 2, (uint64_t)t + 1) - x.hoff[t];
        x.nsl[t] = sched_nslices(x.hlen[t], sl);
        x.par[t] = -1;
        x.ch[t][0] = x.ch[t][1] = -1;
        if (r == root) {
            /* the root's only child in each tree is that tree's top */
            for (int v = 0; v < n; v++)
                if (rooted_node(n, t, kind, v).parent < 0) x.ch[t][0] = (v + root + 1) % p;
            continue;
        }
        tnode_t nd = rooted_node(n, t, kind, u);
        x.par[t] = nd.parent < 0 ? root : (nd.parent + root + 1) % p;
        for (int c = 0; c < 2; c++)
            x.ch[t][c] = nd.child[c] < 0 ? -1 : (nd.child[c] + root + 1) % p;
    }
    return x;
}

void tree_reduce(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                 bool inplace, bool avg)
{
    int p = s->nranks, r = s->rank;
    if (algo_trivial(s, desc, p, count, inplace)) return;
    uint64_t sl = prm->slice_elems;
    rooted_t x = rooted_setup(p, r, root, count, sl);
    /* Partial sums of a rank other than the root go to scratch: its output is not its own. The
     * root reduces its input with each top's half straight into the output. */
    bool any_child = x.ch[0][0] >= 0 || x.ch[1][0] >= 0;
    if (r != root && any_child) s->tmp_elems = LOOM_MAX(s->tmp_elems, count);
    uint32_t acc = r == root ? SCHED_BUF_RECV : SCHED_BUF_TMP;
    for (uint64_t i = 0, S = LOOM_MAX(x.nsl[0], x.nsl[1]); i < S; i++)
        for (int t = 0; t < 2; t++) {
            if (i >= x.nsl[t]) continue;
            uint64_t off = x.hoff[t] + i * sl, len = sched_slice_len(x.hlen[t], sl, i);
            uint32_t src = SCHED_BUF_SEND;
            int nch = (x.ch[t][0] >= 0) + (x.ch[t][1] >= 0), k = 0;
            for (int c = 0; c < 2; c++) {
                if (x.ch[t][c] < 0) continue;
                k++;
                uint8_t flags = (avg && r == root && k == nch) ? STEP_F_AVG : 0;
                sched_recv_reduce(s, desc, x.ch[t][c], src, off, acc, off, len, flags);
                src = acc;
            }
            if (x.par[t] >= 0) sched_send(s, desc, x.par[t], src, off, len);
        }
}

void tree_broadcast(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                    bool inplace)
{
    int p = s->nranks, r = s->rank;
    if (algo_trivial(s, desc, p, count, inplace)) return;
    uint64_t sl = prm->slice_elems;
    rooted_t x = rooted_setup(p, r, root, count, sl);
    for (uint64_t i = 0, S = LOOM_MAX(x.nsl[0], x.nsl[1]); i < S; i++)
        for (int t = 0; t < 2; t++) {
            if (i >= x.nsl[t]) continue;
            uint64_t off = x.hoff[t] + i * sl, len = sched_slice_len(x.hlen[t], sl, i);
            uint32_t src = SCHED_BUF_RECV;
            if (r == root) {
                src = SCHED_BUF_SEND;
                if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, off, SCHED_BUF_RECV, off, len, 0);
            } else {
                sched_recv(s, desc, x.par[t], SCHED_BUF_RECV, off, len);
            }
            for (int c = 0; c < 2; c++)
                if (x.ch[t][c] >= 0) sched_send(s, desc, x.ch[t][c], src, off, len);
        }
}
