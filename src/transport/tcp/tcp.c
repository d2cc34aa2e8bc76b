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
#include "param.h"
#include "sock.h"
#include "transport.h"

#define TCP_MAGIC 0x4c4f4f4du /* "LOOM" */
#define TCP_FRAME_DATA 1
#define TCP_FRAME_ABORT 2
#define TCP_FRAME_PING 3 /* a header alone: "I am alive"; flags: its TRANSPORT_CALL_* state */
#define TCP_MAX_SOCKS 16
#define TCP_ABORT_TEXT_MAX 1024

typedef struct {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint32_t seq;
    uint32_t len;
    uint8_t meta[TRANSPORT_META_BYTES];
} tcp_frame_t;
_Static_assert(sizeof(tcp_frame_t) == 48, "frame header layout");

struct transport_req {
    struct transport_req *next;
    transport_conn_t *conn;
    bool send;
    bool complete;
    bool bad_len; /* the peer's message had another length: meta is valid, data is not */
    uint8_t *buf;
    size_t len;
    size_t done; /* bytes of header + payload moved */
    tcp_frame_t hdr;
};

typedef enum { SK_NONE = 0, SK_HANDSHAKE, SK_READY, SK_CLOSED } tcp_sock_state_t;

typedef struct {
    int fd;
    tcp_sock_state_t state;
    hs_t hs;
    FIFO(transport_req_t) sq; /* sends in posting order */
    FIFO(transport_req_t) rq; /* receives in posting order */
    uint32_t send_seq, recv_seq;
    uint64_t last_send_ns; /* for heartbeats */
    bool eof;              /* the peer closed it while nothing was expected on it */
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
    INFO(LOG_NET, "tcp: rank %d listens on %s, %d sockets per peer", setup->rank,
         sock_addr_str(&ctx->bound, as, sizeof(as)), ctx->nsocks);
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
    c->head.last_activity_ns = base_now_ns();
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
    }
    *out = c;
    return loomSuccess;
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

/* Reads a peer's ABORT frame text (already partly in `have`) and fails the connection. */
static void read_abort(transport_conn_t *c, tcp_sock_t *s, const tcp_frame_t *h,
                       const uint8_t *have, size_t nhave)
{
    char text[TCP_ABORT_TEXT_MAX + 1];
    size_t want = LOOM_MIN((size_t)h->len, (size_t)TCP_ABORT_TEXT_MAX);
    size_t got = LOOM_MIN(nhave, want);
    if (got) memcpy(text, have, got);
    /* The rest is already on its way; give it a moment, it is only an error text. */
    uint64_t deadline = base_now_ns() + 200000000ull;
    while (got < want && base_now_ns() < deadline) {
        ssize_t n = recv(s->fd, text + got, want - got, 0);
        if (n > 0)
            got += (size_t)n;
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
            break;
    }
    text[got] = '\0';
    conn_fail(c, loomRemoteError, "%s aborted: %s", c->head.name, text);
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
    if (h->magic != TCP_MAGIC) {
        conn_fail(c, loomRemoteError,
                  "malformed frame from %s: bad magic 0x%08x (socket %d, frame %u)", c->head.name,
                  h->magic, (int)(s - c->socks), s->recv_seq);
        return false;
    }
    if (h->type == TCP_FRAME_ABORT) {
        read_abort(c, s, h, NULL, 0);
        return false;
    }
    if (h->type != TCP_FRAME_DATA) {
        conn_fail(c, loomRemoteError, "malformed frame from %s: unknown type %u", c->head.name,
                  h->type);
        return false;
    }
    if (h->seq != s->recv_seq) {
        conn_fail(c, loomRemoteError, "malformed frame from %s: sequence %u where %u was expected",
                  c->head.name, h->seq, s->recv_seq);
        return false;
    }
    if (h->len > param_size(PARAM_MAX_MESSAGE)) {
        conn_fail(c, loomRemoteError,
                  "malformed frame from %s: %u bytes, more than LOOM_MAX_MESSAGE (frame %u)",
                  c->head.name, h->len, h->seq);
        return false;
    }
    if (h->len != r->len) {
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
    s->recv_seq++;
    return true;
}

/* Reads a frame header into r->hdr. Heartbeats are consumed here. Returns 1 when a data header
 * is complete, 0 when no more bytes are there now, -1 on failure. */
static int read_header(transport_conn_t *c, tcp_sock_t *s, transport_req_t *r, bool *progressed)
{
    const size_t H = sizeof(tcp_frame_t);
    while (r->done < H) {
        ssize_t n = recv(s->fd, (uint8_t *)&r->hdr + r->done, H - r->done, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n <= 0) {
            transport_conn_recv_failed(&c->head, n, errno);
            return -1;
        }
        *progressed = true;
        c->head.last_activity_ns = base_now_ns();
        r->done += (size_t)n;
        if (r->done == H && r->hdr.magic == TCP_MAGIC && r->hdr.type == TCP_FRAME_PING) {
            transport_peer_call_set(&c->head, r->hdr.flags);
            r->done = 0; /* a heartbeat: nothing to deliver */
        }
    }
    return header_ok(c, s, r) ? 1 : -1;
}

static void sock_progress_recv(transport_conn_t *c, tcp_sock_t *s, bool *progressed)
{
    const size_t H = sizeof(tcp_frame_t);
    while (s->rq.head && !c->head.fail.failed) {
        transport_req_t *r = s->rq.head;
        if (r->done < H) {
            int h = read_header(c, s, r, progressed);
            if (h <= 0) return;
        }
        while (r->done < H + r->len) {
            ssize_t n = recv(s->fd, r->buf + (r->done - H), r->len - (r->done - H), 0);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n <= 0) {
                transport_conn_recv_failed(&c->head, n, errno);
                return;
            }
            *progressed = true;
            c->head.last_activity_ns = base_now_ns();
            r->done += (size_t)n;
        }
        recv_done(c, s, r);
    }
}

