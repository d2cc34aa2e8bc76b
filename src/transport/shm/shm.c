/*
 * Same-node transport for host memory: one copy, straight from the sender's buffer.
 *
 * Each pair of ranks on a node shares one AF_UNIX SOCK_SEQPACKET socket (abstract names: nothing
 * is left in the file system or /dev/shm, even when a rank is killed). The socket carries only
 * small control messages: a send posts a descriptor (address, length, metadata), and the
 * receiver, once it has a matching receive, copies the bytes straight out of the sender's
 * memory with process_vm_readv (cross-memory attach) into its own buffer, then acknowledges; the
 * acknowledgement completes the send. Data crosses memory once, with no socket buffers between.
 *
 * Where cross-memory attach is refused (seccomp in containers, ptrace restrictions) or
 * LOOM_SHM_CMA=0, the bytes go through bounce segments instead: each side owns one (a memfd, sent
 * to the peer over the socket with SCM_RIGHTS and mapped there, offered whatever the mode turns
 * out to be), the sender copies into a free slot, the receiver copies out. Both sides test
 * cross-memory attach on each other at connect time and use it only if both can.
 *
 * Control messages are read eagerly (they are small), so acknowledgements never wait behind
 * data the receiver has not asked for yet. The peer's pid comes from SO_PEERCRED, not from the
 * peer's word.
 *
 * Small messages (up to SHM_EAGER_MAX) take neither the socket nor a cross-memory read: each
 * side's segment begins with a ring of records that only it writes (a header with the message's
 * sequence number, length and metadata, then the payload) and that the peer, which maps the
 * segment, reads in place; a send is complete once its record is in the ring, a receive once
 * it copied the payload out. Each side publishes in its own segment how far it wrote (head) and
 * how far it read the peer's ring (tail), so no word is written by both. A side about to sleep
 * in poll() says so (an odd `armed` count, then a second look at the peer's words); the peer,
 * after publishing a record or consuming one, sends a one-message wake-up over the socket only
 * then. Messages of both paths carry the connection's one sequence, and the receiver matches
 * them in that order whichever path each took.
 */
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "base.h"
#include "fifo.h"
#include "param.h"
#include "sock.h"
#include "transport.h"

#define SHM_MSG_DESC 1
#define SHM_MSG_ACK 2
#define SHM_MSG_ABORT 3
#define SHM_MSG_MODE 4
#define SHM_MSG_PING 5 /* "alive", slot: its TRANSPORT_CALL_* state; read eagerly like the rest */
#define SHM_MSG_WAKE 6 /* "look at my segment": a record was published or consumed */
#define SHM_ABORT_TEXT_MAX 1024
#define SHM_BOUNCE_SLOTS 8

/* A segment: the control words, the ring of small messages, then the bounce slots. */
#define SHM_EAGER_MAX (32u << 10)
#define SHM_RING_BYTES (512u << 10)
#define SHM_CTRL_BYTES 448u
#define SHM_REC_HDR 64u
#define SHM_BOUNCE_OFF ((size_t)SHM_CTRL_BYTES + SHM_RING_BYTES)
#define SHM_SEG_BYTES(slot_bytes) (SHM_BOUNCE_OFF + (size_t)(slot_bytes)*SHM_BOUNCE_SLOTS)

/* The control words of a segment, each written by its owner only, on lines of their own. */
typedef struct {
    _Atomic uint64_t head; /* bytes the owner published in its ring */
    uint8_t pad0[56];
    _Atomic uint64_t tail; /* bytes of the peer's ring the owner consumed */
    uint8_t pad1[56];
    _Atomic uint64_t armed; /* odd: the owner is about to sleep in poll() */
    uint8_t pad2[56];
    _Atomic uint64_t sent; /* control messages the owner put (or is putting) on the socket */
    uint8_t pad3[56];
    /* A call of the owner's ended unfinished (shm_orphan): its messages below this sequence are
     * withdrawn, and a descriptor of one must not be read from the owner's memory. */
    _Atomic uint64_t withdrawn;
    uint8_t pad4[56];
    /* 1 + the sequence of the peer's message the owner is reading out of the peer's memory
     * (process_vm_readv), 0 when none: what the peer's withdrawal waits on. */
    _Atomic uint64_t reading;
    uint8_t pad5[56];
    /* The owner's withdrawal stopped waiting for the peer's read of a message below this
     * sequence (the peer was stopped in it) and gave its caller the buffer back: what the peer
     * read of such a message may be the caller's later bytes, and is thrown away. */
    _Atomic uint64_t abandoned;
    uint8_t pad6[56];
} shm_ctrl_t;

/* How long a withdrawal waits for a read of the peer's already under way (a copy of a slice:
 * microseconds to milliseconds; longer only when the peer was stopped in the middle of one). */
#define SHM_WITHDRAW_WAIT_NS 200000000ull

/* A spinning rank calls recvmsg() on a connection only when the peer's `sent` count says a
 * control message may be there, after every sleep in poll() (which is what reports a closed
 * socket or a message counted late), and at least this often. recvmsg() on every pass cost
 * each spinning pass one system call per connection, which on shared cores is the time the
 * other ranks wait for the core. */
#define SHM_READ_EVERY_NS 1000000ull

#define SHM_REC_MSG 1u
#define SHM_REC_PAD 2u /* the ring's bytes from here to its end are unused */

typedef struct {
    uint64_t seq;
    uint32_t len;
    uint32_t kind;
    uint8_t meta[TRANSPORT_META_BYTES];
    uint8_t pad[SHM_REC_HDR - 16 - TRANSPORT_META_BYTES];
} shm_rec_t;
_Static_assert(sizeof(shm_rec_t) == SHM_REC_HDR, "ring record header");
_Static_assert(sizeof(shm_ctrl_t) <= SHM_CTRL_BYTES, "segment control words");
_Static_assert(SHM_RING_BYTES >= 4 * (SHM_EAGER_MAX + SHM_REC_HDR), "ring too small");

typedef struct {
    uint32_t type;
    uint32_t slot; /* bounce slot, or UINT32_MAX for a cross-memory read */
    uint64_t seq;
    uint64_t addr;
    uint64_t len;
    uint8_t meta[TRANSPORT_META_BYTES];
} shm_desc_t;

typedef struct {
    uint32_t type;
    uint32_t cma_ok;     /* this side could read the peer's probe */
    uint64_t probe_addr; /* a word in this process for the peer to read */
    uint64_t probe_value;
    uint64_t slot_bytes; /* bounce slot size of this side */
} shm_mode_t;

typedef union {
    uint32_t type;
    shm_desc_t desc;
    shm_mode_t mode;
    struct {
        uint32_t type;
        char text[SHM_ABORT_TEXT_MAX];
    } abort;
} shm_msg_t;

struct transport_req {
    struct transport_req *next;
    transport_conn_t *conn;
    bool send, complete;
    bool bad_len; /* the peer's message had another length: meta valid, data not */
    uint8_t *buf;
    size_t len;
    uint64_t seq;
    int slot;
    uint8_t meta[TRANSPORT_META_BYTES];
};

typedef enum { CS_NONE, CS_HANDSHAKE, CS_MODE, CS_READY } shm_conn_state_t;

