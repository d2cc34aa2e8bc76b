/* The node segment (nodeseg.h). */
#include "nodeseg.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base.h"
#include "param.h"

#define SEG_MAGIC 0x6c6f6f6d7365676dull /* "loomsegm" */
#define SEG_HEAD_BYTES 4096u
#define SEG_CTL_BYTES 1024u
/* A slot: its header (32 bytes) and its data in one run, data first in the header's line, so
 * that a small input travels in the cache line that says it is there; 64 bytes per slot beyond
 * the data keep slots on lines of their own. */
#define SEG_HDR_BYTES 32u
#define SEG_SLOT_EXTRA 64u
#define SEG_REASON_MAX 880u

typedef struct {
    uint64_t magic, nonce;
    uint32_t nranks, slot_bytes;
} seg_head_t;

/* A rank's control words, written by that rank only. */
typedef struct {
    _Atomic uint64_t arrive; /* 1 + the sequence number of the last collective it started */
    uint8_t pad0[56];
    uint64_t last[3];       /* that collective's descriptor (desc_words) */
    _Atomic uint32_t state; /* 1: inside a call of the communicator */
    int32_t pid;
    uint8_t pad1[32];
    _Atomic uint32_t aborted; /* 1: it failed or aborted; reason says why */
    char reason[SEG_REASON_MAX];
} seg_ctl_t;
_Static_assert(sizeof(seg_ctl_t) <= SEG_CTL_BYTES, "segment control words");

/* A slot's header; its data follows at once. */
typedef struct {
    _Atomic uint64_t seq; /* 1 + the sequence number of the collective whose input is here */
    uint64_t w[3];        /* its descriptor */
} seg_hdr_t;
_Static_assert(sizeof(seg_hdr_t) <= SEG_HDR_BYTES, "slot header");

struct nodeseg {
    exec_host_t *h;
    uint8_t *base;
    size_t len, slot;
    int p, r;
    uint64_t ncalls; /* allreduces through the segment so far: their parity is the phase */
    int32_t pid[NODESEG_MAX_RANKS];
    int pidfd[NODESEG_MAX_RANKS];
};

static size_t seg_len(int p, size_t slot)
{
    return SEG_HEAD_BYTES + (size_t)p * SEG_CTL_BYTES + (size_t)p * 2 * (SEG_SLOT_EXTRA + slot);
}

static seg_ctl_t *ctl(const nodeseg_t *s, int q)
{
    return (seg_ctl_t *)(void *)(s->base + SEG_HEAD_BYTES + (size_t)q * SEG_CTL_BYTES);
}

static seg_hdr_t *slot_of(const nodeseg_t *s, int q, int ph)
{
    size_t off = SEG_HEAD_BYTES + (size_t)s->p * SEG_CTL_BYTES +
                 ((size_t)q * 2 + (size_t)ph) * (SEG_SLOT_EXTRA + s->slot);
    return (seg_hdr_t *)(void *)(s->base + off);
}

static uint8_t *data_of(seg_hdr_t *hd)
{
    return (uint8_t *)hd + SEG_HDR_BYTES;
}

static void desc_words(const sched_desc_t *d, uint64_t w[3])
{
    w[0] = (uint64_t)d->kind | (uint64_t)d->dtype << 8 | (uint64_t)d->op << 16 |
           (uint64_t)(uint32_t)d->root << 32;
    w[1] = d->count;
    w[2] = d->shape;
}

static sched_desc_t words_desc(const uint64_t w[3], uint64_t seq)
{
    sched_desc_t d = {.kind = (uint8_t)w[0],
                      .dtype = (uint8_t)(w[0] >> 8),
                      .op = (uint8_t)(w[0] >> 16),
                      .root = (int32_t)(uint32_t)(w[0] >> 32),
                      .count = w[1],
                      .seq = seq,
                      .shape = w[2]};
    return d;
}

int nodeseg_create(int nranks, nodeseg_offer_t *offer)
{
    memset(offer, 0, sizeof(*offer));
    size_t slot = LOOM_ALIGN_UP(param_size(PARAM_SEGMENT), 64);
    if (slot == 0 || nranks < 2 || nranks > NODESEG_MAX_RANKS) return -1;
    int fd = (int)syscall(SYS_memfd_create, "loom-segment", MFD_CLOEXEC);
    if (fd < 0) {
        INFO(LOG_INIT, "no node segment: memfd_create: %s", strerror(errno));
        return -1;
    }
    size_t len = seg_len(nranks, slot);
    uint64_t nonce = 0;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || base_random(&nonce, sizeof(nonce)) != loomSuccess || nonce == 0) {
        INFO(LOG_INIT, "no node segment: sizing or mapping %zu bytes: %s", len, strerror(errno));
        if (m != MAP_FAILED) munmap(m, len);
        close(fd);
        return -1;
    }
    seg_head_t *hd = m;
    hd->nranks = (uint32_t)nranks;
    hd->slot_bytes = (uint32_t)slot;
    hd->nonce = nonce;
    atomic_store_explicit((_Atomic uint64_t *)&hd->magic, SEG_MAGIC, memory_order_release);
    munmap(m, len);
    offer->pid = (int32_t)getpid();
    offer->fd = fd;
    offer->nonce = nonce;
    return fd;
}

