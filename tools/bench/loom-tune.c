/*
 * loom-tune: measures and writes the tuning file (src/core/tunefile.h) that loom reads at init
 * through LOOM_TUNE_FILE, for the communicator it runs on (its size, layout, memory type).
 *
 *   loom-tune --fusion [-m MODEL]   searches the fusion bucket threshold and segment size over a
 *                                   replayed step of MODEL (data/fusion), coarse to fine
 *                                   (src/tune/search.h), and writes fusion_threshold and
 *                                   fusion_segment (under mem=host, or with --mem device on
 *                                   GPU tensors under mem=device)
 *   loom-tune --model               measures alpha (seconds per message) and beta (seconds per
 *                                   byte) of each transport and level it can reach (shm inside a
 *                                   node, tcp inside a node, tcp across nodes) by timed
 *                                   ping-pong between rank 0 and a peer at a sweep of sizes,
 *                                   powers of 4 first, then powers of 2 around the knee
 *                                   (alpha/beta) until the fit moves less than the noise, and
 *                                   gamma (seconds per byte reduced) by timing the host's float
 *                                   sum; writes alpha.TP.LEVEL, beta.TP.LEVEL and gamma
 *   loom-tune --algos [-b MIN] [-e MAX]
 *                                   times every allreduce algorithm automatic selection could
 *                                   take on this communicator (float sum, out of place), all of
 *                                   them interleaved at each size, powers of 4 from MIN to MAX
 *                                   first, then powers of 2 and of 2^(1/2) between sizes whose
 *                                   winners differ (the two winners only), until the winner's
 *                                   lead falls under the noise measured; writes allreduce_algos,
 *                                   the measured winners by size, which selection takes before
 *                                   the model
 * All print the table of what they tried. Ranks: -P k forks k local ranks, otherwise a
 * launcher's (mpirun: loomCommInitFromEnv).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "param.h"
#include "ranks.h"
#include "reduce.h"
#include "registry.h"
#include "replay.h"
#include "search.h"
#include "tunefile.h"

typedef struct {
    bool fusion, model, algos;
    uint64_t min_bytes, max_bytes; /* --algos */
    bool dev; /* --mem device: the fusion search on GPU memory, written to the mem=device key */
    const char *model_name;
    const char *out;
    int reps;
} opts_t;

/* ---- fusion ---------------------------------------------------------------------------- */

typedef struct {
    replay_t *r;
} fusion_arg_t;

static double fusion_cost(void *arg, const uint64_t *v)
{
    fusion_arg_t *a = arg;
    loomFusion_t fx = replay_fusion(a->r, v[0], 0, v[1], 0, loomFusionWireExact);
    if (!fx) return -1;
    double t = replay_step(a->r, REPLAY_FUSED, fx, false);
    if (loomFusionDestroy(fx) != loomSuccess) return -1;
    return t;
}

static int tune_fusion(loomComm_t comm, int rank, const opts_t *o, tune_entry_t *e)
{
    replay_model_t m;
    char err[512];
    if (replay_load(o->model_name, &m, err, sizeof(err)) != 0) {
        if (rank == 0) fprintf(stderr, "loom-tune: %s\n", err);
        return 2;
    }
    replay_t r;
    if (replay_init(&r, comm, &m, 0, o->dev) != 0) {
        fprintf(stderr, "loom-tune: rank %d: %s\n", rank, r.err);
        return 2;
    }
    loomFusion_t def = replay_fusion(&r, 0, 0, 0, 0, loomFusionWireExact);
    loomFusionConfig_t c = LOOM_FUSION_CONFIG_INITIALIZER;
    if (!def || loomFusionGetConfig(def, &c) != loomSuccess || loomFusionDestroy(def)) {
        fprintf(stderr, "loom-tune: %s\n", r.err);
        return 2;
    }
    uint64_t bytes = (uint64_t)m.total * 4;
    uint64_t hi = bytes < (256u << 20) ? (bytes + 4095) / 4096 * 4096 : 256u << 20;
    tune_search_t s = {.ndims = 2,
                       .reps = o->reps,
                       .dims = {{"bucket", 64 << 10, hi, c.bucketBytes, 4096},
                                {"segment", 64 << 10, hi, c.segmentBytes, 4096, 1}}};
    if (rank == 0) {
        printf("# loom-tune --fusion: model %s (%d tensors, %.1f MB, %s memory), default bucket "
               "%zu, segment %zu; %d repetitions per point\n",
               m.name, m.n, (double)bytes / 1e6, o->dev ? "device" : "host", c.bucketBytes,
               c.segmentBytes, o->reps);
        fflush(stdout);
    }
    fusion_arg_t a = {&r};
    int rc = tune_search_run(&s, fusion_cost, &a) == 0 ? 0 : 2;
    if (rc) fprintf(stderr, "loom-tune: %s\n", r.err);
    if (r.wrong) {
        fprintf(stderr, "loom-tune: rank %d: %llu elements were not the exact sum\n", rank,
                (unsigned long long)r.wrong);
        rc = 1;
    }
    if (rank == 0 && rc == 0) tune_search_print(&s, stdout);
    e->fusion_threshold = s.best[0];
    e->fusion_segment = s.best[1];
    tune_search_free(&s);
    replay_free(&r);
    replay_free_model(&m);
    return rc;
}

