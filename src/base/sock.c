/* Interface choice, non-blocking sockets and the authenticated handshake (see sock.h). */
#include "sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "base.h"
#include "param.h"

#define HS_MAGIC_CHALLENGE 0x4c4d4348u
#define HS_MAGIC_HELLO 0x4c4d4845u
#define HS_MAGIC_WELCOME 0x4c4d5745u
/* Version 2: libsodium MACs of 32 bytes (version 1 had 16-byte SipHash MACs). Checked in the
 * CHALLENGE, before any length depends on it, so a peer of another version is named as such. */
#define HS_VERSION 2u
#define HS_CHALLENGE_BYTES 24
#define HS_HELLO_FIELDS 32
#define HS_HELLO_BYTES (HS_HELLO_FIELDS + BASE_MAC_BYTES)
#define HS_WELCOME_BYTES (8 + BASE_MAC_BYTES)
/* Each message's MAC names its purpose and direction, so none can be replayed as another. */
#define HS_CTX_HELLO "loom-hs-v2 hello (connector to acceptor)"
#define HS_CTX_WELCOME "loom-hs-v2 welcome (acceptor to connector)"
/* The connector keeps its HELLO behind the WELCOME it receives, both in hs_t's buffer. */
_Static_assert(HS_WELCOME_BYTES + HS_HELLO_BYTES <= sizeof(((hs_t *)0)->buf), "handshake buffer");

const char *sock_addr_str(const sock_addr_t *a, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = "?";
    if (a->sa.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&a->sa;
        inet_ntop(AF_INET, &s->sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%d", host, ntohs(s->sin_port));
    } else if (a->sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&a->sa;
        inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof(host));
        if (s->sin6_scope_id) {
            char ifn[IF_NAMESIZE] = "";
            if (if_indextoname(s->sin6_scope_id, ifn))
                snprintf(host + strlen(host), sizeof(host) - strlen(host), "%%%s", ifn);
        }
        snprintf(buf, len, "[%s]:%d", host, ntohs(s->sin6_port));
    } else {
        snprintf(buf, len, "(no address)");
    }
    return buf;
}

int sock_addr_port(const sock_addr_t *a)
{
    if (a->sa.ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)&a->sa)->sin_port);
    if (a->sa.ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)&a->sa)->sin6_port);
    return -1;
}

void sock_addr_pack(const sock_addr_t *a, uint8_t out[32])
{
    memset(out, 0, 32);
    uint16_t fam = a->sa.ss_family == AF_INET6 ? 6 : 4;
    memcpy(out, &fam, 2);
    if (a->sa.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&a->sa;
        memcpy(out + 2, &s->sin_port, 2);
        memcpy(out + 4, &s->sin_addr, 4);
    } else {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&a->sa;
        memcpy(out + 2, &s->sin6_port, 2);
        memcpy(out + 4, &s->sin6_addr, 16);
        memcpy(out + 20, &s->sin6_scope_id, 4);
    }
}

bool sock_addr_unpack(const uint8_t in[32], sock_addr_t *a)
{
    uint16_t fam;
    memcpy(&fam, in, 2);
    memset(a, 0, sizeof(*a));
    if (fam == 4) {
        struct sockaddr_in *s = (struct sockaddr_in *)&a->sa;
        s->sin_family = AF_INET;
        memcpy(&s->sin_port, in + 2, 2);
        memcpy(&s->sin_addr, in + 4, 4);
        a->len = sizeof(*s);
        return true;
    }
    if (fam == 6) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&a->sa;
        s->sin6_family = AF_INET6;
        memcpy(&s->sin6_port, in + 2, 2);
        memcpy(&s->sin6_addr, in + 4, 16);
        memcpy(&s->sin6_scope_id, in + 20, 4);
        a->len = sizeof(*s);
        return true;
    }
    return false;
}

/* One entry of LOOM_SOCKET_IFNAME: "=eth0" exact, "eth" prefix. */
static bool ifname_matches(const char *name, const char *list, bool *excluded)
{
    bool exclude = list[0] == '^';
    if (exclude) list++;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    bool hit = false;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        bool exact = tok[0] == '=';
        if (exact) tok++;
        if (exact ? strcmp(name, tok) == 0 : strncmp(name, tok, strlen(tok)) == 0) hit = true;
    }
    *excluded = exclude;
    return exclude ? !hit : hit;
}

static int family_rank(int family, int want)
{
    if (want == 4) return family == AF_INET ? 0 : -1;
    if (want == 6) return family == AF_INET6 ? 0 : -1;
    return family == AF_INET ? 0 : family == AF_INET6 ? 1 : -1;
}

