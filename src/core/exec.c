/*
 * The host executor: runs one rank's schedule over message transports.
 *
 * Steps issue out of order within a look-ahead window as soon as their dependencies are done,
 * except that sends to one peer, and receives from one peer, are posted in schedule order (that
 * order is how messages match). A receive-and-reduce lands in one of a few staging slots and is
 * reduced into place the moment it completes, while the slice is still in cache. Every message
 * carries the operation's (sequence, kind, type, op, count, root); a receive that finds a
 * different one reports the two ranks and both operations.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "exec.h"
#include "param.h"
#include "progress.h"

#define EXEC_MAX_INFLIGHT 512
#define EXEC_TEXT_MAX 1024 /* an error text: the operation, then the transport's cause */

enum { ST_PENDING = 0, ST_ISSUED = 1, ST_DONE = 2 };

struct exec {
    exec_host_t *h;
    const sched_t *s;
    void *const *bufs;
    size_t esize;
    loomDataType_t type;
    red_op_t op;
    uint8_t *state;
    transport_req_t **reqs;
    int32_t *slot;      /* staging slot of an issued receive-and-reduce */
    uint32_t *inflight; /* issued steps awaiting completion */
    int ninflight;
    size_t first; /* first step not yet issued */
    size_t ndone;
    uint8_t *staging;
    size_t slot_bytes;
    int nslots;
    int *free_slots;
    int nfree;
    uint32_t *stamp; /* per (peer, direction): scan that found an earlier blocked step */
    uint32_t scan;
    uint64_t start_ns;     /* base_coarse_ns, as every stamp here */
    uint64_t last_step_ns; /* when a step last finished */
    bool dirty;            /* a step finished since the last scan: more may be issuable */
    /* the per-step and per-peer arrays above, in one allocation (one per call, not five: small
     * calls are a microsecond), kept with the exec for the next call (exec_host_t.spare) */
    void *arrays;
    size_t arrays_bytes;
};

/* Metadata as carried in messages: point to point looks the same from both ends. */
_Static_assert(sizeof(sched_desc_t) <= TRANSPORT_META_BYTES, "descriptor fits the metadata");

static void meta_pack(const sched_desc_t *d, uint8_t meta[TRANSPORT_META_BYTES])
{
    sched_desc_t m = *d;
    if (m.kind == OPK_RECV) m.kind = OPK_SEND;
    memset(meta, 0, TRANSPORT_META_BYTES);
    memcpy(meta, &m, sizeof(m));
}

void exec_desc_str(const sched_desc_t *d, char *buf, size_t len)
{
    const char *type = red_type_name((loomDataType_t)d->dtype);
    unsigned long long seq = (unsigned long long)d->seq, count = (unsigned long long)d->count;
    switch (d->kind) {
    case OPK_SEND:
    case OPK_RECV:
        snprintf(buf, len, "point-to-point #%llu (count %llu, %s, sender rank %d)", seq, count,
                 type, d->root);
        break;
    case OPK_ALLREDUCE:
    case OPK_REDUCESCATTER:
        snprintf(buf, len, "%s seq %llu (count %llu, %s, %s)", sched_opkind_name(d->kind), seq,
                 count, type, base_op_code_name(d->op));
        break;
    case OPK_REDUCE:
        snprintf(buf, len, "reduce seq %llu (count %llu, %s, %s, root %d)", seq, count, type,
                 base_op_code_name(d->op), d->root);
        break;
    case OPK_BROADCAST:
        snprintf(buf, len, "broadcast seq %llu (count %llu, %s, root %d)", seq, count, type,
                 d->root);
        break;
    default:
        snprintf(buf, len, "%s seq %llu (count %llu, %s)", sched_opkind_name(d->kind), seq, count,
                 type);
        break;
    }
}

