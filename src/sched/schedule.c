/* Schedule building: steps, descriptors and buffers; each step's dependencies come from the
 * interval maps (imap.c) of the regions it touches. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "imap.h"

void sched_init(sched_t *s, int rank, int nranks)
{
    memset(s, 0, sizeof(*s));
    s->rank = rank;
    s->nranks = nranks;
    s->nbufs = SCHED_BUF_FIRST_FREE;
}

void sched_reset(sched_t *s, int rank, int nranks)
{
    s->rank = rank;
    s->nranks = nranks;
    s->nbufs = SCHED_BUF_FIRST_FREE;
    s->nsteps = s->ndeps = s->ndescs = 0;
    s->tmp_elems = 0;
    s->alias_from = s->alias_to = 0;
    s->alias_delta = 0;
    sched_imap_reset(s);
    s->oom = false;
}

void sched_free(sched_t *s)
{
    free(s->steps);
    free(s->deps);
    free(s->descs);
    sched_imap_free(s);
    memset(s, 0, sizeof(*s));
}

uint32_t sched_add_buf(sched_t *s)
{
    return s->nbufs++;
}

void sched_drop_tracking(sched_t *s)
{
    sched_imap_free(s);
}

void sched_set_alias(sched_t *s, uint32_t from, uint32_t to, int64_t delta)
{
    s->alias_from = from;
    s->alias_to = to;
    s->alias_delta = delta;
}

uint16_t sched_add_desc(sched_t *s, const sched_desc_t *d)
{
    if (s->ndescs >= 65535 ||
        !sched_grow((void **)&s->descs, &s->desccap, s->ndescs + 1, sizeof(*d))) {
        s->oom = true;
        return 0;
    }
    s->descs[s->ndescs] = *d;
    return (uint16_t)s->ndescs++;
}

loomResult_t sched_status(const sched_t *s)
{
    if (s->oom)
        return base_error(loomSystemError, LOG_COLL,
                          "out of memory building a schedule of %zu steps", s->nsteps);
    return loomSuccess;
}

static void add_step(sched_t *s, sched_step_t st, bool reads, bool writes)
{
    if (st.count == 0) return;
    if (!sched_grow((void **)&s->steps, &s->cap, s->nsteps + 1, sizeof(st))) {
        s->oom = true;
        return;
    }
    int64_t idx = (int64_t)s->nsteps;
    st.dep_first = (uint32_t)s->ndeps;
    st.ndeps = 0;
    /* Dependencies are appended contiguously for this step before the next one starts. */
    /* Read first: a step that reads and writes one region must not wait for itself. */
    if (reads) sched_imap_access(s, &st, idx, st.src_buf, st.src_off, false);
    if (writes) sched_imap_access(s, &st, idx, st.dst_buf, st.dst_off, true);
    s->steps[s->nsteps++] = st;
}

/* A send reads its region, a receive writes it; both name one buffer and offset. */
static void add_transfer(sched_t *s, uint8_t kind, uint16_t desc, int peer, uint32_t buf,
                         uint64_t off, uint64_t count)
{
    sched_step_t st = {.kind = kind,
                       .desc = desc,
                       .peer = peer,
                       .src_buf = buf,
                       .src_off = off,
                       .dst_buf = buf,
                       .dst_off = off,
                       .count = count};
    add_step(s, st, kind == STEP_SEND, kind == STEP_RECV);
}

void sched_send(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off, uint64_t count)
{
    add_transfer(s, STEP_SEND, desc, peer, buf, off, count);
}

void sched_recv(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off, uint64_t count)
{
    add_transfer(s, STEP_RECV, desc, peer, buf, off, count);
}

void sched_recv_reduce(sched_t *s, uint16_t desc, int peer, uint32_t src_buf, uint64_t src_off,
                       uint32_t dst_buf, uint64_t dst_off, uint64_t count, uint8_t flags)
{
    sched_step_t st = {.kind = STEP_RECV_REDUCE,
                       .flags = flags,
                       .desc = desc,
                       .peer = peer,
                       .src_buf = src_buf,
                       .src_off = src_off,
                       .dst_buf = dst_buf,
                       .dst_off = dst_off,
                       .count = count};
    add_step(s, st, true, true);
}

/* A step on this rank's memory alone (peer -1): a copy, or a reduction into dst (whose write's
 * dependencies, on the accumulator's last writer and readers, cover its read of dst). */
static void add_local(sched_t *s, uint8_t kind, uint16_t desc, uint32_t src_buf, uint64_t src_off,
                      uint32_t dst_buf, uint64_t dst_off, uint64_t count, uint8_t flags)
{
    sched_step_t st = {.kind = kind,
                       .flags = flags,
                       .desc = desc,
                       .peer = -1,
                       .src_buf = src_buf,
                       .src_off = src_off,
                       .dst_buf = dst_buf,
                       .dst_off = dst_off,
                       .count = count};
    add_step(s, st, true, true);
}

void sched_copy(sched_t *s, uint16_t desc, uint32_t src_buf, uint64_t src_off, uint32_t dst_buf,
                uint64_t dst_off, uint64_t count, uint8_t flags)
{
    add_local(s, STEP_COPY, desc, src_buf, src_off, dst_buf, dst_off, count, flags);
}

void sched_reduce(sched_t *s, uint16_t desc, uint32_t src_buf, uint64_t src_off, uint32_t dst_buf,
                  uint64_t dst_off, uint64_t count, uint8_t flags)
{
    add_local(s, STEP_REDUCE, desc, src_buf, src_off, dst_buf, dst_off, count, flags);
}

const char *sched_opkind_name(int kind)
{
    switch (kind) {
    case OPK_ALLREDUCE: return "allreduce";
    case OPK_BROADCAST: return "broadcast";
    case OPK_REDUCE: return "reduce";
    case OPK_ALLGATHER: return "allgather";
    case OPK_REDUCESCATTER: return "reduce-scatter";
    case OPK_ALLTOALL: return "alltoall";
    case OPK_SEND: return "send";
    case OPK_RECV: return "recv";
    case OPK_SPLIT: return "internal exchange (split, device setup or handles)";
    default: return "operation";
    }
}