/* ---- alpha, beta, gamma ---------------------------------------------------------------- */

typedef struct {
    loomComm_t comm;
    int rank, peer;
    uint8_t *buf;
    bool failed;
} pp_arg_t;

/* One-way seconds for vals[0] bytes between rank 0 and peer (rank 0's figure, on every rank). */
static double pingpong(void *arg, const uint64_t *vals)
{
    pp_arg_t *a = arg;
    size_t n = vals[0];
    int iters = n <= (64 << 10) ? 40 : n <= (1 << 20) ? 12 : 4;
    double t = 0;
    for (int w = 0; w < 2; w++) {
        double t0 = ranks_now();
        for (int i = 0; i < (w ? iters : 2); i++) {
            loomResult_t x = loomSuccess, y = loomSuccess;
            if (a->rank == 0) {
                x = loomSend(a->buf, n, loomUint8, a->peer, a->comm, NULL);
                y = loomRecv(a->buf, n, loomUint8, a->peer, a->comm, NULL);
            } else if (a->rank == a->peer) {
                x = loomRecv(a->buf, n, loomUint8, 0, a->comm, NULL);
                y = loomSend(a->buf, n, loomUint8, 0, a->comm, NULL);
            }
            if (x != loomSuccess || y != loomSuccess) {
                fprintf(stderr, "loom-tune: rank %d: ping-pong of %zu bytes with rank %d: %s\n",
                        a->rank, n, a->rank == 0 ? a->peer : 0, loomGetLastError(a->comm));
                return -1;
            }
        }
        t = (ranks_now() - t0) / (2.0 * iters);
    }
    return ranks_max(a->comm, a->rank == 0 ? t : 0);
}

/* t = alpha + beta n: alpha is the median time of the sizes up to 2 KiB (where the bytes cost
 * nothing next to the latency), beta the least-squares slope through that intercept over every
 * size (the large sizes, whose bytes dominate, decide it). */
static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static void fit(const double *n, const double *t, int k, double *alpha, double *beta)
{
    double small[64];
    int ns = 0;
    for (int i = 0; i < k && ns < 64; i++)
        if (n[i] <= 2048) small[ns++] = t[i];
    qsort(small, (size_t)ns, sizeof(double), cmp_d);
    *alpha = ns ? (ns % 2 ? small[ns / 2] : (small[ns / 2 - 1] + small[ns / 2]) / 2) : 0;
    double sxy = 0, sxx = 0;
    for (int i = 0; i < k; i++)
        sxy += n[i] * (t[i] - *alpha), sxx += n[i] * n[i];
    *beta = sxx > 0 ? sxy / sxx : 0;
    if (*beta <= 1e-13) *beta = 1e-13;
}

