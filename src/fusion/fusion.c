/*
 * The fusion context (loom.h's loomFusion*, docs/fusion.md): tensors enqueued in order are cut
 * into segments, segments are packed into buckets, and each bucket is one in-place allreduce
 * (or, for compressed float32 sums, a pipeline of pieces: node sums, an all-to-all and an
 * allgather of encoded shards, in groups of point-to-point transfers; z_* below), run by core's
 * progress thread through coll_start/coll_test. The caller's thread only queues and, in
 * loomFusionWait*, waits on a condition variable.
 *
 * Why every rank forms the same buckets (the determinism argument). A bucket is a range
 * [start, cut) of segment positions, and positions come from the enqueue order alone. Each rank
 * computes, from its own queue, the fill point: the longest run from start of one type and op
 * that fits the bucket limit; it is a function of the enqueued sequence, so ranks that enqueued
 * the same tensors compute the same one. A rank proposes a cut `want` when its bucket is full
 * (want = fill), when its oldest waiting tensor has waited the cycle time or it was asked to
 * flush (want <= fill: what it has). Proposals are exchanged in a small allgather (a round)
 * ahead of the bucket, and the cut is the minimum of all proposals. Every rank computes that
 * minimum from the same gathered records, so the cut is the same everywhere, whatever each
 * rank's clock said; every rank already holds the segments up to the cut (a proposal never
 * exceeds what its rank has). A rank whose timer fires early only makes the cut earlier for
 * everyone; it cannot make its own bucket differ. A round needs every rank's record, so a rank
 * whose bucket is not ready simply joins later (its own timer, fill or flush): the early ranks'
 * round waits in the progress thread, never in the caller.
 *
 * Why disagreements are errors and not wrong sums. Each segment (tensor id, its count, the
 * segment's offset and length, type, op) is chained into a running digest. A round carries each
 * rank's digest at its proposal; when all proposals are equal the digests are compared at once,
 * else a second round compares the digests at the agreed cut. Equal digests mean equal buckets
 * (up to a 64-bit hash collision). Unequal ones start a third round that gathers the bucket's
 * segment descriptors, and every rank reports the first position where they differ, naming the
 * tensor ids, counts, types and ops and the ranks. The bucket's allreduce also carries the
 * digest in its descriptor (coll_op_t.tag), checked by every receiver, as a second line. A rank
 * that waits for all (loomFusionWaitAll) with nothing left proposes an empty bucket with the
 * FINAL flag: a round whose proposals are all empty and final closes the step, and a round in
 * which some ranks are final and empty while others still have segments is a missing tensor,
 * reported with the first such tensor's id. Every decision is made from gathered data that all
 * ranks hold, so all ranks take the same branch: nobody waits for a round that others skip.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base.h"
#include "coll.h"
#include "fuse.h"
#include "memtype.h"
#include "param.h"
#include "progress.h"
#include "reduce.h"
#include "schedule.h"
#ifdef LOOM_HAVE_CUDA
#include "fusion_dev.h"
#endif

#define FZ_TEXT 1024

struct loomFusionTensor {
    struct loomFusion *f;
    void *buf;
    size_t count;
    loomDataType_t type;
    loomRedOp_t op;
    uint64_t id;
    loomFusionCallback_t cb;
    void *arg;
    uint64_t pos; /* position in its step (since the last loomFusionWaitAll) */
    uint64_t nseg, segs_done;
    atomic_int done;
    loomResult_t res;
    struct loomFusionTensor *next;
    cudaStream_t stream;  /* a device tensor's */
    struct fzd_event *ev; /* ... and its event (fusion_dev.h) */
};

typedef struct {
    struct loomFusionTensor *t;
    fuse_segdesc_t d;
    uint64_t h;     /* the digest after this segment */
    uint64_t t_enq; /* when it was enqueued (the cycle timer) */
} fz_seg_t;

enum { FZ_FULL = 1, FZ_TIMER = 2, FZ_FLUSH = 4, FZ_FINAL = 8 };

/* One rank's record in a round. */
typedef struct {
    uint64_t want;   /* the proposed cut (absolute segment position) */
    uint64_t avail;  /* segments this rank has */
    uint64_t h_want; /* its digest at `want` */
    uint32_t flags;
    uint32_t pad;
    fuse_segdesc_t first; /* the segment at the bucket's start, when it has one */
    uint64_t first_pos;   /* that segment's tensor position in the step */
} fz_rec_t;

enum { ST_IDLE, ST_ROUND, ST_VERIFY, ST_DIAG, ST_DATA, ST_Z_PIPE, ST_DEV };
enum { FZ_MEM_UNSET = -1 }; /* else a mem_type_t: a context's tensors are of one kind */

struct loomFusion {
    loomComm_t comm;
    int rank, nranks;
    loomFusionConfig_t cfg;
    uint64_t cycle_ns;
    bool attached;

    pthread_mutex_t lock; /* everything below up to `start`, and the tensors */
    pthread_cond_t cond;
    fz_seg_t *segs; /* segs[k] is absolute position base + k */
    size_t nsegs, segcap;
    uint64_t base, h_base; /* h_base: the digest before segs[0] */
    struct loomFusionTensor *thead, **ttail;
    uint64_t step_tensors; /* positions given in this step */
    uint64_t pending;      /* tensors not finished */
    uint64_t flush_to;     /* flush up to this absolute position */
    bool waiting;          /* a thread is inside loomFusionWaitAll */
    bool step_done;        /* the closing round agreed */
    bool claimed;
    int mem; /* FZ_MEM_UNSET until the first tensor with values */
    /* sizes left to the tuning (0 in the config): a first device tensor takes the device's */
    bool tuned_bucket, tuned_segment;
    struct fzd *dev; /* the device side (fusion_dev.h) of a context of device tensors */
    loomResult_t err;
    char errtext[FZ_TEXT];
    loomFusionStats_t st;
    double rel_sum;
    uint64_t rel_n;

    /* the progress thread's alone */
    uint64_t start; /* the next bucket's first segment */
    uint64_t step_buckets;
    int state;
    coll_group_t *g;
    fz_rec_t mine, *recs;
    uint64_t cut;
    uint32_t cut_flags;
    fz_seg_t *bk; /* the bucket's segments (copies) */
    size_t nbk, bkcap;
    fuse_segdesc_t *diag; /* nbk mine, then nranks * nbk gathered */
    size_t bk_elems;
    loomDataType_t bk_type;
    loomRedOp_t bk_op;
    bool bk_inplace; /* its segments are contiguous in memory */
    uint8_t *stage;
    size_t stage_cap;
    loomStats_t cs0;
    /* the compressed pipeline (z_*, below) */
    int zS, znslot;       /* network stages per piece (2 flat, 4 by node), buffer slots */
    int zL, zM, zl, zn;   /* ranks per node, nodes, my local index, my node index */
    int *zlocal, *zcross; /* ranks of my node by local index; of my local index by node */
    struct zslot *zs;     /* [znslot] */
    size_t zsh, zP, zcap; /* values per shard, per piece; the shard size the slots hold */
    uint64_t zK;          /* pieces in the bucket */
    int64_t zu;           /* the group running */
    int zi, zsub;         /* its CPU work done so far: stage, sub-step */
    coll_op_t *zops;      /* its operations */
    size_t zopcap;
    int znops;
    size_t *bkoff, bkoffcap; /* each bucket segment's offset in the bucket */
    struct z_range *zr;      /* z_ranges' answer */
    size_t zrcap;
    bool zr_fail;
    double z_relmax, z_relsum;
    uint64_t z_reln;
    uint64_t t_bucket;             /* when the compressed bucket started */
    double tm_enc, tm_red, tm_dec; /* its codec seconds, added to st when it ends */
};

/* ---- completion and failure ---- */

static void finish_tensor_locked(struct loomFusion *f, struct loomFusionTensor *t, loomResult_t r)
{
    if (atomic_load(&t->done)) return;
    t->res = r;
    atomic_store(&t->done, 1);
    f->pending--;
    if (r == loomSuccess) f->st.tensors++;
    if (t->cb) t->cb(t->id, r, t->arg);
}

