/*
 * Network-level tests: interface selection (LOOM_SOCKET_IFNAME), IPv6, listeners bound to the
 * chosen address only, the authenticated handshake as a unit, and several sockets per peer.
 * Loopback only. Ranks are threads of this process.
 *
 * Rank bodies never call ck_assert (Check's failure path is not meant for other threads); they
 * print what went wrong and return non-zero.
 */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "comm.h"
#include "harness.h"
#include "param.h"
#include "sock.h"

#define RCHECK(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__,        \
                    #cond);                                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            rc = 1;                                                                                \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

#define RCALL(call)                                                                                \
    do {                                                                                           \
        loomResult_t r_ = (call);                                                                  \
        RCHECK(r_ == loomSuccess, "%s returned %d (%s): %s", #call, (int)r_,                       \
               loomGetErrorString(r_), loomGetLastError(NULL));                                    \
    } while (0)

/* Changes a parameter for the rest of this test (each test runs in its own process unless
 * CK_FORK=no, so tests restore what they change anyway). */
static void set_param(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    param_reset_cache();
}

/* ---- A barrier that gives up, so that a failed rank cannot wedge the others ---------------- */

typedef struct {
    pthread_mutex_t m;
    pthread_cond_t c;
    int n, count;
    unsigned gen;
} tbar_t;

static void tbar_init(tbar_t *b, int n)
{
    pthread_mutex_init(&b->m, NULL);
    pthread_cond_init(&b->c, NULL);
    b->n = n;
    b->count = 0;
    b->gen = 0;
}

static int tbar_wait(tbar_t *b)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 30;
    pthread_mutex_lock(&b->m);
    unsigned g = b->gen;
    if (++b->count == b->n) {
        b->count = 0;
        b->gen++;
        pthread_cond_broadcast(&b->c);
        pthread_mutex_unlock(&b->m);
        return 0;
    }
    int e = 0;
    while (g == b->gen && e != ETIMEDOUT)
        e = pthread_cond_timedwait(&b->c, &b->m, &dl);
    int ok = g != b->gen;
    pthread_mutex_unlock(&b->m);
    return ok ? 0 : -1;
}

/* ---- A runner whose ranks make their own communicators, from a given unique id ------------ */

typedef int (*raw_fn)(const loomUniqueId *id, int rank, int nranks, void *arg);

typedef struct {
    const loomUniqueId *id;
    int rank, nranks;
    raw_fn fn;
    void *arg;
    int rc;
} raw_rank_t;

static void *raw_main(void *p)
{
    raw_rank_t *t = p;
    t->rc = t->fn(t->id, t->rank, t->nranks, t->arg);
    return NULL;
}

static int run_raw(int nranks, const loomUniqueId *id, raw_fn fn, void *arg)
{
    raw_rank_t t[16];
    pthread_t th[16];
    for (int r = 0; r < nranks; r++) {
        t[r] = (raw_rank_t){.id = id, .rank = r, .nranks = nranks, .fn = fn, .arg = arg};
        pthread_create(&th[r], NULL, raw_main, &t[r]);
    }
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        pthread_join(th[r], NULL);
        if (t[r].rc) bad++;
    }
    return bad;
}

/* ---- What this machine has ---------------------------------------------------------------- */

static bool has_ipv6_loopback(void)
{
    struct ifaddrs *ifs = NULL;
    bool found = false;
    if (getifaddrs(&ifs) != 0) return false;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || i->ifa_addr->sa_family != AF_INET6)
            continue;
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)i->ifa_addr;
        if (strcmp(i->ifa_name, "lo") == 0 && IN6_IS_ADDR_LOOPBACK(&s->sin6_addr)) found = true;
    }
    freeifaddrs(ifs);
    return found;
}

/* An up interface with an IPv4/IPv6 address whose name does not start with "lo" (what "^lo"
 * may pick). */
static bool has_non_lo_interface(void)
{
    struct ifaddrs *ifs = NULL;
    bool found = false;
    if (getifaddrs(&ifs) != 0) return false;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
        int f = i->ifa_addr->sa_family;
        if ((f == AF_INET || f == AF_INET6) && strncmp(i->ifa_name, "lo", 2) != 0) found = true;
    }
    freeifaddrs(ifs);
    return found;
}

/* A non-loopback IPv4 address of this machine, to show that a listener on 127.0.0.1 does not
 * answer there. */
static bool other_ipv4(struct in_addr *out)
{
    struct ifaddrs *ifs = NULL;
    bool found = false;
    if (getifaddrs(&ifs) != 0) return false;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
        if (!i->ifa_addr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        if (i->ifa_addr->sa_family != AF_INET) continue;
        *out = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr;
        found = true;
    }
    freeifaddrs(ifs);
    return found;
}

/* 1 when a TCP connection to addr:port is accepted by the kernel within 2 s, else 0. */
static int can_connect_v4(struct in_addr addr, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = addr};
    int ok = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        ok = 1;
    } else if (errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 2000) == 1) {
            int err = 0;
            socklen_t l = sizeof(err);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
            ok = err == 0;
        }
    }
    close(fd);
    return ok;
}

static bool is_v4(const sock_addr_t *a, uint32_t host_order_addr)
{
    const struct sockaddr_in *s = (const struct sockaddr_in *)&a->sa;
    return a->sa.ss_family == AF_INET && s->sin_addr.s_addr == htonl(host_order_addr);
}

static bool is_v6_loopback(const sock_addr_t *a)
{
    const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&a->sa;
    return a->sa.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
}

/* ---- 1. LOOM_SOCKET_IFNAME ---------------------------------------------------------------- */

START_TEST(test_ifname)
{
    sock_addr_t a;
    char ifn[64];

    /* A prefix that names lo. */
    ck_assert_int_eq(sock_pick_address_spec("lo", 0, &a, ifn, sizeof(ifn)), loomSuccess);
    ck_assert_str_eq(ifn, "lo");
    ck_assert_msg(is_v4(&a, INADDR_LOOPBACK) || is_v6_loopback(&a), "lo gave a non-loopback");
    ck_assert_int_eq(sock_pick_address_spec("lo", 4, &a, ifn, sizeof(ifn)), loomSuccess);
    ck_assert_str_eq(ifn, "lo");
    ck_assert(is_v4(&a, INADDR_LOOPBACK));
    if (has_ipv6_loopback()) {
        ck_assert_int_eq(sock_pick_address_spec("lo", 6, &a, ifn, sizeof(ifn)), loomSuccess);
        ck_assert_str_eq(ifn, "lo");
        ck_assert(is_v6_loopback(&a));
    }

    /* Exact names: "=lo" is lo, "=l" is nothing (no prefix match). */
    ck_assert_int_eq(sock_pick_address_spec("=lo", 0, &a, ifn, sizeof(ifn)), loomSuccess);
    ck_assert_str_eq(ifn, "lo");
    ck_assert_int_eq(sock_pick_address_spec("=l", 0, &a, ifn, sizeof(ifn)), loomInvalidUsage);

    /* A list: the entry that matches wins. */
    ck_assert_int_eq(sock_pick_address_spec("nosuchif,=lo", 4, &a, ifn, sizeof(ifn)), loomSuccess);
    ck_assert_str_eq(ifn, "lo");

    /* Exclusion. */
    strcpy(ifn, "unset");
    loomResult_t r = sock_pick_address_spec("^lo", 0, &a, ifn, sizeof(ifn));
    if (has_non_lo_interface()) {
        ck_assert_msg(r == loomSuccess, "'^lo' found nothing: %s", base_last_error());
        ck_assert_msg(strncmp(ifn, "lo", 2) != 0, "'^lo' picked %s", ifn);
        ck_assert(!is_v4(&a, INADDR_LOOPBACK) && !is_v6_loopback(&a));
    } else {
        ck_assert_int_eq(r, loomInvalidUsage);
    }

    /* Nothing matches: invalid usage, with a text that lists what exists. */
    ck_assert_int_eq(sock_pick_address_spec("nosuchif", 0, &a, ifn, sizeof(ifn)), loomInvalidUsage);
    const char *e = base_last_error();
    ck_assert_msg(strstr(e, "nosuchif") != NULL, "error does not name the spec: '%s'", e);
    ck_assert_msg(strstr(e, "lo") != NULL, "error does not list lo: '%s'", e);
    ck_assert_str_eq(loomGetLastError(NULL), e);
    ck_assert_msg(strstr(loomGetLastError(NULL), "interfaces found") != NULL, "'%s'",
                  loomGetLastError(NULL));

    /* The same through the environment, as loomGetUniqueId reads it. */
    set_param("LOOM_SOCKET_IFNAME", "nosuchif");
    loomUniqueId id;
    ck_assert_int_eq(loomGetUniqueId(&id), loomInvalidUsage);
    ck_assert_msg(strstr(loomGetLastError(NULL), "lo") != NULL, "'%s'", loomGetLastError(NULL));
    set_param("LOOM_SOCKET_IFNAME", "lo");
}
END_TEST

