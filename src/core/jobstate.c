/*
 * The job-state service and its clients (jobstate.h): the frames, the service's loop (run by
 * the bootstrap root's thread once the rank table is out), a rank's side (a poll function of
 * the progress thread, and the wait of a failing rank for the verdict), and loom-status's query.
 */
#include "jobstate.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "progress.h"

#define JS_TABLE_MAX (1u << 24)
#define JS_SEND_NS 1000000000ull

enum {
    JS_HELLO = 1, /* rank -> service: its pid and host, once after the table */
    JS_REPORT,    /* rank -> service: its error */
    JS_BYE,       /* rank -> service: the communicator was destroyed */
    JS_STATE,     /* rank -> service: its state line, answering a query (arg) */
    JS_QUERY,     /* service -> rank: send your line (flags JS_F_PRINT: and log it) */
    JS_VERDICT,   /* service -> rank: the job failed (flags: JS_V_*) */
    JS_TABLE      /* service -> loom-status: the table */
};
enum { JS_F_PRINT = 1 };
enum { JS_V_FAILED = 0, JS_V_DIED = 1 };

/* ---- frames ---- */

size_t js_frame_encode(sock_auth_t *au, const js_frame_t *f0, const char *text, size_t len,
                       uint8_t *out)
{
    js_frame_t f = *f0;
    f.magic = JS_MAGIC;
    f.len = (uint32_t)len;
    uint8_t tag[SOCK_AUTH_TAG];
    sock_auth_tag(au, &f, sizeof(f), text, len, tag);
    memcpy(out, &f, sizeof(f));
    if (len) memcpy(out + sizeof(f), text, len);
    memcpy(out + sizeof(f) + len, tag, sizeof(tag));
    return sizeof(f) + len + sizeof(tag);
}

/* Every frame carries its tag (sock.h's authenticated messages, keyed by the connection's
 * handshake): frame, text, tag, in one send. */
static loomResult_t js_send(int fd, sock_auth_t *au, const js_frame_t *f0, const char *text)
{
    size_t len = text ? strlen(text) : 0;
    /* Ordinary frames (a cause, a state line, a verdict) on the stack: a failing rank sends its
     * report from wherever the error arose; only a table for loom-status may be longer. */
    uint8_t small[sizeof(js_frame_t) + JS_TEXT_MAX + SOCK_AUTH_TAG];
    uint8_t *buf = small;
    if (len > JS_TEXT_MAX && (buf = malloc(sizeof(js_frame_t) + len + SOCK_AUTH_TAG)) == NULL)
        return base_error(loomSystemError, LOG_BOOT, "out of memory (job-state frame)");
    size_t n = js_frame_encode(au, f0, text, len, buf);
    loomResult_t r = sock_send_all(fd, buf, n, base_now_ns() + JS_SEND_NS, "job-state frame");
    if (buf != small) free(buf);
    return r;
}

