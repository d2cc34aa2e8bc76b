/*
 * The node segment: one shared memory segment for all ranks of a communicator that lives on one
 * node, through which small allreduces go without messages (registry row "segment").
 *
 * Rank 0 creates it (a memfd, sized for LOOM_SEGMENT bytes per rank and call, two calls deep)
 * before the bootstrap (a split child's rank 0: before the split's second exchange) and
 * publishes its pid, descriptor and a random nonce with its rank record;
 * every rank opens it through /proc/<pid>/fd/<fd> (the same user, the same pid namespace), checks
 * the nonce, and the ranks agree with one allgather that all of them have it, or none uses it.
 *
 * An allreduce of call k: each rank copies its input into its slot of phase k's parity, stamps
 * the slot with the collective's sequence number and descriptor, then says it arrived; once all
 * ranks arrived it folds the p slots in rank order, ((x0 op x1) op x2) ..., the one-shot
 * schedule's fold (src/algo/oneshot.c), so the result is bit-identical on every rank and to
 * LOOM_ALGO=oneshot. Two phases suffice: a rank writes phase k's parity again only at call k+2,
 * after it saw every rank arrive at k+1, which each does only after its own fold of k.
 *
 * Every collective of the communicator, whatever its algorithm, says it arrived (its sequence
 * number and descriptor), so that a rank running another operation as collective k is a
 * mismatch naming both, not a hang. While it waits a rank watches, for each peer not arrived:
 * its abort word (loomCommAbort, or an error, with its reason), the communicator's own error
 * (the job-state service's verdict), a pidfd that fires when the peer exits, and after
 * LOOM_TIMEOUT whether it is stopped. A peer that is alive and outside calls is computing: it
 * is waited for (LOOM_OP_TIMEOUT bounds that when set).
 */
#ifndef LOOM_CORE_NODESEG_H
#define LOOM_CORE_NODESEG_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exec.h"
#include "loom.h"
#include "reduce.h"
#include "schedule.h"

typedef struct nodeseg nodeseg_t;

/* What rank 0 publishes in its bootstrap record (all zero elsewhere, or when none was made). */
typedef struct {
    int32_t pid, fd;
    uint64_t nonce;
} nodeseg_offer_t;

/* Rank 0, before the bootstrap: creates the segment for nranks ranks (none when LOOM_SEGMENT=0
 * or nranks is 1 or more than NODESEG_MAX_RANKS); fills *offer (zero: none). Returns the
 * descriptor to keep until nodeseg_attach, -1 for none. */
int nodeseg_create(int nranks, nodeseg_offer_t *offer);
#define NODESEG_MAX_RANKS 64

/* Every rank, after the layout is known: maps rank 0's segment (fd: rank 0's own, which it
 * keeps open until every rank has mapped it; -1 on the others). NULL with *why set when it
 * cannot (why says it for the INFO line). */
nodeseg_t *nodeseg_attach(exec_host_t *h, const nodeseg_offer_t *offer, int fd, const int32_t *pids,
                          const char **why);
void nodeseg_free(nodeseg_t *s);
/* The largest allreduce in bytes that fits a slot. */
size_t nodeseg_max_bytes(const nodeseg_t *s);
/* Tells the peers that wait in the segment that this rank failed or aborted, and why. */
void nodeseg_abort(nodeseg_t *s, const char *reason);
/* A collective starts (any algorithm): its descriptor, for peers waiting in the segment. */
void nodeseg_arrive(nodeseg_t *s, const sched_desc_t *d);
/* This rank is inside a call of the communicator, or outside. */
void nodeseg_state(nodeseg_t *s, bool in_call);

/* One allreduce through the segment. */
typedef struct {
    nodeseg_t *s;
    sched_desc_t d;
    const void *send;
    void *recv;
    size_t count;
    loomDataType_t type;
    red_op_t op;
    bool avg;
    uint64_t start_ns; /* base_coarse_ns */
    int next;          /* peers below it arrived (checked in rank order) */
} nodeseg_call_t;

/* Copies the input in and arrives (d: the collective's descriptor, seq and shape set). */
loomResult_t nodeseg_start(nodeseg_t *s, nodeseg_call_t *c, const sched_desc_t *d, const void *send,
                           void *recv, size_t count, loomDataType_t type, red_op_t op, bool avg);
/* Without blocking: *done once every rank arrived and the fold is in recv. */
loomResult_t nodeseg_test(nodeseg_call_t *c, bool *done, bool *progressed);
/* When nothing moved for the spin time: the liveness and timeout rules. */
loomResult_t nodeseg_check(nodeseg_call_t *c);
/* What a blocked wait watches: the communicator's wake-up and the awaited peers' pidfds. */
int nodeseg_pollfds(nodeseg_call_t *c, struct pollfd *fds, int max);

#endif
