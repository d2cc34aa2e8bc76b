/*
 * Rabenseifner's allreduce: a reduce-scatter by recursive halving, then an allgather by
 * recursive doubling, over q = the largest power of two <= p ranks.
 *
 * Costs per rank, n bytes: 2·log2(q) steps (+2 for the fold below), sends and receives
 * 2n(q-1)/q, reduces n(q-1)/q: the ring's bandwidth in log2 steps instead of 2(p-1), so the
 * algorithm of the middle sizes where the ring's step count and rd's whole-buffer steps both cost.
 *
 * Halving step i (i = 0 .. L-1) pairs virtual rank v with v ^ 2^i; the two hold the same range
 * of blocks, each keeps the half that bit i of its v names and receives the partner's
 * contribution to it, sending its own for the other half. After L steps v owns one of q blocks,
 * fully reduced; the doubling steps retrace the pairs in reverse order and exchange what each
 * owns until everyone has everything. The partners of the lowest bit come first so that every
 * partial sum is over consecutive ranks (the symbolic checker's interval values can follow it).
 * A step sends one half and reduces into the other, so no step waits for its own send.
 *
 * p not a power of two: the standard fold. Among the first 2(p-q) ranks each odd one hands its
 * whole input to the even one below before the halving, and receives the result from it after
 * the doubling; the even ones then stand for both.
 */
#include "algo.h"

#include "base.h"

/* Sends or receive-reduces [off, off+len) in slices, one message per slice; the two partners
 * of a step both call this with the same ranges, in the same order. */
static void slices_send(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off,
                        uint64_t len, uint64_t sl)
{
    for (uint64_t j = 0, S = sched_nslices(len, sl); j < S; j++)
        sched_send(s, desc, peer, buf, off + j * sl, sched_slice_len(len, sl, j));
}

void rab_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                          uint32_t out_buf, uint64_t base, uint64_t count, const ring_params_t *prm,
                          bool inplace, bool avg)
{
    int p = g->n, r = g->me;
    if (count == 0) return;
    if (p == 1) {
        if (!inplace) sched_copy(s, desc, in_buf, base, out_buf, base, count, 0);
        return;
    }
    int q = 1, L = 0;
    while (q * 2 <= p)
        q *= 2, L++;
    int extra = p - q;
    uint64_t sl = prm->slice_elems;
    if (r < 2 * extra && r % 2 == 1) {
        int to = grp_rank(g, r - 1);
        slices_send(s, desc, to, in_buf, base, count, sl);
        for (uint64_t j = 0, S = sched_nslices(count, sl); j < S; j++)
            sched_recv(s, desc, to, out_buf, base + j * sl, sched_slice_len(count, sl, j));
        return;
    }
    bool folds = r < 2 * extra;
    uint32_t cur = in_buf; /* where this rank's partial values are */
    if (folds) {
        int from = grp_rank(g, r + 1);
        for (uint64_t j = 0, S = sched_nslices(count, sl); j < S; j++)
            sched_recv_reduce(s, desc, from, in_buf, base + j * sl, out_buf, base + j * sl,
                              sched_slice_len(count, sl, j), 0);
        cur = out_buf;
    }
    int v = folds ? r / 2 : r - extra;
    /* blocks [blo, bhi) of q, as elements */
#define BOFF(b) (base + sched_part_off(count, (uint64_t)q, (uint64_t)(b)))
    int blo = 0, bhi = q;
    for (int i = 0; i < L; i++) {
        int pv = v ^ (1 << i), peer = grp_rank(g, pv < extra ? pv * 2 : pv + extra);
        int mid = blo + (bhi - blo) / 2;
        bool upper = (v >> i) & 1;
        int klo = upper ? mid : blo, khi = upper ? bhi : mid;
        int slo = upper ? blo : mid, shi = upper ? mid : bhi;
        uint64_t ko = BOFF(klo), kl = BOFF(khi) - ko, so = BOFF(slo), sn = BOFF(shi) - so;
        uint8_t flags = (avg && i == L - 1) ? STEP_F_AVG : 0;
        /* slice by slice, a send then a reduction: with sends that complete only once the
         * peer posts their receive and a bounded number in flight, all sends first would hold
         * both partners */
        for (uint64_t j = 0, S = LOOM_MAX(sched_nslices(sn, sl), sched_nslices(kl, sl)); j < S;
             j++) {
            sched_send(s, desc, peer, cur, so + j * sl, sched_slice_len(sn, sl, j));
            sched_recv_reduce(s, desc, peer, cur, ko + j * sl, out_buf, ko + j * sl,
                              sched_slice_len(kl, sl, j), flags);
        }
        cur = out_buf;
        blo = klo;
        bhi = khi;
    }
    for (int i = L - 1; i >= 0; i--) {
        int pv = v ^ (1 << i), peer = grp_rank(g, pv < extra ? pv * 2 : pv + extra);
        /* the partner owns the sibling of [blo, bhi) in the range both held before step i */
        int w = bhi - blo;
        bool upper = (v >> i) & 1;
        int plo = upper ? blo - w : bhi, phi = plo + w;
        uint64_t oo = BOFF(blo), ol = BOFF(bhi) - oo, po = BOFF(plo), pl = BOFF(phi) - po;
        for (uint64_t j = 0, S = LOOM_MAX(sched_nslices(ol, sl), sched_nslices(pl, sl)); j < S;
             j++) {
            sched_send(s, desc, peer, out_buf, oo + j * sl, sched_slice_len(ol, sl, j));
            sched_recv(s, desc, peer, out_buf, po + j * sl, sched_slice_len(pl, sl, j));
        }
        if (upper)
            blo = plo;
        else
            bhi = phi;
    }
#undef BOFF
    if (folds) slices_send(s, desc, grp_rank(g, r + 1), out_buf, base, count, sl);
}

void rab_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                   bool inplace, bool avg)
{
    ring_group_t g = {.n = s->nranks, .me = s->rank, .ranks = NULL};
    rab_allreduce_region(s, desc, &g, SCHED_BUF_SEND, SCHED_BUF_RECV, 0, count, prm, inplace, avg);
}
