/*
 * Dependency derivation: one interval map per buffer, built while a schedule is made. Each
 * interval remembers the step that wrote it last and the steps that read it since, so a new step
 * waits for exactly the earlier steps whose regions overlap its own (read after write, write after
 * read, write after write), however differently the generators before it sliced the buffer.
 */
#include "imap.h"

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

bool sched_grow(void **p, size_t *cap, size_t need, size_t elem)
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

static void add_dep(sched_t *s, sched_step_t *st, int64_t dep)
{
    if (dep < 0) return;
    for (uint32_t i = 0; i < st->ndeps; i++)
        if (s->deps[st->dep_first + i] == (uint32_t)dep) return;
    if (!sched_grow((void **)&s->deps, &s->depcap, s->ndeps + 1, sizeof(uint32_t))) {
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
        if (!sched_grow((void **)&s->readers, &s->readercap, s->nreaders + 2, sizeof(uint32_t))) {
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

void sched_imap_access(sched_t *s, sched_step_t *st, int64_t idx, uint32_t buf, uint64_t off,
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
            if (!sched_grow((void **)&s->readers, &s->readercap, s->nreaders + 2,
                            sizeof(uint32_t))) {
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

void sched_imap_reset(sched_t *s)
{
    for (size_t i = 0; i < s->nimaps; i++) {
        s->imaps[i].n = 0;
        if (s->imaps[i].base) s->imaps[i].iv = s->imaps[i].base + s->imaps[i].cap / 2;
    }
    s->nreaders = 0;
}

void sched_imap_free(sched_t *s)
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