loomResult_t exec_create(exec_host_t *h, const sched_t *s, void *const *bufs, loomDataType_t type,
                         red_op_t op, exec_t **out)
{
    /* One schedule runs at a time per communicator: the last one's exec (and its arrays, when
     * large enough) serves this one, so that a small call allocates nothing. */
    exec_t *e = h->spare;
    h->spare = NULL;
    size_t n = s->nsteps;
    if (e) {
        void *arrays = e->arrays;
        size_t cap = e->arrays_bytes;
        memset(e, 0, sizeof(*e));
        e->arrays = arrays;
        e->arrays_bytes = cap;
    } else {
        e = calloc(1, sizeof(*e));
        if (e == NULL)
            return base_error(loomSystemError, LOG_COLL,
                              "out of memory for a schedule of %zu steps", n);
    }
    e->h = h;
    atomic_fetch_add(&h->running, 1);
    atomic_store(&h->call_state, TRANSPORT_CALL_IN);
    e->s = s;
    e->bufs = bufs;
    e->esize = red_type_size(type);
    e->type = type;
    e->op = op;
    uint64_t max_rr = 0;
    for (size_t i = 0; i < n; i++)
        if (s->steps[i].kind == STEP_RECV_REDUCE) max_rr = LOOM_MAX(max_rr, s->steps[i].count);
    int nslots = max_rr > 0 ? h->slices_in_flight * h->nchannels : 0;
    /* reqs (8-byte entries) first, then the 4-byte arrays, the bytes last: each aligned; only
     * what is read before it is written is cleared (requests, stamps, states) */
    size_t o_slot = (n + 1) * sizeof(*e->reqs), o_infl = o_slot + (n + 1) * sizeof(*e->slot);
    size_t o_free = o_infl + EXEC_MAX_INFLIGHT * sizeof(*e->inflight);
    size_t o_stamp = o_free + (size_t)nslots * sizeof(*e->free_slots);
    size_t o_state = o_stamp + (size_t)h->nranks * 2 * sizeof(*e->stamp);
    size_t need = o_state + n + 1;
    if (e->arrays_bytes < need) {
        free(e->arrays);
        e->arrays_bytes = 0;
        e->arrays = malloc(need);
        if (e->arrays == NULL) goto oom;
        e->arrays_bytes = need;
    }
    uint8_t *a = e->arrays;
    memset(a, 0, o_slot);
    memset(a + o_stamp, 0, need - o_stamp);
    e->reqs = (transport_req_t **)(void *)a;
    e->slot = (int32_t *)(void *)(a + o_slot);
    e->inflight = (uint32_t *)(void *)(a + o_infl);
    e->free_slots = (int *)(void *)(a + o_free);
    e->stamp = (uint32_t *)(void *)(a + o_stamp);
    e->state = a + o_state;
    if (max_rr > 0) {
        e->nslots = nslots;
        e->slot_bytes = LOOM_ALIGN_UP(max_rr * e->esize, 64);
        size_t need_stg = e->slot_bytes * (size_t)e->nslots;
        if (h->staging_bytes < need_stg) {
            free(h->staging);
            h->staging_bytes = 0;
            h->staging = aligned_alloc(64, need_stg);
            if (h->staging == NULL) goto oom;
            h->staging_bytes = need_stg;
        }
        e->staging = h->staging;
        for (int i = 0; i < e->nslots; i++)
            e->free_slots[i] = i;
        e->nfree = e->nslots;
    }
    e->start_ns = base_coarse_ns();
    e->last_step_ns = base_coarse_ns();
    e->dirty = true;
    exec_host_lock(h);
    h->cur = e;
    if (s->ndescs) {
        h->rep.started = s->descs[0];
        h->rep.started_ns = e->start_ns;
        h->rep.any_started = true;
    }
    exec_host_unlock(h);
    *out = e;
    return loomSuccess;
oom:
    exec_free(e);
    return base_error(loomSystemError, LOG_COLL, "out of memory for a schedule of %zu steps", n);
}

void exec_host_side_begin(exec_host_t *h, const sched_desc_t *d,
                          void (*waits)(const void *arg, char *buf, size_t len), const void *arg)
{
    exec_host_lock(h);
    h->side = *d;
    h->side_ns = base_coarse_ns();
    h->side_waits = waits;
    h->side_arg = arg;
    h->rep.started = *d;
    h->rep.started_ns = h->side_ns;
    h->rep.any_started = true;
    exec_host_unlock(h);
}

void exec_host_side_end(exec_host_t *h, bool finished)
{
    exec_host_lock(h);
    if (finished && h->side_waits) {
        h->rep.finished = h->side;
        h->rep.finished_ns = base_coarse_ns();
        h->rep.any_finished = true;
    }
    h->side_waits = NULL;
    exec_host_unlock(h);
}

