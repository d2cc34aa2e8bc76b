/*
 * Ring collectives as schedules: the bandwidth-optimal collectives of a flat ring. Allreduce is
 * reduce-scatter then allgather; each of the C channels (parallel rings) takes 1/C of the buffer,
 * and each chunk moves in slices so that sending, receiving and reducing overlap.
 *
 * Costs per rank, p ranks, n bytes of output (allreduce: n bytes in and out):
 *   allreduce       2(p-1) steps, sends and receives 2n(p-1)/p, reduces n(p-1)/p
 *   reduce-scatter  p-1 steps,    sends and receives (p-1)·recvbytes
 *   allgather       p-1 steps,    sends and receives (p-1)·sendbytes
 *   broadcast       a chain of p-1 hops, pipelined: about n + (p-2)·slice on the critical path
 *   reduce          the same chain towards the root, reducing at each hop
 * Latency: one message per step and slice; with S slices a step costs S messages, overlapped.
 */
#include "algo.h"

#include <stdlib.h>

#include "base.h"

/* The whole communicator as a group. */
static ring_group_t whole(const sched_t *s)
{
    ring_group_t g = {.n = s->nranks, .me = s->rank, .ranks = NULL};
    return g;
}

/* Global rank of group member i (any integer: taken modulo the group size). */
static inline int g_rank(const ring_group_t *g, int i)
{
    return grp_rank(g, algo_mod(i, g->n));
}

/* Offset and length of chunk k of channel c, when a region of `len` elements at `base` is split
 * first into channels, then each channel part into `nchunks` chunks. */
typedef struct {
    uint64_t off, len;
} span_t;

static span_t part_span(uint64_t base, uint64_t len, int nparts, int k)
{
    uint64_t a = sched_part_off(len, (uint64_t)nparts, (uint64_t)k);
    uint64_t b = sched_part_off(len, (uint64_t)nparts, (uint64_t)k + 1);
    span_t s = {base + a, b - a};
    return s;
}

static span_t chunk_span(uint64_t count, int nch, int c, int p, int k)
{
    span_t part = part_span(0, count, nch, c);
    return part_span(part.off, part.len, p, k);
}

static uint64_t max_slices(uint64_t count, const ring_params_t *prm, int p)
{
    /* The largest chunk of any channel decides how many slice rounds a step has. */
    uint64_t biggest = LOOM_DIV_UP(LOOM_DIV_UP(count, (uint64_t)prm->nchannels), (uint64_t)p);
    return sched_nslices(biggest, prm->slice_elems);
}

static int nchannels_for(uint64_t count, const ring_params_t *prm, int p)
{
    /* More channels than slices worth of data only adds messages. */
    uint64_t per = (uint64_t)p * prm->slice_elems;
    uint64_t useful = count / per;
    if (useful < 1) useful = 1;
    return (int)LOOM_MIN((uint64_t)prm->nchannels, useful);
}

void ring_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                    bool inplace, bool avg)
{
    ring_group_t g = whole(s);
    ring_allreduce_region(s, desc, &g, SCHED_BUF_SEND, SCHED_BUF_RECV, 0, count, prm, inplace, avg);
}

