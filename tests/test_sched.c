/*
 * Symbolic proof of the schedule generators (src/algo), as the planner (src/core/plan.c) calls
 * them, and of the dependencies that src/sched derives for them.
 *
 * For one configuration (generator, ranks, count, channels, slice, in place, avg, root) every
 * rank's schedule is built by the planner that src/core/coll.c calls (plan_build), then all
 * ranks run together in this process on symbolic data: an element holds which ranks' inputs it
 * contains and which input index they came from, not numbers. The run respects what the
 * executor (src/core/exec.c) guarantees and nothing more: a step starts once its dependencies
 * are done, sends to one peer start in schedule order, receives from one peer start in schedule
 * order, and the k-th send from a to b meets the k-th receive of b from a. Several policies pick
 * among the steps that could run, so that a dependency the builder forgot shows up as a race or
 * a wrong result under some order even when schedule order happens to hide it.
 *
 * What a pass proves for a configuration: no deadlock, no message of the wrong size, no send
 * without its receive, every two steps that touch one element (one writing) ordered by the
 * dependencies (an element-wise proof over every order, plus race marks while steps are in
 * flight under the concurrent policies), STEP_F_AVG on exactly the reduction that completes each
 * output element, and the exact expected content of every output element (every rank exactly
 * once and the right index, or the right rank's element at the right place).
 *
 * Knobs: SCHED_TIMES=1 prints each grid test's time; SCHED_EXTRA_SEEDS=n adds n random orders
 * per grid case for a deeper search by hand; SCHED_ONLY=rd,tree runs the grid of those
 * generators alone.
 */
#include <check.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algo.h"
#include "exec.h" /* EXEC_LOOKAHEAD: the window the simulated executor scans, as exec.c does */
#include "harness.h"
#include "plan.h"
#include "registry.h"
#include "schedule.h"

/* Mirrors of src/core/exec.c's limits, for the policy that imitates the executor. */
#define EXEC_MAX_INFLIGHT 512

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "test_sched: out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}

/* ---- Configurations ---------------------------------------------------------------------- */

typedef enum {
    ALG_ALLREDUCE,
    ALG_REDUCE_SCATTER,
    ALG_ALLGATHER,
    ALG_BROADCAST,
    ALG_REDUCE,
    ALG_ALLTOALL,
    ALG_HIER, /* allreduces over nodes: the layout is cfg_t.node_size */
    ALG_HIER_LEADER,
    ALG_PS,
    ALG_RD, /* recursive doubling allreduce */
    ALG_RAB,
    ALG_TREE,
    ALG_HIER_TREE, /* hier with other algorithms across nodes */
    ALG_HIER_RAB,
    ALG_HIER_RD,
    ALG_TREE_REDUCE, /* the double binary tree's reduce and broadcast (any root) */
    ALG_TREE_BCAST,
    ALG_DETERM, /* LOOM_DETERMINISTIC=1: allreduce, reduce-scatter and reduce (determ.c) */
    ALG_DETERM_RS,
    ALG_DETERM_REDUCE,
    ALG_ONESHOT, /* every input to every rank, folded in rank order there (oneshot.c) */
    ALG_COUNT
} alg_t;

static const char *const alg_names[ALG_COUNT] = {"allreduce",
                                                 "reduce_scatter",
                                                 "allgather",
                                                 "broadcast",
                                                 "reduce",
                                                 "alltoall",
                                                 "hier",
                                                 "hier_leader",
                                                 "ps",
                                                 "rd",
                                                 "rabenseifner",
                                                 "tree",
                                                 "hier:tree",
                                                 "hier:rabenseifner",
                                                 "hier:rd",
                                                 "tree_reduce",
                                                 "tree_broadcast",
                                                 "determ",
                                                 "determ_reduce_scatter",
                                                 "determ_reduce",
                                                 "oneshot"};

/* The operation a generator implements: the rooted trees are a reduce and a broadcast, determ's
 * variants a reduce-scatter and a reduce. */
static alg_t alg_op(alg_t a)
{
    switch (a) {
    case ALG_TREE_REDUCE:
    case ALG_DETERM_REDUCE: return ALG_REDUCE;
    case ALG_TREE_BCAST: return ALG_BROADCAST;
    case ALG_DETERM_RS: return ALG_REDUCE_SCATTER;
    default: return a;
    }
}
/* The allreduce generators past the plain operations (hier .. hier:rd, determ, oneshot). */
static bool alg_more_allreduce(alg_t a)
{
    return (a >= ALG_HIER && a <= ALG_HIER_RD) || a == ALG_DETERM || a == ALG_ONESHOT;
}
static bool alg_reduces(alg_t a)
{
    a = alg_op(a);
    return a == ALG_ALLREDUCE || a == ALG_REDUCE_SCATTER || a == ALG_REDUCE ||
           alg_more_allreduce(a);
}
/* The result of every allreduce, whichever the algorithm. */
static bool alg_is_allreduce(alg_t a)
{
    return a == ALG_ALLREDUCE || alg_more_allreduce(a);
}
static bool alg_rooted(alg_t a)
{
    a = alg_op(a);
    return a == ALG_BROADCAST || a == ALG_REDUCE;
}
/* Generators that read prm->nchannels; for the others channel counts would repeat cases. */
static bool alg_channels(alg_t a)
{
    return a == ALG_ALLREDUCE || a == ALG_REDUCE_SCATTER || a == ALG_ALLGATHER || a == ALG_HIER ||
           a == ALG_HIER_LEADER || (a >= ALG_HIER_TREE && a <= ALG_HIER_RD);
}
/* hier and its variants: the node-local ring joins a node's ranks in its own order first, which
 * interval values cannot follow (exact count vectors prove them) */
static bool alg_node_ring(alg_t a)
{
    return a == ALG_HIER || (a >= ALG_HIER_TREE && a <= ALG_HIER_RD);
}

typedef struct {
    alg_t alg;
    int p;
    uint64_t count; /* the API's count: per rank for allgather/reduce-scatter/alltoall */
    int nch;
    uint64_t slice;
    bool inplace, avg;
    int root;
    /* Nodes for the hierarchical generators: consecutive blocks of node_size ranks (0: 3), the
     * last one smaller; negative: blocks cycling through |node_size|, |node_size|-3 and
     * |node_size|-1 ranks (uneven nodes). */
    int node_size;
} cfg_t;

typedef struct {
    int node_of[4096], node_start[4097], node_ranks[4096];
    sched_topo_t t;
} topo_store_t;

static const sched_topo_t *make_topo(const cfg_t *c, topo_store_t *ts)
{
    int ns = c->node_size ? c->node_size : 3, n = 0, r = 0;
    while (r < c->p) {
        int size = ns > 0 ? ns : (n % 3 == 0 ? -ns : n % 3 == 1 ? -ns - 3 : -ns - 1);
        if (size < 1) size = 1;
        ts->node_start[n] = r;
        for (int k = 0; k < size && r < c->p; k++, r++) {
            ts->node_of[r] = n;
            ts->node_ranks[r] = r;
        }
        n++;
    }
    ts->node_start[n] = c->p;
    ts->t = (sched_topo_t){.nnodes = n,
                           .node_of = ts->node_of,
                           .node_start = ts->node_start,
                           .node_ranks = ts->node_ranks};
    return &ts->t;
}

static void cfg_str(const cfg_t *c, char *b, size_t n)
{
    snprintf(b, n, "%s p=%d count=%llu nch=%d slice=%llu %s%s root=%d", alg_names[c->alg], c->p,
             (unsigned long long)c->count, c->nch, (unsigned long long)c->slice,
             c->inplace ? "in-place" : "out-of-place", c->avg ? " avg" : "", c->root);
}

/* Each test generator as a call to the planner: the operation, and for the allreduces the
 * registry's row. */
static const struct {
    uint8_t kind;
    int algo;
} alg_plan[ALG_COUNT] = {
    [ALG_ALLREDUCE] = {OPK_ALLREDUCE, ALGO_RING},
    [ALG_REDUCE_SCATTER] = {OPK_REDUCESCATTER, -1},
    [ALG_ALLGATHER] = {OPK_ALLGATHER, -1},
    [ALG_BROADCAST] = {OPK_BROADCAST, -1},
    [ALG_REDUCE] = {OPK_REDUCE, -1},
    [ALG_ALLTOALL] = {OPK_ALLTOALL, -1},
    [ALG_HIER] = {OPK_ALLREDUCE, ALGO_HIER},
    [ALG_HIER_LEADER] = {OPK_ALLREDUCE, ALGO_HIER_LEADER},
    [ALG_PS] = {OPK_ALLREDUCE, ALGO_PS},
    [ALG_RD] = {OPK_ALLREDUCE, ALGO_RD},
    [ALG_RAB] = {OPK_ALLREDUCE, ALGO_RAB},
    [ALG_TREE] = {OPK_ALLREDUCE, ALGO_TREE},
    [ALG_HIER_TREE] = {OPK_ALLREDUCE, ALGO_HIER_TREE},
    [ALG_HIER_RAB] = {OPK_ALLREDUCE, ALGO_HIER_RAB},
    [ALG_HIER_RD] = {OPK_ALLREDUCE, ALGO_HIER_RD},
    [ALG_TREE_REDUCE] = {OPK_REDUCE, ALGO_TREE},
    [ALG_TREE_BCAST] = {OPK_BROADCAST, ALGO_TREE},
    [ALG_DETERM] = {OPK_ALLREDUCE, ALGO_DETERM},
    [ALG_DETERM_RS] = {OPK_REDUCESCATTER, ALGO_DETERM},
    [ALG_DETERM_REDUCE] = {OPK_REDUCE, ALGO_DETERM},
    [ALG_ONESHOT] = {OPK_ALLREDUCE, ALGO_ONESHOT},
};

/* Builds every rank's schedule with the planner a communicator uses (src/core/plan.c), so the
 * aliasing and in-place flags proved here are the real ones; false with a message when a
 * builder reports an error. */
static bool build_scheds(const cfg_t *c, sched_t *s, char *err, size_t errlen)
{
    static topo_store_t ts;
    const sched_topo_t *topo = make_topo(c, &ts);
    for (int r = 0; r < c->p; r++) {
        sched_init(&s[r], r, c->p);
        /* one-byte elements: the slice in bytes is the slice in elements */
        plan_ctx_t ctx = {
            .rank = r, .nranks = c->p, .topo = *topo, .nchannels = c->nch, .slice_bytes = c->slice};
        plan_call_t call = {.desc = {.kind = alg_plan[c->alg].kind,
                                     .dtype = loomInt8,
                                     .root = alg_rooted(c->alg) ? c->root : -1,
                                     .count = c->count,
                                     .seq = 1},
                            .algo = alg_plan[c->alg].algo,
                            .inplace = c->inplace,
                            .avg = c->avg};
        if (plan_build(&ctx, &call, &s[r]) != loomSuccess) {
            snprintf(err, errlen, "rank %d: plan_build failed (out of memory)", r);
            for (int q = 0; q <= r; q++)
                sched_free(&s[q]);
            return false;
        }
        /* The range tables only serve the builder; at 1024 ranks they would hold more memory
         * than the schedules themselves. */
        sched_drop_tracking(&s[r]);
    }
    return true;
}

static void free_scheds(sched_t *s, int p)
{
    for (int r = 0; r < p; r++)
        sched_free(&s[r]);
}

/* ---- Symbolic values -------------------------------------------------------------------- */

/*
 * Every element is a header plus the set of ranks whose input it contains:
 *
 * VAL_VEC: one 16-bit count per rank (how many times rank k's input is in the element). Exact
 *   for any algorithm; 2p bytes per element, fine for the grid (p <= 16).
 *
 * VAL_IVL: a cyclic interval of ranks [start, start+len) mod p. Two values reduce only when
 *   their intervals are adjacent (one ends where the other starts) and their lengths add up to
 *   at most p; then the union is again an interval without overlap, so the representation stays
 *   exact. Anything else (an overlap, a duplicate, or a gap that would make a non-interval set)
 *   marks the value bad, and a bad value never passes the output check. Ring algorithms only
 *   ever combine a partial sum of consecutive ranks with the next neighbour's, so for them the
 *   representation is exact; for other algorithms it can only err towards failing, never pass a
 *   wrong result. 4 bytes per element: 1024 ranks x 3073 elements x 2 buffers fit in ~75 MB
 *   where count vectors would need 12 GB.
 */
typedef enum { VAL_VEC, VAL_IVL } vmode_t;

#define VAL_UNDEF (-1) /* never written: whatever the buffer held before */
#define VAL_MIXED (-2) /* elements of different input indices were reduced together */

typedef struct {
    int32_t idx;  /* input index the contributions come from (or VAL_UNDEF / VAL_MIXED) */
    uint16_t avg; /* times STEP_F_AVG divided this value (or values reduced into it) */
    uint16_t bad; /* VEC: a rank counted twice; IVL: overlap or non-interval union */
} val_hdr_t;

typedef struct {
    vmode_t mode;
    int p;
    size_t size; /* bytes per element: header + payload, a multiple of 4 */
} vfmt_t;