/* ---- 2. IPv6 ------------------------------------------------------------------------------- */

static int ipv6_rank(const loomUniqueId *id, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0;
    loomComm_t comm = NULL;
    enum { N = 100003 };
    double *in = malloc(N * sizeof(double)), *out = malloc(N * sizeof(double));
    RCHECK(in && out, "out of memory");
    RCALL(loomCommInitRank(&comm, nranks, *id, rank));
    for (int q = 0; q < nranks; q++) {
        sock_addr_t a;
        char as[SOCK_ADDR_STRLEN];
        RCHECK(sock_addr_unpack(comm->lay.peers[q].handle[TP_TCP], &a),
               "rank %d's handle is not an address", q);
        RCHECK(a.sa.ss_family == AF_INET6, "rank %d listens on %s, not IPv6", q,
               sock_addr_str(&a, as, sizeof(as)));
        RCHECK(is_v6_loopback(&a), "rank %d listens on %s, not ::1", q,
               sock_addr_str(&a, as, sizeof(as)));
        RCHECK(sock_addr_port(&a) > 0, "rank %d: port 0", q);
    }
    for (int i = 0; i < N; i++)
        in[i] = (double)(rank * 1000003 + i);
    RCALL(loomAllReduce(in, out, N, loomDouble, loomSum, comm, NULL));
    for (int i = 0; i < N; i++) {
        double want = 1000003.0 * (nranks * (nranks - 1) / 2) + (double)nranks * i;
        RCHECK(out[i] == want, "[%d] = %.17g, expected %.17g", i, out[i], want);
    }
out:
    if (comm) loomCommDestroy(comm);
    free(in);
    free(out);
    return rc;
}

START_TEST(test_ipv6)
{
    if (!has_ipv6_loopback()) {
        fprintf(stderr, "test_ipv6: no ::1 on lo here; skipped\n");
        return;
    }
    set_param("LOOM_SOCKET_FAMILY", "6");
    loomUniqueId id;
    ck_assert_msg(loomGetUniqueId(&id) == loomSuccess, "%s", loomGetLastError(NULL));
    uid_layout_t u;
    memcpy(&u, &id, sizeof(u));
    sock_addr_t root;
    ck_assert(sock_addr_unpack(u.root_addr, &root));
    ck_assert_msg(is_v6_loopback(&root), "the bootstrap root is not on ::1");
    ck_assert_int_eq(run_raw(3, &id, ipv6_rank, NULL), 0);
    set_param("LOOM_SOCKET_FAMILY", NULL);
}
END_TEST

/* ---- 3. listeners bind to the chosen address only ------------------------------------------ */

typedef struct {
    bool have_other;
    struct in_addr other;
} bind_arg_t;

static int bind_rank(const loomUniqueId *id, int rank, int nranks, void *arg)
{
    const bind_arg_t *b = arg;
    int rc = 0;
    loomComm_t comm = NULL;
    char as[SOCK_ADDR_STRLEN];
    RCALL(loomCommInitRank(&comm, nranks, *id, rank));
    for (int q = 0; q < nranks; q++) {
        sock_addr_t a;
        RCHECK(sock_addr_unpack(comm->lay.peers[q].handle[TP_TCP], &a), "rank %d: no address", q);
        RCHECK(is_v4(&a, INADDR_LOOPBACK), "rank %d's data listener is %s, not 127.0.0.1", q,
               sock_addr_str(&a, as, sizeof(as)));
        RCHECK(sock_addr_port(&a) > 0, "rank %d: port 0", q);
    }
    sock_addr_t mine;
    sock_addr_unpack(comm->lay.peers[rank].handle[TP_TCP], &mine);
    /* A wildcard bind would answer on every address of the machine. */
    if (b->have_other)
        RCHECK(!can_connect_v4(b->other, sock_addr_port(&mine)),
               "the data listener of rank %d answers on another interface's address", rank);
    int32_t one = 1, n = 0;
    RCALL(loomAllReduce(&one, &n, 1, loomInt32, loomSum, comm, NULL));
    RCHECK(n == nranks, "sum %d", n);
out:
    if (comm) loomCommDestroy(comm);
    return rc;
}