/* On a socket nobody reads now, consume heartbeats at its head (they prove the peer alive). */
static void peek_heartbeats(transport_conn_t *c, tcp_sock_t *s)
{
    tcp_frame_t h;
    for (;;) {
        ssize_t n = recv(s->fd, &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) {
            /* The peer finished and left while its last messages may still wait on the other
             * sockets: an end of stream is an error only where a receive expects data (then
             * sock_progress_recv says so), or when a send fails. */
            s->eof = true;
            return;
        }
        if (n != (ssize_t)sizeof(h)) return;
        if (h.magic != TCP_MAGIC) return; /* the next receive will report it */
        if (h.type == TCP_FRAME_ABORT) {
            recv(s->fd, &h, sizeof(h), MSG_DONTWAIT);
            read_abort(c, s, &h, NULL, 0);
            return;
        }
        if (h.type != TCP_FRAME_PING) {
            c->head.last_activity_ns = base_now_ns(); /* data is waiting: the peer got this far */
            return;
        }
        if (recv(s->fd, &h, sizeof(h), MSG_DONTWAIT) != (ssize_t)sizeof(h)) return;
        c->head.last_activity_ns = base_now_ns();
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
    ssize_t n = send(s->fd, &h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == (ssize_t)sizeof(h)) {
        s->last_send_ns = now;
    } else if (n > 0) {
        /* A partial header would desynchronise the stream: finish it as a frame. */
        transport_req_t *r = calloc(1, sizeof(*r));
        if (r == NULL) {
            conn_fail(c, loomSystemError, "out of memory (heartbeat)");
            return;
        }
        r->conn = c;
        r->send = true;
        r->hdr = h;
        r->done = (size_t)n;
        r->complete = true; /* nobody tests it: freed when sent */
        FIFO_PUSH(&s->sq, r);
    }
}

static void sock_progress_send(transport_conn_t *c, tcp_sock_t *s, bool *progressed)
{
    while (s->sq.head && !c->head.fail.failed) {
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
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            /* The peer may have said why it left before closing: look for that first. */
            int e = errno;
            if (s->rq.head == NULL || s->rq.head->done == 0) peek_heartbeats(c, s);
            transport_conn_send_failed(&c->head, e);
            return;
        }
        *progressed = true;
        c->head.last_activity_ns = s->last_send_ns = base_now_ns();
        r->done += (size_t)n;
        if (r->done >= H + r->len) {
            FIFO_DROP_HEAD(&s->sq);
            if (r->complete) {
                free(r); /* the rest of a heartbeat */
                continue;
            }
            r->complete = true;
            c->head.pending--;
        }
    }
}