loomResult_t sock_pick_address_spec(const char *spec, int want_family, sock_addr_t *out,
                                    char *ifname, size_t ifname_len)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return base_error(loomSystemError, LOG_NET, "getifaddrs failed: %s", strerror(errno));
    /* Two passes for the default: first anything but loopback and docker bridges, then lo. */
    const struct ifaddrs *best = NULL;
    int best_rank = 1 << 30;
    char found[512] = "";
    for (int pass = 0; pass < 2 && best == NULL; pass++) {
        for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (i->ifa_addr == NULL || !(i->ifa_flags & IFF_UP)) continue;
            int fr = family_rank(i->ifa_addr->sa_family, want_family);
            if (fr < 0) continue;
            if (pass == 0 && !strstr(found, i->ifa_name) && strlen(found) + 20 < sizeof(found))
                snprintf(found + strlen(found), sizeof(found) - strlen(found), "%s%s",
                         found[0] ? ", " : "", i->ifa_name);
            bool excluded = false;
            if (spec && spec[0]) {
                if (pass == 1) continue;
                if (!ifname_matches(i->ifa_name, spec, &excluded)) continue;
            } else {
                bool lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
                bool docker = strncmp(i->ifa_name, "docker", 6) == 0;
                if (pass == 0 && (lo || docker)) continue;
                if (pass == 1 && !lo) continue;
            }
            int rank = fr;
            if (i->ifa_addr->sa_family == AF_INET6) {
                const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)i->ifa_addr;
                if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) rank += 2;
            }
            if (rank < best_rank) {
                best = i;
                best_rank = rank;
            }
        }
    }
    if (best == NULL) {
        loomResult_t r = base_error(
            loomInvalidUsage, LOG_NET,
            "no network interface matches LOOM_SOCKET_IFNAME='%s'%s%s; interfaces found: %s",
            spec ? spec : "", want_family ? " with LOOM_SOCKET_FAMILY=" : "",
            want_family == 4   ? "4"
            : want_family == 6 ? "6"
                               : "",
            found[0] ? found : "none");
        freeifaddrs(ifs);
        return r;
    }
    memset(out, 0, sizeof(*out));
    if (best->ifa_addr->sa_family == AF_INET) {
        memcpy(&out->sa, best->ifa_addr, sizeof(struct sockaddr_in));
        out->len = sizeof(struct sockaddr_in);
    } else {
        memcpy(&out->sa, best->ifa_addr, sizeof(struct sockaddr_in6));
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&out->sa;
        if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr))
            s6->sin6_scope_id = if_nametoindex(best->ifa_name);
        out->len = sizeof(struct sockaddr_in6);
    }
    if (ifname) snprintf(ifname, ifname_len, "%s", best->ifa_name);
    freeifaddrs(ifs);
    return loomSuccess;
}

loomResult_t sock_pick_address(sock_addr_t *out, char *ifname, size_t ifname_len)
{
    const char *fam = param_str(PARAM_SOCKET_FAMILY);
    int want = 0;
    if (fam[0]) {
        if (!strcmp(fam, "4") || !strcasecmp(fam, "AF_INET") || !strcasecmp(fam, "ipv4"))
            want = 4;
        else if (!strcmp(fam, "6") || !strcasecmp(fam, "AF_INET6") || !strcasecmp(fam, "ipv6"))
            want = 6;
        else
            return base_error(loomInvalidUsage, LOG_NET,
                              "LOOM_SOCKET_FAMILY='%s' is neither 4 nor 6", fam);
    }
    return sock_pick_address_spec(param_str(PARAM_SOCKET_IFNAME), want, out, ifname, ifname_len);
}

