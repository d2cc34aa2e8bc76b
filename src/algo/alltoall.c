/*
 * Direct all-to-all: p-1 rounds of pairwise exchange, round i sending to r+i and receiving from
 * r-i, so that every round pairs each rank with a different peer and no rank is a hot spot.
 *
 * Cost per rank, p ranks, count elements per pair: p-1 rounds; sends and receives (p-1)·count
 * elements, plus one local copy of its own block. Latency: one message per round and slice.
 * Out of place only (the caller runs an in-place call from a copy of the input).
 */
#include "algo.h"

#include "base.h"

void direct_alltoall(sched_t *s, uint16_t desc, uint64_t n, const ring_params_t *prm)
{
    int p = s->nranks, r = s->rank;
    if (n == 0) return;
    sched_copy(s, desc, SCHED_BUF_SEND, (uint64_t)r * n, SCHED_BUF_RECV, (uint64_t)r * n, n, 0);
    uint64_t sl = prm->slice_elems, S = sched_nslices(n, sl);
    for (int i = 1; i < p; i++) {
        int to = algo_mod(r + i, p), from = algo_mod(r - i, p);
        for (uint64_t j = 0; j < S; j++) {
            uint64_t len = sched_slice_len(n, sl, j), o = j * sl;
            sched_send(s, desc, to, SCHED_BUF_SEND, (uint64_t)to * n + o, len);
            sched_recv(s, desc, from, SCHED_BUF_RECV, (uint64_t)from * n + o, len);
        }
    }
}
