/*
 * Sockets shared by the bootstrap and the TCP transport: choosing the interface, listening and
 * connecting without blocking, and the authenticated handshake every loom connection starts with.
 *
 * Handshake (acceptor A, connector C, job secret K):
 *   A -> C  CHALLENGE  magic, version 2, 16-byte random nonce N
 *   C -> A  HELLO      magic, version, comm id, from rank, to rank, socket index, sockets,
 *                      MAC = BLAKE2b-256(key K, "loom-hs-v2 hello ..." || N || HELLO fields)
 *   A -> C  WELCOME    magic, status, MAC = BLAKE2b-256(key K, "loom-hs-v2 welcome ..." || N ||
 *                      HELLO)
 * (libsodium's keyed crypto_generichash; the MACs are compared with sodium_memcmp.)
 * A peer that cannot prove K, or sends anything malformed, is logged with its address and closed;
 * the secret itself never crosses the wire. A connection that does not finish within
 * LOOM_HANDSHAKE_TIMEOUT is dropped. The timeout measures a peer that stopped talking in the
 * middle of the handshake: a patient connector (the transports': their peer may not have reached
 * its first call yet) waits without limit until the listener says its first word, and leaves that
 * wait to the caller's liveness rule (LOOM_TIMEOUT).
 *
 * Strangers are bounded: a listener keeps at most HS_PENDING_MAX connections that have not proved
 * themselves (the oldest is dropped first once it had HS_PENDING_GRACE_NS to finish), and its
 * refusals are logged at most once per HS_REFUSE_LOG_NS with a count ("refused 1,234 connections
 * from 127.0.0.1 in the last 10 s").
 */
#ifndef LOOM_BASE_SOCK_H
#define LOOM_BASE_SOCK_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "base.h"
#include "loom.h"

#define SOCK_ADDR_STRLEN 64

typedef struct {
    struct sockaddr_storage sa;
    socklen_t len;
} sock_addr_t;

/* "10.0.0.1:5000" or "[fe80::1%eth0]:5000". */
const char *sock_addr_str(const sock_addr_t *a, char *buf, size_t len);
int sock_addr_port(const sock_addr_t *a);
/* Packs an address into 32 bytes (family, port, address, scope) and back. */
void sock_addr_pack(const sock_addr_t *a, uint8_t out[32]);
bool sock_addr_unpack(const uint8_t in[32], sock_addr_t *a);

/* Chooses the address to bind, from LOOM_SOCKET_IFNAME and LOOM_SOCKET_FAMILY (see loom-info).
 * A specification matching nothing is loomInvalidUsage with a text listing the interfaces. */
loomResult_t sock_pick_address(sock_addr_t *out, char *ifname, size_t ifname_len);
/* Same, from an explicit specification (NULL: the default rule). */
loomResult_t sock_pick_address_spec(const char *spec, int family, sock_addr_t *out, char *ifname,
                                    size_t ifname_len);

/* A non-blocking listening socket on addr (its port; 0: any); writes the bound address. */
loomResult_t sock_listen(const sock_addr_t *addr, int backlog, int *fd, sock_addr_t *bound);
/* Starts a non-blocking connect; completion shows as POLLOUT (check with sock_connect_done). */
loomResult_t sock_connect_start(const sock_addr_t *addr, int *fd);
/* 1 when connected, 0 when still connecting, -1 on failure (errno set). */
int sock_connect_done(int fd);
/* Reads and drops what is waiting, then closes. Closing a socket with unread data makes the
 * kernel reset the connection, and a reset destroys what the peer had not read yet (such as the
 * reason we aborted), so every data socket is closed this way. Bounded in time. */
void sock_drain_close(int fd);
/* TCP_NODELAY and buffer sizes for data sockets. */
void sock_tune(int fd, uint64_t bufsize);

/* ---- handshake ---- */

typedef enum {
    HS_CONNECTING = 0,
    HS_SEND_CHALLENGE,
    HS_RECV_CHALLENGE,
    HS_SEND_HELLO,
    HS_RECV_HELLO,
    HS_SEND_WELCOME,
    HS_RECV_WELCOME,
    HS_DONE,
    HS_FAILED
} hs_state_t;

typedef struct {
    uint64_t comm_id;
    int32_t from_rank, to_rank;
    uint32_t chan, nchan;
} hs_hello_t;

typedef struct {
    int fd;
    hs_state_t state;
    bool acceptor;
    uint8_t secret[BASE_KEY_BYTES];
    uint8_t nonce[16];
    hs_hello_t hello; /* connector: what it sends; acceptor: what it received */
    uint8_t buf[128];
    size_t len, done;
    uint64_t deadline_ns;
    uint64_t start_ns; /* acceptor: when accepted (the oldest stranger is dropped first) */
    bool patient;      /* connector: no deadline until the listener's first byte */
    sock_addr_t peer;
    char err[256];
} hs_t;

/* Connector side: fd from sock_connect_start. */
void hs_connect_init(hs_t *h, int fd, const sock_addr_t *peer, const uint8_t secret[16],
                     const hs_hello_t *hello);