loomResult_t sock_listen(const sock_addr_t *addr, int backlog, int *fdp, sock_addr_t *bound)
{
    char as[SOCK_ADDR_STRLEN];
    int fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return base_error(loomSystemError, LOG_NET, "socket() for a listener failed: %s",
                          strerror(errno));
    sock_addr_t a = *addr;
    if (sock_addr_port(&a) != 0) {
        /* A well-known port (MASTER_PORT) may still hold connections of a previous job. */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (bind(fd, (struct sockaddr *)&a.sa, a.len) != 0) {
        int e = errno;
        close(fd);
        return base_error(loomSystemError, LOG_NET, "bind(%s) failed: %s",
                          sock_addr_str(&a, as, sizeof(as)), strerror(e));
    }
    if (listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        return base_error(loomSystemError, LOG_NET, "listen(%s) failed: %s",
                          sock_addr_str(&a, as, sizeof(as)), strerror(e));
    }
    bound->len = sizeof(bound->sa);
    if (getsockname(fd, (struct sockaddr *)&bound->sa, &bound->len) != 0) {
        int e = errno;
        close(fd);
        return base_error(loomSystemError, LOG_NET, "getsockname failed: %s", strerror(e));
    }
    *fdp = fd;
    return loomSuccess;
}

loomResult_t sock_connect_start(const sock_addr_t *addr, int *fdp)
{
    char as[SOCK_ADDR_STRLEN];
    int fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return base_error(loomSystemError, LOG_NET, "socket() to connect to %s failed: %s",
                          sock_addr_str(addr, as, sizeof(as)), strerror(errno));
    if (connect(fd, (const struct sockaddr *)&addr->sa, addr->len) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return base_error(loomRemoteError, LOG_NET, "connect(%s) failed: %s",
                          sock_addr_str(addr, as, sizeof(as)), strerror(e));
    }
    *fdp = fd;
    return loomSuccess;
}

int sock_connect_done(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int n = poll(&p, 1, 0);
    if (n == 0) return 0;
    int err = 0;
    socklen_t l = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) != 0) return -1;
    if (err != 0) {
        errno = err;
        return -1;
    }
    return (p.revents & POLLOUT) ? 1 : 0;
}

void sock_drain_close(int fd)
{
    char buf[16384];
    uint64_t end = base_now_ns() + 20000000ull;
    shutdown(fd, SHUT_WR);
    while (base_now_ns() < end) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        break;
    }
    close(fd);
}

void sock_tune(int fd, uint64_t bufsize)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (bufsize > 0) {
        int b = (int)LOOM_MIN(bufsize, (uint64_t)INT32_MAX);
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b));
    }
}

/* ---- handshake ---- */

static void put32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void hello_encode(const hs_hello_t *h, uint8_t out[HS_HELLO_BYTES])
{
    memset(out, 0, HS_HELLO_BYTES);
    put32(out, HS_MAGIC_HELLO);
    put32(out + 4, HS_VERSION);
    memcpy(out + 8, &h->comm_id, 8);
    memcpy(out + 16, &h->from_rank, 4);
    memcpy(out + 20, &h->to_rank, 4);
    put32(out + 24, h->chan);
    put32(out + 28, h->nchan);
}

static loomResult_t hs_mac(const hs_t *h, const char *context, const uint8_t *msg, size_t len,
                           uint8_t mac[BASE_MAC_BYTES])
{
    return base_mac(h->secret, context, h->nonce, sizeof(h->nonce), msg, len, mac);
}

static void hs_fail(hs_t *h, const char *fmt, ...) LOOM_PRINTF(2, 3);
static void hs_fail(hs_t *h, const char *fmt, ...)
{
    char as[SOCK_ADDR_STRLEN];
    int o = snprintf(h->err, sizeof(h->err), "%s: ", sock_addr_str(&h->peer, as, sizeof(as)));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->err + o, sizeof(h->err) - (size_t)o, fmt, ap);
    va_end(ap);
    h->state = HS_FAILED;
}

static uint64_t hs_deadline(void)
{
    return base_now_ns() + (uint64_t)(param_double(PARAM_HANDSHAKE_TIMEOUT) * 1e9);
}

/* The handshake moves on to the next message: `state` moves `len` bytes of h->buf. */
static void hs_next(hs_t *h, hs_state_t state, size_t len)
{
    h->state = state;
    h->len = len;
    h->done = 0;
}

void hs_connect_init(hs_t *h, int fd, const sock_addr_t *peer, const uint8_t secret[16],
                     const hs_hello_t *hello)
{
    memset(h, 0, sizeof(*h));
    h->fd = fd;
    h->peer = *peer;
    memcpy(h->secret, secret, 16);
    h->hello = *hello;
    h->state = HS_CONNECTING;
    h->deadline_ns = hs_deadline();
}

loomResult_t hs_accept_init(hs_t *h, int fd, const sock_addr_t *peer, const uint8_t secret[16])
{
    memset(h, 0, sizeof(*h));
    h->fd = fd;
    h->peer = *peer;
    h->acceptor = true;
    memcpy(h->secret, secret, 16);
    LOOM_CHECK(base_random(h->nonce, 16));
    put32(h->buf, HS_MAGIC_CHALLENGE);
    put32(h->buf + 4, HS_VERSION);
    memcpy(h->buf + 8, h->nonce, 16);
    hs_next(h, HS_SEND_CHALLENGE, HS_CHALLENGE_BYTES);
    h->start_ns = base_now_ns();
    h->deadline_ns = h->start_ns + (uint64_t)(param_double(PARAM_HANDSHAKE_TIMEOUT) * 1e9);
    return loomSuccess;
}