START_TEST(test_bind_address)
{
    set_param("LOOM_SOCKET_IFNAME", "lo");
    set_param("LOOM_SOCKET_FAMILY", NULL);
    bind_arg_t b = {0};
    b.have_other = other_ipv4(&b.other);
    loomUniqueId id;
    ck_assert_msg(loomGetUniqueId(&id) == loomSuccess, "%s", loomGetLastError(NULL));
    uid_layout_t u;
    memcpy(&u, &id, sizeof(u));
    sock_addr_t root;
    char as[SOCK_ADDR_STRLEN];
    ck_assert(sock_addr_unpack(u.root_addr, &root));
    ck_assert_msg(is_v4(&root, INADDR_LOOPBACK), "the bootstrap root listens on %s",
                  sock_addr_str(&root, as, sizeof(as)));
    ck_assert_int_gt(sock_addr_port(&root), 0);
    /* The root answers on 127.0.0.1 (it is live) but not on the machine's other address. The
     * probe connection closes without a handshake, which the root logs and drops. */
    struct in_addr lo4 = {.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_msg(can_connect_v4(lo4, sock_addr_port(&root)), "the root does not answer");
    if (b.have_other)
        ck_assert_msg(!can_connect_v4(b.other, sock_addr_port(&root)),
                      "the bootstrap root answers on another interface's address");
    else
        fprintf(stderr, "test_bind_address: no non-loopback IPv4 address; connect probe "
                        "skipped\n");
    ck_assert_int_eq(run_raw(3, &id, bind_rank, &b), 0);
}
END_TEST

/* ---- 4. the handshake ---------------------------------------------------------------------- */

/* The wire constants of sock.c (private there): a fake peer has to speak them. */
#define T_MAGIC_CHALLENGE 0x4c4d4348u
#define T_MAGIC_WELCOME 0x4c4d5745u
#define T_VERSION 2u
#define T_HELLO_BYTES 64
#define T_WELCOME_BYTES 40

/* A connected loopback pair: cfd from sock_connect_start, afd from accept. */
static void make_pair(int *cfd, int *afd, sock_addr_t *srv, sock_addr_t *cli)
{
    sock_addr_t lo;
    memset(&lo, 0, sizeof(lo));
    struct sockaddr_in *s = (struct sockaddr_in *)&lo.sa;
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lo.len = sizeof(*s);
    int lfd = -1;
    ck_assert_int_eq(sock_listen(&lo, 4, &lfd, srv), loomSuccess);
    ck_assert_int_eq(sock_connect_start(srv, cfd), loomSuccess);
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    ck_assert_int_eq(poll(&p, 1, 2000), 1);
    cli->len = sizeof(cli->sa);
    *afd = accept4(lfd, (struct sockaddr *)&cli->sa, &cli->len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    ck_assert_int_ge(*afd, 0);
    close(lfd);
}

/* Runs both ends until each is done or failed. A side that fails closes its socket, as the
 * transport and the bootstrap do, so the other side learns of it. */
static void drive_pair(hs_t *c, hs_t *a, loomResult_t *rc, loomResult_t *ra)
{
    uint64_t end = base_now_ns() + 8000000000ull;
    bool cfin = false, afin = false;
    *rc = *ra = loomSuccess;
    while (!(cfin && afin) && base_now_ns() < end) {
        bool prog = false;
        if (!cfin) {
            *rc = hs_progress(c, &prog);
            if (*rc != loomSuccess) {
                close(c->fd);
                c->fd = -1;
            }
            cfin = *rc != loomSuccess || c->state == HS_DONE;
        }
        if (!afin) {
            *ra = hs_progress(a, &prog);
            if (*ra != loomSuccess) {
                close(a->fd);
                a->fd = -1;
            }
            afin = *ra != loomSuccess || a->state == HS_DONE;
        }
        if (!prog) {
            struct pollfd p[2];
            int n = 0;
            if (!cfin) p[n++] = (struct pollfd){.fd = c->fd, .events = hs_events(c)};
            if (!afin) p[n++] = (struct pollfd){.fd = a->fd, .events = hs_events(a)};
            poll(p, (nfds_t)n, 20);
        }
    }
    if (c->fd >= 0) close(c->fd);
    if (a->fd >= 0) close(a->fd);
    c->fd = a->fd = -1;
}

static const uint8_t key_a[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
/* One bit away from key_a: a secret that is almost right is still refused. */
static const uint8_t key_b[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17};

START_TEST(test_handshake_ok)
{
    int cfd, afd;
    sock_addr_t srv, cli;
    make_pair(&cfd, &afd, &srv, &cli);
    static hs_t c, a;
    hs_hello_t hello = {
        .comm_id = 0x1122334455667788ull, .from_rank = 3, .to_rank = 5, .chan = 2, .nchan = 4};
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    ck_assert_int_eq(hs_accept_init(&a, afd, &cli, key_a), loomSuccess);
    loomResult_t rc, ra;
    drive_pair(&c, &a, &rc, &ra);
    ck_assert_msg(rc == loomSuccess && c.state == HS_DONE, "connector: %d state %d: %s", (int)rc,
                  (int)c.state, c.err);
    ck_assert_msg(ra == loomSuccess && a.state == HS_DONE, "acceptor: %d state %d: %s", (int)ra,
                  (int)a.state, a.err);
    /* The acceptor learnt who is calling. */
    ck_assert(a.hello.comm_id == hello.comm_id);
    ck_assert_int_eq(a.hello.from_rank, 3);
    ck_assert_int_eq(a.hello.to_rank, 5);
    ck_assert_uint_eq(a.hello.chan, 2);
    ck_assert_uint_eq(a.hello.nchan, 4);
}
END_TEST

START_TEST(test_handshake_wrong_secret)
{
    int cfd, afd;
    sock_addr_t srv, cli;
    make_pair(&cfd, &afd, &srv, &cli);
    static hs_t c, a;
    hs_hello_t hello = {.comm_id = 7, .from_rank = 0, .to_rank = 1, .chan = 0, .nchan = 1};
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    ck_assert_int_eq(hs_accept_init(&a, afd, &cli, key_b), loomSuccess);
    loomResult_t rc, ra;
    drive_pair(&c, &a, &rc, &ra);
    ck_assert_msg(ra != loomSuccess && a.state == HS_FAILED, "acceptor accepted a wrong secret");
    ck_assert_msg(strstr(a.err, "authentication") != NULL, "acceptor: '%s'", a.err);
    ck_assert_msg(rc != loomSuccess && c.state == HS_FAILED, "connector: %d state %d", (int)rc,
                  (int)c.state);
    ck_assert(c.err[0] != '\0');

    /* A listener that skips the check and answers WELCOME without knowing the secret: the
     * connector must refuse it on its own. */
    make_pair(&cfd, &afd, &srv, &cli);
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    uint8_t msg[24];
    uint32_t v = T_MAGIC_CHALLENGE;
    memcpy(msg, &v, 4);
    v = T_VERSION;
    memcpy(msg + 4, &v, 4);
    memset(msg + 8, 0x77, 16);
    uint64_t dl = base_now_ns() + 5000000000ull;
    ck_assert_int_eq(sock_send_all(afd, msg, sizeof(msg), dl, "fake challenge"), loomSuccess);
    while (c.state != HS_RECV_WELCOME && c.state != HS_FAILED && base_now_ns() < dl) {
        bool prog = false;
        ck_assert_int_eq(hs_progress(&c, &prog), loomSuccess);
        if (!prog) usleep(1000);
    }
    ck_assert_int_eq(c.state, HS_RECV_WELCOME);
    uint8_t hello_wire[T_HELLO_BYTES];
    ck_assert_int_eq(sock_recv_all(afd, hello_wire, sizeof(hello_wire), dl, "fake hello"),
                     loomSuccess);
    uint8_t welcome[T_WELCOME_BYTES] = {0}; /* status 0, and a MAC that proves nothing */
    v = T_MAGIC_WELCOME;
    memcpy(welcome, &v, 4);
    ck_assert_int_eq(sock_send_all(afd, welcome, sizeof(welcome), dl, "fake welcome"), loomSuccess);
    ck_assert_int_ne(hs_run_blocking(&c), loomSuccess);
    ck_assert_msg(strstr(c.err, "secret") != NULL, "connector: '%s'", c.err);
    close(cfd);
    close(afd);
}
END_TEST

/* loom's MAC and key derivation are libsodium's keyed BLAKE2b: computed here with libsodium
 * directly, so that a hand-written replacement (or a changed construction) fails. */
START_TEST(test_crypto_known_answer)
{
    ck_assert_int_ge(sodium_init(), 0);
    static const char ctx[] = "loom-test context";
    uint8_t nonce[16], msg[37];
    for (int i = 0; i < 16; i++)
        nonce[i] = (uint8_t)(0xa0 + i);
    for (int i = 0; i < 37; i++)
        msg[i] = (uint8_t)(i * 7);
    uint8_t want[32], got[BASE_MAC_BYTES];
    crypto_generichash_state st;
    crypto_generichash_init(&st, key_a, sizeof(key_a), sizeof(want));
    crypto_generichash_update(&st, (const unsigned char *)ctx, sizeof(ctx)); /* with its NUL */
    crypto_generichash_update(&st, nonce, sizeof(nonce));
    crypto_generichash_update(&st, msg, sizeof(msg));
    crypto_generichash_final(&st, want, sizeof(want));
    ck_assert_int_eq(BASE_MAC_BYTES, 32);
    ck_assert_int_eq(base_mac(key_a, ctx, nonce, sizeof(nonce), msg, sizeof(msg), got),
                     loomSuccess);
    ck_assert_msg(memcmp(want, got, sizeof(want)) == 0, "base_mac is not keyed BLAKE2b-256");

    /* Another purpose, another key, one bit of the message: another MAC. */
    uint8_t other[BASE_MAC_BYTES];
    ck_assert_int_eq(base_mac(key_a, "loom-test other", nonce, 16, msg, 37, other), loomSuccess);
    ck_assert(memcmp(got, other, sizeof(got)) != 0);
    ck_assert_int_eq(base_mac(key_b, ctx, nonce, 16, msg, 37, other), loomSuccess);
    ck_assert(memcmp(got, other, sizeof(got)) != 0);
    msg[20] ^= 0x04;
    ck_assert_int_eq(base_mac(key_a, ctx, nonce, 16, msg, 37, other), loomSuccess);
    ck_assert(memcmp(got, other, sizeof(got)) != 0);

    /* LOOM_JOB_SECRET's key: BLAKE2b personalised "loom-job-secret", deterministic, and another
     * for a text one character away. */
    static const char text[] = "correct horse battery staple";
    static const unsigned char personal[crypto_generichash_blake2b_PERSONALBYTES] =
        "loom-job-secret";
    uint8_t kw[BASE_KEY_BYTES], k1[BASE_KEY_BYTES], k2[BASE_KEY_BYTES], k3[BASE_KEY_BYTES];
    ck_assert_int_eq(
        crypto_generichash_blake2b_salt_personal(kw, sizeof(kw), (const unsigned char *)text,
                                                 strlen(text), NULL, 0, NULL, personal),
        0);
    ck_assert_int_eq(base_derive_key(text, k1), loomSuccess);
    ck_assert_int_eq(base_derive_key(text, k2), loomSuccess);
    ck_assert_int_eq(base_derive_key("correct horse battery staplf", k3), loomSuccess);
    ck_assert_msg(memcmp(kw, k1, sizeof(kw)) == 0, "the job key is not libsodium's BLAKE2b");
    ck_assert(memcmp(k1, k2, sizeof(k1)) == 0);
    ck_assert(memcmp(k1, k3, sizeof(k1)) != 0);

    ck_assert(base_equal_ct(want, got, sizeof(want)));
    ck_assert(!base_equal_ct(want, other, sizeof(want)));
    /* Two random draws of 32 bytes agree only if the random source is broken. */
    uint8_t r1[32], r2[32];
    ck_assert_int_eq(base_random(r1, sizeof(r1)), loomSuccess);
    ck_assert_int_eq(base_random(r2, sizeof(r2)), loomSuccess);
    ck_assert(memcmp(r1, r2, sizeof(r1)) != 0);
}
END_TEST

/* Advances h until it reaches `want` or fails. */
static void pump_until(hs_t *h, hs_state_t want)
{
    uint64_t dl = base_now_ns() + 5000000000ull;
    while (h->state != want && h->state != HS_FAILED && h->state != HS_DONE && base_now_ns() < dl) {
        bool prog = false;
        (void)hs_progress(h, &prog);
        if (!prog) usleep(1000);
    }
}

/* A relay between a real connector and a real acceptor flips one bit of what it forwards: of the
 * challenge's nonce, of the HELLO's fields, of the HELLO's MAC, or of the WELCOME's MAC. Every
 * one is refused; the untouched relay (case 0) shows that the relay itself is sound. */
START_TEST(test_handshake_one_bit)
{
    static const struct {
        int msg; /* 0: none, 1: challenge, 2: hello, 3: welcome */
        int byte;
    } cases[] = {{0, 0}, {1, 8 + 5}, {2, 20}, {2, 32 + 31}, {3, 8 + 3}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int cfd, xfd, yfd, afd;
        sock_addr_t srv1, cli1, srv2, cli2;
        make_pair(&cfd, &xfd, &srv1, &cli1);
        make_pair(&yfd, &afd, &srv2, &cli2);
        static hs_t c, a;
        hs_hello_t hello = {.comm_id = 9, .from_rank = 1, .to_rank = 0, .chan = 0, .nchan = 1};
        hs_connect_init(&c, cfd, &srv1, key_a, &hello);
        ck_assert_int_eq(hs_accept_init(&a, afd, &cli2, key_a), loomSuccess);
        uint64_t dl = base_now_ns() + 5000000000ull;
        uint8_t buf[T_HELLO_BYTES];

        pump_until(&a, HS_RECV_HELLO);
        ck_assert_int_eq(sock_recv_all(yfd, buf, 24, dl, "challenge"), loomSuccess);
        if (cases[k].msg == 1) buf[cases[k].byte] ^= 0x10;
        ck_assert_int_eq(sock_send_all(xfd, buf, 24, dl, "challenge"), loomSuccess);

        pump_until(&c, HS_RECV_WELCOME);
        ck_assert_int_eq(c.state, HS_RECV_WELCOME);
        ck_assert_int_eq(sock_recv_all(xfd, buf, T_HELLO_BYTES, dl, "hello"), loomSuccess);
        if (cases[k].msg == 2) buf[cases[k].byte] ^= 0x01;
        ck_assert_int_eq(sock_send_all(yfd, buf, T_HELLO_BYTES, dl, "hello"), loomSuccess);

        pump_until(&a, HS_DONE);
        if (cases[k].msg == 1 || cases[k].msg == 2) {
            ck_assert_msg(a.state == HS_FAILED && strstr(a.err, "authentication"),
                          "case %zu: acceptor state %d: '%s'", k, (int)a.state, a.err);
        } else {
            ck_assert_msg(a.state == HS_DONE, "case %zu: acceptor: '%s'", k, a.err);
            ck_assert_int_eq(sock_recv_all(yfd, buf, T_WELCOME_BYTES, dl, "welcome"), loomSuccess);
            if (cases[k].msg == 3) buf[cases[k].byte] ^= 0x80;
            ck_assert_int_eq(sock_send_all(xfd, buf, T_WELCOME_BYTES, dl, "welcome"), loomSuccess);
            pump_until(&c, HS_DONE);
            if (cases[k].msg == 3)
                ck_assert_msg(c.state == HS_FAILED && strstr(c.err, "secret"),
                              "case %zu: connector state %d: '%s'", k, (int)c.state, c.err);
            else
                ck_assert_msg(c.state == HS_DONE, "case %zu: connector: '%s'", k, c.err);
        }
        close(cfd);
        close(xfd);
        close(yfd);
        close(afd);
    }
}
END_TEST

/* A peer of the previous handshake version (16-byte MACs) is named as one, not taken for a
 * wrong secret or a stranger. */
START_TEST(test_handshake_old_version)
{
    int cfd, afd;
    sock_addr_t srv, cli;
    static hs_t c;
    hs_hello_t hello = {.comm_id = 7, .from_rank = 0, .to_rank = 1, .chan = 0, .nchan = 1};
    make_pair(&cfd, &afd, &srv, &cli);
    uint8_t msg[24];
    uint32_t v = T_MAGIC_CHALLENGE;
    memcpy(msg, &v, 4);
    v = 1;
    memcpy(msg + 4, &v, 4);
    memset(msg + 8, 0x55, 16);
    uint64_t dl = base_now_ns() + 5000000000ull;
    ck_assert_int_eq(sock_send_all(afd, msg, sizeof(msg), dl, "old challenge"), loomSuccess);
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    ck_assert_int_eq(hs_run_blocking(&c), loomRemoteError);
    ck_assert_msg(strstr(c.err, "version 1") && strstr(c.err, "speaks 2"), "'%s'", c.err);
    close(cfd);
    close(afd);
}
END_TEST

START_TEST(test_handshake_not_loom)
{
    int cfd, afd;
    sock_addr_t srv, cli;
    static hs_t c, a;
    hs_hello_t hello = {.comm_id = 7, .from_rank = 0, .to_rank = 1, .chan = 0, .nchan = 1};
    uint64_t dl = base_now_ns() + 5000000000ull;

    /* Connector meets an HTTP server. */
    make_pair(&cfd, &afd, &srv, &cli);
    static const char http[] = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n"
                               "Content-Length: 5\r\n\r\nhello";
    ck_assert_int_eq(sock_send_all(afd, http, sizeof(http) - 1, dl, "http reply"), loomSuccess);
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    ck_assert_int_eq(hs_run_blocking(&c), loomRemoteError);
    ck_assert_int_eq(c.state, HS_FAILED);
    ck_assert_msg(strstr(c.err, "not a loom peer") != NULL, "connector: '%s'", c.err);
    close(cfd);
    close(afd);

    /* Acceptor meets an HTTP client. */
    make_pair(&cfd, &afd, &srv, &cli);
    static const char get[] = "GET / HTTP/1.0\r\nHost: localhost\r\nUser-Agent: loom-test\r\n"
                              "Accept: */*\r\n\r\n";
    ck_assert_int_eq(sock_send_all(cfd, get, sizeof(get) - 1, dl, "http request"), loomSuccess);
    ck_assert_int_eq(hs_accept_init(&a, afd, &cli, key_a), loomSuccess);
    loomResult_t ra = loomSuccess;
    while (a.state != HS_FAILED && a.state != HS_DONE && base_now_ns() < dl) {
        bool prog = false;
        ra = hs_progress(&a, &prog);
        if (!prog && ra == loomSuccess) usleep(1000);
    }
    ck_assert_int_eq(ra, loomRemoteError);
    ck_assert_msg(strstr(a.err, "not a loom peer") != NULL, "acceptor: '%s'", a.err);
    close(cfd);
    close(afd);
}
END_TEST

START_TEST(test_handshake_timeout)
{
    /* A peer that accepts and says nothing is dropped after LOOM_HANDSHAKE_TIMEOUT. */
    set_param("LOOM_HANDSHAKE_TIMEOUT", "1");
    int cfd, afd;
    sock_addr_t srv, cli;
    static hs_t c;
    hs_hello_t hello = {.comm_id = 7, .from_rank = 0, .to_rank = 1, .chan = 0, .nchan = 1};
    make_pair(&cfd, &afd, &srv, &cli);
    uint64_t t0 = base_now_ns();
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    ck_assert_int_eq(hs_run_blocking(&c), loomRemoteError);
    double s = (double)(base_now_ns() - t0) * 1e-9;
    ck_assert_msg(s >= 0.9 && s < 4, "gave up after %.2f s", s);
    ck_assert_msg(strstr(c.err, "LOOM_HANDSHAKE_TIMEOUT") != NULL, "'%s'", c.err);
    close(cfd);
    close(afd);
    set_param("LOOM_HANDSHAKE_TIMEOUT", NULL);
}
END_TEST

START_TEST(test_handshake_patient)
{
    /* A patient connector (the transports') whose listener has not said its first word after
     * twice LOOM_HANDSHAKE_TIMEOUT is still waiting, not failed: the peer may not have reached
     * loom yet. Once the listener speaks, the handshake completes. Then a listener that stops
     * in the middle is still dropped after the handshake timeout. */
    set_param("LOOM_HANDSHAKE_TIMEOUT", "1");
    int cfd, afd;
    sock_addr_t srv, cli;
    static hs_t c, a;
    hs_hello_t hello = {.comm_id = 7, .from_rank = 0, .to_rank = 1, .chan = 0, .nchan = 1};
    make_pair(&cfd, &afd, &srv, &cli);
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    c.patient = true;
    uint64_t until = base_now_ns() + 2200000000ull;
    while (base_now_ns() < until) {
        bool prog = false;
        ck_assert_msg(hs_progress(&c, &prog) == loomSuccess, "gave up: '%s'", c.err);
        usleep(20000);
    }
    ck_assert_int_eq(c.state, HS_RECV_CHALLENGE);
    ck_assert_int_eq(hs_accept_init(&a, afd, &cli, key_a), loomSuccess);
    loomResult_t rc, ra;
    drive_pair(&c, &a, &rc, &ra);
    ck_assert_msg(rc == loomSuccess && c.state == HS_DONE, "connector: '%s'", c.err);
    ck_assert_msg(ra == loomSuccess && a.state == HS_DONE, "acceptor: '%s'", a.err);
    close(cfd);
    close(afd);

    /* The listener sends its challenge, then nothing: the clock started with its first byte. */
    make_pair(&cfd, &afd, &srv, &cli);
    hs_connect_init(&c, cfd, &srv, key_a, &hello);
    c.patient = true;
    ck_assert_int_eq(hs_accept_init(&a, afd, &cli, key_a), loomSuccess);
    bool prog = false;
    ck_assert_int_eq(hs_progress(&a, &prog), loomSuccess); /* the challenge goes */
    uint64_t t0 = base_now_ns();
    loomResult_t r = loomSuccess;
    while (r == loomSuccess && base_now_ns() - t0 < 4000000000ull) {
        prog = false;
        r = hs_progress(&c, &prog); /* the HELLO goes; the WELCOME never comes */
        usleep(10000);
    }
    double s = (double)(base_now_ns() - t0) * 1e-9;
    ck_assert_int_eq(r, loomRemoteError);
    ck_assert_msg(s >= 0.9 && s < 3, "gave up after %.2f s", s);
    ck_assert_msg(strstr(c.err, "LOOM_HANDSHAKE_TIMEOUT") != NULL, "'%s'", c.err);
    close(cfd);
    close(afd);
    set_param("LOOM_HANDSHAKE_TIMEOUT", NULL);
}
END_TEST

/* ---- 5. several sockets per peer ----------------------------------------------------------- */

#define NSOCKS 4

typedef struct {
    tbar_t bar;
    int sockets; /* socket descriptors open in the process while all ranks were connected */
} many_arg_t;

static int count_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[300], target[128];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t l = readlink(path, target, sizeof(target) - 1);
        if (l <= 0) continue;
        target[l] = '\0';
        if (strncmp(target, "socket:", 7) == 0) n++;
    }
    closedir(d);
    return n;
}

static float many_val(int r, size_t i)
{
    return (float)((i * 13 + (size_t)r * 7) % 1024) - 512;
}

static int many_rank(const loomUniqueId *id, int rank, int nranks, void *arg)
{
    many_arg_t *m = arg;
    int rc = 0;
    loomComm_t comm = NULL;
    const size_t n = 3u * 1024 * 1024 / sizeof(float) + 7;
    float *in = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    RCHECK(in && out, "out of memory");
    RCALL(loomCommInitRank(&comm, nranks, *id, rank));
    RCHECK(comm->tune.nchannels == 3, "%d channels, LOOM_NCHANNELS=3", comm->tune.nchannels);
    for (size_t i = 0; i < n; i++)
        in[i] = many_val(rank, i);
    RCALL(loomAllReduce(in, out, n, loomFloat, loomSum, comm, NULL));
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < nranks; q++)
            want += many_val(q, i);
        RCHECK(out[i] == want, "[%zu] = %g, expected %g", i, (double)out[i], (double)want);
    }
    /* In place, a second time over the same connections. */
    RCALL(loomAllReduce(out, out, n, loomFloat, loomSum, comm, NULL));
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < nranks; q++)
            want += many_val(q, i);
        want *= (float)nranks;
        RCHECK(out[i] == want, "in place [%zu] = %g, expected %g", i, (double)out[i], (double)want);
    }
    /* Count the sockets while every rank still holds its connections. */
    RCHECK(tbar_wait(&m->bar) == 0, "barrier timed out");
    if (rank == 0) m->sockets = count_sockets();
    RCHECK(tbar_wait(&m->bar) == 0, "barrier timed out");
