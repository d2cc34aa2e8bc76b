/*
 * Running checked operations: core's internal entry (coll.h).
 *
 * A group of operations becomes one job per communicator, its operations in call order; a job
 * turns them into schedules one after another (consecutive point-to-point calls on one
 * communicator become a single schedule, so that they progress together) and runs each with the
 * host executor. All jobs of a group advance together, so one thread may drive several ranks;
 * the waiting between steps is the progress engine's (progress_drive on the calling thread, or
 * the progress thread through coll_start/coll_test).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "comm.h"
#include "param.h"
#include "plan.h"
#include "progress.h"

/* ---- turning queued operations into schedules ---- */

/* A job's buffer table in place up to this many (a collective's send, receive and temporary,
 * and a few of a group's point-to-point buffers) */
#define JOB_BUFS_HERE 8

typedef struct {
    loomComm_t comm;
    const coll_op_t *q; /* the group's operations */
    int *ops;           /* this communicator's, as indices into q, in call order */
    int nops, next;
    exec_t *exec;
    bool seg_on; /* an allreduce through the node segment runs instead of a schedule */
    nodeseg_call_t seg;
    void **bufs; /* bufs_here, or memory of its own past JOB_BUFS_HERE */
    uint32_t nbufs;
    void *bufs_here[JOB_BUFS_HERE];
    void *scaled; /* a pre-multiplied input, or all-to-all's copy of an in-place input */
    loomDataType_t type;
    loomResult_t res;
    char err[ERR_TEXT_MAX];
    bool done;
} comm_job_t;

static red_op_t base_op(loomRedOp_t op)
{
    switch (op) {
    case loomProd: return RED_PROD;
    case loomMax: return RED_MAX;
    case loomMin: return RED_MIN;
    default: return RED_SUM; /* sum, avg, pre-multiplied sum */
    }
}

static void job_release(comm_job_t *j)
{
    exec_free(j->exec);
    j->exec = NULL;
    if (j->seg_on) {
        j->seg_on = false;
        exec_host_side_end(&j->comm->exech, false); /* (ended already unless it failed) */
        atomic_store(&j->comm->exech.call_state, TRANSPORT_CALL_NONE);
    }
    free(j->scaled);
    j->scaled = NULL;
}