static vfmt_t vfmt_make(vmode_t mode, int p)
{
    size_t pay = mode == VAL_VEC ? 2 * (size_t)p : 4;
    vfmt_t f = {mode, p, (sizeof(val_hdr_t) + pay + 3) & ~(size_t)3};
    return f;
}

static inline val_hdr_t *vh(uint8_t *v)
{
    return (val_hdr_t *)(void *)v;
}
static inline const val_hdr_t *cvh(const uint8_t *v)
{
    return (const val_hdr_t *)(const void *)v;
}
static inline uint16_t *vpay(uint8_t *v)
{
    return (uint16_t *)(void *)(v + sizeof(val_hdr_t));
}
static inline const uint16_t *cvpay(const uint8_t *v)
{
    return (const uint16_t *)(const void *)(v + sizeof(val_hdr_t));
}

static void val_undef(const vfmt_t *f, uint8_t *v)
{
    memset(v, 0, f->size);
    vh(v)->idx = VAL_UNDEF;
}

static void val_unit(const vfmt_t *f, uint8_t *v, int rank, uint64_t idx)
{
    memset(v, 0, f->size);
    vh(v)->idx = (int32_t)idx;
    if (f->mode == VAL_VEC) {
        vpay(v)[rank] = 1;
    } else {
        vpay(v)[0] = (uint16_t)rank;
        vpay(v)[1] = 1;
    }
}

/* out = a op b (out may be a or b). */
static void val_combine(const vfmt_t *f, uint8_t *out, const uint8_t *a, const uint8_t *b)
{
    const val_hdr_t *ha = cvh(a), *hb = cvh(b);
    val_hdr_t h;
    if (ha->idx == VAL_UNDEF || hb->idx == VAL_UNDEF)
        h.idx = VAL_UNDEF;
    else if (ha->idx != hb->idx)
        h.idx = VAL_MIXED;
    else
        h.idx = ha->idx;
    unsigned avg = (unsigned)ha->avg + hb->avg;
    h.avg = (uint16_t)(avg > 0xffff ? 0xffff : avg);
    h.bad = (uint16_t)(ha->bad | hb->bad);
    const uint16_t *pa = cvpay(a), *pb = cvpay(b);
    uint16_t *po = vpay(out);
    if (f->mode == VAL_VEC) {
        for (int k = 0; k < f->p; k++) {
            unsigned c = (unsigned)pa[k] + pb[k];
            if (c > 1) h.bad = 1;
            po[k] = (uint16_t)(c > 0xffff ? 0xffff : c);
        }
    } else {
        unsigned p = (unsigned)f->p, sa = pa[0], la = pa[1], sb = pb[0], lb = pb[1];
        unsigned start = sa, len = la + lb;
        if (la == 0) {
            start = sb;
        } else if (lb == 0) {
            start = sa;
        } else if (len > p) {
            h.bad = 1; /* more contributions than ranks: some rank twice */
        } else if ((sa + la) % p == sb) {
            start = sa;
        } else if ((sb + lb) % p == sa) {
            start = sb;
        } else {
            h.bad = 1; /* overlapping, or a gap: not representable, reported as wrong */
        }
        if (len > p) len = p;
        po[0] = (uint16_t)start;
        po[1] = (uint16_t)len;
    }
    *vh(out) = h;
}

/* Every rank exactly once. */
static bool val_full(const vfmt_t *f, const uint8_t *v)
{
    if (cvh(v)->bad || cvh(v)->idx < 0) return false;
    const uint16_t *pv = cvpay(v);
    if (f->mode == VAL_IVL) return pv[1] == f->p;
    for (int k = 0; k < f->p; k++)
        if (pv[k] != 1) return false;
    return true;
}

/* Exactly rank `rank`'s input, once. */
static bool val_is_unit(const vfmt_t *f, const uint8_t *v, int rank)
{
    if (cvh(v)->bad || cvh(v)->idx < 0) return false;
    const uint16_t *pv = cvpay(v);
    if (f->mode == VAL_IVL) return pv[0] == rank && pv[1] == 1;
    for (int k = 0; k < f->p; k++)
        if (pv[k] != (k == rank)) return false;
    return true;
}

static void val_str(const vfmt_t *f, const uint8_t *v, char *b, size_t n)
{
    const val_hdr_t *h = cvh(v);
    int w;
    if (h->idx == VAL_UNDEF)
        w = snprintf(b, n, "{undefined");
    else if (h->idx == VAL_MIXED)
        w = snprintf(b, n, "{mixed indices");
    else
        w = snprintf(b, n, "{index %d", h->idx);
    if (w < 0 || (size_t)w >= n) return;
    size_t u = (size_t)w;
    const uint16_t *pv = cvpay(v);
    if (f->mode == VAL_IVL) {
        w = snprintf(b + u, n - u, ", ranks [%u, +%u) mod %d", pv[0], pv[1], f->p);
    } else {
        w = snprintf(b + u, n - u, ", counts per rank [");
        for (int k = 0; k < f->p && w >= 0 && u + (size_t)w < n; k++) {
            u += (size_t)w;
            if (k == 24) {
                w = snprintf(b + u, n - u, " ...");
                break;
            }
            w = snprintf(b + u, n - u, k ? " %u" : "%u", pv[k]);
        }
        if (w < 0 || u + (size_t)w >= n) return;
        u += (size_t)w;
        w = snprintf(b + u, n - u, "]");
    }
    if (w < 0 || u + (size_t)w >= n) return;
    u += (size_t)w;
    snprintf(b + u, n - u, ", avg x%u%s}", h->avg, h->bad ? ", DUPLICATE/OVERLAP" : "");
}

/* ---- The simulator ----------------------------------------------------------------------- */

typedef enum { POL_ORDER, POL_RANDOM, POL_LATEST, POL_EXEC } policy_kind_t;

typedef struct {
    policy_kind_t kind;
    uint64_t seed;
    /* A send completes only once its receive is posted: the TCP transport reads a socket only
     * while a receive is posted on it, so with full socket buffers a sender waits for this. */
    bool rendezvous;
    int slots; /* POL_EXEC: staging slots for receive-reduce (slices_in_flight x channels) */
} policy_t;

static void policy_str(const policy_t *p, char *b, size_t n)
{
    static const char *const names[] = {"schedule-order", "random", "latest-first", "executor"};
    snprintf(b, n, "%s%s seed %llu", names[p->kind], p->rendezvous ? " rendezvous" : " eager",
             (unsigned long long)p->seed);
}

enum { ST_PENDING = 0, ST_ISSUED = 1, ST_DONE = 2 };

typedef struct {
    uint64_t count;
    uint8_t *data;
} msg_t;

/* All messages from one rank to another. */
typedef struct {
    int from, to;
    uint32_t nsend, nrecv; /* steps in the two schedules */
    uint32_t send_issued, recv_issued, consumed;
    uint32_t *send_steps, *recv_steps; /* event policies: step indices by ordinal */
    msg_t *msgs;                       /* [nsend], by ordinal */
} pair_t;

typedef struct {
    const sched_t *s;
    uint8_t *mem[3];      /* storage of SEND, RECV, TMP; NULL for the alias source */
    uint64_t vsize[3];    /* elements each buffer has, as the caller sees it */
    uint32_t *readers[3]; /* event policies: steps in flight reading each element */
    uint32_t *writer[3];  /* event policies: step in flight writing each element, + 1 */
    uint8_t *state;
    uint32_t *ord;           /* posting ordinal among this rank's steps of the same pair */
    int32_t *pair;           /* pair of a send or receive step */
    uint32_t *remaining;     /* event policies: dependencies not yet done */
    uint32_t *dnt_off, *dnt; /* event policies: steps that depend on each step (CSR) */
    size_t cursor;           /* POL_ORDER: next step; POL_EXEC: first unissued */
    size_t ndone;
    uint32_t *inflight; /* POL_EXEC */
    uint32_t ninflight;
    int nfree;
} rank_t;

typedef struct {
    uint64_t key, ev;
} hent_t;

typedef struct {
    const cfg_t *cfg;
    policy_t pol;
    vfmt_t f;
    int p;
    sched_t *s;
    rank_t *rk;
    int32_t *pair_of; /* [from * p + to] */
    pair_t *pairs;
    size_t npairs;
    bool events, marks;
    hent_t *pool; /* ready events: an array (random) or a max-heap (latest-first) */
    size_t npool, poolcap;
    uint64_t rng;
    uint8_t *scratch;
    size_t scratchcap;
    size_t total, done;
    bool failed;
    char err[768];
} sim_t;

static void sim_fail(sim_t *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sim_fail(sim_t *m, const char *fmt, ...)
{
    if (m->failed) return;
    m->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof(m->err), fmt, ap);
    va_end(ap);
}

static uint64_t sim_rand(sim_t *m)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

static const char *buf_name(uint32_t b)
{
    static const char *const n[] = {"SEND", "RECV", "TMP"};
    return b < 3 ? n[b] : "BUF?";
}

static void step_str(const sched_step_t *st, size_t i, char *b, size_t n)
{
    unsigned long long so = st->src_off, se = st->src_off + st->count;
    unsigned long long doff = st->dst_off, de = st->dst_off + st->count;
    const char *avg = (st->flags & STEP_F_AVG) ? ", avg" : "";
    switch (st->kind) {
    case STEP_SEND:
        snprintf(b, n, "step %zu (send %s[%llu..%llu) to rank %d)", i, buf_name(st->src_buf), so,
                 se, st->peer);
        break;
    case STEP_RECV:
        snprintf(b, n, "step %zu (recv %s[%llu..%llu) from rank %d%s)", i, buf_name(st->dst_buf),
                 doff, de, st->peer, avg);
        break;
    case STEP_RECV_REDUCE:
        snprintf(b, n,
                 "step %zu (recv_reduce from rank %d: %s[%llu..%llu) = %s[%llu..%llu) + msg%s)", i,
                 st->peer, buf_name(st->dst_buf), doff, de, buf_name(st->src_buf), so, se, avg);
        break;
    case STEP_COPY:
        snprintf(b, n, "step %zu (copy %s[%llu..%llu) -> %s[%llu..%llu)%s)", i,
                 buf_name(st->src_buf), so, se, buf_name(st->dst_buf), doff, de, avg);
        break;
    case STEP_REDUCE:
        snprintf(b, n, "step %zu (reduce %s[%llu..%llu) += %s[%llu..%llu)%s)", i,
                 buf_name(st->dst_buf), doff, de, buf_name(st->src_buf), so, se, avg);
        break;
    default: snprintf(b, n, "step %zu (unknown kind %d)", i, st->kind); break;
    }
}

static bool reads_src(const sched_step_t *st)
{
    return st->kind != STEP_RECV;
}
static bool writes_dst(const sched_step_t *st)
{
    return st->kind != STEP_SEND;
}
static bool is_comm(const sched_step_t *st)
{
    return !sched_step_local(st->kind);
}

/* The storage behind (buf, off): in place, one caller buffer is a window of the other. */
static void resolve(const sched_t *s, uint32_t *buf, uint64_t *off)
{
    if (s->alias_from != s->alias_to && *buf == s->alias_from) {
        *buf = s->alias_to;
        *off = (uint64_t)((int64_t)*off + s->alias_delta);
    }
}

static uint8_t *elem(sim_t *m, int r, uint32_t buf, uint64_t off)
{
    resolve(m->rk[r].s, &buf, &off);
    return m->rk[r].mem[buf] + off * m->f.size;
}

static uint8_t *scratch(sim_t *m, uint64_t count)
{
    size_t need = (size_t)count * m->f.size;
    if (need > m->scratchcap) {
        free(m->scratch);
        m->scratch = xcalloc(need, 1);
        m->scratchcap = need;
    }
    return m->scratch;
}

/* The caller-visible sizes of one rank's buffers for this operation. */
static void buffer_sizes(const cfg_t *c, int r, uint64_t *v)
{
    uint64_t n = c->count, pn = n * (uint64_t)c->p;
    if (alg_is_allreduce(c->alg)) {
        v[0] = n;
        v[1] = n;
        return;
    }
    switch (alg_op(c->alg)) {
    case ALG_ALLREDUCE:
        v[0] = n;
        v[1] = n;
        break;
    /* recvbuff is ignored off the root: out of place it may be NULL there */
    case ALG_REDUCE:
        v[0] = n;
        v[1] = (r == c->root || c->inplace) ? n : 0;
        break;
    /* sendbuff is only read at the root */
    case ALG_BROADCAST:
        v[0] = r == c->root ? n : 0;
        v[1] = n;
        break;
    case ALG_ALLGATHER:
        v[0] = n;
        v[1] = pn;
        break;
    case ALG_REDUCE_SCATTER:
        v[0] = pn;
        v[1] = n;
        break;
    case ALG_ALLTOALL:
        v[0] = pn;
        v[1] = pn;
        break;
    default: v[0] = v[1] = 0; break;
    }
}

