/* The schedule builder's private half: dependency tracking (imap.c), used by schedule.c only. */
#ifndef LOOM_SCHED_IMAP_H
#define LOOM_SCHED_IMAP_H

#include "schedule.h"

/* Grows *p to hold `need` elements of `elem` bytes (doubling); false when memory ran out. */
bool sched_grow(void **p, size_t *cap, size_t need, size_t elem);
/* Records that step `idx` (being built in *st) reads or writes st->count elements of buf at off,
 * appending the dependencies that this implies to s->deps; failures set s->oom. */
void sched_imap_access(sched_t *s, sched_step_t *st, int64_t idx, uint32_t buf, uint64_t off,
                       bool write);
/* Empties every map, keeping the allocations for the next schedule. */
void sched_imap_reset(sched_t *s);
/* Frees the maps and the reader pool; the steps stay valid. */
void sched_imap_free(sched_t *s);

#endif
