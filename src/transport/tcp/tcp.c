/*
 * TCP transport: non-blocking sockets, several per peer, framed and validated messages.
 *
 * Connections: for each pair the lower rank connects and the higher accepts, so both sides can
 * ask for the connection at once and still make exactly one. Each connection has N sockets
 * (LOOM_NSOCKS_PERPEER); the k-th message posted towards a peer travels on socket k mod N, and
 * since both sides post in the same order, the k-th receive reads from the same socket.
 *
 * Frames: a 48-byte header (magic, type, sequence number per socket, length, 32 bytes of the
 * executor's metadata) then the payload. A receive reads straight into the caller's buffer; a
 * socket is read only while a receive is posted on it, so an early sender is held back by TCP's
 * flow control instead of by an unbounded queue here. Headers are checked: magic, type, the
 * socket's sequence number, and the length, which must equal the posted receive's.
 *
 * Mode frame: once a socket's handshake is done, each side first sends a 48-byte MODE frame
 * (flags: LOOM_SECURE and whether it has AES in hardware; meta: a random nonce) and reads the
 * peer's. Ranks that disagree on LOOM_SECURE fail the connection on both sides, naming it.
 *
 * LOOM_SECURE=1 (seal.h): every header travels as a sealed record of 64 bytes, and a payload as
 * sealed records of at most TCP_SEAL_CHUNK bytes (each with its 16-byte tag), all numbered by
 * one counter per socket and direction. The receiver reads a payload record's ciphertext straight
 * into the caller's buffer and opens it there; the sender seals one record ahead of the socket
 * into a staging buffer. A record that does not open (modified, replayed, reordered, forged or
 * cut) fails the connection, naming the peer, the socket, the frame and the record.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base.h"
#include "fifo.h"
#include "frame.h"
#include "param.h"
#include "seal.h"
#include "sock.h"
#include "transport.h"

#define TCP_MAX_SOCKS 16

tcp_tamper_t tcp_tamper;

struct transport_req {
    struct transport_req *next;
    transport_conn_t *conn;
    bool send;
    bool complete;
    bool bad_len; /* the peer's message had another length: meta is valid, data is not */
    bool orphan;  /* its call left unfinished: nobody tests it, freed when sent (tcp_orphan) */
    uint8_t *own; /* an orphan's unsent payload, copied out of the caller's buffer */
    uint8_t *buf;
    size_t len;
    size_t done; /* bytes of header + payload moved (secure: of the sealed header only) */
    tcp_frame_t hdr;
    /* secure mode */
    uint8_t wire[TCP_SEALED_HDR]; /* the sealed header, as sent or as received */
    bool sealed;                  /* send: wire holds the header, sealed as record ctr0 */
    uint64_t ctr0;
    size_t off;                  /* payload bytes sent, or received and opened */
    size_t rec;                  /* receive: bytes of the current payload record read */
    uint8_t tag[SEAL_TAG_BYTES]; /* receive: the current payload record's tag */
};

typedef enum { SK_NONE = 0, SK_HANDSHAKE, SK_MODE, SK_READY, SK_CLOSED } tcp_sock_state_t;

/* A socket's secure state (LOOM_SECURE=1). */
typedef struct {
    seal_dir_t tx, rx;
    uint8_t *stage; /* the payload record being sent: ciphertext then tag */
    size_t stage_len, stage_done, stage_plain;
    uint8_t last_hdr[TCP_SEALED_HDR]; /* for TCP_TAMPER_REPLAY */
} tcp_sec_t;

typedef struct {
    int fd;
    tcp_sock_state_t state;
    hs_t hs;
    FIFO(transport_req_t) sq; /* sends in posting order */
    FIFO(transport_req_t) rq; /* receives in posting order */
    uint32_t send_seq, recv_seq;
    uint64_t last_send_ns; /* for heartbeats */
    bool eof;              /* the peer closed it while nothing was expected on it */
    /* the mode frames, ours and the peer's */
    tcp_frame_t mode_out, mode_in;
    size_t mode_out_done, mode_in_done;
    tcp_sec_t *sec;   /* NULL unless LOOM_SECURE=1 */
    bool send_broken; /* a send failed: nothing more goes out on it */
    bool reverse;     /* our dial of a pair whose lower rank has not dialled (until ready) */
    bool test_drop;   /* tests: its handshake fails (tcp_test_drop_reverse_nth) */
} tcp_sock_t;

struct transport_conn {
    transport_conn_head_t head; /* first: the shared ops read it */
    transport_ctx_t *ctx;
    int peer;
    sock_addr_t addr;
    int nsocks;
    int nready;
    tcp_sock_t socks[TCP_MAX_SOCKS];
    uint64_t nsent, nrecv; /* messages posted, to pick sockets */
    uint64_t next_peek_ns; /* when to look for heartbeats on sockets nobody reads */
    bool finishing;        /* the abort's grace: failed, yet finishing half-sent frames */
    /* The higher rank of the pair (which waits to be dialled): when to dial the lower one
     * itself if nothing has arrived by then (0: never again; see reverse_dial). */
    uint64_t reverse_at_ns;
    bool reverse_said; /* the INFO line about it went out */
};
TRANSPORT_CONN_HEAD_FIRST(struct transport_conn, head);

struct transport_ctx {
    transport_setup_t setup;
    int listen_fd;
    sock_addr_t bound;
    int nsocks;
    uint64_t bufsize;
    transport_conn_t **conns; /* by rank, NULL until needed */
    transport_conn_t **active;
    int nactive;
    hs_pending_t pend;       /* accepted sockets still proving who they are */
    char who[48];            /* "tcp rank 3", for the log */
    uint64_t next_accept_ns; /* accept(2) polls are rationed while every connection is up */
    uint64_t ping_ns;        /* heartbeat interval */
    bool secure;             /* LOOM_SECURE */
    transport_abort_t abort;
};

#define conn_fail(c, ...) transport_fail(&(c)->head.fail, __VA_ARGS__)

static loomResult_t tcp_init(const transport_setup_t *setup, transport_ctx_t **out,
                             uint8_t handle[TRANSPORT_HANDLE_BYTES])
{
    transport_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (tcp context)");
    ctx->setup = *setup;
    ctx->listen_fd = -1;
    snprintf(ctx->who, sizeof(ctx->who), "tcp: rank %d", setup->rank);
    ctx->nsocks = (int)LOOM_MAX(1, LOOM_MIN(param_int(PARAM_NSOCKS_PERPEER), TCP_MAX_SOCKS));
    ctx->bufsize = param_size(PARAM_SOCKET_BUFFER);
    ctx->ping_ns = transport_ping_ns();
    ctx->secure = param_str(PARAM_SECURE)[0] == '1'; /* 0 or 1: comm.c refuses others */
    if (ctx->secure) {
        loomResult_t cr = base_crypto_init();
        if (cr != loomSuccess) {
            free(ctx);
            return cr;
        }
    }
    ctx->conns = calloc((size_t)setup->nranks, sizeof(*ctx->conns));
    ctx->active = calloc((size_t)setup->nranks, sizeof(*ctx->active));
    if (ctx->conns == NULL || ctx->active == NULL) {
        free(ctx->conns);
        free(ctx->active);
        free(ctx);
        return base_error(loomSystemError, LOG_NET, "out of memory (tcp connections)");
    }
    sock_addr_t a = {.sa = setup->bind, .len = setup->bind_len};
    loomResult_t r = sock_listen(&a, 1024, &ctx->listen_fd, &ctx->bound);
    if (r != loomSuccess) {
        free(ctx->conns);
        free(ctx->active);
        free(ctx);
        return r;
    }
    memset(handle, 0, TRANSPORT_HANDLE_BYTES);
    sock_addr_pack(&ctx->bound, handle);
    char as[SOCK_ADDR_STRLEN];
    INFO(LOG_NET, "tcp: rank %d listens on %s, %d sockets per peer%s", setup->rank,
         sock_addr_str(&ctx->bound, as, sizeof(as)), ctx->nsocks,
         ctx->secure ? (seal_aes_available() ? ", sealed (AES-256-GCM where the peer has it)"
                                             : ", sealed (ChaCha20-Poly1305)")
                     : "");
    *out = ctx;
    return loomSuccess;
}

