/*
 * Collective and point-to-point entry points, and groups.
 *
 * Every call is checked completely before anything happens (a bad argument changes nothing),
 * then queued; outside a group the queue is run at once. loomGroupEnd turns each communicator's
 * queue into schedules (consecutive point-to-point calls on one communicator become a single
 * schedule, so they progress together) and drives all communicators' schedules at the same time
 * on the calling thread.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "memtype.h"
#include "param.h"
#include "plan.h"
#ifdef LOOM_HAVE_CUDA
#include "dev.h"
#endif

typedef struct {
    loomComm_t comm;
    int kind; /* sched_opkind_t */
    const void *send;
    void *recv;
    size_t count;
    loomDataType_t type;
    loomRedOp_t op;
    int root; /* root, or peer for point to point */
    cudaStream_t stream;
    bool dev; /* device buffers: the device executor orders it on the stream */
} coll_op_t;

static _Thread_local int group_depth;
/* The memory kinds the current call's buffers were found to be (check_buf). */
static _Thread_local loomComm_t call_comm;
static _Thread_local bool call_dev, call_host;
static _Thread_local const void *call_seen; /* the buffer this call already classified */
static _Thread_local coll_op_t *gq;
static _Thread_local int gq_len, gq_cap;

/* ---- argument checks ---- */

static bool mul_overflows(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

static bool ranges_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

static loomResult_t check_op(loomComm_t comm, const char *fn, loomRedOp_t op, loomDataType_t type)
{
    if ((int)op >= 0 && op < loomNumOps) return loomSuccess;
    int i = base_premul_index(op);
    if (i >= 0 && i < COMM_MAX_PREMUL && comm->premul[i].used) {
        if (comm->premul[i].type != type)
            return base_error(loomInvalidArgument, LOG_COLL,
                              "%s: pre-multiplied sum %d was created for %s, called with %s", fn,
                              (int)op, red_type_name(comm->premul[i].type), red_type_name(type));
        return loomSuccess;
    }
    return base_error(loomInvalidArgument, LOG_COLL,
                      "%s: invalid reduction op %d (sum, prod, max, min, avg, or one made by "
                      "loomRedOpCreatePreMulSum on this communicator)",
                      fn, (int)op);
}

static loomResult_t check_common(loomComm_t comm, const char *fn, loomDataType_t type, size_t count,
                                 size_t mult, size_t *bytes)
{
    LOOM_CHECK(comm_check(comm, fn));
    log_set_rank(comm->rank);
    call_comm = comm;
    call_dev = call_host = false;
    call_seen = NULL;
    if ((int)type < 0 || type >= loomNumTypes)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: invalid datatype %d (expected 0..%d)",
                          fn, (int)type, loomNumTypes - 1);
    size_t elems;
    if (mul_overflows(count, mult, &elems) || mul_overflows(elems, red_type_size(type), bytes) ||
        *bytes > (size_t)INT64_MAX)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "%s: count %zu of %s overflows the address space", fn, count,
                          red_type_name(type));
    return loomSuccess;
}

static loomResult_t check_buf(const char *fn, const char *name, const void *p, size_t bytes)
{
    if (bytes > 0 && p == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: %s is NULL with %zu bytes to move",
                          fn, name, bytes);
    if (bytes == 0) return loomSuccess;
    if (p == call_seen) return loomSuccess; /* in place: one driver query, not two */
#ifdef LOOM_HAVE_CUDA
    int ord = -1;
    mem_type_t mt = mem_type_dev(p, &ord);
#else
    mem_type_t mt = mem_type_of(p);
#endif
    if (mt == MEM_HOST) {
        call_host = true;
        call_seen = p;
        return loomSuccess;
    }
    if (mt == MEM_MANAGED)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: %s (%p) is CUDA managed memory, which loom does not move (use "
                          "device or host memory)",
                          fn, name, p);
#ifdef LOOM_HAVE_CUDA
    call_dev = true;
    /* the communicator binds to the first device buffer's GPU (or its config's) */
    if (call_comm->cuda_dev >= 0 && ord != call_comm->cuda_dev)
        return base_error(loomInvalidUsage, LOG_CUDA,
                          "%s: %s (%p) is on GPU %d, but rank %d of this communicator is bound "
                          "to GPU %d",
                          fn, name, p, ord, call_comm->rank, call_comm->cuda_dev);
    call_comm->cuda_dev = ord;
    call_seen = p;
    return loomSuccess;
#else
    return base_error(loomInvalidUsage, LOG_COLL,
                      "%s: %s (%p) is CUDA device memory, and this build of loom has no device "
                      "executor (it was built without the CUDA toolkit)",
                      fn, name, p);
#endif
}