/* A descriptor that arrived before its receive was posted. */
typedef struct shm_pending_desc {
    struct shm_pending_desc *next;
    shm_desc_t d;
} shm_pending_desc_t;

struct transport_conn {
    transport_conn_head_t head; /* first: the shared ops read it */
    transport_ctx_t *ctx;
    int peer;
    int fd;
    shm_conn_state_t state;
    hs_t hs;
    pid_t pid;
    bool cma;
    bool mode_sent, mode_got; /* ours sent; the peer's first one handled */
    uint64_t probe;
    /* bounce segments: ours (we write) and the peer's (we read) */
    uint8_t *my_bounce, *peer_bounce;
    size_t my_bounce_len, peer_bounce_len, peer_slot_bytes;
    bool slot_busy[SHM_BOUNCE_SLOTS];
    int bounce_fd;
    /* queues */
    FIFO(transport_req_t) wait; /* sends waiting for a bounce slot or readiness */
    FIFO(transport_req_t) ack;  /* sends posted, waiting for the acknowledgement */
    FIFO(transport_req_t) recv; /* receives in posting order */
    FIFO(shm_pending_desc_t) desc;
    shm_msg_t *out; /* control messages not yet sent */
    int nout, outcap;
    uint64_t send_seq, recv_seq;
    uint64_t last_send_ns;
    /* the ring: how far we wrote ours and read the peer's; the peer's armed count last woken */
    uint64_t ring_head, ring_tail, woken;
    /* control messages: ours sent, the peer's read; when the socket was last read; whether a
     * wait's poll() came since (set by pollfds, which the progress thread may call) */
    uint64_t sock_sent, sock_read, last_read_ns;
    atomic_bool polled;
    /* The peer closed its socket or aborted: what it left in its ring before that may still be
     * received (its sends completed when they reached the ring, and it may have left since, as
     * tcp's bytes in flight arrive before the peer's close); a receive nothing there can satisfy,
     * or a send, fails the connection, with the peer's reason when it gave one. */
    bool eof;
    char *eof_why;
    /* The higher rank of the pair: the lower one's listener, and when to dial it ourselves if
     * it has not dialled by then (0: never again); reverse: our dial of it, until ready. As
     * tcp's (tcp.c, reverse_dial). */
    char peer_listener[TRANSPORT_HANDLE_BYTES];
    uint64_t reverse_at_ns;
    bool reverse, reverse_said;
};
TRANSPORT_CONN_HEAD_FIRST(struct transport_conn, head);

struct transport_ctx {
    transport_setup_t setup;
    int listen_fd;
    char name[108];
    size_t name_len;
    size_t slot_bytes;
    uint64_t ping_ns;
    uint64_t next_accept_ns;
    bool cma_wanted;
    transport_conn_t **conns;
    transport_conn_t **active;
    int nactive;
    hs_pending_t pend;        /* accepted connections still proving who they are */
    useconds_t read_stall_us; /* LOOM_SHM_READ_STALL_MS (testing only), read at init */
    char who[48];
    transport_abort_t abort;
};

#define conn_fail(c, ...) transport_fail(&(c)->head.fail, __VA_ARGS__)

static shm_ctrl_t *my_ctrl(transport_conn_t *c)
{
    return (shm_ctrl_t *)(void *)c->my_bounce;
}

static const shm_ctrl_t *peer_ctrl(const transport_conn_t *c)
{
    return (const shm_ctrl_t *)(const void *)c->peer_bounce;
}

/* Our count of socket messages, said in our segment before each one is sent (so the peer
 * never sees a message before its count: at worst a count before its message, and one read
 * that finds nothing), and taken back if the send failed. */
static void sent_announce(transport_conn_t *c, bool sending)
{
    if (c->my_bounce == NULL) return;
    atomic_store_explicit(&my_ctrl(c)->sent, c->sock_sent + (sending ? 1 : 0),
                          memory_order_seq_cst);
}

static ssize_t send_counted(transport_conn_t *c, const struct msghdr *mh, int flags)
{
    sent_announce(c, true);
    ssize_t n = sendmsg(c->fd, mh, flags);
    if (n >= 0)
        c->sock_sent++;
    else
        sent_announce(c, false);
    return n;
}

static ssize_t send_ctl(transport_conn_t *c, const void *m, size_t len)
{
    struct iovec iov = {(void *)m, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    return send_counted(c, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Whether to read the socket on this pass: always until both segments are mapped, after a
 * wait's poll(), every SHM_READ_EVERY_NS, and when the peer's count says so. */
static bool sock_news(transport_conn_t *c, uint64_t now)
{
    if (c->state != CS_READY || c->peer_bounce == NULL) return true;
    if (atomic_exchange_explicit(&c->polled, false, memory_order_relaxed)) return true;
    if (now - c->last_read_ns > SHM_READ_EVERY_NS) return true;
    return atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->sent, memory_order_acquire) !=
           c->sock_read;
}

/* The abstract socket address of a handle: a leading NUL then the name. */
static socklen_t shm_sockaddr(const char *name, size_t len, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, name, len);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

static loomResult_t shm_init(const transport_setup_t *setup, transport_ctx_t **out,
                             uint8_t handle[TRANSPORT_HANDLE_BYTES])
{
    transport_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) return base_error(loomSystemError, LOG_SHM, "out of memory (shm context)");
    ctx->setup = *setup;
    snprintf(ctx->who, sizeof(ctx->who), "shm: rank %d", setup->rank);
    ctx->slot_bytes = LOOM_MAX(setup->max_message, 4096);
    ctx->read_stall_us = (useconds_t)param_int(PARAM_SHM_READ_STALL_MS) * 1000;
    ctx->cma_wanted = param_int(PARAM_SHM_CMA) != 0;
    ctx->ping_ns = transport_ping_ns();
    ctx->conns = calloc((size_t)setup->nranks, sizeof(*ctx->conns));
    ctx->active = calloc((size_t)setup->nranks, sizeof(*ctx->active));
    uint8_t rnd[8];
    if (!ctx->conns || !ctx->active || base_random(rnd, sizeof(rnd)) != loomSuccess) goto fail;
    uint64_t r64;
    memcpy(&r64, rnd, 8);
    ctx->name_len =
        (size_t)snprintf(ctx->name, sizeof(ctx->name), "loom/%016llx/%d/%016llx",
                         (unsigned long long)setup->comm_id, setup->rank, (unsigned long long)r64);
    ctx->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ctx->listen_fd < 0) {
        base_error(loomSystemError, LOG_SHM, "shm: socket(AF_UNIX) failed: %s", strerror(errno));
        goto fail;
    }
    struct sockaddr_un sa;
    socklen_t sl = shm_sockaddr(ctx->name, ctx->name_len, &sa);
    if (bind(ctx->listen_fd, (struct sockaddr *)&sa, sl) != 0 ||
        listen(ctx->listen_fd, 1024) != 0) {
        base_error(loomSystemError, LOG_SHM, "shm: bind/listen on @%s failed: %s", ctx->name,
                   strerror(errno));
        close(ctx->listen_fd);
        goto fail;
    }
    memset(handle, 0, TRANSPORT_HANDLE_BYTES);
    memcpy(handle, ctx->name, LOOM_MIN(ctx->name_len, (size_t)TRANSPORT_HANDLE_BYTES - 1));
    INFO(LOG_SHM, "shm: rank %d listens on @%s", setup->rank, ctx->name);
    *out = ctx;
    return loomSuccess;
fail:
    free(ctx->conns);
    free(ctx->active);
    free(ctx);
    return loomSystemError;
}