short hs_events(const hs_t *h)
{
    switch (h->state) {
    case HS_CONNECTING:
    case HS_SEND_CHALLENGE:
    case HS_SEND_HELLO:
    case HS_SEND_WELCOME: return POLLOUT;
    case HS_RECV_CHALLENGE:
    case HS_RECV_HELLO:
    case HS_RECV_WELCOME: return POLLIN;
    default: return 0;
    }
}

/* Moves bytes of the current message; returns 1 when it is complete, 0 if not yet, -1 on error. */
static int hs_io(hs_t *h, bool sending, bool *progressed)
{
    while (h->done < h->len) {
        ssize_t n = sending ? send(h->fd, h->buf + h->done, h->len - h->done, MSG_NOSIGNAL)
                            : recv(h->fd, h->buf + h->done, h->len - h->done, 0);
        if (n > 0) {
            h->done += (size_t)n;
            *progressed = true;
            continue;
        }
        if (n == 0) {
            hs_fail(h, "connection closed during the handshake");
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        hs_fail(h, "%s failed during the handshake: %s", sending ? "send" : "recv",
                strerror(errno));
        return -1;
    }
    return 1;
}

/* Whether a received message opens with `magic` and our version; else the peer is a stranger. */
static bool hs_magic_ok(hs_t *h, uint32_t magic, const char *what)
{
    if (get32(h->buf) == magic && get32(h->buf + 4) == HS_VERSION) return true;
    if (get32(h->buf) == magic) {
        hs_fail(h,
                "loom peer speaks handshake version %u, this build speaks %u (mixed loom "
                "versions in one job?)",
                get32(h->buf + 4), HS_VERSION);
        return false;
    }
    hs_fail(h, "not a loom peer (bad %s magic 0x%08x, version %u)", what, get32(h->buf),
            get32(h->buf + 4));
    return false;
}

loomResult_t hs_progress(hs_t *h, bool *progressed)
{
    for (;;) {
        int r;
        switch (h->state) {
        case HS_CONNECTING: {
            int c = sock_connect_done(h->fd);
            if (c < 0) {
                hs_fail(h, "connect failed: %s", strerror(errno));
                return loomRemoteError;
            }
            if (c == 0) goto pending;
            *progressed = true;
            hs_next(h, HS_RECV_CHALLENGE, HS_CHALLENGE_BYTES);
            continue;
        }
        case HS_SEND_CHALLENGE:
            if ((r = hs_io(h, true, progressed)) < 0) return loomRemoteError;
            if (r == 0) goto pending;
            hs_next(h, HS_RECV_HELLO, HS_HELLO_BYTES);
            continue;
        case HS_RECV_CHALLENGE:
            if ((r = hs_io(h, false, progressed)) < 0) return loomRemoteError;
            if (r == 0) goto pending;
            if (!hs_magic_ok(h, HS_MAGIC_CHALLENGE, "challenge")) return loomRemoteError;
            if (h->patient) { /* the listener spoke: from now on the handshake is timed */
                h->patient = false;
                h->deadline_ns = hs_deadline();
            }
            memcpy(h->nonce, h->buf + 8, 16);
            hello_encode(&h->hello, h->buf);
            if (hs_mac(h, HS_CTX_HELLO, h->buf, HS_HELLO_FIELDS, h->buf + HS_HELLO_FIELDS) !=
                loomSuccess) {
                hs_fail(h, "%s", base_last_error());
                return loomSystemError;
            }
            hs_next(h, HS_SEND_HELLO, HS_HELLO_BYTES);
            continue;
        case HS_SEND_HELLO:
            if ((r = hs_io(h, true, progressed)) < 0) return loomRemoteError;
            if (r == 0) goto pending;
            /* Keep the HELLO: the WELCOME's MAC covers it. */
            memmove(h->buf + HS_WELCOME_BYTES, h->buf, HS_HELLO_BYTES);
            hs_next(h, HS_RECV_WELCOME, HS_WELCOME_BYTES);
            continue;
        case HS_RECV_HELLO: {
            if ((r = hs_io(h, false, progressed)) < 0) return loomRemoteError;
            if (r == 0) goto pending;
            if (!hs_magic_ok(h, HS_MAGIC_HELLO, "hello")) return loomRemoteError;
            uint8_t mac[BASE_MAC_BYTES];
            if (hs_mac(h, HS_CTX_HELLO, h->buf, HS_HELLO_FIELDS, mac) != loomSuccess) {
                hs_fail(h, "%s", base_last_error());
                return loomSystemError;
            }
            if (!base_equal_ct(mac, h->buf + HS_HELLO_FIELDS, BASE_MAC_BYTES)) {
                hs_fail(h, "authentication failed (the peer does not know this job's secret)");
                return loomRemoteError;
            }
            memcpy(&h->hello.comm_id, h->buf + 8, 8);
            memcpy(&h->hello.from_rank, h->buf + 16, 4);
            memcpy(&h->hello.to_rank, h->buf + 20, 4);
            h->hello.chan = get32(h->buf + 24);
            h->hello.nchan = get32(h->buf + 28);
            uint8_t hello[HS_HELLO_BYTES];
            memcpy(hello, h->buf, HS_HELLO_BYTES);
            put32(h->buf, HS_MAGIC_WELCOME);
            put32(h->buf + 4, 0);
            if (hs_mac(h, HS_CTX_WELCOME, hello, HS_HELLO_BYTES, h->buf + 8) != loomSuccess) {
                hs_fail(h, "%s", base_last_error());
                return loomSystemError;
            }
            hs_next(h, HS_SEND_WELCOME, HS_WELCOME_BYTES);
            continue;
        }
        case HS_SEND_WELCOME:
            if ((r = hs_io(h, true, progressed)) < 0) return loomRemoteError;
            if (r == 0) goto pending;
            h->state = HS_DONE;
            return loomSuccess;
        case HS_RECV_WELCOME: {
            if ((r = hs_io(h, false, progressed)) < 0) return loomRemoteError;
            if (r == 0) goto pending;
            uint8_t mac[BASE_MAC_BYTES];
            if (hs_mac(h, HS_CTX_WELCOME, h->buf + HS_WELCOME_BYTES, HS_HELLO_BYTES, mac) !=
                loomSuccess) {
                hs_fail(h, "%s", base_last_error());
                return loomSystemError;
            }
            if (get32(h->buf) != HS_MAGIC_WELCOME ||
                !base_equal_ct(mac, h->buf + 8, BASE_MAC_BYTES)) {
                hs_fail(h, "the listener failed to prove this job's secret (wrong job, or a port "
                           "reused by another program)");
                return loomRemoteError;
            }
            h->state = HS_DONE;
            return loomSuccess;
        }
        case HS_DONE: return loomSuccess;
        case HS_FAILED: return loomRemoteError;
        }
    }
pending:
    /* A patient connector's peer has not said its first word: it may not have reached loom yet
     * (a rank still loading its model); the caller's liveness rule bounds that wait. The clock
     * starts with the first byte. */
    if (h->patient && h->state <= HS_RECV_CHALLENGE) {
        if (h->done == 0) return loomSuccess;
        h->patient = false;
        h->deadline_ns = hs_deadline();
    }
    if (base_now_ns() > h->deadline_ns) {
        hs_fail(h, "handshake not finished within LOOM_HANDSHAKE_TIMEOUT=%g s (state %d)",
                param_double(PARAM_HANDSHAKE_TIMEOUT), (int)h->state);
        return loomRemoteError;
    }
    return loomSuccess;
}

/* "1234567" -> "1,234,567" */
static void thousands(uint64_t v, char *buf, size_t len)
{
    char raw[32];
    int n = snprintf(raw, sizeof(raw), "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < len; i++) {
        if (i > 0 && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = '\0';
}

void hs_pending_report(hs_pending_t *p, log_subsys_t subsys, const char *who)
{
    if (p->refused > 1 || p->dropped > 0) {
        char n[32], d[64] = "";
        thousands(p->refused, n, sizeof(n));
        if (p->dropped) {
            char dn[32];
            thousands(p->dropped, dn, sizeof(dn));
            snprintf(d, sizeof(d), ", %s of them dropped to make room", dn);
        }
        double s = (double)(base_now_ns() - p->window_ns) * 1e-9;
        WARN(subsys, "%s refused %s connections from %s%s in the last %.0f s%s (last: %s)", who, n,
             p->refused_from, p->refused_many_hosts ? " and other addresses" : "", s < 1 ? 1 : s, d,
             p->last_cause);
    }
    p->refused = p->dropped = 0;
    p->refused_many_hosts = false;
    p->refused_from[0] = '\0';
    p->window_ns = base_now_ns();
}

/* The host part of an address, for counting refusals per peer. */
static void addr_host(const sock_addr_t *a, char *buf, size_t len)
{
    sock_addr_str(a, buf, len);
    char *colon = strrchr(buf, ':');
    if (colon && (a->sa.ss_family == AF_INET || (colon > buf && colon[-1] == ']'))) *colon = '\0';
    if (a->sa.ss_family == AF_INET6 && buf[0] == '[') {
        size_t l = strlen(buf);
        memmove(buf, buf + 1, l);
        if (l >= 2 && buf[l - 2] == ']') buf[l - 2] = '\0';
    }
}

static void pend_close(const hs_pending_t *p, int fd)
{
    if (p->close_fd)
        p->close_fd(fd);
    else
        close(fd);
}

/* A stranger refused (failed handshake) or dropped (no room): closed and counted. The first of
 * a window is logged in full; the rest only in the window's summary line. */
static void refuse(hs_pending_t *p, hs_t *h, bool dropped, log_subsys_t subsys, const char *who)
{
    uint64_t now = base_now_ns();
    if (p->window_ns == 0) p->window_ns = now;
    if (now - p->window_ns >= HS_REFUSE_LOG_NS) hs_pending_report(p, subsys, who);
    char host[SOCK_ADDR_STRLEN];
    addr_host(&h->peer, host, sizeof(host));
    if (p->refused_from[0] == '\0')
        snprintf(p->refused_from, sizeof(p->refused_from), "%s", host);
    else if (strcmp(p->refused_from, host) != 0)
        p->refused_many_hosts = true;
    if (dropped)
        snprintf(p->last_cause, sizeof(p->last_cause),
                 "%s: dropped, %d connections had not authenticated yet", host, HS_PENDING_MAX);
    else
        snprintf(p->last_cause, sizeof(p->last_cause), "%.150s", h->err);
    if (p->refused++ == 0) {
        if (dropped)
            WARN(subsys,
                 "%s dropped an incoming connection from %s: %d connections had not "
                 "authenticated yet (the oldest goes first)",
                 who, host, HS_PENDING_MAX);
        else
            WARN(subsys, "%s refused an incoming connection from %s", who, h->err);
    }
    p->dropped += dropped;
    pend_close(p, h->fd);
}

/* Drops the oldest pending handshake, if it had its grace time; false when none did. */
static bool drop_oldest(hs_pending_t *p, log_subsys_t subsys, const char *who)
{
    int old = -1;
    for (int i = 0; i < p->n; i++)
        if (old < 0 || p->hs[i].start_ns < p->hs[old].start_ns) old = i;
    if (old < 0 || base_now_ns() - p->hs[old].start_ns < HS_PENDING_GRACE_NS) return false;
    p->hs[old].err[0] = '\0';
    refuse(p, &p->hs[old], true, subsys, who);
    p->hs[old] = p->hs[--p->n];
    return true;
}

void hs_pending_progress(hs_pending_t *p, int listen_fd, const uint8_t secret[16],
                         log_subsys_t subsys, const char *who, void (*done)(void *arg, hs_t *hs),
                         void *arg, bool *progressed)
{
    /* First the handshakes under way, each only when its socket is ready or its time is up:
     * a few hundred idle strangers cost one poll(2), not a recv(2) each. */
    if (p->n > 0) {
        struct pollfd fds[HS_PENDING_MAX];
        int nf = hs_pending_pollfds(p, fds, HS_PENDING_MAX);
        if (poll(fds, (nfds_t)nf, 0) < 0) nf = 0;
        uint64_t now = base_now_ns();
        /* Walk backwards: a finished or failed entry takes the last one's place. */
        for (int i = p->n - 1; i >= 0; i--) {
            hs_t *h = &p->hs[i];
            bool ready = i < nf && fds[i].revents != 0;
            if (!ready && h->state != HS_DONE && now <= h->deadline_ns) continue;
            if (hs_progress(h, progressed) != loomSuccess) {
                refuse(p, h, false, subsys, who);
                p->hs[i] = p->hs[--p->n];
            } else if (h->state == HS_DONE) {
                hs_t fin = *h;
                p->hs[i] = p->hs[--p->n];
                done(arg, &fin);
            }
        }
    }
    if (p->window_ns && (p->refused > 1 || p->dropped) &&
        base_now_ns() - p->window_ns >= HS_REFUSE_LOG_NS)
        hs_pending_report(p, subsys, who);
    for (;;) {
        /* No room: the oldest stranger goes, once it had its chance; else the rest wait in the
         * kernel's backlog for the next round. */
        if (p->n >= HS_PENDING_MAX && !drop_oldest(p, subsys, who)) break;
        sock_addr_t peer;
        memset(&peer, 0, sizeof(peer));
        peer.len = sizeof(peer.sa);
        int fd = p->accept_fd ? p->accept_fd(listen_fd, &peer)
                              : accept4(listen_fd, (struct sockaddr *)&peer.sa, &peer.len,
                                        SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            /* EMFILE and the like: the connection waits in the backlog for a later try. */
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                WARN(subsys, "%s: accept failed: %s%s", who, strerror(errno),
                     errno == EMFILE || errno == ENFILE ? " (raise the open-file limit)" : "");
            break;
        }
        *progressed = true;
        if (p->n == p->cap) {
            int ncap = p->cap ? p->cap * 2 : 8;
            hs_t *n = realloc(p->hs, (size_t)ncap * sizeof(*n));
            if (n == NULL) {
                pend_close(p, fd);
                continue;
            }
            p->hs = n;
            p->cap = ncap;
        }
        hs_t *h = &p->hs[p->n];
        if (hs_accept_init(h, fd, &peer, secret) != loomSuccess) {
            pend_close(p, fd);
            continue;
        }
        /* The challenge goes at once (an empty socket takes it); a quick peer may even have
         * finished already. */
        if (hs_progress(h, progressed) != loomSuccess) {
            refuse(p, h, false, subsys, who);
            continue;
        }
        if (h->state == HS_DONE) {
            hs_t fin = *h;
            done(arg, &fin);
            continue;
        }
        p->n++;
    }
}

int hs_pending_pollfds(const hs_pending_t *p, struct pollfd *fds, int max)
{
    int n = 0;
    for (int i = 0; i < p->n && n < max; i++)
        fds[n++] = (struct pollfd){.fd = p->hs[i].fd, .events = hs_events(&p->hs[i])};
    return n;
}

void hs_pending_free(hs_pending_t *p)
{
    for (int i = 0; i < p->n; i++)
        pend_close(p, p->hs[i].fd);
    free(p->hs);
    int (*acc)(int, sock_addr_t *) = p->accept_fd;
    void (*cls)(int) = p->close_fd;
    memset(p, 0, sizeof(*p));
    p->accept_fd = acc, p->close_fd = cls;
}

loomResult_t hs_run_blocking(hs_t *h)
{
    while (h->state != HS_DONE) {
        bool prog = false;
        loomResult_t r = hs_progress(h, &prog);
        if (r != loomSuccess) return r;
        if (h->state == HS_DONE) break;
        if (!prog) {
            struct pollfd p = {.fd = h->fd, .events = hs_events(h)};
            poll(&p, 1, 50);
        }
    }
    return loomSuccess;
}

static loomResult_t sock_io_all(int fd, void *buf, size_t len, uint64_t deadline_ns,
                                const char *what, bool sending)
{
    uint8_t *p = buf;
    size_t done = 0;
    while (done < len) {
        ssize_t n = sending ? send(fd, p + done, len - done, MSG_NOSIGNAL)
                            : recv(fd, p + done, len - done, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n == 0)
            return base_error(loomRemoteError, LOG_BOOT, "%s: connection closed by the peer", what);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return base_error(loomRemoteError, LOG_BOOT, "%s: %s failed: %s", what,
                              sending ? "send" : "recv", strerror(errno));
        uint64_t now = base_now_ns();
        if (now >= deadline_ns)
            return base_error(loomRemoteError, LOG_BOOT, "%s: timed out (LOOM_TIMEOUT=%g s)", what,
                              param_double(PARAM_TIMEOUT));
        struct pollfd pf = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        int ms = (int)LOOM_MIN((deadline_ns - now) / 1000000 + 1, 100);
        poll(&pf, 1, ms);
    }
    return loomSuccess;
}

loomResult_t sock_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns,
                           const char *what)
{
    return sock_io_all(fd, (void *)buf, len, deadline_ns, what, true);
}

loomResult_t sock_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns, const char *what)
{
    return sock_io_all(fd, buf, len, deadline_ns, what, false);
}

/* ---- authenticated messages after the handshake ---- */

_Atomic int sock_auth_tamper_nth;

loomResult_t sock_auth_start(sock_auth_t *a, const hs_t *hs, uint64_t deadline_ns)
{
    /* The transcript: the acceptor's challenge, the connector's hello, and a nonce of the
     * connector's (the handshake's only random input is the acceptor's: without one of its own,
     * a connector could be fed a recorded session's challenge, welcome and messages). */
    uint8_t t[16 + sizeof(hs_hello_t) + 16], k[BASE_MAC_BYTES];
    memcpy(t, hs->nonce, 16);
    memcpy(t + 16, &hs->hello, sizeof(hs_hello_t));
    uint8_t *nc = t + 16 + sizeof(hs_hello_t);
    if (hs->acceptor) {
        LOOM_CHECK(sock_recv_all(hs->fd, nc, 16, deadline_ns, "the peer's message nonce"));
    } else {
        LOOM_CHECK(base_random(nc, 16));
        LOOM_CHECK(sock_send_all(hs->fd, nc, 16, deadline_ns, "this side's message nonce"));
    }
    memset(a, 0, sizeof(*a));
    LOOM_CHECK(
        base_mac(hs->secret, "loom message key: connector to acceptor", t, sizeof(t), NULL, 0, k));
    memcpy(hs->acceptor ? a->rx : a->tx, k, BASE_KEY_BYTES);
    LOOM_CHECK(
        base_mac(hs->secret, "loom message key: acceptor to connector", t, sizeof(t), NULL, 0, k));
    memcpy(hs->acceptor ? a->tx : a->rx, k, BASE_KEY_BYTES);
    sodium_memzero(k, sizeof(k));
    return loomSuccess;
}

static void auth_mac(const uint8_t key[BASE_KEY_BYTES], uint64_t n, const void *m, size_t len,
                     const void *m2, size_t len2, uint8_t tag[SOCK_AUTH_TAG])
{
    /* base_mac takes two pieces: the number and the first, then the second */
    uint8_t head[8 + 8];
    uint64_t l = (uint64_t)len;
    memcpy(head, &n, 8);
    memcpy(head + 8, &l, 8); /* where m ends and m2 begins is part of what is signed */
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, BASE_KEY_BYTES, SOCK_AUTH_TAG);
    static const char ctx[] = "loom message";
    crypto_generichash_update(&st, (const unsigned char *)ctx, sizeof(ctx));
    crypto_generichash_update(&st, head, sizeof(head));
    if (len) crypto_generichash_update(&st, m, len);
    if (len2) crypto_generichash_update(&st, m2, len2);
    crypto_generichash_final(&st, tag, SOCK_AUTH_TAG);
    sodium_memzero(&st, sizeof(st));
}

