/*
 * Deterministic reductions (LOOM_DETERMINISTIC=1): every element of the result is the left fold
 * of the ranks' inputs in rank order, ((x0 op x1) op x2) op ... op x(p-1), one rounding per
 * step, whatever the algorithm, channel count, slice, fusion bucket, node layout or timing. That
 * is the value one process folding the p inputs in rank order gets, so results are bitwise the
 * same from run to run and across every LOOM_ALGO and LOOM_NCHANNELS choice.
 *
 * The buffer is cut into p blocks (sched_part_off); rank b owns block b and folds the block's p
 * contributions into its accumulator in rank order, the fold order enforced by the schedule's
 * dependencies (each reduction reads what the previous one wrote). A receive-and-reduce step
 * combines one received and one local operand; the ops are commutative (a op b == b op a
 * bitwise for IEEE sum, product, min and max), so only the grouping is fixed here:
 *   block 0: x0 (own) op x1 op x2 ...            (received from 1, 2, ...)
 *   block 1: x1 (own) op x0, then op x2 op x3 ... (x1 op x0 == x0 op x1)
 *   block b >= 2: x0 received plainly, op x1 ... x(b-1); the owner's own x_b must be folded
 *     between x(b-1) and x(b+1), and a step cannot reduce two local operands, so x_b goes to a
 *     bouncer (rank b-1) and comes back as a received operand; then op x(b+1) ...
 * The bounce depends only on a plain receive, never on another rank's reductions, so every
 * reduction waits on raw inputs alone and no chain of staging slots forms across ranks.
 *
 * Costs per rank, p ranks, n bytes (each block n/p):
 *   reduce-scatter  p-1 blocks in and out, plus at most 2 for the bounce (owners b >= 2 send
 *                   their block out and get it back; each rank bounces at most one block)
 *   allreduce       the reduce-scatter, then each owner sends its block to every other rank:
 *                   2(p-1)/p n + at most 2 n/p (the ring: 2(p-1)/p n)
 *   reduce          the reduce-scatter, then each owner sends its block to the root
 * Steps: the fold at an owner is p-1 dependent receives (the ring's reduce-scatter: p-1 steps),
 * all blocks and slices at once; latency, not bandwidth, is what it costs. An allreduce whose p
 * inputs fit one slice together folds the whole buffer on every rank instead (oneshot.c: the
 * same left fold in rank order, no allgather, (p-1) n in and out per rank, one step).
 */
#include "algo.h"

#include "base.h"

typedef struct {
    uint64_t off, len;
} dspan_t;

/* Block b of a buffer of `count` elements cut into p blocks. */
static dspan_t block_of(uint64_t count, int p, int b)
{
    uint64_t a = sched_part_off(count, (uint64_t)p, (uint64_t)b);
    uint64_t e = sched_part_off(count, (uint64_t)p, (uint64_t)b + 1);
    dspan_t d = {a, e - a};
    return d;
}

/* Where one block's pieces live on this rank. */
typedef struct {
    uint32_t in_buf;  /* this rank's contribution to the block */
    uint64_t in_off;  /* its offset there */
    uint32_t acc_buf; /* the owner's accumulator (only the owner's is used) */
    uint64_t acc_off;
    uint64_t len;
} dblock_t;

/* The rank that bounces block b's own contribution back to its owner (b >= 2): b-1, whose own
 * contribution the owner has by then received, so that their messages keep fold order. Each
 * rank bounces at most one block. */
static int bouncer(int b)
{
    return b - 1;
}

/*
 * One slice [o, o+len) (offsets relative to the block) of block b's fold, the steps this rank
 * takes in it. `bounce_off` is where this rank keeps a block it bounces
 * (SCHED_BUF_TMP). Every rank calls it for every (block, slice) in the same order, so sends and
 * receives between each pair come out in the same order on both sides.
 */
static void fold_slice(sched_t *s, uint16_t desc, int b, const dblock_t *k, uint64_t o,
                       uint64_t len, uint64_t bounce_off, bool avg)
{
    int p = s->nranks, r = s->rank;
    if (len == 0) return;
    uint32_t ib = k->in_buf, ab = k->acc_buf;
    uint64_t io = k->in_off + o, ao = k->acc_off + o;
    /* the owner's last reduction, the one an average divides */
    int last = b < p - 1 ? p - 1 : (b >= 2 ? b : 0);
    if (b < 2) {
        /* b's own value is the fold's first (b = 0) or second (b = 1) operand: the first
         * received operand reduces with it directly */
        int first = b == 0 ? 1 : 0;
        for (int q = 0; q < p; q++) {
            if (q == b) continue;
            uint8_t f = avg && q == last ? STEP_F_AVG : 0;
            if (r == b)
                sched_recv_reduce(s, desc, q, q == first ? ib : ab, q == first ? io : ao, ab, ao,
                                  len, f);
            else if (r == q)
                sched_send(s, desc, b, ib, io, len);
        }
        return;
    }
    int h = bouncer(b);
    /* In place the owner's accumulator is its own input, which the plain receive of x0 below
     * overwrites: the bounce's send comes first (the receive's dependency waits for it). */
    if (r == b) sched_send(s, desc, h, ib, io, len);
    for (int q = 0; q < p; q++) {
        uint8_t f = avg && q == last ? STEP_F_AVG : 0;
        if (q == b) {
            /* x_b, back from the bouncer (which sent its own x_h at q = h, before) */
            if (r == h) {
                sched_recv(s, desc, b, SCHED_BUF_TMP, bounce_off, len);
                sched_send(s, desc, b, SCHED_BUF_TMP, bounce_off, len);
            } else if (r == b) {
                sched_recv_reduce(s, desc, h, ab, ao, ab, ao, len, f);
            }
        } else if (r == b) {
            if (q == 0)
                sched_recv(s, desc, 0, ab, ao, len);
            else
                sched_recv_reduce(s, desc, q, ab, ao, ab, ao, len, f);
        } else if (r == q) {
            sched_send(s, desc, b, ib, io, len);
        }
    }
}