static transport_conn_t *conn_new(transport_ctx_t *ctx, int peer)
{
    transport_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) return NULL;
    c->ctx = ctx;
    c->peer = peer;
    c->fd = -1;
    c->bounce_fd = -1;
    c->head.last_activity_ns = base_coarse_ns();
    c->probe = base_now_ns() ^ 0x5eed5eed5eedull;
    transport_conn_name(&c->head, peer, "same node");
    ctx->conns[peer] = c;
    ctx->active[ctx->nactive++] = c;
    return c;
}

static loomResult_t shm_connect(transport_ctx_t *ctx, int peer,
                                const uint8_t handle[TRANSPORT_HANDLE_BYTES],
                                transport_conn_t **out)
{
    if (ctx->conns[peer]) {
        *out = ctx->conns[peer];
        return loomSuccess;
    }
    transport_conn_t *c = conn_new(ctx, peer);
    if (c == NULL) return base_error(loomSystemError, LOG_SHM, "out of memory (connection)");
    if (ctx->setup.rank < peer) {
        char name[TRANSPORT_HANDLE_BYTES];
        memcpy(name, handle, TRANSPORT_HANDLE_BYTES);
        name[TRANSPORT_HANDLE_BYTES - 1] = '\0';
        struct sockaddr_un sa;
        socklen_t sl = shm_sockaddr(name, strlen(name), &sa);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0 || (connect(fd, (struct sockaddr *)&sa, sl) != 0 && errno != EINPROGRESS &&
                       errno != EAGAIN)) {
            conn_fail(c, loomRemoteError, "cannot connect to %s at @%s: %s", c->head.name, name,
                      strerror(errno));
            if (fd >= 0) close(fd);
        } else {
            sock_addr_t peer_addr;
            memset(&peer_addr, 0, sizeof(peer_addr));
            hs_hello_t hello = {.comm_id = ctx->setup.comm_id,
                                .from_rank = ctx->setup.rank,
                                .to_rank = peer,
                                .chan = 0,
                                .nchan = 1};
            c->fd = fd;
            c->state = CS_HANDSHAKE;
            hs_connect_init(&c->hs, fd, &peer_addr, ctx->setup.secret, &hello);
            c->hs.patient = true; /* as tcp's: the peer may not serve its listener yet */
        }
    } else {
        memcpy(c->peer_listener, handle, TRANSPORT_HANDLE_BYTES);
        c->peer_listener[TRANSPORT_HANDLE_BYTES - 1] = '\0';
        c->reverse_at_ns = base_coarse_ns() + ctx->ping_ns;
    }
    *out = c;
    return loomSuccess;
}

/* Our dial of a late lower rank (see tcp.c's reverse_dial) that did not become ready: back to
 * no socket, nothing of the data sent (only ready connections carry it), its queues kept. */
static void conn_rewind(transport_conn_t *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->state = CS_NONE;
    if (c->my_bounce) munmap(c->my_bounce, c->my_bounce_len);
    if (c->peer_bounce) munmap(c->peer_bounce, c->peer_bounce_len);
    c->my_bounce = c->peer_bounce = NULL;
    c->my_bounce_len = c->peer_bounce_len = c->peer_slot_bytes = 0;
    c->mode_sent = c->mode_got = c->cma = false;
    c->nout = 0;
    c->ring_head = c->ring_tail = c->woken = 0;
    c->sock_sent = c->sock_read = 0;
    c->eof = false;
    free(c->eof_why);
    c->eof_why = NULL;
    c->reverse = false;
    memset(c->slot_busy, 0, sizeof(c->slot_busy));
    transport_conn_name(&c->head, c->peer, "same node");
}

static void reverse_dial(transport_conn_t *c)
{
    transport_ctx_t *ctx = c->ctx;
    if (!c->reverse_said)
        INFO(LOG_SHM,
             "shm: %s has not connected to rank %d after %.2f s: dialling it instead (it may be "
             "late; its heartbeats will say whether it is alive)",
             c->head.name, ctx->setup.rank, (double)ctx->ping_ns * 1e-9);
    c->reverse_said = true;
    struct sockaddr_un sa;
    socklen_t sl = shm_sockaddr(c->peer_listener, strlen(c->peer_listener), &sa);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 ||
        (connect(fd, (struct sockaddr *)&sa, sl) != 0 && errno != EINPROGRESS && errno != EAGAIN)) {
        TRACE(LOG_SHM, "shm: dialling %s: %s (again later)", c->head.name, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    sock_addr_t none;
    memset(&none, 0, sizeof(none));
    hs_hello_t hello = {.comm_id = ctx->setup.comm_id,
                        .from_rank = ctx->setup.rank,
                        .to_rank = c->peer,
                        .chan = 0,
                        .nchan = 1};
    c->fd = fd;
    c->state = CS_HANDSHAKE;
    c->reverse = true;
    hs_connect_init(&c->hs, fd, &none, ctx->setup.secret, &hello);
    c->hs.patient = true;
}

/* A peer that left: its connection fails now (something of ours waits on it). */
static void eof_fail(transport_conn_t *c)
{
    if (c->head.fail.failed) return;
    if (c->eof_why)
        conn_fail(c, loomRemoteError, "%s", c->eof_why);
    else
        transport_conn_recv_failed(&c->head, 0, 0);
}

static loomResult_t conn_check(transport_conn_t *c)
{
    return transport_conn_check(&c->head, &c->ctx->abort);
}

static size_t msg_size(const shm_msg_t *m)
{
    switch (m->type) {
    case SHM_MSG_DESC: return sizeof(shm_desc_t);
    case SHM_MSG_MODE: return sizeof(shm_mode_t);
    case SHM_MSG_ABORT: return sizeof(uint32_t) + strnlen(m->abort.text, SHM_ABORT_TEXT_MAX);
    default: return sizeof(shm_desc_t);
    }
}

static void read_control(transport_conn_t *c, bool *progressed);

/* Queues a control message and tries to send what is queued. */
static void out_push(transport_conn_t *c, const shm_msg_t *m)
{
    if (c->nout == c->outcap) {
        int ncap = c->outcap ? c->outcap * 2 : 16;
        shm_msg_t *n = realloc(c->out, (size_t)ncap * sizeof(*n));
        if (n == NULL) {
            conn_fail(c, loomSystemError, "out of memory (control queue to %s)", c->head.name);
            return;
        }
        c->out = n;
        c->outcap = ncap;
    }
    c->out[c->nout++] = *m;
}

static void out_flush(transport_conn_t *c, bool *progressed)
{
    int k = 0;
    while (k < c->nout && !c->head.fail.failed) {
        ssize_t n = send_ctl(c, &c->out[k], msg_size(&c->out[k]));
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            /* The peer may have said why it left before closing: read that first. */
            int e = errno;
            if (c->reverse) {
                conn_rewind(c);
                return;
            }
            bool ignored = false;
            read_control(c, &ignored);
            if (c->eof) { /* it left: what it left in its ring decides (see eof) */
                c->nout = 0;
                return;
            }
            transport_conn_send_failed(&c->head, e);
            return;
        }
        k++;
        *progressed = true;
        /* Only what the peer sends proves it alive: our own messages do not count. */
        c->last_send_ns = base_coarse_ns();
    }
    if (k > 0) {
        memmove(c->out, c->out + k, (size_t)(c->nout - k) * sizeof(*c->out));
        c->nout -= k;
    }
}