/* Checks what needs no execution: well-formed steps, peers, buffers and bounds, the flags,
 * dependencies that point backwards. */
static void static_check(sim_t *m, int r)
{
    const sched_t *s = &m->s[r];
    rank_t *k = &m->rk[r];
    char d[200];
    if (s->alias_from != s->alias_to) {
        if (s->alias_from > 2 || s->alias_to > 2) {
            sim_fail(m, "rank %d: alias between unknown buffers %u -> %u", r, s->alias_from,
                     s->alias_to);
            return;
        }
        int64_t lo = s->alias_delta, hi = lo + (int64_t)k->vsize[s->alias_from];
        if (lo < 0 || hi > (int64_t)k->vsize[s->alias_to])
            sim_fail(m, "rank %d: alias window %s -> %s[%lld..%lld) outside its %llu elements", r,
                     buf_name(s->alias_from), buf_name(s->alias_to), (long long)lo, (long long)hi,
                     (unsigned long long)k->vsize[s->alias_to]);
    }
    /* The reason is formatted only for a failing step: this runs over millions of steps. */
    char why[200];
#define WHY(...) (why[0] ? (void)0 : (void)snprintf(why, sizeof(why), __VA_ARGS__))
    for (size_t i = 0; i < s->nsteps && !m->failed; i++) {
        const sched_step_t *st = &s->steps[i];
        why[0] = '\0';
        if (st->kind > STEP_REDUCE) {
            WHY("unknown step kind");
        } else {
            if (st->count == 0) WHY("empty step");
            if (st->desc >= s->ndescs) WHY("descriptor %u of %zu", st->desc, s->ndescs);
            if (st->flags & ~STEP_F_AVG) WHY("unknown flags 0x%x", st->flags);
            if ((st->flags & STEP_F_AVG) && !m->cfg->avg)
                WHY("STEP_F_AVG although the operation is not an average");
            if ((st->flags & STEP_F_AVG) && st->kind != STEP_RECV_REDUCE && st->kind != STEP_REDUCE)
                WHY("STEP_F_AVG on a step that does not reduce");
            if (is_comm(st) && (st->peer < 0 || st->peer >= m->p || st->peer == r))
                WHY("bad peer (%d ranks)", m->p);
            if (reads_src(st) &&
                (st->src_buf > 2 || st->src_off + st->count > k->vsize[st->src_buf]))
                WHY("reads beyond %s's %llu elements", buf_name(st->src_buf),
                    (unsigned long long)(st->src_buf > 2 ? 0 : k->vsize[st->src_buf]));
            if (writes_dst(st) &&
                (st->dst_buf > 2 || st->dst_off + st->count > k->vsize[st->dst_buf]))
                WHY("writes beyond %s's %llu elements", buf_name(st->dst_buf),
                    (unsigned long long)(st->dst_buf > 2 ? 0 : k->vsize[st->dst_buf]));
            /* The input belongs to the caller (and is const in the API). */
            if (writes_dst(st) && st->dst_buf == SCHED_BUF_SEND) WHY("writes the input buffer");
            if ((size_t)st->dep_first + st->ndeps > s->ndeps)
                WHY("dependencies [%u, +%u) beyond the %zu recorded", st->dep_first, st->ndeps,
                    s->ndeps);
            else
                for (uint32_t j = 0; j < st->ndeps; j++)
                    if (s->deps[st->dep_first + j] >= i)
                        WHY("depends on step %u, not an earlier one", s->deps[st->dep_first + j]);
        }
        if (why[0]) {
            step_str(st, i, d, sizeof(d));
            sim_fail(m, "rank %d %s: %s", r, d, why);
        }
    }
#undef WHY
}

static pair_t *pair_get(sim_t *m, int from, int to)
{
    int32_t *slot = &m->pair_of[(size_t)from * (size_t)m->p + (size_t)to];
    if (*slot < 0) {
        *slot = (int32_t)m->npairs;
        pair_t *q = &m->pairs[m->npairs++];
        memset(q, 0, sizeof(*q));
        q->from = from;
        q->to = to;
    }
    return &m->pairs[*slot];
}

static void sim_free(sim_t *m)
{
    for (int r = 0; m->rk && r < m->p; r++) {
        rank_t *k = &m->rk[r];
        for (int b = 0; b < 3; b++) {
            free(k->mem[b]);
            free(k->readers[b]);
            free(k->writer[b]);
        }
        free(k->state);
        free(k->ord);
        free(k->pair);
        free(k->remaining);
        free(k->dnt_off);
        free(k->dnt);
        free(k->inflight);
    }
    for (size_t i = 0; i < m->npairs; i++) {
        pair_t *q = &m->pairs[i];
        for (uint32_t j = 0; j < q->send_issued; j++)
            free(q->msgs[j].data);
        free(q->msgs);
        free(q->send_steps);
        free(q->recv_steps);
    }
    free(m->rk);
    free(m->pair_of);
    free(m->pairs);
    free(m->pool);
    free(m->scratch);
}

/* Static checks, storage (inputs: element j of rank r's input is the unit of rank r with index
 * j, everything else undefined), message pairs and the bookkeeping the policy needs. */
static void sim_setup(sim_t *m)
{
    const cfg_t *c = m->cfg;
    int p = m->p;
    m->rk = xcalloc((size_t)p, sizeof(rank_t));
    m->pair_of = xcalloc((size_t)p * (size_t)p, sizeof(int32_t));
    memset(m->pair_of, 0xff, (size_t)p * (size_t)p * sizeof(int32_t));
    size_t maxpairs = 0;
    for (int r = 0; r < p; r++) {
        rank_t *k = &m->rk[r];
        const sched_t *s = &m->s[r];
        k->s = s;
        buffer_sizes(c, r, k->vsize);
        k->vsize[2] = s->tmp_elems;
        m->total += s->nsteps;
        maxpairs += s->nsteps;
    }
    for (int r = 0; r < p && !m->failed; r++)
        static_check(m, r);
    if (m->failed) return;
    /* Pairs: at most one per send/receive step, usually two per rank. */
    m->pairs = xcalloc(maxpairs < (size_t)p * (size_t)p ? maxpairs : (size_t)p * (size_t)p,
                       sizeof(pair_t));
    for (int r = 0; r < p; r++) {
        rank_t *k = &m->rk[r];
        const sched_t *s = k->s;
        for (int b = 0; b < 3; b++) {
            if (s->alias_from != s->alias_to && (uint32_t)b == s->alias_from) continue;
            k->mem[b] = xcalloc(k->vsize[b], m->f.size);
            for (uint64_t e = 0; e < k->vsize[b]; e++)
                val_undef(&m->f, k->mem[b] + e * m->f.size);
            if (m->marks) {
                k->readers[b] = xcalloc(k->vsize[b], sizeof(uint32_t));
                k->writer[b] = xcalloc(k->vsize[b], sizeof(uint32_t));
            }
        }
        for (uint64_t e = 0; e < k->vsize[SCHED_BUF_SEND]; e++)
            val_unit(&m->f, elem(m, r, SCHED_BUF_SEND, e), r, e);
        k->state = xcalloc(s->nsteps, 1);
        k->ord = xcalloc(s->nsteps, sizeof(uint32_t));
        k->pair = xcalloc(s->nsteps, sizeof(int32_t));
        for (size_t i = 0; i < s->nsteps; i++) {
            const sched_step_t *st = &s->steps[i];
            k->pair[i] = -1;
            if (!is_comm(st)) continue;
            pair_t *q = st->kind == STEP_SEND ? pair_get(m, r, st->peer) : pair_get(m, st->peer, r);
            k->pair[i] = (int32_t)(q - m->pairs);
            k->ord[i] = st->kind == STEP_SEND ? q->nsend++ : q->nrecv++;
        }
    }
    for (size_t j = 0; j < m->npairs; j++) {
        pair_t *q = &m->pairs[j];
        q->msgs = xcalloc(q->nsend, sizeof(msg_t));
        if (m->events) {
            q->send_steps = xcalloc(q->nsend, sizeof(uint32_t));
            q->recv_steps = xcalloc(q->nrecv, sizeof(uint32_t));
        }
    }
    for (int r = 0; r < p; r++) {
        rank_t *k = &m->rk[r];
        const sched_t *s = k->s;
        if (m->pol.kind == POL_EXEC) {
            k->inflight = xcalloc(EXEC_MAX_INFLIGHT, sizeof(uint32_t));
            k->nfree = m->pol.slots;
        }
        if (!m->events) continue;
        for (size_t i = 0; i < s->nsteps; i++) {
            const sched_step_t *st = &s->steps[i];
            if (!is_comm(st)) continue;
            pair_t *q = &m->pairs[k->pair[i]];
            (st->kind == STEP_SEND ? q->send_steps : q->recv_steps)[k->ord[i]] = (uint32_t)i;
        }
        /* Reverse dependencies, so that finishing a step wakes exactly its dependents. */
        k->remaining = xcalloc(s->nsteps, sizeof(uint32_t));
        k->dnt_off = xcalloc(s->nsteps + 1, sizeof(uint32_t));
        size_t nd = 0; /* not s->ndeps: a hand-made step may share another's list */
        for (size_t i = 0; i < s->nsteps; i++)
            nd += s->steps[i].ndeps;
        k->dnt = xcalloc(nd, sizeof(uint32_t));
        for (size_t i = 0; i < s->nsteps; i++) {
            const sched_step_t *st = &s->steps[i];
            k->remaining[i] = st->ndeps;
            for (uint32_t j = 0; j < st->ndeps; j++)
                k->dnt_off[s->deps[st->dep_first + j] + 1]++;
        }
        for (size_t i = 0; i < s->nsteps; i++)
            k->dnt_off[i + 1] += k->dnt_off[i];
        uint32_t *fill = xcalloc(s->nsteps + 1, sizeof(uint32_t));
        memcpy(fill, k->dnt_off, (s->nsteps + 1) * sizeof(uint32_t));
        for (size_t i = 0; i < s->nsteps; i++) {
            const sched_step_t *st = &s->steps[i];
            for (uint32_t j = 0; j < st->ndeps; j++)
                k->dnt[fill[s->deps[st->dep_first + j]]++] = (uint32_t)i;
        }
        free(fill);
    }
}

static bool deps_done(const sim_t *m, int r, size_t i)
{
    const sched_t *s = m->rk[r].s;
    const sched_step_t *st = &s->steps[i];
    for (uint32_t j = 0; j < st->ndeps; j++)
        if (m->rk[r].state[s->deps[st->dep_first + j]] != ST_DONE) return false;
    return true;
}

/* Whether step i is the next of its (peer, direction) to be posted. */
static bool is_head(const sim_t *m, int r, size_t i)
{
    const sched_step_t *st = &m->rk[r].s->steps[i];
    if (!is_comm(st)) return true;
    const pair_t *q = &m->pairs[m->rk[r].pair[i]];
    return m->rk[r].ord[i] == (st->kind == STEP_SEND ? q->send_issued : q->recv_issued);
}

/* -- ready events (random and latest-first policies) -- */

static void push_event(sim_t *m, int r, uint32_t i, bool complete)
{
    if (!m->events) return;
    if (m->npool == m->poolcap) {
        m->poolcap = m->poolcap ? 2 * m->poolcap : 1024;
        hent_t *n = realloc(m->pool, m->poolcap * sizeof(hent_t));
        if (n == NULL) abort();
        m->pool = n;
    }
    hent_t e = {((uint64_t)i << 21) | ((uint64_t)complete << 20) | (uint64_t)r,
                ((uint64_t)r << 34) | ((uint64_t)i << 1) | complete};
    size_t j = m->npool++;
    if (m->pol.kind == POL_LATEST) {
        while (j > 0 && m->pool[(j - 1) / 2].key < e.key) {
            m->pool[j] = m->pool[(j - 1) / 2];
            j = (j - 1) / 2;
        }
    }
    m->pool[j] = e;
}

static uint64_t pop_event(sim_t *m)
{
    if (m->pol.kind == POL_RANDOM) {
        size_t j = (size_t)(sim_rand(m) % m->npool);
        uint64_t ev = m->pool[j].ev;
        m->pool[j] = m->pool[--m->npool];
        return ev;
    }
    uint64_t ev = m->pool[0].ev;
    hent_t last = m->pool[--m->npool];
    size_t j = 0, n = m->npool;
    for (;;) {
        size_t c = 2 * j + 1;
        if (c >= n) break;
        if (c + 1 < n && m->pool[c + 1].key > m->pool[c].key) c++;
        if (m->pool[c].key <= last.key) break;
        m->pool[j] = m->pool[c];
        j = c;
    }
    if (n > 0) m->pool[j] = last;
    return ev;
}

static void maybe_ready(sim_t *m, int r, uint32_t i)
{
    rank_t *k = &m->rk[r];
    if (k->state[i] == ST_PENDING && k->remaining[i] == 0 && is_head(m, r, i))
        push_event(m, r, i, false);
}

/* -- races: what steps in flight hold -- */