out:
    if (comm) loomCommDestroy(comm);
    free(in);
    free(out);
    return rc;
}

START_TEST(test_many_sockets)
{
    set_param("LOOM_NSOCKS_PERPEER", "4");
    set_param("LOOM_NCHANNELS", "3");
    /* Same-node peers would use shared memory: force TCP, whose sockets are counted. */
    set_param("LOOM_TRANSPORT", "tcp");
    for (int nranks = 2; nranks <= 3; nranks++) {
        many_arg_t m;
        tbar_init(&m.bar, nranks);
        m.sockets = -1;
        loomUniqueId id;
        ck_assert_msg(loomGetUniqueId(&id) == loomSuccess, "%s", loomGetLastError(NULL));
        ck_assert_msg(run_raw(nranks, &id, many_rank, &m) == 0, "%d ranks", nranks);
        /* With 2 or 3 ranks every pair is a ring neighbour: each pair's connection has NSOCKS
         * sockets, two descriptors each (both ends live in this process). */
        int pairs = nranks * (nranks - 1) / 2;
        ck_assert_msg(m.sockets >= 2 * NSOCKS * pairs,
                      "%d ranks: %d sockets open, expected at least %d", nranks, m.sockets,
                      2 * NSOCKS * pairs);
    }
    set_param("LOOM_NSOCKS_PERPEER", NULL);
    set_param("LOOM_NCHANNELS", NULL);
    set_param("LOOM_TRANSPORT", NULL);
}
END_TEST