/* ---- the ring of small messages ---- */

static size_t rec_bytes(size_t len)
{
    return SHM_REC_HDR + LOOM_ALIGN_UP(len, (size_t)64);
}

/* After publishing or consuming a record: a wake-up if the peer said it sleeps (once per
 * sleep: its armed count changes each time). */
static void ring_wake(transport_conn_t *c)
{
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t a =
        atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->armed, memory_order_relaxed);
    if (!(a & 1) || a == c->woken || c->eof) return;
    c->woken = a;
    /* Straight to the socket, whatever is queued there (a wake-up carries nothing to order);
     * a full socket already wakes the peer, and a closed one is found by the reads. */
    shm_msg_t m;
    memset(&m, 0, sizeof(shm_desc_t));
    m.type = SHM_MSG_WAKE;
    (void)send_ctl(c, &m, msg_size(&m));
}

/* Whether our ring has room for a record of len payload bytes (and the padding before it). */
static bool ring_room(const transport_conn_t *c, size_t len, size_t *pad)
{
    uint64_t tail =
        atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->tail, memory_order_acquire);
    size_t need = rec_bytes(len), off = (size_t)(c->ring_head % SHM_RING_BYTES);
    *pad = off + need > SHM_RING_BYTES ? SHM_RING_BYTES - off : 0;
    return c->ring_head + *pad + need - tail <= SHM_RING_BYTES;
}

/* Copies a send into our ring; false when it has no room yet. */
static bool ring_put(transport_conn_t *c, const transport_req_t *r)
{
    size_t pad;
    if (!ring_room(c, r->len, &pad)) return false;
    uint8_t *ring = c->my_bounce + SHM_CTRL_BYTES;
    if (pad) {
        shm_rec_t *p = (shm_rec_t *)(void *)(ring + c->ring_head % SHM_RING_BYTES);
        p->kind = SHM_REC_PAD;
        p->len = 0;
        c->ring_head += pad;
    }
    uint8_t *at = ring + c->ring_head % SHM_RING_BYTES;
    shm_rec_t *h = (shm_rec_t *)(void *)at;
    h->seq = r->seq;
    h->len = (uint32_t)r->len;
    h->kind = SHM_REC_MSG;
    memcpy(h->meta, r->meta, TRANSPORT_META_BYTES);
    if (r->len) memcpy(at + SHM_REC_HDR, r->buf, r->len);
    c->ring_head += rec_bytes(r->len);
    atomic_store_explicit(&my_ctrl(c)->head, c->ring_head, memory_order_release);
    ring_wake(c);
    return true;
}

/* The peer's next record, copied out of its segment (which the peer may rewrite: nothing is
 * read twice); *payload points at its bytes there. Skips padding; a record that does not fit
 * what the peer published fails the connection. */
static bool ring_peek(transport_conn_t *c, shm_rec_t *rec, const uint8_t **payload)
{
    if (c->peer_bounce == NULL) return false;
    uint64_t head =
        atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->head, memory_order_acquire);
    const uint8_t *ring = c->peer_bounce + SHM_CTRL_BYTES;
    while (c->ring_tail != head) {
        size_t off = (size_t)(c->ring_tail % SHM_RING_BYTES);
        memcpy(rec, ring + off, sizeof(*rec));
        if (rec->kind == SHM_REC_PAD && head - c->ring_tail >= SHM_RING_BYTES - off) {
            c->ring_tail += SHM_RING_BYTES - off;
            continue;
        }
        if (rec->kind != SHM_REC_MSG || rec->len > SHM_EAGER_MAX ||
            off + rec_bytes(rec->len) > SHM_RING_BYTES ||
            head - c->ring_tail < rec_bytes(rec->len) || head - c->ring_tail > SHM_RING_BYTES) {
            conn_fail(c, loomRemoteError,
                      "malformed ring record from %s at byte %llu (kind %u, %u bytes)",
                      c->head.name, (unsigned long long)c->ring_tail, rec->kind, rec->len);
            return false;
        }
        *payload = ring + off + SHM_REC_HDR;
        return true;
    }
    return false;
}

static void ring_consume(transport_conn_t *c, const shm_rec_t *rec)
{
    c->ring_tail += rec_bytes(rec->len);
    atomic_store_explicit(&my_ctrl(c)->tail, c->ring_tail, memory_order_release);
    c->head.last_activity_ns = base_coarse_ns();
    ring_wake(c); /* the peer may wait for room */
}

/* Whether the ring has something a progress pass can act on now: the record that the oldest
 * posted receive wants (or a pad or malformed record before it, which the pass skips or fails
 * on), or room for the small send at the head of our queue. A record that no receive asks for
 * yet (a message for a later step) is not: reporting it made every wait with an early message a
 * busy loop without a yield, which on shared cores kept the core from the rank it waited for. */
static bool ring_ready(transport_conn_t *c)
{
    if (c->state != CS_READY || c->peer_bounce == NULL) return false;
    uint64_t head =
        atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->head, memory_order_acquire);
    if (head != c->ring_tail && c->recv.head) {
        shm_rec_t rec;
        memcpy(&rec, c->peer_bounce + SHM_CTRL_BYTES + c->ring_tail % SHM_RING_BYTES, sizeof(rec));
        if (rec.kind != SHM_REC_MSG || rec.seq <= c->recv.head->seq) return true;
    }
    size_t pad;
    return c->wait.head && c->wait.head->len <= SHM_EAGER_MAX &&
           ring_room(c, c->wait.head->len, &pad);
}

/* Sends that were waiting for the mode decision, ring room or a free bounce slot. */
static void start_sends(transport_conn_t *c)
{
    while (c->wait.head && c->state == CS_READY && !c->head.fail.failed) {
        transport_req_t *r = c->wait.head;
        if (r->len <= SHM_EAGER_MAX) {
            if (!ring_put(c, r)) return;
            FIFO_DROP_HEAD(&c->wait);
            r->complete = true;
            c->head.pending--;
            continue;
        }
        shm_msg_t m;
        memset(&m, 0, sizeof(shm_desc_t));
        m.desc.type = SHM_MSG_DESC;
        m.desc.seq = r->seq;
        m.desc.len = r->len;
        memcpy(m.desc.meta, r->meta, TRANSPORT_META_BYTES);
        if (c->cma) {
            m.desc.slot = UINT32_MAX;
            m.desc.addr = (uint64_t)(uintptr_t)r->buf;
        } else {
            int s = -1;
            for (int i = 0; i < SHM_BOUNCE_SLOTS; i++)
                if (!c->slot_busy[i]) {
                    s = i;
                    break;
                }
            if (s < 0) return;
            if (r->len > c->ctx->slot_bytes) {
                conn_fail(c, loomInternalError,
                          "shm: message of %zu bytes to %s exceeds the %zu "
                          "byte bounce slot",
                          r->len, c->head.name, c->ctx->slot_bytes);
                return;
            }
            c->slot_busy[s] = true;
            r->slot = s;
            memcpy(c->my_bounce + SHM_BOUNCE_OFF + (size_t)s * c->ctx->slot_bytes, r->buf, r->len);
            m.desc.slot = (uint32_t)s;
        }
        FIFO_DROP_HEAD(&c->wait);
        FIFO_PUSH(&c->ack, r);
        out_push(c, &m);
    }
}