void ring_allreduce_region(sched_t *s, uint16_t desc, const ring_group_t *g, uint32_t in_buf,
                           uint32_t out_buf, uint64_t base, uint64_t count,
                           const ring_params_t *prm0, bool inplace, bool avg)
{
    int p = g->n, r = g->me;
    if (count == 0) return;
    if (p == 1) {
        /* One rank: its value is the result (an average over one rank is itself). */
        if (!inplace) sched_copy(s, desc, in_buf, base, out_buf, base, count, 0);
        return;
    }
    ring_params_t prm = *prm0;
    prm.nchannels = nchannels_for(count, prm0, p);
    int next = g_rank(g, r + 1), prev = g_rank(g, r - 1);
    int K = 2 * (p - 1);
    int64_t S = (int64_t)max_slices(count, &prm, p);
    uint64_t sl = prm.slice_elems;
    /* Steps k < p-1 reduce-scatter: step k sends chunk r-k and reduces chunk r-k-1 into the
     * output; the last reduction (k = p-2) completes chunk r+1, which this rank then owns. Steps
     * k >= p-1 allgather: step p-1+i forwards chunk r+1-i and receives chunk r-i.
     * Emitted by wavefront (step + slice): slice j's step k+1 follows its step k one slice
     * later, instead of after every slice of step k, so the first slices travel the whole ring
     * (and, in a hierarchy, reach the next phase) while the later ones are still on their way. */
    for (int64_t d = 0; d < K + S - 1; d++) {
        for (int k = (int)LOOM_MIN((int64_t)K - 1, d); k >= 0 && d - k < S; k--) {
            uint64_t j = (uint64_t)(d - k);
            bool rs = k < p - 1;
            int i = rs ? k : k - (p - 1);
            int sc = rs ? algo_mod(r - i, p) : algo_mod(r + 1 - i, p);
            int rc = rs ? algo_mod(r - i - 1, p) : algo_mod(r - i, p);
            uint32_t sbuf = k == 0 ? in_buf : out_buf;
            uint8_t flags = (avg && k == p - 2) ? STEP_F_AVG : 0;
            for (int c = 0; c < prm.nchannels; c++) {
                span_t a = chunk_span(count, prm.nchannels, c, p, sc);
                span_t b = chunk_span(count, prm.nchannels, c, p, rc);
                a.off += base;
                b.off += base;
                sched_send(s, desc, next, sbuf, a.off + j * sl, sched_slice_len(a.len, sl, j));
                if (rs)
                    sched_recv_reduce(s, desc, prev, in_buf, b.off + j * sl, out_buf,
                                      b.off + j * sl, sched_slice_len(b.len, sl, j), flags);
                else
                    sched_recv(s, desc, prev, out_buf, b.off + j * sl,
                               sched_slice_len(b.len, sl, j));
            }
        }
    }
}

typedef struct {
    uint64_t wave, j;
    int c;
    ring_span_t sp;
} piece_t;

static int piece_cmp(const void *a, const void *b)
{
    const piece_t *x = a, *y = b;
    if (x->wave != y->wave) return x->wave < y->wave ? -1 : 1;
    if (x->j != y->j) return x->j < y->j ? -1 : 1;
    return (x->c > y->c) - (x->c < y->c);
}

size_t ring_allreduce_pieces(uint64_t count, const ring_params_t *prm0, int p, int me, bool finish,
                             ring_span_t **out, bool *oom)
{
    *out = NULL;
    if (count == 0) return 0;
    ring_params_t prm = *prm0;
    prm.nchannels = p > 1 ? nchannels_for(count, prm0, p) : 1;
    if (p < 1) p = 1;
    uint64_t sl = prm.slice_elems;
    size_t n = 0;
    for (int c = 0; c < prm.nchannels; c++)
        for (int ch = 0; ch < p; ch++)
            n += sched_nslices(chunk_span(count, prm.nchannels, c, p, ch).len, sl);
    piece_t *k = malloc(n * sizeof(*k));
    ring_span_t *o = malloc(n * sizeof(*o));
    if (k == NULL || o == NULL) {
        free(k);
        free(o);
        *oom = true;
        return 0;
    }
    size_t m = 0;
    for (int c = 0; c < prm.nchannels; c++) {
        for (int ch = 0; ch < p; ch++) {
            span_t a = chunk_span(count, prm.nchannels, c, p, ch);
            uint64_t ns = sched_nslices(a.len, sl);
            /* the wavefront (step + slice) at which the ring reads or finishes slice j */
            uint64_t lag;
            if (finish)
                lag = (uint64_t)(p - 2 + (algo_mod(me - ch, p) + 1) % p);
            else
                lag = ch == me ? 0 : (uint64_t)algo_mod(me - 1 - ch, p);
            if (p == 1) lag = 0;
            for (uint64_t j = 0; j < ns; j++) {
                k[m].wave = j + lag;
                k[m].j = j;
                k[m].c = c;
                k[m].sp.off = a.off + j * sl;
                k[m].sp.len = sched_slice_len(a.len, sl, j);
                m++;
            }
        }
    }
    qsort(k, n, sizeof(*k), piece_cmp);
    for (size_t i = 0; i < n; i++)
        o[i] = k[i].sp;
    free(k);
    *out = o;
    return n;
}

