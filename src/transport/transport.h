/*
 * One ops table, many transports. A transport moves bytes between this rank and its peers and
 * knows nothing about reductions or schedules.
 *
 * Message capability (tcp, mpi, ucx, ibv): connections are created lazily and never block
 * (connect returns a handle at once; the handshake runs inside progress); isend/irecv post work
 * and test reports completion; messages between two ranks match in posting order. Every message
 * carries TRANSPORT_META_BYTES of opaque metadata, which the executor uses to check that both
 * sides run the same operation.
 *
 * Errors: a failing call returns loomRemoteError or loomSystemError and leaves a text naming the
 * peer (rank and address), the system call and errno in transport_conn_error(); the caller adds
 * the operation and logs it once.
 */
#ifndef LOOM_TRANSPORT_H
#define LOOM_TRANSPORT_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "loom.h"

#define TRANSPORT_META_BYTES 32
#define TRANSPORT_HANDLE_BYTES 64

enum { TRANSPORT_CAP_MSG = 1u << 0, TRANSPORT_CAP_MEM = 1u << 1 };
enum { TRANSPORT_REACH_NODE = 1u << 0, TRANSPORT_REACH_NET = 1u << 1 };
enum { TRANSPORT_MEM_HOST = 1u << 0, TRANSPORT_MEM_CUDA = 1u << 1 };

typedef struct transport_ctx transport_ctx_t;
typedef struct transport_conn transport_conn_t;
typedef struct transport_req transport_req_t;

/* What a communicator hands a transport when it starts it. */
typedef struct {
    int rank, nranks;
    uint64_t comm_id;             /* connections of other communicators are refused */
    uint8_t secret[16];           /* the job's secret: peers must prove they know it */
    struct sockaddr_storage bind; /* the address chosen by LOOM_SOCKET_IFNAME (port ignored) */
    socklen_t bind_len;
    size_t max_message; /* the largest message this communicator will post */
} transport_setup_t;

typedef struct {
    const char *name;
    uint32_t caps, reach, mem_types;
    double bw_GBps, latency_us; /* hints for the cost model */

    /* Starts the transport for one communicator: listeners and the like. Writes the handle that
     * peers pass to connect (at most TRANSPORT_HANDLE_BYTES). */
    loomResult_t (*init)(const transport_setup_t *setup, transport_ctx_t **ctx,
                         uint8_t handle[TRANSPORT_HANDLE_BYTES]);
    /* The connection to `peer` (whose handle is given), created at the first call and returned
     * at once; it becomes usable inside progress. Work may be posted on it before then. */
    loomResult_t (*connect)(transport_ctx_t *ctx, int peer,
                            const uint8_t handle[TRANSPORT_HANDLE_BYTES], transport_conn_t **conn);
    loomResult_t (*isend)(transport_conn_t *conn, const void *buf, size_t len,
                          const uint8_t meta[TRANSPORT_META_BYTES], transport_req_t **req);
    loomResult_t (*irecv)(transport_conn_t *conn, void *buf, size_t len, transport_req_t **req);
    /* *done = 1 once finished (then req is released and meta, for receives, filled). A receive
     * whose message had another length returns an error with *done = 1 and meta filled, so
     * that the caller can name the operations that disagree. */
    loomResult_t (*test)(transport_req_t *req, int *done, uint8_t meta[TRANSPORT_META_BYTES]);
    /* Moves bytes; *progressed tells whether anything moved or connected. */
    loomResult_t (*progress)(transport_ctx_t *ctx, bool *progressed);
    /* Descriptors to wait on when nothing progresses; returns how many were written. */
    int (*pollfds)(transport_ctx_t *ctx, struct pollfd *fds, int max);
    /* Makes every pending and later call fail fast, telling peers `reason` where possible. */
    void (*abort)(transport_ctx_t *ctx, const char *reason);
    /* Nanoseconds since the last byte arrived from or left for this peer, and whether
     * anything is pending towards it. */
    uint64_t (*idle_ns)(transport_conn_t *conn, bool *pending);
    /* "rank 3 (10.0.0.2:41234)" */
    const char *(*peer_name)(transport_conn_t *conn);
    /* The text of the connection's last error. */
    const char *(*conn_error)(transport_conn_t *conn);
    /* Registers memory (transports that need it); may be NULL. */
    loomResult_t (*reg_mr)(transport_ctx_t *ctx, void *buf, size_t len, void **mr);
    /* Frees everything. Pending requests are dropped. */
    void (*fini)(transport_ctx_t *ctx);
} transport_ops_t;

/* A connection's first failure, kept for every later call on it (shared by the transports). */
#define TRANSPORT_ERR_MAX 1280
typedef struct {
    bool failed;
    loomResult_t code;
    char text[TRANSPORT_ERR_MAX];
} transport_fail_t;
/* Records the failure unless one is already there (the first cause is the useful one). */
void transport_fail(transport_fail_t *f, loomResult_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

extern const transport_ops_t transport_tcp;
extern const transport_ops_t transport_shm;

/* Whether a ready shm connection copies with cross-memory attach (else bounce segments). */
bool shm_conn_uses_cma(const transport_conn_t *conn);

/* Finds a transport by name ("tcp"); NULL when unknown or not built. */
const transport_ops_t *transport_by_name(const char *name);

#endif