/* Fails every unfinished tensor with (r, text): the context is broken from now on. */
static void fz_fail(struct loomFusion *f, loomResult_t r, const char *text)
{
    pthread_mutex_lock(&f->lock);
    if (f->err == loomSuccess) {
        f->err = r;
        snprintf(f->errtext, sizeof(f->errtext), "%s", text); /* logged where it was found */
    }
    base_set_error_text(f->errtext);
    for (struct loomFusionTensor *t = f->thead; t; t = t->next)
        finish_tensor_locked(f, t, f->err);
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

static loomResult_t fz_error(struct loomFusion *f)
{
    base_set_error_text(f->errtext);
    return f->err;
}

/* ---- rounds ---- */

static uint64_t digest_at(struct loomFusion *f, uint64_t pos)
{
    return pos == f->base ? f->h_base : f->segs[pos - 1 - f->base].h;
}

static loomResult_t start_ops(struct loomFusion *f, const coll_op_t *ops, int n)
{
    LOOM_CHECK(coll_usable(f->comm, "loomFusion"));
    return coll_start(ops, n, &f->g);
}

static loomResult_t start_gather(struct loomFusion *f, const void *send, void *recv, size_t bytes)
{
    coll_op_t o = {.comm = f->comm,
                   .kind = OPK_ALLGATHER,
                   .send = send,
                   .recv = recv,
                   .count = bytes,
                   .type = loomUint8,
                   .op = loomSum,
                   .root = -1};
    return start_ops(f, &o, 1);
}

/* The bucket limit and the fill point from f->start (lock held); *full when the next segment
 * does not fit (or is of another type or op), or the limit is reached exactly. */
static uint64_t fill_point(struct loomFusion *f, bool *full)
{
    uint64_t avail = f->base + f->nsegs, k = f->start;
    size_t limit = f->step_buckets == 0 ? f->cfg.firstBucketBytes : f->cfg.bucketBytes, bytes = 0;
    *full = false;
    if (k == avail) return k;
    const fz_seg_t *s0 = &f->segs[k - f->base];
    for (; k < avail; k++) {
        const fz_seg_t *s = &f->segs[k - f->base];
        size_t sb = s->d.len * red_type_size((loomDataType_t)s->d.type);
        if (s->d.type != s0->d.type || s->d.op != s0->d.op ||
            (k > f->start && bytes + sb > limit)) {
            *full = true;
            return k;
        }
        bytes += sb;
        if (bytes >= limit) {
            *full = true;
            return k + 1;
        }
    }
    return k;
}

/* In the idle state: whether to propose a cut now; returns the sleep hint. */
static uint64_t maybe_round(struct loomFusion *f, bool *progressed)
{
    pthread_mutex_lock(&f->lock);
    if (f->err != loomSuccess) {
        pthread_mutex_unlock(&f->lock);
        return UINT64_MAX;
    }
    uint64_t avail = f->base + f->nsegs, sleep = UINT64_MAX, want = f->start;
    bool final = f->waiting && !f->step_done && f->flush_to >= avail;
    bool full;
    uint64_t fill = fill_point(f, &full);
    uint32_t flags = 0;
    if (fill > f->start) {
        uint64_t waited = base_now_ns() - f->segs[f->start - f->base].t_enq;
        if (full) {
            flags = FZ_FULL, want = fill;
        } else if (f->flush_to > f->start) {
            flags = FZ_FLUSH, want = LOOM_MIN(fill, f->flush_to);
        } else if (waited >= f->cycle_ns) {
            flags = FZ_TIMER, want = fill;
        } else {
            sleep = f->cycle_ns - waited;
        }
    }
    if (want == f->start && !final) {
        pthread_mutex_unlock(&f->lock);
        return sleep;
    }
    if (final) flags |= FZ_FINAL;
    fz_rec_t *m = &f->mine;
    memset(m, 0, sizeof(*m));
    m->want = want;
    m->avail = avail;
    m->h_want = digest_at(f, want);
    m->flags = flags;
    if (avail > f->start) {
        m->first = f->segs[f->start - f->base].d;
        m->first_pos = f->segs[f->start - f->base].t->pos;
    }
    f->st.rounds++;
    pthread_mutex_unlock(&f->lock);
    *progressed = true;
    loomResult_t r = start_gather(f, m, f->recs, sizeof(*m));
    if (r != loomSuccess) {
        fz_fail(f, r, base_last_error());
        return UINT64_MAX;
    }
    f->state = ST_ROUND;
    return 0;
}

static void ranks_text(char *buf, size_t len, const bool *sel, int n)
{
    size_t o = 0;
    buf[0] = 0;
    for (int r = 0; r < n && o + 12 < len; r++)
        if (sel[r]) o += (size_t)snprintf(buf + o, len - o, "%s%d", o ? "," : "", r);
}

static void seg_text(char *buf, size_t len, const fuse_segdesc_t *d)
{
    snprintf(buf, len, "id %llu (%llu x %s, op %u, elements %llu..%llu)", (unsigned long long)d->id,
             (unsigned long long)d->count, red_type_name((loomDataType_t)d->type), d->op,
             (unsigned long long)d->off, (unsigned long long)(d->off + d->len));
}

static loomResult_t start_bucket(struct loomFusion *f);

/* A round gathered: decide the cut, the same way on every rank. */
static loomResult_t after_round(struct loomFusion *f)
{
    int p = f->nranks;
    uint64_t c = UINT64_MAX, w = 0;
    for (int r = 0; r < p; r++) {
        c = LOOM_MIN(c, f->recs[r].want);
        w = LOOM_MAX(w, f->recs[r].want);
    }
    if (c == f->start) {
        if (w == f->start) { /* every rank is final with nothing left: the step is complete */
            pthread_mutex_lock(&f->lock);
            f->step_done = true;
            f->step_buckets = 0;
            pthread_cond_broadcast(&f->cond);
            pthread_mutex_unlock(&f->lock);
            f->state = ST_IDLE;
            return loomSuccess;
        }
        /* some ranks waited for all with nothing left, others still have segments */
        bool lack[p], have[p];
        int q = -1;
        for (int r = 0; r < p; r++) {
            lack[r] = f->recs[r].want == f->start;
            have[r] = !lack[r];
            if (have[r] && q < 0) q = r;
        }
        char a[256], b[256], d[160];
        ranks_text(a, sizeof(a), have, p);
        ranks_text(b, sizeof(b), lack, p);
        seg_text(d, sizeof(d), &f->recs[q].first);
        return base_error(loomInvalidUsage, LOG_COLL,
                          "loomFusion: ranks disagree at tensor position %llu of this step: "
                          "rank(s) %s enqueued tensor %s there, but rank(s) %s called "
                          "loomFusionWaitAll without it (a missing tensor)",
                          (unsigned long long)f->recs[q].first_pos, a, d, b);
    }
    f->cut = c;
    if (f->state == ST_ROUND) {
        f->cut_flags = 0;
        for (int r = 0; r < p; r++)
            if (f->recs[r].want == c) f->cut_flags |= f->recs[r].flags;
    }
    if (f->state == ST_ROUND && w != c) {
        /* proposals differ: compare the digests at the agreed cut in a second round */
        memset(&f->mine, 0, sizeof(f->mine));
        f->mine.want = c;
        pthread_mutex_lock(&f->lock);
        f->mine.h_want = digest_at(f, c);
        pthread_mutex_unlock(&f->lock);
        f->st.rounds++;
        f->state = ST_VERIFY;
        return start_gather(f, &f->mine, f->recs, sizeof(f->mine));
    }
    bool same = true;
    for (int r = 1; r < p; r++)
        same &= f->recs[r].h_want == f->recs[0].h_want;
    if (!same) {
        /* gather the bucket's descriptors to say where the ranks part */
        size_t n = (size_t)(c - f->start);
        free(f->diag);
        f->diag = malloc((size_t)(p + 1) * n * sizeof(*f->diag));
        if (f->diag == NULL)
            return base_error(loomSystemError, LOG_COLL,
                              "loomFusion: ranks disagree on bucket %llu, and there is no memory "
                              "to say where",
                              (unsigned long long)f->st.buckets);
        pthread_mutex_lock(&f->lock);
        for (size_t k = 0; k < n; k++)
            f->diag[k] = f->segs[f->start + k - f->base].d;
        pthread_mutex_unlock(&f->lock);
        f->st.rounds++;
        f->state = ST_DIAG;
        return start_gather(f, f->diag, f->diag + n, n * sizeof(*f->diag));
    }
    return start_bucket(f);
}

static loomResult_t after_diag(struct loomFusion *f)
{
    int p = f->nranks;
    size_t n = (size_t)(f->cut - f->start);
    const fuse_segdesc_t *all = f->diag + n;
    for (size_t k = 0; k < n; k++) {
        bool differ[p], any = false;
        for (int r = 0; r < p; r++) {
            differ[r] = memcmp(&all[(size_t)r * n + k], &all[k], sizeof(*all)) != 0;
            any |= differ[r];
        }
        if (!any) continue;
        int q = 0;
        while (!differ[q])
            q++;
        char a[160], b[160], rk[256];
        seg_text(a, sizeof(a), &all[k]);
        seg_text(b, sizeof(b), &all[(size_t)q * n + k]);
        ranks_text(rk, sizeof(rk), differ, p);
        uint64_t pos;
        pthread_mutex_lock(&f->lock);
        pos = f->segs[f->start + k - f->base].t->pos;
        pthread_mutex_unlock(&f->lock);
        return base_error(loomInvalidUsage, LOG_COLL,
                          "loomFusion: ranks disagree at tensor position %llu of this step "
                          "(segment %zu of bucket %llu): rank 0 enqueued tensor %s, rank %d "
                          "enqueued tensor %s (differing ranks: %s); every rank must enqueue "
                          "the same tensors (count, type, op) in the same order",
                          (unsigned long long)pos, k, (unsigned long long)f->st.buckets, a, q, b,
                          rk);
    }
    return base_error(loomInvalidUsage, LOG_COLL,
                      "loomFusion: ranks disagree on bucket %llu (their digests differ), but its "
                      "segments compare equal: an earlier disagreement",
                      (unsigned long long)f->st.buckets);
}

/* ---- buckets ---- */

static loomResult_t grow(void **p, size_t *cap, size_t want, size_t es)
{
    if (want <= *cap) return loomSuccess;
    size_t n = LOOM_MAX(want, *cap * 2);
    void *q = realloc(*p, n * es);
    if (q == NULL)
        return base_error(loomSystemError, LOG_COLL, "loomFusion: out of memory (%zu bytes)",
                          n * es);
    *p = q;
    *cap = n;
    return loomSuccess;
}

static bool compressed(const struct loomFusion *f)
{
    return f->cfg.wire != loomFusionWireExact && f->bk_type == loomFloat32 &&
           (f->bk_op == loomSum || f->bk_op == loomAvg);
}

static void pack(struct loomFusion *f, uint8_t *dst)
{
    size_t es = red_type_size(f->bk_type), off = 0;
    for (size_t k = 0; k < f->nbk; k++) {
        const fz_seg_t *s = &f->bk[k];
        memcpy(dst + off * es, (uint8_t *)s->t->buf + s->d.off * es, s->d.len * es);
        off += s->d.len;
    }
}

static void unpack(struct loomFusion *f, const uint8_t *src)
{
    size_t es = red_type_size(f->bk_type), off = 0;
    for (size_t k = 0; k < f->nbk; k++) {
        const fz_seg_t *s = &f->bk[k];
        memcpy((uint8_t *)s->t->buf + s->d.off * es, src + off * es, s->d.len * es);
        off += s->d.len;
    }
}

static uint8_t *seg_ptr(const fz_seg_t *s, size_t es)
{
    return (uint8_t *)s->t->buf + s->d.off * es;
}

static void bucket_done(struct loomFusion *f);

/* ---- the compressed pipeline (docs/fusion.md, "Compressed wire") ----
 *
 * A compressed bucket travels in pieces of L*M*sh values: L ranks per node (1 when the nodes
 * are uneven or the communicator is one node: then every rank is a "node" of its own, M = p),
 * M nodes, shards of sh values. Piece t's part l (M*sh values) belongs to local rank l, and
 * shard m of that part to the rank of local index l on node m. Per piece:
 *   C PACK     copy the piece's values out of the tensors (flat: and encode its M shards)
 *   N RS_I     hier: local rank j receives every local peer's part j, float32 (shm)
 *   C SUMENC   hier: sum the node's L parts in float32, local-rank order, and encode the shards
 *   N A2A      shard m goes to node m's rank of my local index, 16-bit
 *   C REDUCE   decode the M encoded shards of my node index, sum in node order, re-encode
 *   N AG_X     the encoded sums go to the same M-1 peers
 *   C DECODE   decode the M sums into my part (flat: and unpack them into the tensors)
 *   N AG_I     hier: my part (float32) and its chunks' error figures go to the local peers
 *   C UNPACK   hier: copy the piece back into the tensors
 * Network stage i of piece t runs in group t + 2i (one group of point-to-point operations, all
 * stages of that group concurrent); the CPU stage before it runs while group t + 2i - 1 is on
 * the wire, driven by the progress thread one shard at a time between advances of that group.
 * So the codec of piece t+1 and t-1 overlaps the transfers of piece t, and a piece's buffers
 * live for 2S+1 groups (S network stages): that many slots, reused round robin. Every rank
 * builds the same groups from the bucket's size and the layout alone, so the point-to-point
 * operations match in order. */

enum { Z_RS_I, Z_A2A, Z_AG_X, Z_AG_I };

typedef struct z_range {
    float *ptr;      /* tensor memory */
    size_t pos, len; /* bucket position, values */
} z_range_t;
enum { Z_PACK, Z_SUMENC, Z_REDUCE, Z_DECODE, Z_UNPACK };

typedef struct zslot {
    float *rin;       /* hier: the local peers' parts, [L-1][M*sh] */
    uint8_t *xs, *xr; /* encoded shards to send, received: [M][wb] */
    uint8_t *gr;      /* encoded sums, gathered: [M][wb] (mine at my node index) */
    float *acc;       /* [sh] */
    float *own;       /* my shard of the piece, gathered from the tensors [sh] */

    float *mine;                /* the shard I reduce myself, float32 (never encoded) [sh] */
    float *mine_err, *mine_mag; /* its error so far (hier: the node sum's) and magnitude [nch] */
    float *err;                 /* the piece's chunk error figures, [L][M*nch] */
    float *e_in, *m_in, *e, *m; /* per chunk of a shard, [nch] each */
} zslot_t;

static size_t z_wb(const struct loomFusion *f)
{
    return fuse_wire_bytes(f->zsh);
}

static zslot_t *z_slot(struct loomFusion *f, uint64_t t)
{
    return &f->zs[t % (uint64_t)f->znslot];
}

/* The layout's roles, once per context. */
static loomResult_t z_init(struct loomFusion *f)
{
    if (f->zS) return loomSuccess;
    const int *node_of, *node_start, *node_ranks;
    int nn = coll_layout(f->comm, &node_of, &node_start, &node_ranks), p = f->nranks;
    int L = nn > 0 ? node_start[1] - node_start[0] : 1;
    bool even = nn > 1 && L > 1;
    for (int n = 1; n < nn && even; n++)
        even = node_start[n + 1] - node_start[n] == L;
    f->zlocal = malloc((size_t)p * sizeof(int));
    f->zcross = malloc((size_t)p * sizeof(int));
    if (!f->zlocal || !f->zcross)
        return base_error(loomSystemError, LOG_COLL, "loomFusion: out of memory (pipeline)");
    if (even) {
        int me = node_of[f->rank];
        f->zL = L, f->zM = nn, f->zn = me;
        for (int j = 0; j < L; j++) {
            f->zlocal[j] = node_ranks[node_start[me] + j];
            if (f->zlocal[j] == f->rank) f->zl = j;
        }
        for (int m = 0; m < nn; m++)
            f->zcross[m] = node_ranks[node_start[m] + f->zl];
        f->zS = 4;
    } else {
        f->zL = 1, f->zM = p, f->zl = 0, f->zn = f->rank;
        f->zlocal[0] = f->rank;
        for (int m = 0; m < p; m++)
            f->zcross[m] = m;
        f->zS = 2;
    }
    f->znslot = 2 * f->zS + 1;
    f->zs = calloc((size_t)f->znslot, sizeof(zslot_t));
    if (f->zs == NULL)
        return base_error(loomSystemError, LOG_COLL, "loomFusion: out of memory (pipeline)");
    INFO(LOG_COLL, "fusion %p: compressed pipeline %s, %d local x %d nodes, local index %d",
         (void *)f, even ? "by node" : "flat", f->zL, f->zM, f->zl);
    return loomSuccess;
}

/* Buffers for shards of f->zsh values (kept between buckets; they only grow). */
static loomResult_t z_buffers(struct loomFusion *f)
{
    size_t L = (size_t)f->zL, M = (size_t)f->zM, sh = f->zsh, wb = z_wb(f), nch = sh / FUSE_CHUNK;
    if (sh <= f->zcap) return loomSuccess;
    for (int s = 0; s < f->znslot; s++) {
        zslot_t *z = &f->zs[s];
        void **bufs[] = {(void **)&z->rin,      (void **)&z->xs,      (void **)&z->xr,
                         (void **)&z->gr,       (void **)&z->acc,     (void **)&z->err,
                         (void **)&z->e_in,     (void **)&z->m_in,    (void **)&z->e,
                         (void **)&z->m,        (void **)&z->own,     (void **)&z->mine,
                         (void **)&z->mine_err, (void **)&z->mine_mag};
        size_t sizes[] = {(L - 1) * M * sh * sizeof(float) + 1,
                          M * wb,
                          M * wb,
                          M * wb,
                          sh * sizeof(float),
                          L * M * nch * sizeof(float),
                          nch * sizeof(float),
                          nch * sizeof(float),
                          nch * sizeof(float),
                          nch * sizeof(float),
                          sh * sizeof(float),
                          sh * sizeof(float),
                          nch * sizeof(float),
                          nch * sizeof(float)};
        for (size_t k = 0; k < LOOM_ARRAY_SIZE(bufs); k++) {
            free(*bufs[k]);
            *bufs[k] = malloc(sizes[k]);
            if (*bufs[k] == NULL)
                return base_error(loomSystemError, LOG_COLL,
                                  "loomFusion: out of memory (pipeline, %zu bytes)", sizes[k]);
        }
    }
    f->zcap = sh;
    return loomSuccess;
}

static void z_free(struct loomFusion *f)
{
    for (int s = 0; s < f->znslot && f->zs; s++) {
        zslot_t *z = &f->zs[s];
        free(z->rin), free(z->xs), free(z->xr), free(z->gr), free(z->acc), free(z->err);
        free(z->e_in), free(z->m_in), free(z->e), free(z->m), free(z->own);
        free(z->mine), free(z->mine_err), free(z->mine_mag);
    }
    free(f->zs);
    free(f->zlocal);
    free(f->zcross);
    free(f->bkoff);
    free(f->zr);
}

/* The tensor memory of bucket positions [a, min(b, bk_elems)): fills f->zr, returns how many
 * ranges (0 on allocation failure: then f->zr_fail). */
static size_t z_ranges(struct loomFusion *f, size_t a, size_t b)
{
    b = LOOM_MIN(b, f->bk_elems);
    if (a >= b) return 0;
    /* the segment holding a: bkoff is increasing, bkoff[0] = 0 */
    size_t lo = 0, hi = f->nbk, n = 0;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (f->bkoff[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    for (size_t k = lo; k < f->nbk && f->bkoff[k] < b; k++) {
        const fz_seg_t *s = &f->bk[k];
        size_t s0 = LOOM_MAX(a, f->bkoff[k]), s1 = LOOM_MIN(b, f->bkoff[k] + s->d.len);
        if (grow((void **)&f->zr, &f->zrcap, n + 1, sizeof(*f->zr)) != loomSuccess) {
            f->zr_fail = true;
            return 0;
        }
        f->zr[n++] = (z_range_t){(float *)s->t->buf + s->d.off + (s0 - f->bkoff[k]), s0, s1 - s0};
    }
    return n;
}

/* The tensor memory of bucket positions [a, b) when they lie in one segment (no padding), else
 * NULL: the codec then reads or writes it in place instead of through a copy. */
static float *z_direct(struct loomFusion *f, size_t a, size_t b)
{
    if (b > f->bk_elems) return NULL;
    return z_ranges(f, a, b) == 1 ? f->zr[0].ptr : NULL;
}

/* Copies bucket positions [a, b) between the tensors and buf (buf[0] is position a): gather
 * (positions from bk_elems on read as zeros) or scatter. */
static void z_move(struct loomFusion *f, size_t a, size_t b, float *buf, bool gather)
{
    if (gather && b > f->bk_elems) {
        size_t z0 = LOOM_MAX(a, f->bk_elems);
        memset(buf + (z0 - a), 0, (b - z0) * sizeof(float));
    }
    size_t n = z_ranges(f, a, b);
    for (size_t k = 0; k < n; k++) {
        const z_range_t *r = &f->zr[k];
        if (gather)
            memcpy(buf + (r->pos - a), r->ptr, r->len * sizeof(float));
        else
            memcpy(r->ptr, buf + (r->pos - a), r->len * sizeof(float));
    }
}

static void z_stats(struct loomFusion *f, size_t pos, const float *err, size_t nch)
{
    for (size_t c = 0; c < nch && pos + c * FUSE_CHUNK < f->bk_elems; c++) {
        f->z_relmax = LOOM_MAX(f->z_relmax, (double)err[c]);
        f->z_relsum += err[c];
        f->z_reln++;
    }
}

/* Bucket position of piece t, part l, shard m. */
static size_t z_pos(const struct loomFusion *f, uint64_t t, int l, int m)
{
    return (size_t)t * f->zP + ((size_t)l * (size_t)f->zM + (size_t)m) * f->zsh;
}

static int z_cpu_kind(const struct loomFusion *f, int i)
{
    static const int flat[] = {Z_PACK, Z_REDUCE, Z_DECODE};
    static const int hier[] = {Z_PACK, Z_SUMENC, Z_REDUCE, Z_DECODE, Z_UNPACK};
    return f->zS == 4 ? hier[i] : flat[i];
}

static int z_net_kind(const struct loomFusion *f, int i)
{
    static const int flat[] = {Z_A2A, Z_AG_X};
    static const int hier[] = {Z_RS_I, Z_A2A, Z_AG_X, Z_AG_I};
    return f->zS == 4 ? hier[i] : flat[i];
}

static int z_substeps(const struct loomFusion *f, int kind)
{
    int L = f->zL, M = f->zM;
    switch (kind) {
    case Z_PACK: return f->zS == 4 ? 0 : M; /* by node, RS_I reads the tensors itself */
    case Z_REDUCE: return M + 1;
    case Z_UNPACK: return L;
    default: return M; /* SUMENC, DECODE */
    }
}

/* CPU time of the calling thread (the progress thread): the codec's own cost, whatever share of
 * a core the thread got meanwhile. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The largest magnitude of each chunk of v (NaN left out, as fuse_decode's). */
static void chunk_maxabs(const float *v, size_t nch, float *out)
{
    for (size_t c = 0; c < nch; c++) {
        uint32_t mb = 0;
        for (size_t i = 0; i < FUSE_CHUNK; i++) {
            uint32_t b;
            memcpy(&b, &v[c * FUSE_CHUNK + i], sizeof(b));
            b &= 0x7fffffffu;
            b = b > 0x7f800000u ? 0 : b;
            mb = b > mb ? b : mb;
        }
        memcpy(&out[c], &mb, sizeof(mb));
    }
}

/* One sub-step (about one shard's work) of CPU stage `kind` of piece t. */
static void z_cpu(struct loomFusion *f, uint64_t t, int kind, int s)
{
    zslot_t *z = z_slot(f, t);
    int L = f->zL, M = f->zM, l = f->zl, n = f->zn, wire = f->cfg.wire;
    size_t sh = f->zsh, wb = z_wb(f), nch = sh / FUSE_CHUNK, part = (size_t)M * sh;
    uint64_t t0 = thread_cpu_ns();
    double *tm = &f->tm_enc;
    switch (kind) {
    case Z_PACK: { /* flat: shard s, gathered and encoded (mine kept as it is) */
        size_t a = (size_t)t * f->zP + (size_t)s * sh;
        if (s == n) {
            z_move(f, a, a + sh, z->mine, true);
            chunk_maxabs(z->mine, nch, z->mine_mag);
            for (size_t c = 0; c < nch; c++)
                z->mine_err[c] = 0;
            break;
        }
        float *v = z_direct(f, a, a + sh);
        if (v == NULL) z_move(f, a, a + sh, v = z->own, true);
        fuse_encode(wire, v, sh, sh, NULL, z->xs + (size_t)s * wb);
        break;
    }
    case Z_SUMENC: { /* shard s of my part: the node's sum, in local-rank order */
        /* the shard I reduce myself is summed straight into z->mine and stays float32 */
        float *acc = s == n ? z->mine : z->acc, *magsum = z->m;
        float *last = s == n ? z->mine_mag : z->e; /* the sum's magnitude: only mine's is kept */
        const float *own = z_direct(f, z_pos(f, t, l, s), z_pos(f, t, l, s) + sh);
        if (own == NULL) z_move(f, z_pos(f, t, l, s), z_pos(f, t, l, s) + sh, z->own, true);
        if (own == NULL) own = z->own;
        for (size_t c = 0; c < nch; c++)
            magsum[c] = 0;
        for (int j = 0; j < L; j++) {
            const float *in = j == l ? own : z->rin + (size_t)(j < l ? j : j - 1) * part + s * sh;
            if (j == 0) {
                memcpy(acc, in, sh * sizeof(float));
                continue;
            }
            /* each addition rounds by at most 2^-24 of its result: the largest partial sum of
             * each chunk, taken in the same pass (on the bits, NaN left out) */
            for (size_t c = 0; c < nch; c++) {
                const float *v = in + c * FUSE_CHUNK;
                float *d = acc + c * FUSE_CHUNK;
                uint32_t mb = 0;
                for (size_t i = 0; i < FUSE_CHUNK; i++) {
                    d[i] += v[i];
                    uint32_t b;
                    memcpy(&b, &d[i], sizeof(b));
                    b &= 0x7fffffffu;
                    b = b > 0x7f800000u ? 0 : b;
                    mb = b > mb ? b : mb;
                }
                float mx;
                memcpy(&mx, &mb, sizeof(mx));
                magsum[c] += mx;
                last[c] = mx;
            }
        }
        /* the float32 sum's rounding, 2^-23 of the partial sums' largest magnitudes (2^-24 of
         * the exact ones), travels with the encoding's own error */
        if (s == n) { /* kept in float32: its magnitude is the last partial sum's */
            for (size_t c = 0; c < nch; c++)
                z->mine_err[c] = 0x1p-23f * magsum[c];
            break;
        }
        uint8_t *out = z->xs + (size_t)s * wb;
        fuse_encode(wire, acc, sh, sh, NULL, out);
        for (size_t c = 0; c < nch; c++)
            fuse_set_chunk_err(out, c, fuse_chunk_err(out, c) + 0x1p-23f * magsum[c]);
        break;
    }
    case Z_REDUCE: {
        tm = &f->tm_red;
        if (s < M) { /* node s's shard into the sum (my own node's as it is, float32) */
            if (s == n) {
                if (s == 0)
                    memcpy(z->acc, z->mine, sh * sizeof(float));
                else
                    for (size_t i = 0; i < sh; i++)
                        z->acc[i] += z->mine[i];
                memcpy(z->e, z->mine_err, nch * sizeof(float));
                memcpy(z->m, z->mine_mag, nch * sizeof(float));
            } else {
                fuse_decode(wire, z->xr + (size_t)s * wb, sh, z->acc, s > 0, z->e, z->m);
            }
            for (size_t c = 0; c < nch; c++) {
                z->e_in[c] = (s > 0 ? z->e_in[c] : 0) + z->e[c];
                z->m_in[c] = (s > 0 ? z->m_in[c] : 0) + z->m[c];
            }
            break;
        }
        float div = f->bk_op == loomAvg ? (float)f->nranks : 1.0f;
        if (f->bk_op == loomAvg)
            for (size_t i = 0; i < sh; i++)
                z->acc[i] /= div;
        uint8_t *out = z->gr + (size_t)n * wb;
        fuse_encode(wire, z->acc, sh, sh, NULL, out);
        /* The chunk's relative error bound: what the inputs' encodings lost (each sender
         * measured its own, node sums with their float32 rounding), what the sum's encoding
         * lost, and float32 accumulation (M roundings of at most 2^-24 of the running
         * magnitude), over the chunk's magnitude scale, the sum of the inputs' largest
         * magnitudes (docs/fusion.md). */
        for (size_t c = 0; c < nch; c++) {
            double scale = z->m_in[c] / div;
            double bound = z->e_in[c] / div + fuse_chunk_err(out, c) + M * 0x1p-24 * scale;
            fuse_set_chunk_err(out, c, scale > 0 ? (float)(bound / scale) : 0.0f);
        }
        break;
    }
    case Z_DECODE: { /* node s's sum: shard s of my part, final, into the tensors */
        tm = &f->tm_dec;
        size_t a = z_pos(f, t, l, s);
        float *err = z->err + (size_t)l * M * nch + (size_t)s * nch;
        float *v = z_direct(f, a, a + sh);
        fuse_decode(wire, z->gr + (size_t)s * wb, sh, v ? v : z->own, false, err, NULL);
        if (v == NULL) z_move(f, a, a + sh, z->own, false);
        if (f->zS == 2) z_stats(f, a, err, nch);
        break;
    }
    case Z_UNPACK: /* hier: the local peers' parts are in the tensors; their error figures */
        tm = &f->tm_dec;
        z_stats(f, z_pos(f, t, s, 0), z->err + (size_t)s * M * nch, (size_t)M * nch);
        break;
    }
    *tm += (double)(thread_cpu_ns() - t0) * 1e-9;
}

static void z_op(struct loomFusion *f, int kind, int peer, void *buf, size_t bytes)
{
    if (grow((void **)&f->zops, &f->zopcap, (size_t)f->znops + 1, sizeof(*f->zops)) !=
        loomSuccess) {
        f->zr_fail = true;
        return;
    }
    f->zops[f->znops++] = (coll_op_t){.comm = f->comm,
                                      .kind = kind,
                                      .send = buf,
                                      .recv = buf,
                                      .count = bytes,
                                      .type = loomUint8,
                                      .op = loomSum,
                                      .root = peer};
}

/* Network stage `kind` of piece t: its point-to-point operations, appended to f->zops. */
static void z_net(struct loomFusion *f, uint64_t t, int kind)
{
    zslot_t *z = z_slot(f, t);
    int L = f->zL, M = f->zM, l = f->zl, n = f->zn;
    size_t sh = f->zsh, wb = z_wb(f), nch = sh / FUSE_CHUNK, part = (size_t)M * sh;
    switch (kind) {
    case Z_RS_I: {
        /* straight from and to the tensors' memory: one message per tensor range, split alike
         * on both sides (every rank holds the same bucket); padding is not sent */
        size_t mine = z_pos(f, t, l, 0);
        for (int j = 0; j < L; j++) {
            if (j == l) continue;
            size_t n = z_ranges(f, z_pos(f, t, j, 0), z_pos(f, t, j, 0) + part);
            for (size_t k = 0; k < n; k++)
                z_op(f, OPK_SEND, f->zlocal[j], f->zr[k].ptr, f->zr[k].len * sizeof(float));
            float *in = z->rin + (size_t)(j < l ? j : j - 1) * part;
            if (mine + part > f->bk_elems) {
                size_t z0 = LOOM_MAX(mine, f->bk_elems);
                memset(in + (z0 - mine), 0, (mine + part - z0) * sizeof(float));
            }
            n = z_ranges(f, mine, mine + part);
            for (size_t k = 0; k < n; k++)
                z_op(f, OPK_RECV, f->zlocal[j], in + (f->zr[k].pos - mine),
                     f->zr[k].len * sizeof(float));
        }
        break;
    }
    case Z_A2A:
    case Z_AG_X:
        for (int m = 0; m < M; m++) {
            if (m == n) continue;
            if (kind == Z_A2A) {
                z_op(f, OPK_SEND, f->zcross[m], z->xs + (size_t)m * wb, wb);
                z_op(f, OPK_RECV, f->zcross[m], z->xr + (size_t)m * wb, wb);
            } else {
                z_op(f, OPK_SEND, f->zcross[m], z->gr + (size_t)n * wb, wb);
                z_op(f, OPK_RECV, f->zcross[m], z->gr + (size_t)m * wb, wb);
            }
        }
        break;
    case Z_AG_I: {
        /* my part's final values (DECODE put them in the tensors), and the peers', straight
         * from and into the tensors */
        size_t mine = z_pos(f, t, l, 0);
        for (int j = 0; j < L; j++) {
            if (j == l) continue;
            size_t n = z_ranges(f, mine, mine + part);
            for (size_t k = 0; k < n; k++)
                z_op(f, OPK_SEND, f->zlocal[j], f->zr[k].ptr, f->zr[k].len * sizeof(float));
            z_op(f, OPK_SEND, f->zlocal[j], z->err + (size_t)l * M * nch, M * nch * sizeof(float));
            n = z_ranges(f, z_pos(f, t, j, 0), z_pos(f, t, j, 0) + part);
            for (size_t k = 0; k < n; k++)
                z_op(f, OPK_RECV, f->zlocal[j], f->zr[k].ptr, f->zr[k].len * sizeof(float));
            z_op(f, OPK_RECV, f->zlocal[j], z->err + (size_t)j * M * nch, M * nch * sizeof(float));
        }
        break;
    }
    }
}

/* Group u: starts its network stages and sets up its CPU stages. */
static loomResult_t z_group(struct loomFusion *f)
{
    int64_t u = f->zu, K = (int64_t)f->zK;
    f->znops = 0;
    for (int i = 0; i < f->zS; i++) {
        int64_t t = u - 2 * i;
        if (t >= 0 && t < K) z_net(f, (uint64_t)t, z_net_kind(f, i));
    }
    f->zi = 0;
    f->zsub = 0;
    if (f->zr_fail)
        return base_error(loomSystemError, LOG_COLL,
                          "loomFusion: out of memory (bucket %llu, compressed pipeline)",
                          (unsigned long long)f->st.buckets);
    if (f->znops == 0) return loomSuccess;
    return start_ops(f, f->zops, f->znops);
}

/* The next CPU sub-step of group u, if any is left (false: all done). */
static bool z_cpu_next(struct loomFusion *f)
{
    int64_t K = (int64_t)f->zK;
    for (; f->zi <= f->zS; f->zi++, f->zsub = 0) {
        int64_t t = f->zu - 2 * f->zi + 1;
        if (t < 0 || t >= K) continue;
        int kind = z_cpu_kind(f, f->zi);
        if (f->zsub < z_substeps(f, kind)) {
            z_cpu(f, (uint64_t)t, kind, f->zsub++);
            return true;
        }
    }
    return false;
}

/* Compressed bucket agreed: cut it into pieces and start the pipeline. */
static loomResult_t z_start(struct loomFusion *f)
{
    LOOM_CHECK(z_init(f));
    size_t LM = (size_t)f->zL * (size_t)f->zM;
    size_t piece = LOOM_MAX(param_size(PARAM_FUSION_WIRE_PIECE) / FUSE_CHUNK, 1) * FUSE_CHUNK;
    size_t per = (f->bk_elems + LM - 1) / LM;
    f->zsh = LOOM_MIN(piece, (per + FUSE_CHUNK - 1) / FUSE_CHUNK * FUSE_CHUNK);
    f->zP = LM * f->zsh;
    f->zK = (f->bk_elems + f->zP - 1) / f->zP;
    LOOM_CHECK(z_buffers(f));
    f->zr_fail = false;
    LOOM_CHECK(grow((void **)&f->bkoff, &f->bkoffcap, f->nbk, sizeof(*f->bkoff)));
    LOOM_CHECK(grow((void **)&f->zops, &f->zopcap, (size_t)f->zS * 4 * LOOM_MAX(f->zL, f->zM),
                    sizeof(*f->zops)));
    size_t off = 0;
    for (size_t k = 0; k < f->nbk; k++) {
        f->bkoff[k] = off;
        off += f->bk[k].d.len;
    }
    f->z_relmax = f->z_relsum = 0;
    f->z_reln = 0;
    f->tm_enc = f->tm_red = f->tm_dec = 0;
    f->t_bucket = base_now_ns();
    f->zu = -1;
    f->state = ST_Z_PIPE;
    return z_group(f);
}

/* The progress thread's turn while a compressed bucket runs. */
static uint64_t z_poll(struct loomFusion *f, bool *progressed)
{
    if (f->g) {
        bool done = false, moved = false;
        loomResult_t r = coll_advance(f->g, &done, &moved);
        *progressed |= moved;
        if (done) {
            f->g = NULL;
            *progressed = true;
            if (r != loomSuccess) {
                char text[FZ_TEXT];
                snprintf(text, sizeof(text),
                         "loomFusion: bucket %llu (the compressed pipeline, group %lld of %llu) "
                         "failed: %s",
                         (unsigned long long)f->st.buckets, (long long)f->zu,
                         (unsigned long long)(f->zK + 2 * (uint64_t)f->zS - 1), base_last_error());
                f->state = ST_IDLE;
                fz_fail(f, r, text);
                return UINT64_MAX;
            }
        }
    }
    if (z_cpu_next(f)) {
        *progressed = true;
        return 0;
    }
    if (f->g) return 0;
    /* group u is through, on the wire and in the codec */
    f->zu++;
    *progressed = true;
    if (f->zu > (int64_t)f->zK + 2 * f->zS - 2) {
        bucket_done(f);
        return 0;
    }
    loomResult_t r = z_group(f);
    if (r != loomSuccess) {
        f->state = ST_IDLE;
        fz_fail(f, r, base_last_error());
        return UINT64_MAX;
    }
    return 0;
}

/* Bucket [start, cut) agreed and verified: copy its segments out and start it. */
static loomResult_t start_bucket(struct loomFusion *f)
{
    size_t n = (size_t)(f->cut - f->start);
    LOOM_CHECK(grow((void **)&f->bk, &f->bkcap, n, sizeof(*f->bk)));
    pthread_mutex_lock(&f->lock);
    memcpy(f->bk, &f->segs[f->start - f->base], n * sizeof(*f->bk));
    uint64_t tag = digest_at(f, f->cut) | 1;
    pthread_mutex_unlock(&f->lock);
    f->nbk = n;
    f->bk_type = (loomDataType_t)f->bk[0].d.type;
    f->bk_op = (loomRedOp_t)f->bk[0].d.op;
    f->bk_elems = 0;
    for (size_t k = 0; k < n; k++)
        f->bk_elems += f->bk[k].d.len;
    size_t es = red_type_size(f->bk_type), bytes = f->bk_elems * es;
    (void)loomCommGetStats(f->comm, &f->cs0);
    coll_op_t o = {.comm = f->comm,
                   .kind = OPK_ALLREDUCE,
                   .count = f->bk_elems,
                   .type = f->bk_type,
                   .op = f->bk_op,
                   .root = -1,
                   .tag = tag};
    /* Segments that lie back to back in memory (a large tensor's, or a framework's flat
     * gradient buffer) are reduced where they are: no copy in, no copy out. */
    f->bk_inplace = true;
    for (size_t k = 0; k + 1 < n && f->bk_inplace; k++)
        f->bk_inplace = seg_ptr(&f->bk[k], es) + f->bk[k].d.len * es == seg_ptr(&f->bk[k + 1], es);
#ifdef LOOM_HAVE_CUDA
    if (f->dev) { /* ordered on the context's stream by its launcher (fusion_dev.h) */
        fzd_seg_t *v = fzd_segs(f->dev, n);
        if (v == NULL) return base_error(loomSystemError, LOG_COLL, "loomFusion: out of memory");
        for (size_t k = 0; k < n; k++) {
            const fz_seg_t *s = &f->bk[k];
            v[k] = (fzd_seg_t){.ptr = seg_ptr(s, es),
                               .bytes = s->d.len * es,
                               .ev = s->t->ev,
                               .first = s->d.off == 0,
                               .last = s->d.off + s->d.len == s->d.count};
        }
        f->state = ST_DEV;
        fzd_submit(f->dev, n, f->bk_elems, f->bk_type, f->bk_op, f->bk_inplace);
        return loomSuccess;
    }
#endif
    if (!compressed(f)) {
        void *buf;
        if (f->bk_inplace) {
            buf = seg_ptr(&f->bk[0], es);
        } else {
            LOOM_CHECK(grow((void **)&f->stage, &f->stage_cap, bytes, 1));
            pack(f, f->stage);
            buf = f->stage;
        }
        o.send = o.recv = buf;
        f->state = ST_DATA;
        return start_ops(f, &o, 1);
    }
    return z_start(f);
}

/* The bucket's values are in place (exact) or gathered (compressed): finish its tensors. */
static void bucket_done(struct loomFusion *f)
{
    size_t es = red_type_size(f->bk_type);
    if (f->state == ST_DATA && !f->bk_inplace) unpack(f, f->stage);
    loomStats_t cs = f->cs0;
    (void)loomCommGetStats(f->comm, &cs);
    pthread_mutex_lock(&f->lock);
    f->st.buckets++;
    f->st.segments += f->nbk;
    f->st.bytes += f->bk_elems * es;
    f->st.wireBytes += cs.bytes_sent - f->cs0.bytes_sent;
    if (f->cut_flags & FZ_FULL)
        f->st.fullCuts++;
    else if (f->cut_flags & FZ_FLUSH)
        f->st.flushCuts++;
    else
        f->st.timerCuts++;
    if (f->state == ST_Z_PIPE) {
        f->st.compressedSeconds += (double)(base_now_ns() - f->t_bucket) * 1e-9;
        f->st.encodeSeconds += f->tm_enc;
        f->st.reduceSeconds += f->tm_red;
        f->st.decodeSeconds += f->tm_dec;
        f->st.compressedBuckets++;
        f->st.maxRelError = LOOM_MAX(f->st.maxRelError, f->z_relmax);
        f->rel_sum += f->z_relsum;
        f->rel_n += f->z_reln;
        f->st.meanRelError = f->rel_n ? f->rel_sum / (double)f->rel_n : 0;
    }
    for (size_t k = 0; k < f->nbk; k++) {
        struct loomFusionTensor *t = f->bk[k].t;
        if (++t->segs_done == t->nseg) finish_tensor_locked(f, t, loomSuccess);
    }
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    f->start = f->cut;
    f->step_buckets++;
    f->state = ST_IDLE;
}

static loomResult_t advance_state(struct loomFusion *f)
{
    switch (f->state) {
    case ST_ROUND:
    case ST_VERIFY: return after_round(f);
    case ST_DIAG: return after_diag(f);
    case ST_DATA: bucket_done(f); return loomSuccess;
    default: return loomSuccess;
    }
}

static uint64_t fz_poll(void *arg, bool *progressed)
{
    struct loomFusion *f = arg;
    log_set_rank(f->rank);
    if (f->state == ST_Z_PIPE) {
        uint64_t sleep = z_poll(f, progressed);
        if (f->state != ST_IDLE || sleep == UINT64_MAX) return sleep;
        return maybe_round(f, progressed);
    }
#ifdef LOOM_HAVE_CUDA
    if (f->state == ST_DEV) {
        loomResult_t r;
        char text[FZ_TEXT];
        if (!fzd_done(f->dev, &r, text, sizeof(text))) return UINT64_MAX; /* it wakes us */
        *progressed = true;
        if (r != loomSuccess) {
            char why[FZ_TEXT + 64];
            snprintf(why, sizeof(why), "loomFusion: bucket %llu (device) failed: %s",
                     (unsigned long long)f->st.buckets, text);
            f->state = ST_IDLE;
            fz_fail(f, r, why);
            return UINT64_MAX;
        }
        bucket_done(f);
        return maybe_round(f, progressed);
    }
#endif
    if (f->g) {
        bool done = false, moved = false;
        loomResult_t r = coll_advance(f->g, &done, &moved);
        *progressed |= moved;
        if (!done) return 0;
        f->g = NULL;
        *progressed = true;
        if (r != loomSuccess) {
            /* the network's failure, said in the context's terms */
            static const char *const what[] = {"",
                                               "the agreement round",
                                               "the digest round",
                                               "the mismatch report",
                                               "the allreduce",
                                               "the compressed pipeline",
                                               "the device bucket"};
            char text[FZ_TEXT];
            snprintf(text, sizeof(text), "loomFusion: bucket %llu (%s) failed: %s",
                     (unsigned long long)f->st.buckets, what[f->state], base_last_error());
            f->state = ST_IDLE;
            fz_fail(f, r, text);
            return UINT64_MAX;
        }
        r = advance_state(f);
        if (r != loomSuccess) {
            f->state = ST_IDLE;
            fz_fail(f, r, base_last_error());
            return UINT64_MAX;
        }
        if (f->g) return 0;
    }
    if (f->state != ST_IDLE) return UINT64_MAX;
    return maybe_round(f, progressed);
}

/* ---- the public calls ---- */

static loomResult_t check_ctx(loomFusion_t f, const char *fn)
{
    if (f == NULL) return base_error(loomInvalidArgument, LOG_COLL, "%s: fusion is NULL", fn);
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomFusionCreate(loomFusion_t *out, loomComm_t comm,
                                          const loomFusionConfig_t *config)
{
    const char *fn = "loomFusionCreate";
    base_clear_error();
    if (out == NULL) return base_error(loomInvalidArgument, LOG_COLL, "%s: fusion is NULL", fn);
    loomFusionConfig_t c = LOOM_FUSION_CONFIG_INITIALIZER;
    if (config) {
        if (config->magic != LOOM_FUSION_CONFIG_MAGIC || config->size < 3 * sizeof(size_t))
            return base_error(loomInvalidArgument, LOG_COLL,
                              "%s: config is not a loomFusionConfig_t (magic %#x, size %zu): "
                              "start from LOOM_FUSION_CONFIG_INITIALIZER",
                              fn, config->magic, config->size);
        memcpy(&c, config, LOOM_MIN(config->size, sizeof(c)));
        c.size = sizeof(c);
        c.version = LOOM_FUSION_CONFIG_VERSION;
    }
    /* zero sizes: LOOM_FUSION_BUCKET/SEGMENT when set, else the tuning file's (loom-tune
     * --fusion; every rank read the same file or none), else the defaults */
    uint64_t tuned_bucket, tuned_segment;
    coll_fusion_sizes(comm, false, &tuned_bucket, &tuned_segment);
    bool tuned_b = c.bucketBytes == 0, tuned_s = c.segmentBytes == 0;
    if (c.bucketBytes == 0) c.bucketBytes = tuned_bucket;
    if (c.firstBucketBytes == 0) c.firstBucketBytes = param_size(PARAM_FUSION_FIRST_BUCKET);
    if (c.segmentBytes == 0) c.segmentBytes = tuned_segment;
    if (c.cycleUs == 0) c.cycleUs = (uint64_t)param_int(PARAM_FUSION_CYCLE_US);
    if (c.wire == loomFusionWireExact) {
        const char *w = param_str(PARAM_FUSION_WIRE);
        c.wire = strcmp(w, "bf16") == 0   ? loomFusionWireBf16
                 : strcmp(w, "fp16") == 0 ? loomFusionWireFp16
                                          : loomFusionWireExact;
    }
    if (c.wire < 0 || c.wire >= loomFusionNumWires)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "%s: wire format %d (expected exact 0, bf16 1, fp16 2)", fn, c.wire);
    /* The exact wire allreduces each bucket with the communicator's collectives, whose result
     * is element-wise (the same wherever a tensor lands in a bucket); the 16-bit wires scale
     * each chunk of 256 values of a bucket by a power of two of its own, so a value's rounding
     * depends on its neighbours in the bucket, which depend on timing. */
    if (c.wire != loomFusionWireExact && coll_deterministic(comm))
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: LOOM_DETERMINISTIC=1 and the %s wire: a 16-bit wire rounds each "
                          "chunk of a bucket by a scale of its own, so a tensor's result depends "
                          "on its bucket; use the exact wire (loomFusionWireExact, "
                          "LOOM_FUSION_WIRE unset) or unset LOOM_DETERMINISTIC",
                          fn, c.wire == loomFusionWireBf16 ? "bf16" : "fp16");
    c.segmentBytes = LOOM_MIN(c.segmentBytes, c.bucketBytes);
    LOOM_CHECK(coll_hold(comm, fn));
    struct loomFusion *f = calloc(1, sizeof(*f));
    if (f) f->recs = calloc((size_t)coll_nranks(comm), sizeof(*f->recs));
    if (f == NULL || f->recs == NULL) {
        if (f) free(f);
        coll_drop(comm);
        return base_error(loomSystemError, LOG_COLL, "%s: out of memory", fn);
    }
    f->comm = comm;
    f->tuned_bucket = tuned_b;
    f->tuned_segment = tuned_s;
    f->rank = coll_rank(comm);
    f->nranks = coll_nranks(comm);
    f->cfg = c;
    f->cycle_ns = c.cycleUs == LOOM_FUSION_NEVER || c.cycleUs > UINT64_MAX / 1000
                      ? UINT64_MAX
                      : c.cycleUs * 1000;
    f->h_base = 0x6c6f6f6d66757365ull;
    f->mem = FZ_MEM_UNSET;
    f->ttail = &f->thead;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    loomResult_t r = progress_attach(fz_poll, f, coll_spin_ns(comm), coll_hot_ns(comm));
    if (r != loomSuccess) {
        free(f->recs);
        free(f);
        coll_drop(comm);
        return r;
    }
    f->attached = true;
    INFO(LOG_COLL,
         "fusion context %p: buckets of %zu bytes (first %zu), segments of %zu, cycle %llu us, "
         "wire %s",
         (void *)f, c.bucketBytes, c.firstBucketBytes, c.segmentBytes,
         (unsigned long long)c.cycleUs,
         c.wire == 0   ? "exact"
         : c.wire == 1 ? "bf16"
                       : "fp16");
    *out = f;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomFusionGetConfig(loomFusion_t f, loomFusionConfig_t *config)
{
    LOOM_CHECK(check_ctx(f, "loomFusionGetConfig"));
    if (config == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "loomFusionGetConfig: config is NULL");
    *config = f->cfg;
    return loomSuccess;
}

/* A tensor's memory against its context's (lock held): the first tensor with values fixes it
 * (and a device one opens the device side, collective over the communicator when its device
 * executor is not set up yet); every later one must be of the same kind. */
/* Called and returns with f->lock held (released while a first device tensor sets up). */
static loomResult_t tensor_memory(struct loomFusion *f, const char *fn, uint64_t id, void *buff,
                                  mem_type_t mt, int ord, cudaStream_t stream)
{
    static const char *const kind[] = {"host", "CUDA device", "CUDA managed"};
    unsigned long long tid = (unsigned long long)id;
    if (mt == MEM_MANAGED)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: tensor %llu: %p is CUDA managed memory, which loom does not move "
                          "(use device or host memory)",
                          fn, tid, buff);
    if (mt == MEM_HOST && stream != NULL)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: tensor %llu: %p is host memory but a stream was given (a stream "
                          "orders device tensors only)",
                          fn, tid, buff);
    if (f->mem != FZ_MEM_UNSET) {
        if ((int)mt == f->mem) return loomSuccess;
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: tensor %llu: %p is %s memory, but this context's tensors are %s "
                          "memory (its first tensor's); use one context per kind of memory",
                          fn, tid, buff, kind[mt], kind[f->mem]);
    }
    if (mt == MEM_DEVICE) {
#ifdef LOOM_HAVE_CUDA
        if (f->cfg.wire != loomFusionWireExact)
            return base_error(loomInvalidUsage, LOG_COLL,
                              "%s: tensor %llu: %p is CUDA device memory and the context's wire "
                              "is %s: the 16-bit wires encode on the host, so device tensors "
                              "travel exact (loomFusionWireExact)",
                              fn, tid, buff, f->cfg.wire == loomFusionWireBf16 ? "bf16" : "fp16");
        /* The first device tensor sets the device side up, collectively over the communicator
         * (it may wait for peers and for the progress thread): not under the context's lock. */
        /* sizes the config left to the tuning: the tuning file's for device memory (no tensor
         * is cut yet; every rank reads the same file and sees the same first tensor's memory) */
        uint64_t tb, ts;
        coll_fusion_sizes(f->comm, true, &tb, &ts);
        if (f->tuned_bucket) f->cfg.bucketBytes = tb;
        if (f->tuned_segment) f->cfg.segmentBytes = ts;
        f->cfg.segmentBytes = LOOM_MIN(f->cfg.segmentBytes, f->cfg.bucketBytes);
        size_t stage = LOOM_MAX(f->cfg.bucketBytes, f->cfg.firstBucketBytes);
        fzd_t *dev = NULL;
        pthread_mutex_unlock(&f->lock);
        loomResult_t r = fzd_open(f->comm, buff, ord, stage, &dev);
        pthread_mutex_lock(&f->lock);
        LOOM_CHECK(r);
        if (f->mem != FZ_MEM_UNSET) { /* another thread's first tensor was set meanwhile */
            fzd_close(dev);
            return tensor_memory(f, fn, id, buff, mt, ord, stream);
        }
        f->dev = dev;
#else
        (void)ord;
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: tensor %llu: %p is CUDA device memory, and this build of loom has "
                          "no device executor (it was built without the CUDA toolkit)",
                          fn, tid, buff);
#endif
    }
    f->mem = (int)mt;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomFusionEnqueue(loomFusion_t f, void *buff, size_t count,
                                           loomDataType_t type, loomRedOp_t op, uint64_t id,
                                           cudaStream_t stream, loomFusionCallback_t cb,
                                           void *cb_arg, loomFusionHandle_t *handle)
{
    const char *fn = "loomFusionEnqueue";
    base_clear_error();
    LOOM_CHECK(check_ctx(f, fn));
    if ((int)type < 0 || type >= loomNumTypes)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: tensor %llu: invalid datatype %d", fn,
                          (unsigned long long)id, (int)type);
    size_t es = red_type_size(type), bytes;
    if (__builtin_mul_overflow(count, es, &bytes) || bytes > (size_t)INT64_MAX)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "%s: tensor %llu: count %zu overflows the address space", fn,
                          (unsigned long long)id, count);
    if (count > 0 && buff == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "%s: tensor %llu: buff is NULL", fn,
                          (unsigned long long)id);
    int ord = -1;
    mem_type_t mt = MEM_HOST;
    if (count > 0) {
#ifdef LOOM_HAVE_CUDA
        mt = mem_type_dev(buff, &ord);
#else
        mt = mem_type_of(buff);
#endif
    }
    pthread_mutex_lock(&f->lock);
    loomResult_t r = f->err;
    if (r != loomSuccess) {
        pthread_mutex_unlock(&f->lock);
        return fz_error(f);
    }
    if (count > 0 && (r = tensor_memory(f, fn, id, buff, mt, ord, stream)) != loomSuccess) {
        pthread_mutex_unlock(&f->lock);
        return r;
    }
    if ((r = coll_usable(f->comm, fn)) != loomSuccess ||
        (r = coll_check_op(f->comm, fn, op, type)) != loomSuccess) {
        pthread_mutex_unlock(&f->lock);
        return r;
    }
    if (!f->claimed) {
        r = coll_claim(f->comm, f, "loomFusion (tensors in flight until loomFusionWaitAll)");
        if (r != loomSuccess) {
            pthread_mutex_unlock(&f->lock);
            return r;
        }
        f->claimed = true;
    }
    size_t seg = LOOM_MAX(f->cfg.segmentBytes / es, 1);
    uint64_t nseg = count == 0 ? 0 : (count + seg - 1) / seg;
    struct loomFusionTensor *t = calloc(1, sizeof(*t));
    if (t == NULL ||
        grow((void **)&f->segs, &f->segcap, f->nsegs + nseg, sizeof(*f->segs)) != loomSuccess) {
        free(t);
        pthread_mutex_unlock(&f->lock);
        return base_error(loomSystemError, LOG_COLL, "%s: tensor %llu: out of memory", fn,
                          (unsigned long long)id);
    }
    *t = (struct loomFusionTensor){.f = f,
                                   .buf = buff,
                                   .count = count,
                                   .type = type,
                                   .op = op,
                                   .id = id,
                                   .cb = cb,
                                   .arg = cb_arg,
                                   .pos = f->step_tensors++,
                                   .nseg = nseg,
                                   .stream = stream};
