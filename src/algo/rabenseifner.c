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
 * the doubling; the even ones then stand for both (algo.h's algo_pow2, shared with rd.c).
 */
#include "algo.h"

#include "base.h"

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
    algo_pow2_t f = algo_pow2(p);
    int q = f.q, L = f.L;
    uint64_t sl = prm->slice_elems;
    if (algo_pow2_away(&f, r)) {
        algo_pow2_away_steps(s, desc, g, in_buf, out_buf, base, count, sl);
        return;
    }
    bool folds = algo_pow2_folds(&f, r);
    uint32_t cur = in_buf; /* where this rank's partial values are */
    if (folds) {
        algo_pow2_fold_steps(s, desc, g, in_buf, base, out_buf, base, count, sl);
        cur = out_buf;
    }
    int v = algo_pow2_vrank(&f, r);
    /* blocks [blo, bhi) of q, as elements */
#define BOFF(b) (base + sched_part_off(count, (uint64_t)q, (uint64_t)(b)))
    int blo = 0, bhi = q;
    for (int i = 0; i < L; i++) {
        int peer = grp_rank(g, algo_pow2_member(&f, v ^ (1 << i)));
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
        int peer = grp_rank(g, algo_pow2_member(&f, v ^ (1 << i)));
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
    if (folds) algo_pow2_unfold_steps(s, desc, g, out_buf, base, count, sl);
}

void rab_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                   bool inplace, bool avg)
{
    ring_group_t g = {.n = s->nranks, .me = s->rank, .ranks = NULL};
    rab_allreduce_region(s, desc, &g, SCHED_BUF_SEND, SCHED_BUF_RECV, 0, count, prm, inplace, avg);
}
