/* Schedule building: steps plus dependencies derived from the regions each step touches. */
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#include "base.h"

/* One interval of a buffer: who wrote it last, and who read it since. */
typedef struct {
    int64_t start, end;
    int64_t last_writer; /* step index, -1: none */
    int64_t readers;     /* head of a list in s->readers, -1: none */
} sched_ival_t;

/* Disjoint intervals sorted by start; only ranges that steps touched are present. The array
 * keeps free room at both ends (iv points at the first interval, base at the allocation), so an
 * insertion moves whichever side is shorter: rings touch chunks in descending order, which
 * would otherwise shift the whole array on every new range. */
struct sched_imap {
    sched_ival_t *iv, *base;
    size_t n, cap;
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
    for (size_t i = 0; i < s->nimaps; i++) {
        s->imaps[i].n = 0;
        if (s->imaps[i].base) s->imaps[i].iv = s->imaps[i].base + s->imaps[i].cap / 2;
    }
    s->nreaders = 0;
    s->oom = false;
}

void sched_free(sched_t *s)
{
    free(s->steps);
    free(s->deps);
    free(s->descs);
    for (size_t i = 0; i < s->nimaps; i++)
        free(s->imaps[i].base);
    free(s->imaps);
    free(s->readers);
    memset(s, 0, sizeof(*s));
}

uint32_t sched_add_buf(sched_t *s)
{
    return s->nbufs++;
}

void sched_drop_tracking(sched_t *s)
{
    for (size_t i = 0; i < s->nimaps; i++)
        free(s->imaps[i].base);
    free(s->imaps);
    s->imaps = NULL;
    s->nimaps = 0;
    free(s->readers);
    s->readers = NULL;
    s->readercap = s->nreaders = 0;
}

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
    while (n < need)
        n *= 2;
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

static sched_imap_t *imap_of(sched_t *s, uint32_t buf)
{
    if (buf >= s->nimaps) {
        size_t n = LOOM_MAX((size_t)buf + 1, s->nimaps * 2);
        sched_imap_t *m = realloc(s->imaps, n * sizeof(*m));
        if (m == NULL) return NULL;
        memset(m + s->nimaps, 0, (n - s->nimaps) * sizeof(*m));
        s->imaps = m;
        s->nimaps = n;
    }
    return &s->imaps[buf];
}

/* Copies a reader list (intervals that split share their history). */
static int64_t readers_copy(sched_t *s, int64_t head)
{
    int64_t out = -1;
    for (int64_t i = head; i >= 0; i = (int32_t)s->readers[i + 1]) {
        if (!grow((void **)&s->readers, &s->readercap, s->nreaders + 2, sizeof(uint32_t))) {
            s->oom = true;
            return out;
        }
        s->readers[s->nreaders] = s->readers[i];
        s->readers[s->nreaders + 1] = (uint32_t)out;
        out = (int64_t)s->nreaders;
        s->nreaders += 2;
    }
    return out;
}

/* Index of the first interval with end > x. */
static size_t imap_find(const sched_imap_t *m, int64_t x)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->iv[mid].end <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool imap_insert(sched_t *s, sched_imap_t *m, size_t at, sched_ival_t v)
{
    size_t front = m->base ? (size_t)(m->iv - m->base) : 0;
    if (at < m->n - at && front > 0) {
        memmove(m->iv - 1, m->iv, at * sizeof(*m->iv));
        m->iv--;
    } else if (m->base && front + m->n < m->cap) {
        memmove(m->iv + at + 1, m->iv + at, (m->n - at) * sizeof(*m->iv));
    } else {
        size_t ncap = LOOM_MAX((size_t)64, 2 * (m->n + 1));
        sched_ival_t *nb = malloc(ncap * sizeof(*nb));
        if (nb == NULL) {
            s->oom = true;
            return false;
        }
        sched_ival_t *niv = nb + (ncap - m->n - 1) / 2;
        if (m->n) {
            memcpy(niv, m->iv, at * sizeof(*niv));
            memcpy(niv + at + 1, m->iv + at, (m->n - at) * sizeof(*niv));
        }
        free(m->base);
        m->base = nb;
        m->iv = niv;
        m->cap = ncap;
    }
    m->iv[at] = v;
    m->n++;
    return true;
}

