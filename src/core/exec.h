/*
 * The host executor's interface: what it needs of a communicator, and nothing more.
 *
 * The executor (exec.c) runs one rank's schedule over message transports. It never sees core's
 * communicator: core fills in an exec_host_t inside each communicator (as it does dev_host_t for
 * the device executor) and hands that to exec_create. Through it the executor reaches the
 * links to the peers (made lazily, by core, through `conn`), the transports to progress and
 * wait on, the parameters that shape its pipeline, the abort flag, the error sink and the
 * statistics. Waiting is not the executor's: exec_progress never blocks, and the progress
 * engine (progress.c) decides when to spin, when to block on exec_pollfds, and when to ask
 * exec_check_timeout.
 */
#ifndef LOOM_CORE_EXEC_H
#define LOOM_CORE_EXEC_H

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "loom.h"
#include "reduce.h"
#include "schedule.h"
#include "transport.h"

/* Steps scanned past the first unissued one (tests/test_sched.c simulates the same window). */
#define EXEC_LOOKAHEAD 4096

/* A started transport of a communicator (ops NULL: not started). */
typedef struct {
    const transport_ops_t *ops;
    transport_ctx_t *ctx;
} exec_tp_t;

/* A peer's connection and the transport that carries it (conn NULL until first used). */
typedef struct {
    const transport_ops_t *ops;
    transport_conn_t *conn;
} exec_link_t;

typedef struct exec_host exec_host_t;
struct exec_host {
    int rank, nranks;
    int nchannels, slices_in_flight; /* receive-and-reduce staging: slots per channel */
    double timeout_s;                /* LOOM_TIMEOUT: no sign of life from a peer; 0: none */
    exec_link_t *links;              /* by peer, owned by core */
    const exec_tp_t *tp;             /* the started transports, ntp of them */
    int ntp;
    int wake_fd;                /* written by abort: part of what a blocked wait watches */
    const atomic_int *aborting; /* set by loomCommAbort: fail at the next step */
    loomStats_t *stats;         /* bytes counted here */
    /* The link to `peer`, connected on first use over the transport core picks for the pair. */
    loomResult_t (*conn)(exec_host_t *h, int peer, exec_link_t **link);
    /* Marks the communicator broken (first error wins) and tells its peers. */
    void (*set_error)(exec_host_t *h, loomResult_t res, const char *text);
    /* Receive-and-reduce staging, the executor's, kept between calls (one schedule runs at a
     * time per communicator) so that big calls do not fault in fresh pages each time; freed by
     * exec_host_release. */
    uint8_t *staging;
    size_t staging_bytes;
};

typedef struct exec exec_t;
/* Starts running `sched` with buffer pointers `bufs` (kept by reference until exec_free). */
loomResult_t exec_create(exec_host_t *h, const sched_t *sched, void *const *bufs,
                         loomDataType_t type, red_op_t op, exec_t **out);
/* Advances without blocking; *done when the schedule finished, *progressed if anything moved. */
loomResult_t exec_progress(exec_t *e, bool *done, bool *progressed);
/* The descriptors a blocked wait watches (the host's wake_fd and its transports'). */
int exec_pollfds(exec_t *e, struct pollfd *fds, int max);
/* Whether a started transport of h has no descriptors to wait on (TRANSPORT_CAP_POLL). */
bool exec_host_no_fds(const exec_host_t *h);
/* Gives up when a peer this schedule waits on showed no sign of life for LOOM_TIMEOUT, or when
 * nothing finished for twice that although every peer is alive: the error names the peer. */
loomResult_t exec_check_timeout(exec_t *e);
void exec_free(exec_t *e);
/* Frees what the executor keeps in `h` between calls. */
void exec_host_release(exec_host_t *h);

#endif
