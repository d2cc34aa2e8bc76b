/*
 * Bootstrap: the unique id and the rendezvous of all ranks.
 *
 * loomGetUniqueId listens on the chosen interface and starts a root thread in the calling
 * process. Every rank connects to it, proves the job's secret (sock.h's handshake), and sends its
 * peer_info_t (then its large transport addresses, info.addr_bytes of them: comm.h's
 * comm_peer_addr); once all ranks have arrived the root sends everyone the full table, then all
 * those addresses in rank order. The root then becomes the job-state service (jobstate.h): each
 * rank keeps its bootstrap connection for the life of its communicator, and the thread exits
 * once every rank said goodbye or died. Data connections are made later, lazily, between the
 * pairs that a schedule uses.
 *
 * A rendezvous that cannot complete says why on every rank that arrived: ranks that pass
 * different rank counts (both counts and who said them), or ranks that never arrived within
 * LOOM_TIMEOUT of the first (named). A refused rank's socket is drained before it is closed,
 * so that the reason is read before the connection resets.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "coll.h"
#include "comm.h"
#include "fork.h"
#include "jobstate.h"
#include "param.h"

#define UID_MAGIC 0x6c6d6964u /* "lmid" */
#define UID_VERSION 1
#define BOOT_RANK_ROOT (-1)
#define BOOT_ADDR_MAX (1u << 20)           /* a rank's large transport addresses, at most */
#define BOOT_REASON_GRACE_NS 5000000000ull /* a rank waits this long past its own deadline */

typedef struct {
    int32_t status; /* 0 ok, else an error text follows */
    int32_t nranks;
} boot_reply_t;

typedef struct {
    hs_t hs;
    sock_auth_t au; /* once the handshake is done: every message after it is authenticated */
    int state;      /* 0 handshake, 1 reading info (then addr, then tag), 2 waiting for the table, 3
                       closed */
    peer_info_t info;
    size_t got;
    uint8_t *addr;              /* info.addr_bytes, read after info */
    uint8_t tag[SOCK_AUTH_TAG]; /* of info and addr, read after them */
    int nranks;
} boot_client_t;

typedef struct {
    int listen_fd;
    uint8_t secret[16];
    uint64_t job_id;
    sock_addr_t addr;
} boot_root_args_t;

uint64_t boot_node_hash(char *host, size_t hostlen, uint32_t *machine)
{
    char h[HOST_NAME_LEN] = "";
    gethostname(h, sizeof(h) - 1);
    if (host) snprintf(host, hostlen, "%s", h);
    char id[256] = "";
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, id, sizeof(id) - 1);
        if (n > 0) id[n] = '\0';
        close(fd);
    }
    uint64_t x = base_hash64(id, strlen(id), base_hash64(h, strlen(h), 0x6e6f6465));
    if (machine) *machine = (uint32_t)(x ^ (x >> 32));
    const char *over = param_str(PARAM_NODE_ID);
    if (over[0]) return base_hash64(over, strlen(over), 0x6e6f6465);
    struct stat st;
    uint64_t ns = stat("/proc/self/ns/net", &st) == 0 ? (uint64_t)st.st_ino : 0;
    return base_hash64(&ns, sizeof(ns), x);
}

loomResult_t boot_uid_parse(const loomUniqueId *id, uid_layout_t *out)
{
    memcpy(out, id, sizeof(*out));
    if (out->magic != UID_MAGIC || out->version != UID_VERSION)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "the unique id is not one made by loomGetUniqueId of this loom version "
                          "(magic 0x%08x, version %u)",
                          out->magic, out->version);
    return loomSuccess;
}

static void root_send_error(boot_client_t *c, const char *text)
{
    int fd = c->hs.fd;
    boot_reply_t rep = {.status = 1, .nranks = 0};
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", text);
    uint64_t dl = base_now_ns() + 1000000000ull;
    if (sock_send_auth(fd, &c->au, &rep, sizeof(rep), dl, "bootstrap root: error reply") ==
        loomSuccess)
        sock_send_auth(fd, &c->au, buf, sizeof(buf), dl, "bootstrap root: error reply");
    /* Closing a socket that still holds unread bytes (the rank's peer_info_t, sent right after
     * its handshake) resets the connection, and the reset discards the reason at the rank before
     * it reads it: say we are done, read until the rank closes (it does once it has the reason),
     * then close. */
    shutdown(fd, SHUT_WR);
    char sink[512];
    while (base_now_ns() < dl) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 50) < 0 && errno != EINTR) break;
        ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
    }
}