/* An accepted socket proved itself: attach it to its connection. */
static void attach_accepted(void *arg, hs_t *hs)
{
    transport_ctx_t *ctx = arg;
    const hs_hello_t *h = &hs->hello;
    char as[SOCK_ADDR_STRLEN];
    const char *why = transport_hello_refusal(&ctx->setup, h);
    if (why == NULL && (int)h->nchan != ctx->nsocks)
        why = "LOOM_NSOCKS_PERPEER differs between the two ranks";
    else if (why == NULL && h->chan >= h->nchan)
        why = "bad socket index";
    transport_conn_t *c = NULL;
    if (why == NULL) {
        c = conn_get(ctx, h->from_rank, NULL);
        if (c == NULL)
            why = "out of memory";
        else if (c->socks[h->chan].state != SK_NONE)
            why = "duplicate socket";
    }
    if (why) {
        WARN(LOG_NET, "tcp: refused connection from %s claiming rank %d: %s",
             sock_addr_str(&hs->peer, as, sizeof(as)), h->from_rank, why);
        close(hs->fd);
        return;
    }
    tcp_sock_t *s = &c->socks[h->chan];
    s->fd = hs->fd;
    s->state = SK_READY;
    sock_tune(s->fd, ctx->bufsize);
    c->nready++;
    if (c->addr.len == 0) {
        c->addr = hs->peer;
        transport_conn_name(&c->head, c->peer, sock_addr_str(&hs->peer, as, sizeof(as)));
    }
    c->head.last_activity_ns = base_now_ns();
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
    for (int i = 0; i < c->nsocks && !c->head.fail.failed; i++) {
        tcp_sock_t *s = &c->socks[i];
        if (s->state == SK_HANDSHAKE) {
            int hs = transport_conn_handshake(&c->head, &s->hs, progressed);
            if (hs < 0) return;
            if (hs == 0) continue;
            s->state = SK_READY;
            sock_tune(s->fd, ctx->bufsize);
            c->nready++;
            c->head.last_activity_ns = base_now_ns();
        }
        if (s->state != SK_READY) continue;
        if (s->sq.head) sock_progress_send(c, s, progressed);
        if (s->rq.head) sock_progress_recv(c, s, progressed);
    }
    uint64_t now = base_now_ns();
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
        for (int k = 0; k < c->nsocks && !c->head.fail.failed; k++) {
            tcp_sock_t *s = &c->socks[k];
            if (s->state == SK_HANDSHAKE) {
                if (hs_progress(&s->hs, prog) != loomSuccess) {
                    s->state = SK_CLOSED;
                    continue;
                }
                if (s->hs.state == HS_DONE) {
                    s->state = SK_READY;
                    c->nready++;
                } else {
                    busy = true;
                }
            }
            if (s->state == SK_READY && s->sq.head && s->sq.head->done > 0) {
                sock_progress_send(c, s, prog);
                if (s->sq.head && s->sq.head->done > 0) busy = true;
            }
        }
    }
    return busy;
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
            if (s->state == SK_READY && !mid_frame) {
                tcp_frame_t h = {.magic = TCP_MAGIC,
                                 .type = TCP_FRAME_ABORT,
                                 .seq = s->send_seq,
                                 .len = (uint32_t)rl};
                struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)reason, rl}};
                struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
                ssize_t n = sendmsg(s->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                (void)n;
            }
            shutdown(s->fd, SHUT_RDWR);
        }
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
                free(r);
            }
            for (transport_req_t *r = s->rq.head, *n; r; r = n) {
                n = r->next;
                free(r);
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
    .idle_ns = tcp_idle_ns,
    .peer_name = transport_peer_name,
    .conn_error = transport_conn_error,
    .reg_mr = NULL,
    .fini = tcp_fini,
};
