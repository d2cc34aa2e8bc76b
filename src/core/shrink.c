/*
 * loomCommShrink: a communicator of the survivors of a parent, without the excluded (dead)
 * ranks and without a new unique id.
 *
 * The parent's links cannot carry the agreement: after a peer died its transports are aborted
 * (comm_set_error), and an exchange over them would wait on the dead rank. So every
 * communicator keeps, from its creation, one more listening socket per rank (the shrink
 * listener, its address in peer_info_t.shrink_addr, known to every peer through the bootstrap or
 * split). Nothing reads it until a shrink: connections wait in the kernel's queue, which costs
 * one descriptor and no thread.
 *
 * At a shrink every survivor computes the same survivor list from its exclude list; the lowest
 * surviving parent rank (the child's rank 0) is the meeting point. Each other survivor connects
 * to its shrink listener, proves the job's secret (sock.h's handshake, for this parent and this
 * shrink's sequence number), and sends its record: its parent rank, its exclude list, and its
 * child's peer_info_t (the handles of the child's fresh transports, its own shrink listener)
 * and large addresses. Once every survivor it expects has arrived with the same exclude list,
 * the meeting point answers everyone with the child's table; if any list differs, a rank it
 * expects does not come within LOOM_TIMEOUT, or a rank it excluded calls in, everyone connected
 * gets the same error naming the ranks and their lists. Nothing waits without a bound.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "param.h"

#define SHRINK_HELLO_RANK (-2) /* to_rank of a shrink handshake */
#define SHRINK_TEXT_MAX 1024

typedef struct {
    int32_t parent_rank;
    int32_t nexclude;
    peer_info_t info; /* the child's, with its rank in the child */
} shrink_rec_t;

typedef struct {
    int32_t status; /* 0: the table follows; else a text of SHRINK_TEXT_MAX */
    int32_t nranks;
} shrink_reply_t;