void exec_free(exec_t *e)
{
    if (e == NULL) return;
    exec_host_t *h = e->h;
    exec_host_lock(h);
    if (h->cur == e) h->cur = NULL;
    /* A run that failed leaves requests in flight. Those still queued in their transport are
     * freed with the connection, but a receive that completed with an error (a message of
     * another length) has left every queue, and only its test releases it. */
    for (int k = 0; e->reqs && k < e->ninflight; k++) {
        size_t i = e->inflight[k];
        if (e->reqs[i] == NULL) continue;
        int done = 0;
        uint8_t meta[TRANSPORT_META_BYTES];
        (void)e->h->links[e->s->steps[i].peer].ops->test(e->reqs[i], &done, meta);
        e->reqs[i] = NULL;
    }
    /* The caller gets its buffers back when the call returns: the transports let go of them
     * now, not at the abort's grace or a keepalive pass later. */
    if (e->reqs && e->ninflight > 0 && e->ndone != e->s->nsteps)
        for (int t = 0; t < h->ntp; t++)
            if (h->tp[t].ctx && h->tp[t].ops->orphan) h->tp[t].ops->orphan(h->tp[t].ctx);
    exec_host_unlock(h);
    if (atomic_fetch_sub(&h->running, 1) == 1) atomic_store(&h->call_state, TRANSPORT_CALL_NONE);
    if (h->spare == NULL) {
        h->spare = e;
        return;
    }
    free(e->arrays);
    free(e);
}

static inline uint8_t *buf_at(const exec_t *e, uint32_t buf, uint64_t off)
{
    return (uint8_t *)e->bufs[buf] + off * e->esize;
}

static bool deps_done(const exec_t *e, const sched_step_t *st)
{
    for (uint32_t i = 0; i < st->ndeps; i++)
        if (e->state[e->s->deps[st->dep_first + i]] != ST_DONE) return false;
    return true;
}

static loomResult_t step_error(exec_t *e, const sched_step_t *st, const exec_link_t *l,
                               loomResult_t res)
{
    char d[160];
    exec_desc_str(&e->s->descs[st->desc], d, sizeof(d));
    const char *why = l && l->conn ? l->ops->conn_error(l->conn) : base_last_error();
    char text[EXEC_TEXT_MAX];
    snprintf(text, sizeof(text), "%s: %s", d, why);
    loomResult_t r = base_error(res, LOG_COLL, "%s", text);
    e->h->set_error(e->h, r, base_last_error());
    return r;
}

static void finish_step(exec_t *e, size_t i)
{
    e->state[i] = ST_DONE;
    e->ndone++;
    e->dirty = true;
    e->last_step_ns = base_coarse_ns();
}

static void apply_avg(exec_t *e, const sched_step_t *st)
{
    if (st->flags & STEP_F_AVG) {
        uint8_t *d = buf_at(e, st->dst_buf, st->dst_off);
        red_host_div(e->type, d, d, e->h->nranks, st->count);
    }
}

/* Tries to issue step i; returns whether it was (or it finished at once). */
static loomResult_t complete(exec_t *e, bool *progressed);

static loomResult_t try_issue(exec_t *e, size_t i, bool *issued)
{
    const sched_step_t *st = &e->s->steps[i];
    exec_host_t *h = e->h;
    *issued = false;
    if (!deps_done(e, st)) return loomSuccess;
    if (sched_step_local(st->kind)) {
        uint8_t *d = buf_at(e, st->dst_buf, st->dst_off);
        const uint8_t *src = buf_at(e, st->src_buf, st->src_off);
        if (st->kind == STEP_REDUCE)
            red_host_apply(e->type, e->op, d, d, src, st->count);
        else if (d != src)
            memcpy(d, src, st->count * e->esize);
        apply_avg(e, st);
        finish_step(e, i);
        *issued = true;
        return loomSuccess;
    }
    if (e->ninflight >= EXEC_MAX_INFLIGHT) return loomSuccess;
    if (st->kind == STEP_RECV_REDUCE && e->nfree == 0) return loomSuccess;
    exec_link_t *l;
    loomResult_t r = h->conn(h, st->peer, &l);
    if (r != loomSuccess) return step_error(e, st, NULL, r);
    size_t bytes = st->count * e->esize;
    if (st->kind == STEP_SEND) {
        uint8_t meta[TRANSPORT_META_BYTES];
        meta_pack(&e->s->descs[st->desc], meta);
        r = l->ops->isend(l->conn, buf_at(e, st->src_buf, st->src_off), bytes, meta, &e->reqs[i]);
    } else if (st->kind == STEP_RECV) {
        r = l->ops->irecv(l->conn, buf_at(e, st->dst_buf, st->dst_off), bytes, &e->reqs[i]);
    } else {
        int slot = e->free_slots[--e->nfree];
        e->slot[i] = slot;
        r = l->ops->irecv(l->conn, e->staging + (size_t)slot * e->slot_bytes, bytes, &e->reqs[i]);
    }
    if (r != loomSuccess) {
        /* A connection that a message of the wrong length broke refuses new work; the receive in
         * flight that got that message carries the metadata naming the operation the peer ran
         * (transports whose metadata travels apart from the payload, such as ucx, may see the
         * break first): let it report first. */
        bool moved = false;
        LOOM_CHECK(complete(e, &moved));
        return step_error(e, st, l, r);
    }
    e->state[i] = ST_ISSUED;
    e->inflight[e->ninflight++] = (uint32_t)i;
    *issued = true;
    return loomSuccess;
}

