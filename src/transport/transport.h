/*
 * One ops table, many transports. A transport moves bytes between this rank and its peers and
 * knows nothing about reductions or schedules.
 *
 * Message capability (tcp, shm and mpi; ucx and ibv when they land): connections are created lazily
 * and never block (connect returns a handle at once; the handshake runs inside progress);
 * isend/irecv post work and test reports completion; messages between two ranks match in posting
 * order. Every message carries TRANSPORT_META_BYTES of opaque metadata, which the executor uses to
 * check that both sides run the same operation.
 *
 * Errors: a failing call returns loomRemoteError or loomSystemError and leaves a text naming the
 * peer (rank and address), the system call and errno in transport_conn_error(); the caller adds
 * the operation and logs it once.
 */
#ifndef LOOM_TRANSPORT_H
#define LOOM_TRANSPORT_H

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "loom.h"
#include "sock.h"

#define TRANSPORT_META_BYTES 32
#define TRANSPORT_HANDLE_BYTES 64

/* TRANSPORT_CAP_POLL: no descriptor tells when bytes arrive (MPI): pollfds gives none, and a
 * waiter that finds nothing to do sleeps at most PROGRESS_POLL_NS before calling progress again. */
enum { TRANSPORT_CAP_MSG = 1u << 0, TRANSPORT_CAP_MEM = 1u << 1, TRANSPORT_CAP_POLL = 1u << 2 };
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
    /* What this rank's heartbeats say about it (a TRANSPORT_CALL_* value, kept by the
     * executor); NULL: always TRANSPORT_CALL_NONE. */
    const atomic_int *call_state;
} transport_setup_t;

/* What connect_addr learns of a peer: its handle, its large address, and whether core's node
 * layout puts it on this rank's node. */
typedef struct {
    const uint8_t *handle; /* TRANSPORT_HANDLE_BYTES */
    const void *addr;
    size_t addr_len;
    bool same_node;
} transport_peer_t;

/* The state a heartbeat carries: whether the sender is inside a call of this communicator, and
 * whether that call waits on a rank that is outside every call (computing, loading, writing a
 * checkpoint). A peer is blamed for a wait that never ends only when it is in a call that waits
 * on nobody idle: then the ranks wait on each other (see exec_check_timeout). */
enum {
    TRANSPORT_CALL_NONE = 0, /* outside calls (heartbeats of the progress thread), or unknown */
    TRANSPORT_CALL_IN = 1,
    TRANSPORT_CALL_WAITS_IDLE = 2,
};