/* The fold of every block, slice by slice: blk(b) says where block b lies on this rank. */
typedef dblock_t (*dblock_fn)(const sched_t *s, uint64_t n, int b, int root);

static void fold_all(sched_t *s, uint16_t desc, uint64_t n, int root, dblock_fn blk,
                     uint64_t bounce_off, const ring_params_t *prm, bool avg)
{
    int p = s->nranks;
    uint64_t sl = prm->slice_elems, S = 0;
    for (int b = 0; b < p; b++)
        S = LOOM_MAX(S, sched_nslices(blk(s, n, b, root).len, sl));
    for (uint64_t j = 0; j < S; j++)
        for (int b = 0; b < p; b++) {
            dblock_t k = blk(s, n, b, root);
            fold_slice(s, desc, b, &k, j * sl, sched_slice_len(k.len, sl, j), bounce_off + j * sl,
                       avg);
        }
}

/* Allreduce: the blocks of one buffer, accumulated in place in the output. */
static dblock_t ar_block(const sched_t *s, uint64_t n, int b, int root)
{
    (void)root;
    dspan_t d = block_of(n, s->nranks, b);
    dblock_t k = {SCHED_BUF_SEND, d.off, SCHED_BUF_RECV, d.off, d.len};
    return k;
}

/* Reduce-scatter: block b is the input's b-th recvcount elements; the owner's is the output. */
static dblock_t rs_block(const sched_t *s, uint64_t n, int b, int root)
{
    (void)s;
    (void)root;
    dblock_t k = {SCHED_BUF_SEND, (uint64_t)b * n, SCHED_BUF_RECV, 0, n};
    return k;
}

/* Reduce: like allreduce, but only the root has an output; other owners accumulate in scratch
 * after the bounce area. */
static dblock_t red_block(const sched_t *s, uint64_t n, int b, int root)
{
    dspan_t d = block_of(n, s->nranks, b);
    uint64_t big = LOOM_DIV_UP(n, (uint64_t)s->nranks);
    dblock_t k = {SCHED_BUF_SEND, d.off, SCHED_BUF_RECV, d.off, d.len};
    if (s->rank != root) k.acc_buf = SCHED_BUF_TMP, k.acc_off = big;
    return k;
}

/* Scratch for the block this rank bounces (the largest block), and `extra` more. */
static void want_tmp(sched_t *s, uint64_t big, uint64_t extra)
{
    if (s->nranks > 2) s->tmp_elems = LOOM_MAX(s->tmp_elems, big + extra);
}

void determ_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                      bool inplace, bool avg)
{
    int p = s->nranks, r = s->rank;
    if (algo_trivial(s, desc, p, count, inplace)) return;
    if (count * (uint64_t)p <= prm->slice_elems) {
        oneshot_allreduce(s, desc, count, prm, inplace, avg); /* the same fold, one step */
        return;
    }
    want_tmp(s, LOOM_DIV_UP(count, (uint64_t)p), 0);
    fold_all(s, desc, count, -1, ar_block, 0, prm, avg);
    /* Every owner's block to every other rank (the peers in turn from the next rank on, so
     * that each round spreads over all links). */
    uint64_t sl = prm->slice_elems, S = sched_nslices(LOOM_DIV_UP(count, (uint64_t)p), sl);
    for (uint64_t j = 0; j < S; j++)
        for (int b = 0; b < p; b++) {
            dspan_t d = block_of(count, p, b);
            uint64_t len = sched_slice_len(d.len, sl, j), o = d.off + j * sl;
            if (len == 0) continue;
            for (int i = 1; i < p; i++) {
                int q = algo_mod(b + i, p);
                if (r == b)
                    sched_send(s, desc, q, SCHED_BUF_RECV, o, len);
                else if (r == q)
                    sched_recv(s, desc, b, SCHED_BUF_RECV, o, len);
            }
        }
}

void determ_reduce_scatter(sched_t *s, uint16_t desc, uint64_t recvcount, const ring_params_t *prm,
                           bool inplace, bool avg)
{
    if (recvcount == 0) return;
    if (s->nranks == 1) {
        if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, 0, SCHED_BUF_RECV, 0, recvcount, 0);
        return;
    }
    want_tmp(s, recvcount, 0);
    fold_all(s, desc, recvcount, -1, rs_block, 0, prm, avg);
}

void determ_reduce(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                   bool inplace, bool avg)
{
    int p = s->nranks, r = s->rank;
    if (algo_trivial(s, desc, p, count, inplace)) return;
    uint64_t big = LOOM_DIV_UP(count, (uint64_t)p);
    /* non-root owners accumulate after the bounce area */
    if (r != root) s->tmp_elems = LOOM_MAX(s->tmp_elems, 2 * big);
    want_tmp(s, big, r != root ? big : 0);
    fold_all(s, desc, count, root, red_block, 0, prm, avg);
    /* Each owner's block to the root. */
    uint64_t sl = prm->slice_elems, S = sched_nslices(big, sl);
    for (uint64_t j = 0; j < S; j++)
        for (int b = 0; b < p; b++) {
            if (b == root) continue;
            dspan_t d = block_of(count, p, b);
            uint64_t len = sched_slice_len(d.len, sl, j);
            if (len == 0) continue;
            if (r == b)
                sched_send(s, desc, root, SCHED_BUF_TMP, big + j * sl, len);
            else if (r == root)
                sched_recv(s, desc, b, SCHED_BUF_RECV, d.off + j * sl, len);
        }
}
