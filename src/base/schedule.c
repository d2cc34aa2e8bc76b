/* Schedule building: steps plus dependencies derived from the regions each step touches. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "base.h"

struct sched_region_slot {
    uint32_t buf;
    uint32_t used;
    int64_t off;
    int64_t last_writer; /* step index, -1: none */
    int64_t readers;     /* head of a list in s->readers (pairs: step, next), -1: none */
};

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
    if (s->regions) memset(s->regions, 0, s->region_cap * sizeof(*s->regions));
    s->region_used = 0;
    s->nreaders = 0;
    s->oom = false;
}

void sched_free(sched_t *s)
{
    free(s->steps);
    free(s->deps);
    free(s->descs);
    free(s->regions);
    free(s->readers);
    memset(s, 0, sizeof(*s));
}

uint32_t sched_add_buf(sched_t *s) { return s->nbufs++; }

void sched_set_alias(sched_t *s, uint32_t from, uint32_t to, int64_t delta)
{
    s->alias_from = from;
    s->alias_to = to;
    s->alias_delta = delta;
}

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (q == NULL) return false;
    *p = q;
    *cap = n;
    return true;
}

uint16_t sched_add_desc(sched_t *s, const sched_desc_t *d)
{
    if (s->ndescs >= 65535 || !grow((void **)&s->descs, &s->desccap, s->ndescs + 1, sizeof(*d))) {
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

static uint64_t region_hash(uint32_t buf, int64_t off)
{
    uint64_t h = (uint64_t)off * 0x9e3779b97f4a7c15ull ^ ((uint64_t)buf << 48);
    return h ^ (h >> 29);
}

static bool region_rehash(sched_t *s)
{
    size_t ncap = s->region_cap ? s->region_cap * 2 : 256;
    sched_region_slot_t *n = calloc(ncap, sizeof(*n));
    if (n == NULL) return false;
    for (size_t i = 0; i < s->region_cap; i++) {
        sched_region_slot_t *o = &s->regions[i];
        if (!o->used) continue;
        size_t h = region_hash(o->buf, o->off) & (ncap - 1);
        while (n[h].used) h = (h + 1) & (ncap - 1);
        n[h] = *o;
    }
    free(s->regions);
    s->regions = n;
    s->region_cap = ncap;
    return true;
}

static sched_region_slot_t *region_get(sched_t *s, uint32_t buf, uint64_t off)
{
    int64_t o = (int64_t)off;
    if (buf == s->alias_from && s->alias_from != s->alias_to) {
        buf = s->alias_to;
        o += s->alias_delta;
    }
    if ((s->region_used + 1) * 2 > s->region_cap && !region_rehash(s)) return NULL;
    size_t h = region_hash(buf, o) & (s->region_cap - 1);
    while (s->regions[h].used) {
        if (s->regions[h].buf == buf && s->regions[h].off == o) return &s->regions[h];
        h = (h + 1) & (s->region_cap - 1);
    }
    sched_region_slot_t *r = &s->regions[h];
    r->used = 1;
    r->buf = buf;
    r->off = o;
    r->last_writer = -1;
    r->readers = -1;
    s->region_used++;
    return r;
}

static void add_dep(sched_t *s, sched_step_t *st, int64_t dep)
{
    if (dep < 0) return;
    for (uint32_t i = 0; i < st->ndeps; i++)
        if (s->deps[st->dep_first + i] == (uint32_t)dep) return;
    if (!grow((void **)&s->deps, &s->depcap, s->ndeps + 1, sizeof(uint32_t))) {
        s->oom = true;
        return;
    }
    s->deps[s->ndeps++] = (uint32_t)dep;
    st->ndeps++;
}

static void region_read(sched_t *s, sched_step_t *st, int64_t idx, uint32_t buf, uint64_t off)
{
    sched_region_slot_t *r = region_get(s, buf, off);
    if (r == NULL || !grow((void **)&s->readers, &s->readercap, s->nreaders + 2,
                           sizeof(uint32_t))) {
        s->oom = true;
        return;
    }
    add_dep(s, st, r->last_writer);
    s->readers[s->nreaders] = (uint32_t)idx;
    s->readers[s->nreaders + 1] = (uint32_t)r->readers;
    r->readers = (int64_t)s->nreaders;
    s->nreaders += 2;
}

static void region_write(sched_t *s, sched_step_t *st, int64_t idx, uint32_t buf, uint64_t off)
{
    sched_region_slot_t *r = region_get(s, buf, off);
    if (r == NULL) {
        s->oom = true;
        return;
    }
    add_dep(s, st, r->last_writer);
    for (int64_t i = r->readers; i >= 0; i = (int32_t)s->readers[i + 1])
        if ((int64_t)s->readers[i] != idx) add_dep(s, st, s->readers[i]);
    r->readers = -1;
    r->last_writer = idx;
}

static void add_step(sched_t *s, sched_step_t st, bool reads, bool writes)
{
    if (st.count == 0) return;
    if (!grow((void **)&s->steps, &s->cap, s->nsteps + 1, sizeof(st))) {
        s->oom = true;
        return;
    }
    int64_t idx = (int64_t)s->nsteps;
    st.dep_first = (uint32_t)s->ndeps;
    st.ndeps = 0;
    /* Dependencies are appended contiguously for this step before the next one starts. */
    /* Read first: a step that reads and writes one region must not wait for itself. */
    if (reads) region_read(s, &st, idx, st.src_buf, st.src_off);
    if (writes) region_write(s, &st, idx, st.dst_buf, st.dst_off);
    s->steps[s->nsteps++] = st;
}

void sched_send(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off, uint64_t count)
{
    sched_step_t st = {.kind = STEP_SEND, .desc = desc, .peer = peer, .src_buf = buf,
                       .src_off = off, .dst_buf = buf, .dst_off = off, .count = count};
    add_step(s, st, true, false);
}

void sched_recv(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off, uint64_t count)
{
    sched_step_t st = {.kind = STEP_RECV, .desc = desc, .peer = peer, .src_buf = buf,
                       .src_off = off, .dst_buf = buf, .dst_off = off, .count = count};
    add_step(s, st, false, true);
}

void sched_recv_reduce(sched_t *s, uint16_t desc, int peer, uint32_t src_buf, uint64_t src_off,
                       uint32_t dst_buf, uint64_t dst_off, uint64_t count, uint8_t flags)
{
    sched_step_t st = {.kind = STEP_RECV_REDUCE, .flags = flags, .desc = desc, .peer = peer,
                       .src_buf = src_buf, .src_off = src_off, .dst_buf = dst_buf,
                       .dst_off = dst_off, .count = count};
    add_step(s, st, true, true);
}

void sched_copy(sched_t *s, uint16_t desc, uint32_t src_buf, uint64_t src_off, uint32_t dst_buf,
                uint64_t dst_off, uint64_t count, uint8_t flags)
{
    sched_step_t st = {.kind = STEP_COPY, .flags = flags, .desc = desc, .peer = -1,
                       .src_buf = src_buf, .src_off = src_off, .dst_buf = dst_buf,
                       .dst_off = dst_off, .count = count};
    add_step(s, st, true, true);
}