/* alpha and beta of one link: rank 0 to peer over comm. The sweep and the fit are printed. */
static int measure_link(loomComm_t comm, int rank, int peer, const char *label, int reps,
                        double *alpha, double *beta)
{
    enum { MAXS = 32 };
    const uint64_t top = 4u << 20;
    pp_arg_t a = {.comm = comm, .rank = rank, .peer = peer, .buf = calloc(top, 1)};
    if (!a.buf) return 2;
    double ns[MAXS], ts[MAXS], lo[MAXS], hi[MAXS];
    const char *stage[MAXS];
    int k = 0;
    for (uint64_t s = 8; s <= top && k < MAXS; s *= 4, k++) {
        ns[k] = (double)s, stage[k] = "x4";
        if ((ts[k] = tune_measure(pingpong, &a, &s, reps, &lo[k], &hi[k])) < 0) return 2;
    }
    fit(ns, ts, k, alpha, beta);
    /* around the knee (alpha = beta n), powers of 2, then of 2^(1/2), while the fit moves more
     * than the noise */
    static const double steps[] = {2, 1.4142135623730951};
    for (size_t f = 0; f < 2; f++) {
        double knee = *alpha / *beta, a0 = *alpha, b0 = *beta;
        for (int side = -1; side <= 1 && k < MAXS; side++) {
            uint64_t s = (uint64_t)llround(side < 0 ? knee / steps[f]
                                           : side   ? knee * steps[f]
                                                    : knee);
            if (s < 8 || s > top) continue;
            bool known = false;
            for (int i = 0; i < k; i++)
                known |= (uint64_t)ns[i] == s;
            if (known) continue;
            ns[k] = (double)s, stage[k] = f ? "x1.41" : "x2";
            if ((ts[k] = tune_measure(pingpong, &a, &s, reps, &lo[k], &hi[k])) < 0) return 2;
            k++;
        }
        fit(ns, ts, k, alpha, beta);
        double spread[MAXS];
        for (int i = 0; i < k; i++)
            spread[i] = (hi[i] - lo[i]) / (2 * ts[i]);
        double noise = 0;
        for (int i = 0; i < k; i++)
            noise += spread[i] / k;
        if (fabs(*alpha - a0) / (a0 > 0 ? a0 : 1e-9) < noise && fabs(*beta - b0) / b0 < noise)
            break;
    }
    if (rank == 0) {
        printf("# %s: rank 0 <-> rank %d, one-way times (median of %d)\n", label, peer, reps);
        printf("#  %-6s %12s %12s %12s %12s %8s\n", "stage", "bytes", "median_us", "min_us",
               "max_us", "fit_err");
        for (int i = 0; i < k; i++) {
            double pred = *alpha + *beta * ns[i];
            printf("   %-6s %12.0f %12.2f %12.2f %12.2f %7.1f%%\n", stage[i], ns[i], ts[i] * 1e6,
                   lo[i] * 1e6, hi[i] * 1e6, (pred - ts[i]) / ts[i] * 100);
        }
        printf("# %s: alpha %.2f us, beta %.4f ns/byte (%.2f GB/s)\n", label, *alpha * 1e6,
               *beta * 1e9, 1 / *beta / 1e9);
        fflush(stdout);
    }
    free(a.buf);
    return 0;
}

/* Seconds per output byte of the host's float sum (rank 0's figure, on every rank). */
static double measure_gamma(loomComm_t comm, int rank, int reps)
{
    const size_t n = 4u << 20;
    float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    double best = 0;
    if (x && y && z && rank == 0) {
        for (size_t i = 0; i < n; i++)
            x[i] = (float)i, y[i] = 1, z[i] = 0;
        /* the fastest of the repetitions: the reduction alone, without the machine's noise */
        for (int i = 0; i < reps; i++) {
            double t0 = ranks_now();
            red_host_apply(loomFloat32, RED_SUM, z, x, y, n);
            double t = ranks_now() - t0;
            best = i == 0 || t < best ? t : best;
        }
    }
    free(x), free(y), free(z);
    return ranks_max(comm, best / (double)(n * 4));
}