nodeseg_t *nodeseg_attach(exec_host_t *h, const nodeseg_offer_t *offer, int fd, const int32_t *pids,
                          const char **why)
{
    static _Thread_local char text[200];
    *why = text;
    int p = h->nranks;
    if (offer->nonce == 0) {
        snprintf(text, sizeof(text), "rank 0 offered none (LOOM_SEGMENT=0, or it could not)");
        return NULL;
    }
    bool own = fd < 0; /* rank 0 keeps its descriptor open until every rank has opened it */
    if (own) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)offer->pid, (int)offer->fd);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            snprintf(text, sizeof(text), "open(%s) of rank 0's: %s", path, strerror(errno));
            return NULL;
        }
    }
    seg_head_t head;
    ssize_t n = pread(fd, &head, sizeof(head), 0);
    if (n != (ssize_t)sizeof(head) || head.magic != SEG_MAGIC || head.nonce != offer->nonce ||
        head.nranks != (uint32_t)p || head.slot_bytes == 0) {
        snprintf(text, sizeof(text),
                 "rank 0's descriptor does not hold its segment (another pid namespace?)");
        if (own) close(fd);
        return NULL;
    }
    size_t len = seg_len(p, head.slot_bytes);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (own) close(fd);
    if (m == MAP_FAILED) {
        snprintf(text, sizeof(text), "mmap of %zu bytes: %s", len, strerror(errno));
        return NULL;
    }
    nodeseg_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        munmap(m, len);
        snprintf(text, sizeof(text), "out of memory");
        return NULL;
    }
    *s = (nodeseg_t){.h = h, .base = m, .len = len, .slot = head.slot_bytes, .p = p, .r = h->rank};
    for (int q = 0; q < p; q++) {
        s->pid[q] = pids[q];
        /* A pidfd fires when the peer exits, even before its parent reaps it. Where there is
         * none (old kernels), kill(pid, 0) in nodeseg_check stands for it. */
        s->pidfd[q] =
            q == s->r || pids[q] == getpid() ? -1 : (int)syscall(SYS_pidfd_open, pids[q], 0);
    }
    seg_ctl_t *me = ctl(s, s->r);
    me->pid = (int32_t)getpid();
    return s;
}

void nodeseg_free(nodeseg_t *s)
{
    if (s == NULL) return;
    for (int q = 0; q < s->p; q++)
        if (s->pidfd[q] >= 0) close(s->pidfd[q]);
    munmap(s->base, s->len);
    free(s);
}

size_t nodeseg_max_bytes(const nodeseg_t *s)
{
    return s ? s->slot : 0;
}

void nodeseg_abort(nodeseg_t *s, const char *reason)
{
    if (s == NULL) return;
    seg_ctl_t *me = ctl(s, s->r);
    if (atomic_load_explicit(&me->aborted, memory_order_relaxed)) return;
    snprintf(me->reason, sizeof(me->reason), "%s", reason);
    atomic_store_explicit(&me->aborted, 1, memory_order_release);
}

void nodeseg_arrive(nodeseg_t *s, const sched_desc_t *d)
{
    if (s == NULL) return;
    seg_ctl_t *me = ctl(s, s->r);
    desc_words(d, me->last);
    atomic_store_explicit(&me->arrive, d->seq + 1, memory_order_release);
}

void nodeseg_state(nodeseg_t *s, bool in_call)
{
    if (s) atomic_store_explicit(&ctl(s, s->r)->state, in_call ? 1u : 0u, memory_order_relaxed);
}

/* The call's error: named by its operation, recorded as the communicator's (which tells the
 * peers, through the segment too). */