/* Reads what is there; false when the connection closed or broke. */
static bool js_rx_fill(int fd, js_rx_t *rx)
{
    while (rx->got < sizeof(rx->buf)) {
        ssize_t n = recv(fd, rx->buf + rx->got, sizeof(rx->buf) - rx->got, MSG_DONTWAIT);
        if (n > 0) {
            rx->got += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
        return false;
    }
    return true;
}

int js_rx_next(js_rx_t *rx, sock_auth_t *au, js_frame_t *f, char *text, size_t tlen)
{
    if (rx->got < sizeof(*f)) return 0;
    memcpy(f, rx->buf, sizeof(*f));
    if (f->len >= JS_TEXT_MAX) return -1;
    size_t want = sizeof(*f) + f->len + SOCK_AUTH_TAG;
    if (rx->got < want) return 0;
    if (!sock_auth_check(au, rx->buf, sizeof(*f), rx->buf + sizeof(*f), f->len,
                         rx->buf + sizeof(*f) + f->len))
        return -2;
    if (f->magic != JS_MAGIC) return -1;
    size_t n = LOOM_MIN((size_t)f->len, tlen - 1);
    memcpy(text, rx->buf + sizeof(*f), n);
    text[n] = '\0';
    f->host[JS_HOST_LEN - 1] = '\0';
    memmove(rx->buf, rx->buf + want, rx->got - want);
    rx->got -= want;
    return 1;
}

/* ---- the service ---- */

enum { R_LIVE = 0, R_BYE, R_DEAD };

typedef struct {
    int fd;
    sock_auth_t au;
    int state;
    int pid;
    char host[JS_HOST_LEN];
    js_rx_t rx;
    bool answered;
    char line[JS_TEXT_MAX];
} js_rank_t;

typedef struct {
    hs_t hs;
    sock_auth_t au;
} js_asker_t;

/* Connections that have not proved the secret wait in a bounded list (sock.h's hs_pending_t: the
 * oldest stranger dropped first, refusals logged once per 10 s with a count, each at most
 * LOOM_HANDSHAKE_TIMEOUT); status clients that proved it wait for the table, at most this many
 * at once. */
#define JS_ASKERS_MAX 64
#define JS_VERDICT_GRACE_NS 300000000ull

typedef struct {
    const js_serve_args_t *a;
    js_rank_t *r;
    js_asker_t *ask;
    int nask, askcap;
    /* the query in flight (0: none) */
    uint64_t qid, qdeadline;
    bool qprint;
    /* the failure being judged, and the verdict once sent */
    bool failing, verdict_sent;
    int first_rank; /* first report */
    char first_text[JS_TEXT_MAX];
    int dead_rank;     /* first death, -1 none */
    uint64_t fail_ns;  /* when failing began */
    hs_pending_t pend; /* connections still proving the secret */
    char who[160];     /* "job-state service ADDR", for the pending list's lines */
} js_srv_t;

static void srv_query(js_srv_t *s, bool print)
{
    if (s->qid) {
        s->qprint |= print;
        return;
    }
    s->qid = (uint64_t)base_now_ns() | 1;
    s->qdeadline = base_now_ns() + JS_QUERY_WAIT_NS;
    s->qprint = print;
    for (int i = 0; i < s->a->nranks; i++) {
        js_rank_t *r = &s->r[i];
        r->answered = false;
        r->line[0] = '\0';
        if (r->state != R_LIVE) continue;
        js_frame_t f = {.type = JS_QUERY, .flags = print ? JS_F_PRINT : 0, .arg = s->qid};
        (void)js_send(r->fd, &r->au, &f, NULL);
    }
}

static void srv_rank_lost(js_srv_t *s, int i)
{
    js_rank_t *r = &s->r[i];
    s->a->close_fd(r->fd);
    r->fd = -1;
    if (r->state != R_LIVE) return;
    r->state = R_DEAD;
    if (s->verdict_sent) return;
    WARN(LOG_BOOT,
         "job-state service %s: rank %d (%s, pid %d) closed its connection without "
         "a goodbye: it died",
         s->a->addr_str, i, r->host, r->pid);
    if (s->dead_rank < 0) s->dead_rank = i;
    if (!s->failing) {
        s->failing = true;
        s->fail_ns = base_now_ns();
        srv_query(s, true);
    }
}

static char *srv_table(js_srv_t *s)
{
    size_t cap = 256 + (size_t)s->a->nranks * (JS_TEXT_MAX / 4), o = 0;
    char *t = malloc(cap);
    if (t == NULL) return NULL;
    o += (size_t)snprintf(t, cap, "loom job state: %d ranks (job-state service %s)\n", s->a->nranks,
                          s->a->addr_str);
    for (int i = 0; i < s->a->nranks; i++) {
        const js_rank_t *r = &s->r[i];
        const char *what = r->state == R_DEAD  ? "died (its connection to the service closed)"
                           : r->state == R_BYE ? "left (its communicator was destroyed)"
                           : r->answered       ? r->line
                                               : "no answer within 2 s (stopped or stuck?)";
        size_t need = strlen(what) + 128;
        if (o + need >= cap) {
            cap = (o + need) * 2;
            char *n = realloc(t, cap);
            if (n == NULL) break;
            t = n;
        }
        o += (size_t)snprintf(t + o, cap - o, "  rank %d (%s, pid %d): %s\n", i, r->host, r->pid,
                              what);
    }
    return t;
}

static void srv_verdict(js_srv_t *s);

static void srv_query_done(js_srv_t *s)
{
    if (s->failing && !s->verdict_sent) srv_verdict(s);
    char *table = srv_table(s);
    if (s->qprint && table) WARN(LOG_BOOT, "%s", table);
    for (int k = 0; k < s->nask; k++) {
        js_frame_t f = {.type = JS_TABLE};
        (void)js_send(s->ask[k].hs.fd, &s->ask[k].au, &f, table);
        s->a->close_fd(s->ask[k].hs.fd);
        s->ask[k] = s->ask[--s->nask];
        k--;
    }
    free(table);
    s->qid = 0;
}

/* Sends the verdict: the rank that died if any, else the first report. */
static void srv_verdict(js_srv_t *s)
{
    js_frame_t f = {.type = JS_VERDICT};
    const char *text;
    if (s->dead_rank >= 0) {
        f.flags = JS_V_DIED;
        f.rank = s->dead_rank;
        text = "";
    } else {
        f.flags = JS_V_FAILED;
        f.rank = s->first_rank;
        text = s->first_text;
    }
    f.pid = s->r[f.rank].pid;
    snprintf(f.host, sizeof(f.host), "%s", s->r[f.rank].host);
    for (int i = 0; i < s->a->nranks; i++)
        if (s->r[i].state == R_LIVE) (void)js_send(s->r[i].fd, &s->r[i].au, &f, text);
    s->verdict_sent = true;
}

static void srv_frame(js_srv_t *s, int i, const js_frame_t *f, const char *text)
{
    js_rank_t *r = &s->r[i];
    switch (f->type) {
    case JS_HELLO:
        r->pid = f->pid;
        snprintf(r->host, sizeof(r->host), "%s", f->host);
        break;
    case JS_BYE: r->state = R_BYE; break;
    case JS_STATE:
        if (s->qid && f->arg == s->qid) {
            snprintf(r->line, sizeof(r->line), "%s", text);
            r->answered = true;
        }
        break;
    case JS_REPORT:
        if (s->verdict_sent || s->failing) break;
        WARN(LOG_BOOT, "job-state service %s: rank %d (%s, pid %d) failed: %s", s->a->addr_str, i,
             r->host, r->pid, text);
        s->failing = true;
        s->fail_ns = base_now_ns();
        s->first_rank = i;
        snprintf(s->first_text, sizeof(s->first_text), "%s", text);
        srv_query(s, true);
        break;
    default: break;
    }
}

/* A connection that proved the secret: a loom-status client of this job gets the table of the
 * query this starts (or joins); anything else that has the secret is refused, named. */
static void srv_took(void *arg, hs_t *hs)
{
    js_srv_t *s = arg;
    const char *why = NULL;
    sock_auth_t au;
    if (hs->hello.comm_id != s->a->job_id || hs->hello.from_rank != JS_RANK_STATUS)
        why = "not a loom-status client of this job";
    else if (s->nask >= JS_ASKERS_MAX)
        why = "64 status queries are waiting already";
    else if (sock_auth_start(&au, hs, base_now_ns() + 1000000000ull) != loomSuccess)
        why = base_last_error();
    if (!why && s->nask == s->askcap) {
        int cap = s->askcap ? 2 * s->askcap : 8;
        js_asker_t *n = realloc(s->ask, (size_t)cap * sizeof(*n));
        if (n == NULL)
            why = "out of memory";
        else
            s->ask = n, s->askcap = cap;
    }
    if (why) {
        char ps[SOCK_ADDR_STRLEN];
        WARN(LOG_BOOT,
             "job-state service %s refused a connection from %s that proved the secret: %s",
             s->a->addr_str, sock_addr_str(&hs->peer, ps, sizeof(ps)), why);
        s->a->close_fd(hs->fd);
        return;
    }
    s->ask[s->nask++] = (js_asker_t){.hs = *hs, .au = au};
    INFO(LOG_BOOT, "job-state service %s: a status query", s->a->addr_str);
    srv_query(s, false);
}

void js_serve(const js_serve_args_t *a)
{
    js_srv_t s = {.a = a,
                  .dead_rank = -1,
                  .first_rank = -1,
                  .pend = {.accept_fd = a->accept_fd, .close_fd = a->close_fd}};
    snprintf(s.who, sizeof(s.who), "job-state service %s", a->addr_str);
    s.r = calloc((size_t)a->nranks, sizeof(*s.r));
    struct pollfd *fds = calloc((size_t)a->nranks + 1 + HS_PENDING_MAX, sizeof(*fds));
    if (s.r == NULL || fds == NULL) goto out;
    for (int i = 0; i < a->nranks; i++) {
        s.r[i].fd = a->fd_of[i];
        s.r[i].au = a->auth_of[i];
        s.r[i].state = a->fd_of[i] >= 0 ? R_LIVE : R_DEAD;
        snprintf(s.r[i].host, sizeof(s.r[i].host), "%s", a->host_of[i]);
    }
    for (;;) {
        int live = 0, nf = 0;
        fds[nf++] = (struct pollfd){.fd = a->listen_fd, .events = POLLIN};
        for (int i = 0; i < a->nranks; i++)
            if (s.r[i].fd >= 0) {
                fds[nf++] = (struct pollfd){.fd = s.r[i].fd, .events = POLLIN};
                live += s.r[i].state == R_LIVE;
            }
        nf += hs_pending_pollfds(&s.pend, fds + nf, HS_PENDING_MAX);
        if (live == 0) {
            /* Every rank left or died: a query still open gets the table as it stands. */
            if (s.qid) srv_query_done(&s);
            break;
        }
        (void)poll(fds, (nfds_t)nf, 100);
        bool prog = false;
        hs_pending_progress(&s.pend, a->listen_fd, a->secret, LOG_BOOT, s.who, srv_took, &s, &prog);
        for (int i = 0; i < a->nranks; i++) {
            js_rank_t *r = &s.r[i];
            if (r->fd < 0) continue;
            bool ok = js_rx_fill(r->fd, &r->rx);
            js_frame_t f;
            char text[JS_TEXT_MAX];
            int got;
            while ((got = js_rx_next(&r->rx, &r->au, &f, text, sizeof(text))) > 0)
                srv_frame(&s, i, &f, text);
            if (got == -2)
                WARN(LOG_BOOT,
                     "job-state service %s: message %llu from rank %d (%s, pid %d) failed "
                     "authentication (changed on the way, or injected by someone without the "
                     "job's secret); its connection is closed",
                     a->addr_str, (unsigned long long)r->au.nrx, i, r->host, r->pid);
            if (got < 0 || !ok) srv_rank_lost(&s, i);
        }
        if (s.qid) {
            bool all = true;
            for (int i = 0; i < a->nranks; i++)
                if (s.r[i].state == R_LIVE && !s.r[i].answered) all = false;
            if (all || base_now_ns() > s.qdeadline) srv_query_done(&s);
        }
        /* The verdict does not wait for a rank that cannot answer (stopped): once the ranks had
         * JS_VERDICT_GRACE_NS to report a death or answer, it goes out; the table follows. */
        if (s.failing && !s.verdict_sent && base_now_ns() - s.fail_ns > JS_VERDICT_GRACE_NS)
            srv_verdict(&s);
    }
out:
    for (int i = 0; s.r && i < a->nranks; i++)
        if (s.r[i].fd >= 0) a->close_fd(s.r[i].fd);
    for (int k = 0; k < s.nask; k++)
        a->close_fd(s.ask[k].hs.fd);
    hs_pending_report(&s.pend, LOG_BOOT, s.who);
    hs_pending_free(&s.pend);
    free(s.ask);
    free(s.r);
    free(fds);
}

/* ---- a rank's side ---- */

struct js_client {
    int fd;
    sock_auth_t au; /* sending under slock, receiving under rlock */
    js_hooks_t hk;
    char root[SOCK_ADDR_STRLEN];
    pthread_mutex_t rlock; /* reading: rx, and the fields below (a leaf lock) */
    pthread_mutex_t slock; /* sending (a leaf lock) */
    js_rx_t rx;
    atomic_bool gone; /* the service's connection closed: link-based detection only */
    bool reported;    /* this rank's error went out */
    bool verdict;
    bool verdict_used; /* handed to the communicator */
    int vkind, vrank, vpid;
    char vhost[JS_HOST_LEN];
    char vtext[JS_TEXT_MAX];
    /* The line of a call that waits for the verdict, taken by that call (which holds the
     * executor's lock the progress thread's answer would need). */
    char own_line[JS_TEXT_MAX];
    atomic_int waiting; /* a failing call reads the socket itself */
    prog_work_t watch;
};

static int client_pollfds(prog_work_t *w, struct pollfd *fds, int max)
{
    js_client_t *c = (js_client_t *)((char *)w - offsetof(js_client_t, watch));
    if (max < 1 || atomic_load(&c->gone)) return 0;
    fds[0] = (struct pollfd){.fd = c->fd, .events = POLLIN};
    return 1;
}

static void client_send(js_client_t *c, const js_frame_t *f, const char *text)
{
    pthread_mutex_lock(&c->slock);
    if (!atomic_load(&c->gone)) (void)js_send(c->fd, &c->au, f, text);
    pthread_mutex_unlock(&c->slock);
}

/* Reads and parses what arrived; queries found are returned through qid and qprint (answered by
 * the caller outside the lock). */
static void client_read(js_client_t *c, uint64_t *qid, bool *qprint)
{
    pthread_mutex_lock(&c->rlock);
    if (!atomic_load(&c->gone)) {
        bool ok = js_rx_fill(c->fd, &c->rx);
        js_frame_t f;
        char text[JS_TEXT_MAX];
        int got;
        while ((got = js_rx_next(&c->rx, &c->au, &f, text, sizeof(text))) > 0) {
            if (f.type == JS_QUERY) {
                *qid = f.arg;
                *qprint |= (f.flags & JS_F_PRINT) != 0;
            } else if (f.type == JS_VERDICT && !c->verdict) {
                c->verdict = true;
                c->vkind = f.flags;
                c->vrank = f.rank;
                c->vpid = f.pid;
                snprintf(c->vhost, sizeof(c->vhost), "%s", f.host);
                snprintf(c->vtext, sizeof(c->vtext), "%s", text);
            }
        }
        if (got == -2)
            WARN(LOG_BOOT,
                 "rank %d: message %llu from the job-state service %s failed authentication "
                 "(changed on the way, or injected by someone without the job's secret); the "
                 "service is not listened to any more",
                 c->hk.rank, (unsigned long long)c->au.nrx, c->root);
        if (got < 0 || !ok) {
            /* Not fatal: the links still detect dead peers (LOOM_TIMEOUT). */
            if (!c->verdict && got != -2)
                INFO(LOG_BOOT,
                     "rank %d: the job-state service %s is gone; failures are detected over the "
                     "links only",
                     c->hk.rank, c->root);
            atomic_store(&c->gone, true);
        }
    }
    pthread_mutex_unlock(&c->rlock);
}

static void client_answer(js_client_t *c, uint64_t qid, bool print)
{
    char line[JS_TEXT_MAX];
    if (!c->hk.line(c->hk.arg, line, sizeof(line))) {
        pthread_mutex_lock(&c->rlock);
        if (c->own_line[0]) snprintf(line, sizeof(line), "%s", c->own_line);
        pthread_mutex_unlock(&c->rlock);
    }
    if (print) WARN(LOG_COLL, "rank %d state: %s", c->hk.rank, line);
    js_frame_t f = {.type = JS_STATE, .rank = c->hk.rank, .arg = qid};
    client_send(c, &f, line);
}

/* The verdict as this rank says it. */
static void client_verdict_text(js_client_t *c, char *out, size_t len)
{
    if (c->vkind == JS_V_DIED) {
        char cur[512];
        c->hk.current(c->hk.arg, cur, sizeof(cur));
        snprintf(out, len,
                 "rank %d (%s, pid %d) died during %s%s; you are rank %d (the job-state service "
                 "%s saw its connection close)",
                 c->vrank, c->vhost, c->vpid, cur[0] ? "" : "the job, while this rank was ",
                 cur[0] ? cur : "outside calls", c->hk.rank, c->root);
    } else {
        snprintf(out, len, "rank %d (%s, pid %d) failed: %.1500s; you are rank %d", c->vrank,
                 c->vhost, c->vpid, c->vtext, c->hk.rank);
    }
}

static uint64_t client_poll(void *arg, bool *progressed)
{
    (void)progressed;
    js_client_t *c = arg;
    if (atomic_load(&c->gone)) return UINT64_MAX;
    if (atomic_load(&c->waiting)) return 50000000ull;
    uint64_t qid = 0;
    bool print = false;
    client_read(c, &qid, &print);
    if (qid) client_answer(c, qid, print);
    pthread_mutex_lock(&c->rlock);
    bool hand = c->verdict && !c->verdict_used;
    if (hand) c->verdict_used = true;
    pthread_mutex_unlock(&c->rlock);
    if (hand) {
        char text[JS_TEXT_MAX];
        client_verdict_text(c, text, sizeof(text));
        c->hk.fail(c->hk.arg, text);
    }
    return atomic_load(&c->gone) ? UINT64_MAX : 500000000ull;
}

loomResult_t js_client_start(int fd, const sock_addr_t *root, const sock_auth_t *au,
                             const js_hooks_t *hooks, js_client_t **out)
{
    *out = NULL;
    js_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return base_error(loomSystemError, LOG_BOOT, "out of memory (job-state client)");
    }
    c->fd = fd;
    c->au = *au;
    c->hk = *hooks;
    sock_addr_str(root, c->root, sizeof(c->root));
    pthread_mutex_init(&c->rlock, NULL);
    pthread_mutex_init(&c->slock, NULL);
    atomic_init(&c->waiting, 0);
    atomic_init(&c->gone, false);
    c->watch.pollfds = client_pollfds;
    js_frame_t f = {.type = JS_HELLO, .rank = hooks->rank, .pid = (int32_t)getpid()};
    gethostname(f.host, sizeof(f.host) - 1);
    loomResult_t r = js_send(fd, &c->au, &f, NULL);
    if (r == loomSuccess) r = progress_attach(client_poll, c, 0, 0);
    if (r != loomSuccess) {
        close(fd);
        free(c);
        return r;
    }
    progress_watch(&c->watch);
    progress_wake();
    *out = c;
    return loomSuccess;
}

