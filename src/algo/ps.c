/*
 * Parameter server allreduce, the baseline that ring and hierarchy replace: everyone sends its
 * buffer to rank 0, which reduces and sends the result back. Two steps for the workers, but rank
 * 0 receives and sends (p-1) whole buffers, so its link's bandwidth bounds the call at 2(p-1)
 * buffers whatever p is.
 */
#include "algo.h"

#include "base.h"

void ps_allreduce(sched_t *s, uint16_t desc, uint64_t count, const ring_params_t *prm, bool inplace,
                  bool avg)
{
    int p = s->nranks, r = s->rank;
    if (algo_trivial(s, desc, p, count, inplace)) return;
    uint64_t sl = prm->slice_elems, S = sched_nslices(count, sl);
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