loomResult_t comm_shrink_listen(loomComm_t comm, uint8_t addr[32])
{
    memset(addr, 0, 32);
    sock_addr_t a, bound;
    char ifname[64];
    LOOM_CHECK(sock_pick_address(&a, ifname, sizeof(ifname)));
    if (a.sa.ss_family == AF_INET)
        ((struct sockaddr_in *)&a.sa)->sin_port = 0;
    else if (a.sa.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&a.sa)->sin6_port = 0;
    LOOM_CHECK(sock_listen(&a, 256, &comm->net.shrink_fd, &bound));
    sock_addr_pack(&bound, addr);
    return loomSuccess;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* "[1 3]" */
static void list_str(const int32_t *l, int n, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? " " : "", l[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* This shrink's identity in the handshake: the parent, and how many shrinks it has had. */
static uint64_t shrink_key(loomComm_t comm)
{
    return base_hash64(&comm->seq.shrink, sizeof(comm->seq.shrink),
                       comm->lay.comm_id ^ 0x736872696e6bull);
}

typedef struct {
    int fd;
    int parent_rank;
    sock_auth_t au; /* every message after the handshake is authenticated (sock.h) */
    int32_t *excl;
    int nexcl;
    shrink_rec_t rec;
    uint8_t *addr;
} shrink_client_t;

static void client_free(shrink_client_t *c)
{
    /* drained first: a close with the rank's bytes unread would reset the connection and lose
     * the reply it has not read yet */
    if (c->fd >= 0) sock_drain_close(c->fd);
    free(c->excl);
    free(c->addr);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

static void send_error(shrink_client_t *c, const char *text);

/* Accepts one survivor at the meeting point: handshake, record, exclude list, addresses. On
 * failure the connection is dropped (a stranger, or a rank of another shrink) and 0 returned. */
typedef struct {
    hs_t *hs;
    int n, cap;
} shrink_done_t;

static void shrink_took(void *arg, hs_t *hs)
{
    shrink_done_t *d = arg;
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 8;
        hs_t *n = realloc(d->hs, (size_t)cap * sizeof(*n));
        if (n == NULL) {
            close(hs->fd);
            return;
        }
        d->hs = n, d->cap = cap;
    }
    d->hs[d->n++] = *hs;
}

/* A connection that proved the secret (the meeting point's pending list did the handshake, so
 * that a silent stranger holds up nobody): a survivor of this shrink, whose record is read. */
static int take_one(loomComm_t comm, uint64_t key, uint64_t dl, hs_t hs, shrink_client_t *c)
{
    int fd = hs.fd;
    if (hs.hello.comm_id != key || hs.hello.to_rank != SHRINK_HELLO_RANK ||
        hs.hello.from_rank < 0 || hs.hello.from_rank >= comm->nranks ||
        hs.hello.nchan > (uint32_t)comm->nranks ||
        sock_auth_start(&c->au, &hs, LOOM_MIN(dl, base_now_ns() + 1000000000ull)) != loomSuccess) {
        INFO(LOG_INIT, "shrink: refused a connection (%s)",
             hs.err[0] ? hs.err : "another shrink, or not a survivor");
        close(fd);
        return 0;
    }
    c->fd = fd;
    c->parent_rank = hs.hello.from_rank;
    char what[96];
    snprintf(what, sizeof(what), "shrink: reading rank %d's record", c->parent_rank);
    if (sock_recv_auth(fd, &c->au, &c->rec, sizeof(c->rec), dl, what) != loomSuccess ||
        c->rec.parent_rank != c->parent_rank || c->rec.nexclude < 0 ||
        c->rec.nexclude >= comm->nranks || c->rec.info.addr_bytes > (1u << 20))
        goto bad;
    c->nexcl = c->rec.nexclude;
    c->excl = calloc((size_t)c->nexcl + 1, sizeof(int32_t));
    c->addr = malloc((size_t)c->rec.info.addr_bytes + 1);
    if (c->excl == NULL || c->addr == NULL ||
        sock_recv_auth(fd, &c->au, c->excl, (size_t)c->nexcl * sizeof(int32_t), dl, what) !=
            loomSuccess ||
        sock_recv_auth(fd, &c->au, c->addr, c->rec.info.addr_bytes, dl, what) != loomSuccess)
        goto bad;
    return 1;
bad:;
    /* It is told why (an authentic reply: its record was damaged or injected on the way). */
    char text[SHRINK_TEXT_MAX];
    snprintf(text, sizeof(text), "loomCommShrink: rank %d refused rank %d's record: %.900s",
             comm->rank, c->parent_rank, base_last_error());
    WARN(LOG_INIT, "%s", text);
    send_error(c, text);
    client_free(c);
    return 0;
}

static void send_error(shrink_client_t *c, const char *text)
{
    shrink_reply_t rep = {.status = 1};
    char buf[SHRINK_TEXT_MAX] = {0};
    snprintf(buf, sizeof(buf), "%s", text);
    uint64_t dl = base_now_ns() + 1000000000ull;
    if (sock_send_auth(c->fd, &c->au, &rep, sizeof(rep), dl, "shrink: error reply") == loomSuccess)
        sock_send_auth(c->fd, &c->au, buf, sizeof(buf), dl, "shrink: error reply");
}

/* The meeting point: collects the n-1 other survivors' records into table (child rank order)
 * and addrs, checks that their exclude lists are its own, answers them all. */
static loomResult_t shrink_serve(loomComm_t comm, uint64_t key, const int *surv, int n,
                                 const int32_t *excl, int nexcl, peer_info_t *table,
                                 uint8_t **addrs, uint64_t dl)
{
    shrink_client_t *cl = calloc((size_t)comm->nranks, sizeof(*cl));
    int *child_of = malloc((size_t)comm->nranks * sizeof(int));
    if (cl == NULL || child_of == NULL) {
        free(cl);
        free(child_of);
        return base_error(loomSystemError, LOG_INIT, "out of memory (shrink)");
    }
    for (int q = 0; q < comm->nranks; q++) {
        cl[q].fd = -1;
        child_of[q] = -1;
    }
    for (int i = 0; i < n; i++)
        child_of[surv[i]] = i;
    int arrived = 0;
    bool disagree = false;
    char mine[256];
    list_str(excl, nexcl, mine, sizeof(mine));
    /* Connections still proving the secret: sock.h's bounded list (strangers dropped oldest
     * first, their refusals counted), the finished ones taken in turn below. */
    hs_pending_t pend = {0};
    shrink_done_t fin = {0};
    char who[64];
    snprintf(who, sizeof(who), "shrink: rank %d's meeting point", comm->rank);
    struct pollfd fds[1 + HS_PENDING_MAX];
    for (uint64_t now = base_now_ns(); arrived < n - 1 && now < dl; now = base_now_ns()) {
        if (fin.n == 0) {
            fds[0] = (struct pollfd){.fd = comm->net.shrink_fd, .events = POLLIN};
            int nf = 1 + hs_pending_pollfds(&pend, fds + 1, HS_PENDING_MAX);
            uint64_t left_ms = (dl - now) / 1000000 + 1;
            (void)poll(fds, (nfds_t)nf, (int)LOOM_MIN(left_ms, 100));
            bool prog = false;
            hs_pending_progress(&pend, comm->net.shrink_fd, comm->lay.secret, LOG_INIT, who,
                                shrink_took, &fin, &prog);
            if (fin.n == 0) continue;
        }
        shrink_client_t c;
        memset(&c, 0, sizeof(c));
        c.fd = -1;
        hs_t hs = fin.hs[--fin.n];
        if (!take_one(comm, key, dl, hs, &c)) continue;
        int q = c.parent_rank;
        if (q == comm->rank || cl[q].fd >= 0) {
            send_error(&c, "shrink: this rank joined twice");
            client_free(&c);
            continue;
        }
        cl[q] = c;
        bool same = c.nexcl == nexcl && memcmp(c.excl, excl, (size_t)nexcl * sizeof(int32_t)) == 0;
        if (!same || child_of[q] < 0) {
            /* Wait a little for the others, so that the error names them all. */
            disagree = true;
            dl = LOOM_MIN(dl, base_now_ns() + 1000000000ull);
        }
        if (child_of[q] >= 0) arrived++;
    }
    for (int i = 0; i < fin.n; i++) /* proved the secret, but the meeting is over */
        close(fin.hs[i].fd);
    free(fin.hs);
    hs_pending_report(&pend, LOG_INIT, who);
    hs_pending_free(&pend);
    char text[SHRINK_TEXT_MAX];
    size_t o = 0;
    if (disagree || arrived < n - 1) {
        o += (size_t)snprintf(text + o, sizeof(text) - o,
                              "loomCommShrink: the survivors do not agree (rank %d, where they "
                              "meet, excludes %s):",
                              comm->rank, mine);
        for (int q = 0; q < comm->nranks && o < sizeof(text); q++) {
            if (q == comm->rank) continue;
            char l[256];
            if (cl[q].fd >= 0) {
                bool same = cl[q].nexcl == nexcl &&
                            memcmp(cl[q].excl, excl, (size_t)nexcl * sizeof(int32_t)) == 0;
                if (same && child_of[q] >= 0) continue;
                list_str(cl[q].excl, cl[q].nexcl, l, sizeof(l));
                o += (size_t)snprintf(text + o, sizeof(text) - o, " rank %d excludes %s%s;", q, l,
                                      child_of[q] < 0 ? " (and calls in, though excluded)" : "");
            } else if (child_of[q] >= 0) {
                o += (size_t)snprintf(text + o, sizeof(text) - o,
                                      " rank %d did not call loomCommShrink within LOOM_TIMEOUT "
                                      "(dead? then exclude it too);",
                                      q);
            }
        }
        if (o > 0 && o < sizeof(text) && text[o - 1] == ';') text[o - 1] = '\0';
        for (int q = 0; q < comm->nranks; q++)
            if (cl[q].fd >= 0) send_error(&cl[q], text);
        for (int q = 0; q < comm->nranks; q++)
            client_free(&cl[q]);
        free(cl);
        free(child_of);
        return base_error(loomInvalidUsage, LOG_INIT, "%s", text);
    }
    for (int q = 0; q < comm->nranks; q++)
        if (cl[q].fd >= 0) {
            table[child_of[q]] = cl[q].rec.info;
            addrs[child_of[q]] = cl[q].addr;
            cl[q].addr = NULL;
        }
    shrink_reply_t rep = {.status = 0, .nranks = n};
    loomResult_t r = loomSuccess;
    for (int q = 0; q < comm->nranks; q++) {
        if (cl[q].fd < 0) continue;
        int fd = cl[q].fd;
        char what[96];
        snprintf(what, sizeof(what), "shrink: sending the table to rank %d", q);
        sock_auth_t *au = &cl[q].au;
        loomResult_t s = sock_send_auth(fd, au, &rep, sizeof(rep), dl, what);
        if (s == loomSuccess)
            s = sock_send_auth(fd, au, table, sizeof(*table) * (size_t)n, dl, what);
        for (int i = 0; i < n && s == loomSuccess; i++)
            if (table[i].addr_bytes)
                s = sock_send_auth(fd, au, addrs[i], table[i].addr_bytes, dl, what);
        if (s != loomSuccess && r == loomSuccess) r = s;
    }
    for (int q = 0; q < comm->nranks; q++)
        client_free(&cl[q]);
    free(cl);
    free(child_of);
    return r;
}

/* A survivor other than the meeting point: sends its record, receives the table. */
static loomResult_t shrink_join(loomComm_t comm, uint64_t key, int root, int n,
                                const shrink_rec_t *rec, const int32_t *excl, const uint8_t *addr,
                                peer_info_t *table, uint8_t **addrs, uint64_t dl)
{
    sock_addr_t ra;
    if (!sock_addr_unpack(comm->lay.peers[root].shrink_addr, &ra))
        return base_error(loomInvalidUsage, LOG_INIT,
                          "loomCommShrink: rank %d published no shrink address", root);
    char as[SOCK_ADDR_STRLEN], what[256];
    sock_addr_str(&ra, as, sizeof(as));
    int fd = -1;
    loomResult_t r;
    sock_auth_t au;
    for (;;) {
        LOOM_CHECK(sock_connect_start(&ra, &fd));
        hs_t hs;
        hs_hello_t hello = {.comm_id = key,
                            .from_rank = comm->rank,
                            .to_rank = SHRINK_HELLO_RANK,
                            .nchan = (uint32_t)rec->nexclude};
        hs_connect_init(&hs, fd, &ra, comm->lay.secret, &hello);
        r = hs_run_blocking(&hs);
        if (r == loomSuccess) r = sock_auth_start(&au, &hs, dl);
        if (r == loomSuccess) break;
        close(fd);
        fd = -1;
        if (base_now_ns() > dl)
            return base_error(loomRemoteError, LOG_INIT,
                              "loomCommShrink: cannot reach rank %d, where the survivors meet "
                              "(%s): %s; if it died, exclude it too",
                              root, as, hs.err);
        usleep(50000);
    }
    snprintf(what, sizeof(what),
             "loomCommShrink: rank %d sending its record to rank %d (%s), where the survivors "
             "meet",
             comm->rank, root, as);
    LOOM_CHECK_GOTO(sock_send_auth(fd, &au, rec, sizeof(*rec), dl, what), r, out);
    LOOM_CHECK_GOTO(
        sock_send_auth(fd, &au, excl, (size_t)rec->nexclude * sizeof(int32_t), dl, what), r, out);
    LOOM_CHECK_GOTO(sock_send_auth(fd, &au, addr, rec->info.addr_bytes, dl, what), r, out);
    snprintf(what, sizeof(what),
             "loomCommShrink: rank %d waiting for rank %d (%s) to hear from all %d survivors "
             "(does every survivor call loomCommShrink with the same exclude list?)",
             comm->rank, root, as, n);
    /* The meeting point's own deadline rules: it answers (with an error naming whoever did not
     * come) just after it, so wait a little longer than that for its answer. */
    dl += 2000000000ull;
    shrink_reply_t rep;
    LOOM_CHECK_GOTO(sock_recv_auth(fd, &au, &rep, sizeof(rep), dl, what), r, out);
    if (rep.status != 0) {
        char text[SHRINK_TEXT_MAX];
        if (sock_recv_auth(fd, &au, text, sizeof(text), dl, what) != loomSuccess)
            snprintf(text, sizeof(text), "loomCommShrink: rank %d refused (no reason given)", root);
        text[sizeof(text) - 1] = '\0';
        r = base_error(loomInvalidUsage, LOG_INIT, "%s", text);
        goto out;
    }
    if (rep.nranks != n) {
        r = base_error(loomInternalError, LOG_INIT, "loomCommShrink: rank %d answered for %d ranks",
                       root, rep.nranks);
        goto out;
    }
    LOOM_CHECK_GOTO(sock_recv_auth(fd, &au, table, sizeof(*table) * (size_t)n, dl, what), r, out);
    for (int i = 0; i < n; i++) {
        if (table[i].addr_bytes > (1u << 20)) {
            r = base_error(loomRemoteError, LOG_INIT, "loomCommShrink: a bad table from rank %d",
                           root);
            goto out;
        }
        addrs[i] = malloc((size_t)table[i].addr_bytes + 1);
        if (addrs[i] == NULL) {
            r = base_error(loomSystemError, LOG_INIT, "out of memory (shrink)");
            goto out;
        }
        if (table[i].addr_bytes) /* sent (and tagged) only when there are some */
            LOOM_CHECK_GOTO(sock_recv_auth(fd, &au, addrs[i], table[i].addr_bytes, dl, what), r,
                            out);
    }
out:
    close(fd);
    return r;
}

loomResult_t comm_shrink(loomComm_t comm, const int *exclude, int nexclude, const loomConfig_t *cfg,
                         loomComm_t *newcomm)
{
    int P = comm->nranks, n = 0, me = -1;
    int32_t *excl = malloc(((size_t)nexclude + 1) * sizeof(int32_t));
    int *surv = malloc((size_t)P * sizeof(int));
    bool *out_set = calloc((size_t)P, sizeof(bool));
    peer_info_t *table = NULL;
    uint8_t **addrs = NULL;
    loomComm_t child = NULL;
    loomResult_t r = loomSuccess;
    int seg_fd = -1;
    if (excl == NULL || surv == NULL || out_set == NULL) {
        r = base_error(loomSystemError, LOG_INIT, "out of memory (shrink)");
        goto out;
    }
    for (int i = 0; i < nexclude; i++)
        excl[i] = exclude[i];
    qsort(excl, (size_t)nexclude, sizeof(int32_t), cmp_int);
    for (int i = 0; i < nexclude; i++)
        out_set[excl[i]] = true;
    for (int q = 0; q < P; q++)
        if (!out_set[q]) {
            if (q == comm->rank) me = n;
            surv[n++] = q;
        }
    uint64_t key = shrink_key(comm);
    comm->seq.shrink++;
    LOOM_CHECK_GOTO(comm_alloc(n, me, cfg, &child), r, out);
    child->lay.comm_id = base_hash64(surv, (size_t)n * sizeof(int), key);
    memcpy(child->lay.secret, comm->lay.secret, 16);
    shrink_rec_t rec = {.parent_rank = comm->rank, .nexclude = nexclude};
    rec.info = comm->lay.peers[comm->rank];
    rec.info.rank = me;
    /* the child's rank 0 offers a node segment when every survivor is on its node (init's rank
     * 0's offer, which the parent's record may hold, is not the child's) */
    memset(&rec.info.seg, 0, sizeof(rec.info.seg));
    bool one_node = true;
    for (int i = 0; i < n && me == 0; i++)
        one_node &= comm->lay.peers[surv[i]].node_hash == comm->lay.peers[comm->rank].node_hash;
    if (me == 0 && one_node) seg_fd = nodeseg_create(n, &rec.info.seg);
    LOOM_CHECK_GOTO(comm_start_transport(child, rec.info.handle), r, out);
    LOOM_CHECK_GOTO(comm_shrink_listen(child, rec.info.shrink_addr), r, out);
    rec.info.addr_bytes = child->net.my_addr_len;
    table = calloc((size_t)n, sizeof(*table));
    addrs = calloc((size_t)n, sizeof(*addrs));
    if (table == NULL || addrs == NULL) {
        r = base_error(loomSystemError, LOG_INIT, "out of memory (shrink)");
        goto out;
    }
    double to = comm->tune.timeout_s;
    uint64_t dl = base_now_ns() + (to > 0 ? (uint64_t)(to * 1e9) : UINT64_MAX / 4);
    if (me == 0) {
        /* The meeting point's own row first: the table it sends holds everyone's. */
        table[0] = rec.info;
        if (rec.info.addr_bytes) {
            addrs[0] = malloc(rec.info.addr_bytes);
            if (addrs[0] == NULL) {
                r = base_error(loomSystemError, LOG_INIT, "out of memory (shrink)");
                goto out;
            }
            memcpy(addrs[0], child->net.my_addr, rec.info.addr_bytes);
        }
        LOOM_CHECK_GOTO(shrink_serve(comm, key, surv, n, excl, nexclude, table, addrs, dl), r, out);
    } else {
        LOOM_CHECK_GOTO(
            shrink_join(comm, key, surv[0], n, &rec, excl, child->net.my_addr, table, addrs, dl), r,
            out);
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        child->lay.peers[i] = table[i];
        child->lay.peers[i].rank = i;
        total += table[i].addr_bytes;
    }
    if (total) {
        uint8_t *buf = malloc(total), *p = buf;
        if (buf == NULL) {
            r = base_error(loomSystemError, LOG_INIT, "out of memory (shrink)");
            goto out;
        }
        for (int i = 0; i < n; i++) {
            memcpy(p, addrs[i], table[i].addr_bytes);
            p += table[i].addr_bytes;
        }
        LOOM_CHECK_GOTO(comm_set_peer_addrs(child, buf, total), r, out);
    }
    LOOM_CHECK_GOTO(comm_layout(child), r, out);
    r = comm_seg_setup(child, seg_fd); /* closes seg_fd */
    seg_fd = -1;
    if (r != loomSuccess) goto out;
    INFO(LOG_INIT, "shrink: rank %d of %d -> rank %d of %d", comm->rank, P, me, n);
out:
    if (seg_fd >= 0) close(seg_fd);
    if (addrs)
        for (int i = 0; i < n; i++)
            free(addrs[i]);
    free(addrs);
    free(table);
    free(excl);
    free(surv);
    free(out_set);
    if (r != loomSuccess) {
        comm_free(child);
        return r;
    }
    *newcomm = child;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommShrink(loomComm_t comm, const int *excludeRanks, int nExclude,
                                        loomComm_t *newcomm, loomConfig_t *config, int flags)
{
    base_clear_error();
    if (newcomm) *newcomm = NULL;
    if (comm == NULL || !comm_live(comm))
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommShrink: %p is not a live loom communicator", (void *)comm);
    log_set_rank(comm->rank);
    if (newcomm == NULL)
        return base_error(loomInvalidArgument, LOG_INIT, "loomCommShrink: newcomm is NULL");
    if (flags != LOOM_SHRINK_DEFAULT && flags != LOOM_SHRINK_ABORT)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommShrink: flags 0x%x (LOOM_SHRINK_DEFAULT or LOOM_SHRINK_ABORT)",
                          (unsigned)flags);
    if (nExclude < 0 || nExclude >= comm->nranks || (nExclude > 0 && excludeRanks == NULL))
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommShrink: %d ranks to exclude of %d (the list %s)", nExclude,
                          comm->nranks, excludeRanks ? "given" : "is NULL");
    for (int i = 0; i < nExclude; i++) {
        int q = excludeRanks[i];
        if (q < 0 || q >= comm->nranks)
            return base_error(loomInvalidArgument, LOG_INIT,
                              "loomCommShrink: excluded rank %d is outside [0, %d)", q,
                              comm->nranks);
        if (q == comm->rank)
            return base_error(loomInvalidArgument, LOG_INIT,
                              "loomCommShrink: rank %d excludes itself (excluded ranks do not "
                              "call loomCommShrink)",
                              q);
        for (int j = 0; j < i; j++)
            if (excludeRanks[j] == q)
                return base_error(loomInvalidArgument, LOG_INIT,
                                  "loomCommShrink: rank %d is listed twice", q);
    }
    if (comm->lay.peers[comm->rank].shrink_addr[0] == 0)
        return base_error(loomInvalidUsage, LOG_INIT,
                          "loomCommShrink: this communicator has no shrink listener");
    if (comm->st.init_thread_live) {
        pthread_join(comm->st.init_thread, NULL);
        comm->st.init_thread_live = false;
    }
    if (atomic_load(&comm->st.async_error) == loomInProgress)
        return base_error(loomInvalidUsage, LOG_INIT, "loomCommShrink: init did not finish");
    loomConfig_t cfg;
    LOOM_CHECK(comm_config_read(config, &cfg));
    bool held;
    if (flags == LOOM_SHRINK_ABORT) {
        /* Outstanding operations on the parent end first (with loomRemoteError), its peers
         * learn it is aborted; the parent stays a handle for loomCommDestroy. Then the shrink
         * claims the parent like any lifecycle call, once the aborted call has let it go. */
        if (!comm_stop(comm, "the communicator was aborted by loomCommShrink(LOOM_SHRINK_ABORT)"))
            return base_error(loomInternalError, LOG_INIT,
                              "loomCommShrink: a call on the parent did not leave within 10 s of "
                              "its abort");
        LOOM_CHECK(comm_enter(comm, "loomCommShrink", 2000, &held));
    } else {
        LOOM_CHECK(comm_enter(comm, "loomCommShrink", 0, &held));
        if (atomic_load(&comm->st.active_calls) > 0) { /* one of loom's own threads */
            const char *call = atomic_load(&comm->st.owner_call);
            comm_leave(comm, held);
            return base_error(loomInvalidUsage, LOG_INIT,
                              "loomCommShrink: an operation is outstanding on the parent (%s in "
                              "thread %d); wait for it, or shrink with LOOM_SHRINK_ABORT",
                              call ? call : "a call", atomic_load(&comm->st.owner_tid));
        }
    }
    loomResult_t r = comm_shrink(comm, excludeRanks, nExclude, &cfg, newcomm);
    comm_leave(comm, held);
    if (r == loomSuccess && (r = boot_child_service(*newcomm)) != loomSuccess) {
        comm_free(*newcomm);
        *newcomm = NULL;
    }
    return r;
}