static loomResult_t shm_isend(transport_conn_t *c, const void *buf, size_t len,
                              const uint8_t meta[TRANSPORT_META_BYTES], transport_req_t **out)
{
    if (c->eof) eof_fail(c);
    LOOM_CHECK(conn_check(c));
    transport_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return base_error(loomSystemError, LOG_SHM, "out of memory (send request)");
    r->conn = c;
    r->send = true;
    r->buf = (uint8_t *)buf;
    r->len = len;
    r->seq = c->send_seq++;
    r->slot = -1;
    memcpy(r->meta, meta, TRANSPORT_META_BYTES);
    FIFO_PUSH(&c->wait, r);
    c->head.pending++;
    start_sends(c);
    /* The descriptor leaves now, not at the next progress pass: that pass may first copy a
     * slice in from another peer, and the receiver would wait for that copy. */
    bool ignored = false;
    if (c->nout) out_flush(c, &ignored);
    *out = r;
    return loomSuccess;
}

static loomResult_t shm_irecv(transport_conn_t *c, void *buf, size_t len, transport_req_t **out)
{
    LOOM_CHECK(conn_check(c));
    transport_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return base_error(loomSystemError, LOG_SHM, "out of memory (recv request)");
    r->conn = c;
    r->buf = buf;
    r->len = len;
    r->seq = c->recv_seq++;
    FIFO_PUSH(&c->recv, r);
    c->head.pending++;
    *out = r;
    return loomSuccess;
}

static loomResult_t shm_test(transport_req_t *r, int *done, uint8_t meta[TRANSPORT_META_BYTES])
{
    if (!r->complete) {
        *done = 0;
        return conn_check(r->conn);
    }
    loomResult_t res = transport_req_finish(&r->conn->head, r->bad_len, r->meta, done, meta);
    free(r);
    return res;
}

/* Copies a matched message into the receive buffer. */
static void deliver(transport_conn_t *c, transport_req_t *r, const shm_desc_t *d)
{
    if (d->len != r->len) {
        conn_fail(c, loomRemoteError,
                  "%s sent a message of %llu bytes where %zu were expected (message %llu): the "
                  "ranks disagree on the operation",
                  c->head.name, (unsigned long long)d->len, r->len, (unsigned long long)d->seq);
        /* Hand the metadata back so that the executor can name both operations. */
        memcpy(r->meta, d->meta, TRANSPORT_META_BYTES);
        r->bad_len = true;
        r->complete = true;
        c->head.pending--;
        return;
    }
    if (d->slot == UINT32_MAX) {
        /* Say which message we read, then look whether the sender withdrew it (its call ended
         * unfinished, and its buffer is its caller's again): one of us sees the other. */
        _Atomic uint64_t *reading = c->my_bounce ? &my_ctrl(c)->reading : NULL;
        if (reading && c->peer_bounce) {
            atomic_store_explicit(reading, d->seq + 1, memory_order_seq_cst);
            atomic_thread_fence(memory_order_seq_cst);
            uint64_t w = atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->withdrawn,
                                              memory_order_seq_cst);
            if (w > d->seq) {
                atomic_store_explicit(reading, 0, memory_order_release);
                conn_fail(c, loomRemoteError,
                          "%s withdrew message %llu (%zu bytes) before this rank read it: the "
                          "call that sent it ended unfinished there",
                          c->head.name, (unsigned long long)d->seq, r->len);
                FIFO_UNPOP(&c->recv, r); /* the connection's to free, with the rest */
                return;
            }
            if (c->ctx->read_stall_us) usleep(c->ctx->read_stall_us);
        }
        size_t done = 0;
        while (done < r->len) {
            struct iovec local = {r->buf + done, r->len - done};
            struct iovec remote = {(void *)(uintptr_t)(d->addr + done), r->len - done};
            ssize_t n = process_vm_readv(c->pid, &local, 1, &remote, 1, 0);
            if (n <= 0) {
                conn_fail(c, loomRemoteError,
                          "process_vm_readv from %s (pid %d, %zu bytes at 0x%llx) failed: %s",
                          c->head.name, (int)c->pid, r->len - done,
                          (unsigned long long)(d->addr + done),
                          n == 0 ? "no data" : strerror(errno));
                if (reading) atomic_store_explicit(reading, 0, memory_order_release);
                FIFO_UNPOP(&c->recv, r);
                return;
            }
            done += (size_t)n;
        }
        if (reading) {
            /* a withdrawal that stopped waiting for this read gave the buffer back meanwhile:
             * it said so before (its caller's later bytes come after that word) */
            atomic_thread_fence(memory_order_seq_cst);
            uint64_t ab = atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->abandoned,
                                               memory_order_seq_cst);
            atomic_store_explicit(reading, 0, memory_order_release);
            if (ab > d->seq) {
                conn_fail(c, loomRemoteError,
                          "%s gave the buffer of message %llu (%zu bytes) back to its caller "
                          "while this rank was still reading it (this rank was held up for "
                          "over %llu ms in the read): what was read is discarded",
                          c->head.name, (unsigned long long)d->seq, r->len,
                          (unsigned long long)(SHM_WITHDRAW_WAIT_NS / 1000000));
                FIFO_UNPOP(&c->recv, r);
                return;
            }
        }
    } else {
        if (d->slot >= SHM_BOUNCE_SLOTS || c->peer_bounce == NULL ||
            SHM_BOUNCE_OFF + (size_t)(d->slot + 1) * c->peer_slot_bytes > c->peer_bounce_len) {
            conn_fail(c, loomRemoteError, "malformed descriptor from %s: slot %u", c->head.name,
                      d->slot);
            FIFO_UNPOP(&c->recv, r);
            return;
        }
        memcpy(r->buf, c->peer_bounce + SHM_BOUNCE_OFF + (size_t)d->slot * c->peer_slot_bytes,
               r->len);
    }
    memcpy(r->meta, d->meta, TRANSPORT_META_BYTES);
    r->complete = true;
    c->head.pending--;
    shm_msg_t ack;
    memset(&ack, 0, sizeof(shm_desc_t));
    ack.desc.type = SHM_MSG_ACK;
    ack.desc.seq = d->seq;
    ack.desc.slot = d->slot;
    out_push(c, &ack);
    /* At once: the sender's step (and the buffer it may reuse) waits for it, and another
     * matched receive may be copied next. */
    bool ignored = false;
    out_flush(c, &ignored);
}