static transport_conn_t *conn_get(transport_ctx_t *ctx, int peer, const sock_addr_t *addr)
{
    transport_conn_t *c = ctx->conns[peer];
    if (c) return c;
    c = calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->ctx = ctx;
    c->peer = peer;
    c->nsocks = ctx->nsocks;
    c->head.last_activity_ns = base_coarse_ns();
    for (int i = 0; i < TCP_MAX_SOCKS; i++)
        c->socks[i].fd = -1;
    if (addr) c->addr = *addr;
    char as[SOCK_ADDR_STRLEN];
    transport_conn_name(&c->head, peer,
                        addr ? sock_addr_str(addr, as, sizeof(as)) : "address unknown");
    ctx->conns[peer] = c;
    ctx->active[ctx->nactive++] = c;
    return c;
}

static loomResult_t tcp_connect(transport_ctx_t *ctx, int peer,
                                const uint8_t handle[TRANSPORT_HANDLE_BYTES],
                                transport_conn_t **out)
{
    if (ctx->conns[peer]) {
        *out = ctx->conns[peer];
        return loomSuccess;
    }
    sock_addr_t addr;
    if (!sock_addr_unpack(handle, &addr))
        return base_error(loomInternalError, LOG_NET, "tcp: bad connection handle for rank %d",
                          peer);
    transport_conn_t *c = conn_get(ctx, peer, &addr);
    if (c == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (connection)");
    if (ctx->setup.rank < peer) {
        for (int i = 0; i < c->nsocks; i++) {
            int fd;
            if (sock_connect_start(&addr, &fd) != loomSuccess) {
                conn_fail(c, loomRemoteError, "cannot connect to %s: %s", c->head.name,
                          base_last_error());
                break;
            }
            hs_hello_t hello = {.comm_id = ctx->setup.comm_id,
                                .from_rank = ctx->setup.rank,
                                .to_rank = peer,
                                .chan = (uint32_t)i,
                                .nchan = (uint32_t)c->nsocks};
            c->socks[i].fd = fd;
            c->socks[i].state = SK_HANDSHAKE;
            hs_connect_init(&c->socks[i].hs, fd, &addr, ctx->setup.secret, &hello);
            /* The peer may not be serving its listener yet (its progress thread starts with its
             * communicator, but a kernel's backlog accepts before that): LOOM_TIMEOUT, not the
             * handshake's, bounds the wait for its first word. */
            c->socks[i].hs.patient = true;
        }
        TRACE(LOG_NET, "tcp: connecting to %s with %d sockets", c->head.name, c->nsocks);
    } else {
        c->reverse_at_ns = base_coarse_ns() + ctx->ping_ns;
    }
    *out = c;
    return loomSuccess;
}

/*
 * A late lower rank. The lower rank of a pair dials, at its first call that needs the link;
 * one that is late (loading, checkpointing) leaves the higher rank with no link, so no
 * heartbeats, and LOOM_TIMEOUT would blame a live peer. So the higher rank, after a heartbeat
 * interval with nothing arrived, dials the lower one itself: the late rank's progress thread
 * accepts between calls (keepalive), the link carries heartbeats at once, and it is the link the
 * late rank finds at its first call. Where both dial at once the lower rank's dial wins on
 * both sides: the lower rank refuses the reverse socket when it has its own on that index, the
 * higher one drops its reverse socket (not ready, so nothing of the data went out on it; its
 * queues stay) for the lower rank's. A reverse socket that fails before it is ready is closed
 * without failing the connection and dialled again an interval later, until every socket of the
 * link is ready or the lower rank's own dial arrives (the lower rank dials none once a reverse
 * socket made the connection: a socket not dialled again would leave the link short for good).
 * A dead peer is still named by LOOM_TIMEOUT, as nothing arrives from it.
 */
_Atomic int tcp_test_drop_reverse_nth;
static void sock_reset(tcp_sock_t *s)
{
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    s->state = SK_NONE;
    s->reverse = false;
    s->test_drop = false;
    s->mode_out_done = s->mode_in_done = 0;
}

static void reverse_dial(transport_conn_t *c)
{
    transport_ctx_t *ctx = c->ctx;
    if (!c->reverse_said)
        INFO(LOG_NET,
             "tcp: %s has not connected to rank %d after %.2f s: dialling it instead (it may be "
             "late; its heartbeats will say whether it is alive)",
             c->head.name, ctx->setup.rank, (double)ctx->ping_ns * 1e-9);
    c->reverse_said = true;
    for (int i = 0; i < c->nsocks; i++) {
        if (c->socks[i].state != SK_NONE) continue; /* under way or ready */
        int fd;
        if (sock_connect_start(&c->addr, &fd) != loomSuccess) {
            TRACE(LOG_NET, "tcp: dialling %s: %s (again later)", c->head.name, base_last_error());
            return;
        }
        hs_hello_t hello = {.comm_id = ctx->setup.comm_id,
                            .from_rank = ctx->setup.rank,
                            .to_rank = c->peer,
                            .chan = (uint32_t)i,
                            .nchan = (uint32_t)c->nsocks};
        tcp_sock_t *s = &c->socks[i];
        s->fd = fd;
        s->state = SK_HANDSHAKE;
        s->reverse = true;
        hs_connect_init(&s->hs, fd, &c->addr, ctx->setup.secret, &hello);
        s->hs.patient = true;
        s->test_drop = atomic_load(&tcp_test_drop_reverse_nth) > 0 &&
                       atomic_fetch_sub(&tcp_test_drop_reverse_nth, 1) == 1;
    }
}

/* A reverse socket's handshake: 1 done, 0 not yet (or failed: reset, dialled again later). */
static int reverse_handshake(transport_conn_t *c, tcp_sock_t *s, bool *progressed)
{
    if (s->test_drop) { /* as a flooded listener drops it: see tcp_test_drop_reverse_nth */
        TRACE(LOG_NET, "tcp: test hook: the handshake of reverse socket %d to %s fails",
              (int)(s - c->socks), c->head.name);
        sock_reset(s);
        return 0;
    }
    if (hs_progress(&s->hs, progressed) != loomSuccess) {
        TRACE(LOG_NET, "tcp: dialling %s (socket %d): %s (again later)", c->head.name,
              (int)(s - c->socks), s->hs.err);
        sock_reset(s);
        return 0;
    }
    return s->hs.state == HS_DONE;
}

static loomResult_t conn_check(transport_conn_t *c)
{
    return transport_conn_check(&c->head, &c->ctx->abort);
}

static loomResult_t tcp_isend(transport_conn_t *c, const void *buf, size_t len,
                              const uint8_t meta[TRANSPORT_META_BYTES], transport_req_t **out)
{
    LOOM_CHECK(conn_check(c));
    if (len > UINT32_MAX)
        return base_error(loomInternalError, LOG_NET, "tcp: message of %zu bytes to %s", len,
                          c->head.name);
    transport_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (send request)");
    r->conn = c;
    r->send = true;
    r->buf = (uint8_t *)buf;
    r->len = len;
    tcp_sock_t *s = &c->socks[c->nsent++ % (uint64_t)c->nsocks];
    r->hdr.magic = TCP_MAGIC;
    r->hdr.type = TCP_FRAME_DATA;
    r->hdr.seq = s->send_seq++;
    r->hdr.len = (uint32_t)len;
    memcpy(r->hdr.meta, meta, TRANSPORT_META_BYTES);
    FIFO_PUSH(&s->sq, r);
    c->head.pending++;
    *out = r;
    return loomSuccess;
}

static loomResult_t tcp_irecv(transport_conn_t *c, void *buf, size_t len, transport_req_t **out)
{
    LOOM_CHECK(conn_check(c));
    transport_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (recv request)");
    r->conn = c;
    r->buf = buf;
    r->len = len;
    tcp_sock_t *s = &c->socks[c->nrecv++ % (uint64_t)c->nsocks];
    FIFO_PUSH(&s->rq, r);
    c->head.pending++;
    *out = r;
    return loomSuccess;
}

static loomResult_t tcp_test(transport_req_t *r, int *done, uint8_t meta[TRANSPORT_META_BYTES])
{
    if (!r->complete) {
        *done = 0;
        return conn_check(r->conn);
    }
    loomResult_t res = transport_req_finish(&r->conn->head, r->bad_len, r->hdr.meta, done, meta);
    free(r);
    return res;
}

/* ---- frame checks (frame.h) ---- */

tcp_frame_verdict_t tcp_frame_check(const tcp_frame_t *h, uint32_t expect_seq, uint64_t expect_len,
                                    uint64_t max_len)
{
    if (h->magic != TCP_MAGIC) return TCP_FRAME_BAD_MAGIC;
    if (h->type == TCP_FRAME_ABORT)
        return h->len > TCP_ABORT_TEXT_MAX ? TCP_FRAME_TOO_LONG : TCP_FRAME_IS_ABORT;
    if (h->type != TCP_FRAME_DATA) return TCP_FRAME_BAD_TYPE;
    if (h->seq != expect_seq) return TCP_FRAME_BAD_SEQ;
    if (h->len > max_len) return TCP_FRAME_TOO_LONG;
    if (h->len != expect_len) return TCP_FRAME_BAD_LEN;
    return TCP_FRAME_OK;
}

bool tcp_open_header(seal_dir_t *rx, uint64_t ctr, const uint8_t wire[TCP_SEALED_HDR],
                     tcp_frame_t *out)
{
    uint8_t buf[sizeof(tcp_frame_t)];
    memcpy(buf, wire, sizeof(buf));
    if (!seal_open(rx, ctr, SEAL_KIND_HEADER, buf, sizeof(buf), wire + sizeof(tcp_frame_t)))
        return false;
    memcpy(out, buf, sizeof(*out));
    return true;
}

void tcp_seal_header(seal_dir_t *tx, const tcp_frame_t *h, uint8_t wire[TCP_SEALED_HDR])
{
    seal_close(tx, SEAL_KIND_HEADER, h, sizeof(*h), wire, wire + sizeof(tcp_frame_t));
}

/* A record from the peer that does not open. */
static void fail_auth(transport_conn_t *c, tcp_sock_t *s, const char *what, uint32_t frame,
                      uint64_t ctr)
{
    conn_fail(c, loomRemoteError,
              "%s from %s failed authentication (LOOM_SECURE=1, %s, socket %d, frame %u, record "
              "%llu): the stream was modified, replayed, reordered or forged on the way",
              what, c->head.name, seal_alg_name(s->sec->rx.alg), (int)(s - c->socks), frame,
              (unsigned long long)ctr);
}

/* Test-only damage of a record about to be sent (frame.h). */
static void tamper(tcp_sec_t *x, uint8_t *rec, size_t len, bool header)
{
    if (tcp_tamper.what == TCP_TAMPER_NONE) return;
    if (++tcp_tamper.seen < tcp_tamper.nth) return;
    if (tcp_tamper.what == TCP_TAMPER_FLIP) {
        rec[len / 2] ^= 0x10;
        tcp_tamper.what = TCP_TAMPER_NONE;
    } else if (tcp_tamper.what == TCP_TAMPER_REPLAY && header) {
        memcpy(rec, x->last_hdr, TCP_SEALED_HDR);
        tcp_tamper.what = TCP_TAMPER_NONE;
    }
}

/* Reads up to `want` bytes for an abort text, giving the rest a moment to arrive. */
static size_t read_abort_bytes(tcp_sock_t *s, uint8_t *buf, size_t want)
{
    size_t got = 0;
    uint64_t deadline = base_now_ns() + 200000000ull;
    while (got < want && base_now_ns() < deadline) {
        ssize_t n = recv(s->fd, buf + got, want - got, 0);
        if (n > 0)
            got += (size_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            break;
    }
    return got;
}

/* Reads a peer's ABORT frame text (its header consumed) and fails the connection. */
static void read_abort(transport_conn_t *c, tcp_sock_t *s, const tcp_frame_t *h)
{
    uint8_t text[TCP_ABORT_TEXT_MAX + SEAL_TAG_BYTES + 1];
    size_t want = LOOM_MIN((size_t)h->len, (size_t)TCP_ABORT_TEXT_MAX);
    if (s->sec) {
        /* Sealed: the whole text and its tag, or no text at all. */
        size_t got = read_abort_bytes(s, text, want + SEAL_TAG_BYTES);
        uint64_t ctr = s->sec->rx.ctr;
        if (h->len > TCP_ABORT_TEXT_MAX || got != want + SEAL_TAG_BYTES ||
            !seal_open(&s->sec->rx, ctr, SEAL_KIND_ABORT, text, want, text + want)) {
            conn_fail(c, loomRemoteError,
                      "%s aborted (its reason did not arrive whole or failed authentication, "
                      "record %llu)",
                      c->head.name, (unsigned long long)ctr);
            return;
        }
        s->sec->rx.ctr++;
        text[want] = '\0';
        conn_fail(c, loomRemoteError, "%s aborted: %s", c->head.name, (char *)text);
        return;
    }
    size_t got = read_abort_bytes(s, text, want);
    text[got] = '\0';
    conn_fail(c, loomRemoteError, "%s aborted: %s", c->head.name, (char *)text);
}

static void peek_heartbeats(transport_conn_t *c, tcp_sock_t *s);

/* A receive met the end of the stream or an error: a peer that aborted sent its reason on every
 * socket before closing them, so look for it at the heads of the others first. */
static void look_for_reason(transport_conn_t *c)
{
    for (int k = 0; k < c->nsocks && !c->head.fail.failed; k++) {
        tcp_sock_t *o = &c->socks[k];
        if (o->state == SK_READY && (o->rq.head == NULL || o->rq.head->done == 0))
            peek_heartbeats(c, o);
    }
}

static void recv_failed(transport_conn_t *c, tcp_sock_t *s, ssize_t n, int err)
{
    (void)s;
    look_for_reason(c);
    transport_conn_recv_failed(&c->head, n, err);
}

/* Finishes the head receive of a socket. */
static void recv_done(transport_conn_t *c, tcp_sock_t *s, transport_req_t *r)
{
    FIFO_DROP_HEAD(&s->rq);
    r->complete = true;
    c->head.pending--;
}

/* Checks a complete header; returns false when the connection failed. */
static bool header_ok(transport_conn_t *c, tcp_sock_t *s, transport_req_t *r)
{
    const tcp_frame_t *h = &r->hdr;
    switch (tcp_frame_check(h, s->recv_seq, r->len, param_size(PARAM_MAX_MESSAGE))) {
    case TCP_FRAME_OK: s->recv_seq++; return true;
    case TCP_FRAME_BAD_MAGIC:
        conn_fail(c, loomRemoteError,
                  "malformed frame from %s: bad magic 0x%08x (socket %d, frame %u)", c->head.name,
                  h->magic, (int)(s - c->socks), s->recv_seq);
        return false;
    case TCP_FRAME_IS_ABORT: read_abort(c, s, h); return false;
    case TCP_FRAME_BAD_TYPE:
        conn_fail(c, loomRemoteError, "malformed frame from %s: unknown type %u (frame %u)",
                  c->head.name, h->type, s->recv_seq);
        return false;
    case TCP_FRAME_BAD_SEQ:
        conn_fail(c, loomRemoteError, "malformed frame from %s: sequence %u where %u was expected",
                  c->head.name, h->seq, s->recv_seq);
        return false;
    case TCP_FRAME_TOO_LONG:
        conn_fail(c, loomRemoteError, "malformed frame from %s: %u bytes, more than %s (frame %u)",
                  c->head.name, h->len,
                  h->type == TCP_FRAME_ABORT ? "an abort text may have" : "LOOM_MAX_MESSAGE",
                  h->seq);
        return false;
    case TCP_FRAME_BAD_LEN:
        /* Hand the request back with its metadata, so that the executor can say which
         * operations disagree; the stream cannot be trusted after this. */
        conn_fail(c, loomRemoteError,
                  "%s sent a message of %u bytes where %zu were expected (frame %u): the ranks "
                  "disagree on the operation",
                  c->head.name, h->len, r->len, h->seq);
        r->bad_len = true;
        recv_done(c, s, r);
        return false;
    }
    return false;
}

/* Reads a frame header into r->hdr. Heartbeats are consumed here. Returns 1 when a data header
 * is complete, 0 when no more bytes are there now, -1 on failure. */
static int read_header(transport_conn_t *c, tcp_sock_t *s, transport_req_t *r, bool *progressed)
{
    const size_t H = s->sec ? TCP_SEALED_HDR : sizeof(tcp_frame_t);
    uint8_t *dst = s->sec ? r->wire : (uint8_t *)&r->hdr;
    while (r->done < H) {
        ssize_t n = recv(s->fd, dst + r->done, H - r->done, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n <= 0) {
            recv_failed(c, s, n, errno);
            return -1;
        }
        *progressed = true;
        c->head.last_activity_ns = base_coarse_ns();
        r->done += (size_t)n;
        if (r->done < H) continue;
        if (s->sec) {
            uint64_t ctr = s->sec->rx.ctr;
            if (!tcp_open_header(&s->sec->rx, ctr, r->wire, &r->hdr)) {
                fail_auth(c, s, "frame header", s->recv_seq, ctr);
                return -1;
            }
            s->sec->rx.ctr++;
        }
        if (r->hdr.magic == TCP_MAGIC && r->hdr.type == TCP_FRAME_PING) {
            transport_peer_call_set(&c->head, r->hdr.flags);
            r->done = 0; /* a heartbeat: nothing to deliver */
        }
    }
    return header_ok(c, s, r) ? 1 : -1;
}

/* Secure mode: reads and opens the payload records of r, in place. Returns false when it must
 * stop (no more bytes now, or the connection failed). */
static bool recv_payload_sealed(transport_conn_t *c, tcp_sock_t *s, transport_req_t *r,
                                bool *progressed)
{
    while (r->off < r->len) {
        size_t n = LOOM_MIN((size_t)TCP_SEAL_CHUNK, r->len - r->off);
        struct iovec iov[2];
        int n_iov = 0;
        if (r->rec < n) {
            iov[n_iov].iov_base = r->buf + r->off + r->rec;
            iov[n_iov++].iov_len = n - r->rec;
            iov[n_iov].iov_base = r->tag;
            iov[n_iov++].iov_len = SEAL_TAG_BYTES;
        } else {
            iov[n_iov].iov_base = r->tag + (r->rec - n);
            iov[n_iov++].iov_len = SEAL_TAG_BYTES - (r->rec - n);
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t got = recvmsg(s->fd, &mh, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
        if (got <= 0) {
            recv_failed(c, s, got, errno);
            return false;
        }
        *progressed = true;
        c->head.last_activity_ns = base_coarse_ns();
        r->rec += (size_t)got;
        if (r->rec < n + SEAL_TAG_BYTES) continue;
        uint64_t ctr = s->sec->rx.ctr;
        if (!seal_open(&s->sec->rx, ctr, SEAL_KIND_DATA, r->buf + r->off, n, r->tag)) {
            fail_auth(c, s, "frame payload", r->hdr.seq, ctr);
            return false;
        }
        s->sec->rx.ctr++;
        r->off += n;
        r->rec = 0;
    }
    return true;
}

static void sock_progress_recv(transport_conn_t *c, tcp_sock_t *s, bool *progressed)
{
    const size_t H = s->sec ? TCP_SEALED_HDR : sizeof(tcp_frame_t);
    while (s->rq.head && !c->head.fail.failed) {
        transport_req_t *r = s->rq.head;
        if (r->done < H) {
            int h = read_header(c, s, r, progressed);
            if (h <= 0) return;
        }
        if (s->sec) {
            if (!recv_payload_sealed(c, s, r, progressed)) return;
            recv_done(c, s, r);
            continue;
        }
        while (r->done < H + r->len) {
            ssize_t n = recv(s->fd, r->buf + (r->done - H), r->len - (r->done - H), 0);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n <= 0) {
                recv_failed(c, s, n, errno);
                return;
            }
            *progressed = true;
            c->head.last_activity_ns = base_coarse_ns();
            r->done += (size_t)n;
        }
        recv_done(c, s, r);
    }
}

/* On a socket nobody reads now, consume heartbeats at its head (they prove the peer alive). */
static void peek_heartbeats(transport_conn_t *c, tcp_sock_t *s)
{
    const size_t H = s->sec ? TCP_SEALED_HDR : sizeof(tcp_frame_t);
    uint8_t wire[TCP_SEALED_HDR];
    tcp_frame_t h;
    for (;;) {
        ssize_t n = recv(s->fd, wire, H, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) {
            /* The peer finished and left while its last messages may still wait on the other
             * sockets: an end of stream is an error only where a receive expects data (then
             * sock_progress_recv says so), or when a send fails. */
            s->eof = true;
            return;
        }
        if (n != (ssize_t)H) return;
        if (s->sec) {
            /* Opening a record twice is harmless; it is consumed only if it is a heartbeat or
             * an abort. */
            if (!tcp_open_header(&s->sec->rx, s->sec->rx.ctr, wire, &h)) {
                fail_auth(c, s, "frame header", s->recv_seq, s->sec->rx.ctr);
                return;
            }
        } else {
            memcpy(&h, wire, sizeof(h));
        }
        if (h.magic != TCP_MAGIC) return; /* the next receive will report it */
        if (h.type == TCP_FRAME_ABORT) {
            recv(s->fd, wire, H, MSG_DONTWAIT);
            if (s->sec) s->sec->rx.ctr++;
            read_abort(c, s, &h);
            return;
        }
        if (h.type != TCP_FRAME_PING) {
            c->head.last_activity_ns =
                base_coarse_ns(); /* data is waiting: the peer got this far */
            return;
        }
        if (recv(s->fd, wire, H, MSG_DONTWAIT) != (ssize_t)H) return;
        if (s->sec) s->sec->rx.ctr++;
        c->head.last_activity_ns = base_coarse_ns();
        transport_peer_call_set(&c->head, h.flags);
    }
}

/* Sends a heartbeat on an idle socket (only between frames, never inside one). */
static void maybe_ping(transport_conn_t *c, tcp_sock_t *s, uint64_t now)
{
    if (s->sq.head || now - s->last_send_ns < c->ctx->ping_ns) return;
    tcp_frame_t h = {.magic = TCP_MAGIC,
                     .type = TCP_FRAME_PING,
                     .flags = (uint16_t)transport_my_call(&c->ctx->setup)};
    uint8_t wire[TCP_SEALED_HDR];
    size_t H = sizeof(h);
    uint64_t ctr0 = s->sec ? s->sec->tx.ctr : 0;
    if (s->sec) {
        tcp_seal_header(&s->sec->tx, &h, wire);
        H = TCP_SEALED_HDR;
    } else {
        memcpy(wire, &h, sizeof(h));
    }
    ssize_t n = send(s->fd, wire, H, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)H) {
        s->last_send_ns = now;
    } else if (n > 0 || s->sec) {
        /* A partial header would desynchronise the stream, and a sealed one has used its
         * record number: finish it as a frame. */
        transport_req_t *r = calloc(1, sizeof(*r));
        if (r == NULL) {
            conn_fail(c, loomSystemError, "out of memory (heartbeat)");
            return;
        }
        r->conn = c;
        r->send = true;
        r->hdr = h;
        memcpy(r->wire, wire, H);
        r->sealed = true;
        r->ctr0 = ctr0;
        r->done = n > 0 ? (size_t)n : 0;
        r->complete = true; /* nobody tests it: freed when sent */
        FIFO_PUSH(&s->sq, r);
    }
}

/* A send failed: the peer may have said why it left before closing; look for that first. */
static void send_failed(transport_conn_t *c, tcp_sock_t *s, int e)
{
    s->send_broken = true;
    look_for_reason(c);
    transport_conn_send_failed(&c->head, e);
}

/* The head send is done. Returns whether to go on with the next. */
static void send_done(transport_conn_t *c, tcp_sock_t *s, transport_req_t *r)
{
    FIFO_DROP_HEAD(&s->sq);
    if (r->complete || r->orphan) { /* the rest of a heartbeat, or of a call that left */
        if (r->orphan) c->head.pending--;
        free(r->own);
        free(r);
        return;
    }
    r->complete = true;
    c->head.pending--;
}

/* One non-blocking sendmsg of iov on s: the bytes the socket took (the send counted as activity),
 * or -1 when it is full or failed (send_failed has then said why). */
static ssize_t sock_sendv(transport_conn_t *c, tcp_sock_t *s, struct iovec *iov, int n_iov,
                          bool *progressed)
{
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
    ssize_t n;
    do
        n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) send_failed(c, s, errno);
        return -1;
    }
    *progressed = true;
    c->head.last_activity_ns = s->last_send_ns = base_coarse_ns();
    return n;
}

