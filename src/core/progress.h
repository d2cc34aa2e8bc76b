/*
 * The progress engine: the one owner of waiting in loom.
 *
 * Two ways to get host work done, and nothing else in loom spins, polls or sleeps on it:
 *
 * - A blocking host call drives its own work on the calling thread (progress_drive): no thread
 *   hop on the hot path. It advances the work, spins for the work's spin time after the last
 *   sign of progress, then asks the work's timeout rules and blocks on its descriptors (the
 *   transports' and the communicator's wake-up eventfd) for at most PROGRESS_BLOCK_MS, so that
 *   aborts and timeouts are seen even when no descriptor fires.
 *
 * - Work that nobody waits on (the network part of device collectives today; MPI and UCX
 *   progress and fusion's buckets next) is served by one thread per process, started at the
 *   first progress_attach. Each attached poll function does a bounded piece of work and says how
 *   long the thread may sleep; when nothing moves the thread spins for the longest spin time any
 *   attachment asked for (0 on nodes with more ranks than cores), then blocks on an eventfd
 *   (progress_wake) and the descriptors of the work it watches (progress_watch), with the
 *   shortest sleep any poll function asked for as the timeout. Idle, it costs nothing.
 */
#ifndef LOOM_CORE_PROGRESS_H
#define LOOM_CORE_PROGRESS_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>

#include "loom.h"

/* The longest a blocked wait lasts before timeouts and aborts are looked at again. */
#define PROGRESS_BLOCK_MS 100
/* By default a spin longer than this yields the core on each pass (progress.c's spin_yield);
 * comm.c yields from the first pass where a node has more ranks than cores. */
#define PROGRESS_HOT_NS 50000ull
/* The longest a wait sleeps when the work has a transport without descriptors (no_fds). */
#define PROGRESS_POLL_NS 50000ull

typedef struct prog_work prog_work_t;
/* Host work that a waiter drives to the end. */
struct prog_work {
    /* Advances without blocking; *done when all of it finished, *progressed if anything moved.
     * An error ends the wait (work that keeps per-part results returns loomSuccess and says
     * done once every part ended, failed or not). */
    loomResult_t (*advance)(prog_work_t *w, bool *done, bool *progressed);
    /* The descriptors to block on when nothing moves; returns how many it wrote. */
    int (*pollfds)(prog_work_t *w, struct pollfd *fds, int max);
    /* Called when nothing moved for the spin time: the liveness and timeout rules. */
    loomResult_t (*check)(prog_work_t *w);
    uint64_t spin_ns; /* spin this long after the last progress before blocking */
    uint64_t hot_ns;  /* of which this long without yielding the core */
    /* A transport of the work has no descriptor that says when bytes arrive (MPI): a wait
     * sleeps at most PROGRESS_POLL_NS, then advances again. */
    bool no_fds;
};

/* Drives w on the calling thread until it is done (or advance/check fail). */
loomResult_t progress_drive(prog_work_t *w);

/* A poll function of the progress thread: a bounded piece of work, *progressed when anything
 * moved; returns how long the thread may sleep before the next call in ns (0: call again at
 * once; UINT64_MAX: not before progress_wake). */
typedef uint64_t (*progress_poll_fn)(void *arg, bool *progressed);

/* Attaches fn(arg) to the process's progress thread (starting it if needed); spin_ns is how long
 * the thread may spin for it when nothing moves, the first hot_ns of it without yielding. */
loomResult_t progress_attach(progress_poll_fn fn, void *arg, uint64_t spin_ns, uint64_t hot_ns);
/* Detaches the poll function with this arg; returns once it is not running and will not run
 * again (at once when called from a poll function itself). */
void progress_detach(void *arg);
/* Wakes the thread (any thread may call it: how new work reaches a sleeping poll function). */
void progress_wake(void);
/* While watched, w's descriptors are part of what the sleeping thread waits on (work that poll
 * functions advance, such as the host collectives of staged device work). Called on the
 * progress thread. */
void progress_watch(prog_work_t *w);
void progress_unwatch(prog_work_t *w);
/* Whether the calling thread is the progress thread. */
bool progress_on_thread(void);

#endif