static int tune_model(loomComm_t comm, int rank, const opts_t *o, tune_entry_t *e)
{
    const comm_layout_t *L = &comm->lay;
    int local = L->node_start[1] - L->node_start[0] > 1 ? L->node_ranks[1] : -1;
    int net = L->nnodes > 1 ? L->node_ranks[L->node_start[1]] : -1;
    if (rank == 0)
        printf("# loom-tune --model: %d ranks on %d nodes; rank 0's peers: inside its node %d, "
               "across nodes %d (-1: none)\n",
               comm->nranks, L->nnodes, local, net);
    int rc = 0;
    double a, b;
    if (local >= 0 && comm->net.tp[TP_SHM].ops) {
        if ((rc = measure_link(comm, rank, local, "shm.local", o->reps, &a, &b))) return rc;
        e->alpha[TUNE_SHM][TUNE_LOCAL] = a, e->beta[TUNE_SHM][TUNE_LOCAL] = b;
    }
    if (net >= 0) {
        if ((rc = measure_link(comm, rank, net, "tcp.net", o->reps, &a, &b))) return rc;
        e->alpha[TUNE_TCP][TUNE_NET] = a, e->beta[TUNE_TCP][TUNE_NET] = b;
    }
    if (local >= 0) {
        /* the same ranks over tcp alone: a communicator split off with LOOM_TRANSPORT=tcp */
        loomComm_t tcp = NULL;
        setenv("LOOM_TRANSPORT", "tcp", 1);
        param_reset_cache();
        loomResult_t x = loomCommSplit(comm, 0, rank, &tcp, NULL);
        unsetenv("LOOM_TRANSPORT");
        param_reset_cache();
        if (x != loomSuccess) {
            fprintf(stderr, "loom-tune: rank %d: loomCommSplit (tcp only): %s\n", rank,
                    loomGetLastError(comm));
            return 2;
        }
        rc = measure_link(tcp, rank, local, "tcp.local", o->reps, &a, &b);
        loomCommDestroy(tcp);
        if (rc) return rc;
        e->alpha[TUNE_TCP][TUNE_LOCAL] = a, e->beta[TUNE_TCP][TUNE_LOCAL] = b;
    }
    double g = measure_gamma(comm, rank, o->reps);
    if (g < 0) return 2;
    e->gamma = g;
    if (rank == 0) printf("# gamma: %.4f ns per byte reduced (%.2f GB/s)\n", g * 1e9, 1 / g / 1e9);
    return 0;
}

/* ---- the measured allreduce table (--algos) --------------------------------------------- */

#define ALG_MAX_PTS 64

typedef struct {
    uint64_t bytes;
    const char *stage;
    double med[ALGO_COUNT]; /* seconds per call, median over the repetitions; 0: not measured */
    double spread;          /* the largest relative half-spread of its repetitions */
    int win;
} alg_pt_t;

typedef struct {
    loomComm_t comm;
    int rank, reps;
    float *send, *recv;
    alg_pt_t pts[ALG_MAX_PTS];
    int npts;
    int cand[ALGO_COUNT], ncand;
} alg_run_t;