/* Secure mode: the sealed header, then the payload one sealed record at a time. */
static void sock_progress_send_sealed(transport_conn_t *c, tcp_sock_t *s, bool *progressed)
{
    tcp_sec_t *x = s->sec;
    while (s->sq.head && (!c->head.fail.failed || c->finishing) && !s->send_broken) {
        transport_req_t *r = s->sq.head;
        if (!r->sealed) {
            r->ctr0 = x->tx.ctr;
            tcp_seal_header(&x->tx, &r->hdr, r->wire);
            r->sealed = true;
            uint8_t plain[TCP_SEALED_HDR];
            memcpy(plain, r->wire, sizeof(plain));
            tamper(x, r->wire, TCP_SEALED_HDR, true);
            memcpy(x->last_hdr, plain, sizeof(plain));
        }
        if (x->stage_len == 0 && r->off < r->len) {
            size_t n = LOOM_MIN((size_t)TCP_SEAL_CHUNK, r->len - r->off);
            seal_close(&x->tx, SEAL_KIND_DATA, r->buf + r->off, n, x->stage, x->stage + n);
            tamper(x, x->stage, n + SEAL_TAG_BYTES, false);
            x->stage_len = n + SEAL_TAG_BYTES;
            x->stage_plain = n;
            x->stage_done = 0;
        }
        struct iovec iov[2];
        int n_iov = 0;
        if (r->done < TCP_SEALED_HDR) {
            iov[n_iov].iov_base = r->wire + r->done;
            iov[n_iov++].iov_len = TCP_SEALED_HDR - r->done;
        }
        if (x->stage_len) {
            iov[n_iov].iov_base = x->stage + x->stage_done;
            iov[n_iov++].iov_len = x->stage_len - x->stage_done;
        }
        if (n_iov) {
            ssize_t n = sock_sendv(c, s, iov, n_iov, progressed);
            if (n < 0) return;
            size_t moved = (size_t)n;
            size_t h = LOOM_MIN(moved, TCP_SEALED_HDR - r->done);
            r->done += h;
            moved -= h;
            x->stage_done += moved;
            if (x->stage_len && x->stage_done == x->stage_len) {
                r->off += x->stage_plain;
                x->stage_len = 0;
            }
        }
        if (r->done == TCP_SEALED_HDR && r->off == r->len && x->stage_len == 0) send_done(c, s, r);
    }
}

