/*
 * Recursive doubling allreduce: log2(q) steps (q the largest power of two <= p), each exchanging
 * the whole buffer with the partner whose rank differs in one bit, plus a fold before and an unfold
 * after for the p - q ranks beyond q. Sends log2(q) buffers per rank instead of the ring's
 * 2(p-1)/p, in log2(q) steps instead of 2(p-1): the latency algorithm for small buffers. Both
 * partners of a step combine the same two values (a + b and b + a), so every rank ends
 * bit-identical.
 *
 * A step sends its current value and reduces into the next one; were they the same memory, the
 * reduction would have to wait for the partner to take the send, while the partner's reduction
 * waits for ours (a transport that reads from the sender's memory, or a full socket, would hold
 * both forever). So the partial values move between two scratch halves and end in the output.
 */
#include "algo.h"

#include "base.h"

void rd_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm, bool inplace,
                  bool avg)
{
    ring_group_t g = {.n = s->nranks, .me = s->rank, .ranks = NULL};
    rd_allreduce_region(s, desc, &g, SCHED_BUF_SEND, SCHED_BUF_RECV, 0, count, prm, inplace, avg);
}

void rd_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
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
    uint64_t sl = prm->slice_elems, S = sched_nslices(count, sl);
    if (algo_pow2_away(&f, r)) {
        algo_pow2_away_steps(s, desc, g, in_buf, out_buf, base, count, sl);
        return;
    }
    bool folds = algo_pow2_folds(&f, r);
    int m = L + (folds ? 1 : 0); /* reductions this rank makes */
    /* Where write w (1..m) goes: the last into the output, the ones before alternating between
     * the scratch halves A (offset 2·base) and B (offset 2·base + count). */
    uint64_t t0 = 2 * base;
    s->tmp_elems = LOOM_MAX(s->tmp_elems, t0 + 2 * count);
    uint32_t buf[64];
    uint64_t off[64];
    buf[m] = out_buf;
    off[m] = base;
    for (int w = m - 1; w >= 1; w--) {
        buf[w] = SCHED_BUF_TMP;
        off[w] = t0 + (((m - 1 - w) % 2) ? count : 0);
    }
    buf[0] = in_buf;
    off[0] = base;
    if (inplace && m == 1) {
        /* the input is the output: start from a copy in a scratch half */
        for (uint64_t j = 0; j < S; j++)
            sched_copy(s, desc, in_buf, base + j * sl, SCHED_BUF_TMP, t0 + j * sl,
                       sched_slice_len(count, sl, j), 0);
        buf[0] = SCHED_BUF_TMP;
        off[0] = t0;
    }
    int w = 0;
    if (folds) {
        w++;
        algo_pow2_fold_steps(s, desc, g, buf[w - 1], off[w - 1], buf[w], off[w], count, sl);
    }
    int v = algo_pow2_vrank(&f, r);
    for (int mask = 1; mask < q; mask <<= 1) {
        int partner = grp_rank(g, algo_pow2_member(&f, v ^ mask));
        uint8_t flags = (avg && mask * 2 == q) ? STEP_F_AVG : 0;
        w++;
        for (uint64_t j = 0; j < S; j++) {
            uint64_t len = sched_slice_len(count, sl, j);
            sched_send(s, desc, partner, buf[w - 1], off[w - 1] + j * sl, len);
            sched_recv_reduce(s, desc, partner, buf[w - 1], off[w - 1] + j * sl, buf[w],
                              off[w] + j * sl, len, flags);
        }
    }
    if (folds) algo_pow2_unfold_steps(s, desc, g, out_buf, base, count, sl);
}

void algo_pow2_away_steps(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                          uint32_t out_buf, uint64_t base, uint64_t count, uint64_t sl)
{
    int to = grp_rank(g, g->me - 1);
    uint64_t S = sched_nslices(count, sl);
    for (uint64_t j = 0; j < S; j++)
        sched_send(s, desc, to, in_buf, base + j * sl, sched_slice_len(count, sl, j));
    for (uint64_t j = 0; j < S; j++)
        sched_recv(s, desc, to, out_buf, base + j * sl, sched_slice_len(count, sl, j));
}

void algo_pow2_fold_steps(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                          uint64_t base, uint32_t dst, uint64_t dst_off, uint64_t count,
                          uint64_t sl)
{
    int from = grp_rank(g, g->me + 1);
    for (uint64_t j = 0, S = sched_nslices(count, sl); j < S; j++)
        sched_recv_reduce(s, desc, from, in_buf, base + j * sl, dst, dst_off + j * sl,
                          sched_slice_len(count, sl, j), 0);
}

void algo_pow2_unfold_steps(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t out_buf,
                            uint64_t base, uint64_t count, uint64_t sl)
{
    int to = grp_rank(g, g->me + 1);
    for (uint64_t j = 0, S = sched_nslices(count, sl); j < S; j++)
        sched_send(s, desc, to, out_buf, base + j * sl, sched_slice_len(count, sl, j));
}