/* A small message: straight out of the peer's ring. */
static void deliver_rec(transport_conn_t *c, transport_req_t *r, const shm_rec_t *rec,
                        const uint8_t *payload)
{
    memcpy(r->meta, rec->meta, TRANSPORT_META_BYTES);
    if (rec->len != r->len) {
        conn_fail(c, loomRemoteError,
                  "%s sent a message of %u bytes where %zu were expected (message %llu): the "
                  "ranks disagree on the operation",
                  c->head.name, rec->len, r->len, (unsigned long long)rec->seq);
        r->bad_len = true;
    } else if (r->len) {
        memcpy(r->buf, payload, r->len);
    }
    r->complete = true;
    c->head.pending--;
    ring_consume(c, rec);
}

/* Receives are matched in the connection's one order: the next message is in the ring or among
 * the descriptors, whichever carries the sequence number the oldest receive has. */
static void match_recvs(transport_conn_t *c)
{
    while (c->recv.head && !c->head.fail.failed) {
        uint64_t want = c->recv.head->seq;
        shm_rec_t rec;
        const uint8_t *payload;
        bool in_ring = ring_peek(c, &rec, &payload);
        if (c->head.fail.failed) return;
        if (in_ring && rec.seq == want) {
            deliver_rec(c, FIFO_POP(&c->recv), &rec, payload);
            continue;
        }
        shm_pending_desc_t *pd = c->desc.head;
        if (pd && pd->d.seq == want) {
            transport_req_t *r = FIFO_POP(&c->recv);
            FIFO_DROP_HEAD(&c->desc);
            deliver(c, r, &pd->d);
            free(pd);
            continue;
        }
        if ((in_ring && rec.seq < want) || (pd && pd->d.seq < want))
            conn_fail(c, loomRemoteError, "%s sent message %llu out of order (expected %llu)",
                      c->head.name,
                      (unsigned long long)(in_ring && rec.seq < want ? rec.seq : pd->d.seq),
                      (unsigned long long)want);
        return;
    }
}

/* The peer's mode messages, handled as they arrive (both may come in one read):
 *   first:  its probe word and bounce segment (passed_fd) -> we probe it and answer;
 *   second: whether it could read our probe -> cross-memory attach iff both could. */
static void handle_mode(transport_conn_t *c, const shm_mode_t *m, int passed_fd)
{
    if (m->cma_ok == 0) {
        if (passed_fd >= 0) {
            size_t len = SHM_SEG_BYTES(m->slot_bytes);
            void *p = m->slot_bytes >= 4096 && m->slot_bytes <= (1ull << 40)
                          ? mmap(NULL, len, PROT_READ, MAP_SHARED, passed_fd, 0)
                          : MAP_FAILED;
            close(passed_fd);
            if (p == MAP_FAILED) {
                conn_fail(c, loomSystemError, "mmap of %s's bounce segment failed: %s",
                          c->head.name, strerror(errno));
                return;
            }
            c->peer_bounce = p;
            c->peer_bounce_len = len;
            c->peer_slot_bytes = m->slot_bytes;
        }
        uint64_t v = 0;
        struct iovec local = {&v, sizeof(v)};
        struct iovec remote = {(void *)(uintptr_t)m->probe_addr, sizeof(v)};
        bool ok = c->ctx->cma_wanted &&
                  process_vm_readv(c->pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof(v) &&
                  v == m->probe_value;
        if (!ok && c->ctx->cma_wanted)
            INFO(LOG_SHM, "shm: cross-memory attach to %s refused (%s); using bounce segments",
                 c->head.name, strerror(errno));
        c->cma = ok;
        shm_msg_t ans;
        memset(&ans, 0, sizeof(shm_mode_t));
        ans.mode.type = SHM_MSG_MODE;
        ans.mode.cma_ok = ok ? 1 : 2;
        out_push(c, &ans);
        c->mode_got = true;
        return;
    }
    if (passed_fd >= 0) close(passed_fd);
    if (!c->mode_got) {
        conn_fail(c, loomRemoteError, "malformed mode exchange from %s", c->head.name);
        return;
    }
    c->cma = c->cma && m->cma_ok == 1;
    c->state = CS_READY;
    c->reverse = false;
    c->reverse_at_ns = 0;
    c->head.last_activity_ns = base_coarse_ns();
    INFO(LOG_SHM, "shm: connected to %s, %s", c->head.name,
         c->cma ? "cross-memory attach (one copy)" : "bounce segments (two copies)");
}

static void read_control(transport_conn_t *c, bool *progressed)
{
    for (;;) {
        shm_msg_t m;
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {&m, sizeof(m)};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
        ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n == 0 && c->state == CS_READY) {
            c->eof = true;
            return;
        }
        if (n <= 0 && c->reverse) { /* refused by the peer, which dialled us */
            conn_rewind(c);
            return;
        }
        if (n <= 0) {
            transport_conn_recv_failed(&c->head, n, errno);
            return;
        }
        c->sock_read++;
        int passed_fd = -1;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
                memcpy(&passed_fd, CMSG_DATA(cm), sizeof(int));
        *progressed = true;
        c->head.last_activity_ns = base_coarse_ns();
        if ((size_t)n < sizeof(uint32_t)) {
            conn_fail(c, loomRemoteError, "malformed control message from %s (%zd bytes)",
                      c->head.name, n);
            return;
        }
        switch (m.type) {
        case SHM_MSG_DESC: {
            if ((size_t)n != sizeof(shm_desc_t) || m.desc.len > param_size(PARAM_MAX_MESSAGE)) {
                conn_fail(c, loomRemoteError, "malformed descriptor from %s", c->head.name);
                return;
            }
            shm_pending_desc_t *pd = malloc(sizeof(*pd));
            if (pd == NULL) {
                conn_fail(c, loomSystemError, "out of memory");
                return;
            }
            pd->d = m.desc;
            FIFO_PUSH(&c->desc, pd);
            break;
        }
        case SHM_MSG_ACK: {
            transport_req_t *r = c->ack.head;
            if (r == NULL || r->seq != m.desc.seq) {
                conn_fail(c, loomRemoteError, "unexpected acknowledgement %llu from %s",
                          (unsigned long long)m.desc.seq, c->head.name);
                return;
            }
            FIFO_DROP_HEAD(&c->ack);
            if (r->slot >= 0) c->slot_busy[r->slot] = false;
            r->complete = true;
            c->head.pending--;
            break;
        }
        case SHM_MSG_MODE:
            if ((size_t)n != sizeof(shm_mode_t)) {
                conn_fail(c, loomRemoteError, "malformed mode message from %s", c->head.name);
                return;
            }
            handle_mode(c, &m.mode, passed_fd);
            break;
        case SHM_MSG_PING: transport_peer_call_set(&c->head, m.desc.slot); break;
        case SHM_MSG_WAKE: break; /* the ring is looked at after every read */
        case SHM_MSG_ABORT:
            ((char *)&m)[LOOM_MIN((size_t)n, sizeof(m) - 1)] = '\0';
            if (c->state == CS_READY && !c->eof_why) {
                size_t len = strlen(c->head.name) + strlen(m.abort.text) + 16;
                c->eof_why = malloc(len);
                if (c->eof_why) {
                    snprintf(c->eof_why, len, "%s aborted: %s", c->head.name, m.abort.text);
                    c->eof = true;
                    return;
                }
            }
            conn_fail(c, loomRemoteError, "%s aborted: %s", c->head.name, m.abort.text);
            return;
        default:
            conn_fail(c, loomRemoteError, "malformed control message from %s: type %u",
                      c->head.name, m.type);
            return;
        }
    }
}