/* ---- tcp: a late lower rank, and a reverse socket whose handshake fails -------------------- */

typedef struct {
    double late_s;  /* rank 0 sleeps this long before its first call */
    double secs[2]; /* each rank's allreduce, seconds */
    int nready[2];  /* the sockets of its link once done */
} rev_arg_t;

static int reverse_rank(const loomUniqueId *id, int rank, int nranks, void *arg)
{
    rev_arg_t *a = arg;
    int rc = 0;
    loomComm_t comm = NULL;
    const size_t n = 4u * 1024 * 1024 / sizeof(float) + 3; /* large enough for both sockets */
    float *in = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    RCHECK(in && out, "out of memory");
    RCALL(loomCommInitRank(&comm, nranks, *id, rank));
    for (size_t i = 0; i < n; i++)
        in[i] = many_val(rank, i);
    if (rank == 0) usleep((useconds_t)(a->late_s * 1e6));
    double t0 = h_now_s();
    RCALL(loomAllReduce(in, out, n, loomFloat, loomSum, comm, NULL));
    a->secs[rank] = h_now_s() - t0;
    for (size_t i = 0; i < n; i++) {
        float want = many_val(0, i) + many_val(1, i);
        RCHECK(out[i] == want, "[%zu] = %g, expected %g", i, (double)out[i], (double)want);
    }
out:
    if (comm) loomCommDestroy(comm);
    free(in);
    free(out);
    return rc;
}

START_TEST(test_reverse_dial_retry)
{
    /* Rank 0, the lower rank that dials, is 2 s late to its first call; rank 1 dials it instead
     * after a heartbeat interval (LOOM_TIMEOUT=2: 0.5 s), two sockets, and the handshake of its
     * second fails (tcp_test_drop_reverse_nth, as a flooded listener drops one). That socket is
     * dialled again: the first one's success used to end the dialling, and rank 0, which found
     * a connection there at its call, dials none, so the link stayed a socket short and the
     * allreduce waited for LOOM_OP_TIMEOUT. */
    set_param("LOOM_TRANSPORT", "tcp");
    set_param("LOOM_NSOCKS_PERPEER", "2");
    set_param("LOOM_TIMEOUT", "2");
    set_param("LOOM_OP_TIMEOUT", "12");
    rev_arg_t a = {.late_s = 2.0};
    tcp_test_drop_reverse_nth = 2;
    loomUniqueId id;
    ck_assert_msg(loomGetUniqueId(&id) == loomSuccess, "%s", loomGetLastError(NULL));
    int bad = run_raw(2, &id, reverse_rank, &a);
    int left = tcp_test_drop_reverse_nth;
    tcp_test_drop_reverse_nth = 0;
    set_param("LOOM_TRANSPORT", NULL);
    set_param("LOOM_NSOCKS_PERPEER", NULL);
    set_param("LOOM_TIMEOUT", NULL);
    set_param("LOOM_OP_TIMEOUT", NULL);
    ck_assert_msg(left == 0,
                  "the hook did not fire (%d reverse sockets short): rank 1 never "
                  "dialled rank 0 twice",
                  left);
    ck_assert_msg(bad == 0, "a rank failed (see above)");
    ck_assert_msg(a.secs[0] < 6, "rank 0's allreduce took %.1f s (a socket short?)", a.secs[0]);
}
END_TEST

/* ---- shm: cross-memory attach and the bounce-segment fallback ------------------------------ */

typedef struct {
    bool want_cma;
    int wrong;
    int used_cma;
} shm_arg_t;

