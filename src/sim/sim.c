/* The simulator (sim.h): the planner's schedules, every rank's, run as discrete events on a
 * modelled machine. */
#include "sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "exec.h" /* EXEC_LOOKAHEAD: the executor's window */
#include "plan.h"
#include "registry.h"
#include "schedule.h"

bool sim_machine_preset(const char *name, sim_machine_t *m)
{
    memset(m, 0, sizeof(*m));
    m->oversub = 1;
    m->slice_bytes = 256 << 10;
    m->nchannels = 2;
    m->slices_in_flight = 8;
    if (strcmp(name, "h200") == 0) {
        /* NVLink 4 through NVSwitch: 450 GB/s a direction nominal; 360 is what two H200s
         * reach with loom and NCCL at 8 GiB (perf/RESULTS.md, /work/shared/baselines), the
         * calibration point. A step's latency from the 2-GPU 8 B time (4.8 us, two steps). */
        m->per_node = 8;
        m->loc_alpha = 2.4e-6;
        m->loc_bw = 360e9;
        /* 400 Gb/s NICs (ConnectX-7), 48 GB/s reached; RDMA plus proxy latency */
        m->net_alpha = 6e-6;
        m->net_bw = 48e9;
        m->fabric = SIM_RAIL;
        m->spine_alpha = 1e-6;
        m->red_bw = 2e12; /* reducing in HBM: never the bound */
        m->slice_bytes = 512 << 10;
        return true;
    }
    if (strcmp(name, "dev") == 0) {
        /* The 2-core dev VM: one node, shared memory copied by the cores (perf/RESULTS.md: the
         * sweep at 2 and 4 ranks, membw). */
        m->per_node = 0; /* all ranks on one node */
        m->loc_alpha = 18e-6;
        m->loc_bw = 6e9;
        m->net_alpha = 30e-6;
        m->net_bw = 1e9;
        m->red_bw = 5e9;
        m->cores = 2;
        m->wake_alpha = 25e-6;
        return true;
    }
    if (strcmp(name, "testbed") == 0) {
        /* scripts/testbed.sh on the dev VM: every node a network namespace whose one veth is
         * shaped to 1 Gbit/s each way, a bridge between them; inside a node the dev preset's
         * shared memory, and the VM's 2 cores shared by all nodes. The link carries TCP
         * payload at 1448 of every 1514 bytes tbf counts: 119.6 MB/s (the 2x2 ring at 16 MiB
         * measured 119.4, perf/RESULTS.md). The bed's jobs have more ranks than the host has
         * cores: loom's ranks then spin yielding the core (no wake-up per step) and take 4x
         * slices (comm.c). Latencies calibrated on the 2x2 bed's 8 B time of rd (one shm step,
         * one TCP step: 14.4 us, perf/RESULTS.md session 21); 2x4 and 4x2 validate them
         * (perf/testbed-model). */
        sim_machine_preset("dev", m);
        m->per_node = 2;
        m->loc_alpha = 4e-6;
        m->net_alpha = 10e-6;
        m->net_bw = 1e9 / 8 * 1448 / 1514;
        m->node_nic = true;
        m->cores_shared = true;
        m->wake_alpha = 0;
        m->slice_bytes = 1 << 20;
        return true;
    }
    return false;
}

/* ---- events ------------------------------------------------------------------------------ */

enum { EV_POST = 0, EV_ARRIVE = 1, EV_DONE = 2 };

typedef struct {
    double t;
    uint32_t gid;
    uint8_t type;
} ev_t;

typedef struct {
    ev_t *h;
    size_t n, cap;
    bool oom;
} heap_t;

/* Earlier time first; at one time, the earlier step (the executor scans in schedule order). */
static inline bool ev_before(const ev_t *a, const ev_t *b)
{
    return a->t < b->t || (a->t == b->t && a->gid < b->gid);
}