/* The sockets of the process's root threads: the listeners and their ranks' connections. They
 * belong to the parent's threads, which a forked child does not have: left open there, a
 * listener would accept ranks that nobody answers, and a connection would keep a rank from
 * seeing its root leave. The child closes them all (boot_atfork). */
static pthread_mutex_t root_fd_lock = PTHREAD_MUTEX_INITIALIZER;
static int *root_fds;
static int root_nfd, root_fd_cap;

/* Called with root_fd_lock held. */
static bool root_fd_add_locked(int fd)
{
    if (root_nfd == root_fd_cap) {
        int cap = root_fd_cap ? root_fd_cap * 2 : 16;
        int *n = realloc(root_fds, (size_t)cap * sizeof(*n));
        if (n == NULL) return false;
        root_fds = n;
        root_fd_cap = cap;
    }
    root_fds[root_nfd++] = fd;
    return true;
}

static bool root_fd_add(int fd)
{
    pthread_mutex_lock(&root_fd_lock);
    bool ok = root_fd_add_locked(fd);
    pthread_mutex_unlock(&root_fd_lock);
    return ok;
}

/* Forgets and closes fd under the lock, so a fork never sees a number that is already reused. */
static void root_close(int fd);

/* Reads more of a rank's address message into the part of it that lies between the message's
 * bytes base and end (its fixed part, its addresses, its tag), c->got being how far it came:
 * 1 when that part is complete, 0 when more is to come, -1 when the rank left (closed here). */
static int root_recv_part(boot_client_t *c, uint8_t *dst, size_t base, size_t end, const char *as)
{
    if (c->got >= end) return 1;
    ssize_t n = recv(c->hs.fd, dst + (c->got - base), end - c->got, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        WARN(LOG_BOOT, "bootstrap root %s: rank %d left before sending its address", as,
             c->hs.hello.from_rank);
        root_close(c->hs.fd);
        c->state = 3;
        return -1;
    }
    if (n > 0) c->got += (size_t)n;
    return c->got >= end ? 1 : 0;
}

static void root_close(int fd)
{
    pthread_mutex_lock(&root_fd_lock);
    for (int i = 0; i < root_nfd; i++)
        if (root_fds[i] == fd) {
            root_fds[i] = root_fds[--root_nfd];
            break;
        }
    close(fd);
    pthread_mutex_unlock(&root_fd_lock);
}

/* Accepts under the lock, so that no fork falls between the accept and the bookkeeping. */
static int root_accept(int lfd, sock_addr_t *peer)
{
    pthread_mutex_lock(&root_fd_lock);
    int fd = accept4(lfd, (struct sockaddr *)&peer->sa, &peer->len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0 && !root_fd_add_locked(fd)) {
        close(fd);
        fd = -1;
    }
    pthread_mutex_unlock(&root_fd_lock);
    return fd;
}

void boot_atfork(base_fork_phase_t phase)
{
    if (phase == BASE_FORK_PREPARE) {
        pthread_mutex_lock(&root_fd_lock);
    } else if (phase == BASE_FORK_PARENT) {
        pthread_mutex_unlock(&root_fd_lock);
    } else {
        for (int i = 0; i < root_nfd; i++)
            close(root_fds[i]);
        root_nfd = 0;
        pthread_mutex_unlock(&root_fd_lock);
    }
}

int boot_root_fd_count(void)
{
    pthread_mutex_lock(&root_fd_lock);
    int n = root_nfd;
    pthread_mutex_unlock(&root_fd_lock);
    return n;
}

/* Fails the whole rendezvous: every rank that arrived gets text (the root then exits). */
static void root_fail_all(boot_client_t *cl, int ncl, const char *text)
{
    WARN(LOG_BOOT, "%s", text);
    for (int i = 0; i < ncl; i++)
        if (cl[i].state == 1 || cl[i].state == 2) {
            root_send_error(&cl[i], text);
            root_close(cl[i].hs.fd);
            cl[i].state = 3;
        }
}