#ifdef LOOM_HAVE_CUDA
    if (f->dev && nseg && (r = fzd_tensor(f->dev, stream, &t->ev)) != loomSuccess) {
        free(t);
        pthread_mutex_unlock(&f->lock);
        return r;
    }
#endif
    *f->ttail = t;
    f->ttail = &t->next;
    f->pending++;
    uint64_t now = base_now_ns(), h = digest_at(f, f->base + f->nsegs);
    for (uint64_t k = 0; k < nseg; k++) {
        fz_seg_t *s = &f->segs[f->nsegs++];
        s->t = t;
        s->d = (fuse_segdesc_t){.id = id,
                                .count = count,
                                .off = k * seg,
                                .len = LOOM_MIN(seg, count - k * seg),
                                .type = (uint32_t)type,
                                .op = (uint32_t)op};
        h = s->h = fuse_chain(h, &s->d);
        s->t_enq = now;
    }
    if (nseg == 0) finish_tensor_locked(f, t, loomSuccess);
    pthread_mutex_unlock(&f->lock);
    if (handle) *handle = t;
    if (nseg) progress_wake();
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomFusionFlush(loomFusion_t f)
{
    LOOM_CHECK(check_ctx(f, "loomFusionFlush"));
    pthread_mutex_lock(&f->lock);
    f->flush_to = f->base + f->nsegs;
    loomResult_t r = f->err;
    pthread_mutex_unlock(&f->lock);
    progress_wake();
    return r == loomSuccess ? loomSuccess : fz_error(f);
}