static void heap_push(heap_t *q, double t, uint32_t gid, uint8_t type)
{
    if (q->n == q->cap) {
        size_t nc = q->cap ? q->cap * 2 : 4096;
        ev_t *nh = realloc(q->h, nc * sizeof(*nh));
        if (nh == NULL) {
            q->oom = true;
            return;
        }
        q->h = nh;
        q->cap = nc;
    }
    size_t i = q->n++;
    ev_t e = {t, gid, type};
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ev_before(&e, &q->h[p])) break;
        q->h[i] = q->h[p];
        i = p;
    }
    q->h[i] = e;
}

static ev_t heap_pop(heap_t *q)
{
    ev_t top = q->h[0], last = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && ev_before(&q->h[c + 1], &q->h[c])) c++;
        if (!ev_before(&q->h[c], &last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

/* ---- the run ----------------------------------------------------------------------------- */

enum { S_DEPS = 1, S_POSTED = 2, S_DONE = 4, S_DEFER = 8, S_WANT = 16 };

typedef struct {
    int from, to;
    uint32_t nsend, nrecv, sposted, rposted, started;
    uint32_t *send, *recv; /* global step ids by ordinal */
    int32_t wnext;         /* in its receiver's queue of pairs waiting for a staging slot */
    bool waiting;
} pair_t;

typedef struct {
    const sim_machine_t *m;
    int p, g; /* ranks, ranks per node */
    sched_t *s;
    uint32_t *off; /* [p + 1] global id of each rank's first step */
    uint64_t total;
    uint32_t *rank_of;   /* by global id */
    uint32_t *remaining; /* dependencies not done */
    uint8_t *state;
    uint32_t *dnt_off, *dnt; /* dependents (CSR) */
    int32_t *pair;           /* pair of a send or receive */
    pair_t *pairs;
    size_t npairs;
    uint32_t *cursor;       /* first step not yet issued, per rank (the executor's window start) */
    int *free_slots;        /* staging slots for receive-reduce, per rank */
    int32_t *whead, *wtail; /* pairs waiting for a slot, a FIFO per receiving rank */
    /* link and engine free times */
    double *loc_tx, *loc_rx, *nic_tx, *nic_rx, *engine;
    double *up, *down, *core; /* per node; cores: [node * cores + k] */
    heap_t q;
    double end;
    bool oom;
} run_t;

static int node_of(const run_t *r, int rank)
{
    return rank / r->g;
}

/* The hash of pairs: open addressing on from * p + to. */
typedef struct {
    int64_t *key;
    int32_t *val;
    size_t cap;
} pmap_t;

static int32_t pair_id(run_t *r, pmap_t *pm, int from, int to)
{
    int64_t k = (int64_t)from * r->p + to;
    if (2 * (r->npairs + 1) > pm->cap) {
        size_t nc = pm->cap ? pm->cap * 2 : 1024;
        int64_t *nk = malloc(nc * sizeof(*nk));
        int32_t *nv = malloc(nc * sizeof(*nv));
        pair_t *np = realloc(r->pairs, (nc / 2) * sizeof(*np));
        if (nk == NULL || nv == NULL || np == NULL) {
            free(nk);
            free(nv);
            if (np) r->pairs = np;
            r->oom = true;
            return -1;
        }
        r->pairs = np;
        for (size_t i = 0; i < nc; i++)
            nk[i] = -1;
        for (size_t i = 0; i < pm->cap; i++) {
            if (pm->key[i] < 0) continue;
            size_t h = (size_t)((uint64_t)pm->key[i] * 0x9e3779b97f4a7c15ull >> 20) & (nc - 1);
            while (nk[h] >= 0)
                h = (h + 1) & (nc - 1);
            nk[h] = pm->key[i];
            nv[h] = pm->val[i];
        }
        free(pm->key);
        free(pm->val);
        pm->key = nk;
        pm->val = nv;
        pm->cap = nc;
    }
    size_t h = (size_t)((uint64_t)k * 0x9e3779b97f4a7c15ull >> 20) & (pm->cap - 1);
    while (pm->key[h] >= 0) {
        if (pm->key[h] == k) return pm->val[h];
        h = (h + 1) & (pm->cap - 1);
    }
    pm->key[h] = k;
    pm->val[h] = (int32_t)r->npairs;
    pair_t *pr = &r->pairs[r->npairs];
    memset(pr, 0, sizeof(*pr));
    pr->from = from;
    pr->to = to;
    return (int32_t)r->npairs++;
}

static const sched_step_t *step_of(const run_t *r, uint32_t gid)
{
    int rk = (int)r->rank_of[gid];
    return &r->s[rk].steps[gid - r->off[rk]];
}

static double step_cost(const run_t *r, int rank)
{
    const sim_machine_t *m = r->m;
    int nsize = m->cores_shared ? r->p : LOOM_MIN(r->g, r->p - node_of(r, rank) * r->g);
    return m->step_alpha + (m->cores > 0 && nsize > m->cores ? m->wake_alpha : 0);
}

/* The earliest-free core of a node (host model). */
static double *pick_core(run_t *r, int node)
{
    double *c = &r->core[r->m->cores_shared ? 0 : (size_t)node * (size_t)r->m->cores];
    double *best = c;
    for (int k = 1; k < r->m->cores; k++)
        if (c[k] < *best) best = &c[k];
    return best;
}

/* Runs on the reduction engine (or a core): returns the end. */
static double compute(run_t *r, int rank, double now, double bytes)
{
    double *e = r->m->cores > 0 ? pick_core(r, node_of(r, rank)) : &r->engine[rank];
    double t0 = LOOM_MAX(now, *e);
    *e = t0 + bytes / r->m->red_bw;
    return *e;
}

/* One message from a to b starting no earlier than now: holds each link of its path for bytes
 * over that link's bandwidth; returns its arrival. */
static double transfer(run_t *r, int a, int b, double now, double bytes)
{
    const sim_machine_t *m = r->m;
    double *res[6], cap[6];
    int n = 0;
    double alpha;
    int na = node_of(r, a), nb = node_of(r, b);
    if (na == nb) {
        alpha = m->loc_alpha;
        res[n] = &r->loc_tx[a], cap[n++] = m->loc_bw;
        res[n] = &r->loc_rx[b], cap[n++] = m->loc_bw;
        if (m->cores > 0) res[n] = pick_core(r, nb), cap[n++] = m->loc_bw;
    } else {
        alpha = m->net_alpha;
        if (m->node_nic) {
            /* the node's one NIC is its uplink */
            res[n] = &r->up[na], cap[n++] = m->net_bw;
            res[n] = &r->down[nb], cap[n++] = m->net_bw;
        } else {
            res[n] = &r->nic_tx[a], cap[n++] = m->net_bw;
            res[n] = &r->nic_rx[b], cap[n++] = m->net_bw;
            bool same_rail = (a % r->g) == (b % r->g);
            if (m->fabric == SIM_FAT_TREE || !same_rail) {
                double uplink = (double)r->g * m->net_bw / LOOM_MAX(m->oversub, 1.0);
                res[n] = &r->up[na], cap[n++] = uplink;
                res[n] = &r->down[nb], cap[n++] = uplink;
                if (m->fabric == SIM_RAIL) alpha += m->spine_alpha;
            }
        }
    }
    double t0 = now, slow = INFINITY;
    for (int i = 0; i < n; i++) {
        t0 = LOOM_MAX(t0, *res[i]);
        slow = LOOM_MIN(slow, cap[i]);
    }
    for (int i = 0; i < n; i++)
        *res[i] = t0 + bytes / cap[i];
    return t0 + alpha + bytes / slow;
}

static void issue(run_t *r, uint32_t gid, double now)
{
    r->state[gid] &= (uint8_t)~S_DEFER;
    heap_push(&r->q, now + step_cost(r, (int)r->rank_of[gid]), gid, EV_POST);
}

/* The window moves past every issued step; steps it reaches that wait for it go. */
static void advance_window(run_t *r, int rk, double now)
{
    uint32_t n = r->off[rk + 1] - r->off[rk], old = r->cursor[rk];
    while (r->cursor[rk] < n && (r->state[r->off[rk] + r->cursor[rk]] & S_POSTED))
        r->cursor[rk]++;
    uint64_t lo = (uint64_t)old + EXEC_LOOKAHEAD, hi = (uint64_t)r->cursor[rk] + EXEC_LOOKAHEAD;
    for (uint64_t i = lo; i < hi && i < n; i++)
        if (r->state[r->off[rk] + i] & S_DEFER) issue(r, r->off[rk] + (uint32_t)i, now);
}

/* Dependencies done at `now`: issue within the window, else wait for it. */
static void deps_done(run_t *r, uint32_t gid, double now)
{
    int rk = (int)r->rank_of[gid];
    r->state[gid] |= S_DEPS;
    if (gid - r->off[rk] < r->cursor[rk] + EXEC_LOOKAHEAD)
        issue(r, gid, now);
    else
        r->state[gid] |= S_DEFER;
}

/* Sends and receives of one pair are issued in schedule order, as the executor issues them (an
 * earlier step to a peer that cannot go holds the later ones): a receive-reduce takes a staging
 * slot or the pair waits in its receiver's queue for one. Then every send and receive matched
 * on both sides starts its transfer. */
static void pair_progress(run_t *r, pair_t *pr, double now)
{
    while (pr->sposted < pr->nsend && (r->state[pr->send[pr->sposted]] & S_WANT)) {
        r->state[pr->send[pr->sposted++]] |= S_POSTED;
        advance_window(r, pr->from, now);
    }
    while (pr->rposted < pr->nrecv && (r->state[pr->recv[pr->rposted]] & S_WANT)) {
        uint32_t g = pr->recv[pr->rposted];
        if (step_of(r, g)->kind == STEP_RECV_REDUCE) {
            if (r->free_slots[pr->to] == 0) {
                if (!pr->waiting) {
                    int32_t id = (int32_t)(pr - r->pairs);
                    pr->waiting = true;
                    pr->wnext = -1;
                    if (r->whead[pr->to] < 0)
                        r->whead[pr->to] = id;
                    else
                        r->pairs[r->wtail[pr->to]].wnext = id;
                    r->wtail[pr->to] = id;
                }
                break;
            }
            r->free_slots[pr->to]--;
        }
        r->state[g] |= S_POSTED;
        pr->rposted++;
        advance_window(r, pr->to, now);
    }
    while (pr->started < pr->sposted && pr->started < pr->rposted) {
        uint32_t sg = pr->send[pr->started], rg = pr->recv[pr->started];
        pr->started++;
        double bytes = (double)step_of(r, sg)->count * 4.0;
        double at = transfer(r, pr->from, pr->to, now, bytes);
        heap_push(&r->q, at, sg, EV_DONE);
        heap_push(&r->q, at, rg, EV_ARRIVE);
    }
}

/* A step is issued: a copy runs, a send or receive joins its pair's order. */
static void post(run_t *r, uint32_t gid, double now)
{
    const sched_step_t *st = step_of(r, gid);
    int rk = (int)r->rank_of[gid];
    r->state[gid] |= S_WANT;
    if (sched_step_local(st->kind)) {
        r->state[gid] |= S_POSTED;
        advance_window(r, rk, now);
        heap_push(&r->q, compute(r, rk, now, (double)st->count * 4.0), gid, EV_DONE);
    } else {
        pair_progress(r, &r->pairs[r->pair[gid]], now);
    }
}

static void step_done(run_t *r, uint32_t gid, double now)
{
    const sched_step_t *st = step_of(r, gid);
    int rk = (int)r->rank_of[gid];
    if (st->kind == STEP_RECV_REDUCE) {
        r->free_slots[rk]++;
        int32_t w = r->whead[rk];
        if (w >= 0) {
            r->whead[rk] = r->pairs[w].wnext;
            r->pairs[w].waiting = false;
            pair_progress(r, &r->pairs[w], now);
        }
    }
    r->state[gid] |= S_DONE;
    if (now > r->end) r->end = now;
    for (uint32_t k = r->dnt_off[gid]; k < r->dnt_off[gid + 1]; k++) {
        uint32_t d = r->dnt[k];
        if (--r->remaining[d] == 0) deps_done(r, d, now);
    }
}

static void run_free(run_t *r)
{
    if (r->s)
        for (int i = 0; i < r->p; i++)
            sched_free(&r->s[i]);
    free(r->s);
    free(r->off);
    free(r->rank_of);
    free(r->remaining);
    free(r->state);
    free(r->dnt_off);
    free(r->dnt);
    free(r->pair);
    for (size_t i = 0; i < r->npairs; i++) {
        free(r->pairs[i].send);
        free(r->pairs[i].recv);
    }
    free(r->pairs);
    free(r->cursor);
    free(r->free_slots);
    free(r->whead);
    free(r->wtail);
    free(r->loc_tx);
    free(r->q.h);
}

/* Builds every rank's schedule with slices of `slice` bytes; false (with *over) when the steps
 * would pass the budget. */
static loomResult_t build_all(run_t *r, sim_coll_t coll, int algo, uint64_t count, int root,
                              uint64_t slice, uint64_t budget, bool *over)
{
    int p = r->p, nn = (p + r->g - 1) / r->g;
    int *node_of_r = malloc((size_t)p * sizeof(int)),
        *start = malloc((size_t)(nn + 1) * sizeof(int));
    int *ranks = malloc((size_t)p * sizeof(int));
    if (node_of_r == NULL || start == NULL || ranks == NULL) {
        free(node_of_r);
        free(start);
        free(ranks);
        return base_error(loomSystemError, LOG_COLL, "loom-sim: out of memory (layout of %d ranks)",
                          p);
    }
    for (int i = 0; i < p; i++)
        node_of_r[i] = i / r->g, ranks[i] = i;
    for (int n = 0; n <= nn; n++)
        start[n] = LOOM_MIN(n * r->g, p);
    plan_ctx_t ctx = {
        .nranks = p,
        .topo = {.nnodes = nn, .node_of = node_of_r, .node_start = start, .node_ranks = ranks},
        .nchannels = r->m->nchannels,
        .slice_bytes = slice};
    plan_call_t call = {.desc = {.kind = coll == SIM_REDUCE      ? OPK_REDUCE
                                         : coll == SIM_BROADCAST ? OPK_BROADCAST
                                                                 : OPK_ALLREDUCE,
                                 .dtype = loomFloat32,
                                 .op = 0,
                                 .root = coll == SIM_ALLREDUCE ? -1 : root,
                                 .count = count,
                                 .seq = 1},
                        .algo = algo,
                        .inplace = false};
    loomResult_t rc = loomSuccess;
    uint64_t total = 0;
    *over = false;
    for (int i = 0; i < p && rc == loomSuccess; i++) {
        ctx.rank = i;
        sched_init(&r->s[i], i, p);
        rc = plan_build(&ctx, &call, &r->s[i]);
        sched_drop_tracking(&r->s[i]);
        total += r->s[i].nsteps;
        if (total > budget) {
            *over = true;
            for (int k = 0; k <= i; k++)
                sched_free(&r->s[k]);
            break;
        }
    }
    if (rc != loomSuccess)
        for (int k = 0; k < p; k++)
            sched_free(&r->s[k]);
    r->total = total;
    free(node_of_r);
    free(start);
    free(ranks);
    return rc;
}

loomResult_t sim_allreduce(const sim_machine_t *m, int algo, uint64_t bytes, sim_result_t *out)
{
    return sim_collective(m, SIM_ALLREDUCE, algo, bytes, -1, out);
}

loomResult_t sim_collective(const sim_machine_t *m, sim_coll_t coll, int algo, uint64_t bytes,
                            int root, sim_result_t *out)
{
    memset(out, 0, sizeof(*out));
    if (m->ranks < 1 || registry_get(algo) == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "loom-sim: %d ranks, algorithm %d",
                          m->ranks, algo);
    const char *what = coll == SIM_REDUCE ? "reduce" : "broadcast";
    if (coll != SIM_ALLREDUCE &&
        registry_rooted_forced(algo, coll == SIM_REDUCE ? ROOTED_REDUCE : ROOTED_BROADCAST) < 0)
        return base_error(loomInvalidArgument, LOG_COLL, "loom-sim: %s has no %s form",
                          registry_get(algo)->name, what);
    if (coll != SIM_ALLREDUCE && (root < 0 || root >= m->ranks))
        return base_error(loomInvalidArgument, LOG_COLL,
                          "loom-sim: %s root %d is not one of the %d ranks", what, root, m->ranks);
    run_t r = {.m = m, .p = m->ranks, .g = m->per_node > 0 ? m->per_node : m->ranks};
    if (r.g > r.p) r.g = r.p;
    uint64_t count = bytes / 4, budget = m->max_steps ? m->max_steps : 6000000;
    r.s = calloc((size_t)r.p, sizeof(sched_t));
    if (r.s == NULL) return base_error(loomSystemError, LOG_COLL, "loom-sim: out of memory");
    uint64_t slice = m->slice_bytes;
    for (;;) {
        bool over = false;
        loomResult_t rc = build_all(&r, coll, algo, count, root, slice, budget, &over);
        if (rc != loomSuccess) {
            run_free(&r);
            return rc;
        }
        if (!over) break;
        if (slice >= bytes) {
            run_free(&r);
            return base_error(loomInvalidUsage, LOG_COLL,
                              "loom-sim: %s on %d ranks needs more than %llu steps even with "
                              "one slice per chunk",
                              registry_get(algo)->name, r.p, (unsigned long long)budget);
        }
        slice *= 4;
    }
    out->slice_bytes = slice;
    out->steps = r.total;
    if (r.total >= UINT32_MAX) {
        run_free(&r);
        return base_error(loomInvalidUsage, LOG_COLL, "loom-sim: too many steps");
    }
    uint32_t T = (uint32_t)r.total;
    r.off = malloc((size_t)(r.p + 1) * sizeof(uint32_t));
    r.rank_of = malloc((size_t)T * sizeof(uint32_t) + 1);
    r.remaining = malloc((size_t)T * sizeof(uint32_t) + 1);
    r.state = calloc((size_t)T + 1, 1);
    r.dnt_off = calloc((size_t)T + 2, sizeof(uint32_t));
    r.pair = malloc((size_t)T * sizeof(int32_t) + 1);
    r.cursor = calloc((size_t)r.p, sizeof(uint32_t));
    r.free_slots = malloc((size_t)r.p * sizeof(int));
    r.whead = malloc((size_t)r.p * sizeof(int32_t));
    r.wtail = malloc((size_t)r.p * sizeof(int32_t));
    int nn = (r.p + r.g - 1) / r.g, cores = m->cores > 0 ? m->cores : 1;
    size_t nres = 5 * (size_t)r.p + 2 * (size_t)nn + (size_t)nn * (size_t)cores;
    r.loc_tx = calloc(nres, sizeof(double));
    pmap_t pm = {0};
    if (!r.off || !r.rank_of || !r.remaining || !r.state || !r.dnt_off || !r.pair || !r.cursor ||
        !r.loc_tx || !r.free_slots || !r.whead || !r.wtail)
        goto oom;
    for (int i = 0; i < r.p; i++) {
        r.free_slots[i] = LOOM_MAX(m->slices_in_flight, 1) * LOOM_MAX(m->nchannels, 1);
        r.whead[i] = r.wtail[i] = -1;
    }
    r.loc_rx = r.loc_tx + r.p;
    r.nic_tx = r.loc_rx + r.p;
    r.nic_rx = r.nic_tx + r.p;
    r.engine = r.nic_rx + r.p;
    r.up = r.engine + r.p;
    r.down = r.up + nn;
    r.core = r.down + nn;
    r.off[0] = 0;
    for (int i = 0; i < r.p; i++)
        r.off[i + 1] = r.off[i] + (uint32_t)r.s[i].nsteps;
    /* dependents, pairs */
    for (int i = 0; i < r.p; i++) {
        const sched_t *s = &r.s[i];
        for (size_t k = 0; k < s->nsteps; k++) {
            uint32_t gid = r.off[i] + (uint32_t)k;
            r.rank_of[gid] = (uint32_t)i;
            r.remaining[gid] = s->steps[k].ndeps;
            for (uint32_t d = 0; d < s->steps[k].ndeps; d++)
                r.dnt_off[r.off[i] + s->deps[s->steps[k].dep_first + d] + 1]++;
            const sched_step_t *st = &s->steps[k];
            r.pair[gid] = -1;
            if (sched_step_local(st->kind)) continue;
            bool snd = st->kind == STEP_SEND;
            int32_t pid = snd ? pair_id(&r, &pm, i, st->peer) : pair_id(&r, &pm, st->peer, i);
            if (pid < 0) goto oom;
            r.pair[gid] = pid;
            if (snd)
                r.pairs[pid].nsend++;
            else
                r.pairs[pid].nrecv++;
        }
    }
    for (uint32_t g = 0; g < T; g++)
        r.dnt_off[g + 1] += r.dnt_off[g];
    r.dnt = malloc((size_t)r.dnt_off[T] * sizeof(uint32_t) + 1);
    uint32_t *fill = calloc((size_t)T + 1, sizeof(uint32_t));
    if (r.dnt == NULL || fill == NULL) {
        free(fill);
        goto oom;
    }
    for (size_t i = 0; i < r.npairs; i++) {
        pair_t *pr = &r.pairs[i];
        if (pr->nsend != pr->nrecv) {
            free(fill);
            run_free(&r);
            free(pm.key);
            free(pm.val);
            return base_error(loomInternalError, LOG_COLL,
                              "loom-sim: rank %d sends %u messages to rank %d, which receives %u",
                              pr->from, pr->nsend, pr->to, pr->nrecv);
        }
        pr->send = malloc((size_t)pr->nsend * sizeof(uint32_t) + 1);
        pr->recv = malloc((size_t)pr->nrecv * sizeof(uint32_t) + 1);
        if (pr->send == NULL || pr->recv == NULL) {
            free(fill);
            goto oom;
        }
        pr->nsend = pr->nrecv = 0;
    }
    for (int i = 0; i < r.p; i++) {
        const sched_t *s = &r.s[i];
        for (size_t k = 0; k < s->nsteps; k++) {
            uint32_t gid = r.off[i] + (uint32_t)k;
            for (uint32_t d = 0; d < s->steps[k].ndeps; d++) {
                uint32_t dg = r.off[i] + s->deps[s->steps[k].dep_first + d];
                r.dnt[r.dnt_off[dg] + fill[dg]++] = gid;
            }
            if (r.pair[gid] < 0) continue;
            pair_t *pr = &r.pairs[r.pair[gid]];
            if (s->steps[k].kind == STEP_SEND)
                pr->send[pr->nsend++] = gid;
            else
                pr->recv[pr->nrecv++] = gid;
        }
    }
    free(fill);
    free(pm.key);
    free(pm.val);
    pm.key = NULL;
    pm.val = NULL;
    for (uint32_t g = 0; g < T; g++)
        if (r.remaining[g] == 0) deps_done(&r, g, 0);
    uint64_t done = 0;
    while (r.q.n > 0 && !r.q.oom) {
        ev_t e = heap_pop(&r.q);
        const sched_step_t *st = step_of(&r, e.gid);
        int rk = (int)r.rank_of[e.gid];
        switch (e.type) {
        case EV_POST: post(&r, e.gid, e.t); break;
        case EV_ARRIVE:
            if (st->kind == STEP_RECV_REDUCE)
                heap_push(&r.q, compute(&r, rk, e.t, (double)st->count * 4.0), e.gid, EV_DONE);
            else
                step_done(&r, e.gid, e.t), done++;
            break;
        default: step_done(&r, e.gid, e.t), done++; break;
        }
    }
    if (r.q.oom) goto oom;
    if (done != T) {
        run_free(&r);
        return base_error(loomInternalError, LOG_COLL,
                          "loom-sim: %s on %d ranks stopped with %llu of %u steps done (a "
                          "deadlock in the schedules)",
                          registry_get(algo)->name, m->ranks, (unsigned long long)done, T);
    }
    out->time = r.end;
    run_free(&r);
    return loomSuccess;
oom:
    free(pm.key);
    free(pm.val);
    run_free(&r);
    return base_error(loomSystemError, LOG_COLL, "loom-sim: out of memory (%llu steps)",
                      (unsigned long long)r.total);
}