static void race_check(sim_t *m, int r, size_t i, uint32_t buf, uint64_t off, uint64_t n,
                       bool write)
{
    if (!m->marks) return;
    resolve(m->rk[r].s, &buf, &off);
    const uint32_t *rd = m->rk[r].readers[buf], *wr = m->rk[r].writer[buf];
    for (uint64_t e = off; e < off + n; e++) {
        if (wr[e] == 0 && (!write || rd[e] == 0)) continue;
        char a[200], b[200];
        step_str(&m->rk[r].s->steps[i], i, a, sizeof(a));
        if (wr[e])
            step_str(&m->rk[r].s->steps[wr[e] - 1], wr[e] - 1, b, sizeof(b));
        else
            snprintf(b, sizeof(b), "%u step(s) in flight reading it", rd[e]);
        sim_fail(m, "race at rank %d: %s %s %s[%llu] while %s %s (a missing dependency)", r, a,
                 write ? "writes" : "reads", buf_name(buf), (unsigned long long)e,
                 wr[e] ? "it is written by" : "there are", b);
        return;
    }
}

static void mark(sim_t *m, int r, size_t i, uint32_t buf, uint64_t off, uint64_t n, bool write,
                 bool set)
{
    if (!m->marks) return;
    resolve(m->rk[r].s, &buf, &off);
    for (uint64_t e = off; e < off + n; e++) {
        if (write)
            m->rk[r].writer[buf][e] = set ? (uint32_t)i + 1 : 0;
        else
            m->rk[r].readers[buf][e] += set ? 1u : (uint32_t)-1;
    }
}

/* -- executing steps -- */

static void finish(sim_t *m, int r, size_t i)
{
    rank_t *k = &m->rk[r];
    k->state[i] = ST_DONE;
    k->ndone++;
    m->done++;
    if (!m->events) return;
    for (uint32_t j = k->dnt_off[i]; j < k->dnt_off[i + 1]; j++) {
        uint32_t d = k->dnt[j];
        if (--k->remaining[d] == 0) maybe_ready(m, r, d);
    }
}

/* dst has its final value for this step: apply STEP_F_AVG. */
static void apply_avg(sim_t *m, int r, size_t i)
{
    const sched_step_t *st = &m->rk[r].s->steps[i];
    if (!(st->flags & STEP_F_AVG)) return;
    for (uint64_t e = 0; e < st->count; e++) {
        uint8_t *v = elem(m, r, st->dst_buf, st->dst_off + e);
        if (!val_full(&m->f, v)) {
            char a[200], b[200];
            step_str(st, i, a, sizeof(a));
            val_str(&m->f, v, b, sizeof(b));
            sim_fail(m, "rank %d %s: STEP_F_AVG divides a partial result: %s[%llu] = %s", r, a,
                     buf_name(st->dst_buf), (unsigned long long)(st->dst_off + e), b);
            return;
        }
        vh(v)->avg++;
    }
}

static void do_issue(sim_t *m, int r, size_t i)
{
    rank_t *k = &m->rk[r];
    const sched_step_t *st = &k->s->steps[i];
    size_t E = m->f.size;
    k->state[i] = ST_ISSUED;
    if (reads_src(st)) race_check(m, r, i, st->src_buf, st->src_off, st->count, false);
    if (writes_dst(st)) race_check(m, r, i, st->dst_buf, st->dst_off, st->count, true);
    if (m->failed) return;
    if (st->kind == STEP_COPY) {
        /* Through scratch: source and destination may overlap. */
        uint8_t *t = scratch(m, st->count);
        memcpy(t, elem(m, r, st->src_buf, st->src_off), st->count * E);
        memcpy(elem(m, r, st->dst_buf, st->dst_off), t, st->count * E);
        apply_avg(m, r, i);
        finish(m, r, i);
        return;
    }
    if (st->kind == STEP_REDUCE) {
        /* dst = dst op src, element by element (source and destination may not overlap: the
         * race marks see to it) */
        uint8_t *t = scratch(m, st->count);
        uint8_t *dst = elem(m, r, st->dst_buf, st->dst_off);
        const uint8_t *src = elem(m, r, st->src_buf, st->src_off);
        for (uint64_t e = 0; e < st->count; e++)
            val_combine(&m->f, t + e * E, dst + e * E, src + e * E);
        memcpy(dst, t, st->count * E);
        apply_avg(m, r, i);
        finish(m, r, i);
        return;
    }
    if (reads_src(st)) mark(m, r, i, st->src_buf, st->src_off, st->count, false, true);
    if (writes_dst(st)) mark(m, r, i, st->dst_buf, st->dst_off, st->count, true, true);
    pair_t *q = &m->pairs[k->pair[i]];
    uint32_t o = k->ord[i];
    if (st->kind == STEP_SEND) {
        /* The data is captured now; a writer of the source must wait for the send anyway (the
         * race marks check that), so capturing now or later is the same. */
        msg_t *g = &q->msgs[o];
        g->count = st->count;
        g->data = xcalloc(st->count, E);
        memcpy(g->data, elem(m, r, st->src_buf, st->src_off), st->count * E);
        q->send_issued++;
        if (m->events) {
            if (q->recv_issued > o) push_event(m, q->to, q->recv_steps[o], true);
            if (!m->pol.rendezvous || q->recv_issued > o) push_event(m, r, (uint32_t)i, true);
            if (q->send_issued < q->nsend) maybe_ready(m, r, q->send_steps[q->send_issued]);
        }
    } else {
        q->recv_issued++;
        if (m->events) {
            if (q->send_issued > o) {
                push_event(m, r, (uint32_t)i, true);
                if (m->pol.rendezvous) push_event(m, q->from, q->send_steps[o], true);
            }
            if (q->recv_issued < q->nrecv) maybe_ready(m, r, q->recv_steps[q->recv_issued]);
        }
    }
}

static bool completable(const sim_t *m, int r, size_t i)
{
    const sched_step_t *st = &m->rk[r].s->steps[i];
    const pair_t *q = &m->pairs[m->rk[r].pair[i]];
    uint32_t o = m->rk[r].ord[i];
    if (st->kind == STEP_SEND) return !m->pol.rendezvous || q->recv_issued > o;
    return q->send_issued > o;
}

static void do_complete(sim_t *m, int r, size_t i)
{
    rank_t *k = &m->rk[r];
    const sched_step_t *st = &k->s->steps[i];
    size_t E = m->f.size;
    if (reads_src(st)) mark(m, r, i, st->src_buf, st->src_off, st->count, false, false);
    if (writes_dst(st)) mark(m, r, i, st->dst_buf, st->dst_off, st->count, true, false);
    if (st->kind != STEP_SEND) {
        pair_t *q = &m->pairs[k->pair[i]];
        msg_t *g = &q->msgs[k->ord[i]];
        if (g->count != st->count) {
            char a[200];
            step_str(st, i, a, sizeof(a));
            sim_fail(m,
                     "mismatched message sizes: rank %d %s meets message %u of rank %d, which "
                     "has %llu elements",
                     r, a, k->ord[i], q->from, (unsigned long long)g->count);
            return;
        }
        uint8_t *dst = elem(m, r, st->dst_buf, st->dst_off);
        if (st->kind == STEP_RECV) {
            memcpy(dst, g->data, st->count * E);
        } else {
            uint8_t *t = scratch(m, st->count);
            const uint8_t *src = elem(m, r, st->src_buf, st->src_off);
            for (uint64_t e = 0; e < st->count; e++)
                val_combine(&m->f, t + e * E, src + e * E, g->data + e * E);
            memcpy(dst, t, st->count * E);
        }
        free(g->data);
        g->data = NULL;
        q->consumed++;
        apply_avg(m, r, i);
    }
    finish(m, r, i);
}

/* -- failure reports -- */

static void report_stuck(sim_t *m)
{
    for (int r = 0; r < m->p; r++) {
        rank_t *k = &m->rk[r];
        const sched_t *s = k->s;
        if (k->ndone == s->nsteps) continue;
        size_t i = 0;
        while (k->state[i] == ST_DONE)
            i++;
        const sched_step_t *st = &s->steps[i];
        char a[200], why[200] = "";
        step_str(st, i, a, sizeof(a));
        const pair_t *q = is_comm(st) ? &m->pairs[k->pair[i]] : NULL;
        if (k->state[i] == ST_ISSUED && st->kind == STEP_SEND) {
            snprintf(why, sizeof(why),
                     "rank %d has posted only %u of its %u receives from rank "
                     "%d",
                     q->to, q->recv_issued, q->nrecv, r);
        } else if (k->state[i] == ST_ISSUED) {
            snprintf(why, sizeof(why),
                     "waits for message %u from rank %d, which has sent %u of "
                     "%u",
                     k->ord[i], q->from, q->send_issued, q->nsend);
        } else if (!deps_done(m, r, i)) {
            for (uint32_t j = 0; j < st->ndeps; j++) {
                uint32_t dp = s->deps[st->dep_first + j];
                if (k->state[dp] != ST_DONE) {
                    snprintf(why, sizeof(why), "waits for its dependency, step %u", dp);
                    break;
                }
            }
        } else if (q && !is_head(m, r, i)) {
            snprintf(why, sizeof(why), "waits for an earlier step to the same peer");
        } else {
            snprintf(why, sizeof(why), "ready but never run (executor window or limits)");
        }
        sim_fail(m, "deadlock: rank %d stuck at %s: %s (%zu of %zu steps done on all ranks)", r, a,
                 why, m->done, m->total);
        return;
    }
}

/* -- policies -- */

/* Each rank strictly in schedule order, eager sends; the ranks take turns. */
static void run_order(sim_t *m)
{
    bool progress = true;
    while (m->done < m->total && progress && !m->failed) {
        progress = false;
        for (int r = 0; r < m->p && !m->failed; r++) {
            rank_t *k = &m->rk[r];
            const sched_t *s = k->s;
            while (k->cursor < s->nsteps && !m->failed) {
                size_t i = k->cursor;
                const sched_step_t *st = &s->steps[i];
                if (st->kind != STEP_SEND && !sched_step_local(st->kind) &&
                    m->pairs[k->pair[i]].send_issued <= k->ord[i])
                    break;
                if (!deps_done(m, r, i)) break; /* cannot happen: dependencies point back */
                do_issue(m, r, i);
                if (!m->failed && k->state[i] != ST_DONE) do_complete(m, r, i);
                k->cursor++;
                progress = true;
            }
        }
    }
}

/* Random or latest-first choice among every event that could happen next anywhere. */
static void run_events(sim_t *m)
{
    for (int r = 0; r < m->p; r++)
        for (size_t i = 0; i < m->rk[r].s->nsteps; i++)
            maybe_ready(m, r, (uint32_t)i);
    while (m->npool > 0 && !m->failed) {
        uint64_t ev = pop_event(m);
        int r = (int)(ev >> 34);
        size_t i = (size_t)((ev >> 1) & 0x1ffffffffull);
        if (ev & 1)
            do_complete(m, r, i);
        else
            do_issue(m, r, i);
    }
}

/* The executor's own loop (src/core/exec.c: issue then complete): a window of EXEC_LOOKAHEAD
 * steps past the first unissued one, at most EXEC_MAX_INFLIGHT in flight, receive-reduces
 * limited by staging slots; ranks progress in a random order and completions are random. */
static bool exec_rank(sim_t *m, int r, bool force)
{
    rank_t *k = &m->rk[r];
    const sched_t *s = k->s;
    bool progress = false;
    size_t end = k->cursor + EXEC_LOOKAHEAD < s->nsteps ? k->cursor + EXEC_LOOKAHEAD : s->nsteps;
    for (size_t i = k->cursor; i < end && !m->failed; i++) {
        if (k->state[i] != ST_PENDING) continue;
        const sched_step_t *st = &s->steps[i];
        if (!is_head(m, r, i) || !deps_done(m, r, i)) continue;
        if (is_comm(st)) {
            if (k->ninflight >= EXEC_MAX_INFLIGHT) continue;
            if (st->kind == STEP_RECV_REDUCE && k->nfree == 0) continue;
            if (st->kind == STEP_RECV_REDUCE) k->nfree--;
            k->inflight[k->ninflight++] = (uint32_t)i;
        }
        do_issue(m, r, i);
        progress = true;
    }
    while (k->cursor < s->nsteps && k->state[k->cursor] != ST_PENDING)
        k->cursor++;
    for (uint32_t j = 0; j < k->ninflight && !m->failed;) {
        size_t i = k->inflight[j];
        if (!completable(m, r, i) || (!force && (sim_rand(m) & 1))) {
            j++;
            continue;
        }
        if (s->steps[i].kind == STEP_RECV_REDUCE) k->nfree++;
        do_complete(m, r, i);
        k->inflight[j] = k->inflight[--k->ninflight];
        progress = true;
    }
    return progress;
}

static void run_exec(sim_t *m)
{
    while (m->done < m->total && !m->failed) {
        bool progress = false;
        int first = (int)(sim_rand(m) % (uint64_t)m->p);
        for (int j = 0; j < m->p && !m->failed; j++)
            progress |= exec_rank(m, (first + j) % m->p, false);
        if (progress) continue;
        for (int r = 0; r < m->p && !m->failed; r++)
            progress |= exec_rank(m, r, true);
        if (!progress) break;
    }
}