LOOM_EXPORT loomResult_t loomFusionTest(loomFusionHandle_t h, int *done)
{
    if (h == NULL || done == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "loomFusionTest: NULL handle or done");
    *done = atomic_load(&h->done);
    if (!*done) return loomSuccess;
    if (h->res != loomSuccess) return fz_error(h->f);
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomFusionWait(loomFusionHandle_t h)
{
    if (h == NULL) return base_error(loomInvalidArgument, LOG_COLL, "loomFusionWait: NULL handle");
    struct loomFusion *f = h->f;
    pthread_mutex_lock(&f->lock);
    /* the tensor's bucket may need a flush to leave (its rank's timer does it too) */
    while (!atomic_load(&h->done))
        pthread_cond_wait(&f->cond, &f->lock);
    pthread_mutex_unlock(&f->lock);
    if (h->res != loomSuccess) return fz_error(f);
#ifdef LOOM_HAVE_CUDA
    /* a device tensor: its stream waits for the bucket that finished it */
    if (h->ev) return fzd_wait_tensor(f->dev, h->ev, h->stream);
#endif
    return loomSuccess;
}

/* Frees the step's tensors and segments (lock held; all finished). */
static void step_reset_locked(struct loomFusion *f)
{
    for (struct loomFusionTensor *t = f->thead, *n; t; t = n) {
        n = t->next;
#ifdef LOOM_HAVE_CUDA
        if (t->ev) fzd_tensor_free(f->dev, t->ev);
#endif
        free(t);
    }
    f->thead = NULL;
    f->ttail = &f->thead;
    if (f->nsegs) f->h_base = f->segs[f->nsegs - 1].h;
    f->base += f->nsegs;
    f->nsegs = 0;
    f->step_tensors = 0;
}

LOOM_EXPORT loomResult_t loomFusionWaitAll(loomFusion_t f)
{
    base_clear_error();
    LOOM_CHECK(check_ctx(f, "loomFusionWaitAll"));
    pthread_mutex_lock(&f->lock);
    f->flush_to = f->base + f->nsegs;
    f->waiting = true;
    f->step_done = false;
    pthread_mutex_unlock(&f->lock);
    progress_wake();
    pthread_mutex_lock(&f->lock);
    while (!f->step_done && f->err == loomSuccess)
        pthread_cond_wait(&f->cond, &f->lock);
    f->waiting = false;
    f->step_done = false;
    loomResult_t r = f->err;
#ifdef LOOM_HAVE_CUDA
    /* device tensors: their streams wait for the step's last bucket (each stream once) */
    for (struct loomFusionTensor *t = f->thead; t && r == loomSuccess; t = t->next) {
        if (t->ev == NULL) continue;
        bool seen = false;
        for (struct loomFusionTensor *u = f->thead; u != t && !seen; u = u->next)
            seen = u->ev && u->stream == t->stream;
        if (!seen) r = fzd_wait_all(f->dev, t->stream);
    }
    loomResult_t werr = r == f->err ? loomSuccess : r; /* the stream wait's own */
    if (werr != loomSuccess) r = f->err;
#endif
    if (r == loomSuccess) step_reset_locked(f);
    /* a failed context runs nothing more: the communicator is the caller's again */
    if (f->claimed) coll_unclaim(f->comm, f);
    f->claimed = false;
    pthread_mutex_unlock(&f->lock);
#ifdef LOOM_HAVE_CUDA
    if (werr != loomSuccess) return werr;
#endif
    return r == loomSuccess ? loomSuccess : fz_error(f);
}

LOOM_EXPORT loomResult_t loomFusionGetStats(loomFusion_t f, loomFusionStats_t *stats)
{
    LOOM_CHECK(check_ctx(f, "loomFusionGetStats"));
    if (stats == NULL)
        return base_error(loomInvalidArgument, LOG_COLL, "loomFusionGetStats: stats is NULL");
    pthread_mutex_lock(&f->lock);
    *stats = f->st;
    pthread_mutex_unlock(&f->lock);
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomFusionDestroy(loomFusion_t f)
{
    if (f == NULL) return loomSuccess;
    pthread_mutex_lock(&f->lock);
    bool busy = f->pending > 0 && f->err == loomSuccess;
    pthread_mutex_unlock(&f->lock);
    if (busy) (void)loomFusionWaitAll(f);
    if (f->attached) progress_detach(f);
#ifdef LOOM_HAVE_CUDA
    fzd_close(f->dev); /* after the bucket it runs; waits for the context's stream */
#endif
    /* a group can still run only when the context failed outside a round: drive it out */
    while (f->g) {
        bool done = false;
        (void)coll_test(f->g, &done);
        if (done) f->g = NULL;
    }
    pthread_mutex_lock(&f->lock);
    for (struct loomFusionTensor *t = f->thead; t; t = t->next)
        finish_tensor_locked(f, t, loomInvalidUsage);
    step_reset_locked(f);
    if (f->claimed) coll_unclaim(f->comm, f);
    pthread_mutex_unlock(&f->lock);
    coll_drop(f->comm);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->cond);
    free(f->segs);
    free(f->recs);
    free(f->bk);
    free(f->diag);
    free(f->stage);
    z_free(f);
    free(f->zops);
    free(f);
    return loomSuccess;
}