static loomResult_t issue(exec_t *e, bool *progressed)
{
    const sched_t *s = e->s;
    e->scan++;
    size_t end = LOOM_MIN(s->nsteps, e->first + EXEC_LOOKAHEAD);
    for (size_t i = e->first; i < end; i++) {
        if (e->state[i] != ST_PENDING) continue;
        const sched_step_t *st = &s->steps[i];
        uint32_t *stamp = NULL;
        if (!sched_step_local(st->kind)) {
            stamp = &e->stamp[(size_t)st->peer * 2 + (st->kind == STEP_SEND ? 0 : 1)];
            if (*stamp == e->scan) continue; /* an earlier step to this peer waits: keep order */
        }
        bool issued;
        LOOM_CHECK(try_issue(e, i, &issued));
        if (issued)
            *progressed = true;
        else if (stamp)
            *stamp = e->scan;
    }
    while (e->first < s->nsteps && e->state[e->first] != ST_PENDING)
        e->first++;
    return loomSuccess;
}

void exec_mismatch_text(int peer, const sched_desc_t *theirs, int rank, const sched_desc_t *mine,
                        char *text, size_t len)
{
    char a[160], b[160];
    exec_desc_str(theirs, a, sizeof(a));
    exec_desc_str(mine, b, sizeof(b));
    sched_desc_t same = *theirs;
    same.shape = mine->shape;
    uint8_t m1[TRANSPORT_META_BYTES], m2[TRANSPORT_META_BYTES];
    meta_pack(&same, m2);
    meta_pack(mine, m1);
    if (memcmp(m2, m1, TRANSPORT_META_BYTES) == 0)
        snprintf(
            text, len,
            "operation mismatch: ranks %d and %d both called %s but cut it differently "
            "(shape %016llx against %016llx): LOOM_ALGO, LOOM_DETERMINISTIC, LOOM_SLICE_SIZE or "
            "LOOM_NCHANNELS "
            "differ between them, or it fuses calls that differ (the allreduces of a "
            "group or a fusion bucket: their counts, types, ops or order)",
            peer, rank, b, (unsigned long long)theirs->shape, (unsigned long long)mine->shape);
    else
        snprintf(text, len,
                 "operation mismatch: rank %d called %s but rank %d called %s; every rank must "
                 "issue the same operations in the same order",
                 peer, a, rank, b);
}

static loomResult_t check_meta(exec_t *e, const sched_step_t *st, const uint8_t *meta)
{
    uint8_t want[TRANSPORT_META_BYTES];
    const sched_desc_t *mine = &e->s->descs[st->desc];
    meta_pack(mine, want);
    if (memcmp(want, meta, TRANSPORT_META_BYTES) == 0) return loomSuccess;
    sched_desc_t theirs;
    memcpy(&theirs, meta, sizeof(theirs));
    char text[EXEC_TEXT_MAX];
    exec_mismatch_text(st->peer, &theirs, e->h->rank, mine, text, sizeof(text));
    loomResult_t r = base_error(loomInvalidUsage, LOG_COLL, "%s", text);
    e->h->set_error(e->h, r, base_last_error());
    return r;
}