static loomResult_t job_bufs(comm_job_t *j, uint32_t n)
{
    if (j->bufs == NULL) {
        j->bufs = j->bufs_here;
        j->nbufs = JOB_BUFS_HERE;
    }
    if (n > j->nbufs) {
        void **b = malloc(n * sizeof(void *));
        if (b == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory");
        memcpy(b, j->bufs, j->nbufs * sizeof(void *));
        if (j->bufs != j->bufs_here) free(j->bufs);
        j->bufs = b;
        j->nbufs = n;
    }
    return loomSuccess;
}

/* The cached schedule for this shape, or an emptied slot (*hit false) to build it in: the
 * least recently used one, counted as empty until cache_commit says its build succeeded. */
static sched_t *cache_slot(loomComm_t comm, const uint64_t key[6], bool *hit)
{
    comm_cache_t *cc = &comm->cache;
    for (size_t i = 0; i < LOOM_ARRAY_SIZE(cc->slot); i++) {
        struct comm_sched_cache *c = &cc->slot[i];
        if (c->last_use && memcmp(c->key, key, sizeof(c->key)) == 0) {
            c->last_use = lru_tick(&cc->clock);
            *hit = true;
            return &c->s;
        }
    }
    struct comm_sched_cache *c = &cc->slot[LRU_PICK(cc->slot, LOOM_ARRAY_SIZE(cc->slot), last_use)];
    c->last_use = 0; /* until built */
    memcpy(c->key, key, sizeof(c->key));
    sched_reset(&c->s, comm->rank, comm->nranks);
    *hit = false;
    return &c->s;
}

static void cache_commit(loomComm_t comm, sched_t *s)
{
    comm_cache_t *cc = &comm->cache;
    for (size_t i = 0; i < LOOM_ARRAY_SIZE(cc->slot); i++)
        if (&cc->slot[i].s == s) cc->slot[i].last_use = lru_tick(&cc->clock);
    /* Only building needs the range tables. */
    sched_drop_tracking(s);
}

/* Builds (or finds) the schedule for a collective; fills j->bufs and *out. */
static loomResult_t plan_collective(comm_job_t *j, const coll_op_t *o, sched_t **out)
{
    loomComm_t comm = j->comm;
    int p = comm->nranks, r = comm->rank;
    size_t es = red_type_size(o->type);
    bool avg = o->op == loomAvg;
    int pm = base_premul_index(o->op);
    sched_desc_t d = {.kind = (uint8_t)o->kind,
                      .dtype = (uint8_t)o->type,
                      .op = (uint8_t)(pm >= 0 ? BASE_OP_CODE_PREMUL : (int)o->op),
                      .root = o->root,
                      .count = o->count,
                      .seq = comm->seq.coll++};
    bool reduces =
        o->kind == OPK_ALLREDUCE || o->kind == OPK_REDUCE || o->kind == OPK_REDUCESCATTER;
    if (!reduces) d.op = 0;
    if (o->kind == OPK_ALLGATHER || o->kind == OPK_BROADCAST || o->kind == OPK_ALLTOALL ||
        o->kind == OPK_SPLIT)
        d.root = o->kind == OPK_BROADCAST ? o->root : -1;
    if (o->kind == OPK_ALLREDUCE || o->kind == OPK_ALLGATHER || o->kind == OPK_REDUCESCATTER ||
        o->kind == OPK_ALLTOALL)
        d.root = -1;
    LOOM_CHECK(job_bufs(j, SCHED_BUF_FIRST_FREE));
    const void *send = o->send;
    void *recv = o->recv;
    size_t in_elems =
        o->kind == OPK_REDUCESCATTER || o->kind == OPK_ALLTOALL ? o->count * (size_t)p : o->count;
    /* A pre-multiplied sum scales this rank's input once, then sums. */
    if (pm >= 0 && o->count > 0) {
        j->scaled = malloc(LOOM_MAX(in_elems * es, 1));
        if (j->scaled == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory");
        red_host_scale(o->type, j->scaled, send, comm->premul[pm].scalar, in_elems);
        send = j->scaled;
    }
    /* All-to-all in place: work from a copy of the input. */
    if (o->kind == OPK_ALLTOALL && send == recv && o->count > 0) {
        j->scaled = malloc(in_elems * es);
        if (j->scaled == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory");
        memcpy(j->scaled, send, in_elems * es);
        send = j->scaled;
    }
    /* The shape: in place or not (and how the buffers alias), and the algorithm. */
    plan_ctx_t ctx = {.rank = r,
                      .nranks = p,
                      .topo = comm_topo(comm),
                      .nchannels = comm->tune.nchannels,
                      .slice_bytes = comm->tune.slice_bytes};
    ring_params_t prm = plan_ring_params(&ctx, o->type);
    int algo =
        o->kind == OPK_ALLREDUCE ? comm_pick_allreduce(comm, o->count * es)
        : o->kind == OPK_REDUCE || o->kind == OPK_BROADCAST
            ? comm_pick_rooted(comm, o->kind == OPK_REDUCE ? ROOTED_REDUCE : ROOTED_BROADCAST,
                               o->count * es, o->root)
            : -1;
    /* LOOM_DETERMINISTIC=1: reduce and reduce-scatter fold in rank order too (src/algo/determ.c) */
    if (comm->tune.deterministic && (o->kind == OPK_REDUCE || o->kind == OPK_REDUCESCATTER))
        algo = ALGO_DETERM;
    plan_call_t call = {
        .algo = algo, .inplace = plan_inplace(o->kind, r, o->count, es, send, recv), .avg = avg};
    call.desc = d;
    plan_alias_t al = plan_alias(&ctx, &call);
    uint64_t key[6] = {(uint64_t)d.kind | (uint64_t)d.dtype << 8 | (uint64_t)d.op << 16 |
                           (uint64_t)(uint32_t)d.root << 32,
                       o->count,
                       (uint64_t)al.inplace | (uint64_t)(algo + 1) << 8,
                       (uint64_t)al.alias_delta,
                       (uint64_t)prm.nchannels,
                       prm.slice_elems};
    /* the cut, carried in every message: ranks that slice differently fail with that reason
     * instead of a confusing size mismatch */
    /* (in place or not may differ between ranks: only the algorithm and the cut count) */
    uint64_t cut[4] = {key[2] >> 8, key[4], key[5], o->tag};
    d.shape = base_hash64(cut, sizeof(cut), 0x7368617065);
    call.desc.shape = d.shape;
    nodeseg_t *seg = comm->net.seg;
    if (algo == ALGO_SEGMENT && seg && o->count > 0 && o->count * es <= nodeseg_max_bytes(seg)) {
        /* no schedule: the node segment (nodeseg.h); heartbeats say this rank is in a call */
        *out = NULL;
        j->seg_on = true;
        atomic_store(&comm->exech.call_state, TRANSPORT_CALL_IN);
        return nodeseg_start(seg, &j->seg, &d, send, recv, o->count, o->type, base_op(o->op), avg);
    }
    /* peers waiting in the segment see what this rank runs as this collective */
    nodeseg_arrive(seg, &d);
    bool hit;
    sched_t *s = cache_slot(comm, key, &hit);
    *out = s;
    if (hit) {
        s->descs[0].seq = d.seq;
        s->descs[0].shape = d.shape; /* the tag is not part of the cache key */
        goto buffers;
    }
    LOOM_CHECK(plan_build(&ctx, &call, s));
    cache_commit(comm, s);
buffers:
    /* Scratch is the communicator's, kept between calls like its staging (one schedule runs
     * at a time per communicator): a fresh block per call faulted in every page each time. */
    if (s->tmp_elems && s->tmp_elems * es > comm->cache.tmp_bytes) {
        free(comm->cache.tmp_buf);
        comm->cache.tmp_bytes = 0;
        comm->cache.tmp_buf = calloc(1, s->tmp_elems * es); /* sent as it is by ring_close */
        if (comm->cache.tmp_buf == NULL)
            return base_error(loomSystemError, LOG_COLL, "out of memory");
        comm->cache.tmp_bytes = s->tmp_elems * es;
    }
    j->bufs[SCHED_BUF_SEND] = (void *)send;
    j->bufs[SCHED_BUF_RECV] = recv;
    j->bufs[SCHED_BUF_TMP] = s->tmp_elems ? comm->cache.tmp_buf : NULL;
    return loomSuccess;
}

/* Builds one schedule for a run of point-to-point calls; *used tells how many it took. */
static loomResult_t plan_p2p(comm_job_t *j, sched_t *s, int *used)
{
    loomComm_t comm = j->comm;
    int n = 0;
    while (j->next + n < j->nops) {
        const coll_op_t *o = &j->q[j->ops[j->next + n]];
        if (o->kind != OPK_SEND && o->kind != OPK_RECV) break;
        n++;
    }
    LOOM_CHECK(job_bufs(j, SCHED_BUF_FIRST_FREE + (uint32_t)n));
    j->bufs[SCHED_BUF_SEND] = j->bufs[SCHED_BUF_RECV] = j->bufs[SCHED_BUF_TMP] = NULL;
    /* Sends to self meet receives from self in order, as local copies. */
    int self_recv = 0;
    for (int k = 0; k < n; k++) {
        const coll_op_t *o = &j->q[j->ops[j->next + k]];
        uint32_t b = sched_add_buf(s);
        size_t es = red_type_size(o->type);
        uint64_t slice = LOOM_MAX(comm_p2p_piece(comm, o->root) / es, 1);
        if (o->root == comm->rank) {
            if (o->kind == OPK_RECV) continue;
            /* find the matching receive from self */
            int seen = 0, match = -1;
            for (int q = 0; q < n; q++) {
                const coll_op_t *x = &j->q[j->ops[j->next + q]];
                if (x->kind == OPK_RECV && x->root == comm->rank && seen++ == self_recv) {
                    match = q;
                    break;
                }
            }
            self_recv++;
            if (match < 0)
                return base_error(loomInvalidUsage, LOG_P2P,
                                  "send to self (rank %d) without a matching receive from self "
                                  "in the same group",
                                  comm->rank);
            const coll_op_t *x = &j->q[j->ops[j->next + match]];
            if (x->count != o->count || x->type != o->type)
                return base_error(loomInvalidUsage, LOG_P2P,
                                  "send to self of %zu %s meets a receive of %zu %s", o->count,
                                  red_type_name(o->type), x->count, red_type_name(x->type));
            if (o->count) memcpy(x->recv, o->send, o->count * es);
            continue;
        }
        j->bufs[b] = o->kind == OPK_SEND ? (void *)o->send : o->recv;
        sched_desc_t d = {.kind = (uint8_t)o->kind,
                          .dtype = (uint8_t)o->type,
                          .root = o->kind == OPK_SEND ? comm->rank : o->root,
                          .count = o->count};
        d.seq = o->kind == OPK_SEND ? comm->seq.p2p_send[o->root]++ : comm->seq.p2p_recv[o->root]++;
        uint16_t di = sched_add_desc(s, &d);
        uint64_t S = sched_nslices(o->count, slice);
        for (uint64_t q = 0; q < S; q++) {
            uint64_t len = sched_slice_len(o->count, slice, q);
            if (o->kind == OPK_SEND)
                sched_send(s, di, o->root, b, q * slice, len);
            else
                sched_recv(s, di, o->root, b, q * slice, len);
        }
    }
    LOOM_CHECK(sched_status(s));
    *used = n;
    return loomSuccess;
}

/* Prepares the next schedule of a job; sets j->done when none is left. */
static loomResult_t job_next(comm_job_t *j)
{
    job_release(j);
    if (j->next >= j->nops) {
        j->done = true;
        return loomSuccess;
    }
    loomComm_t comm = j->comm;
    log_set_rank(comm->rank);
    sched_t *s = &comm->cache.p2p;
    const coll_op_t *o = &j->q[j->ops[j->next]];
    loomDataType_t type = o->type;
    red_op_t rop = base_op(o->op);
    if (o->kind == OPK_SEND || o->kind == OPK_RECV) {
        int used = 0;
        sched_reset(s, comm->rank, comm->nranks);
        LOOM_CHECK(plan_p2p(j, s, &used));
        j->next += used;
        type = loomUint8;
        /* Point-to-point schedules may mix types: count in bytes. */
        for (size_t i = 0; i < s->nsteps; i++) {
            sched_step_t *st = &s->steps[i];
            size_t es = red_type_size((loomDataType_t)s->descs[st->desc].dtype);
            st->src_off *= es;
            st->dst_off *= es;
            st->count *= es;
        }
    } else {
        LOOM_CHECK(plan_collective(j, o, &s));
        j->next++;
        if (s == NULL) return loomSuccess; /* through the node segment */
    }
    j->type = type;
    if (s->nsteps == 0) return job_next(j);
    return exec_create(&comm->exech, s, j->bufs, type, rop, &j->exec);
}

static loomResult_t job_fail(comm_job_t *j, loomResult_t r)
{
    j->res = r;
    snprintf(j->err, sizeof(j->err), "%s", base_last_error());
    j->done = true;
    job_release(j);
    return r;
}

/* ---- groups ---- */

struct coll_group {
    prog_work_t work; /* first: the progress engine's view of the group */
    coll_op_t *own;   /* coll_start's copy of the operations */
    comm_job_t *jobs;
    int njobs;
    int *idx;
    uint64_t idle_since; /* coll_test: when the group last moved */
    bool no_fds;         /* a transport of the group has no descriptors (work.no_fds's base) */
};

static coll_group_t *group_of(prog_work_t *w)
{
    return (coll_group_t *)w;
}

static loomResult_t group_advance(prog_work_t *w, bool *all_done, bool *progressed)
{
    coll_group_t *g = group_of(w);
    *all_done = true;
    bool seg = false;
    for (int k = 0; k < g->njobs; k++) {
        comm_job_t *j = &g->jobs[k];
        if (j->done) continue;
        log_set_rank(j->comm->rank);
        bool done = false;
        loomResult_t r = j->seg_on ? nodeseg_test(&j->seg, &done, progressed)
                                   : exec_progress(j->exec, &done, progressed);
        if (r != loomSuccess) {
            job_fail(j, r);
            continue;
        }
        if (done) {
            j->comm->stats.collectives++;
            r = job_next(j);
            if (r != loomSuccess) job_fail(j, r);
            *progressed = true;
        }
        /* a job that just ended counts now: a waiter told "not done" would sleep on the
         * descriptors of a group that has none left to wait on */
        if (!j->done) *all_done = false;
        /* nothing signals an arrival in the segment: a wait on one sleeps in short pieces */
        seg |= !j->done && j->seg_on;
    }
    g->work.no_fds = g->no_fds || seg;
    return loomSuccess;
}

/* Jobs fail one by one (the others go on): the group's result is gathered at the end. */
static loomResult_t group_check(prog_work_t *w)
{
    coll_group_t *g = group_of(w);
    for (int k = 0; k < g->njobs; k++) {
        comm_job_t *j = &g->jobs[k];
        if (j->done) continue;
        log_set_rank(j->comm->rank);
        loomResult_t r = j->seg_on ? nodeseg_check(&j->seg) : exec_check_timeout(j->exec);
        if (r != loomSuccess) job_fail(j, r);
    }
    return loomSuccess;
}

static int group_pollfds(prog_work_t *w, struct pollfd *fds, int max)
{
    coll_group_t *g = group_of(w);
    int nf = 0;
    for (int k = 0; k < g->njobs; k++)
        if (!g->jobs[k].done)
            nf += g->jobs[k].seg_on ? nodeseg_pollfds(&g->jobs[k].seg, fds + nf, max - nf)
                                    : exec_pollfds(g->jobs[k].exec, fds + nf, max - nf);
    return nf;
}

/* The group's result (the first failure, its text made the thread's error text), freed. */
static loomResult_t group_finish(coll_group_t *g)
{
    loomResult_t res = loomSuccess;
    for (int k = 0; k < g->njobs; k++) {
        comm_job_t *j = &g->jobs[k];
        if (j->res != loomSuccess && res == loomSuccess) {
            res = j->res;
            base_set_error_text(j->err);
        }
        job_release(j);
        nodeseg_state(j->comm->net.seg, false);
        atomic_fetch_sub(&j->comm->st.active_calls, 1);
        if (j->bufs != j->bufs_here) free(j->bufs);
    }
    free(g->own);
    free(g);
    return res;
}

/* One job per communicator, its operations in call order; each starts its first schedule. */
static loomResult_t group_create(const coll_op_t *q, int n, coll_group_t **out)
{
    /* The group, its jobs and their operation indices in one allocation: one per call. */
    size_t m = (size_t)LOOM_MAX(n, 1);
    size_t jobs_at = LOOM_ALIGN_UP(sizeof(coll_group_t), _Alignof(comm_job_t));
    size_t idx_at = jobs_at + m * sizeof(comm_job_t);
    coll_group_t *g = calloc(1, idx_at + m * sizeof(int));
    if (g == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    g->jobs = (comm_job_t *)(void *)((char *)g + jobs_at);
    g->idx = (int *)(void *)((char *)g + idx_at);
    g->work = (prog_work_t){.advance = group_advance,
                            .pollfds = group_pollfds,
                            .check = group_check,
                            .spin_ns = n ? q[0].comm->tune.spin_ns : 0,
                            .hot_ns = n ? q[0].comm->tune.hot_ns : 0};
    int used = 0;
    for (int i = 0; i < n; i++) {
        int k;
        for (k = 0; k < g->njobs; k++)
            if (g->jobs[k].comm == q[i].comm) break;
        if (k < g->njobs) continue;
        comm_job_t *j = &g->jobs[g->njobs++];
        j->comm = q[i].comm;
        j->q = q;
        j->ops = g->idx + used;
        for (int o = i; o < n; o++)
            if (q[o].comm == q[i].comm) j->ops[j->nops++] = o;
        used += j->nops;
        atomic_fetch_add(&j->comm->st.active_calls, 1);
        nodeseg_state(j->comm->net.seg, true);
        g->no_fds |= exec_host_no_fds(&j->comm->exech);
    }
    g->work.no_fds = g->no_fds;
    for (int k = 0; k < g->njobs; k++) {
        comm_job_t *j = &g->jobs[k];
        /* a broken or aborted communicator runs nothing more (the public entry points refuse
         * it before queueing; core's own callers come here directly) */
        loomResult_t a = (loomResult_t)atomic_load(&j->comm->st.async_error);
        if (a != loomSuccess && a != loomInProgress) {
            base_set_error_text(j->comm->st.async_text);
            job_fail(j, a);
            continue;
        }
        loomResult_t r = job_next(j);
        if (r != loomSuccess) job_fail(j, r);
    }
    *out = g;
    return loomSuccess;
}

loomResult_t coll_run(const coll_op_t *ops, int n)
{
    if (n == 0) return loomSuccess;
    coll_group_t *g;
    LOOM_CHECK(group_create(ops, n, &g));
    loomResult_t r = progress_drive(&g->work);
    loomResult_t f = group_finish(g);
    return r != loomSuccess ? r : f;
}

loomResult_t coll_start(const coll_op_t *ops, int n, coll_group_t **out)
{
    coll_op_t *own = malloc((size_t)LOOM_MAX(n, 1) * sizeof(*own));
    if (own == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    memcpy(own, ops, (size_t)n * sizeof(*own));
    coll_group_t *g;
    loomResult_t r = group_create(own, n, &g);
    if (r != loomSuccess) {
        free(own);
        return r;
    }
    g->own = own;
    g->idle_since = base_now_ns();
    progress_watch(&g->work);
    *out = g;
    return loomSuccess;
}

loomResult_t coll_test(coll_group_t *g, bool *done)
{
    bool progressed;
    return coll_advance(g, done, &progressed);
}

loomResult_t coll_advance(coll_group_t *g, bool *done, bool *moved)
{
    bool progressed = false;
    *done = false;
    loomResult_t r = group_advance(&g->work, done, &progressed);
    uint64_t now = base_now_ns();
    *moved = progressed;
    if (progressed) g->idle_since = now;
    /* the timeout rules, as a blocked caller would apply them between its waits */
    if (!*done && r == loomSuccess && now - g->idle_since >= PROGRESS_BLOCK_MS * 1000000ull) {
        g->idle_since = now;
        r = group_check(&g->work);
    }
    if (!*done && r == loomSuccess) return loomSuccess;
    *done = true;
    progress_unwatch(&g->work);
    loomResult_t f = group_finish(g);
    return r != loomSuccess ? r : f;
}

loomResult_t coll_hold(loomComm_t comm, const char *fn)
{
    LOOM_CHECK(comm_check(comm, fn));
    comm_ref(comm);
    return loomSuccess;
}

void coll_drop(loomComm_t comm)
{
    comm_unref(comm);
}

loomResult_t coll_usable(loomComm_t comm, const char *fn)
{
    if (atomic_load(&comm->st.destroyed))
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: communicator %p was destroyed or aborted", fn, (void *)comm);
    return comm_check(comm, fn);
}

uint64_t coll_spin_ns(loomComm_t comm)
{
    return comm->tune.spin_ns;
}

uint64_t coll_hot_ns(loomComm_t comm)
{
    return comm->tune.hot_ns;
}

int coll_rank(loomComm_t comm)
{
    return comm->rank;
}

int coll_nranks(loomComm_t comm)
{
    return comm->nranks;
}

int coll_layout(loomComm_t comm, const int **node_of, const int **node_start,
                const int **node_ranks)
{
    *node_of = comm->lay.node_of;
    *node_start = comm->lay.node_start;
    *node_ranks = comm->lay.node_ranks;
    return comm->lay.nnodes;
}

loomResult_t coll_allgather_many(loomComm_t *comms, const void *const *send, void *const *recv,
                                 size_t bytes, int k)
{
    coll_op_t few[8], *ops = few;
    if (k > (int)LOOM_ARRAY_SIZE(few)) {
        ops = malloc((size_t)k * sizeof(*ops));
        if (ops == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    }
    for (int i = 0; i < k; i++)
        ops[i] = (coll_op_t){.comm = comms[i],
                             .kind = OPK_SPLIT,
                             .send = send[i],
                             .recv = recv[i],
                             .count = bytes,
                             .type = loomUint8,
                             .op = loomSum,
                             .root = -1};
    loomResult_t r = coll_run(ops, k);
    if (ops != few) free(ops);
    return r;
}

void coll_fusion_sizes(loomComm_t comm, bool device, uint64_t *bucket, uint64_t *segment)
{
    comm_fusion_sizes(comm, device ? TUNE_MEM_DEVICE : TUNE_MEM_HOST, bucket, segment);
}

bool coll_deterministic(loomComm_t comm)
{
    return comm->tune.deterministic;
}