/* A connection that proved the secret becomes a client of the rendezvous. */
typedef struct {
    boot_client_t **cl;
    int *ncl, *cap;
} root_took_t;

static void root_take(void *arg, hs_t *hs)
{
    root_took_t *t = arg;
    if (*t->ncl == *t->cap) {
        int cap = *t->cap ? *t->cap * 2 : 16;
        boot_client_t *n = realloc(*t->cl, (size_t)cap * sizeof(*n));
        if (n == NULL) {
            root_close(hs->fd);
            return;
        }
        *t->cl = n;
        *t->cap = cap;
    }
    boot_client_t *c = &(*t->cl)[(*t->ncl)++];
    memset(c, 0, sizeof(*c));
    c->hs = *hs;
}

static void *root_main(void *arg)
{
    boot_root_args_t a = *(boot_root_args_t *)arg;
    free(arg);
    char as[SOCK_ADDR_STRLEN];
    sock_addr_str(&a.addr, as, sizeof(as));
    boot_client_t *cl = NULL;
    int ncl = 0, cap = 0, nranks = -1, joined = 0;
    peer_info_t *table = NULL;
    int *fd_of = NULL;
    sock_auth_t *auth_of = NULL;
    uint8_t **addr_of = NULL;
    uint64_t timeout = (uint64_t)(param_double(PARAM_TIMEOUT) * 1e9);
    uint64_t last_join = base_now_ns(), first_join = 0, failed_at = 0;
    int first_rank = -1;
    /* A rendezvous that failed: its reason, told to every rank that still arrives for a while
     * (LOOM_TIMEOUT, at most 10 s) before the root exits. */
    char failed[400] = "";
    uint64_t linger = timeout ? LOOM_MIN(timeout, 10000000000ull) : 10000000000ull;
    bool done = false;
    INFO(LOG_BOOT, "bootstrap root listening on %s", as);
    /* Connections still proving the secret wait in a bounded list (the oldest stranger dropped
     * first, refusals logged once per 10 s with a count: sock.h); those that proved it become
     * clients. */
    char who[SOCK_ADDR_STRLEN + 32];
    snprintf(who, sizeof(who), "bootstrap root %s", as);
    hs_pending_t pend = {.accept_fd = root_accept, .close_fd = root_close};
    root_took_t took = {.cl = &cl, .ncl = &ncl, .cap = &cap};
    while (!done) {
        struct pollfd *fds = calloc((size_t)ncl + 1 + HS_PENDING_MAX, sizeof(*fds));
        if (fds == NULL) break;
        fds[0] = (struct pollfd){.fd = a.listen_fd, .events = POLLIN};
        int nf = 1;
        for (int i = 0; i < ncl; i++) {
            short ev = cl[i].state == 0 ? hs_events(&cl[i].hs) : cl[i].state == 1 ? POLLIN : 0;
            if (ev) fds[nf++] = (struct pollfd){.fd = cl[i].hs.fd, .events = ev};
        }
        nf += hs_pending_pollfds(&pend, fds + nf, HS_PENDING_MAX);
        poll(fds, (nfds_t)nf, 100);
        free(fds);
        bool pprog = false;
        hs_pending_progress(&pend, a.listen_fd, a.secret, LOG_BOOT, who, root_take, &took, &pprog);
        for (int i = 0; i < ncl; i++) {
            boot_client_t *c = &cl[i];
            bool prog = false;
            if (c->state == 0) {
                if (hs_progress(&c->hs, &prog) != loomSuccess) {
                    WARN(LOG_BOOT, "bootstrap root %s refused a connection from %s", as, c->hs.err);
                    root_close(c->hs.fd);
                    c->state = 3;
                    continue;
                }
                if (c->hs.state != HS_DONE) continue;
                if (sock_auth_start(&c->au, &c->hs, base_now_ns() + 1000000000ull) != loomSuccess) {
                    char ps[SOCK_ADDR_STRLEN];
                    WARN(LOG_BOOT,
                         "bootstrap root %s: rank %d (from %s) passed the handshake "
                         "but not the start of its messages: %s",
                         as, c->hs.hello.from_rank, sock_addr_str(&c->hs.peer, ps, sizeof(ps)),
                         base_last_error());
                    root_close(c->hs.fd);
                    c->state = 3;
                    continue;
                }
                const hs_hello_t *h = &c->hs.hello;
                const char *why = NULL;
                if (failed[0] && h->comm_id == a.job_id) {
                    root_send_error(c, failed);
                    root_close(c->hs.fd);
                    c->state = 3;
                    continue;
                }
                if (h->comm_id != a.job_id || h->to_rank != BOOT_RANK_ROOT)
                    why = "wrong job";
                else if (h->nchan == 0 || h->nchan > (1u << 24))
                    why = "bad rank count";
                else if (h->from_rank < 0 || (uint32_t)h->from_rank >= h->nchan)
                    why = "bad rank";
                else if (nranks >= 0 && (int)h->nchan != nranks) {
                    char text[400];
                    snprintf(text, sizeof(text),
                             "bootstrap root %s: rank %d says the job has %u ranks, but rank %d "
                             "said %d: every rank must pass the same rank count (and unique id) "
                             "to loomCommInitRank",
                             as, h->from_rank, h->nchan, first_rank, nranks);
                    c->state = 1; /* refused with the others */
                    root_fail_all(cl, ncl, text);
                    snprintf(failed, sizeof(failed), "%s", text);
                    failed_at = base_now_ns();
                    continue;
                }
                if (why) {
                    char text[256];
                    snprintf(text, sizeof(text),
                             "bootstrap root %s refused rank %d (nranks %u): %s", as, h->from_rank,
                             h->nchan, why);
                    WARN(LOG_BOOT, "%s", text);
                    root_send_error(c, text);
                    root_close(c->hs.fd);
                    c->state = 3;
                    continue;
                }
                if (nranks < 0) {
                    nranks = (int)h->nchan;
                    first_rank = h->from_rank;
                    first_join = base_now_ns();
                    table = calloc((size_t)nranks, sizeof(*table));
                    fd_of = malloc((size_t)nranks * sizeof(int));
                    addr_of = calloc((size_t)nranks, sizeof(*addr_of));
                    auth_of = calloc((size_t)nranks, sizeof(*auth_of));
                    if (table == NULL || fd_of == NULL || addr_of == NULL || auth_of == NULL)
                        goto out;
                    for (int k = 0; k < nranks; k++)
                        fd_of[k] = -1;
                }
                c->state = 1;
            }
            if (c->state == 1) {
                if (root_recv_part(c, (uint8_t *)&c->info, 0, sizeof(c->info), as) <= 0) continue;
                if (c->info.addr_bytes > BOOT_ADDR_MAX) {
                    WARN(LOG_BOOT, "bootstrap root %s: rank %d announced %u bytes of addresses", as,
                         c->hs.hello.from_rank, c->info.addr_bytes);
                    root_close(c->hs.fd);
                    c->state = 3;
                    continue;
                }
                size_t want = sizeof(c->info) + c->info.addr_bytes;
                if (c->info.addr_bytes && c->addr == NULL &&
                    (c->addr = malloc(c->info.addr_bytes)) == NULL)
                    goto out;
                if (root_recv_part(c, c->addr, sizeof(c->info), want, as) <= 0 ||
                    root_recv_part(c, c->tag, want, want + SOCK_AUTH_TAG, as) <= 0)
                    continue;
                if (!sock_auth_check(&c->au, &c->info, sizeof(c->info), c->addr, c->info.addr_bytes,
                                     c->tag)) {
                    char text[400], ps[SOCK_ADDR_STRLEN];
                    snprintf(text, sizeof(text),
                             "bootstrap root %s: the address message of rank %d (from %s) failed "
                             "authentication (changed on the way, or injected by someone without "
                             "the job's secret); its connection is refused",
                             as, c->hs.hello.from_rank, sock_addr_str(&c->hs.peer, ps, sizeof(ps)));
                    WARN(LOG_BOOT, "%s", text);
                    root_send_error(c, text);
                    root_close(c->hs.fd);
                    c->state = 3;
                    continue;
                }
                int r = c->hs.hello.from_rank;
                if (c->info.rank != r || fd_of[r] >= 0) {
                    char text[256];
                    snprintf(text, sizeof(text), "bootstrap root %s: rank %d joined twice", as, r);
                    WARN(LOG_BOOT, "%s", text);
                    root_send_error(c, text);
                    root_close(c->hs.fd);
                    c->state = 3;
                    continue;
                }
                table[r] = c->info;
                fd_of[r] = c->hs.fd;
                auth_of[r] = c->au; /* the service takes it over with the connection */
                addr_of[r] = c->addr;
                c->state = 2;
                joined++;
                last_join = base_now_ns();
                TRACE(LOG_BOOT, "bootstrap root: rank %d joined (%d of %d)", r, joined, nranks);
            }
        }
        if (failed[0]) {
            if (base_now_ns() - failed_at > linger) break;
        } else if (nranks > 0 && joined == nranks) {
            boot_reply_t rep = {.status = 0, .nranks = nranks};
            uint64_t dl = base_now_ns() + timeout;
            for (int r = 0; r < nranks; r++) {
                /* A rank that died after joining only fails itself: the others carry on. */
                if (sock_send_auth(fd_of[r], &auth_of[r], &rep, sizeof(rep), dl,
                                   "bootstrap root: reply") != loomSuccess ||
                    sock_send_auth(fd_of[r], &auth_of[r], table, sizeof(*table) * (size_t)nranks,
                                   dl, "bootstrap root: sending the rank table") != loomSuccess)
                    continue;
                for (int q = 0; q < nranks; q++)
                    if (table[q].addr_bytes &&
                        sock_send_auth(fd_of[r], &auth_of[r], addr_of[q], table[q].addr_bytes, dl,
                                       "bootstrap root: sending the transport addresses") !=
                            loomSuccess)
                        break;
            }
            done = true;
            /* The ranks keep these connections: the job-state service takes them over. */
            char(*host_of)[JS_HOST_LEN] = calloc((size_t)nranks, JS_HOST_LEN);
            if (host_of == NULL) break;
            for (int r = 0; r < nranks; r++)
                snprintf(host_of[r], JS_HOST_LEN, "%s", table[r].host);
            for (int i = 0; i < ncl; i++)
                if (cl[i].state == 2) cl[i].state = 3;
            js_serve_args_t sa = {.listen_fd = a.listen_fd,
                                  .job_id = a.job_id,
                                  .addr_str = as,
                                  .nranks = nranks,
                                  .fd_of = fd_of,
                                  .auth_of = auth_of,
                                  .host_of = (const char(*)[JS_HOST_LEN])host_of,
                                  .accept_fd = root_accept,
                                  .close_fd = root_close};
            memcpy(sa.secret, a.secret, sizeof(sa.secret));
            hs_pending_report(&pend, LOG_BOOT, who);
            hs_pending_free(&pend); /* strangers at the rendezvous: the service has its own */
            js_serve(&sa);
            free(host_of);
        } else if (timeout && nranks < 0 && base_now_ns() - last_join > timeout) {
            INFO(LOG_BOOT, "bootstrap root %s closes: no rank used this id for LOOM_TIMEOUT=%g s",
                 as, param_double(PARAM_TIMEOUT));
            break;
        } else if (timeout && nranks > 0 && base_now_ns() - first_join > timeout) {
            /* Name the ranks that never came (the first few), on every rank that did. */
            char missing[200] = "";
            size_t o = 0;
            int nmiss = 0;
            for (int r = 0; r < nranks; r++) {
                if (fd_of[r] >= 0) continue;
                if (nmiss < 8 && o + 16 < sizeof(missing))
                    o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%d",
                                          nmiss ? ", " : "", r);
                nmiss++;
            }
            char text[400];
            snprintf(text, sizeof(text),
                     "rank%s %s%s never arrived at the bootstrap root %s within LOOM_TIMEOUT=%g s "
                     "of the first rank; %d of %d ranks joined (is every rank started, with the "
                     "same unique id?)",
                     nmiss > 1 ? "s" : "", missing, nmiss > 8 ? ", ..." : "", as,
                     param_double(PARAM_TIMEOUT), joined, nranks);
            root_fail_all(cl, ncl, text);
            snprintf(failed, sizeof(failed), "%s", text);
            failed_at = base_now_ns();
        }
    }