static loomResult_t complete(exec_t *e, bool *progressed)
{
    exec_host_t *h = e->h;
    /* A broken connection fails all its requests; test them all before reporting, because one
     * of them may carry the metadata that explains the break (a mismatched operation). */
    const sched_step_t *failed_st = NULL;
    loomResult_t failed_res = loomSuccess;
    for (int k = 0; k < e->ninflight;) {
        size_t i = e->inflight[k];
        const sched_step_t *st = &e->s->steps[i];
        int done = 0;
        uint8_t meta[TRANSPORT_META_BYTES];
        const exec_link_t *l = &h->links[st->peer];
        loomResult_t r = l->ops->test(e->reqs[i], &done, meta);
        if (r != loomSuccess) {
            if (done) {
                /* The message arrived but did not fit: say which operations disagree. */
                e->reqs[i] = NULL;
                e->inflight[k] = e->inflight[--e->ninflight];
                if (st->kind != STEP_SEND) LOOM_CHECK(check_meta(e, st, meta));
            } else {
                k++;
            }
            if (failed_st == NULL) {
                failed_st = st;
                failed_res = r;
            }
            continue;
        }
        if (!done) {
            k++;
            continue;
        }
        e->reqs[i] = NULL;
        size_t bytes = st->count * e->esize;
        if (st->kind == STEP_SEND) {
            h->stats->bytes_sent += bytes;
        } else {
            h->stats->bytes_received += bytes;
            LOOM_CHECK(check_meta(e, st, meta));
            if (st->kind == STEP_RECV_REDUCE) {
                const uint8_t *stg = e->staging + (size_t)e->slot[i] * e->slot_bytes;
                red_host_apply(e->type, e->op, buf_at(e, st->dst_buf, st->dst_off),
                               buf_at(e, st->src_buf, st->src_off), stg, st->count);
                e->free_slots[e->nfree++] = e->slot[i];
            }
            apply_avg(e, st);
        }
        finish_step(e, i);
        e->inflight[k] = e->inflight[--e->ninflight];
        *progressed = true;
    }
    if (failed_st) return step_error(e, failed_st, &h->links[failed_st->peer], failed_res);
    return loomSuccess;
}

/* Under the lock (exec_progress holds it). */
static void exec_mark_finished(exec_t *e)
{
    exec_host_t *h = e->h;
    if (e->s->ndescs == 0) return;
    h->rep.finished = e->s->descs[0];
    h->rep.finished_ns = base_coarse_ns();
    h->rep.any_finished = true;
}

static loomResult_t progress_locked(exec_t *e, bool *done, bool *progressed)
{
    exec_host_t *h = e->h;
    *done = false;
    if (atomic_load(h->aborting)) {
        loomResult_t r = base_error(
            loomRemoteError, LOG_COLL, "%s: the communicator was aborted (loomCommAbort)",
            e->s->ndescs ? sched_opkind_name(e->s->descs[0].kind) : "operation");
        return r;
    }
    if (h->async_error) {
        int a = atomic_load(h->async_error);
        if (a != loomSuccess && a != loomInProgress) {
            char d[160] = "operation";
            if (e->s->ndescs) exec_desc_str(&e->s->descs[0], d, sizeof(d));
            return base_error((loomResult_t)a, LOG_COLL, "%s: %s", d, h->async_text);
        }
    }
    if (e->ndone == e->s->nsteps) {
        exec_mark_finished(e);
        *done = true;
        return loomSuccess;
    }
    /* Nothing can become issuable until a step finishes (dependencies and staging slots are
     * all released by completions). */
    if (e->dirty) {
        e->dirty = false;
        LOOM_CHECK(issue(e, progressed));
    }
    for (int t = 0; t < h->ntp; t++) {
        if (h->tp[t].ctx == NULL) continue;
        bool moved = false;
        loomResult_t r = h->tp[t].ops->progress(h->tp[t].ctx, &moved);
        if (r != loomSuccess) {
            h->set_error(h, r, base_last_error());
            return r;
        }
        if (moved) *progressed = true;
    }
    LOOM_CHECK(complete(e, progressed));
    if (e->ndone == e->s->nsteps) {
        exec_mark_finished(e);
        *done = true;
    }
    return loomSuccess;
}

loomResult_t exec_progress(exec_t *e, bool *done, bool *progressed)
{
    exec_host_lock(e->h);
    loomResult_t r = progress_locked(e, done, progressed);
    exec_host_unlock(e->h);
    return r;
}

int exec_pollfds(exec_t *e, struct pollfd *fds, int max)
{
    int n = 0;
    exec_host_t *h = e->h;
    if (max > 0 && h->wake_fd >= 0) fds[n++] = (struct pollfd){.fd = h->wake_fd, .events = POLLIN};
    exec_host_lock(h);
    for (int t = 0; t < h->ntp; t++)
        if (h->tp[t].ctx) n += h->tp[t].ops->pollfds(h->tp[t].ctx, fds + n, max - n);
    exec_host_unlock(h);
    return n;
}

bool exec_host_no_fds(const exec_host_t *h)
{
    for (int t = 0; t < h->ntp; t++)
        if (h->tp[t].ctx && (h->tp[t].ops->caps & TRANSPORT_CAP_POLL)) return true;
    return false;
}

static const char *call_state_text(int st)
{
    switch (st) {
    case TRANSPORT_CALL_IN: return "inside a call";
    case TRANSPORT_CALL_WAITS_IDLE: return "inside a call, waiting on a rank outside calls";
    default: return "outside calls (computing?)";
    }
}