/* Seconds per call of algo at `bytes`, the slowest rank's (the same on every rank). */
static double alg_time(alg_run_t *a, int algo, uint64_t bytes)
{
    size_t count = (size_t)(bytes / 4);
    int iters = bytes <= (64u << 10)   ? 200
                : bytes <= (1u << 20)  ? 40
                : bytes <= (16u << 20) ? 8
                                       : 3;
    a->comm->tune.algo = algo;
    loomResult_t r = loomSuccess;
    for (int i = 0; i < 2 && r == loomSuccess; i++) /* the schedule built, the links warm */
        r = loomAllReduce(a->send, a->recv, count, loomFloat32, loomSum, a->comm, NULL);
    double t0 = ranks_now();
    for (int i = 0; i < iters && r == loomSuccess; i++)
        r = loomAllReduce(a->send, a->recv, count, loomFloat32, loomSum, a->comm, NULL);
    double t = (ranks_now() - t0) / iters;
    a->comm->tune.algo = ALGO_AUTO;
    if (r != loomSuccess) {
        fprintf(stderr, "loom-tune: rank %d: allreduce of %llu bytes by %s: %s\n", a->rank,
                (unsigned long long)bytes, registry_get(algo)->name, loomGetLastError(a->comm));
        return -1;
    }
    return ranks_max(a->comm, t);
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* One point: the candidates (n of them) measured in turn, reps times, so that a slow moment of
 * the machine falls on all of them alike; the fastest median wins. */
static alg_pt_t *alg_point(alg_run_t *a, uint64_t bytes, const char *stage, const int *cand, int n)
{
    if (a->npts == ALG_MAX_PTS) return NULL;
    alg_pt_t *p = &a->pts[a->npts++];
    *p = (alg_pt_t){.bytes = bytes, .stage = stage, .win = -1};
    double t[ALGO_COUNT][64];
    for (int r = 0; r < a->reps; r++)
        for (int k = 0; k < n; k++) {
            int c = cand[(k + r) % n]; /* the order rotates from one repetition to the next */
            if ((t[c][r] = alg_time(a, c, bytes)) < 0) return NULL;
        }
    for (int k = 0; k < n; k++) {
        int c = cand[k];
        qsort(t[c], (size_t)a->reps, sizeof(double), cmp_double);
        double med =
            a->reps % 2 ? t[c][a->reps / 2] : (t[c][a->reps / 2 - 1] + t[c][a->reps / 2]) / 2;
        double half = (t[c][a->reps - 1] - t[c][0]) / 2 / med;
        p->med[c] = med;
        if (half > p->spread) p->spread = half;
        if (p->win < 0 || med < p->med[p->win]) p->win = c;
    }
    return p;
}

static int cmp_pt(const void *x, const void *y)
{
    const alg_pt_t *a = x, *b = y;
    return a->bytes < b->bytes ? -1 : a->bytes > b->bytes;
}

/* The median of the points' spreads: what a lead must exceed to mean anything. */
static double alg_noise(const alg_run_t *a)
{
    double s[ALG_MAX_PTS];
    for (int i = 0; i < a->npts; i++)
        s[i] = a->pts[i].spread;
    qsort(s, (size_t)a->npts, sizeof(double), cmp_double);
    return a->npts ? s[a->npts / 2] : 0;
}

/* Winners by size with the noise taken out: a size keeps the previous size's winner while that
 * one is within the noise of the fastest there, so that ties do not flip the table. */
static void alg_settle(alg_run_t *a, double noise)
{
    qsort(a->pts, (size_t)a->npts, sizeof(alg_pt_t), cmp_pt);
    for (int i = 1; i < a->npts; i++) {
        alg_pt_t *p = &a->pts[i];
        int prev = a->pts[i - 1].win;
        if (p->win != prev && p->med[prev] > 0 && p->med[prev] <= p->med[p->win] * (1 + noise))
            p->win = prev;
    }
}

static int tune_algos(loomComm_t comm, int rank, const opts_t *o, tune_entry_t *e)
{
    alg_run_t *a = calloc(1, sizeof(*a));
    if (!a) return 2;
    a->comm = comm, a->rank = rank, a->reps = o->reps;
    a->send = malloc(LOOM_MAX(o->max_bytes, 8));
    a->recv = malloc(LOOM_MAX(o->max_bytes, 8));
    int rc = 2;
    if (!a->send || !a->recv) goto out;
    for (uint64_t i = 0; i < o->max_bytes / 4; i++)
        a->send[i] = (float)((i + (uint64_t)rank) % 7);
    /* the candidates: every row automatic selection could take at some size of the range */
    for (int id = 0; id < ALGO_COUNT; id++)
        if (!comm_algo_unfit(comm, id, o->min_bytes)) a->cand[a->ncand++] = id;
    if (rank == 0) {
        printf("# loom-tune --algos: %d ranks on %d nodes, %llu to %llu bytes, float sum out of "
               "place; candidates:",
               comm->nranks, comm->lay.nnodes, (unsigned long long)o->min_bytes,
               (unsigned long long)o->max_bytes);
        for (int k = 0; k < a->ncand; k++)
            printf(" %s", registry_get(a->cand[k])->name);
        printf("; %d repetitions per point\n", o->reps);
        fflush(stdout);
    }
    /* powers of 4: every candidate that fits the size */
    for (uint64_t b = o->min_bytes; b <= o->max_bytes; b *= 4) {
        int cand[ALGO_COUNT], n = 0;
        for (int k = 0; k < a->ncand; k++)
            if (!comm_algo_unfit(comm, a->cand[k], b)) cand[n++] = a->cand[k];
        if (!alg_point(a, b, "x4", cand, n)) goto out;
        if (b > UINT64_MAX / 4) break;
    }
    /* between neighbours whose winners differ: the two winners at the geometric middle, as
     * long as the new points' leads exceed the noise */
    static const char *const stages[] = {"x2", "x1.41"};
    for (int st = 0; st < 2; st++) {
        double noise = alg_noise(a);
        alg_settle(a, noise);
        int n0 = a->npts;
        double lead = 0;
        for (int i = 0; i + 1 < n0; i++) {
            alg_pt_t *l = &a->pts[i], *h = &a->pts[i + 1];
            if (l->win == h->win) continue;
            uint64_t mid = (uint64_t)sqrt((double)l->bytes * (double)h->bytes) / 8 * 8;
            if (mid <= l->bytes || mid >= h->bytes) continue;
            int cand[2] = {l->win, h->win};
            alg_pt_t *p = alg_point(a, mid, stages[st], cand, 2);
            if (!p) goto out;
            double lo = fmin(p->med[cand[0]], p->med[cand[1]]),
                   hi = fmax(p->med[cand[0]], p->med[cand[1]]);
            if (hi / lo - 1 > lead) lead = hi / lo - 1;
        }
        if (a->npts == n0 || lead < noise) break; /* the boundaries are as good as the noise */
    }
    double noise = alg_noise(a);
    alg_settle(a, noise);
    /* the table: a row where the winner changes, at the geometric middle of the two sizes */
    e->nalgos = 0;
    for (int i = 0; i < a->npts && e->nalgos < TUNE_MAX_ALGOS; i++) {
        if (i > 0 && a->pts[i].win == a->pts[i - 1].win) continue;
        uint64_t from =
            i == 0 ? 0 : (uint64_t)sqrt((double)a->pts[i - 1].bytes * (double)a->pts[i].bytes);
        e->algo_from[e->nalgos] = from;
        e->algo_id[e->nalgos++] = a->pts[i].win;
    }
    if (rank == 0) {
        printf("#  stage         bytes");
        for (int k = 0; k < a->ncand; k++)
            printf(" %13s", registry_get(a->cand[k])->name);
        printf("  winner (us per call, median)\n");
        for (int i = 0; i < a->npts; i++) {
            const alg_pt_t *p = &a->pts[i];
            printf("   %-6s %12llu", p->stage, (unsigned long long)p->bytes);
            for (int k = 0; k < a->ncand; k++) {
                double m = p->med[a->cand[k]];
                if (m > 0)
                    printf(" %12.2f%s", m * 1e6, a->cand[k] == p->win ? "*" : " ");
                else
                    printf(" %13s", "-");
            }
            printf("  %s\n", registry_get(p->win)->name);
        }
        printf("# noise (median half-spread of the repetitions): %.1f%%\n", noise * 100);
    }
    rc = 0;
out:
    comm->tune.algo = ALGO_AUTO;
    free(a->send), free(a->recv), free(a);
    return rc;
}

static int tune_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    const opts_t *o = arg;
    if (nranks < 2) {
        fprintf(stderr, "loom-tune: needs at least 2 ranks (-P k or a launcher)\n");
        return 2;
    }
    tune_entry_t e;
    tune_entry_clear(&e);
    int rc = 0;
    if (o->model && (rc = tune_model(comm, rank, o, &e))) return rc;
    if (o->fusion && (rc = tune_fusion(comm, rank, o, &e))) return rc;
    if (o->algos && (rc = tune_algos(comm, rank, o, &e))) return rc;
    if (rank == 0) {
        tune_key_t k = tune_key_of(comm->nranks, comm->lay.nnodes, comm->lay.node_start,
                                   o->dev ? TUNE_MEM_DEVICE : TUNE_MEM_HOST);
        char err[512];
        if (tunefile_update(o->out, &k, &e, err, sizeof(err)) != 0) {
            fprintf(stderr, "loom-tune: %s\n", err);
            return 2;
        }
        printf("# written to %s:\n", o->out);
        tunefile_write_section(stdout, &k, &e);
    }
    return 0;
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: loom-tune (--fusion [-m MODEL] [--mem host|device] | --model | --algos [-b MIN] "
        "[-e MAX]) [-P k] [-o FILE] [-r REPS]\n"
        "  --fusion       search the fusion bucket threshold and segment size over MODEL's "
        "step\n"
        "  -m MODEL       resnet50 (default), bert-base, llm24x2048, or a path to a list\n"
        "  --mem device   the fusion search on CUDA device tensors (one GPU per local rank),\n"
        "                 written under mem=device (device fusion contexts read it)\n"
        "  --model        measure alpha/beta per transport and level, and gamma\n"
        "  --algos        time every allreduce algorithm selection could take, MIN to MAX\n"
        "                 bytes (default 8 to 64M), and write the winners by size\n"
        "  -P k           fork k local ranks (default: a launcher's ranks)\n"
        "  -o FILE        the tuning file to update (default: LOOM_TUNE_FILE, else "
        "loom-tune.txt)\n"
        "  -r REPS        repetitions per point (default 3)\n");
}