out:
    hs_pending_report(&pend, LOG_BOOT, who);
    hs_pending_free(&pend);
    for (int i = 0; i < ncl; i++) {
        if (cl[i].state != 3) root_close(cl[i].hs.fd);
        free(cl[i].addr);
    }
    free(cl);
    free(addr_of);
    free(table);
    free(fd_of);
    if (auth_of) sodium_memzero(auth_of, (size_t)LOOM_MAX(nranks, 0) * sizeof(*auth_of));
    free(auth_of);
    root_close(a.listen_fd);
    return NULL;
}

/* Listens at addr (its port, or any when 0) and starts the root thread there. */
static loomResult_t boot_root_start(const sock_addr_t *addr, const uint8_t secret[16],
                                    uint64_t job_id, sock_addr_t *bound)
{
    int fd;
    core_fork_init();
    LOOM_CHECK(sock_listen(addr, 4096, &fd, bound));
    boot_root_args_t *a = malloc(sizeof(*a));
    if (a == NULL || !root_fd_add(fd)) {
        free(a);
        close(fd);
        return base_error(loomSystemError, LOG_BOOT, "out of memory");
    }
    a->listen_fd = fd;
    memcpy(a->secret, secret, 16);
    a->job_id = job_id;
    a->addr = *bound;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int e = pthread_create(&t, &attr, root_main, a);
    pthread_attr_destroy(&attr);
    if (e != 0) {
        root_close(fd);
        free(a);
        return base_error(loomSystemError, LOG_BOOT, "pthread_create (bootstrap root): %s",
                          strerror(e));
    }
    return loomSuccess;
}