/* The peers e waits on, each once, with what their heartbeats say (the first six). */
static void waits_on(const exec_t *e, char *peers, size_t plen)
{
    const exec_host_t *h = e->h;
    peers[0] = '\0';
    size_t o = 0;
    int listed = 0, more = 0;
    for (int k = 0; k < e->ninflight; k++) {
        int peer = e->s->steps[e->inflight[k]].peer;
        bool seen = false; /* each peer once (only on this error path: quadratic is fine) */
        for (int j = 0; j < k && !seen; j++)
            seen = e->s->steps[e->inflight[j]].peer == peer;
        if (seen) continue;
        const exec_link_t *l = &h->links[peer];
        if (listed == 6 || o + 4 >= plen) {
            more++;
            continue;
        }
        int n = l->conn == NULL ? snprintf(peers + o, plen - o, "%srank %d: not connected yet",
                                           listed ? "; " : "", peer)
                                : snprintf(peers + o, plen - o, "%s%s: %s", listed ? "; " : "",
                                           l->ops->peer_name(l->conn),
                                           call_state_text(transport_peer_call(l->conn)));
        o = LOOM_MIN(o + (size_t)LOOM_MAX(n, 0), plen - 1);
        listed++;
    }
    if (listed == 0) snprintf(peers, plen, "no peer");
    if (more && o + 24 < plen) snprintf(peers + o, plen - o, " and %d more", more);
}

/* LOOM_OP_TIMEOUT: the operation, how long, and every peer it waits on with its state. */
static loomResult_t op_timeout_error(exec_t *e, uint64_t waited)
{
    exec_host_t *h = e->h;
    const sched_step_t *w = &e->s->steps[e->inflight[0]];
    char d[160], peers[640];
    exec_desc_str(&e->s->descs[w->desc], d, sizeof(d));
    waits_on(e, peers, sizeof(peers));
    loomResult_t r = base_error(loomRemoteError, LOG_COLL,
                                "%s: not finished within LOOM_OP_TIMEOUT=%g s (%.1f s); rank %d "
                                "waits on %s (alive: their heartbeats arrive)",
                                d, h->op_timeout_s, (double)waited * 1e-9, h->rank, peers);
    h->set_error(h, r, base_last_error());
    return r;
}

void exec_host_current(exec_host_t *h, char *buf, size_t len)
{
    exec_host_lock(h);
    buf[0] = '\0';
    if (h->cur && h->cur->s->ndescs) exec_desc_str(&h->cur->s->descs[0], buf, len);
    if (h->cur == NULL && h->side_waits) exec_desc_str(&h->side, buf, len);
    exec_host_unlock(h);
}

bool exec_host_status(exec_host_t *h, char *buf, size_t len)
{
    char fin[200] = "nothing finished yet";
    uint64_t now = base_coarse_ns(); /* the stamps are the coarse clock's */
    /* Asked from the progress thread: a call that holds the lock across a long step (one
     * waiting for the job's verdict) must not stall the answer. */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 200000000;
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    if (pthread_mutex_timedlock(&h->lock, &dl) != 0) {
        snprintf(buf, len, "busy (a call holds the communicator: failing?)");
        return false;
    }
    if (h->rep.any_finished) {
        char d[160];
        exec_desc_str(&h->rep.finished, d, sizeof(d));
        snprintf(fin, sizeof(fin), "last finished %s, %.1f s ago", d,
                 (double)(now - h->rep.finished_ns) * 1e-9);
    }
    if (h->cur && h->cur->s->ndescs) {
        char d[160], peers[640];
        exec_desc_str(&h->cur->s->descs[0], d, sizeof(d));
        waits_on(h->cur, peers, sizeof(peers));
        snprintf(buf, len, "in %s for %.1f s, waiting on %s; %s", d,
                 (double)(now - h->cur->start_ns) * 1e-9, peers, fin);
    } else if (h->side_waits) {
        char d[160], peers[640];
        exec_desc_str(&h->side, d, sizeof(d));
        h->side_waits(h->side_arg, peers, sizeof(peers));
        snprintf(buf, len, "in %s for %.1f s, waiting on %s; %s", d,
                 (double)(now - h->side_ns) * 1e-9, peers, fin);
    } else {
        snprintf(buf, len, "outside calls; %s", fin);
    }
    exec_host_unlock(h);
    return true;
}

static loomResult_t check_locked(exec_t *e);

/* The peers that reached this rank over links of transport t it has not made yet (mpi, ucx:
 * no accept), connected now, so that they hear this rank's heartbeats: between calls (the
 * keepalive) while it computes, and inside a call (check_locked) where its schedule has not
 * reached them yet while they wait on it. */