static int shm_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    shm_arg_t *a = p;
    size_t n = (1u << 20) + 5; /* several slices */
    int32_t *buf = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        buf[i] = (int32_t)(i % 1000) + rank;
    loomResult_t r = loomAllReduce(buf, buf, n, loomInt32, loomSum, comm, NULL);
    int rc = 0;
    if (r != loomSuccess) {
        fprintf(stderr, "rank %d: %s\n", rank, loomGetLastError(comm));
        rc = 1;
    }
    for (size_t i = 0; i < n && rc == 0; i++)
        if (buf[i] != nranks * (int32_t)(i % 1000) + nranks * (nranks - 1) / 2) {
            __atomic_add_fetch(&a->wrong, 1, __ATOMIC_RELAXED);
            rc = 1;
        }
    /* Every same-node link must be shm, copying the way LOOM_SHM_CMA asked for. */
    for (int q = 0; q < nranks && rc == 0; q++) {
        if (q == rank || comm->net.links[q].conn == NULL) continue;
        if (strcmp(comm->net.links[q].ops->name, "shm") != 0) {
            fprintf(stderr, "rank %d reaches rank %d over %s\n", rank, q,
                    comm->net.links[q].ops->name);
            rc = 1;
        } else if (shm_conn_uses_cma(comm->net.links[q].conn)) {
            __atomic_add_fetch(&a->used_cma, 1, __ATOMIC_RELAXED);
        }
    }
    free(buf);
    return rc;
}

START_TEST(test_shm_modes)
{
    for (int mode = 0; mode < 2; mode++) {
        shm_arg_t a = {.want_cma = mode == 0};
        set_param("LOOM_SHM_CMA", mode == 0 ? NULL : "0");
        ck_assert_msg(h_run_threads(3, shm_rank, &a) == 0, "shm %s failed",
                      mode == 0 ? "with cross-memory attach" : "with bounce segments");
        ck_assert_int_eq(a.wrong, 0);
        if (mode == 0)
            ck_assert_msg(a.used_cma > 0, "cross-memory attach was not used");
        else
            ck_assert_msg(a.used_cma == 0, "LOOM_SHM_CMA=0 still used cross-memory attach");
    }
    set_param("LOOM_SHM_CMA", NULL);
}
END_TEST

/* A send's descriptor leaves in the send call itself, not at the next progress pass: that pass
 * may first copy a slice from another peer, and the receiver would wait for that copy (in a ring,
 * every rank; which connection a pass visited first depended on the order the links were made,
 * and a first small call made large ring allreduces 1.4x slower). */
static int shm_at_once_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    (void)p;
    int32_t one = rank;
    if (loomAllReduce(&one, &one, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) return 1;
    int peer = 1 - rank, rc = 0;
    exec_link_t *l = &comm->net.links[peer];
    if (l->conn == NULL || strcmp(l->ops->name, "shm") != 0) {
        fprintf(stderr, "rank %d: no shm link to rank %d\n", rank, peer);
        return 1;
    }
    size_t n = 1u << 18;
    int32_t *buf = calloc(n, sizeof(int32_t));
    for (size_t i = 0; rank == 0 && i < n; i++)
        buf[i] = (int32_t)(i * 3 + 1);
    uint8_t meta[TRANSPORT_META_BYTES] = {7};
    transport_req_t *req = NULL;
    exec_host_lock(&comm->exech); /* the progress thread's keepalive drives the links too */
    loomResult_t r = rank == 0 ? l->ops->isend(l->conn, buf, n * sizeof(int32_t), meta, &req)
                               : l->ops->irecv(l->conn, buf, n * sizeof(int32_t), &req);
    if (rank == 0 && r == loomSuccess && shm_conn_unsent(l->conn) != 0) {
        fprintf(stderr, "rank 0: the descriptor waits for a progress pass (%d unsent)\n",
                shm_conn_unsent(l->conn));
        rc = 1;
    }
    exec_host_unlock(&comm->exech);
    int done = 0;
    uint8_t got[TRANSPORT_META_BYTES];
    while (r == loomSuccess && !done) {
        bool moved = false;
        exec_host_lock(&comm->exech);
        r = comm->net.tp[TP_SHM].ops->progress(comm->net.tp[TP_SHM].ctx, &moved);
        if (r == loomSuccess) r = l->ops->test(req, &done, got);
        exec_host_unlock(&comm->exech);
    }
    if (r != loomSuccess) {
        fprintf(stderr, "rank %d: %s\n", rank, loomGetLastError(comm));
        rc = 1;
    }
    for (size_t i = 0; rank == 1 && rc == 0 && i < n; i++)
        if (buf[i] != (int32_t)(i * 3 + 1)) rc = 1;
    if (rank == 1 && rc == 0 && got[0] != 7) rc = 1;
    free(buf);
    return rc;
}

START_TEST(test_shm_send_at_once)
{
    set_param("LOOM_TRANSPORT", "shm");
    ck_assert_msg(h_run_threads(2, shm_at_once_rank, NULL) == 0,
                  "an shm send's descriptor did not leave in the send call");
    set_param("LOOM_TRANSPORT", NULL);
}
END_TEST

/* ---- the abort's grace after the caller got its buffer back ------------------------------- */

/* A frame half sent when its call fails: the call's end (exec_free's orphan) must take the rest
 * of the payload out of the caller's buffer, because the abort's grace finishes the frame after
 * the call returned, when the caller may have reused or freed the buffer. Rank 0 half sends
 * 4 MiB (small socket buffers, rank 1 not reading), its call ends, it overwrites and frees the
 * buffer, then aborts while rank 1 reads: rank 1 must get the whole message, every byte as it
 * was when sent. */
#define GRACE_BYTES (4u << 20)
static uint8_t grace_byte(size_t i)
{
    return (uint8_t)(i % 200 + 1); /* never 0 (not received) nor 0xEE (overwritten) */
}

static tbar_t grace_bar;

static int grace_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    (void)p;
    int rc = 0;
    int32_t one = rank;
    uint8_t *buf = NULL;
    RCALL(loomAllReduce(&one, &one, 1, loomInt32, loomSum, comm, NULL)); /* connects */
    exec_link_t *l = &comm->net.links[1 - rank];
    RCHECK(l->conn && strcmp(l->ops->name, "tcp") == 0, "no tcp link");
    const exec_tp_t *tp = &comm->net.tp[TP_TCP];
    transport_req_t *req = NULL;
    uint8_t meta[TRANSPORT_META_BYTES] = {9}, got[TRANSPORT_META_BYTES] = {0};
    int done = 0;
    loomResult_t r = loomSuccess;
    if (rank == 0) {
        buf = malloc(GRACE_BYTES);
        RCHECK(buf, "out of memory");
        for (size_t i = 0; i < GRACE_BYTES; i++)
            buf[i] = grace_byte(i);
        exec_host_lock(&comm->exech); /* the progress thread's keepalive drives the links too */
        r = l->ops->isend(l->conn, buf, GRACE_BYTES, meta, &req);
        exec_host_unlock(&comm->exech);
        RCHECK(r == loomSuccess, "isend: %s", loomGetLastError(NULL));
        /* until the socket is full: no byte moved for 100 ms */
        double t0 = h_now_s(), last = t0;
        while (!done && h_now_s() - last < 0.1 && h_now_s() - t0 < 10) {
            bool moved = false;
            exec_host_lock(&comm->exech);
            r = tp->ops->progress(tp->ctx, &moved);
            if (r == loomSuccess) r = l->ops->test(req, &done, got);
            exec_host_unlock(&comm->exech);
            RCHECK(r == loomSuccess, "progress: %s", loomGetLastError(NULL));
            if (moved) last = h_now_s();
            usleep(1000);
        }
        RCHECK(!done, "4 MiB went out with nobody reading: not a half sent frame");
        /* The call ends unfinished (what exec_free does), and the caller reuses its buffer. */
        exec_host_lock(&comm->exech);
        tp->ops->orphan(tp->ctx);
        exec_host_unlock(&comm->exech);
        memset(buf, 0xEE, GRACE_BYTES);
        free(buf);
        buf = NULL;
        RCHECK(tbar_wait(&grace_bar) == 0, "rank 1 did not arrive");
        comm_abort_transports(comm, "test: the call left, its frame half sent");
        goto out;
    }
    buf = calloc(1, GRACE_BYTES);
    RCHECK(buf, "out of memory");
    RCHECK(tbar_wait(&grace_bar) == 0, "rank 0 did not arrive");
    exec_host_lock(&comm->exech);
    r = l->ops->irecv(l->conn, buf, GRACE_BYTES, &req);
    exec_host_unlock(&comm->exech);
    for (double t0 = h_now_s(); r == loomSuccess && !done && h_now_s() - t0 < 10;) {
        bool moved = false;
        exec_host_lock(&comm->exech);
        r = tp->ops->progress(tp->ctx, &moved);
        if (r == loomSuccess) r = l->ops->test(req, &done, got);
        exec_host_unlock(&comm->exech);
        if (!moved) usleep(200);
    }
    size_t have = 0, wrong = 0, first_wrong = GRACE_BYTES;
    for (size_t i = 0; i < GRACE_BYTES; i++) {
        if (buf[i] == grace_byte(i))
            have++;
        else if (buf[i] != 0 && wrong++ == 0)
            first_wrong = i;
    }
    fprintf(stderr, "rank 1: %s; %zu bytes as sent, %zu other (the first at %zu)\n",
            done ? "received" : "not received", have, wrong, first_wrong);
    RCHECK(wrong == 0, "%zu bytes arrived that the caller wrote after its call (first at %zu)",
           wrong, first_wrong);
    RCHECK(r == loomSuccess && done, "the half sent frame was not finished: %d %s", (int)r,
           loomGetLastError(NULL));
    RCHECK(have == GRACE_BYTES && got[0] == 9, "%zu of %u bytes, meta %u", have, GRACE_BYTES,
           got[0]);