int main(int argc, char **argv)
{
    opts_t o = {.model_name = "resnet50", .reps = 3, .min_bytes = 8, .max_bytes = 64u << 20};
    const char *env = getenv("LOOM_TUNE_FILE");
    o.out = env && *env ? env : "loom-tune.txt";
    int k = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = (char *)"";
        if (!strcmp(a, "--fusion")) {
            o.fusion = true;
            continue;
        }
        if (!strcmp(a, "--model")) {
            o.model = true;
            continue;
        }
        if (!strcmp(a, "--algos")) {
            o.algos = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(), 0;
        if (!v) return usage(), 2;
        if (!strcmp(a, "-P"))
            k = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "-m"))
            o.model_name = v;
        else if (!strcmp(a, "--mem")) {
            if (strcmp(v, "host") && strcmp(v, "device")) {
                fprintf(stderr, "loom-tune: --mem %s: expected host or device\n", v);
                return 2;
            }
            o.dev = !strcmp(v, "device");
        } else if (!strcmp(a, "-o"))
            o.out = v;
        else if (!strcmp(a, "-r"))
            o.reps = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "-b") || !strcmp(a, "-e")) {
            double d = strtod(v, &end);
            double mul = *end == 'K'   ? 1024.0
                         : *end == 'M' ? 1048576.0
                         : *end == 'G' ? 1073741824.0
                                       : 1;
            if (mul > 1) end++;
            if (*end || !(d >= 4) || d * mul > 4294967296.0 || d * mul != floor(d * mul)) {
                fprintf(stderr, "loom-tune: %s %s: a size from 4 bytes to 4G (K, M, G allowed)\n",
                        a, v);
                return 2;
            }
            *(a[1] == 'b' ? &o.min_bytes : &o.max_bytes) = (uint64_t)(d * mul) / 4 * 4;
        } else
            return usage(), 2;
        if (*end || k < 0 || k > 1024 || o.reps < 1 || o.reps > 64) {
            fprintf(stderr, "loom-tune: %s %s: not a valid value\n", a, v);
            return 2;
        }
        i++;
    }
    if (!o.fusion && !o.model && !o.algos) return usage(), 2;
    if (o.min_bytes > o.max_bytes) {
        fprintf(stderr, "loom-tune: -b %llu is above -e %llu\n", (unsigned long long)o.min_bytes,
                (unsigned long long)o.max_bytes);
        return 2;
    }
    if (o.dev && (o.model || o.algos)) {
        fprintf(stderr, "loom-tune: --mem device goes with --fusion only: --model measures the "
                        "host transports and --algos the host allreduce (run them without --mem, "
                        "then --fusion --mem device)\n");
        return 2;
    }
    /* the file being written must not steer the measurements */
    unsetenv("LOOM_TUNE_FILE");
    return ranks_run("loom-tune", k, tune_rank, &o);
}
