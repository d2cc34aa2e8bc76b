/*
 * A least-recently-used choice among a small fixed array of entries, for caches of a few dozen
 * entries where a linear scan is cheaper than any index (the device executor's IPC mappings,
 * core's schedule cache). Header only, no allocation: the entries stay the caller's, each with
 * a use stamp (a uint64_t member) that the caller sets from its clock on every use.
 *
 * A stamp of 0 marks an empty entry; the clock starts at 0 and every use takes the next value,
 * so stamps of used entries are distinct and never 0. The caller looks its key up itself (only
 * it knows what a key is) and, on a miss, asks lru_pick for the entry to fill: the first empty
 * one, else the one used longest ago. If it evicts a used entry, releasing what that entry held
 * is the caller's job too.
 *
 *     for (i...) if (e[i].use && e[i].key == key) { e[i].use = lru_tick(&clock); return ...; }
 *     size_t v = LRU_PICK(e, n, use);       // e[v].use == 0: empty; else evict e[v] first
 *     e[v] = (entry){.key = key, .use = lru_tick(&clock), ...};
 */
#ifndef LOOM_BASE_LRU_H
#define LOOM_BASE_LRU_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t now; /* the last stamp handed out (0: none yet) */
} lru_clock_t;

/* The stamp of a use now: later than every stamp before it, never 0. */
static inline uint64_t lru_tick(lru_clock_t *c)
{
    return ++c->now;
}

/* The index, among n >= 1 entries whose stamps lie `stride` bytes apart from *first, of the first
 * entry with the smallest stamp: an empty entry if there is one, else the least recently used. */
static inline size_t lru_pick(const uint64_t *first, size_t n, size_t stride)
{
    size_t best = 0;
    uint64_t oldest = *first;
    for (size_t i = 1; i < n && oldest != 0; i++) {
        uint64_t u = *(const uint64_t *)((const char *)first + i * stride);
        if (u < oldest) {
            oldest = u;
            best = i;
        }
    }
    return best;
}

/* lru_pick over an array of entries `arr` of n elements, stamps in member `use`. */
#define LRU_PICK(arr, n, use) lru_pick(&(arr)[0].use, (n), sizeof((arr)[0]))

#endif