loomResult_t boot_uid_create(loomUniqueId *id)
{
    uid_layout_t u;
    memset(&u, 0, sizeof(u));
    u.magic = UID_MAGIC;
    u.version = UID_VERSION;
    LOOM_CHECK(base_random(u.secret, sizeof(u.secret)));
    LOOM_CHECK(base_random(&u.job_id, sizeof(u.job_id)));
    sock_addr_t addr, bound;
    char ifname[64];
    LOOM_CHECK(sock_pick_address(&addr, ifname, sizeof(ifname)));
    LOOM_CHECK(boot_root_start(&addr, u.secret, u.job_id, &bound));
    sock_addr_pack(&bound, u.root_addr);
    char as[SOCK_ADDR_STRLEN];
    INFO(LOG_BOOT, "unique id: root %s on %s", sock_addr_str(&bound, as, sizeof(as)), ifname);
    memcpy(id, &u, sizeof(u));
    return loomSuccess;
}

loomResult_t boot_uid_master(const char *maddr, const char *mport, int rank, int nranks,
                             loomUniqueId *id)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(maddr, mport, &hints, &res);
    if (g != 0 || res == NULL)
        return base_error(loomInvalidUsage, LOG_BOOT, "MASTER_ADDR=%s MASTER_PORT=%s: %s", maddr,
                          mport, gai_strerror(g));
    sock_addr_t root;
    memset(&root, 0, sizeof(root));
    memcpy(&root.sa, res->ai_addr, res->ai_addrlen);
    root.len = res->ai_addrlen;
    freeaddrinfo(res);
    uid_layout_t u;
    memset(&u, 0, sizeof(u));
    u.magic = UID_MAGIC;
    u.version = UID_VERSION;
    const char *secret = param_str(PARAM_JOB_SECRET);
    if (secret[0]) {
        LOOM_CHECK(base_derive_key(secret, u.secret));
    } else if (rank == 0) {
        WARN(LOG_BOOT,
             "no LOOM_JOB_SECRET: the rendezvous at %s:%s trusts whoever reaches it first; a "
             "launcher should export one random value to every rank",
             maddr, mport);
    }
    char ident[300];
    int n = snprintf(ident, sizeof(ident), "%s:%s/%d", maddr, mport, nranks);
    /* Keyed by the secret through a MAC, not a plain hash: the communicator id derived from the
     * job id crosses the wire, and a plain (invertible) hash would publish a fingerprint of the
     * secret with it. */
    uint8_t tag[BASE_MAC_BYTES];
    LOOM_CHECK(base_mac(u.secret, "loom job id", ident, (size_t)n, NULL, 0, tag));
    memcpy(&u.job_id, tag, sizeof(u.job_id));
    sock_addr_pack(&root, u.root_addr);
    if (rank == 0) {
        sock_addr_t bound;
        LOOM_CHECK(boot_root_start(&root, u.secret, u.job_id, &bound));
        char as[SOCK_ADDR_STRLEN];
        INFO(LOG_BOOT, "rank 0 serves the rendezvous at %s (from MASTER_ADDR/MASTER_PORT)",
             sock_addr_str(&bound, as, sizeof(as)));
    }
    memcpy(id, &u, sizeof(u));
    return loomSuccess;
}