/* After the handshake: learn the peer's pid, offer a probe word and, for the fallback, a bounce
 * segment. */
static void mode_start(transport_conn_t *c)
{
    struct ucred cred;
    socklen_t l = sizeof(cred);
    int pc = getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &l);
    if (pc != 0 && c->reverse) { /* the peer refused our dial: it dials us */
        conn_rewind(c);
        return;
    }
    if (pc != 0) {
        conn_fail(c, loomSystemError, "SO_PEERCRED on the socket to %s failed: %s", c->head.name,
                  strerror(errno));
        return;
    }
    c->pid = cred.pid;
    char where[48];
    snprintf(where, sizeof(where), "pid %d, same node", (int)c->pid);
    transport_conn_name(&c->head, c->peer, where);
    size_t len = SHM_SEG_BYTES(c->ctx->slot_bytes);
    /* The segment is cheap until touched (pages are allocated on first write), so both sides
     * offer one, whatever LOOM_SHM_CMA says: which of them copies is only known once both probed
     * cross-memory attach. */
    int mfd = memfd_create("loom-shm-bounce", MFD_CLOEXEC);
    if (mfd >= 0 && ftruncate(mfd, (off_t)len) == 0) {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
        if (p != MAP_FAILED) {
            c->my_bounce = p;
            c->my_bounce_len = len;
        }
    }
    if (c->my_bounce == NULL) {
        conn_fail(c, loomSystemError, "memfd bounce segment of %zu bytes for %s: %s", len,
                  c->head.name, strerror(errno));
        if (mfd >= 0) close(mfd);
        return;
    }
    shm_mode_t m = {.type = SHM_MSG_MODE,
                    .probe_addr = (uint64_t)(uintptr_t)&c->probe,
                    .probe_value = c->probe,
                    .slot_bytes = c->ctx->slot_bytes};
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof(cbuf));
    struct iovec iov = {&m, sizeof(m)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
    /* The first message on a fresh socket: its buffer is empty, so it goes at once. */
    ssize_t n = send_counted(c, &mh, MSG_NOSIGNAL);
    close(mfd);
    if (n != (ssize_t)sizeof(m) && c->reverse) { /* the peer refused our dial: it dials us */
        conn_rewind(c);
        return;
    }
    if (n != (ssize_t)sizeof(m)) {
        conn_fail(c, loomRemoteError, "sending the mode message to %s failed: %s", c->head.name,
                  strerror(errno));
        return;
    }
    c->mode_sent = true;
    c->state = CS_MODE;
}

static void attach_accepted(void *arg, hs_t *hs)
{
    transport_ctx_t *ctx = arg;
    const hs_hello_t *h = &hs->hello;
    bool rev = false; /* a higher rank's dial: this rank was late to dial it (reverse_dial) */
    const char *why = transport_hello_refusal(&ctx->setup, h, &rev);
    transport_conn_t *c = NULL;
    if (!why) {
        c = ctx->conns[h->from_rank] ? ctx->conns[h->from_rank] : conn_new(ctx, h->from_rank);
        if (c == NULL) {
            why = "out of memory";
        } else if (c->fd >= 0 && !rev && c->reverse) {
            TRACE(LOG_SHM, "shm: %s dialled us while we dialled it: its socket replaces ours",
                  c->head.name);
            conn_rewind(c);
        } else if (c->fd >= 0 && rev && !c->reverse) {
            TRACE(LOG_SHM, "shm: %s dialled us while we dialled it: ours stands", c->head.name);
            close(hs->fd);
            return;
        } else if (c->fd >= 0) {
            why = "duplicate connection";
        }
    }
    if (why) {
        WARN(LOG_SHM, "shm: rank %d refused a local connection claiming rank %d: %s",
             ctx->setup.rank, h->from_rank, why);
        close(hs->fd);
        return;
    }
    c->fd = hs->fd;
    if (!rev) c->reverse_at_ns = 0; /* the lower rank dialled: no need to dial it */
    mode_start(c);
}

static void accept_progress(transport_ctx_t *ctx, bool *progressed)
{
    hs_pending_progress(&ctx->pend, ctx->listen_fd, ctx->setup.secret, LOG_SHM, ctx->who,
                        attach_accepted, ctx, progressed);
}

static loomResult_t shm_progress(transport_ctx_t *ctx, bool *progressed)
{
    if (ctx->abort.aborted) return loomSuccess;
    uint64_t now = base_coarse_ns();
    /* Data first, then the listener (see tcp_progress). Two passes: first every connection's
     * control messages (descriptors and acknowledgements in and out, which cost microseconds),
     * then the copies (a slice each, hundreds of microseconds). In one pass, a rank that copies
     * from the peer before it in the ring would hold back the descriptor its next peer waits for,
     * and how much depended on the order the connections were made in: a first small call made
     * them in another order and later large ring allreduces 1.4x slower. */
    bool want_accept = false;
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->state != CS_READY && !c->head.fail.failed) want_accept = true;
        if (c->reverse_at_ns && c->fd < 0 && !c->head.fail.failed && now >= c->reverse_at_ns) {
            c->reverse_at_ns = now + ctx->ping_ns;
            reverse_dial(c);
        }
        if (c->head.fail.failed || c->fd < 0) continue;
        if (c->my_bounce) { /* awake: the peer need not wake us (see shm_pollfds) */
            uint64_t a = atomic_load_explicit(&my_ctrl(c)->armed, memory_order_relaxed);
            if (a & 1) atomic_store_explicit(&my_ctrl(c)->armed, a + 1, memory_order_relaxed);
        }
        if (c->state == CS_HANDSHAKE && c->reverse) {
            if (hs_progress(&c->hs, progressed) != loomSuccess) {
                TRACE(LOG_SHM, "shm: dialling %s: %s (again later)", c->head.name, c->hs.err);
                conn_rewind(c);
                continue;
            }
            if (c->hs.state != HS_DONE) continue;
            mode_start(c);
        } else if (c->state == CS_HANDSHAKE) {
            if (transport_conn_handshake(&c->head, &c->hs, progressed) <= 0) continue;
            mode_start(c);
        }
        if (c->head.fail.failed || c->fd < 0) continue; /* (a refused dial of ours: rewound) */
        if (!c->eof && sock_news(c, now)) {
            c->last_read_ns = now;
            read_control(c, progressed);
        }
        if (c->state == CS_READY) start_sends(c);
        if (c->nout) out_flush(c, progressed);
    }
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->head.fail.failed || c->fd < 0) continue;
        if (c->state == CS_READY) {
            match_recvs(c);
            if (c->eof) {
                if (c->recv.head || c->wait.head || c->ack.head) eof_fail(c);
                continue;
            }
            if (c->nout == 0 && now - c->last_send_ns > ctx->ping_ns) {
                shm_msg_t m;
                memset(&m, 0, sizeof(shm_desc_t));
                m.type = SHM_MSG_PING;
                m.desc.slot = (uint32_t)transport_my_call(&ctx->setup);
                out_push(c, &m);
            }
        }
        if (c->nout) out_flush(c, progressed);
    }
    if (transport_accept_due(&ctx->next_accept_ns, want_accept)) accept_progress(ctx, progressed);
    return loomSuccess;
}