out:
    free(buf);
    return rc;
}

START_TEST(test_abort_grace_own_copy)
{
    set_param("LOOM_TRANSPORT", "tcp");
    set_param("LOOM_SOCKET_BUFFER", "64K");
    set_param("LOOM_NSOCKS_PERPEER", "1");
    tbar_init(&grace_bar, 2);
    ck_assert_msg(h_run_threads(2, grace_rank, NULL) == 0,
                  "the abort's grace read the caller's buffer after its call");
    set_param("LOOM_TRANSPORT", NULL);
    set_param("LOOM_SOCKET_BUFFER", NULL);
    set_param("LOOM_NSOCKS_PERPEER", NULL);
}
END_TEST

/* The ring of small messages and the descriptors of large ones carry one sequence: a mix of
 * sizes on one connection, more small messages than the ring holds at once (the sender waits
 * for room, the receiver wakes it), in place and out of order of posting sizes, arrives whole
 * and in order. */
#define MIX_N 96
static size_t mix_count(int i)
{
    static const size_t sizes[] = {0, 1, 7, 1024, 8192 - 1, 8192, 8193, 300000, 16, 65536};
    return sizes[i % (int)(sizeof(sizes) / sizeof(sizes[0]))];
}

static int shm_mix_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    (void)p;
    int32_t *bufs[MIX_N];
    for (int i = 0; i < MIX_N; i++) {
        bufs[i] = calloc(mix_count(i) + 1, sizeof(int32_t));
        for (size_t j = 0; rank == 0 && j < mix_count(i); j++)
            bufs[i][j] = (int32_t)(i * 100003 + (int)j);
    }
    if (rank == 1) usleep(100000); /* the sender fills the ring first */
    loomGroupStart();
    for (int i = 0; i < MIX_N; i++) {
        if (rank == 0)
            loomSend(bufs[i], mix_count(i), loomInt32, 1, comm, NULL);
        else
            loomRecv(bufs[i], mix_count(i), loomInt32, 0, comm, NULL);
    }
    int rc = loomGroupEnd() == loomSuccess ? 0 : 1;
    if (rc) fprintf(stderr, "rank %d: %s\n", rank, loomGetLastError(comm));
    for (int i = 0; i < MIX_N; i++) {
        for (size_t j = 0; rank == 1 && rc == 0 && j < mix_count(i); j++)
            if (bufs[i][j] != (int32_t)(i * 100003 + (int)j)) {
                fprintf(stderr, "message %d (%zu values): value %zu is %d\n", i, mix_count(i), j,
                        bufs[i][j]);
                rc = 1;
            }
        free(bufs[i]);
    }
    return rc;
}

START_TEST(test_shm_ring_mix)
{
    set_param("LOOM_TRANSPORT", "shm");
    for (int mode = 0; mode < 2; mode++) {
        set_param("LOOM_SHM_CMA", mode == 0 ? NULL : "0");
        ck_assert_msg(h_run_threads(2, shm_mix_rank, NULL) == 0,
                      "small and large messages on one shm connection (%s)",
                      mode == 0 ? "cross-memory attach" : "bounce segments");
    }
    set_param("LOOM_SHM_CMA", NULL);
    set_param("LOOM_TRANSPORT", NULL);
}
END_TEST

/* A small send is complete once it is in the ring: its sender may destroy its communicator (or
 * exit) before the receiver looked, and the receiver still gets it, as tcp's bytes in flight
 * arrive before the peer's close; the next receive, which nothing can satisfy, fails naming the
 * closed connection. (An abort is a job-wide error instead: the job-state service fails every
 * rank's communicator, whatever is in flight.) */
static int shm_leave_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    atomic_int *sent = p;
    int32_t v[4] = {rank, 0, 0, 0};
    if (loomAllReduce(v, v, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) return 1;
    if (rank == 1) {
        int32_t x[4] = {11, 22, 33, 44};
        if (loomSend(x, 4, loomInt32, 0, comm, NULL) != loomSuccess) return 2;
        atomic_store(sent, 1);
        return 0; /* the harness destroys the communicator */
    }
    while (!atomic_load(sent))
        usleep(1000);
    usleep(200000); /* the close has reached this rank's socket */
    int32_t y[4] = {0};
    if (loomRecv(y, 4, loomInt32, 1, comm, NULL) != loomSuccess) {
        fprintf(stderr, "rank 0: the message sent before the close: %s\n", loomGetLastError(comm));
        return 4;
    }
    if (y[0] != 11 || y[3] != 44) return 5;
    if (loomRecv(y, 4, loomInt32, 1, comm, NULL) == loomSuccess) return 6;
    if (!strstr(loomGetLastError(comm), "rank 1")) {
        fprintf(stderr, "rank 0: the receive after the close: %s\n", loomGetLastError(comm));
        return 7;
    }
    return 0;
}

START_TEST(test_shm_send_then_leave)
{
    set_param("LOOM_TRANSPORT", "shm");
    atomic_int sent = 0;
    ck_assert_msg(h_run_threads(2, shm_leave_rank, &sent) == 0,
                  "a small message sent before the sender left was lost");
    set_param("LOOM_TRANSPORT", NULL);
}
END_TEST

/* A record in the ring that no receive asks for yet (a message for a later step) is nothing
 * the receiver can act on: its wait must sleep, not return at once. Asking poll() for the
 * socket's room whenever the peer's ring was not empty made every wait with an early message a
 * busy loop that never yielded: with more ranks than cores (and so no spinning) it kept the core
 * from the very rank it waited for, 8 ranks on 2 cores 9.4 ms per 8-byte rd allreduce. Rank 1's
 * wait, with rank 0's record in the ring and nothing posted, must find no descriptor ready (a
 * ping or a wake-up arriving just then may make one attempt ready: three tries). */
static tbar_t early_bar;

static int shm_early_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    (void)p;
    int32_t one = rank;
    if (loomAllReduce(&one, &one, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) return 1;
    exec_link_t *l = &comm->net.links[1 - rank];
    const exec_tp_t *tp = &comm->net.tp[TP_SHM];
    if (l->conn == NULL || strcmp(l->ops->name, "shm") != 0) return 2;
    int32_t x[2] = {rank == 0 ? 41 : 0, rank == 0 ? 42 : 0};
    uint8_t meta[TRANSPORT_META_BYTES] = {5}, got[TRANSPORT_META_BYTES] = {0};
    transport_req_t *req = NULL;
    int done = 0, rc = 0;
    loomResult_t r = loomSuccess;
    if (rank == 0) {
        exec_host_lock(&comm->exech);
        r = l->ops->isend(l->conn, x, sizeof(x), meta, &req);
        if (r == loomSuccess) r = l->ops->test(req, &done, got);
        exec_host_unlock(&comm->exech);
        if (r != loomSuccess || !done) rc = 3; /* complete once in the ring */
        if (tbar_wait(&early_bar) != 0 || tbar_wait(&early_bar) != 0) return 4;
        return rc;
    }
    if (tbar_wait(&early_bar) != 0) return 4;
    int quiet = 0;
    for (int attempt = 0; attempt < 3 && !quiet && r == loomSuccess; attempt++) {
        struct pollfd fds[16];
        bool moved = false;
        exec_host_lock(&comm->exech); /* the keepalive must not read the socket between */
        r = tp->ops->progress(tp->ctx, &moved);
        int nf = tp->ops->pollfds(tp->ctx, fds, 16);
        int ready = poll(fds, (nfds_t)nf, 0);
        exec_host_unlock(&comm->exech);
        if (ready == 0) quiet = 1;
        for (int i = 0; i < nf && ready > 0; i++)
            if (fds[i].revents)
                fprintf(stderr, "rank 1, try %d: fd %d ready (events 0x%x, revents 0x%x)\n",
                        attempt, fds[i].fd, fds[i].events, fds[i].revents);
    }
    if (!quiet) rc = 5;
    exec_host_lock(&comm->exech);
    if (r == loomSuccess) r = l->ops->irecv(l->conn, x, sizeof(x), &req);
    exec_host_unlock(&comm->exech);
    while (r == loomSuccess && !done) {
        bool moved = false;
        exec_host_lock(&comm->exech);
        r = tp->ops->progress(tp->ctx, &moved);
        if (r == loomSuccess) r = l->ops->test(req, &done, got);
        exec_host_unlock(&comm->exech);
    }
    if (r != loomSuccess) {
        fprintf(stderr, "rank 1: %s\n", loomGetLastError(comm));
        rc = 6;
    } else if (x[0] != 41 || x[1] != 42 || got[0] != 5) {
        rc = 7;
    }
    if (tbar_wait(&early_bar) != 0) return 4;
    return rc;
}