/* Meets the other ranks through the root at uid. adopt: the table fills comm->lay.peers and the
 * transport addresses; otherwise (a child's service: the child has its table) both are read
 * and dropped, and only the connection is kept. */
static loomResult_t rendezvous(loomComm_t comm, const uid_layout_t *uid, const peer_info_t *mine,
                               bool adopt)
{
    sock_addr_t root;
    char as[SOCK_ADDR_STRLEN], what[320];
    if (!sock_addr_unpack(uid->root_addr, &root))
        return base_error(loomInvalidArgument, LOG_BOOT, "the unique id holds no root address");
    sock_addr_str(&root, as, sizeof(as));
    uint64_t timeout = (uint64_t)(comm->tune.timeout_s * 1e9);
    uint64_t dl = base_now_ns() + (timeout ? timeout : UINT64_MAX / 2);
    int fd = -1;
    loomResult_t r = loomSuccess;
    sock_auth_t au;
    /* The root may not be listening yet if its process starts late: retry refused connects. */
    for (;;) {
        LOOM_CHECK(sock_connect_start(&root, &fd));
        hs_t hs;
        hs_hello_t hello = {.comm_id = uid->job_id,
                            .from_rank = comm->rank,
                            .to_rank = BOOT_RANK_ROOT,
                            .chan = 0,
                            .nchan = (uint32_t)comm->nranks};
        hs_connect_init(&hs, fd, &root, uid->secret, &hello);
        r = hs_run_blocking(&hs);
        if (r == loomSuccess) r = sock_auth_start(&au, &hs, dl);
        if (r == loomSuccess) break;
        close(fd);
        fd = -1;
        if (base_now_ns() > dl)
            return base_error(r, LOG_BOOT, "bootstrap: cannot reach the root: %s", hs.err);
        usleep(100000);
    }
    snprintf(what, sizeof(what), "bootstrap: sending rank %d's address to the root %s", comm->rank,
             as);
    uint8_t tag[SOCK_AUTH_TAG];
    sock_auth_tag(&au, mine, sizeof(*mine), comm->net.my_addr, mine->addr_bytes, tag);
    LOOM_CHECK_GOTO(sock_send_all(fd, mine, sizeof(*mine), dl, what), r, out);
    if (mine->addr_bytes)
        LOOM_CHECK_GOTO(sock_send_all(fd, comm->net.my_addr, mine->addr_bytes, dl, what), r, out);
    LOOM_CHECK_GOTO(sock_send_all(fd, tag, sizeof(tag), dl, what), r, out);
    boot_reply_t rep;
    snprintf(what, sizeof(what),
             "bootstrap: waiting at the root %s for all %d ranks to join (is every rank started "
             "with the same unique id and rank count?)",
             as, comm->nranks);
    /* The root judges a rendezvous that cannot complete (and names the missing ranks) at
     * LOOM_TIMEOUT after the first rank's arrival: give its reason time to arrive. */
    LOOM_CHECK_GOTO(
        sock_recv_auth(fd, &au, &rep, sizeof(rep), timeout ? dl + BOOT_REASON_GRACE_NS : dl, what),
        r, out);
    if (rep.status != 0) {
        char text[512];
        if (sock_recv_auth(fd, &au, text, sizeof(text), base_now_ns() + 1000000000ull, what) !=
            loomSuccess)
            snprintf(text, sizeof(text), "(no reason given: %.400s)", base_last_error());
        text[sizeof(text) - 1] = '\0';
        r = base_error(loomInvalidUsage, LOG_BOOT, "bootstrap refused: %s", text);
        goto out;
    }
    if (rep.nranks != comm->nranks) {
        r = base_error(loomInternalError, LOG_BOOT, "bootstrap: root answered for %d ranks",
                       rep.nranks);
        goto out;
    }
    snprintf(what, sizeof(what), "bootstrap: receiving the rank table from the root %s", as);
    peer_info_t *table = comm->lay.peers;
    if (!adopt && (table = malloc(sizeof(peer_info_t) * (size_t)comm->nranks)) == NULL) {
        r = base_error(loomSystemError, LOG_BOOT, "out of memory (rank table)");
        goto out;
    }
    r = sock_recv_auth(fd, &au, table, sizeof(peer_info_t) * (size_t)comm->nranks, dl, what);
    size_t total = 0;
    for (int q = 0; q < comm->nranks && r == loomSuccess; q++)
        total += table[q].addr_bytes;
    if (!adopt) free(table);
    if (r != loomSuccess) goto out;
    if (total) {
        uint8_t *buf = malloc(total);
        if (buf == NULL) {
            r = base_error(loomSystemError, LOG_BOOT, "out of memory (transport addresses)");
            goto out;
        }
        snprintf(what, sizeof(what),
                 "bootstrap: receiving the transport addresses from the root %s", as);
        size_t off = 0;
        for (int q = 0; q < comm->nranks && r == loomSuccess; q++) {
            size_t n = comm->lay.peers[q].addr_bytes;
            if (n) r = sock_recv_auth(fd, &au, buf + off, n, dl, what);
            off += n;
        }
        if (r != loomSuccess || !adopt) {
            free(buf);
            if (r != loomSuccess) goto out;
        } else {
            r = comm_set_peer_addrs(comm, buf, total);
        }
    }
    if (r == loomSuccess) {
        /* The connection stays: the root is now the job-state service. Without it the rank
         * still works (link-based detection only). */
        js_hooks_t hk;
        comm_js_hooks(comm, &hk);
        if (js_client_start(fd, &root, &au, &hk, &comm->js) != loomSuccess)
            WARN(LOG_BOOT, "rank %d: no job-state service (%s)", comm->rank, base_last_error());
        return loomSuccess;
    }
out:
    close(fd);
    return r;
}