static void sock_progress_send(transport_conn_t *c, tcp_sock_t *s, bool *progressed)
{
    if (s->sec) {
        sock_progress_send_sealed(c, s, progressed);
        return;
    }
    while (s->sq.head && (!c->head.fail.failed || c->finishing) && !s->send_broken) {
        transport_req_t *r = s->sq.head;
        const size_t H = sizeof(tcp_frame_t);
        struct iovec iov[2];
        int n_iov = 0;
        if (r->done < H) {
            iov[n_iov].iov_base = (uint8_t *)&r->hdr + r->done;
            iov[n_iov++].iov_len = H - r->done;
            if (r->len) {
                iov[n_iov].iov_base = r->buf;
                iov[n_iov++].iov_len = r->len;
            }
        } else {
            iov[n_iov].iov_base = r->buf + (r->done - H);
            iov[n_iov++].iov_len = r->len - (r->done - H);
        }
        ssize_t n = sock_sendv(c, s, iov, n_iov, progressed);
        if (n < 0) return;
        r->done += (size_t)n;
        if (r->done >= H + r->len) send_done(c, s, r);
    }
}

/* ---- the mode frames ---- */

/* A socket's handshake is done: our mode frame is ready to go. */
static void mode_start(transport_ctx_t *ctx, transport_conn_t *c, tcp_sock_t *s)
{
    s->state = SK_MODE;
    sock_tune(s->fd, ctx->bufsize);
    memset(&s->mode_out, 0, sizeof(s->mode_out));
    s->mode_out.magic = TCP_MAGIC;
    s->mode_out.type = TCP_FRAME_MODE;
    if (ctx->secure) {
        s->mode_out.flags = (uint16_t)(TCP_MODE_SECURE | (seal_aes_available() ? TCP_MODE_AES : 0));
        if (base_random(s->mode_out.meta, 16) != loomSuccess)
            conn_fail(c, loomSystemError, "no random nonce for the keys of %s: %s", c->head.name,
                      base_last_error());
    }
    s->mode_out_done = s->mode_in_done = 0;
    c->head.last_activity_ns = base_coarse_ns();
}