void js_client_error(js_client_t *c, const char *local, char *out, size_t len)
{
    snprintf(out, len, "%s", local);
    if (c == NULL) return;
    pthread_mutex_lock(&c->rlock);
    bool gone = atomic_load(&c->gone), have = c->verdict, report = !c->reported && !c->verdict;
    c->reported = true;
    pthread_mutex_unlock(&c->rlock);
    if (gone && !have) return;
    char line[JS_TEXT_MAX];
    c->hk.line(c->hk.arg, line, sizeof(line)); /* the calling thread may take the lock */
    pthread_mutex_lock(&c->rlock);
    snprintf(c->own_line, sizeof(c->own_line), "%s", line);
    pthread_mutex_unlock(&c->rlock);
    atomic_fetch_add(&c->waiting, 1); /* before the report: the query it causes is ours */
    if (report) {
        js_frame_t f = {.type = JS_REPORT, .rank = c->hk.rank};
        client_send(c, &f, local);
    }
    uint64_t dl = base_now_ns() + JS_VERDICT_WAIT_NS;
    while (!have && base_now_ns() < dl) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        (void)poll(&p, 1, 50);
        uint64_t qid = 0;
        bool print = false;
        client_read(c, &qid, &print);
        if (qid) client_answer(c, qid, print);
        pthread_mutex_lock(&c->rlock);
        have = c->verdict;
        gone = atomic_load(&c->gone);
        if (have) c->verdict_used = true;
        pthread_mutex_unlock(&c->rlock);
        if (gone) break;
    }
    atomic_fetch_sub(&c->waiting, 1);
    if (!have) return;
    char v[JS_TEXT_MAX], who[JS_HOST_LEN + 48];
    client_verdict_text(c, v, sizeof(v));
    /* The local text adds nothing when it is this rank's own report, or a peer's forwarded
     * abort that already carries the verdict. */
    snprintf(who, sizeof(who), "rank %d (%s, pid %d) ", c->vrank, c->vhost, c->vpid);
    if (strstr(v, local) || c->vrank == c->hk.rank || strstr(local, who))
        snprintf(out, len, "%s", v);
    else
        snprintf(out, len, "%.1200s (here: %.600s)", v, local);
}