void ring_reduce_scatter(sched_t *s, uint16_t desc, uint64_t n, const ring_params_t *prm0,
                         bool inplace, bool avg)
{
    int p = s->nranks, r = s->rank;
    if (n == 0) return;
    if (p == 1) {
        if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, 0, SCHED_BUF_RECV, 0, n, 0);
        return;
    }
    ring_params_t prm = *prm0;
    prm.nchannels = nchannels_for(n * (uint64_t)p, prm0, p);
    int next = algo_mod(r + 1, p), prev = algo_mod(r - 1, p);
    uint64_t sl = prm.slice_elems;
    /* Partial sums travel through two scratch halves of n elements: step k writes half k%2
     * and step k+1 sends it. */
    s->tmp_elems = 2 * n;
    for (int k = 0; k < p - 1; k++) {
        int sc = algo_mod(r - k - 1, p), rc = algo_mod(r - k - 2, p);
        for (int c = 0; c < prm.nchannels; c++) {
            span_t part = part_span(0, n, prm.nchannels, c);
            uint64_t S = sched_nslices(part.len, sl);
            for (uint64_t j = 0; j < S; j++) {
                uint64_t len = sched_slice_len(part.len, sl, j), o = part.off + j * sl;
                if (k == 0)
                    sched_send(s, desc, next, SCHED_BUF_SEND, (uint64_t)sc * n + o, len);
                else
                    sched_send(s, desc, next, SCHED_BUF_TMP, (uint64_t)((k - 1) % 2) * n + o, len);
                if (k == p - 2)
                    sched_recv_reduce(s, desc, prev, SCHED_BUF_SEND, (uint64_t)rc * n + o,
                                      SCHED_BUF_RECV, o, len, avg ? STEP_F_AVG : 0);
                else
                    sched_recv_reduce(s, desc, prev, SCHED_BUF_SEND, (uint64_t)rc * n + o,
                                      SCHED_BUF_TMP, (uint64_t)(k % 2) * n + o, len, 0);
            }
        }
    }
}

void ring_allgather(sched_t *s, uint16_t desc, uint64_t n, const ring_params_t *prm0, bool inplace)
{
    int p = s->nranks, r = s->rank;
    if (n == 0) return;
    if (!inplace) sched_copy(s, desc, SCHED_BUF_SEND, 0, SCHED_BUF_RECV, (uint64_t)r * n, n, 0);
    if (p == 1) return;
    ring_params_t prm = *prm0;
    prm.nchannels = nchannels_for(n * (uint64_t)p, prm0, p);
    int next = algo_mod(r + 1, p), prev = algo_mod(r - 1, p);
    uint64_t sl = prm.slice_elems;
    for (int k = 0; k < p - 1; k++) {
        int sc = algo_mod(r - k, p), rc = algo_mod(r - k - 1, p);
        for (int c = 0; c < prm.nchannels; c++) {
            span_t part = part_span(0, n, prm.nchannels, c);
            uint64_t S = sched_nslices(part.len, sl);
            for (uint64_t j = 0; j < S; j++) {
                uint64_t len = sched_slice_len(part.len, sl, j), o = part.off + j * sl;
                /* The own chunk is sent from the input so that the copy above (out of place)
                 * and the first send can run at once. */
                if (k == 0)
                    sched_send(s, desc, next, SCHED_BUF_SEND, o, len);
                else
                    sched_send(s, desc, next, SCHED_BUF_RECV, (uint64_t)sc * n + o, len);
                sched_recv(s, desc, prev, SCHED_BUF_RECV, (uint64_t)rc * n + o, len);
            }
        }
    }
}