/* Acceptor side: fd from accept(). */
loomResult_t hs_accept_init(hs_t *h, int fd, const sock_addr_t *peer, const uint8_t secret[16]);
/* Advances without blocking. Returns loomSuccess while in progress or done (h->state), or
 * loomRemoteError/loomSystemError with h->err set. */
loomResult_t hs_progress(hs_t *h, bool *progressed);
/* POLLIN/POLLOUT wanted now. */
short hs_events(const hs_t *h);
/* Blocks (with poll) until done or failed; for the bootstrap's client side. */
loomResult_t hs_run_blocking(hs_t *h);

/* Incoming connections still proving who they are: the acceptor's side, for every listener. */
#define HS_PENDING_MAX 128
#define HS_PENDING_GRACE_NS 200000000ull /* a legitimate peer finishes in far less */
#define HS_REFUSE_LOG_NS 10000000000ull
typedef struct {
    hs_t *hs;
    int n, cap;
    /* refusals since the last line written about them */
    uint64_t refused, dropped;
    uint64_t window_ns; /* when the window of refusals being counted started */
    char refused_from[SOCK_ADDR_STRLEN];
    bool refused_many_hosts;
    char last_cause[160];
    /* Optional (NULL: accept4(2) and close(2)): how the listener's connections are accepted
     * and closed, for a listener that keeps its descriptors' books (the bootstrap root's and the
     * job-state service's, for fork safety). accept_fd returns -1 with errno on failure. */
    int (*accept_fd)(int listen_fd, sock_addr_t *peer);
    void (*close_fd)(int fd);
} hs_pending_t;

/* Advances the pending handshakes that have something to read or write (one poll(2) finds them)
 * and those whose time ran out, then accepts what waits on listen_fd: a finished handshake is
 * handed to done(arg, hs), which owns its descriptor from then on; a failed one is closed and
 * counted, and logged (naming `who`, the listener, and the peer) at most once per
 * HS_REFUSE_LOG_NS. */
void hs_pending_progress(hs_pending_t *p, int listen_fd, const uint8_t secret[16],
                         log_subsys_t subsys, const char *who, void (*done)(void *arg, hs_t *hs),
                         void *arg, bool *progressed);
int hs_pending_pollfds(const hs_pending_t *p, struct pollfd *fds, int max);
/* Writes the line about refusals not yet reported (also done by hs_pending_progress once their
 * window is over). */
void hs_pending_report(hs_pending_t *p, log_subsys_t subsys, const char *who);
/* Closes what is still pending. */
void hs_pending_free(hs_pending_t *p);

/* Messages after the handshake, authenticated: each carries a tag, a keyed BLAKE2b (base_mac) of
 * its bytes and its number in the stream, under a key of its direction derived from the job's
 * secret and the handshake's transcript (its nonce and hello, and a nonce of the connector's). A
 * stranger who injects into the connection, or takes it over, cannot make one; a message replayed,
 * dropped or reordered has the wrong number. Used by the bootstrap and the job-state service (their
 * every message after the handshake); the data transports have their own framing (tcp:
 * LOOM_SECURE's sealed records). */
#define SOCK_AUTH_TAG BASE_MAC_BYTES
typedef struct {
    uint8_t tx[BASE_KEY_BYTES], rx[BASE_KEY_BYTES];
    uint64_t ntx, nrx; /* messages sent, and received whole and authentic */
} sock_auth_t;
/* After a finished handshake, on both sides: the connector sends a random nonce of its own, the
 * acceptor reads it (blocking until deadline_ns), and both derive the keys from the transcript. */
loomResult_t sock_auth_start(sock_auth_t *a, const hs_t *hs, uint64_t deadline_ns);
/* The tag of the next message sent: the bytes of m, then of m2 (either may be empty). */
void sock_auth_tag(sock_auth_t *a, const void *m, size_t len, const void *m2, size_t len2,
                   uint8_t tag[SOCK_AUTH_TAG]);
/* Whether tag is the next received message's; counts it only if so. */
bool sock_auth_check(sock_auth_t *a, const void *m, size_t len, const void *m2, size_t len2,
                     const uint8_t tag[SOCK_AUTH_TAG]);
/* Test-only: when non-zero, the sock_auth_tag call of that number (1: the next) in this process
 * returns a damaged tag, as if the message had been changed on the wire (atomic: the bootstrap
 * root's thread reads it while a test sets it). */
extern _Atomic int sock_auth_tamper_nth;
/* sock_send_all of buf and its tag / sock_recv_all of both, checked: a wrong tag is
 * loomRemoteError naming `what` and "failed authentication". */
loomResult_t sock_send_auth(int fd, sock_auth_t *a, const void *buf, size_t len,
                            uint64_t deadline_ns, const char *what);
loomResult_t sock_recv_auth(int fd, sock_auth_t *a, void *buf, size_t len, uint64_t deadline_ns,
                            const char *what);

/* Blocking send/receive with a deadline (absolute, base_now_ns clock) on a non-blocking socket. */
loomResult_t sock_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns,
                           const char *what);
loomResult_t sock_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *what);

#endif