/* Both mode frames are there: agree, and derive the socket's keys. */
static void mode_finish(transport_ctx_t *ctx, transport_conn_t *c, tcp_sock_t *s)
{
    const tcp_frame_t *m = &s->mode_in;
    int k = (int)(s - c->socks);
    if (m->magic != TCP_MAGIC || m->type != TCP_FRAME_MODE) {
        conn_fail(c, loomRemoteError,
                  "%s opened socket %d with frame type %u instead of its mode frame (magic "
                  "0x%08x): a loom of another version?",
                  c->head.name, k, m->type, m->magic);
        return;
    }
    bool peer_secure = (m->flags & TCP_MODE_SECURE) != 0;
    if (peer_secure != ctx->secure) {
        conn_fail(c, loomInvalidUsage,
                  "%s runs with LOOM_SECURE=%d and this rank (%d) with LOOM_SECURE=%d: every rank "
                  "of a job must use the same LOOM_SECURE",
                  c->head.name, peer_secure, ctx->setup.rank, ctx->secure);
        return;
    }
    if (ctx->secure) {
        tcp_sec_t *x = calloc(1, sizeof(*x));
        uint8_t *stage = malloc(TCP_SEAL_CHUNK + SEAL_TAG_BYTES);
        if (x == NULL || stage == NULL) {
            free(x);
            free(stage);
            conn_fail(c, loomSystemError, "out of memory (sealed socket to %s)", c->head.name);
            return;
        }
        x->stage = stage;
        seal_alg_t alg = (m->flags & TCP_MODE_AES) && (s->mode_out.flags & TCP_MODE_AES)
                             ? SEAL_AES256GCM
                             : SEAL_CHACHA20POLY1305;
        /* The transcript: the handshake's challenge and hello, then the connector's and the
         * acceptor's nonces, and the cipher. */
        bool acceptor = s->hs.acceptor;
        const uint8_t *nc = acceptor ? m->meta : s->mode_out.meta;
        const uint8_t *na = acceptor ? s->mode_out.meta : m->meta;
        uint8_t t[16 + sizeof(hs_hello_t) + 32 + 1];
        size_t tl = 0;
        memcpy(t + tl, s->hs.nonce, 16), tl += 16;
        memcpy(t + tl, &s->hs.hello, sizeof(hs_hello_t)), tl += sizeof(hs_hello_t);
        memcpy(t + tl, nc, 16), tl += 16;
        memcpy(t + tl, na, 16), tl += 16;
        t[tl++] = (uint8_t)alg;
        /* direction 0: connector to acceptor */
        loomResult_t r1 = seal_init(&x->tx, alg, ctx->setup.secret, t, tl, acceptor ? 1 : 0);
        loomResult_t r2 = seal_init(&x->rx, alg, ctx->setup.secret, t, tl, acceptor ? 0 : 1);
        sodium_memzero(t, sizeof(t));
        if (r1 != loomSuccess || r2 != loomSuccess) {
            seal_wipe(&x->tx);
            seal_wipe(&x->rx);
            free(stage);
            free(x);
            conn_fail(c, loomSystemError, "deriving the keys of socket %d to %s: %s", k,
                      c->head.name, base_last_error());
            return;
        }
        s->sec = x;
        TRACE(LOG_NET, "tcp: socket %d of %s sealed with %s", k, c->head.name, seal_alg_name(alg));
    }
    s->state = SK_READY;
    s->reverse = false;
    c->nready++;
    if (c->nready == c->nsocks) c->reverse_at_ns = 0; /* every socket is there */
    c->head.last_activity_ns = base_coarse_ns();
}