static loomResult_t call_error(nodeseg_call_t *c, loomResult_t res, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static loomResult_t call_error(nodeseg_call_t *c, loomResult_t res, const char *fmt, ...)
{
    char d[160], why[1024];
    exec_desc_str(&c->d, d, sizeof(d));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    loomResult_t r = base_error(res, LOG_COLL, "%s (through the node segment): %s", d, why);
    c->s->h->set_error(c->s->h, r, base_last_error());
    return r;
}

/* Whom a call waits on, with what each one's words say (the hang report's line). */
static void seg_waits(const void *arg, char *buf, size_t len)
{
    const nodeseg_call_t *c = arg;
    const nodeseg_t *s = c->s;
    uint64_t want = c->d.seq + 1;
    size_t o = 0;
    int listed = 0, more = 0;
    buf[0] = '\0';
    /* From rank 0, not c->next: the calling thread moves that while the progress thread asks
     * (ThreadSanitizer); the arrival words say who is done. */
    for (int q = 0; q < s->p; q++) {
        if (q == s->r || atomic_load_explicit(&ctl(s, q)->arrive, memory_order_relaxed) >= want)
            continue;
        if (listed == 6 || o + 4 >= len) {
            more++;
            continue;
        }
        bool in = atomic_load_explicit(&ctl(s, q)->state, memory_order_relaxed) != 0;
        int n =
            snprintf(buf + o, len - o, "%srank %d (pid %d, node segment): %s", listed ? "; " : "",
                     q, (int)s->pid[q], in ? "inside a call" : "outside calls (computing?)");
        o = LOOM_MIN(o + (size_t)LOOM_MAX(n, 0), len - 1);
        listed++;
    }
    if (listed == 0) snprintf(buf, len, "no peer (folding)");
    if (more && o + 24 < len) snprintf(buf + o, len - o, " and %d more", more);
}

loomResult_t nodeseg_start(nodeseg_t *s, nodeseg_call_t *c, const sched_desc_t *d, const void *send,
                           void *recv, size_t count, loomDataType_t type, red_op_t op, bool avg)
{
    *c = (nodeseg_call_t){.s = s,
                          .d = *d,
                          .send = send,
                          .recv = recv,
                          .count = count,
                          .type = type,
                          .op = op,
                          .avg = avg,
                          .start_ns = base_coarse_ns()};
    int ph = (int)(s->ncalls++ & 1);
    seg_hdr_t *mine = slot_of(s, s->r, ph);
    size_t n = count * red_type_size(type);
    if (n) memcpy(data_of(mine), send, n);
    desc_words(d, mine->w);
    atomic_store_explicit(&mine->seq, d->seq + 1, memory_order_release);
    nodeseg_arrive(s, d);
    exec_host_side_begin(s->h, d, seg_waits, c);
    return loomSuccess;
}

/* A peer's failure word, or NULL. */
static const char *peer_aborted(const nodeseg_t *s, int q)
{
    seg_ctl_t *pc = ctl(s, q);
    if (!atomic_load_explicit(&pc->aborted, memory_order_acquire)) return NULL;
    return pc->reason;
}

loomResult_t nodeseg_test(nodeseg_call_t *c, bool *done, bool *progressed)
{
    nodeseg_t *s = c->s;
    exec_host_t *h = s->h;
    *done = false;
    if (atomic_load(h->aborting))
        return base_error(loomRemoteError, LOG_COLL,
                          "allreduce: the communicator was aborted (loomCommAbort)");
    if (h->async_error) {
        int a = atomic_load(h->async_error);
        if (a != loomSuccess && a != loomInProgress) {
            char d[160];
            exec_desc_str(&c->d, d, sizeof(d));
            return base_error((loomResult_t)a, LOG_COLL, "%s: %s", d, h->async_text);
        }
    }
    uint64_t want = c->d.seq + 1;
    int ph = (int)((s->ncalls - 1) & 1);
    uint64_t mine[3];
    desc_words(&c->d, mine);
    for (; c->next < s->p; c->next++) {
        int q = c->next;
        if (q == s->r) continue;
        /* the slot's header first: where the peer is on time, it is the one line read */
        seg_hdr_t *hd = slot_of(s, q, ph);
        uint64_t sq = atomic_load_explicit(&hd->seq, memory_order_acquire);
        if (sq == want && memcmp(hd->w, mine, sizeof(mine)) == 0) {
            *progressed = true;
            continue;
        }
        seg_ctl_t *pc = ctl(s, q);
        uint64_t a = atomic_load_explicit(&pc->arrive, memory_order_acquire);
        if (a < want) {
            const char *why = peer_aborted(s, q);
            if (why) return call_error(c, loomRemoteError, "rank %d failed: %s", q, why);
            return loomSuccess; /* not there yet */
        }
        /* (it arrived: its slot, written before its arrival, is read again) */
        sq = atomic_load_explicit(&hd->seq, memory_order_acquire);
        if (sq == want && memcmp(hd->w, mine, sizeof(mine)) == 0) {
            *progressed = true;
            continue;
        }
        /* It runs something else as this collective: its descriptor says what (the slot's
         * when it came through the segment, else the last one it started). */
        sched_desc_t theirs = words_desc(sq == want ? hd->w : pc->last, c->d.seq);
        char text[1024];
        exec_mismatch_text(q, &theirs, s->r, &c->d, text, sizeof(text));
        if (sq != want && a > want)
            snprintf(text + strlen(text), sizeof(text) - strlen(text),
                     " (rank %d went past collective %llu without this allreduce)", q,
                     (unsigned long long)c->d.seq);
        loomResult_t r = base_error(loomInvalidUsage, LOG_COLL, "%s", text);
        h->set_error(h, r, base_last_error());
        return r;
    }
    /* Everyone's input is there: the one-shot fold, in rank order. */
    size_t n = c->count * red_type_size(c->type);
    memcpy(c->recv, data_of(slot_of(s, 0, ph)), n);
    for (int q = 1; q < s->p; q++)
        red_host_apply(c->type, c->op, c->recv, c->recv, data_of(slot_of(s, q, ph)), c->count);
    if (c->avg) red_host_div(c->type, c->recv, c->recv, s->p, c->count);
    exec_host_side_end(h, true);
    *done = true;
    *progressed = true;
    return loomSuccess;
}

/* 'R', 'S', 'T' ...: the peer's state letter from /proc/<pid>/stat, '?' when unknown. */
static char proc_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return '?';
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return '?';
    buf[n] = '\0';
    const char *e = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    return e && e[1] == ' ' && e[2] ? e[2] : '?';
}

