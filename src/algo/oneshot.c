/*
 * One-shot allreduce: every rank sends its whole input to every other rank at once and folds the
 * p inputs itself, in rank order, ((x0 op x1) op x2) op ... op x(p-1). One dependent step (all
 * messages leave at the start and none waits on another rank's reduction), against recursive
 * doubling's log2(p) and the ring's 2(p-1): the latency algorithm for the smallest buffers on a
 * few ranks, as the one-shot kernels of NCCL and the shared-memory collectives of MPI libraries
 * are. It pays for it in bytes: p-1 copies of the buffer out of and into every rank (the ring:
 * 2(p-1)/p), and p-1 reductions of the whole buffer on every rank; and in connections: a full
 * mesh, so the registry offers it up to ONESHOT_MAX_RANKS ranks only.
 *
 * Every rank folds the same operands in the same order, so every rank ends bit-identical (and
 * the result is the left fold in rank order, whatever the timing: run to run the same).
 *
 * Per rank r, p ranks, n elements cut into slices of the communicator's slice:
 *   sends   slice j of the input to r+1, r+2, ... r+p-1 (mod p): each link gets its turn early;
 *   receives slice j of x0 straight into the accumulator, of x_b (0 < b != r) into scratch
 *           block b: all posted at once, none waiting;
 *   fold    acc = x0 (rank 0: a copy of its input), then acc op= x_b for b = 1 .. p-1 in order,
 *           x_r being the rank's own input (the last one averages).
 * The accumulator is the output, but in place it is scratch block r (the output is the input,
 * read by the sends until the peers took them) and is copied out at the end. Scratch: p·n.
 */
#include "algo.h"

#include "base.h"

void oneshot_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm,
                       bool inplace, bool avg)
{
    int p = s->nranks, r = s->rank;
    if (algo_trivial(s, desc, p, count, inplace)) return;
    uint64_t sl = prm->slice_elems, S = sched_nslices(count, sl);
    s->tmp_elems = LOOM_MAX(s->tmp_elems, (uint64_t)p * count);
    uint32_t acc = inplace ? SCHED_BUF_TMP : SCHED_BUF_RECV;
    uint64_t acc0 = inplace ? (uint64_t)r * count : 0;
    /* slice by slice: its sends, its receives, its fold (an executor keeps a bounded number of
     * messages in flight, and a transport may complete a send only once its receive is posted:
     * every slice's sends before any receive would wait on each other) */
    for (uint64_t j = 0; j < S; j++) {
        uint64_t o = j * sl, len = sched_slice_len(count, sl, j);
        for (int i = 1; i < p; i++)
            sched_send(s, desc, algo_mod(r + i, p), SCHED_BUF_SEND, o, len);
        if (r != 0) sched_recv(s, desc, 0, acc, acc0 + o, len); /* the fold starts from it */
        for (int b = 1; b < p; b++)
            if (b != r) sched_recv(s, desc, b, SCHED_BUF_TMP, (uint64_t)b * count + o, len);
        if (r == 0) sched_copy(s, desc, SCHED_BUF_SEND, o, acc, acc0 + o, len, 0);
        for (int b = 1; b < p; b++) {
            uint8_t f = avg && b == p - 1 ? STEP_F_AVG : 0;
            if (b == r)
                sched_reduce(s, desc, SCHED_BUF_SEND, o, acc, acc0 + o, len, f);
            else
                sched_reduce(s, desc, SCHED_BUF_TMP, (uint64_t)b * count + o, acc, acc0 + o, len,
                             f);
        }
    }
    if (inplace) sched_copy(s, desc, SCHED_BUF_TMP, acc0, SCHED_BUF_RECV, 0, count, 0);
}