/* Sends ours and reads the peer's mode frame, without blocking. */
static void mode_progress(transport_ctx_t *ctx, transport_conn_t *c, tcp_sock_t *s,
                          bool *progressed)
{
    const size_t M = sizeof(tcp_frame_t);
    bool live = !c->head.fail.failed || c->finishing;
    while (s->mode_out_done < M && live) {
        ssize_t n = send(s->fd, (uint8_t *)&s->mode_out + s->mode_out_done, M - s->mode_out_done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n < 0 && s->reverse) { /* refused by the peer, which dialled us: see reverse_dial */
            sock_reset(s);
            return;
        }
        if (n < 0) {
            s->send_broken = true;
            transport_conn_send_failed(&c->head, errno);
            return;
        }
        *progressed = true;
        s->mode_out_done += (size_t)n;
        s->last_send_ns = base_coarse_ns();
    }
    while (s->mode_in_done < M && live) {
        ssize_t n = recv(s->fd, (uint8_t *)&s->mode_in + s->mode_in_done, M - s->mode_in_done,
                         MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0 && s->reverse) {
            sock_reset(s);
            return;
        }
        if (n <= 0) {
            s->send_broken = true; /* the peer is gone: nothing to finish */
            transport_conn_recv_failed(&c->head, n, errno);
            return;
        }
        *progressed = true;
        s->mode_in_done += (size_t)n;
        c->head.last_activity_ns = base_coarse_ns();
    }
    if (live && s->mode_out_done == M && s->mode_in_done == M) mode_finish(ctx, c, s);
}