loomResult_t boot_rendezvous(loomComm_t comm, const uid_layout_t *uid, const peer_info_t *mine)
{
    return rendezvous(comm, uid, mine, true);
}

loomResult_t boot_child_service(loomComm_t child)
{
    if (child->nranks < 2) return loomSuccess;
    uid_layout_t u;
    memset(&u, 0, sizeof(u));
    u.magic = UID_MAGIC;
    u.version = UID_VERSION;
    memcpy(u.secret, child->lay.secret, sizeof(u.secret));
    u.job_id = base_hash64("loom job-state", 14, child->lay.comm_id);
    uint8_t mine[32] = {0};
    if (child->rank == 0) {
        sock_addr_t addr, bound;
        char ifname[64];
        if (sock_pick_address(&addr, ifname, sizeof(ifname)) == loomSuccess &&
            boot_root_start(&addr, u.secret, u.job_id, &bound) == loomSuccess)
            sock_addr_pack(&bound, mine);
        else
            WARN(LOG_BOOT, "rank 0 of a %d-rank child communicator: no job-state service (%s)",
                 child->nranks, base_last_error());
    }
    /* Every rank takes part in the exchange, also when rank 0 has no service to offer. */
    uint8_t *all = calloc((size_t)child->nranks, sizeof(mine));
    if (all == NULL) return base_error(loomSystemError, LOG_INIT, "out of memory");
    const void *send = mine;
    void *recv = all;
    loomResult_t r = coll_allgather_many(&child, &send, &recv, sizeof(mine), 1);
    if (r == loomSuccess) memcpy(u.root_addr, all, sizeof(u.root_addr));
    free(all);
    if (r != loomSuccess) return r;
    sock_addr_t root;
    if (!sock_addr_unpack(u.root_addr, &root)) return loomSuccess; /* rank 0 warned */
    peer_info_t me = child->lay.peers[child->rank];
    me.addr_bytes = 0; /* the child has the addresses */
    if (rendezvous(child, &u, &me, false) != loomSuccess)
        WARN(LOG_BOOT, "rank %d of a %d-rank child communicator: no job-state service (%s)",
             child->rank, child->nranks, base_last_error());
    return loomSuccess;
}