typedef struct {
    const char *name;
    uint32_t caps, reach, mem_types;
    double bw_GBps, latency_us; /* hints for the cost model */
    /* The piece a point-to-point message (loomSend/loomRecv) travels in over this transport,
     * where it is larger than the communicator's slice (0: the slice). Both ends of a link use
     * the same transport, so they cut messages alike. */
    size_t p2p_piece;

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
    /* progress as the progress thread calls it between calls (heartbeats while the rank
     * computes, connection setup), for a transport that may refuse that thread or must not be
     * called at some moment (MPI's thread level, its finalisation); NULL: progress. */
    loomResult_t (*keepalive)(transport_ctx_t *ctx, bool *progressed);
    /* For transports without an accept, where each side makes its connection at its own first
     * use (mpi, ucx): the peers that reached this rank over a link it has not made yet. The
     * progress thread connects them between calls (exec's keepalive), so that a rank computing
     * before its first call with a peer answers that peer's heartbeats, as tcp's accept does.
     * Writes at most max ranks and returns how many; NULL: none. */
    int (*callers)(transport_ctx_t *ctx, int *peers, int max);
    /* Descriptors to wait on when nothing progresses; returns how many were written. */
    int (*pollfds)(transport_ctx_t *ctx, struct pollfd *fds, int max);
    /* Makes every pending and later call fail fast, telling peers `reason` where possible. */
    void (*abort)(transport_ctx_t *ctx, const char *reason);
    /* The call whose requests are still queued on ctx is leaving unfinished (it failed): once
     * this returns, nothing of the transport may read or write their buffers, which are the
     * caller's again (freed, perhaps). The requests stay the transport's, freed by it. NULL for
     * transports that never touch a buffer outside isend, irecv, test and progress calls made
     * inside the call. */
    void (*orphan)(transport_ctx_t *ctx);
    /* Nanoseconds since the last byte arrived from or left for this peer, and whether
     * anything is pending towards it. */
    uint64_t (*idle_ns)(transport_conn_t *conn, bool *pending);
    /* "rank 3 (10.0.0.2:41234)" */
    const char *(*peer_name)(transport_conn_t *conn);
    /* The text of the connection's last error. */
    const char *(*conn_error)(transport_conn_t *conn);
    /* Transports whose peers need more than a handle to reach them (UCX's worker address is
     * hundreds of bytes) publish that address here after init, valid until fini; core carries it
     * to every peer through the bootstrap (comm.h: comm_peer_addr) and then calls connect_addr
     * with the peer's instead of connect. Both NULL for the others. */
    loomResult_t (*address)(transport_ctx_t *ctx, const void **addr, size_t *len);
    loomResult_t (*connect_addr)(transport_ctx_t *ctx, int peer, const transport_peer_t *info,
                                 transport_conn_t **conn);
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

/* A context's abort: once set, every connection of it fails with the reason. */
#define TRANSPORT_ABORT_TEXT_MAX 1024
typedef struct {
    bool aborted;
    char reason[TRANSPORT_ABORT_TEXT_MAX];
} transport_abort_t;

/* What every connection keeps the same way, whatever moves its bytes. Each transport's struct
 * transport_conn starts with it (checked by TRANSPORT_CONN_HEAD_FIRST), so that the shared
 * functions below read it through the opaque connection. */
typedef struct {
    transport_fail_t fail;
    char name[96];             /* "rank 3 (10.0.0.2:41234)": how every message names the peer */
    uint64_t last_activity_ns; /* the last sign of life the transport counts (base_coarse_ns) */
    int pending;               /* requests posted and not yet complete */
    int peer_call;             /* TRANSPORT_CALL_* of the peer's last heartbeat */
    bool peer_call_known;      /* a heartbeat said it (tcp, shm); else the rules assume a call */
} transport_conn_head_t;
#define TRANSPORT_CONN_HEAD_FIRST(type, member)                                                    \
    _Static_assert(offsetof(type, member) == 0, "the connection must start with its head")

/* Its failure; else, once the context aborted, "communicator aborted: <reason>" recorded as its
 * failure (so that it outlives the context's state); loomSuccess while usable. */
loomResult_t transport_conn_check(transport_conn_head_t *h, const transport_abort_t *a);
/* Names the peer "rank <peer> (<where>)" (where: its address, pid, ...). */
void transport_conn_name(transport_conn_head_t *h, int peer, const char *where);
/* The end of a request that test found complete: copies its metadata out (got: what arrived
 * or was sent) and says done; the caller frees it. A receive whose length disagreed returns
 * the connection's failure. */
loomResult_t transport_req_finish(const transport_conn_head_t *h, bool bad_len,
                                  const uint8_t got[TRANSPORT_META_BYTES], int *done,
                                  uint8_t meta[TRANSPORT_META_BYTES]);
/* A recv(2) that returned n <= 0 (0: the peer closed; else errno err) or a send that failed with
 * err: the peer is gone or going. Recorded with texts the tests and users know. */
void transport_conn_recv_failed(transport_conn_head_t *h, ssize_t n, int err);
void transport_conn_send_failed(transport_conn_head_t *h, int err);
/* Moves the connection's handshake on: 1 once it is done, 0 while it runs, -1 when it failed
 * (recorded as the connection's failure, with the handshake's cause). */
int transport_conn_handshake(transport_conn_head_t *h, hs_t *hs, bool *progressed);

/* The ops that read only the head: idle_ns (connecting: the transport still sets it up, which
 * counts as pending), peer_name and conn_error. */
uint64_t transport_conn_idle_ns(const transport_conn_head_t *h, bool connecting, bool *pending);
const char *transport_peer_name(transport_conn_t *conn);
const char *transport_conn_error(transport_conn_t *conn);
/* The peer's TRANSPORT_CALL_* state, as its last heartbeat said. */
int transport_peer_call(transport_conn_t *conn);
bool transport_peer_call_known(transport_conn_t *conn);
/* This rank's state for its heartbeats; a received one (any value) recorded in the head. */
int transport_my_call(const transport_setup_t *setup);
void transport_peer_call_set(transport_conn_head_t *h, uint32_t v);

/* Why an authenticated hello is refused by this rank (another communicator, another rank, a
 * rank that does not exist), or NULL when it is welcome; then *reverse says whether it comes
 * from the higher rank of the pair, which dials only when the lower one is late to (tcp.c's
 * reverse_dial). */
const char *transport_hello_refusal(const transport_setup_t *setup, const hs_hello_t *hello,
                                    bool *reverse);

/* Heartbeats let a peer that waits on us tell "alive" (computing, or waiting for someone else)
 * from "stalled or dead": a quarter of LOOM_TIMEOUT, between 50 ms and 1 s. They go whether or
 * not this rank is inside a call: between calls the progress thread sends them
 * (exec_keepalive). */
uint64_t transport_ping_ns(void);

/* Whether to look at the listener now: always while `wanted` (a connection waits for its peer or
 * a handshake runs), else every TRANSPORT_ACCEPT_EVERY_NS only (strangers are dealt with then,
 * and the hot loop saves a system call: accept(2) was a tenth of shm's time). */
#define TRANSPORT_ACCEPT_EVERY_NS 5000000ull
bool transport_accept_due(uint64_t *next_accept_ns, bool wanted);

/* Before telling peers why we abort, connections still being set up (and, for tcp, frames half
 * sent) get a moment to finish: otherwise a peer that was just connecting sees only a refused
 * connection or a truncated stream instead of the reason. step moves what it can, sets
 * *progressed when something moved, and returns whether anything is still unfinished; it runs
 * until nothing is or TRANSPORT_ABORT_GRACE_NS passed. */
#define TRANSPORT_ABORT_GRACE_NS 250000000ull
void transport_abort_grace(bool (*step)(void *arg, bool *progressed), void *arg);
/* Marks the context aborted with its reason (kept for the connections' errors). */
void transport_abort_set(transport_abort_t *a, const char *reason);

extern const transport_ops_t transport_tcp;
/* Tests only: the handshake of the nth reverse socket tcp dials from now on (counting from 1)
 * fails, as when a flooded listener drops it; 0: none. */
extern _Atomic int tcp_test_drop_reverse_nth;
extern const transport_ops_t transport_shm;
#ifdef LOOM_HAVE_MPI
extern const transport_ops_t transport_mpi; /* mpi/mpi.c */
#endif
#ifdef LOOM_HAVE_UCX
extern const transport_ops_t transport_ucx;
/* Whether UCX sees an RDMA transport (InfiniBand/RoCE: rc, dc, ud) on this machine, which tcp
 * and shm cannot use; found once per process from UCX's own resource list. *what names them. */
bool ucx_has_rdma(const char **what);
#endif

/* Whether a ready shm connection copies with cross-memory attach (else bounce segments). */
bool shm_conn_uses_cma(const transport_conn_t *conn);
/* Control messages (descriptors, acknowledgements) an shm connection holds unsent. */
int shm_conn_unsent(const transport_conn_t *conn);

/* Every transport with an ops table built into this library (for tools that list them); *n gets
 * their number. The table is static: the caller never frees it. */
const transport_ops_t *const *transport_all(size_t *n);
/* Finds a transport of transport_all() by name ("tcp"); NULL when unknown or not built. */
const transport_ops_t *transport_by_name(const char *name);

#endif