/* An accepted socket proved itself: attach it to its connection. */
static void attach_accepted(void *arg, hs_t *hs)
{
    transport_ctx_t *ctx = arg;
    const hs_hello_t *h = &hs->hello;
    char as[SOCK_ADDR_STRLEN];
    bool rev = false; /* a higher rank's dial: this rank was late to dial it (reverse_dial) */
    const char *why = transport_hello_refusal(&ctx->setup, h, &rev);
    if (why == NULL && (int)h->nchan != ctx->nsocks)
        why = "LOOM_NSOCKS_PERPEER differs between the two ranks";
    else if (why == NULL && h->chan >= h->nchan)
        why = "bad socket index";
    transport_conn_t *c = NULL;
    if (why == NULL) {
        c = conn_get(ctx, h->from_rank, NULL);
        tcp_sock_t *o = c ? &c->socks[h->chan] : NULL;
        if (c == NULL) {
            why = "out of memory";
        } else if (o->state != SK_NONE && !rev && o->reverse) {
            TRACE(LOG_NET, "tcp: %s dialled us while we dialled it: its socket %u replaces ours",
                  c->head.name, h->chan);
            sock_reset(o); /* its queues stay for the socket taking its place */
        } else if (o->state != SK_NONE && rev && !o->reverse) {
            TRACE(LOG_NET, "tcp: %s dialled us while we dialled it: ours (socket %u) stands",
                  c->head.name, h->chan);
            close(hs->fd);
            return;
        } else if (o->state != SK_NONE) {
            why = "duplicate socket";
        }
    }
    if (why) {
        WARN(LOG_NET, "tcp: refused connection from %s claiming rank %d: %s",
             sock_addr_str(&hs->peer, as, sizeof(as)), h->from_rank, why);
        close(hs->fd);
        return;
    }
    tcp_sock_t *s = &c->socks[h->chan];
    s->fd = hs->fd;
    s->hs = *hs; /* its nonce and hello go into the keys */
    if (c->addr.len == 0) {
        c->addr = hs->peer;
        transport_conn_name(&c->head, c->peer, sock_addr_str(&hs->peer, as, sizeof(as)));
    }
    if (!rev) c->reverse_at_ns = 0; /* the lower rank dials: no need to dial it */
    mode_start(ctx, c, s);
    TRACE(LOG_NET, "tcp: accepted socket %u of %s", h->chan, c->head.name);
}

static void accept_progress(transport_ctx_t *ctx, bool *progressed)
{
    hs_pending_progress(&ctx->pend, ctx->listen_fd, ctx->setup.secret, LOG_NET, ctx->who,
                        attach_accepted, ctx, progressed);
}

static void conn_progress(transport_conn_t *c, bool *progressed)
{
    transport_ctx_t *ctx = c->ctx;
    if (c->reverse_at_ns && !c->head.fail.failed && c->addr.len > 0) {
        uint64_t t = base_coarse_ns();
        if (t >= c->reverse_at_ns) {
            c->reverse_at_ns = t + ctx->ping_ns;
            reverse_dial(c);
        }
    }
    for (int i = 0; i < c->nsocks && !c->head.fail.failed; i++) {
        tcp_sock_t *s = &c->socks[i];
        if (s->state == SK_HANDSHAKE) {
            int hs = s->reverse ? reverse_handshake(c, s, progressed)
                                : transport_conn_handshake(&c->head, &s->hs, progressed);
            if (hs < 0) return;
            if (hs == 0) continue;
            mode_start(ctx, c, s);
        }
        if (s->state == SK_MODE) mode_progress(ctx, c, s, progressed);
        if (s->state != SK_READY) continue;
        if (s->sq.head) sock_progress_send(c, s, progressed);
        if (s->rq.head) sock_progress_recv(c, s, progressed);
    }
    uint64_t now = base_coarse_ns();
    for (int i = 0; i < c->nsocks && !c->head.fail.failed; i++)
        if (c->socks[i].state == SK_READY) maybe_ping(c, &c->socks[i], now);
    if (now >= c->next_peek_ns) {
        c->next_peek_ns = now + c->ctx->ping_ns / 4;
        for (int i = 0; i < c->nsocks && !c->head.fail.failed; i++)
            if (c->socks[i].state == SK_READY && c->socks[i].rq.head == NULL && !c->socks[i].eof)
                peek_heartbeats(c, &c->socks[i]);
    }
}

static loomResult_t tcp_progress(transport_ctx_t *ctx, bool *progressed)
{
    if (ctx->abort.aborted) return loomSuccess;
    /* Data first: whatever strangers do at the listener, the job's sockets are served before. */
    bool want_accept = false;
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (!c->head.fail.failed) conn_progress(c, progressed);
        if (c->nready < c->nsocks) want_accept = true;
    }
    /* The listener matters at every round only while one of the job's connections waits for
     * its peer's sockets; pending strangers are looked at every TRANSPORT_ACCEPT_EVERY_NS. */
    if (transport_accept_due(&ctx->next_accept_ns, want_accept)) accept_progress(ctx, progressed);
    return loomSuccess;
}

static int tcp_pollfds(transport_ctx_t *ctx, struct pollfd *fds, int max)
{
    int n = 0;
    if (ctx->abort.aborted) return 0;
    /* The job's sockets first: the waiter's array is bounded, and a flood of strangers must not
     * push them out of it. */
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->head.fail.failed) continue;
        for (int k = 0; k < c->nsocks && n < max; k++) {
            tcp_sock_t *s = &c->socks[k];
            short ev = 0;
            if (s->state == SK_HANDSHAKE)
                ev = hs_events(&s->hs);
            else if (s->state == SK_MODE)
                ev = (short)(POLLIN | (s->mode_out_done < sizeof(tcp_frame_t) ? POLLOUT : 0));
            else if (s->state == SK_READY)
                ev = (short)((s->sq.head ? POLLOUT : 0) | (s->rq.head ? POLLIN : 0));
            if (ev) fds[n++] = (struct pollfd){.fd = s->fd, .events = ev};
        }
    }
    if (n < max) fds[n++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
    n += hs_pending_pollfds(&ctx->pend, fds + n, max - n);
    return n;
}

static uint64_t tcp_idle_ns(transport_conn_t *c, bool *pending)
{
    return transport_conn_idle_ns(&c->head, c->nready < c->nsocks, pending);
}

/* A round of the abort's grace: handshakes and half-sent frames are what may still finish. A
 * handshake that fails is not waited for; the connection's error will be the abort's. */
static bool abort_grace_step(void *arg, bool *prog)
{
    transport_ctx_t *ctx = arg;
    accept_progress(ctx, prog);
    bool busy = ctx->pend.n > 0;
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        for (int k = 0; k < c->nsocks; k++) {
            tcp_sock_t *s = &c->socks[k];
            /* A connection that failed on what it received may still finish what it sends, so
             * that the abort frame after it can tell the peer why. */
            if (c->head.fail.failed) {
                if (s->state == SK_MODE && !s->send_broken) {
                    c->finishing = true;
                    mode_progress(ctx, c, s, prog);
                    c->finishing = false;
                    if (s->state == SK_MODE && !s->send_broken) busy = true;
                }
                if (s->state == SK_READY && s->sq.head && s->sq.head->done > 0 && !s->send_broken) {
                    c->finishing = true;
                    sock_progress_send(c, s, prog);
                    c->finishing = false;
                    if (s->sq.head && s->sq.head->done > 0 && !s->send_broken) busy = true;
                }
                continue;
            }
            if (s->state == SK_HANDSHAKE) {
                if (hs_progress(&s->hs, prog) != loomSuccess) {
                    s->state = SK_CLOSED;
                    continue;
                }
                if (s->hs.state == HS_DONE)
                    mode_start(ctx, c, s);
                else
                    busy = true;
            }
            if (s->state == SK_MODE) {
                mode_progress(ctx, c, s, prog);
                if (s->state == SK_MODE && !c->head.fail.failed) busy = true;
            }
            if (s->state == SK_READY && s->sq.head && s->sq.head->done > 0) {
                sock_progress_send(c, s, prog);
                if (s->sq.head && s->sq.head->done > 0) busy = true;
            }
        }
    }
    return busy;
}