/* Fills o->dev from the call's buffers; host and device buffers in one call are refused. */
static loomResult_t check_mem_kind(const char *fn, coll_op_t *o)
{
    if (call_dev && call_host)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: one buffer is CUDA device memory and another host memory; a "
                          "call takes one kind",
                          fn);
    o->dev = call_dev;
    return loomSuccess;
}

static loomResult_t check_root(loomComm_t comm, const char *fn, const char *what, int root)
{
    if (root < 0 || root >= comm->nranks)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: %s %d is outside [0, %d)", fn, what,
                          root, comm->nranks);
    return loomSuccess;
}

static loomResult_t check_no_partial_overlap(const char *fn, const void *s, size_t sb,
                                             const void *r, size_t rb, const void *inplace_at)
{
    if (s == inplace_at) return loomSuccess;
    if (ranges_overlap(s, sb, r, rb))
        return base_error(loomInvalidArgument, LOG_COLL,
                          "%s: send and receive buffers overlap without being in place", fn);
    return loomSuccess;
}

/* ---- the queue ---- */

static loomResult_t run_group(void);

static loomResult_t enqueue(const coll_op_t *op)
{
    if (gq_len == gq_cap) {
        int ncap = gq_cap ? gq_cap * 2 : 16;
        coll_op_t *n = realloc(gq, (size_t)ncap * sizeof(*n));
        if (n == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
        gq = n;
        gq_cap = ncap;
    }
    gq[gq_len++] = *op;
    if (group_depth == 0) return run_group();
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomGroupStart(void)
{
    group_depth++;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomGroupEnd(void)
{
    if (group_depth == 0)
        return base_error(loomInvalidUsage, LOG_COLL, "loomGroupEnd without loomGroupStart");
    if (--group_depth > 0) return loomSuccess;
    return run_group();
}

/* ---- turning queued operations into schedules ---- */

typedef struct {
    loomComm_t comm;
    int *ops; /* indices into the queue, in call order */
    int nops, next;
    exec_t *exec;
    void **bufs;
    uint32_t nbufs;
    void *tmp, *scaled;
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
    free(j->tmp);
    free(j->scaled);
    j->tmp = j->scaled = NULL;
}

static loomResult_t job_bufs(comm_job_t *j, uint32_t n)
{
    if (n > j->nbufs) {
        void **b = realloc(j->bufs, n * sizeof(void *));
        if (b == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory");
        j->bufs = b;
        j->nbufs = n;
    }
    return loomSuccess;
}

/* The cached schedule for this shape, or an emptied slot (*hit false) to build it in. */
static sched_t *cache_slot(loomComm_t comm, const uint64_t key[6], bool *hit)
{
    struct comm_sched_cache *lru = &comm->cache[0];
    comm->cache_clock++;
    for (size_t i = 0; i < LOOM_ARRAY_SIZE(comm->cache); i++) {
        struct comm_sched_cache *c = &comm->cache[i];
        if (c->used && memcmp(c->key, key, sizeof(c->key)) == 0) {
            c->last_use = comm->cache_clock;
            *hit = true;
            return &c->s;
        }
        if (!c->used || (lru->used && c->last_use < lru->last_use)) lru = c;
    }
    lru->used = false; /* until built */
    memcpy(lru->key, key, sizeof(lru->key));
    lru->last_use = comm->cache_clock;
    sched_reset(&lru->s, comm->rank, comm->nranks);
    *hit = false;
    return &lru->s;
}

static void cache_commit(loomComm_t comm, sched_t *s)
{
    for (size_t i = 0; i < LOOM_ARRAY_SIZE(comm->cache); i++)
        if (&comm->cache[i].s == s) comm->cache[i].used = true;
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
                      .seq = comm->coll_seq++};
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
                      .nchannels = comm->nchannels,
                      .slice_bytes = comm->slice_bytes};
    ring_params_t prm = plan_ring_params(&ctx, o->type);
    int algo = o->kind == OPK_ALLREDUCE ? comm_pick_allreduce(comm, o->count * es) : -1;
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
    uint64_t cut[3] = {key[2] >> 8, key[4], key[5]};
    d.shape = base_hash64(cut, sizeof(cut), 0x7368617065);
    call.desc.shape = d.shape;
    bool hit;
    sched_t *s = cache_slot(comm, key, &hit);
    *out = s;
    if (hit) {
        s->descs[0].seq = d.seq;
        goto buffers;
    }
    LOOM_CHECK(plan_build(&ctx, &call, s));
    cache_commit(comm, s);
buffers:
    /* Scratch is the communicator's, kept between calls like its staging (one schedule runs
     * at a time per communicator): a fresh block per call faulted in every page each time. */
    if (s->tmp_elems && s->tmp_elems * es > comm->tmp_bytes) {
        free(comm->tmp_buf);
        comm->tmp_bytes = 0;
        comm->tmp_buf = malloc(s->tmp_elems * es);
        if (comm->tmp_buf == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory");
        comm->tmp_bytes = s->tmp_elems * es;
    }
    j->bufs[SCHED_BUF_SEND] = (void *)send;
    j->bufs[SCHED_BUF_RECV] = recv;
    j->bufs[SCHED_BUF_TMP] = s->tmp_elems ? comm->tmp_buf : NULL;
    return loomSuccess;
}

/* Builds one schedule for a run of point-to-point calls; *used tells how many it took. */
static loomResult_t plan_p2p(comm_job_t *j, sched_t *s, int *used)
{
    loomComm_t comm = j->comm;
    int n = 0;
    while (j->next + n < j->nops) {
        const coll_op_t *o = &gq[j->ops[j->next + n]];
        if (o->kind != OPK_SEND && o->kind != OPK_RECV) break;
        n++;
    }
    LOOM_CHECK(job_bufs(j, SCHED_BUF_FIRST_FREE + (uint32_t)n));
    j->bufs[SCHED_BUF_SEND] = j->bufs[SCHED_BUF_RECV] = j->bufs[SCHED_BUF_TMP] = NULL;
    /* Sends to self meet receives from self in order, as local copies. */
    int self_recv = 0;
    for (int k = 0; k < n; k++) {
        const coll_op_t *o = &gq[j->ops[j->next + k]];
        uint32_t b = sched_add_buf(s);
        size_t es = red_type_size(o->type);
        uint64_t slice = LOOM_MAX(comm->slice_bytes / es, 1);
        if (o->root == comm->rank) {
            if (o->kind == OPK_RECV) continue;
            /* find the matching receive from self */
            int seen = 0, match = -1;
            for (int q = 0; q < n; q++) {
                const coll_op_t *x = &gq[j->ops[j->next + q]];
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
            const coll_op_t *x = &gq[j->ops[j->next + match]];
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
        d.seq = o->kind == OPK_SEND ? comm->p2p_send_seq[o->root]++ : comm->p2p_recv_seq[o->root]++;
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
    sched_t *s = &comm->sched;
    const coll_op_t *o = &gq[j->ops[j->next]];
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
    }
    j->type = type;
    if (s->nsteps == 0) return job_next(j);
    return exec_create(comm, s, j->bufs, type, rop, &j->exec);
}

static loomResult_t job_fail(comm_job_t *j, loomResult_t r)
{
    j->res = r;
    snprintf(j->err, sizeof(j->err), "%s", base_last_error());
    j->done = true;
    job_release(j);
    return r;
}

#ifdef LOOM_HAVE_CUDA
/* The device operations of communicator c, from queue entry `first` on, in call order, handed
 * to its device executor at once. A call outside a group is one operation, and it is the
 * latency path's whole host cost besides the launch: no allocation below 8 operations. */
static loomResult_t run_dev_ops(loomComm_t c, int first)
{
    int m = 0;
    for (int q = first; q < gq_len; q++)
        if (gq[q].dev && gq[q].comm == c) m++;
    dev_op_t few[8], *dops = few;
    if (m > (int)LOOM_ARRAY_SIZE(few)) {
        dops = malloc((size_t)m * sizeof(*dops));
        if (dops == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    }
    m = 0;
    for (int q = first; q < gq_len; q++) {
        coll_op_t *o = &gq[q];
        if (!o->dev || o->comm != c) continue;
        dev_op_t *d = &dops[m++];
        *d = (dev_op_t){.kind = o->kind,
                        .send = o->send,
                        .recv = o->recv,
                        .count = o->count,
                        .type = o->type,
                        .op = o->op,
                        .root = o->root,
                        .stream = o->stream};
        int pm = base_premul_index(o->op);
        if (pm >= 0) { /* the pre-multiplied sum's scalar */
            d->scale_host = c->premul[pm].scalar;
            d->scale_dev = c->premul[pm].dev_ptr;
        }
        o->comm = NULL; /* taken */
    }
    atomic_fetch_add(&c->active_calls, 1);
    log_set_rank(c->rank);
    loomResult_t r = dev_run(&c->devh, dops, m);
    if (r == loomSuccess) c->stats.collectives += (uint64_t)m;
    atomic_fetch_sub(&c->active_calls, 1);
    if (dops != few) free(dops);
    return r;
}
#endif

static loomResult_t run_group(void)
{
    int n = gq_len;
    if (n == 0) return loomSuccess;
    loomResult_t res = loomSuccess;
#ifdef LOOM_HAVE_CUDA
    /* First device use of communicators: set them up together (one thread may drive several
     * ranks). */
    {
        dev_host_t *fresh[n];
        int nf = 0;
        for (int i = 0; i < n; i++) {
            if (!gq[i].dev || dev_ready(&gq[i].comm->devh)) continue;
            int k = 0;
            while (k < nf && fresh[k] != &gq[i].comm->devh)
                k++;
            if (k == nf) {
                comm_devhost_fill(gq[i].comm);
                fresh[nf++] = &gq[i].comm->devh;
            }
        }
        if (nf) res = dev_setup(fresh, nf);
    }
    /* Device buffers: ordered on their streams by the device executor, per communicator in
     * call order; nothing to drive here. */
    for (int i = 0; i < n && res == loomSuccess; i++)
        if (gq[i].dev && gq[i].comm != NULL) res = run_dev_ops(gq[i].comm, i);
    if (res != loomSuccess) {
        gq_len = 0;
        return res;
    }
#endif
    int nhost = 0;
    for (int i = 0; i < n; i++)
        nhost += gq[i].comm != NULL;
    if (nhost == 0) {
        gq_len = 0;
        return loomSuccess;
    }
    comm_job_t *jobs = calloc((size_t)n, sizeof(*jobs));
    int *idx = malloc((size_t)n * sizeof(int));
    int njobs = 0;
    if (jobs == NULL || idx == NULL) {
        free(jobs);
        free(idx);
        gq_len = 0;
        return base_error(loomSystemError, LOG_COLL, "out of memory (group)");
    }
    /* One job per communicator, its operations in call order. */
    int used = 0;
    for (int i = 0; i < n; i++) {
        if (gq[i].comm == NULL) continue; /* device operation, done above */
        int k;
        for (k = 0; k < njobs; k++)
            if (jobs[k].comm == gq[i].comm) break;
        if (k == njobs) {
            jobs[k].comm = gq[i].comm;
            jobs[k].ops = idx + used;
            for (int q = i; q < n; q++)
                if (gq[q].comm == gq[i].comm) jobs[k].ops[jobs[k].nops++] = q;
            used += jobs[k].nops;
            njobs++;
            atomic_fetch_add(&gq[i].comm->active_calls, 1);
        }
    }
    for (int k = 0; k < njobs; k++) {
        loomResult_t r = job_next(&jobs[k]);
        if (r != loomSuccess) job_fail(&jobs[k], r);
    }
    uint64_t idle_since = base_now_ns();
    uint64_t spin = njobs ? jobs[0].comm->spin_ns : 0;
    for (;;) {
        bool all_done = true, progressed = false;
        for (int k = 0; k < njobs; k++) {
            comm_job_t *j = &jobs[k];
            if (j->done) continue;
            all_done = false;
            log_set_rank(j->comm->rank);
            bool done = false;
            loomResult_t r = exec_progress(j->exec, &done, &progressed);
            if (r != loomSuccess) {
                job_fail(j, r);
                continue;
            }
            if (done) {
                j->comm->stats.collectives++;
                r = job_next(j);
                if (r != loomSuccess) job_fail(j, r);
                progressed = true;
            }
        }
        if (all_done) break;
        uint64_t now = base_now_ns();
        if (progressed) {
            idle_since = now;
            continue;
        }
        if (now - idle_since < spin) continue;
        struct pollfd fds[256];
        int nf = 0;
        for (int k = 0; k < njobs; k++) {
            comm_job_t *j = &jobs[k];
            if (j->done) continue;
            log_set_rank(j->comm->rank);
            loomResult_t r = exec_check_timeout(j->exec);
            if (r != loomSuccess) {
                job_fail(j, r);
                continue;
            }
            nf += exec_pollfds(j->exec, fds + nf, 256 - nf);
        }
        poll(fds, (nfds_t)nf, 100);
    }
    for (int k = 0; k < njobs; k++) {
        if (jobs[k].res != loomSuccess && res == loomSuccess) {
            res = jobs[k].res;
            base_set_error_text(jobs[k].err);
        }
        atomic_fetch_sub(&jobs[k].comm->active_calls, 1);
        free(jobs[k].bufs);
    }
    free(jobs);
    free(idx);
    gq_len = 0;
    return res;
}

/* Internal allgathers of raw bytes on k communicators at once, as one group, apart from this
 * thread's group queue (the device executor sets itself up in the middle of a call, maybe
 * inside a group, maybe for several ranks that this thread drives). */
loomResult_t coll_internal_allgather_many(loomComm_t *comms, const void *const *send,
                                          void *const *recv, size_t bytes, int k)
{
    int depth = group_depth, len = gq_len, cap = gq_cap;
    coll_op_t *q = gq;
    loomComm_t cc = call_comm;
    bool cd = call_dev, ch = call_host;
    gq_len = gq_cap = 0;
    gq = NULL;
    group_depth = 1;
    loomResult_t r = loomSuccess;
    for (int i = 0; i < k && r == loomSuccess; i++) {
        coll_op_t o = {.comm = comms[i],
                       .kind = OPK_SPLIT,
                       .send = send[i],
                       .recv = recv[i],
                       .count = bytes,
                       .type = loomUint8,
                       .op = loomSum,
                       .root = -1};
        r = enqueue(&o);
    }
    group_depth = 0;
    if (r == loomSuccess) r = run_group();
    free(gq);
    group_depth = depth, gq_len = len, gq_cap = cap, gq = q;
    call_comm = cc, call_dev = cd, call_host = ch;
    return r;
}

/* Internal allgather of raw bytes (communicator split). */
loomResult_t coll_internal_allgather(loomComm_t comm, const void *send, void *recv, size_t bytes)
{
    return coll_internal_allgather_many(&comm, &send, &recv, bytes, 1);
}

/* ---- entry points ---- */

LOOM_EXPORT loomResult_t loomAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                       loomDataType_t type, loomRedOp_t op, loomComm_t comm,
                                       cudaStream_t stream)
{
    const char *fn = "loomAllReduce";
    size_t bytes = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    LOOM_CHECK(check_op(comm, fn, op, type));
    LOOM_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    LOOM_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    LOOM_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, bytes, recvbuff));
    coll_op_t o = {comm, OPK_ALLREDUCE, sendbuff, recvbuff, count, type, op, -1, stream, false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

LOOM_EXPORT loomResult_t loomBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                       loomDataType_t type, int root, loomComm_t comm,
                                       cudaStream_t stream)
{
    const char *fn = "loomBroadcast";
    size_t bytes = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    LOOM_CHECK(check_root(comm, fn, "root", root));
    if (comm->rank == root) {
        LOOM_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
        LOOM_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, bytes, recvbuff));
    }
    LOOM_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    coll_op_t o = {comm, OPK_BROADCAST, sendbuff, recvbuff, count,
                   type, loomSum,       root,     stream,   false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

LOOM_EXPORT loomResult_t loomReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    loomDataType_t type, loomRedOp_t op, int root, loomComm_t comm,
                                    cudaStream_t stream)
{
    const char *fn = "loomReduce";
    size_t bytes = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    LOOM_CHECK(check_op(comm, fn, op, type));
    LOOM_CHECK(check_root(comm, fn, "root", root));
    LOOM_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    if (comm->rank == root) {
        LOOM_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
        LOOM_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, bytes, recvbuff));
    } else {
        recvbuff = (void *)sendbuff == recvbuff ? recvbuff : NULL;
    }
    coll_op_t o = {comm, OPK_REDUCE, sendbuff, recvbuff, count, type, op, root, stream, false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

LOOM_EXPORT loomResult_t loomAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                       loomDataType_t type, loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomAllGather";
    size_t bytes = 0, total = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, sendcount, 1, &bytes));
    LOOM_CHECK(check_common(comm, fn, type, sendcount, (size_t)comm->nranks, &total));
    LOOM_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    LOOM_CHECK(check_buf(fn, "recvbuff", recvbuff, total));
    LOOM_CHECK(check_no_partial_overlap(fn, sendbuff, bytes, recvbuff, total,
                                        (uint8_t *)recvbuff + (size_t)comm->rank * bytes));
    coll_op_t o = {comm, OPK_ALLGATHER, sendbuff, recvbuff, sendcount,
                   type, loomSum,       -1,       stream,   false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

LOOM_EXPORT loomResult_t loomReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                           loomDataType_t type, loomRedOp_t op, loomComm_t comm,
                                           cudaStream_t stream)
{
    const char *fn = "loomReduceScatter";
    size_t bytes = 0, total = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, recvcount, 1, &bytes));
    LOOM_CHECK(check_common(comm, fn, type, recvcount, (size_t)comm->nranks, &total));
    LOOM_CHECK(check_op(comm, fn, op, type));
    LOOM_CHECK(check_buf(fn, "sendbuff", sendbuff, total));
    LOOM_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    if ((uint8_t *)recvbuff != (const uint8_t *)sendbuff + (size_t)comm->rank * bytes)
        LOOM_CHECK(check_no_partial_overlap(fn, sendbuff, total, recvbuff, bytes, NULL));
    coll_op_t o = {comm, OPK_REDUCESCATTER, sendbuff, recvbuff, recvcount, type, op, -1, stream,
                   false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

LOOM_EXPORT loomResult_t loomAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                      loomDataType_t type, loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomAlltoAll";
    size_t total = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, count, 1, &total));
    LOOM_CHECK(check_common(comm, fn, type, count, (size_t)comm->nranks, &total));
    LOOM_CHECK(check_buf(fn, "sendbuff", sendbuff, total));
    LOOM_CHECK(check_buf(fn, "recvbuff", recvbuff, total));
    LOOM_CHECK(check_no_partial_overlap(fn, sendbuff, total, recvbuff, total, recvbuff));
    coll_op_t o = {comm, OPK_ALLTOALL, sendbuff, recvbuff, count, type, loomSum, -1, stream, false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

LOOM_EXPORT loomResult_t loomSend(const void *sendbuff, size_t count, loomDataType_t type, int peer,
                                  loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomSend";
    size_t bytes = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    LOOM_CHECK(check_root(comm, fn, "peer", peer));
    LOOM_CHECK(check_buf(fn, "sendbuff", sendbuff, bytes));
    coll_op_t o = {comm, OPK_SEND, sendbuff, NULL, count, type, loomSum, peer, stream, false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

LOOM_EXPORT loomResult_t loomRecv(void *recvbuff, size_t count, loomDataType_t type, int peer,
                                  loomComm_t comm, cudaStream_t stream)
{
    const char *fn = "loomRecv";
    size_t bytes = 0;
    base_clear_error();
    LOOM_CHECK(check_common(comm, fn, type, count, 1, &bytes));
    LOOM_CHECK(check_root(comm, fn, "peer", peer));
    LOOM_CHECK(check_buf(fn, "recvbuff", recvbuff, bytes));
    coll_op_t o = {comm, OPK_RECV, NULL, recvbuff, count, type, loomSum, peer, stream, false};
    LOOM_CHECK(check_mem_kind(fn, &o));
    return enqueue(&o);
}

/* ---- device memory: not in this build ---- */

LOOM_EXPORT loomResult_t loomMemAlloc(void **ptr, size_t size)
{
    base_clear_error();
    if (ptr == NULL) return base_error(loomInvalidArgument, LOG_CUDA, "loomMemAlloc: ptr is NULL");
#ifdef LOOM_HAVE_CUDA
    return dev_mem_alloc(ptr, size);
#else
    (void)size;
    return base_error(loomInvalidUsage, LOG_CUDA,
                      "loomMemAlloc: this loom was built without CUDA support");
#endif
}

LOOM_EXPORT loomResult_t loomMemFree(void *ptr)
{
    base_clear_error();
    if (ptr == NULL) return loomSuccess;
#ifdef LOOM_HAVE_CUDA
    if (mem_type_of(ptr) == MEM_DEVICE) return dev_mem_free(ptr);
#endif
    return base_error(loomInvalidUsage, LOG_CUDA,
                      "loomMemFree: %p was not allocated by loomMemAlloc", ptr);
}

LOOM_EXPORT loomResult_t loomCommRegister(const loomComm_t comm, void *buff, size_t size,
                                          void **handle)
{
    LOOM_CHECK(comm_check(comm, "loomCommRegister"));
    if (handle == NULL || (buff == NULL && size > 0))
        return base_error(loomInvalidArgument, LOG_COLL, "loomCommRegister: NULL handle or buffer");
    /* Host memory needs no registration for the TCP transport: the handle records the range. */
    void **h = malloc(2 * sizeof(void *));
    if (h == NULL) return base_error(loomSystemError, LOG_COLL, "out of memory");
    h[0] = buff;
    h[1] = (void *)(uintptr_t)size;
    *handle = h;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommDeregister(const loomComm_t comm, void *handle)
{
    LOOM_CHECK(comm_check(comm, "loomCommDeregister"));
    if (handle == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "loomCommDeregister: NULL handle");
    free(handle);
    return loomSuccess;
}