static bool connect_callers(exec_host_t *h, int t)
{
    const transport_ops_t *o = h->tp[t].ops;
    if (h->tp[t].ctx == NULL || o == NULL || o->callers == NULL) return false;
    int peers[16];
    int n = o->callers(h->tp[t].ctx, peers, 16);
    bool made = false;
    for (int i = 0; i < n; i++) {
        exec_link_t *l;
        made |= h->conn(h, peers[i], &l) == loomSuccess;
    }
    return made;
}

loomResult_t exec_check_timeout(exec_t *e)
{
    exec_host_lock(e->h);
    loomResult_t r = check_locked(e);
    exec_host_unlock(e->h);
    return r;
}

static loomResult_t check_locked(exec_t *e)
{
    exec_host_t *h = e->h;
    for (int t = 0; t < h->ntp; t++)
        (void)connect_callers(h, t);
    uint64_t now = base_coarse_ns(); /* the stamps are the coarse clock's */
    /* What this rank's heartbeats say: whether it waits on a rank outside calls (a peer that
     * then waits on us is not in a deadlock with us). */
    bool waits_idle = false;
    for (int k = 0; k < e->ninflight && !waits_idle; k++) {
        const exec_link_t *l = &h->links[e->s->steps[e->inflight[k]].peer];
        if (l->conn && transport_peer_call_known(l->conn) &&
            transport_peer_call(l->conn) == TRANSPORT_CALL_NONE)
            waits_idle = true;
    }
    atomic_store(&h->call_state, waits_idle ? TRANSPORT_CALL_WAITS_IDLE : TRANSPORT_CALL_IN);
    uint64_t op_limit = (uint64_t)(h->op_timeout_s * 1e9);
    if (op_limit > 0 && e->ninflight > 0 && now - e->start_ns > op_limit)
        return op_timeout_error(e, now - e->start_ns);
    uint64_t limit = (uint64_t)(h->timeout_s * 1e9);
    if (limit == 0) return loomSuccess;
    /* Only peers this schedule is waiting on count; the stalest one is named. */
    uint64_t worst = 0;
    int worst_peer = -1;
    for (int k = 0; k < e->ninflight; k++) {
        const sched_step_t *st = &e->s->steps[e->inflight[k]];
        const exec_link_t *l = &h->links[st->peer];
        if (l->conn == NULL) continue;
        bool pending;
        uint64_t idle = l->ops->idle_ns(l->conn, &pending);
        if (pending && idle > worst) {
            worst = idle;
            worst_peer = st->peer;
        }
    }
    if (worst <= limit) {
        /* Heartbeats prove the peers alive, yet nothing finishes. A peer outside calls is
         * computing (or loading, or checkpointing): wait for it, however long (LOOM_OP_TIMEOUT
         * bounds that if the user wants). Point-to-point calls that do not match (both ranks
         * receiving, say) are the application's: after twice LOOM_TIMEOUT with the peer inside a
         * call that waits on nobody outside calls, say what this rank waits for. A collective is
         * left alone: in a ring, a rank waits on a neighbour that is inside the call and waits
         * itself on a computing rank further along. */
        uint64_t stuck = now - e->last_step_ns;
        if (e->ninflight == 0 || stuck <= 2 * limit) return loomSuccess;
        const sched_step_t *w = NULL;
        for (int k = 0; k < e->ninflight && w == NULL; k++) {
            const sched_step_t *st = &e->s->steps[e->inflight[k]];
            const exec_link_t *l = &h->links[st->peer];
            /* A transport whose heartbeats say nothing (mpi, ucx) keeps the old rule. */
            if (l->conn && (!transport_peer_call_known(l->conn) ||
                            transport_peer_call(l->conn) == TRANSPORT_CALL_IN))
                w = st;
        }
        if (w == NULL) return loomSuccess;
        const sched_desc_t *wd = &e->s->descs[w->desc];
        bool p2p = wd->kind == OPK_SEND || wd->kind == OPK_RECV;
        if (!p2p) return loomSuccess;
        bool sending = w->kind == STEP_SEND;
        char d[160], more[48] = "";
        exec_desc_str(wd, d, sizeof(d));
        if (e->ninflight > 1)
            snprintf(more, sizeof(more), " (and %d more steps)", e->ninflight - 1);
        const char *peer = h->links[w->peer].ops->peer_name(h->links[w->peer].conn);
        loomResult_t r;
        if (p2p)
            r = base_error(loomInvalidUsage, LOG_COLL,
                           "%s: nothing finished for %.1f s: this rank waits %s %s%s, which is "
                           "alive (its heartbeats arrive) but %s: the ranks' sends and receives "
                           "do not match (each waiting on the other, or a call missing)",
                           d, (double)stuck * 1e-9, sending ? "to send to" : "to receive from",
                           peer, more, sending ? "does not receive" : "does not send");
        else
            r = base_error(loomRemoteError, LOG_COLL,
                           "%s: nothing finished for %.1f s: this rank waits %s %s%s, which is "
                           "alive (its heartbeats arrive) but %s: it is busy elsewhere or has "
                           "not called this collective",
                           d, (double)stuck * 1e-9, sending ? "to send to" : "to receive from",
                           peer, more, sending ? "does not receive" : "does not send");
        h->set_error(h, r, base_last_error());
        return r;
    }
    const sched_step_t *st = NULL;
    for (int k = 0; k < e->ninflight; k++)
        if (e->s->steps[e->inflight[k]].peer == worst_peer) st = &e->s->steps[e->inflight[k]];
    char d[160];
    exec_desc_str(&e->s->descs[st->desc], d, sizeof(d));
    loomResult_t r = base_error(
        loomRemoteError, LOG_COLL,
        "%s: no progress from %s for %.1f s (LOOM_TIMEOUT=%g) while %s it; the peer is stalled "
        "or dead",
        d, h->links[worst_peer].ops->peer_name(h->links[worst_peer].conn), (double)worst * 1e-9,
        h->timeout_s, st->kind == STEP_SEND ? "sending to" : "receiving from");
    h->set_error(h, r, base_last_error());
    return r;
}