/* -- ordering proof -- */

/*
 * Two steps that touch one element, one of them writing, must be ordered by the transitive
 * closure of the dependencies: the executor may run any other two steps at the same time (the
 * per-peer posting order orders only the starts). This is checked element by element on the
 * storage behind the buffers (after the in-place alias), so it does not rely on the builder's
 * assumption that regions touched twice start at the same offset. The random orders look for
 * the same races by running steps concurrently; this proves their absence for every order.
 */
typedef struct {
    const sched_t *s;
    uint32_t *seen, stamp;
    uint32_t *stack;
    uint32_t memo_a, memo_b;
    bool memo_res, memo_valid;
} hb_t;

/* Whether step a (< b) is done before step b can start. */
static bool happens_before(hb_t *h, uint32_t a, uint32_t b)
{
    if (h->memo_valid && h->memo_a == a && h->memo_b == b) return h->memo_res;
    const sched_t *s = h->s;
    bool found = false;
    size_t n = 0;
    h->stamp++;
    h->stack[n++] = b;
    h->seen[b] = h->stamp;
    while (n > 0 && !found) {
        const sched_step_t *st = &s->steps[h->stack[--n]];
        for (uint32_t j = 0; j < st->ndeps; j++) {
            uint32_t d = s->deps[st->dep_first + j];
            if (d == a) {
                found = true;
                break;
            }
            /* Dependencies point backwards: nothing before a can lead to a. */
            if (d > a && h->seen[d] != h->stamp) {
                h->seen[d] = h->stamp;
                h->stack[n++] = d;
            }
        }
    }
    h->memo_a = a;
    h->memo_b = b;
    h->memo_res = found;
    h->memo_valid = true;
    return found;
}

static void prove_ordered(sim_t *m, int r)
{
    rank_t *k = &m->rk[r];
    const sched_t *s = k->s;
    hb_t h = {.s = s};
    h.seen = xcalloc(s->nsteps, sizeof(uint32_t));
    h.stack = xcalloc(s->nsteps, sizeof(uint32_t));
    int32_t *lastw[3], *rhead[3];
    for (int b = 0; b < 3; b++) {
        lastw[b] = xcalloc(k->vsize[b], sizeof(int32_t));
        rhead[b] = xcalloc(k->vsize[b], sizeof(int32_t));
        memset(lastw[b], 0xff, k->vsize[b] * sizeof(int32_t));
        memset(rhead[b], 0xff, k->vsize[b] * sizeof(int32_t));
    }
    uint32_t *pool = NULL; /* reader lists: (step, next) */
    size_t npool = 0, cap = 0;
    for (size_t i = 0; i < s->nsteps && !m->failed; i++) {
        const sched_step_t *st = &s->steps[i];
        uint32_t me = (uint32_t)i;
        int32_t other = -1;
        uint32_t cb = 0;
        uint64_t ce = 0;
        if (reads_src(st)) {
            uint32_t b = st->src_buf;
            uint64_t off = st->src_off;
            resolve(s, &b, &off);
            if (npool + 2 * st->count > cap) {
                while (npool + 2 * st->count > cap)
                    cap = cap ? 2 * cap : 4096;
                uint32_t *q = realloc(pool, cap * sizeof(uint32_t));
                if (q == NULL) abort();
                pool = q;
            }
            for (uint64_t e = off; e < off + st->count && other < 0; e++) {
                int32_t w = lastw[b][e];
                if (w >= 0 && !happens_before(&h, (uint32_t)w, me)) {
                    other = w;
                    cb = b;
                    ce = e;
                }
                pool[npool] = me;
                pool[npool + 1] = (uint32_t)rhead[b][e];
                rhead[b][e] = (int32_t)npool;
                npool += 2;
            }
        }
        if (writes_dst(st) && other < 0) {
            uint32_t b = st->dst_buf;
            uint64_t off = st->dst_off;
            resolve(s, &b, &off);
            for (uint64_t e = off; e < off + st->count && other < 0; e++) {
                int32_t w = lastw[b][e];
                if (w >= 0 && w != (int32_t)me && !happens_before(&h, (uint32_t)w, me)) {
                    other = w;
                    cb = b;
                    ce = e;
                }
                for (int32_t x = rhead[b][e]; x >= 0 && other < 0; x = (int32_t)pool[x + 1])
                    if (pool[x] != me && !happens_before(&h, pool[x], me)) {
                        other = (int32_t)pool[x];
                        cb = b;
                        ce = e;
                    }
                lastw[b][e] = (int32_t)me;
                rhead[b][e] = -1;
            }
        }
        if (other >= 0) {
            char a[200], o[200];
            step_str(st, i, a, sizeof(a));
            step_str(&s->steps[other], (size_t)other, o, sizeof(o));
            sim_fail(m,
                     "race at rank %d: %s and %s both touch %s[%llu], one writing, and neither "
                     "depends on the other (a missing dependency)",
                     r, o, a, buf_name(cb), (unsigned long long)ce);
        }
    }
    free(pool);
    for (int b = 0; b < 3; b++) {
        free(lastw[b]);
        free(rhead[b]);
    }
    free(h.seen);
    free(h.stack);
}

/* -- the expected outcome -- */

static void final_check(sim_t *m)
{
    const cfg_t *c = m->cfg;
    uint64_t n = c->count;
    unsigned want_avg = alg_reduces(c->alg) && c->avg && c->p > 1 ? 1 : 0;
    for (size_t j = 0; j < m->npairs && !m->failed; j++) {
        const pair_t *q = &m->pairs[j];
        if (q->send_issued != q->consumed)
            sim_fail(m, "unmatched sends: rank %d sent %u messages to rank %d, which received %u",
                     q->from, q->send_issued, q->to, q->consumed);
    }
    for (int r = 0; r < m->p && !m->failed; r++) {
        uint64_t len;
        switch (alg_op(c->alg)) {
        case ALG_REDUCE: len = r == c->root ? n : 0; break;
        case ALG_ALLGATHER:
        case ALG_ALLTOALL: len = n * (uint64_t)c->p; break;
        default: len = n; break;
        }
        for (uint64_t e = 0; e < len; e++) {
            const uint8_t *v = elem(m, r, SCHED_BUF_RECV, e);
            int32_t want_idx;
            int want_rank = -1; /* -1: every rank once */
            switch (alg_op(c->alg)) {
            case ALG_REDUCE_SCATTER: want_idx = (int32_t)((uint64_t)r * n + e); break;
            case ALG_ALLGATHER:
                want_rank = (int)(e / n);
                want_idx = (int32_t)(e % n);
                break;
            case ALG_BROADCAST:
                want_rank = c->root;
                want_idx = (int32_t)e;
                break;
            case ALG_ALLTOALL:
                want_rank = (int)(e / n);
                want_idx = (int32_t)((uint64_t)r * n + e % n);
                break;
            default: want_idx = (int32_t)e; break;
            }
            bool ok = cvh(v)->idx == want_idx && cvh(v)->avg == (want_rank < 0 ? want_avg : 0) &&
                      (want_rank < 0 ? val_full(&m->f, v) : val_is_unit(&m->f, v, want_rank));
            if (ok) continue;
            char b[400], w[120];
            val_str(&m->f, v, b, sizeof(b));
            if (want_rank < 0)
                snprintf(w, sizeof(w), "every rank exactly once, index %d, avg x%u", want_idx,
                         want_avg);
            else
                snprintf(w, sizeof(w), "rank %d's input element %d", want_rank, want_idx);
            sim_fail(m, "wrong result: rank %d RECV[%llu] = %s, expected %s", r,
                     (unsigned long long)e, b, w);
            break;
        }
    }
}

/* Runs built schedules under one policy; false with the reason in err. */
static bool verify(const cfg_t *c, sched_t *s, const policy_t *pol, vmode_t mode, char *err,
                   size_t errlen)
{
    sim_t *m = xcalloc(1, sizeof(sim_t));
    m->cfg = c;
    m->pol = *pol;
    m->p = c->p;
    m->s = s;
    m->f = vfmt_make(mode, c->p);
    m->events = pol->kind == POL_RANDOM || pol->kind == POL_LATEST;
    m->marks = pol->kind != POL_ORDER;
    m->rng = pol->seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
    sim_setup(m);
    /* The ordering proof does not depend on the policy: once per configuration suffices. */
    if (pol->kind == POL_ORDER)
        for (int r = 0; r < m->p && !m->failed; r++)
            prove_ordered(m, r);
    if (!m->failed) {
        switch (pol->kind) {
        case POL_ORDER: run_order(m); break;
        case POL_EXEC: run_exec(m); break;
        default: run_events(m); break;
        }
    }
    if (!m->failed && m->done < m->total) report_stuck(m);
    if (!m->failed) final_check(m);
    bool ok = !m->failed;
    if (!ok) snprintf(err, errlen, "%s", m->err);
    sim_free(m);
    free(m);
    return ok;
}

/* ---- The grid ---------------------------------------------------------------------------- */

static const int grid_ps[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16};
#define NGRID_P ((int)(sizeof(grid_ps) / sizeof(grid_ps[0])))

typedef struct {
    int cases, runs, failed;
    char first[1024];
} tally_t;

/* Builds one configuration and runs it under a set of policies; failures are printed (the first
 * few) and counted, so that one run shows every broken case. */
static void run_case(const cfg_t *c, tally_t *t)
{
    char err[768], cs[160];
    sched_t *s = xcalloc((size_t)c->p, sizeof(sched_t));
    t->cases++;
    if (!build_scheds(c, s, err, sizeof(err))) {
        cfg_str(c, cs, sizeof(cs));
        if (t->failed++ == 0) snprintf(t->first, sizeof(t->first), "%s: %s", cs, err);
        free(s);
        return;
    }
    size_t steps = 0;
    for (int r = 0; r < c->p; r++)
        steps += s[r].nsteps;
    int slots = c->nch; /* slices_in_flight = 1, the tightest the executor can be given */
    /* Most telling first: the big cases (thousands of one-element slices, where the runtime
     * goes) run only a prefix. */
    policy_t pols[] = {
        {POL_ORDER, 0, false, 0},   {POL_RANDOM, 1, false, 0}, {POL_LATEST, 0, true, 0},
        {POL_EXEC, 3, true, slots}, {POL_RANDOM, 2, true, 0},  {POL_RANDOM, 4, true, 0},
        {POL_LATEST, 0, false, 0},
    };
    int npol = (int)(sizeof(pols) / sizeof(pols[0]));
    if (steps > 40000) npol = 4;
    if (steps > 150000) npol = 2;
    for (int j = 0; j < npol; j++) {
        t->runs++;
        if (verify(c, s, &pols[j], VAL_VEC, err, sizeof(err))) continue;
        char ps[80];
        cfg_str(c, cs, sizeof(cs));
        policy_str(&pols[j], ps, sizeof(ps));
        if (t->failed < 12) fprintf(stderr, "FAIL %s [%s]: %s\n", cs, ps, err);
        if (t->failed++ == 0) snprintf(t->first, sizeof(t->first), "%s [%s]: %s", cs, ps, err);
        break;
    }
    /* SCHED_EXTRA_SEEDS=n: n more random orders per case, for a deeper search by hand. */
    const char *extra = getenv("SCHED_EXTRA_SEEDS");
    for (long j = 0; extra && j < atol(extra) && t->failed == 0; j++) {
        policy_t pol = {POL_RANDOM, 100 + (uint64_t)j, (j & 1) != 0, 0};
        if (j % 3 == 2) pol = (policy_t){POL_EXEC, 100 + (uint64_t)j, true, slots};
        t->runs++;
        if (verify(c, s, &pol, VAL_VEC, err, sizeof(err))) continue;
        char ps[80];
        cfg_str(c, cs, sizeof(cs));
        policy_str(&pol, ps, sizeof(ps));
        if (t->failed < 12) fprintf(stderr, "FAIL %s [%s]: %s\n", cs, ps, err);
        if (t->failed++ == 0) snprintf(t->first, sizeof(t->first), "%s [%s]: %s", cs, ps, err);
    }
    /* The compact representation must agree with the exact one (it backs the scale tests). */
    policy_t order = {POL_ORDER, 0, false, 0};
    if (steps <= 40000) {
        t->runs++;
        if (!verify(c, s, &order, VAL_IVL, err, sizeof(err))) {
            cfg_str(c, cs, sizeof(cs));
            if (t->failed < 12) fprintf(stderr, "FAIL %s [interval values]: %s\n", cs, err);
            if (t->failed++ == 0)
                snprintf(t->first, sizeof(t->first), "%s [interval values]: %s", cs, err);
        }
    }
    free_scheds(s, c->p);
    free(s);
}