/*
 * Broadcast and reduce are chains along the ring, so one rank of each would only send (the
 * broadcast's root, the reduce's first rank) and never see a peer's descriptor: a rank that
 * believes itself the root, alone, would return success. One element from the chain's end to
 * its start (from scratch, depending on nothing, so it leaves at once: the start waits one hop,
 * not a round trip) closes the ring: every rank then receives from its predecessor whatever the
 * root, and compares the predecessor's descriptor (root included) with its own.
 */
static void ring_close(sched_t *s, uint16_t desc, uint64_t count, bool end, bool start)
{
    if (count == 0 || s->nranks < 2) return;
    int next = algo_mod(s->rank + 1, s->nranks), prev = algo_mod(s->rank - 1, s->nranks);
    if (end || start) s->tmp_elems = LOOM_MAX(s->tmp_elems, 1);
    if (end) sched_send(s, desc, next, SCHED_BUF_TMP, 0, 1);
    if (start) sched_recv(s, desc, prev, SCHED_BUF_TMP, 0, 1);
}

void ring_broadcast(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                    bool inplace)
{
    ring_group_t g = whole(s);
    /* The chain's last rank closes the ring towards the root (first: issued at once). */
    ring_close(s, desc, count, algo_mod(s->rank - root, s->nranks) == s->nranks - 1,
               s->rank == root);
    ring_broadcast_group(s, desc, &g, count, root, SCHED_BUF_SEND, prm, inplace);
}

void ring_broadcast_group(sched_t *s, uint16_t desc, const ring_group_t *g, uint64_t count,
                          int root, uint32_t root_buf, const ring_params_t *prm, bool inplace)
{
    int p = g->n, r = g->me;
    if (count == 0) return;
    int pos = algo_mod(r - root, p), next = g_rank(g, r + 1), prev = g_rank(g, r - 1);
    uint64_t sl = prm->slice_elems, S = sched_nslices(count, sl);
    for (uint64_t j = 0; j < S; j++) {
        uint64_t len = sched_slice_len(count, sl, j), o = j * sl;
        if (pos == 0) {
            if (!inplace) sched_copy(s, desc, root_buf, o, SCHED_BUF_RECV, o, len, 0);
            if (p > 1) sched_send(s, desc, next, root_buf, o, len);
        } else {
            sched_recv(s, desc, prev, SCHED_BUF_RECV, o, len);
            if (pos < p - 1) sched_send(s, desc, next, SCHED_BUF_RECV, o, len);
        }
    }
}

void ring_reduce(sched_t *s, uint16_t desc, uint64_t count, int root, const ring_params_t *prm,
                 bool inplace, bool avg)
{
    ring_group_t g = whole(s);
    /* The root, the chain's end, closes the ring towards the chain's first rank (first: issued
     * at once). */
    ring_close(s, desc, count, s->rank == root, algo_mod(s->rank - root - 1, s->nranks) == 0);
    ring_reduce_group(s, desc, &g, count, root, prm, inplace, avg);
}

void ring_reduce_group(sched_t *s, uint16_t desc, const ring_group_t *g, uint64_t count, int root,
                       const ring_params_t *prm, bool inplace, bool avg)
{
    int p = g->n, r = g->me;
    if (algo_trivial(s, desc, p, count, inplace)) return;
    /* The chain starts after the root and ends at it. */
    int pos = algo_mod(r - root - 1, p), next = g_rank(g, r + 1), prev = g_rank(g, r - 1);
    uint64_t sl = prm->slice_elems, S = sched_nslices(count, sl);
    if (pos > 0 && pos < p - 1) s->tmp_elems = count;
    for (uint64_t j = 0; j < S; j++) {
        uint64_t len = sched_slice_len(count, sl, j), o = j * sl;
        if (pos == 0) {
            sched_send(s, desc, next, SCHED_BUF_SEND, o, len);
        } else if (pos < p - 1) {
            sched_recv_reduce(s, desc, prev, SCHED_BUF_SEND, o, SCHED_BUF_TMP, o, len, 0);
            sched_send(s, desc, next, SCHED_BUF_TMP, o, len);
        } else {
            sched_recv_reduce(s, desc, prev, SCHED_BUF_SEND, o, SCHED_BUF_RECV, o, len,
                              avg ? STEP_F_AVG : 0);
        }
    }
}