/* Makes [a, b) exactly covered by intervals (splitting and filling gaps); returns the index of
 * the first one, and in *last one past the final one. */
static size_t imap_cover(sched_t *s, sched_imap_t *m, int64_t a, int64_t b, size_t *last)
{
    size_t i = imap_find(m, a);
    int64_t x = a;
    size_t first = i;
    while (x < b && !s->oom) {
        if (i == m->n || m->iv[i].start >= b) {
            sched_ival_t v = {x, b, -1, -1};
            imap_insert(s, m, i, v);
            i++;
            break;
        }
        sched_ival_t *iv = &m->iv[i];
        if (iv->start > x) { /* a gap before this interval */
            sched_ival_t v = {x, iv->start, -1, -1};
            if (!imap_insert(s, m, i, v)) break;
            x = m->iv[i].end;
            i++;
            continue;
        }
        if (iv->start < x) { /* split off the part before a */
            sched_ival_t left = *iv;
            left.end = x;
            m->iv[i].start = x;
            m->iv[i].readers = readers_copy(s, left.readers);
            if (!imap_insert(s, m, i, left)) break;
            i++;
            if (i == first + 1) first = i;
            continue;
        }
        if (iv->end > b) { /* split off the part after b */
            sched_ival_t right = *iv;
            right.start = b;
            right.readers = readers_copy(s, iv->readers);
            m->iv[i].end = b;
            if (!imap_insert(s, m, i + 1, right)) break;
        }
        x = m->iv[i].end;
        i++;
    }
    *last = i;
    return imap_find(m, a);
}

static void region_access(sched_t *s, sched_step_t *st, int64_t idx, uint32_t buf, uint64_t off,
                          bool write)
{
    int64_t a = (int64_t)off;
    if (buf == s->alias_from && s->alias_from != s->alias_to) {
        buf = s->alias_to;
        a += s->alias_delta;
    }
    int64_t b = a + (int64_t)st->count;
    sched_imap_t *m = imap_of(s, buf);
    if (m == NULL) {
        s->oom = true;
        return;
    }
    size_t last;
    size_t i = imap_cover(s, m, a, b, &last);
    for (; i < m->n && m->iv[i].start < b && !s->oom; i++) {
        sched_ival_t *iv = &m->iv[i];
        add_dep(s, st, iv->last_writer);
        if (write) {
            for (int64_t r = iv->readers; r >= 0; r = (int32_t)s->readers[r + 1])
                if ((int64_t)s->readers[r] != idx) add_dep(s, st, s->readers[r]);
            iv->readers = -1;
            iv->last_writer = idx;
        } else {
            if (!grow((void **)&s->readers, &s->readercap, s->nreaders + 2, sizeof(uint32_t))) {
                s->oom = true;
                return;
            }
            s->readers[s->nreaders] = (uint32_t)idx;
            s->readers[s->nreaders + 1] = (uint32_t)iv->readers;
            iv->readers = (int64_t)s->nreaders;
            s->nreaders += 2;
        }
    }
}

static void region_read(sched_t *s, sched_step_t *st, int64_t idx, uint32_t buf, uint64_t off)
{
    region_access(s, st, idx, buf, off, false);
}

static void region_write(sched_t *s, sched_step_t *st, int64_t idx, uint32_t buf, uint64_t off)
{
    region_access(s, st, idx, buf, off, true);
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
    sched_step_t st = {.kind = STEP_SEND,
                       .desc = desc,
                       .peer = peer,
                       .src_buf = buf,
                       .src_off = off,
                       .dst_buf = buf,
                       .dst_off = off,
                       .count = count};
    add_step(s, st, true, false);
}

void sched_recv(sched_t *s, uint16_t desc, int peer, uint32_t buf, uint64_t off, uint64_t count)
{
    sched_step_t st = {.kind = STEP_RECV,
                       .desc = desc,
                       .peer = peer,
                       .src_buf = buf,
                       .src_off = off,
                       .dst_buf = buf,
                       .dst_off = off,
                       .count = count};
    add_step(s, st, false, true);
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

void sched_copy(sched_t *s, uint16_t desc, uint32_t src_buf, uint64_t src_off, uint32_t dst_buf,
                uint64_t dst_off, uint64_t count, uint8_t flags)
{
    sched_step_t st = {.kind = STEP_COPY,
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