void exec_host_release(exec_host_t *h)
{
    if (h->spare) {
        free(h->spare->arrays);
        free(h->spare);
        h->spare = NULL;
    }
    free(h->staging);
    h->staging = NULL;
    h->staging_bytes = 0;
}

void exec_host_init(exec_host_t *h)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&h->lock, &a);
    pthread_mutexattr_destroy(&a);
    atomic_init(&h->running, 0);
    atomic_init(&h->call_state, TRANSPORT_CALL_NONE);
    h->op_timeout_s = param_double(PARAM_OP_TIMEOUT);
    /* Often enough for the heartbeats (transport_ping_ns) and to answer a late peer's
     * handshake well within LOOM_HANDSHAKE_TIMEOUT (the wait for the first word is not timed);
     * an idle process wakes a few times a second per communicator (250 ms by default). */
    uint64_t hs_ns = (uint64_t)(LOOM_MIN(param_double(PARAM_HANDSHAKE_TIMEOUT), 60.0) * 1e9);
    h->keepalive_ns = LOOM_MAX(LOOM_MIN(transport_ping_ns(), hs_ns) / 4, 1000000ull);
}

void exec_host_lock(exec_host_t *h)
{
    pthread_mutex_lock(&h->lock);
}

void exec_host_unlock(exec_host_t *h)
{
    pthread_mutex_unlock(&h->lock);
}

/* The progress thread's poll function: heartbeats and connection setup while no schedule runs.
 * Errors stay on their connections, for the next call to find. */
static uint64_t keepalive_poll(void *arg, bool *progressed)
{
    (void)progressed; /* not reported: the thread would spin on the heartbeats' bookkeeping */
    exec_host_t *h = arg;
    bool moved = false;
    if (atomic_load(&h->running) == 0 && !atomic_load(h->aborting) &&
        pthread_mutex_trylock(&h->lock) == 0) {
        /* Every transport heartbeats while this rank computes; one that may refuse this thread
         * (MPI below MPI_THREAD_MULTIPLE) says so through its keepalive. */
        for (int t = 0; t < h->ntp && atomic_load(&h->running) == 0; t++) {
            const transport_ops_t *o = h->tp[t].ops;
            if (h->tp[t].ctx == NULL) continue;
            moved |= connect_callers(h, t);
            (void)(o->keepalive ? o->keepalive : o->progress)(h->tp[t].ctx, &moved);
        }
        pthread_mutex_unlock(&h->lock);
    }
    /* Something moved (a peer's connection being authenticated): come back soon. */
    return moved ? 1000000ull : h->keepalive_ns;
}

loomResult_t exec_keepalive_start(exec_host_t *h)
{
    if (h->keepalive_on) return loomSuccess;
    LOOM_CHECK(progress_attach(keepalive_poll, h, 0, 0));
    h->keepalive_on = true;
    return loomSuccess;
}

void exec_keepalive_stop(exec_host_t *h)
{
    if (!h->keepalive_on) return;
    progress_detach(h);
    h->keepalive_on = false;
}