/* Two thread ranks over shm meeting at bar: the early-record and withdrawal cases. */
static int shm_pair(h_rank_fn fn, tbar_t *bar)
{
    set_param("LOOM_TRANSPORT", "shm");
    tbar_init(bar, 2);
    int bad = h_run_threads(2, fn, NULL);
    set_param("LOOM_TRANSPORT", NULL);
    return bad;
}

START_TEST(test_shm_early_record_sleeps)
{
    ck_assert_msg(shm_pair(shm_early_rank, &early_bar) == 0,
                  "a wait with an unasked-for record in the ring did not sleep");
}
END_TEST

/* A large shm send leaves as a descriptor, and the peer reads the bytes straight out of the
 * sender's buffer whenever its receive comes. When the sender's call ends unfinished (it
 * failed) the caller gets that buffer back, and the peer must not read it any more: rank 0's
 * call leaves with its 1 MiB send unread (orphan, as exec_free does), it overwrites the buffer;
 * rank 1's receive must fail naming the withdrawal, not deliver the overwritten bytes, and rank
 * 0's connection is failed. Two cases:
 * - withdraw: rank 1's receive is posted after the orphan (before the withdrawal word, it
 *   delivered the overwritten bytes);
 * - abandon: rank 1 is held up for 1.5 s between its look at the withdrawal word and its read
 *   (LOOM_SHM_READ_STALL_MS, what a stopped rank does); rank 0's orphan comes meanwhile, waits
 *   200 ms for that read, gives the buffer back and overwrites it (before the abandonment word,
 *   the read delivered the overwritten bytes). */
#define WITHDRAW_BYTES (1u << 20)
static tbar_t withdraw_bar;

static int shm_unfinished_rank(loomComm_t comm, int rank, bool abandon)
{
    int32_t one = rank;
    if (loomAllReduce(&one, &one, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) return 1;
    exec_link_t *l = &comm->net.links[1 - rank];
    const exec_tp_t *tp = &comm->net.tp[TP_SHM];
    if (l->conn == NULL || strcmp(l->ops->name, "shm") != 0) return 2;
    uint8_t *buf = malloc(WITHDRAW_BYTES);
    if (buf == NULL) return 3;
    memset(buf, rank == 0 ? 0x5A : 0, WITHDRAW_BYTES);
    uint8_t meta[TRANSPORT_META_BYTES] = {3}, got[TRANSPORT_META_BYTES] = {0};
    transport_req_t *req = NULL;
    int done = 0, rc = 0;
    loomResult_t r = loomSuccess;
    if (rank == 0) {
        exec_host_lock(&comm->exech);
        r = l->ops->isend(l->conn, buf, WITHDRAW_BYTES, meta, &req);
        if (r == loomSuccess) r = l->ops->test(req, &done, got); /* exec_free's last test */
        exec_host_unlock(&comm->exech);
        if (abandon) {
            if (tbar_wait(&withdraw_bar) != 0) rc = 6;
            usleep(400000); /* rank 1 is in its held-up read by now */
        }
        exec_host_lock(&comm->exech);
        double t0 = h_now_s();
        if (tp->ops->orphan) tp->ops->orphan(tp->ctx);
        double waited = h_now_s() - t0;
        int left = 0;
        loomResult_t after = l->ops->test(req, &left, got);
        exec_host_unlock(&comm->exech);
        memset(buf, 0xEE, WITHDRAW_BYTES); /* the caller's buffer again */
        if (r != loomSuccess || done) rc = 4;
        if (after == loomSuccess || left) {
            fprintf(stderr, "rank 0: the connection still works after the orphan\n");
            rc = 5;
        }
        if (abandon && waited < 0.15) {
            fprintf(stderr, "rank 0: the withdrawal waited %.3f s: rank 1 was not reading yet\n",
                    waited);
            rc = 5;
        }
        if ((!abandon && tbar_wait(&withdraw_bar) != 0) || tbar_wait(&withdraw_bar) != 0) rc = 6;
        free(buf);
        return rc;
    }
    if (tbar_wait(&withdraw_bar) != 0) return 6;
    exec_host_lock(&comm->exech);
    r = l->ops->irecv(l->conn, buf, WITHDRAW_BYTES, &req);
    exec_host_unlock(&comm->exech);
    double t0 = h_now_s();
    while (r == loomSuccess && !done && h_now_s() - t0 < 10) {
        bool moved = false;
        exec_host_lock(&comm->exech);
        r = tp->ops->progress(tp->ctx, &moved);
        if (r == loomSuccess) r = l->ops->test(req, &done, got);
        exec_host_unlock(&comm->exech);
    }
    exec_host_lock(&comm->exech);
    char why[1024];
    snprintf(why, sizeof(why), "%s", l->ops->conn_error(l->conn));
    exec_host_unlock(&comm->exech);
    const char *want = abandon ? "gave the buffer" : "withdrew";
    if (r == loomSuccess) {
        fprintf(stderr, "rank 1: the %s message %s (first byte 0x%02x)\n",
                abandon ? "abandoned" : "withdrawn",
                done ? "was delivered" : "neither failed nor arrived", buf[0]);
        rc = 7;
    } else if (!strstr(why, want) || !strstr(why, "rank 0")) {
        fprintf(stderr, "rank 1: error '%s' does not say '%s'\n", why, want);
        rc = 8;
    }
    if (tbar_wait(&withdraw_bar) != 0) rc = 6;
    free(buf);
    return rc;
}

static int shm_withdraw_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    (void)p;
    return shm_unfinished_rank(comm, rank, false);
}

static int shm_abandon_rank(loomComm_t comm, int rank, int nranks, void *p)
{
    (void)nranks;
    (void)p;
    return shm_unfinished_rank(comm, rank, true);
}

START_TEST(test_shm_abandon)
{
    set_param("LOOM_SHM_READ_STALL_MS", "1500");
    int bad = shm_pair(shm_abandon_rank, &withdraw_bar);
    set_param("LOOM_SHM_READ_STALL_MS", NULL);
    ck_assert_msg(bad == 0, "a read held up past the withdrawal's wait delivered the caller's "
                            "later bytes, or did not fail naming them");
}
END_TEST

START_TEST(test_shm_withdraw)
{
    ck_assert_msg(shm_pair(shm_withdraw_rank, &withdraw_bar) == 0,
                  "a send whose call ended unfinished was read by the peer afterwards");
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------- */

static Suite *net_suite(void)
{
    Suite *s = suite_create("net");
    const h_case_t tests[] = {
        {.name = "ifname", .test = test_ifname},
        {.name = "abort_grace_own_copy", .test = test_abort_grace_own_copy},
        {.name = "ipv6", .test = test_ipv6},
        {.name = "bind_address", .test = test_bind_address},
        {.name = "handshake_ok", .test = test_handshake_ok},
        {.name = "handshake_wrong_secret", .test = test_handshake_wrong_secret},
        {.name = "crypto_known_answer", .test = test_crypto_known_answer},
        {.name = "handshake_one_bit", .test = test_handshake_one_bit},
        {.name = "handshake_old_version", .test = test_handshake_old_version},
        {.name = "handshake_not_loom", .test = test_handshake_not_loom},
        {.name = "handshake_timeout", .test = test_handshake_timeout},
        {.name = "handshake_patient", .test = test_handshake_patient},
        {.name = "many_sockets", .test = test_many_sockets},
        {.name = "reverse_dial_retry", .test = test_reverse_dial_retry},
        {.name = "shm_modes", .test = test_shm_modes},
        {.name = "shm_send_at_once", .test = test_shm_send_at_once},
        {.name = "shm_ring_mix", .test = test_shm_ring_mix},
        {.name = "shm_send_then_leave", .test = test_shm_send_then_leave},
        {.name = "shm_early_record_sleeps", .test = test_shm_early_record_sleeps},
        {.name = "shm_withdraw", .test = test_shm_withdraw},
        {.name = "shm_abandon", .test = test_shm_abandon},
    };
    h_add_cases(s, tests, sizeof(tests) / sizeof(tests[0]), 60);
    return s;
}

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    unsetenv("LOOM_SOCKET_FAMILY");
    unsetenv("LOOM_NSOCKS_PERPEER");
    unsetenv("LOOM_NCHANNELS");
    unsetenv("LOOM_HANDSHAKE_TIMEOUT");
    return h_check_main(net_suite(), false, CK_NORMAL);
}