void sock_auth_tag(sock_auth_t *a, const void *m, size_t len, const void *m2, size_t len2,
                   uint8_t tag[SOCK_AUTH_TAG])
{
    auth_mac(a->tx, a->ntx++, m, len, m2, len2, tag);
    if (atomic_load(&sock_auth_tamper_nth) > 0 && atomic_fetch_sub(&sock_auth_tamper_nth, 1) == 1)
        tag[0] ^= 0x01;
}

bool sock_auth_check(sock_auth_t *a, const void *m, size_t len, const void *m2, size_t len2,
                     const uint8_t tag[SOCK_AUTH_TAG])
{
    uint8_t want[SOCK_AUTH_TAG];
    auth_mac(a->rx, a->nrx, m, len, m2, len2, want);
    bool ok = base_equal_ct(want, tag, SOCK_AUTH_TAG);
    if (ok) a->nrx++;
    return ok;
}

loomResult_t sock_send_auth(int fd, sock_auth_t *a, const void *buf, size_t len,
                            uint64_t deadline_ns, const char *what)
{
    uint8_t tag[SOCK_AUTH_TAG];
    sock_auth_tag(a, buf, len, NULL, 0, tag);
    LOOM_CHECK(sock_send_all(fd, buf, len, deadline_ns, what));
    return sock_send_all(fd, tag, sizeof(tag), deadline_ns, what);
}

loomResult_t sock_recv_auth(int fd, sock_auth_t *a, void *buf, size_t len, uint64_t deadline_ns,
                            const char *what)
{
    uint8_t tag[SOCK_AUTH_TAG];
    LOOM_CHECK(sock_recv_all(fd, buf, len, deadline_ns, what));
    LOOM_CHECK(sock_recv_all(fd, tag, sizeof(tag), deadline_ns, what));
    if (!sock_auth_check(a, buf, len, NULL, 0, tag))
        return base_error(loomRemoteError, LOG_BOOT,
                          "%s: message %llu failed authentication (changed on the way, or "
                          "injected by someone without the job's secret); connection refused",
                          what, (unsigned long long)a->nrx);
    return loomSuccess;
}
