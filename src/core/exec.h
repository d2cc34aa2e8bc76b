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
#include <pthread.h>
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

/* What the hang report says of the last operations started and finished (one store each per
 * call). */
typedef struct {
    sched_desc_t started, finished;
    uint64_t started_ns, finished_ns;
    bool any_started, any_finished;
} exec_report_t;

typedef struct exec_host exec_host_t;
typedef struct exec exec_t;
struct exec_host {
    int rank, nranks;
    int nchannels, slices_in_flight; /* receive-and-reduce staging: slots per channel */
    double timeout_s;                /* LOOM_TIMEOUT: no sign of life from a peer; 0: none */
    double op_timeout_s; /* LOOM_OP_TIMEOUT: how long one operation may wait on live peers */
    exec_link_t *links;  /* by peer, owned by core */
    const exec_tp_t *tp; /* the started transports, ntp of them */
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
    /* The last schedule's exec, kept for the next (the same rule: one at a time), freed by
     * exec_host_release. */
    exec_t *spare;
    /* Liveness between calls (exec_keepalive_start): the progress thread moves the transports
     * (heartbeats, accepting and authenticating the peers' connections) while no schedule of
     * this communicator runs. `lock` (recursive: an error inside a step aborts the transports
     * under it) is held by whoever moves them: exec_progress, exec_pollfds, exec_check_timeout
     * and exec_free on the caller's thread, the keepalive on the progress thread, and core's
     * abort of the transports. The keepalive only tries it, and does nothing while `running`
     * (a schedule runs: its caller's progress heartbeats itself). */
    pthread_mutex_t lock;
    atomic_int running;
    atomic_int call_state; /* TRANSPORT_CALL_*: what this rank's heartbeats say */
    bool keepalive_on;
    uint64_t keepalive_ns;
    /* The communicator's error (core's), when set by another thread (the job-state service's
     * verdict): the schedule running fails at its next step with that text. */
    const atomic_int *async_error;
    const char *async_text;
    /* For the hang report (exec_host_status), under `lock`: the schedule running now, and the
     * last operation started and finished (one store each per call). */
    exec_t *cur;
    /* An operation that runs without a schedule (the node segment's allreduce), for the same
     * report: its descriptor, when it started, and who it waits on (written by waits under
     * `lock`); waits NULL: none runs. Set by exec_host_side_begin/end. */
    sched_desc_t side;
    uint64_t side_ns;
    void (*side_waits)(const void *arg, char *buf, size_t len);
    const void *side_arg;
    exec_report_t rep;
};

/* Fills the executor's own parts of h (lock, states, LOOM_OP_TIMEOUT); once, before any use. */
void exec_host_init(exec_host_t *h);
/* Attaches the keepalive to the progress thread (once the transports are started) and detaches
 * it (before they are freed; returns once it no longer runs). */
loomResult_t exec_keepalive_start(exec_host_t *h);
void exec_keepalive_stop(exec_host_t *h);
void exec_host_lock(exec_host_t *h);
void exec_host_unlock(exec_host_t *h);

/* Starts running `sched` with buffer pointers `bufs` (kept by reference until exec_free). */
loomResult_t exec_create(exec_host_t *h, const sched_t *sched, void *const *bufs,
                         loomDataType_t type, red_op_t op, exec_t **out);
/* Advances without blocking; *done when the schedule finished, *progressed if anything moved. */
loomResult_t exec_progress(exec_t *e, bool *done, bool *progressed);
/* The descriptors a blocked wait watches (the host's wake_fd and its transports'). */
int exec_pollfds(exec_t *e, struct pollfd *fds, int max);
/* Whether a started transport of h has no descriptors to wait on (TRANSPORT_CAP_POLL). */
bool exec_host_no_fds(const exec_host_t *h);
/* The timeout rules, each error naming the operation (kind and seq) and the peers:
 * - a peer this schedule waits on showed no sign of life (no byte, no heartbeat) for
 *   LOOM_TIMEOUT: it is dead, stopped or unreachable;
 * - LOOM_OP_TIMEOUT (default off) passed since the operation started, although the peers are
 *   alive: the error lists the peers it waits on and what their heartbeats say they do;
 * - point to point only: nothing finished for twice LOOM_TIMEOUT while the peer is inside a call
 *   of this communicator that waits on no rank outside calls: the ranks wait on each other
 *   (loomInvalidUsage). A collective waits on live peers without limit but LOOM_OP_TIMEOUT:
 *   a rank that computes, loads or checkpoints between calls is not an error. */
loomResult_t exec_check_timeout(exec_t *e);
void exec_free(exec_t *e);
/* The hang report's line of this rank: the operation it runs (kind, seq, for how long, the peers
 * it waits on and what their heartbeats say) or that it is outside calls, and the last
 * operation it finished. */
bool exec_host_status(exec_host_t *h, char *buf, size_t len); /* false: busy (locked) */
/* The operation running now ("allreduce seq 12 (count ...)"), or "" outside calls. */
void exec_host_current(exec_host_t *h, char *buf, size_t len);
/* "allreduce seq 12 (count 4, float32, sum)": how every error names an operation. */
void exec_desc_str(const sched_desc_t *d, char *buf, size_t len);
/* The text of a mismatch between this rank's operation and the one `peer` runs at the same
 * place (the same operation cut differently, or another operation). */
void exec_mismatch_text(int peer, const sched_desc_t *theirs, int rank, const sched_desc_t *mine,
                        char *text, size_t len);
/* An operation without a schedule starts or ends (finished: it completed), for the hang report
 * and exec_host_current. */
void exec_host_side_begin(exec_host_t *h, const sched_desc_t *d,
                          void (*waits)(const void *arg, char *buf, size_t len), const void *arg);
void exec_host_side_end(exec_host_t *h, bool finished);
/* Frees what the executor keeps in `h` between calls. */
void exec_host_release(exec_host_t *h);

#endif