void js_client_report(js_client_t *c, const char *text)
{
    if (c == NULL) return;
    pthread_mutex_lock(&c->rlock);
    bool report = !c->reported && !c->verdict && !atomic_load(&c->gone);
    c->reported = true;
    pthread_mutex_unlock(&c->rlock);
    if (!report) return;
    js_frame_t f = {.type = JS_REPORT, .rank = c->hk.rank};
    client_send(c, &f, text);
}

void js_client_stop(js_client_t *c)
{
    if (c == NULL) return;
    progress_unwatch(&c->watch);
    progress_detach(c);
    js_frame_t f = {.type = JS_BYE, .rank = c->hk.rank};
    client_send(c, &f, NULL);
    close(c->fd);
    pthread_mutex_destroy(&c->rlock);
    pthread_mutex_destroy(&c->slock);
    free(c);
}

/* ---- loom-status ---- */

loomResult_t js_status_query(const sock_addr_t *root, const uint8_t secret[16], uint64_t job_id,
                             uint64_t timeout_ns, char **table)
{
    *table = NULL;
    char as[SOCK_ADDR_STRLEN];
    sock_addr_str(root, as, sizeof(as));
    int fd;
    LOOM_CHECK(sock_connect_start(root, &fd));
    hs_t hs;
    hs_hello_t hello = {
        .comm_id = job_id, .from_rank = JS_RANK_STATUS, .to_rank = -1, .chan = 0, .nchan = 0};
    hs_connect_init(&hs, fd, root, secret, &hello);
    loomResult_t r = hs_run_blocking(&hs);
    if (r != loomSuccess) {
        close(fd);
        return base_error(r, LOG_BOOT,
                          "job-state service %s: the handshake failed (refused: a wrong secret or "
                          "job id? no job there?): %s",
                          as, hs.err);
    }
    sock_auth_t au;
    r = sock_auth_start(&au, &hs, base_now_ns() + timeout_ns);
    if (r != loomSuccess) {
        close(fd);
        return r;
    }
    uint64_t dl = base_now_ns() + timeout_ns;
    js_frame_t f;
    r = sock_recv_all(fd, &f, sizeof(f), dl,
                      "waiting for the job-state table (refused: a wrong secret or job?)");
    if (r == loomSuccess && (f.magic != JS_MAGIC || f.type != JS_TABLE || f.len > JS_TABLE_MAX))
        r = base_error(loomRemoteError, LOG_BOOT, "job-state service %s: not a table", as);
    char *t = NULL;
    if (r == loomSuccess && (t = malloc((size_t)f.len + 1)) == NULL)
        r = base_error(loomSystemError, LOG_BOOT, "out of memory");
    if (r == loomSuccess) r = sock_recv_all(fd, t, f.len, dl, "receiving the job-state table");
    uint8_t tag[SOCK_AUTH_TAG];
    if (r == loomSuccess)
        r = sock_recv_all(fd, tag, sizeof(tag), dl, "receiving the job-state table");
    if (r == loomSuccess && !sock_auth_check(&au, &f, sizeof(f), t, f.len, tag))
        r = base_error(loomRemoteError, LOG_BOOT,
                       "job-state service %s: its table failed authentication (changed on the "
                       "way, or sent by someone without the job's secret)",
                       as);
    close(fd);
    if (r != loomSuccess) {
        free(t);
        return r;
    }
    t[f.len] = '\0';
    *table = t;
    return loomSuccess;
}