/* A frame half sent from the caller's buffer: its unsent payload moves into memory of ours, so
 * that the abort's grace can still finish the frame (the peer's stream then stays whole, and the
 * abort's reason after it readable) after the caller got its buffer back. Without memory the
 * frame is cut off: the socket sends nothing more, and the peer sees the stream end. */
static void orphan_half_sent(tcp_sock_t *s, transport_req_t *r)
{
    size_t from = s->sec                          ? r->off
                  : r->done > sizeof(tcp_frame_t) ? r->done - sizeof(tcp_frame_t)
                                                  : 0;
    size_t rem = r->len - from;
    uint8_t *own = malloc(rem ? rem : 1);
    if (own == NULL) {
        s->send_broken = true;
        return;
    }
    memcpy(own, r->buf + from, rem);
    r->own = r->buf = own;
    r->len = rem;
    if (s->sec)
        r->off = 0; /* records are cut at the same places: `from` is a multiple of the record */
    else if (r->done > sizeof(tcp_frame_t))
        r->done = sizeof(tcp_frame_t);
}

/* The call whose requests are queued here left unfinished (transport.h). Every connection with
 * some of them fails (the communicator is broken anyway): nothing of it moves again but the half
 * sent frames, from copies, during the abort's grace. */
static void tcp_orphan(transport_ctx_t *ctx)
{
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        bool queued = false;
        for (int k = 0; k < c->nsocks; k++) {
            tcp_sock_t *s = &c->socks[k];
            for (transport_req_t *r = s->sq.head; r; r = r->next) {
                if (r->complete || r->orphan) continue; /* a heartbeat's rest, or done before */
                queued = true;
                r->orphan = true;
                if (r == s->sq.head && r->done > 0 && !s->send_broken) orphan_half_sent(s, r);
            }
            for (transport_req_t *r = s->rq.head; r; r = r->next) {
                queued = queued || !r->orphan;
                r->orphan = true; /* never read into again: the connection fails */
            }
        }
        if (queued)
            conn_fail(c, loomRemoteError,
                      "the call with messages queued to %s ended unfinished; the connection is "
                      "not used again",
                      c->head.name);
    }
}

static void tcp_abort(transport_ctx_t *ctx, const char *reason)
{
    if (ctx->abort.aborted) return;
    transport_abort_grace(abort_grace_step, ctx);
    transport_abort_set(&ctx->abort, reason);
    size_t rl = LOOM_MIN(strlen(reason), (size_t)TCP_ABORT_TEXT_MAX);
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        for (int k = 0; k < c->nsocks; k++) {
            tcp_sock_t *s = &c->socks[k];
            if (s->fd < 0) continue;
            /* Tell the peer why, unless a frame is half sent (the peer would read our header
             * as payload): then closing the socket must say it. */
            bool mid_frame = s->sq.head && s->sq.head->done > 0;
            TRACE(LOG_NET, "tcp: abort: socket %d of %s: %s", k, c->head.name,
                  s->state != SK_READY ? "not ready, closed"
                  : mid_frame          ? "in the middle of a frame, closed"
                                       : "reason sent");
            if (s->state == SK_READY && !mid_frame) {
                tcp_frame_t h = {.magic = TCP_MAGIC,
                                 .type = TCP_FRAME_ABORT,
                                 .seq = s->send_seq,
                                 .len = (uint32_t)rl};
                if (s->sec) {
                    /* Records sealed but not a byte of them sent are taken back: their numbers
                     * go to the abort, and nothing sealed under them ever leaves. */
                    tcp_sec_t *x = s->sec;
                    if (s->sq.head && s->sq.head->sealed) x->tx.ctr = s->sq.head->ctr0;
                    x->stage_len = 0;
                    uint8_t wire[TCP_SEALED_HDR];
                    uint8_t text[TCP_ABORT_TEXT_MAX + SEAL_TAG_BYTES];
                    tcp_seal_header(&x->tx, &h, wire);
                    seal_close(&x->tx, SEAL_KIND_ABORT, reason, rl, text, text + rl);
                    struct iovec iov[2] = {{wire, sizeof(wire)}, {text, rl + SEAL_TAG_BYTES}};
                    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
                    ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                    (void)n;
                } else {
                    struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)reason, rl}};
                    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
                    ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                    (void)n;
                }
            }
        }
    }
    /* Every reason first, then the ends of stream: a peer that sees one socket closed looks
     * for the reason on the others. */
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        for (int k = 0; k < c->nsocks; k++)
            if (c->socks[k].fd >= 0) shutdown(c->socks[k].fd, SHUT_RDWR);
    }
}

static void tcp_fini(transport_ctx_t *ctx)
{
    if (ctx == NULL) return;
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        for (int k = 0; k < TCP_MAX_SOCKS; k++) {
            tcp_sock_t *s = &c->socks[k];
            if (s->fd >= 0) sock_drain_close(s->fd);
            /* Requests still queued were abandoned by their owner with the communicator. */
            for (transport_req_t *r = s->sq.head, *n; r; r = n) {
                n = r->next;
                free(r->own);
                free(r);
            }
            for (transport_req_t *r = s->rq.head, *n; r; r = n) {
                n = r->next;
                free(r);
            }
            if (s->sec) {
                seal_wipe(&s->sec->tx);
                seal_wipe(&s->sec->rx);
                free(s->sec->stage);
                free(s->sec);
            }
        }
        free(c);
    }
    hs_pending_free(&ctx->pend);
    if (ctx->listen_fd >= 0) close(ctx->listen_fd);
    free(ctx->conns);
    free(ctx->active);
    free(ctx);
}

const transport_ops_t transport_tcp = {
    .name = "tcp",
    .caps = TRANSPORT_CAP_MSG,
    .reach = TRANSPORT_REACH_NODE | TRANSPORT_REACH_NET,
    .mem_types = TRANSPORT_MEM_HOST,
    .bw_GBps = 1.0,
    .latency_us = 30.0,
    .init = tcp_init,
    .connect = tcp_connect,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .test = tcp_test,
    .progress = tcp_progress,
    .pollfds = tcp_pollfds,
    .abort = tcp_abort,
    .orphan = tcp_orphan,
    .idle_ns = tcp_idle_ns,
    .peer_name = transport_peer_name,
    .conn_error = transport_conn_error,
    .reg_mr = NULL,
    .fini = tcp_fini,
};