/* SCHED_ONLY=name,name: the grid of those generators alone (by hand, while working on one). */
static bool grid_selected(alg_t alg)
{
    const char *only = getenv("SCHED_ONLY");
    if (only == NULL || *only == '\0') return true;
    size_t n = strlen(alg_names[alg]);
    for (const char *p = only; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, alg_names[alg], n) == 0 && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

START_TEST(test_grid)
{
    alg_t alg = (alg_t)(_i / NGRID_P);
    int p = grid_ps[_i % NGRID_P];
    if (!grid_selected(alg)) return;
    uint64_t counts[] = {0, 1, (uint64_t)p - 1, (uint64_t)p, (uint64_t)p + 1, 37, 1000};
    /* roots: 0 and p - 1; the trees' (whose shape moves with the root) every one up to 9
     * ranks, beyond that the ends and two inside */
    int roots[16] = {0, p - 1}, nroots = alg_rooted(alg) && p > 1 ? 2 : 1;
    if (alg == ALG_TREE_REDUCE || alg == ALG_TREE_BCAST) {
        nroots = 0;
        if (p <= 9)
            for (int q = 0; q < p; q++)
                roots[nroots++] = q;
        else
            roots[0] = 0, roots[1] = p - 1, roots[2] = 1, roots[3] = p / 2, nroots = 4;
    }
    static const uint64_t slices[] = {1, 3, 64};
    tally_t t = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
        bool seen = false;
        for (size_t cj = 0; cj < ci; cj++)
            seen |= counts[cj] == counts[ci];
        if (seen) continue;
        for (int nch = 1; nch <= (alg_channels(alg) ? 3 : 1); nch++)
            for (size_t si = 0; si < sizeof(slices) / sizeof(slices[0]); si++)
                for (int ip = 0; ip <= (alg == ALG_ALLTOALL ? 0 : 1); ip++)
                    for (int avg = 0; avg <= (alg_reduces(alg) ? 1 : 0); avg++)
                        for (int ri = 0; ri < nroots; ri++) {
                            /* 1000 elements in slices of 1 or 3 is the expensive corner: there
                             * only the two extremes of the channel / in-place / avg axes. */
                            bool heavy = counts[ci] == 1000 && slices[si] < 64;
                            bool low = nch == 1 && !ip && !avg;
                            bool high = nch == (alg_channels(alg) ? 3 : 1) &&
                                        ip == (alg != ALG_ALLTOALL) && avg == alg_reduces(alg);
                            if (heavy && !low && !high) continue;
                            /* determ's reduce-scatter and reduce are the allreduce's fold
                             * (proved above at this corner) on other buffers: 37 elements in
                             * slices of 1 and 3 prove their slicing */
                            if (heavy && (alg == ALG_DETERM_RS || alg == ALG_DETERM_REDUCE))
                                continue;
                            /* Building costs quadratic time in the ranges a buffer is cut
                             * into (schedule.c keeps them in a sorted array, inserted out of
                             * order): beyond ~10000 ranges per buffer a case costs seconds. */
                            uint64_t elems =
                                counts[ci] * (alg == ALG_ALLGATHER ||
                                                      alg_op(alg) == ALG_REDUCE_SCATTER ||
                                                      alg == ALG_ALLTOALL
                                                  ? (uint64_t)p
                                                  : 1);
                            if (elems / slices[si] > 10000) continue;
                            /* node algorithms: uneven nodes of 3 and 1 ranks, or of 2 */
                            cfg_t c = {alg, p,         counts[ci],     nch, slices[si], ip,
                                       avg, roots[ri], ri % 2 ? -4 : 2};
                            run_case(&c, &t);
                        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (getenv("SCHED_TIMES"))
        fprintf(stderr, "grid %s p=%d: %d cases, %d runs, %.2f s\n", alg_names[alg], p, t.cases,
                t.runs, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    ck_assert_msg(t.failed == 0, "%d of %d %s cases at p=%d failed; first: %s", t.failed, t.cases,
                  alg_names[alg], p, t.first);
}
END_TEST

/* ---- Scale ------------------------------------------------------------------------------- */

/* Ring allreduce with chunks of 3 and 4 elements, one slice per chunk, at many ranks: proves
 * the chunk arithmetic and the ring order where p is large, with interval values. */
static void scale_case(int p, vmode_t mode, bool inplace)
{
    cfg_t c = {ALG_ALLREDUCE, p, 3 * (uint64_t)p + 1, 1, 1u << 20, inplace, true, 0, 0};
    policy_t pol = {POL_ORDER, 0, false, 0};
    char err[768], cs[160];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sched_t *s = xcalloc((size_t)p, sizeof(sched_t));
    cfg_str(&c, cs, sizeof(cs));
    ck_assert_msg(build_scheds(&c, s, err, sizeof(err)), "%s: %s", cs, err);
    bool ok = verify(&c, s, &pol, mode, err, sizeof(err));
    size_t steps = 0;
    for (int r = 0; r < p; r++)
        steps += s[r].nsteps;
    free_scheds(s, p);
    free(s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "scale: %s, %zu steps, %s values: %.2f s\n", cs, steps,
            mode == VAL_IVL ? "interval" : "count-vector",
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    ck_assert_msg(ok, "%s: %s", cs, err);
}

START_TEST(test_scale_128)
{
    scale_case(128, VAL_IVL, false);
    scale_case(128, VAL_IVL, true);
    scale_case(128, VAL_VEC, false); /* cross-check of the compact values */
}
END_TEST

/* Every generator at 128 ranks, schedule order, interval values. */
START_TEST(test_scale_all_128)
{
    for (int a = 0; a < ALG_COUNT; a++) {
        if (alg_node_ring((alg_t)a)) continue; /* intervals cannot follow: see test_scale_hier */
        bool per_rank =
            a == ALG_ALLGATHER || alg_op((alg_t)a) == ALG_REDUCE_SCATTER || a == ALG_ALLTOALL;
        cfg_t c = {(alg_t)a, 128, per_rank ? 3 : 3 * 128 + 1, 2, 2, false, alg_reduces(a), 77, 8};
        policy_t pol = {POL_ORDER, 0, false, 0};
        char err[768], cs[160];
        sched_t *s = xcalloc(128, sizeof(sched_t));
        cfg_str(&c, cs, sizeof(cs));
        ck_assert_msg(build_scheds(&c, s, err, sizeof(err)), "%s: %s", cs, err);
        bool ok = verify(&c, s, &pol, VAL_IVL, err, sizeof(err));
        free_scheds(s, 128);
        free(s);
        ck_assert_msg(ok, "%s: %s", cs, err);
    }
}
END_TEST

START_TEST(test_scale_512)
{
    scale_case(512, VAL_IVL, false);
}
END_TEST

/* The node algorithms at scale: 8 ranks per node, and uneven nodes (8, 5 and 7 ranks).
 * Interval values follow contributions that join in ring order; hier joins a node's ranks in
 * its local ring's order first, which an interval cannot describe, so hier is proved with
 * exact count vectors at 128 ranks, and hier_leader and ps with intervals at 1024. */
static void scale_node_case(alg_t alg, int p, int node_size, vmode_t mode)
{
    cfg_t c = {alg, p, 3 * (uint64_t)p + 1, 1, 1u << 20, node_size < 0, true, 0, node_size};
    policy_t pol = {POL_ORDER, 0, false, 0};
    char err[768], cs[160];
    sched_t *s = xcalloc((size_t)p, sizeof(sched_t));
    cfg_str(&c, cs, sizeof(cs));
    ck_assert_msg(build_scheds(&c, s, err, sizeof(err)), "%s: %s", cs, err);
    bool ok = verify(&c, s, &pol, mode, err, sizeof(err));
    free_scheds(s, p);
    free(s);
    ck_assert_msg(ok, "%s nodes %d: %s", cs, node_size, err);
}

START_TEST(test_scale_hier)
{
    scale_node_case(ALG_HIER, 128, 8, VAL_VEC);
    scale_node_case(ALG_HIER, 128, -8, VAL_VEC);
    scale_node_case(ALG_HIER_LEADER, 1024, 8, VAL_IVL);
    scale_node_case(ALG_HIER_LEADER, 1024, -8, VAL_IVL);
    scale_node_case(ALG_PS, 1024, 8, VAL_IVL);
    scale_node_case(ALG_RD, 1024, 8, VAL_IVL);
    scale_node_case(ALG_RD, 1000, 8, VAL_IVL); /* 24 ranks fold into their neighbours */
    scale_node_case(ALG_RAB, 1024, 8, VAL_IVL);
    scale_node_case(ALG_RAB, 1000, 8, VAL_IVL);
    scale_node_case(ALG_TREE, 1024, 8, VAL_IVL);
    scale_node_case(ALG_TREE, 1000, 8, VAL_IVL);
    scale_node_case(ALG_TREE, 1023, 8, VAL_IVL); /* 2^10 - 1: the shifted second tree */
    /* the one-shot's full mesh: the registry offers it up to 16 ranks; its fold in rank order
     * (every reduction joins adjacent intervals) is proved past that */
    scale_node_case(ALG_ONESHOT, 16, 8, VAL_IVL);
    scale_node_case(ALG_ONESHOT, 61, 8, VAL_IVL);
    for (int a = ALG_HIER_TREE; a <= ALG_HIER_RD; a++) {
        scale_node_case((alg_t)a, 128, 8, VAL_VEC);
        scale_node_case((alg_t)a, 128, -8, VAL_VEC);
    }
}
END_TEST

/* The cross-node level of hier's variants at 1024 ranks (128 nodes of 8, and uneven nodes):
 * exact count vectors cost 2 KiB an element there, so a few elements per shard. */
static void scale_hier_1024(alg_t alg, int node_size)
{
    cfg_t c = {alg, 1024, 8 * 5 + 3, 1, 2, node_size < 0, true, 0, node_size};
    policy_t pol = {POL_ORDER, 0, false, 0};
    char err[768], cs[160];
    sched_t *s = xcalloc(1024, sizeof(sched_t));
    cfg_str(&c, cs, sizeof(cs));
    ck_assert_msg(build_scheds(&c, s, err, sizeof(err)), "%s: %s", cs, err);
    bool ok = verify(&c, s, &pol, VAL_VEC, err, sizeof(err));
    free_scheds(s, 1024);
    free(s);
    ck_assert_msg(ok, "%s nodes %d: %s", cs, node_size, err);
}

START_TEST(test_scale_hier_1024)
{
    scale_hier_1024(ALG_HIER_TREE, 8);
    scale_hier_1024(ALG_HIER_RAB, 8);
    scale_hier_1024(ALG_HIER_RD, -8);
    scale_hier_1024(ALG_HIER_TREE, -8);
}
END_TEST

/* The trees' reduce and broadcast at scale: the shape turns with the root (ranks are counted
 * from root + 1), so every root at 128 and 129 ranks, then the ends and the middle at 1000,
 * 1023, 1024 and 1025 ranks (2^10 - 1 + 1: the other ranks are a perfect tree's 1023), several
 * slices per half, interval values. */
static void scale_rooted(alg_t alg, int p, int root, uint64_t slice, bool inplace)
{
    cfg_t c = {alg, p, 3 * (uint64_t)p + 1, 1, slice, inplace, alg == ALG_TREE_REDUCE, root, 0};
    policy_t pol = {POL_ORDER, 0, false, 0};
    char err[768], cs[160];
    sched_t *s = xcalloc((size_t)p, sizeof(sched_t));
    cfg_str(&c, cs, sizeof(cs));
    ck_assert_msg(build_scheds(&c, s, err, sizeof(err)), "%s: %s", cs, err);
    bool ok = verify(&c, s, &pol, VAL_IVL, err, sizeof(err));
    free_scheds(s, p);
    free(s);
    ck_assert_msg(ok, "%s: %s", cs, err);
}

START_TEST(test_scale_tree_rooted)
{
    alg_t alg = _i ? ALG_TREE_BCAST : ALG_TREE_REDUCE;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int p = 128; p <= 129; p++)
        for (int root = 0; root < p; root++)
            scale_rooted(alg, p, root, 1u << 20, root % 2);
    static const int ps[] = {1000, 1023, 1024, 1025};
    for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
        int p = ps[k], roots[] = {0, 1, p / 2, p - 1};
        for (int j = 0; j < 4; j++)
            scale_rooted(alg, p, roots[j], 128, j % 2);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "scale: %s, every root at 128 and 129 ranks, 4 roots at 1000-1025: %.2f s\n",
            alg_names[alg],
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
}
END_TEST

START_TEST(test_scale_1024)
{
    scale_case(1024, VAL_IVL, false);
}
END_TEST

/* ---- The checker can fail ---------------------------------------------------------------- */

/* Removes step i from a built schedule, renumbering the dependencies (those on i vanish). */
static void drop_step(sched_t *s, size_t i)
{
    uint32_t *nd = xcalloc(s->ndeps, sizeof(uint32_t));
    size_t nn = 0, w = 0;
    for (size_t j = 0; j < s->nsteps; j++) {
        if (j == i) continue;
        sched_step_t st = s->steps[j];
        size_t first = nn;
        for (uint32_t k = 0; k < st.ndeps; k++) {
            uint32_t d = s->deps[st.dep_first + k];
            if (d != i) nd[nn++] = d > i ? d - 1 : d;
        }
        st.dep_first = (uint32_t)first;
        st.ndeps = (uint32_t)(nn - first);
        s->steps[w++] = st;
    }
    memcpy(s->deps, nd, nn * sizeof(uint32_t));
    s->ndeps = nn;
    s->nsteps = w;
    free(nd);
}

static size_t find_step(const sched_t *s, int kind, size_t nth)
{
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == kind && nth-- == 0) return i;
    ck_abort_msg("no step of kind %d", kind);
    return 0;
}

typedef enum {
    BREAK_DROP_RR,
    BREAK_PEER,
    BREAK_SIZE,
    BREAK_DEPS,
    BREAK_ONE_DEP,
    BREAK_AVG_MISSING,
    BREAK_AVG_EARLY,
    BREAK_KIND,
    BREAK_EXTRA_SEND,
    BREAK_COUNT
} break_t;

/* Whether text contains one of the '|'-separated words. */
static bool mentions(const char *text, const char *words)
{
    char w[128];
    snprintf(w, sizeof(w), "%s", words);
    for (char *save = NULL, *t = strtok_r(w, "|", &save); t; t = strtok_r(NULL, "|", &save))
        if (strstr(text, t)) return true;
    return false;
}

/* A ring allreduce with one deliberate defect; every policy that should see it must fail, with
 * the expected words in its report. */
START_TEST(test_broken)
{
    break_t b = (break_t)_i;
    cfg_t c = {
        ALG_ALLREDUCE, 4, 37, 1, 3, false, b == BREAK_AVG_MISSING || b == BREAK_AVG_EARLY, 0, 0};
    sched_t s[4];
    char err[768];
    ck_assert(build_scheds(&c, s, err, sizeof(err)));
    policy_t order = {POL_ORDER, 0, false, 0}, latest = {POL_LATEST, 0, true, 0};
    policy_t random = {POL_RANDOM, 7, false, 0}, exec = {POL_EXEC, 3, true, 1};
    const char *want = NULL;
    switch (b) {
    case BREAK_DROP_RR: /* rank 2 forgets one receive: the rest of its messages shift */
        drop_step(&s[2], find_step(&s[2], STEP_RECV_REDUCE, 0));
        break;
    case BREAK_PEER: /* rank 0's first send goes to rank 2 instead of 1 */
        s[0].steps[find_step(&s[0], STEP_SEND, 0)].peer = 2;
        want = "deadlock|mismatched message sizes"; /* rank 1 waits, or takes a later one */
        break;
    case BREAK_SIZE:
        s[1].steps[find_step(&s[1], STEP_RECV_REDUCE, 1)].count--;
        want = "mismatched message sizes";
        break;
    case BREAK_DEPS:
        /* Running in schedule order would hide missing dependencies: the ordering proof and
         * the concurrent orders must not. */
        for (size_t i = 0; i < s[1].nsteps; i++)
            s[1].steps[i].ndeps = 0;
        want = "race";
        break;
    case BREAK_ONE_DEP: {
        /* Only one dependency missing: rank 2's first allgather send no longer waits for the
         * reduction that completes its chunk. */
        size_t i = find_step(&s[2], STEP_SEND, 0);
        while (s[2].steps[i].kind != STEP_SEND || s[2].steps[i].src_buf != SCHED_BUF_RECV ||
               s[2].steps[i].ndeps == 0)
            i++;
        s[2].steps[i].ndeps = 0;
        want = "race";
        break;
    }
    case BREAK_AVG_MISSING: {
        size_t i = s[3].nsteps;
        while (i-- > 0)
            if (s[3].steps[i].flags & STEP_F_AVG) break;
        s[3].steps[i].flags = 0;
        want = "avg x0";
        break;
    }
    case BREAK_AVG_EARLY:
        s[0].steps[find_step(&s[0], STEP_RECV_REDUCE, 0)].flags |= STEP_F_AVG;
        want = "partial";
        break;
    case BREAK_KIND: /* a reduction that only receives loses rank 1's own input */
        s[1].steps[find_step(&s[1], STEP_RECV_REDUCE, 2)].kind = STEP_RECV;
        want = "wrong result";
        break;
    case BREAK_EXTRA_SEND: { /* rank 3 sends its last message twice */
        size_t last = s[3].nsteps - 1;
        while (s[3].steps[last].kind != STEP_SEND)
            last--;
        sched_step_t d = s[3].steps[last];
        sched_send(&s[3], d.desc, d.peer, d.src_buf, d.src_off, d.count);
        ck_assert(sched_status(&s[3]) == loomSuccess);
        /* the builder forgot the history (tables freed): share the original's dependencies,
         * so that the only defect is the extra message */
        s[3].steps[s[3].nsteps - 1].dep_first = d.dep_first;
        s[3].steps[s[3].nsteps - 1].ndeps = d.ndeps;
        want = "unmatched sends|deadlock"; /* eager: left over; rendezvous: never completes */
        break;
    }
    default: break;
    }
    const policy_t *pols[] = {&order, &latest, &random, &exec};
    for (int j = 0; j < 4; j++) {
        /* one random order may be lucky with a missing dependency */
        if ((b == BREAK_DEPS || b == BREAK_ONE_DEP) && j == 2) continue;
        char ps[80];
        policy_str(pols[j], ps, sizeof(ps));
        bool ok = verify(&c, s, pols[j], VAL_VEC, err, sizeof(err));
        ck_assert_msg(!ok, "break %d: [%s] the checker passed a broken schedule", b, ps);
        ck_assert_msg(want == NULL || mentions(err, want), "break %d: [%s] expected \"%s\" in: %s",
                      b, ps, want, err);
        if (j == 0) fprintf(stderr, "broken %d [%s] -> %s\n", b, ps, err);
    }
    /* The compact values must see the defects too. */
    ck_assert_msg(!verify(&c, s, &order, VAL_IVL, err, sizeof(err)),
                  "break %d: interval values passed a broken schedule", b);
    free_scheds(s, 4);
}
END_TEST

/* The builder on its own: random steps over random, unaligned ranges of three buffers (with
 * and without an alias), as composed generators may produce. Every two conflicting steps must
 * be ordered (the ordering proof), and every dependency recorded must be a real conflict: the
 * builder may not serialize what could run at once. */
static bool overlaps(const sched_t *s, uint32_t b1, uint64_t o1, uint32_t b2, uint64_t o2,
                     uint64_t n1, uint64_t n2)
{
    resolve(s, &b1, &o1);
    resolve(s, &b2, &o2);
    return b1 == b2 && o1 < o2 + n2 && o2 < o1 + n1;
}

static bool conflict(const sched_t *s, const sched_step_t *x, const sched_step_t *y)
{
    bool c = false;
    if (writes_dst(x) && writes_dst(y))
        c |= overlaps(s, x->dst_buf, x->dst_off, y->dst_buf, y->dst_off, x->count, y->count);
    if (writes_dst(x) && reads_src(y))
        c |= overlaps(s, x->dst_buf, x->dst_off, y->src_buf, y->src_off, x->count, y->count);
    if (reads_src(x) && writes_dst(y))
        c |= overlaps(s, x->src_buf, x->src_off, y->dst_buf, y->dst_off, x->count, y->count);
    return c;
}

START_TEST(test_builder_random)
{
    uint64_t rng = 0x1234567u + (uint64_t)_i * 0x9e3779b97f4a7c15ull;
#define RND(n) (rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, rng % (uint64_t)(n))
    sched_t s;
    sched_init(&s, 0, 2);
    for (int round = 0; round < 200; round++) {
        /* reuse, as comm.c does between collectives */
        sched_reset(&s, 0, 2);
        bool alias = round % 2;
        uint64_t vsize[3] = {alias ? 24 : 64, 64, 64};
        if (alias) sched_set_alias(&s, SCHED_BUF_SEND, SCHED_BUF_RECV, 17);
        int nsteps = 1 + (int)RND(60);
        for (int j = 0; j < nsteps; j++) {
            int kind = (int)RND(4);
            uint32_t sb = (uint32_t)RND(3), db = 1 + (uint32_t)RND(2);
            uint64_t n = 1 + RND(12);
            uint64_t lim = vsize[sb] < vsize[db] ? vsize[sb] : vsize[db];
            if (n > lim) n = lim;
            uint64_t so = RND(vsize[sb] - n + 1), dof = RND(vsize[db] - n + 1);
            switch (kind) {
            case STEP_SEND: sched_send(&s, 0, 1, sb, so, n); break;
            case STEP_RECV: sched_recv(&s, 0, 1, db, dof, n); break;
            case STEP_RECV_REDUCE: sched_recv_reduce(&s, 0, 1, sb, so, db, dof, n, 0); break;
            default: sched_copy(&s, 0, sb, so, db, dof, n, 0); break;
            }
        }
        ck_assert(sched_status(&s) == loomSuccess);
        ck_assert_int_eq(s.nsteps, nsteps);
        for (size_t i = 0; i < s.nsteps; i++) {
            const sched_step_t *st = &s.steps[i];
            for (uint32_t j = 0; j < st->ndeps; j++) {
                uint32_t d = s.deps[st->dep_first + j];
                char a[200], b[200];
                step_str(st, i, a, sizeof(a));
                step_str(&s.steps[d < s.nsteps ? d : 0], d, b, sizeof(b));
                ck_assert_msg(d < i && conflict(&s, &s.steps[d], st),
                              "round %d: %s depends on %s without a conflict", round, a, b);
            }
        }
        sim_t m = {.p = 1};
        rank_t k = {.s = &s};
        memcpy(k.vsize, vsize, sizeof(vsize));
        m.rk = &k;
        prove_ordered(&m, 0);
        ck_assert_msg(!m.failed, "round %d%s: %s", round, alias ? " (alias)" : "", m.err);
    }
#undef RND
    sched_free(&s);
}
END_TEST

/* The interval values refuse what they cannot represent exactly. */
START_TEST(test_interval_values)
{
    vfmt_t f = vfmt_make(VAL_IVL, 5);
    uint8_t a[16], b2[16], c[16], d[16];
    val_unit(&f, a, 1, 7);
    val_unit(&f, b2, 2, 7);
    val_combine(&f, c, a, b2); /* [1, +2) */
    ck_assert(!cvh(c)->bad && cvpay(c)[0] == 1 && cvpay(c)[1] == 2);
    val_combine(&f, d, c, a); /* rank 1 twice */
    ck_assert(cvh(d)->bad);
    val_unit(&f, d, 4, 7);
    val_combine(&f, d, c, d); /* {1,2} + {4}: a gap */
    ck_assert(cvh(d)->bad);
    val_unit(&f, d, 0, 7);
    val_combine(&f, d, c, d); /* {0} + {1,2}: adjacent on the other side */
    ck_assert(!cvh(d)->bad && cvpay(d)[0] == 0 && cvpay(d)[1] == 3);
    val_unit(&f, a, 3, 7);
    val_unit(&f, b2, 4, 7);
    val_combine(&f, a, a, b2);
    val_combine(&f, a, a, d); /* {3,4} + {0,1,2}: wraps around to the full set */
    ck_assert(val_full(&f, a));
    val_combine(&f, a, a, b2); /* and once more: a duplicate */
    ck_assert(!val_full(&f, a));
    val_unit(&f, b2, 4, 8);
    val_combine(&f, c, c, b2); /* another index */
    ck_assert(cvh(c)->idx == VAL_MIXED);
    vfmt_t g = vfmt_make(VAL_VEC, 5);
    uint8_t v[32], w[32];
    val_unit(&g, v, 3, 2);
    val_unit(&g, w, 3, 2);
    val_combine(&g, v, v, w);
    ck_assert(cvh(v)->bad && !val_full(&g, v));
}
END_TEST

/* The pieces a hierarchy's node-local rings walk in the cross-node ring's order
 * (ring_allreduce_pieces) cover the region exactly once, none empty, for every member of rings
 * of several sizes, both orders, and channel and slice settings that cut it many ways. (That
 * the order serves the ring is measured on the test bed, perf/RESULTS.md; that results do not
 * change is the grid and scale tests' job.) */
START_TEST(test_ring_pieces)
{
    const uint64_t counts[] = {1, 7, 1000, 65537, 300007};
    const int ps[] = {1, 2, 3, 4, 8};
    const ring_params_t prms[] = {{1, 1}, {2, 100}, {4, 4096}, {8, 1 << 18}};
    for (size_t a = 0; a < sizeof(counts) / sizeof(counts[0]); a++) {
        uint64_t n = counts[a];
        uint8_t *seen = malloc(n);
        ck_assert_ptr_nonnull(seen);
        for (size_t b = 0; b < sizeof(ps) / sizeof(ps[0]); b++)
            for (size_t c = 0; c < sizeof(prms) / sizeof(prms[0]); c++)
                for (int me = 0; me < ps[b]; me++)
                    for (int fin = 0; fin < 2; fin++) {
                        if (prms[c].slice_elems == 1 && n > 65537) continue; /* too many */
                        ring_span_t *sp = NULL;
                        bool oom = false;
                        size_t np = ring_allreduce_pieces(n, &prms[c], ps[b], me, fin, &sp, &oom);
                        ck_assert(!oom);
                        /* plain checks inside the loops (a Check assertion per element
                         * costs a system call), one assertion per call */
                        memset(seen, 0, n);
                        uint64_t bad_piece = UINT64_MAX, twice = UINT64_MAX, missed = UINT64_MAX;
                        for (size_t i = 0; i < np && bad_piece == UINT64_MAX; i++) {
                            if (sp[i].len == 0 || sp[i].off + sp[i].len > n) {
                                bad_piece = i;
                                break;
                            }
                            for (uint64_t e = sp[i].off; e < sp[i].off + sp[i].len; e++) {
                                if (seen[e] && twice == UINT64_MAX) twice = e;
                                seen[e] = 1;
                            }
                        }
                        for (uint64_t e = 0; e < n && missed == UINT64_MAX; e++)
                            if (!seen[e]) missed = e;
                        ck_assert_msg(bad_piece == UINT64_MAX && twice == UINT64_MAX &&
                                          missed == UINT64_MAX,
                                      "n %llu p %d me %d finish %d slice %llu channels %d: bad "
                                      "piece %lld, element %lld twice, element %lld missed",
                                      (unsigned long long)n, ps[b], me, fin,
                                      (unsigned long long)prms[c].slice_elems, prms[c].nchannels,
                                      (long long)bad_piece, (long long)twice, (long long)missed);
                        free(sp);
                    }
        free(seen);
    }
}
END_TEST

/* ---- The registry ------------------------------------------------------------------------ */

/* Every allreduce row of the registry is one of the generators this file proves: a new row
 * without a grid of its own fails here. */
START_TEST(test_registry_covered)
{
    for (int i = 0; i < ALGO_COUNT; i++) {
        const registry_algo_t *row = registry_get(i);
        ck_assert_ptr_nonnull(row);
        ck_assert_ptr_nonnull(row->gen);
        ck_assert_ptr_nonnull(row->name);
        ck_assert_ptr_nonnull(row->applies);
        ck_assert_ptr_nonnull(row->doc);
        bool proved = false;
        /* (a row that reuses a proven row's generator, as segment does oneshot's, is proven
         * with it; what segment runs instead of that schedule is core's, tested by running) */
        for (int a = 0; a < ALG_COUNT; a++)
            proved |= alg_plan[a].kind == OPK_ALLREDUCE && alg_plan[a].algo >= 0 &&
                      registry_get(alg_plan[a].algo)->gen == row->gen;
        ck_assert_msg(proved, "registry row %s has no symbolic proof here", row->name);
        /* its reduce and broadcast forms too (the plain rows run the ring's: algo -1) */
        for (int op = 0; op < ROOTED_COUNT; op++) {
            if (row->rooted[op].gen == NULL) continue;
            uint8_t kind = op == ROOTED_REDUCE ? OPK_REDUCE : OPK_BROADCAST;
            bool rp = false;
            for (int a = 0; a < ALG_COUNT; a++)
                rp |= alg_plan[a].kind == kind &&
                      (alg_plan[a].algo == i || (alg_plan[a].algo < 0 && i == ALGO_RING));
            ck_assert_msg(rp, "registry row %s's %s has no symbolic proof here", row->name,
                          op == ROOTED_REDUCE ? "reduce" : "broadcast");
        }
    }
    ck_assert_ptr_null(registry_get(ALGO_COUNT));
    ck_assert_ptr_null(registry_get(ALGO_AUTO));
}
END_TEST

/* LOOM_ALGO's names are the table's, and an unknown one is refused naming them all. */
START_TEST(test_registry_parse)
{
    int a = 0;
    ck_assert_int_eq(registry_parse("", &a), loomSuccess);
    ck_assert_int_eq(a, ALGO_AUTO);
    for (int i = 0; i < ALGO_COUNT; i++) {
        ck_assert_int_eq(registry_parse(registry_algos[i].name, &a), loomSuccess);
        ck_assert_int_eq(a, i);
    }
    ck_assert_int_eq(registry_parse("hier:ps", &a), loomInvalidUsage);
    const char *e = base_last_error();
    ck_assert_msg(strstr(e,
                         "LOOM_ALGO=hier:ps: unknown algorithm (ring, hier, hier_leader, ps, "
                         "rd, rabenseifner, tree, hier:tree, hier:rabenseifner, hier:rd, determ, "
                         "oneshot, segment)"),
                  "%s", e);
}
END_TEST

/* The automatic choice is the preferred row where one says so, else the fitting row of the
 * lowest prediction; the explanation gives the winner's reason, and "n/a" only to rows that
 * could not be chosen. */
START_TEST(test_registry_pick)
{
    const double lat[] = {0.5e-6, 20e-6}, bw[] = {1.25e9, 12e9};
    for (int p = 2; p <= 1024; p = p < 9 ? p + 1 : p * 4)
        for (int nn = 1; nn <= 3 && nn <= p; nn++)
            for (int k = 0; k < 16; k++) {
                bool shm = k & 1;
                registry_model_t m = {.nranks = p,
                                      .nnodes = nn,
                                      .a_net = lat[1],
                                      .b_net = 1 / bw[0],
                                      .a_loc = shm ? lat[(k >> 1) & 1] : lat[1],
                                      .b_loc = shm ? 1 / bw[(k >> 2) & 1] : 1 / bw[0],
                                      .shared_mem = shm,
                                      /* a node segment of 64 KiB (one node only, as comm.c) */
                                      .seg_bytes = (k & 8) && nn == 1 && shm ? 65536 : 0};
                for (uint64_t bytes = 1; bytes <= (1ull << 30); bytes *= 32) {
                    int pick = registry_pick(&m, bytes);
                    const registry_algo_t *w = registry_get(pick);
                    ck_assert_ptr_nonnull(w);
                    ck_assert(w->unfit == NULL || w->unfit(&m) == NULL);
                    const char *why = w->preferred ? w->preferred(&m, bytes) : NULL;
                    ck_assert_int_eq(why != NULL, p == 2 && nn == 1 && shm && bytes > m.seg_bytes);
                    char text[1024];
                    registry_explain(&m, bytes, pick, text, sizeof(text));
                    ck_assert_msg(strstr(text, why ? "(preferred: " : ", predicted "), "%s", text);
                    for (int i = 0; i < ALGO_COUNT; i++) {
                        const registry_algo_t *a = &registry_algos[i];
                        bool fits = (a->unfit == NULL || a->unfit(&m) == NULL) && a->cost &&
                                    (a->max_bytes == NULL || bytes <= a->max_bytes(&m));
                        char na[64];
                        snprintf(na, sizeof(na), "; %s n/a (", a->name);
                        ck_assert_msg(i == pick || (strstr(text, na) != NULL) == !fits, "%s", text);
                        if (!fits || why) continue;
                        double c = a->cost(&m, (double)bytes), cw = w->cost(&m, (double)bytes);
                        ck_assert_msg(cw < c || (cw == c && pick <= i), "%s", text);
                    }
                }
            }
}
END_TEST

/* Reduce and broadcast: the choice is among the rows with that form, the lowest prediction
 * (ties to the earlier row), the tree where its hops are fewer than the ring's p - 1 (from 5
 * ranks on); the others are "n/a (no ... form)";
 * LOOM_ALGO naming a row without the form leaves the operation to the model. */
START_TEST(test_registry_pick_rooted)
{
    static const char *const none[ROOTED_COUNT] = {"no reduce form", "no broadcast form"};
    for (int op = 0; op < ROOTED_COUNT; op++)
        for (int p = 2; p <= 1024; p = p < 9 ? p + 1 : p * 4)
            for (int nn = 1; nn <= 2 && nn <= p; nn++) {
                registry_model_t m = {.nranks = p,
                                      .nnodes = nn,
                                      .a_net = 20e-6,
                                      .b_net = 1 / 1.25e9,
                                      .a_loc = 5e-6,
                                      .b_loc = 1 / 6e9,
                                      .gamma = 1 / 5e9,
                                      .shared_mem = true};
                for (uint64_t bytes = 1; bytes <= (1ull << 30); bytes *= 32) {
                    int pick = registry_pick_rooted(&m, op, bytes);
                    const registry_algo_t *w = registry_get(pick);
                    ck_assert_ptr_nonnull(w);
                    ck_assert_ptr_nonnull(w->rooted[op].gen);
                    ck_assert_int_eq(pick, tree_rooted_hops(p) < p - 1 ? ALGO_TREE : ALGO_RING);
                    char text[1024];
                    registry_explain_rooted(&m, op, bytes, pick, text, sizeof(text));
                    ck_assert_msg(strstr(text, ", predicted "), "%s", text);
                    for (int i = 0; i < ALGO_COUNT; i++) {
                        const registry_algo_t *a = &registry_algos[i];
                        char na[96];
                        snprintf(na, sizeof(na), "; %s n/a (%s)", a->name, none[op]);
                        ck_assert_msg(i == pick ||
                                          (strstr(text, na) != NULL) == (a->rooted[op].gen == NULL),
                                      "%s", text);
                        if (a->rooted[op].gen == NULL) continue;
                        double c = a->rooted[op].cost(&m, (double)bytes);
                        double cw = w->rooted[op].cost(&m, (double)bytes);
                        ck_assert_msg(cw < c || (cw == c && pick <= i), "%s", text);
                    }
                }
            }
    /* the hops of the trees' actual shapes: 2 ranks 1, 4 ranks 3 (the second tree of 3 hangs
     * below one member), 5 ranks 3, 8 ranks 4, 1024 ranks 11 (1023 others: a perfect tree of
     * 10 levels and the other one a level deeper) */
    ck_assert_int_eq(tree_rooted_hops(2), 1);
    ck_assert_int_eq(tree_rooted_hops(4), 3);
    ck_assert_int_eq(tree_rooted_hops(5), 3);
    ck_assert_int_eq(tree_rooted_hops(8), 4);
    ck_assert_int_eq(tree_rooted_hops(1024), 11);
    registry_model_t five = {.nranks = 5, .nnodes = 1, .a_loc = 1e-6, .b_loc = 1e-9};
    ck_assert_int_eq(registry_pick_rooted(&five, ROOTED_REDUCE, 8), ALGO_TREE);
    /* ranks outnumbering cores: the job's messages count, the tree's are twice the ring's */
    registry_model_t busy = {.nranks = 1024, .nnodes = 1, .a_loc = 1e-6, .oversubscribed = true};
    for (int op = 0; op < ROOTED_COUNT; op++)
        ck_assert_int_eq(registry_pick_rooted(&busy, op, 8), ALGO_RING);
    for (int op = 0; op < ROOTED_COUNT; op++) {
        ck_assert_int_eq(registry_rooted_forced(ALGO_TREE, op), ALGO_TREE);
        ck_assert_int_eq(registry_rooted_forced(ALGO_RING, op), ALGO_RING);
        ck_assert_int_eq(registry_rooted_forced(ALGO_RD, op), -1);
        ck_assert_int_eq(registry_rooted_forced(ALGO_AUTO, op), -1);
    }
}
END_TEST

/* ---- Runner ------------------------------------------------------------------------------ */

static Suite *sched_suite(void)
{
    Suite *s = suite_create("sched");
    TCase *chk = tcase_create("checker");
    tcase_add_loop_test(chk, test_broken, 0, BREAK_COUNT);
    tcase_add_test(chk, test_interval_values);
    tcase_add_loop_test(chk, test_builder_random, 0, 20);
    suite_add_tcase(s, chk);

    TCase *pieces = tcase_create("pieces");
    tcase_set_timeout(pieces, 60);
    tcase_add_test(pieces, test_ring_pieces);
    suite_add_tcase(s, pieces);

    TCase *reg = tcase_create("registry");
    tcase_add_test(reg, test_registry_covered);
    tcase_add_test(reg, test_registry_parse);
    tcase_add_test(reg, test_registry_pick);
    tcase_add_test(reg, test_registry_pick_rooted);
    suite_add_tcase(s, reg);

    TCase *grid = tcase_create("grid");
    tcase_set_timeout(grid, 120);
    tcase_add_loop_test(grid, test_grid, 0, ALG_COUNT * NGRID_P);
    suite_add_tcase(s, grid);

    TCase *scale = tcase_create("scale");
    tcase_set_timeout(scale, 120);
    tcase_add_test(scale, test_scale_128);
    tcase_add_test(scale, test_scale_all_128);
    tcase_add_test(scale, test_scale_512);
    tcase_add_test(scale, test_scale_1024);
    tcase_add_test(scale, test_scale_hier);
    tcase_add_test(scale, test_scale_hier_1024);
    tcase_add_loop_test(scale, test_scale_tree_rooted, 0, 2);
    suite_add_tcase(s, scale);
    return s;
}

int main(void)
{
    return h_check_main(sched_suite(), false, CK_NORMAL);
}