static int shm_pollfds(transport_ctx_t *ctx, struct pollfd *fds, int max)
{
    int n = 0;
    if (ctx->abort.aborted) return 0;
    for (int i = 0; i < ctx->nactive && n < max; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->head.fail.failed || c->fd < 0 || c->eof) continue;
        short ev = c->state == CS_HANDSHAKE ? hs_events(&c->hs) : POLLIN;
        if (c->nout) ev |= POLLOUT;
        if (c->state == CS_READY && c->my_bounce) {
            /* About to sleep: say so, then look at the ring once more (the peer publishes, then
             * looks at our word: one of us sees the other). Something there already: ask for
             * the socket's room, which poll() reports at once. */
            uint64_t a = atomic_load_explicit(&my_ctrl(c)->armed, memory_order_relaxed);
            if (!(a & 1)) atomic_store_explicit(&my_ctrl(c)->armed, a + 1, memory_order_seq_cst);
            atomic_thread_fence(memory_order_seq_cst);
            if (ring_ready(c)) ev |= POLLOUT;
        }
        atomic_store_explicit(&c->polled, true, memory_order_relaxed);
        fds[n++] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    if (n < max) fds[n++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
    n += hs_pending_pollfds(&ctx->pend, fds + n, max - n);
    return n;
}

static uint64_t shm_idle_ns(transport_conn_t *c, bool *pending)
{
    return transport_conn_idle_ns(&c->head, c->state != CS_READY, pending);
}

/* A round of the abort's grace: handshakes are what may still finish (the mode message that
 * follows goes at once). A handshake that fails is not waited for; the connection's error will be
 * the abort's. */
static bool abort_grace_step(void *arg, bool *prog)
{
    transport_ctx_t *ctx = arg;
    accept_progress(ctx, prog);
    bool busy = ctx->pend.n > 0;
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->head.fail.failed || c->fd < 0 || c->state != CS_HANDSHAKE) continue;
        if (hs_progress(&c->hs, prog) != loomSuccess) continue;
        if (c->hs.state == HS_DONE)
            mode_start(c);
        else
            busy = true;
    }
    return busy;
}

/* The call whose requests are queued here left unfinished (transport.h). Here: a connection
 * with a receive posted, a send not out yet, or a send waiting for its acknowledgement fails,
 * so that no progress pass copies into or out of the caller's buffers again. The peer may hold
 * the descriptor of a send it has not read yet, and would read the caller's buffer (freed or
 * reused by then) whenever its receive came: the withdrawal word in our segment withdraws every
 * message sent so far, and we wait until no read of the peer's is under way (bounded by
 * SHM_WITHDRAW_WAIT_NS: a peer stopped between its look at the word and its read. Past the
 * bound, the abandonment word says so before the caller gets the buffer back, and the peer's
 * read, which looks at that word after it copied, throws away what it got). Records in the ring
 * are the peer's already (their sends completed). */
static void shm_orphan(transport_ctx_t *ctx)
{
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (!c->recv.head && !c->wait.head && !c->ack.head) continue;
        if (c->ack.head && c->my_bounce && c->peer_bounce) {
            atomic_store_explicit(&my_ctrl(c)->withdrawn, c->send_seq, memory_order_seq_cst);
            atomic_thread_fence(memory_order_seq_cst);
            uint64_t t0 = base_now_ns();
            for (;;) {
                uint64_t rd = atomic_load_explicit((_Atomic uint64_t *)&peer_ctrl(c)->reading,
                                                   memory_order_seq_cst);
                if (rd == 0 || rd > c->send_seq) break;
                if (base_now_ns() - t0 > SHM_WITHDRAW_WAIT_NS) {
                    /* before the caller can touch the buffer: the peer's read checks it */
                    atomic_store_explicit(&my_ctrl(c)->abandoned, c->send_seq,
                                          memory_order_seq_cst);
                    atomic_thread_fence(memory_order_seq_cst);
                    WARN(LOG_SHM,
                         "shm: %s still reads message %llu of a call that ended unfinished "
                         "here after %llu ms; the caller gets its buffers back anyway (the "
                         "peer throws away what it reads of them)",
                         c->head.name, (unsigned long long)(rd - 1),
                         (unsigned long long)(SHM_WITHDRAW_WAIT_NS / 1000000));
                    break;
                }
                sched_yield();
            }
        }
        if (!c->head.fail.failed)
            conn_fail(c, loomRemoteError,
                      "the call with messages queued to %s ended unfinished; the connection is "
                      "not used again",
                      c->head.name);
    }
}

static void shm_abort(transport_ctx_t *ctx, const char *reason)
{
    if (ctx->abort.aborted) return;
    transport_abort_grace(abort_grace_step, ctx);
    transport_abort_set(&ctx->abort, reason);
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->fd < 0) continue;
        /* Also on a failed connection: its stream of control messages is intact. */
        if (c->state != CS_HANDSHAKE) {
            if (c->nout) {
                bool prog = false;
                out_flush(c, &prog);
            }
            shm_msg_t m;
            m.abort.type = SHM_MSG_ABORT;
            snprintf(m.abort.text, sizeof(m.abort.text), "%s", reason);
            (void)send_ctl(c, &m, msg_size(&m));
        }
        shutdown(c->fd, SHUT_RDWR);
    }
}

static void free_queue(transport_req_t *r)
{
    while (r) {
        transport_req_t *n = r->next;
        free(r);
        r = n;
    }
}

static void shm_fini(transport_ctx_t *ctx)
{
    if (ctx == NULL) return;
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->fd >= 0) {
            sock_drain_close(c->fd);
            c->fd = -1;
        }
        if (c->my_bounce) munmap(c->my_bounce, c->my_bounce_len);
        if (c->peer_bounce) munmap(c->peer_bounce, c->peer_bounce_len);
        free_queue(c->wait.head);
        free_queue(c->ack.head);
        free_queue(c->recv.head);
        for (shm_pending_desc_t *d = c->desc.head, *n; d; d = n) {
            n = d->next;
            free(d);
        }
        free(c->out);
        free(c->eof_why);
        free(c);
    }
    hs_pending_free(&ctx->pend);
    if (ctx->listen_fd >= 0) close(ctx->listen_fd);
    free(ctx->conns);
    free(ctx->active);
    free(ctx);
}

bool shm_conn_uses_cma(const transport_conn_t *c)
{
    return c->state == CS_READY && c->cma;
}

const transport_ops_t transport_shm = {
    .name = "shm",
    .caps = TRANSPORT_CAP_MSG,
    .reach = TRANSPORT_REACH_NODE,
    .mem_types = TRANSPORT_MEM_HOST,
    .bw_GBps = 6.0,
    .latency_us = 5.0,
    .init = shm_init,
    .connect = shm_connect,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .test = shm_test,
    .progress = shm_progress,
    .pollfds = shm_pollfds,
    .abort = shm_abort,
    .orphan = shm_orphan,
    .idle_ns = shm_idle_ns,
    .peer_name = transport_peer_name,
    .conn_error = transport_conn_error,
    .reg_mr = NULL,
    .fini = shm_fini,
};

int shm_conn_unsent(const transport_conn_t *c)
{
    return c->nout;
}