static bool peer_exited(const nodeseg_t *s, int q)
{
    if (s->pidfd[q] >= 0) {
        struct pollfd pf = {.fd = s->pidfd[q], .events = POLLIN};
        return poll(&pf, 1, 0) > 0;
    }
    if (s->pid[q] == getpid()) return false;
    return (kill(s->pid[q], 0) != 0 && errno == ESRCH) || proc_state(s->pid[q]) == 'Z';
}

loomResult_t nodeseg_check(nodeseg_call_t *c)
{
    nodeseg_t *s = c->s;
    exec_host_t *h = s->h;
    uint64_t now = base_coarse_ns(), waited = now - c->start_ns;
    uint64_t want = c->d.seq + 1;
    int late = -1;
    for (int q = c->next; q < s->p; q++) {
        if (q == s->r) continue;
        seg_ctl_t *pc = ctl(s, q);
        if (atomic_load_explicit(&pc->arrive, memory_order_acquire) >= want) continue;
        const char *why = peer_aborted(s, q);
        if (why) return call_error(c, loomRemoteError, "rank %d failed: %s", q, why);
        if (peer_exited(s, q))
            return call_error(c, loomRemoteError,
                              "rank %d (pid %d) exited or died before it reached this operation", q,
                              (int)s->pid[q]);
        if (late < 0) late = q;
        if (h->timeout_s > 0 && waited > (uint64_t)(h->timeout_s * 1e9)) {
            char st = proc_state(s->pid[q]);
            if (st == 'T' || st == 't')
                return call_error(c, loomRemoteError,
                                  "rank %d (pid %d) is stopped (state %c) and has not reached "
                                  "this operation for %.1f s (LOOM_TIMEOUT=%g s)",
                                  q, (int)s->pid[q], st, (double)waited * 1e-9, h->timeout_s);
        }
    }
    if (late >= 0 && h->op_timeout_s > 0 && waited > (uint64_t)(h->op_timeout_s * 1e9)) {
        bool in = atomic_load_explicit(&ctl(s, late)->state, memory_order_relaxed) != 0;
        char d[160];
        exec_desc_str(&c->d, d, sizeof(d));
        loomResult_t r = base_error(
            loomRemoteError, LOG_COLL,
            "%s: not finished within LOOM_OP_TIMEOUT=%g s (%.1f s); rank %d waits in the node "
            "segment on rank %d (pid %d): %s (alive)",
            d, h->op_timeout_s, (double)waited * 1e-9, s->r, late, (int)s->pid[late],
            in ? "inside a call (an earlier operation?)" : "outside calls (computing?)");
        h->set_error(h, r, base_last_error());
        return r;
    }
    return loomSuccess;
}

int nodeseg_pollfds(nodeseg_call_t *c, struct pollfd *fds, int max)
{
    nodeseg_t *s = c->s;
    int nf = 0;
    if (nf < max) fds[nf++] = (struct pollfd){.fd = s->h->wake_fd, .events = POLLIN};
    uint64_t want = c->d.seq + 1;
    for (int q = c->next; q < s->p && nf < max; q++) {
        if (q == s->r || s->pidfd[q] < 0) continue;
        if (atomic_load_explicit(&ctl(s, q)->arrive, memory_order_relaxed) >= want) continue;
        fds[nf++] = (struct pollfd){.fd = s->pidfd[q], .events = POLLIN};
    }
    return nf;
}
