/*
 * Gradient-bucket fusion (src/fusion, docs/fusion.md): fused results bit for bit against the
 * unfused allreduce of each tensor over random tensor lists (every type and op, 1 to about a
 * million elements, ranks enqueueing at different speeds, tcp and shm), group fusion, each kind
 * of disagreement named, abort with buckets in flight, and the compressed wire's error bound.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fuse.h"
#include "harness.h"
#include "loom_internal.h"
#include "reduce.h"

/* ---- inputs whose reduction is exact in any order ---- */

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Element i of rank r's tensor t: small integers (sums of 8 ranks stay exact in bfloat16);
 * products use 1 and 2 only. */
static int small_value(uint64_t seed, int t, int r, size_t i, loomRedOp_t op)
{
    uint64_t h = mix(seed ^ ((uint64_t)t << 40) ^ ((uint64_t)r << 32) ^ i);
    return op == loomProd ? 1 + (int)(h & 1) : (int)(h % 9);
}

static void fill(void *buf, loomDataType_t type, size_t n, uint64_t seed, int t, int r,
                 loomRedOp_t op)
{
    for (size_t i = 0; i < n; i++) {
        int v = small_value(seed, t, r, i, op);
        switch (type) {
        case loomInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
        case loomUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
        case loomInt32: ((int32_t *)buf)[i] = v; break;
        case loomUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
        case loomInt64: ((int64_t *)buf)[i] = v; break;
        case loomUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
        case loomFloat16: ((uint16_t *)buf)[i] = red_float_to_half((float)v); break;
        case loomFloat32: ((float *)buf)[i] = (float)v; break;
        case loomFloat64: ((double *)buf)[i] = v; break;
        case loomBfloat16: ((uint16_t *)buf)[i] = red_float_to_bf16((float)v); break;
        case loomFloat8e4m3:
        case loomFloat8e5m2:
            /* 0 or 1 (products 1 or 2): sums of up to 8 ranks and products of up to 4 stay
             * exact with 2 or 3 mantissa bits */
            ((uint8_t *)buf)[i] = red_float_to_fp8(type, (float)(op == loomProd ? v : v & 1));
            break;
        default: break;
        }
    }
}

/* ---- random tensor lists, fused against unfused ---- */

typedef struct {
    size_t count;
    loomDataType_t type;
    loomRedOp_t op;
} tensor_t;

typedef struct {
    uint64_t seed;
    int ntensors;
    size_t max_count; /* the largest tensor (one of them is this large) */
    int sleep_us;     /* ranks pause up to this between enqueues (per-rank random) */
    loomFusionConfig_t cfg;
    bool use_handles;
    int stagger_us;       /* rank r also pauses r * this before every 4th tensor */
    bool want_split_cuts; /* assert that the staggered ranks proposed different cuts (timing) */
    bool flat;            /* the tensors are views of one buffer, back to back (as frameworks' flat
                             gradient buffers): buckets reduce in place without packing */
    bool vary_cfg;        /* each rank its own bucket, first-bucket and cycle settings */
    atomic_int callbacks;
} list_arg_t;

static const loomRedOp_t ops[] = {loomSum, loomProd, loomMax, loomMin, loomAvg};

static void make_list(const list_arg_t *a, tensor_t *t)
{
    for (int k = 0; k < a->ntensors; k++) {
        uint64_t h = mix(a->seed * 7919 + (uint64_t)k);
        /* mostly small tensors, some medium, one at max_count */
        size_t c = k == a->ntensors / 2 ? a->max_count
                   : h % 8 == 0         ? 1 + (size_t)(h >> 16) % (a->max_count / 8 + 1)
                                        : 1 + (size_t)(h >> 16) % 3000;
        t[k] = (tensor_t){c, (loomDataType_t)((h >> 8) % loomNumTypes),
                          ops[(h >> 12) % (sizeof(ops) / sizeof(ops[0]))]};
        if (h % 5 == 0 && k > 0) { /* runs of one type and op, as models have */
            t[k].type = t[k - 1].type;
            t[k].op = t[k - 1].op;
        }
    }
}

static void count_cb(uint64_t id, loomResult_t r, void *arg)
{
    (void)id;
    list_arg_t *a = arg;
    if (r == loomSuccess) atomic_fetch_add(&a->callbacks, 1);
}

static int list_rank(loomComm_t comm, int r, int p, void *arg)
{
    list_arg_t *a = arg;
    tensor_t *t = calloc((size_t)a->ntensors, sizeof(*t));
    void **fused = calloc((size_t)a->ntensors, sizeof(void *));
    void **plain = calloc((size_t)a->ntensors, sizeof(void *));
    loomFusionHandle_t *hd = calloc((size_t)a->ntensors, sizeof(*hd));
    make_list(a, t);
    int bad = 0;
    size_t total = 0;
    for (int k = 0; k < a->ntensors; k++)
        total += t[k].count * red_type_size(t[k].type) + 16;
    uint8_t *arena = a->flat ? malloc(total) : NULL, *next = arena;
    for (int k = 0; k < a->ntensors; k++) {
        size_t bytes = t[k].count * red_type_size(t[k].type);
        if (a->flat && k > 0 && t[k].type != t[k - 1].type) /* aligned where the type changes */
            next = arena + ((size_t)(next - arena) + 15) / 16 * 16;
        fused[k] = a->flat ? (void *)next : malloc(bytes);
        next += a->flat ? bytes : 0;
        plain[k] = malloc(bytes);
        fill(fused[k], t[k].type, t[k].count, a->seed, k, r, t[k].op);
        memcpy(plain[k], fused[k], bytes);
    }
    /* the unfused reference: one allreduce per tensor */
    for (int k = 0; k < a->ntensors; k++)
        if (loomAllReduce(plain[k], plain[k], t[k].count, t[k].type, t[k].op, comm, NULL) !=
            loomSuccess) {
            fprintf(stderr, "rank %d: unfused allreduce %d: %s\n", r, k, loomGetLastError(NULL));
            bad++;
        }
    loomFusion_t f;
    loomFusionConfig_t cfg = a->cfg;
    if (a->vary_cfg) { /* the cut is the smallest proposal: the buckets still agree */
        cfg.bucketBytes = (size_t)(64 << 10) << (r % 3);
        cfg.firstBucketBytes = (size_t)(4 << 10) << r;
        cfg.cycleUs = 200 + 400 * (uint64_t)r;
    }
    if (loomFusionCreate(&f, comm, &cfg) != loomSuccess) {
        fprintf(stderr, "rank %d: create: %s\n", r, loomGetLastError(NULL));
        return 1;
    }
    uint64_t rs = mix(a->seed ^ (uint64_t)(r + 1) * 0x9e37);
    for (int step = 0; step < 2 && !bad; step++) {
        if (step == 1) /* again, on the reduced values: a context serves many steps */
            for (int k = 0; k < a->ntensors; k++) {
                size_t bytes = t[k].count * red_type_size(t[k].type);
                fill(fused[k], t[k].type, t[k].count, a->seed, k, r, t[k].op);
                memcpy(plain[k], fused[k], bytes);
                loomAllReduce(plain[k], plain[k], t[k].count, t[k].type, t[k].op, comm, NULL);
            }
        for (int k = 0; k < a->ntensors; k++) {
            rs = mix(rs);
            if (a->sleep_us && rs % 3 == 0) usleep((useconds_t)(rs >> 8) % (unsigned)a->sleep_us);
            if (a->stagger_us && k % 4 == 0) usleep((useconds_t)(r * a->stagger_us));
            loomResult_t e =
                loomFusionEnqueue(f, fused[k], t[k].count, t[k].type, t[k].op, 1000 + (uint64_t)k,
                                  NULL, count_cb, a, a->use_handles ? &hd[k] : NULL);
            if (e != loomSuccess) {
                fprintf(stderr, "rank %d: enqueue %d: %s\n", r, k, loomGetLastError(NULL));
                bad++;
                break;
            }
        }
        if (a->use_handles)
            for (int k = 0; k < a->ntensors && !bad; k++)
                if (loomFusionWait(hd[k]) != loomSuccess) {
                    fprintf(stderr, "rank %d: wait %d: %s\n", r, k, loomGetLastError(NULL));
                    bad++;
                }
        /* the communicator belongs to the context until WaitAll */
        int32_t probe = 1;
        if (!bad &&
            loomAllReduce(&probe, &probe, 1, loomInt32, loomSum, comm, NULL) != loomInvalidUsage) {
            fprintf(stderr,
                    "rank %d: an allreduce beside a busy fusion context was not "
                    "refused\n",
                    r);
            bad++;
        }
        if (loomFusionWaitAll(f) != loomSuccess) {
            fprintf(stderr, "rank %d: wait all: %s\n", r, loomGetLastError(NULL));
            bad++;
        }
        for (int k = 0; k < a->ntensors && !bad; k++) {
            size_t bytes = t[k].count * red_type_size(t[k].type);
            if (memcmp(fused[k], plain[k], bytes) != 0) {
                fprintf(stderr,
                        "rank %d step %d: tensor %d (%zu x %s, op %d) differs from the unfused "
                        "allreduce\n",
                        r, step, k, t[k].count, red_type_name(t[k].type), (int)t[k].op);
                bad++;
            }
        }
    }
    loomFusionStats_t st;
    loomFusionGetStats(f, &st);
    if (!bad && (st.tensors != 2 * (uint64_t)a->ntensors || st.buckets == 0 ||
                 st.segments < st.tensors || st.buckets > st.segments)) {
        fprintf(stderr, "rank %d: stats: %llu tensors %llu segments %llu buckets\n", r,
                (unsigned long long)st.tensors, (unsigned long long)st.segments,
                (unsigned long long)st.buckets);
        bad++;
    }
    /* staggered ranks propose different cuts (their timers fire at different segments), which
     * takes the second round that compares digests at the agreed cut */
    if (!bad && a->want_split_cuts && p > 1 && st.rounds <= st.buckets + 2) {
        fprintf(stderr,
                "rank %d: staggered ranks never proposed different cuts (%llu rounds, "
                "%llu buckets)\n",
                r, (unsigned long long)st.rounds, (unsigned long long)st.buckets);
        bad++;
    }
    if (r == 0 && p > 1)
        printf("fusion list seed %llu: %d ranks, %llu buckets (%llu full, %llu timer, %llu "
               "flush), %llu segments, %llu rounds\n",
               (unsigned long long)a->seed, p, (unsigned long long)st.buckets,
               (unsigned long long)st.fullCuts, (unsigned long long)st.timerCuts,
               (unsigned long long)st.flushCuts, (unsigned long long)st.segments,
               (unsigned long long)st.rounds);
    /* the probe outside a step works again */
    int32_t probe = 1;
    if (!bad && loomAllReduce(&probe, &probe, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) {
        fprintf(stderr, "rank %d: allreduce after WaitAll: %s\n", r, loomGetLastError(NULL));
        bad++;
    }
    loomFusionDestroy(f);
    for (int k = 0; k < a->ntensors; k++) {
        if (!a->flat) free(fused[k]);
        free(plain[k]);
    }
    free(arena);
    free(fused);
    free(plain);
    free(t);
    free(hd);
    return bad;
}

static void small_buckets(loomFusionConfig_t *c)
{
    *c = (loomFusionConfig_t)LOOM_FUSION_CONFIG_INITIALIZER;
    c->bucketBytes = 64 << 10;
    c->firstBucketBytes = 8 << 10;
    c->segmentBytes = 24 << 10;
    c->cycleUs = 300;
}

static void run_list_a(int p, const char *transport, list_arg_t *a);

static void run_list(int p, const char *transport, uint64_t seed, int n, size_t max_count,
                     int sleep_us, bool handles)
{
    list_arg_t a = {.seed = seed,
                    .ntensors = n,
                    .max_count = max_count,
                    .sleep_us = sleep_us,
                    .use_handles = handles};
    run_list_a(p, transport, &a);
}

static void run_list_a(int p, const char *transport, list_arg_t *ap)
{
    if (transport)
        setenv("LOOM_TRANSPORT", transport, 1);
    else
        unsetenv("LOOM_TRANSPORT");
    param_reset_cache();
    list_arg_t *a = ap;
    small_buckets(&a->cfg);
    int bad = h_run_threads(p, list_rank, a);
    unsetenv("LOOM_TRANSPORT");
    param_reset_cache();
    ck_assert_msg(bad == 0, "%d of %d ranks failed a check (see stderr)", bad, p);
    ck_assert_int_eq(atomic_load(&a->callbacks), 2 * a->ntensors * p);
}

START_TEST(lists_shm)
{
    static const int ranks[] = {1, 2, 3, 4};
    run_list(ranks[_i], "shm", 11 + (uint64_t)_i, 60, 300000, 200, _i % 2 == 1);
}
END_TEST

START_TEST(lists_tcp)
{
    static const int ranks[] = {2, 3, 4};
    run_list(ranks[_i], "tcp", 23 + (uint64_t)_i, 60, 300000, 200, _i % 2 == 0);
}
END_TEST

START_TEST(lists_flat)
{
    static const char *const tps[] = {"tcp", "shm"};
    list_arg_t a = {.seed = 41 + (uint64_t)_i, .ntensors = 50, .max_count = 100000, .flat = true};
    run_list_a(3, tps[_i], &a);
}
END_TEST

/* A million-element tensor among small ones, default bucket sizes (segments of 8 MiB). */
START_TEST(lists_varied_config)
{
    list_arg_t a = {
        .seed = 61, .ntensors = 60, .max_count = 100000, .sleep_us = 300, .vary_cfg = true};
    run_list_a(3, "shm", &a);
}
END_TEST

START_TEST(big_tensor)
{
    run_list(3, NULL, 99, 12, 1u << 20, 0, false);
}
END_TEST

/* Ranks at very different speeds: the cut comes from whoever's timer fires first, and must be
 * the same everywhere. */
START_TEST(uneven_speeds)
{
    run_list(4, "shm", 7, 80, 20000, 2000, false);
    list_arg_t a = {.seed = 8, .ntensors = 60, .max_count = 20000, .stagger_us = 800};
    run_list_a(3, "tcp", &a);
}
END_TEST

/* The same staggered ranks: their timers fire at different segments, so they propose different
 * cuts, which takes the second round that compares digests at the agreed cut. A property of the
 * timing (under a sanitizer's slowdown every timer fires alike), so tagged timing. */
START_TEST(staggered_cuts)
{
    list_arg_t a = {
        .seed = 8, .ntensors = 60, .max_count = 20000, .stagger_us = 800, .want_split_cuts = true};
    run_list_a(3, "tcp", &a);
}
END_TEST

/* ---- group fusion ---- */

static int group_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p;
    (void)arg;
    enum { N = 12 };
    tensor_t t[N];
    void *g[N], *u[N];
    int bad = 0;
    for (int k = 0; k < N; k++) {
        /* runs of equal type and op, broken by a type change and by a broadcast */
        t[k] = (tensor_t){(size_t)(1 + k * 37),
                          k < 5   ? loomFloat32
                          : k < 9 ? loomInt64
                                  : loomBfloat16,
                          k == 7 ? loomMax : loomSum};
        size_t b = t[k].count * red_type_size(t[k].type);
        g[k] = malloc(b);
        u[k] = malloc(b);
        fill(g[k], t[k].type, t[k].count, 5, k, r, t[k].op);
        memcpy(u[k], g[k], b);
    }
    int32_t bc_g[4] = {r, r, r, r}, bc_u[4] = {r, r, r, r};
    loomStats_t s0, s1, s2;
    loomCommGetStats(comm, &s0);
    for (int k = 0; k < N; k++) {
        loomAllReduce(u[k], u[k], t[k].count, t[k].type, t[k].op, comm, NULL);
        if (k == 3) loomBroadcast(bc_u, bc_u, 4, loomInt32, 0, comm, NULL);
    }
    loomCommGetStats(comm, &s1);
    loomGroupStart();
    for (int k = 0; k < N; k++) {
        loomAllReduce(g[k], g[k], t[k].count, t[k].type, t[k].op, comm, NULL);
        if (k == 3) loomBroadcast(bc_g, bc_g, 4, loomInt32, 0, comm, NULL);
    }
    if (loomGroupEnd() != loomSuccess) {
        fprintf(stderr, "rank %d: group: %s\n", r, loomGetLastError(NULL));
        bad++;
    }
    loomCommGetStats(comm, &s2);
    for (int k = 0; k < N; k++)
        if (memcmp(g[k], u[k], t[k].count * red_type_size(t[k].type)) != 0) {
            fprintf(stderr, "rank %d: grouped allreduce %d differs from the unfused one\n", r, k);
            bad++;
        }
    if (memcmp(bc_g, bc_u, sizeof(bc_g)) != 0) bad++;
    /* 13 calls unfused; fused: [0..3] bcast [4] [5,6] [7] [8] [9..11] = 7 */
    uint64_t unfused = s1.collectives - s0.collectives, fused = s2.collectives - s1.collectives;
    if (p > 1 && (unfused != N + 1 || fused != 7)) {
        fprintf(stderr, "rank %d: %llu operations unfused, %llu fused (expected 13 and 7)\n", r,
                (unsigned long long)unfused, (unsigned long long)fused);
        bad++;
    }
    for (int k = 0; k < N; k++) {
        free(g[k]);
        free(u[k]);
    }
    return bad;
}

START_TEST(group_fused)
{
    static const int ranks[] = {1, 2, 3, 4};
    unsetenv("LOOM_FUSION_GROUP");
    param_reset_cache();
    int bad = h_run_threads(ranks[_i], group_rank, NULL);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* Grouped calls that differ between ranks (same total count) fail, never a silent sum. */
static int group_mismatch_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p;
    (void)arg;
    float a[30] = {0}, b[30] = {0};
    loomGroupStart();
    loomAllReduce(a, a, r == 0 ? 10 : 20, loomFloat32, loomSum, comm, NULL);
    loomAllReduce(b, b, r == 0 ? 20 : 10, loomFloat32, loomSum, comm, NULL);
    loomResult_t e = loomGroupEnd();
    if (e == loomSuccess) {
        fprintf(stderr, "rank %d: grouped calls of different counts succeeded\n", r);
        return 1;
    }
    if (!strstr(loomGetLastError(NULL), "mismatch")) {
        fprintf(stderr, "rank %d: unexpected text: %s\n", r, loomGetLastError(NULL));
        return 1;
    }
    return 0;
}

START_TEST(group_mismatch)
{
    int bad = h_run_threads(2, group_mismatch_rank, NULL);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* ---- disagreements ---- */

enum { MM_COUNT, MM_TYPE, MM_OP, MM_ORDER, MM_MISSING, MM_MISSING_LAST, MM_ID, MM_N };
static const char *const mm_names[] = {"count",   "type",         "op", "order",
                                       "missing", "missing-last", "id"};

typedef struct {
    int kind;
    int odd; /* the rank that differs */
} mm_arg_t;

static int mismatch_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p;
    mm_arg_t *a = arg;
    enum { N = 10 };
    float *buf[N] = {0}; /* freed at the end, also those after a refused enqueue */
    loomFusionConfig_t c;
    small_buckets(&c);
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, &c) != loomSuccess) return 1;
    bool odd = r == a->odd;
    int n = N;
    for (int k = 0; k < N; k++) {
        buf[k] = calloc(4096, sizeof(float));
        size_t cnt = 100 + (size_t)k * 300;
        loomDataType_t ty = loomFloat32;
        loomRedOp_t op = loomSum;
        uint64_t id = 500 + (uint64_t)k;
        int kk = k;
        if (odd && k == 6) {
            if (a->kind == MM_COUNT) cnt += 1;
            if (a->kind == MM_TYPE) ty = loomInt32;
            if (a->kind == MM_OP) op = loomMax;
            if (a->kind == MM_ID) id = 999;
        }
        if (odd && a->kind == MM_ORDER && (k == 6 || k == 7)) kk = 13 - k; /* 6 <-> 7 */
        if (kk != k) {
            cnt = 100 + (size_t)kk * 300;
            id = 500 + (uint64_t)kk;
        }
        if (odd && a->kind == MM_MISSING && k == 6) continue;
        if (odd && a->kind == MM_MISSING_LAST && k == N - 1) continue;
        if (loomFusionEnqueue(f, buf[k], cnt, ty, op, id, NULL, NULL, NULL, NULL) != loomSuccess)
            break;
    }
    (void)n;
    loomResult_t e = loomFusionWaitAll(f);
    const char *txt = loomGetLastError(NULL);
    int bad = 0;
    if (e != loomInvalidUsage) {
        fprintf(stderr, "rank %d (%s): WaitAll returned %d, not an invalid-usage error\n", r,
                mm_names[a->kind], (int)e);
        bad++;
    } else {
        /* the text names the tensor (its id) and its position */
        const char *want_id = a->kind == MM_MISSING_LAST ? "id 509" : "id 506";
        const char *want_pos =
            a->kind == MM_MISSING_LAST ? "tensor position 9" : "tensor position 6";
        if (!strstr(txt, want_id) || !strstr(txt, want_pos)) {
            fprintf(stderr, "rank %d (%s): the error does not name %s at %s: %s\n", r,
                    mm_names[a->kind], want_id, want_pos, txt);
            bad++;
        }
        char rk[16];
        snprintf(rk, sizeof(rk), "%d", a->odd);
        if (!strstr(txt, "rank")) bad++;
    }
    loomFusionDestroy(f);
    for (int k = 0; k < N; k++)
        free(buf[k]);
    return bad;
}

START_TEST(mismatch)
{
    int kind = _i % MM_N, p = 2 + _i / MM_N; /* 2 and 3 ranks */
    mm_arg_t a = {.kind = kind, .odd = p - 1};
    int bad = h_run_threads(p, mismatch_rank, &a);
    ck_assert_msg(bad == 0, "%s on %d ranks: %d ranks did not name the disagreement",
                  mm_names[kind], p, bad);
}
END_TEST

/* ---- abort with buckets in flight ---- */

static int abort_wire = loomFusionWireExact; /* the contexts' wire (abort_compressed) */

static int abort_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p;
    enum { N = 8 };
    const size_t C = arg ? *(const size_t *)arg : (size_t)1 << 19;
    float *buf[N];
    loomFusionConfig_t c;
    small_buckets(&c);
    c.wire = abort_wire;
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, &c) != loomSuccess) return 1;
    /* Rank 0 enqueues the first half, waits until buckets of it are done, then enqueues the
     * second half and aborts at once: the abort lands with buckets done, queued and (on the
     * others, which enqueued everything) in flight, however fast the buckets go (through the
     * node segment a whole half can finish between two looks at the statistics). */
    int first = r == 0 ? N / 2 : N, early = 0;
    for (int k = 0; k < N; k++) {
        buf[k] = calloc(C, sizeof(float));
        if (k < first)
            loomFusionEnqueue(f, buf[k], C, loomFloat32, loomSum, (uint64_t)k, NULL, NULL, NULL,
                              NULL);
    }
    if (r == 0) {
        loomFusionStats_t st = {0};
        for (int i = 0; i < 5000 && st.buckets < 2; i++) {
            usleep(1000);
            loomFusionGetStats(f, &st);
        }
        for (int k = first; k < N; k++)
            loomFusionEnqueue(f, buf[k], C, loomFloat32, loomSum, (uint64_t)k, NULL, NULL, NULL,
                              NULL);
        loomFusionGetStats(f, &st);
        early = st.buckets < 2 || st.buckets * c.bucketBytes >= (size_t)N * C * sizeof(float);
        /* (aborted whatever it found: the others must not wait for a rank that left) */
        loomCommAbort(comm);
        if (early)
            fprintf(stderr, "rank 0: %llu buckets done before the abort\n",
                    (unsigned long long)st.buckets);
    }
    uint64_t t0 = (uint64_t)time(NULL);
    loomResult_t e = loomFusionWaitAll(f);
    int bad = 0;
    if (e == loomSuccess) {
        fprintf(stderr, "rank %d: WaitAll succeeded although rank 0 aborted\n", r);
        bad++;
    } else if (r == 1) {
        printf("rank 1: %s\n", loomGetLastError(NULL));
    }
    if ((uint64_t)time(NULL) - t0 > 20) {
        fprintf(stderr, "rank %d: WaitAll took %llu s after the abort\n", r,
                (unsigned long long)((uint64_t)time(NULL) - t0));
        bad++;
    }
    /* enqueueing on the failed context fails at once */
    if (loomFusionEnqueue(f, buf[0], 1, loomFloat32, loomSum, 77, NULL, NULL, NULL, NULL) ==
        loomSuccess)
        bad++;
    loomFusionDestroy(f);
    for (int k = 0; k < N; k++)
        free(buf[k]);
    return bad + early;
}

/* The same with the ranks as threads of one process: run under valgrind (tag lifetime), a
 * block the abort left behind is a failure. */
START_TEST(abort_threads)
{
    size_t c = 1 << 16;
    int bad = h_run_threads(3, abort_rank, &c);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* The same on the 16-bit wire, by node (2 pretend nodes of 2), pieces of 256 values: the abort
 * lands while a bucket's pipeline has several groups of point-to-point transfers to go. */
START_TEST(abort_compressed)
{
    size_t c = 1 << 16;
    abort_wire = loomFusionWireBf16;
    setenv("LOOM_FUSION_WIRE_PIECE", "256", 1);
    setenv("LOOM_NODE_ID", "a,a,b,b", 1);
    param_reset_cache();
    int bad = h_run_threads(4, abort_rank, &c);
    abort_wire = loomFusionWireExact;
    unsetenv("LOOM_FUSION_WIRE_PIECE");
    unsetenv("LOOM_NODE_ID");
    param_reset_cache();
    ck_assert_int_eq(bad, 0);
}
END_TEST

START_TEST(abort_in_flight)
{
    static const char *const tps[] = {"tcp", "shm"};
    setenv("LOOM_TRANSPORT", tps[_i], 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    param_reset_cache();
    int st[3];
    int bad = h_run_procs(3, abort_rank, NULL, 60, st);
    unsetenv("LOOM_TRANSPORT");
    unsetenv("LOOM_TIMEOUT");
    param_reset_cache();
    for (int r = 0; r < 3; r++)
        ck_assert_msg(st[r] == 0, "rank %d ended with status %d", r, st[r]);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* A rank that leaves without taking part (it never enqueues nor waits): the others' round
 * fails within the timeout, naming the peer, instead of waiting for ever. */
static int gone_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p;
    (void)arg;
    int32_t one = 1; /* connect first, so that the leaver's close is seen */
    if (loomAllReduce(&one, &one, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) return 1;
    if (r == 1) return 0; /* the harness destroys its communicator */
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, NULL) != loomSuccess) return 1;
    float v[16] = {0};
    loomFusionEnqueue(f, v, 16, loomFloat32, loomSum, 1, NULL, NULL, NULL, NULL);
    time_t t0 = time(NULL);
    loomResult_t e = loomFusionWaitAll(f);
    int bad = 0;
    if (e == loomSuccess) {
        fprintf(stderr, "rank %d: WaitAll succeeded without its peer\n", r);
        bad++;
    } else {
        printf("rank %d, after %lld s: %s\n", r, (long long)(time(NULL) - t0),
               loomGetLastError(NULL));
    }
    loomFusionDestroy(f);
    return bad;
}

START_TEST(peer_gone)
{
    setenv("LOOM_TIMEOUT", "3", 1);
    param_reset_cache();
    int st[2];
    int bad = h_run_procs(2, gone_rank, NULL, 40, st);
    unsetenv("LOOM_TIMEOUT");
    param_reset_cache();
    ck_assert_msg(bad == 0, "ranks ended with %d and %d", st[0], st[1]);
}
END_TEST

/* ---- compressed wire ---- */

typedef struct {
    int wire;
    size_t n;
    loomRedOp_t op;
    float *results; /* [nranks][n] */
    double *exact;  /* [n], filled by rank 0 */
    double *scale;  /* per chunk: sum over ranks of the inputs' largest magnitude */
    double reported[8];
} z_arg_t;

static float z_value(int r, size_t i)
{
    uint64_t h = mix((uint64_t)r << 40 ^ i);
    double u = (double)(h >> 11) / 9007199254740992.0 * 2 - 1; /* [-1, 1) */
    double mag = ldexp(1.0, (int)((h >> 3) % 24) - 12);        /* 2^-12 .. 2^11 */
    return (float)(u * (i % 512 < 256 ? 1.0 : mag));           /* some chunks of wide range */
}

static int z_rank(loomComm_t comm, int r, int p, void *arg)
{
    z_arg_t *a = arg;
    size_t n = a->n;
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = z_value(r, i);
    loomFusionConfig_t c;
    small_buckets(&c);
    c.wire = a->wire;
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, &c) != loomSuccess) return 1;
    /* three tensors, so that buckets pack several and cross chunk borders */
    size_t cut1 = n / 3 + 5, cut2 = 2 * n / 3 + 77;
    cut1 = cut1 > n ? n : cut1;
    cut2 = cut2 > n ? n : cut2 < cut1 ? cut1 : cut2;
    loomFusionEnqueue(f, x, cut1, loomFloat32, a->op, 1, NULL, NULL, NULL, NULL);
    loomFusionEnqueue(f, x + cut1, cut2 - cut1, loomFloat32, a->op, 2, NULL, NULL, NULL, NULL);
    loomFusionEnqueue(f, x + cut2, n - cut2, loomFloat32, a->op, 3, NULL, NULL, NULL, NULL);
    int bad = 0;
    if (loomFusionWaitAll(f) != loomSuccess) {
        fprintf(stderr, "rank %d: %s\n", r, loomGetLastError(NULL));
        bad++;
    }
    loomFusionStats_t st;
    loomFusionGetStats(f, &st);
    a->reported[r] = st.maxRelError;
    if (st.compressedBuckets != st.buckets || st.buckets == 0) {
        fprintf(stderr, "rank %d: %llu of %llu buckets compressed\n", r,
                (unsigned long long)st.compressedBuckets, (unsigned long long)st.buckets);
        bad++;
    }
    memcpy(a->results + (size_t)r * n, x, n * sizeof(float));
    loomFusionDestroy(f);
    free(x);
    (void)p;
    return bad;
}

static void run_compressed_n(int p, int wire, size_t n, loomRedOp_t op, const char *what)
{
    z_arg_t a = {.wire = wire, .n = n, .op = op};
    a.results = malloc((size_t)p * a.n * sizeof(float));
    int bad = h_run_threads(p, z_rank, &a);
    ck_assert_int_eq(bad, 0);
    /* every rank holds the same values */
    for (int r = 1; r < p; r++)
        ck_assert_msg(memcmp(a.results, a.results + (size_t)r * a.n, a.n * sizeof(float)) == 0,
                      "rank %d's compressed result differs from rank 0's", r);
    /* the stated bound (docs/fusion.md): per element, |y - exact| <= B * S, S the sum over
     * ranks of the largest input magnitude of the element's 256-value chunk; B = 2u + p 2^-23
     * with u = 2^-8 (bfloat16), 2^-11 (float16). The reported figure bounds the measured one. */
    double u = wire == loomFusionWireBf16 ? 0x1p-8 : 0x1p-11, B = 2 * u + p * 0x1p-23;
    /* A chunk is at most 256 consecutive values of x (buckets cover consecutive ranges of it),
     * so it lies inside the aligned 256-blocks b-1, b, b+1 around an element of block b: the
     * sum over ranks of their largest magnitude there is at least S. */
    size_t nb = (a.n + 255) / 256;
    double *bmax = calloc(nb * (size_t)p, sizeof(double));
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < a.n; i++) {
            double m = fabs(z_value(r, i));
            if (m > bmax[(size_t)r * nb + i / 256]) bmax[(size_t)r * nb + i / 256] = m;
        }
    double measured = 0;
    for (size_t i = 0; i < a.n; i++) {
        size_t b = i / 256;
        double ex = 0, w = 0, div = op == loomAvg ? p : 1;
        for (int r = 0; r < p; r++) {
            ex += z_value(r, i) / div;
            double m = bmax[(size_t)r * nb + b];
            if (b > 0 && bmax[(size_t)r * nb + b - 1] > m) m = bmax[(size_t)r * nb + b - 1];
            if (b + 1 < nb && bmax[(size_t)r * nb + b + 1] > m) m = bmax[(size_t)r * nb + b + 1];
            w += m / div;
        }
        double err = fabs(a.results[i] - ex);
        ck_assert_msg(err <= B * w, "element %zu: error %g above the stated bound %g", i, err,
                      B * w);
        if (w > 0 && err / w > measured) measured = err / w;
    }
    free(bmax);
    ck_assert_msg(measured <= a.reported[0], "measured %g above the reported %g", measured,
                  a.reported[0]);
    for (int r = 0; r < p; r++) {
        ck_assert_msg(a.reported[r] <= B, "rank %d reports %g, above the stated bound %g", r,
                      a.reported[r], B);
        ck_assert_msg(a.reported[r] == a.reported[0], "ranks report different errors");
        ck_assert_msg(a.reported[r] > 0, "no error reported");
    }
    printf("compressed %s on %d ranks%s: reported max relative error %.3g (bound %.3g)\n",
           wire == loomFusionWireBf16 ? "bf16" : "fp16", p, what, a.reported[0], B);
    free(a.results);
}

static void run_compressed(int p, int wire)
{
    run_compressed_n(p, wire, 200003, loomSum, "");
}

START_TEST(compressed)
{
    static const int ranks[] = {1, 2, 3, 4};
    run_compressed(ranks[_i / 2], _i % 2 ? loomFusionWireFp16 : loomFusionWireBf16);
}
END_TEST

/* The pipeline: pieces of 256 values a shard (LOOM_FUSION_WIRE_PIECE), so a bucket runs as
 * dozens of pieces and every stage of the pipeline overlaps others; odd sizes (partial last
 * pieces, padding), sum and avg, 1 to 8 ranks, one node (flat), pretend nodes of even size (by
 * node: float32 node sums, 16-bit across) and uneven ones (flat again). */
START_TEST(compressed_pipeline)
{
    static const struct {
        int p;
        const char *nodes;
    } lay[] = {{1, "a"},         {2, "a,b"},         {3, "a,a,a"},         {4, "a,a,b,b"},
               {5, "a,b,a,b,b"}, {6, "a,a,a,b,b,b"}, {7, "a,b,c,d,e,f,g"}, {8, "a,b,a,b,a,b,a,b"}};
    int l = _i / 2;
    int wire = _i % 2 ? loomFusionWireFp16 : loomFusionWireBf16;
    setenv("LOOM_FUSION_WIRE_PIECE", "256", 1);
    setenv("LOOM_NODE_ID", lay[l].nodes, 1);
    param_reset_cache();
    char what[96];
    static const size_t sizes[] = {1, 257, 77777};
    for (size_t k = 0; k < 3; k++) {
        loomRedOp_t op = k == 1 ? loomAvg : loomSum;
        snprintf(what, sizeof(what), ", nodes %s, %zu values, %s", lay[l].nodes, sizes[k],
                 op == loomAvg ? "avg" : "sum");
        run_compressed_n(lay[l].p, wire, sizes[k], op, what);
    }
    unsetenv("LOOM_FUSION_WIRE_PIECE");
    unsetenv("LOOM_NODE_ID");
    param_reset_cache();
}
END_TEST

/* ---- small things ---- */

static int empty_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p;
    (void)arg;
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, NULL) != loomSuccess) return 1;
    int bad = 0;
    /* a step with nothing, and one with only empty tensors */
    if (loomFusionWaitAll(f) != loomSuccess) bad++;
    loomFusionHandle_t h;
    int done = 0;
    if (loomFusionEnqueue(f, NULL, 0, loomFloat32, loomSum, 1, NULL, NULL, NULL, &h) !=
            loomSuccess ||
        loomFusionTest(h, &done) != loomSuccess || !done)
        bad++;
    if (loomFusionWaitAll(f) != loomSuccess) bad++;
    /* bad arguments change nothing */
    float v = 1;
    if (loomFusionEnqueue(f, &v, 1, (loomDataType_t)42, loomSum, 2, NULL, NULL, NULL, NULL) !=
        loomInvalidArgument)
        bad++;
    if (loomFusionEnqueue(f, &v, 1, loomFloat32, (loomRedOp_t)99, 2, NULL, NULL, NULL, NULL) !=
        loomInvalidArgument)
        bad++;
    if (loomFusionEnqueue(f, NULL, 5, loomFloat32, loomSum, 2, NULL, NULL, NULL, NULL) !=
        loomInvalidArgument)
        bad++;
    loomFusionConfig_t c = LOOM_FUSION_CONFIG_INITIALIZER, got;
    c.magic = 7;
    loomFusion_t g;
    if (loomFusionCreate(&g, comm, &c) != loomInvalidArgument) bad++;
    loomFusionGetConfig(f, &got);
    if (got.bucketBytes != 32u << 20 || got.firstBucketBytes != 1u << 20 ||
        got.segmentBytes != 8u << 20 || got.cycleUs != 2000 || got.wire != loomFusionWireExact)
        bad++;
    /* a flushed single tensor, waited alone */
    v = (float)(r + 1);
    if (loomFusionEnqueue(f, &v, 1, loomFloat32, loomSum, 3, NULL, NULL, NULL, &h) != loomSuccess ||
        loomFusionFlush(f) != loomSuccess || loomFusionWait(h) != loomSuccess)
        bad++;
    if (v != (float)(p * (p + 1) / 2)) bad++;
    if (loomFusionWaitAll(f) != loomSuccess) bad++;
    if (bad) fprintf(stderr, "rank %d: %d checks failed\n", r, bad);
    loomFusionDestroy(f);
    return bad;
}

/* Small steps with the progress thread sleeping between events (LOOM_SPIN_US=0): a round or a
 * bucket that ends must be seen at once, not at the next 100 ms wake-up. Before that was fixed
 * (coll.c), every step took at least 200 ms. */
static int latency_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p;
    double *median = arg;
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, NULL) != loomSuccess) return 1;
    enum { STEPS = 15 };
    double t[STEPS];
    float v[8][64] = {{0}};
    for (int s = 0; s < STEPS; s++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int k = 0; k < 8; k++)
            loomFusionEnqueue(f, v[k], 64, loomFloat32, loomSum, (uint64_t)k, NULL, NULL, NULL,
                              NULL);
        if (loomFusionWaitAll(f) != loomSuccess) return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        t[s] = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    }
    for (int i = 0; i < STEPS; i++) /* insertion sort */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    (void)median;
    loomFusionDestroy(f);
    printf("fusion step of 8 small tensors, rank %d of 2 processes, no spinning: median %.2f "
           "ms\n",
           r, t[STEPS / 2] * 1e3);
    if (t[STEPS / 2] >= 0.08) {
        fprintf(stderr, "rank %d: a small step takes %.1f ms: a wake-up is missed\n", r,
                t[STEPS / 2] * 1e3);
        return 1;
    }
    return 0;
}

START_TEST(step_latency)
{
    setenv("LOOM_SPIN_US", "0", 1);
    param_reset_cache();
    /* processes: ranks as threads would share one progress thread, whose wake-ups hide it */
    int st[2];
    int bad = h_run_procs(2, latency_rank, NULL, 50, st);
    unsetenv("LOOM_SPIN_US");
    param_reset_cache();
    ck_assert_msg(bad == 0, "ranks ended with %d and %d", st[0], st[1]);
}
END_TEST

/* A context created without sizes takes the tuning file's (loom-tune --fusion), and a step
 * through it sums exactly. */
static int tuned_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)arg;
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, NULL) != loomSuccess) return 1;
    loomFusionConfig_t got;
    loomFusionGetConfig(f, &got);
    int bad = got.bucketBytes != 5000000 || got.segmentBytes != 300000;
    if (bad)
        fprintf(stderr, "rank %d: bucket %zu segment %zu, the file says 5000000 and 300000\n", r,
                got.bucketBytes, got.segmentBytes);
    enum { N = 400000 }; /* two buckets, several segments */
    float *v = malloc(N * sizeof(float));
    if (v == NULL) return 1;
    for (int i = 0; i < N; i++)
        v[i] = (float)((i + r) % 7);
    if (loomFusionEnqueue(f, v, N, loomFloat32, loomSum, 1, NULL, NULL, NULL, NULL) !=
            loomSuccess ||
        loomFusionWaitAll(f) != loomSuccess)
        bad++;
    for (int i = 0; i < N && !bad; i++) {
        float want = 0;
        for (int q = 0; q < p; q++)
            want += (float)((i + q) % 7);
        if (v[i] != want) bad++;
    }
    free(v);
    loomFusionDestroy(f);
    return bad;
}

START_TEST(tuned_sizes)
{
    char path[] = "/tmp/loom-fusion-tune-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    /* the device section is for device contexts: a host context keeps the host sizes */
    const char text[] = "[ranks=* mem=host]\nfusion_threshold = 5000000\nfusion_segment = 300000\n"
                        "[ranks=* mem=device]\nfusion_threshold = 9000000\nfusion_segment = "
                        "700000\n";
    ck_assert_int_eq(write(fd, text, sizeof(text) - 1), (ssize_t)(sizeof(text) - 1));
    close(fd);
    setenv("LOOM_TUNE_FILE", path, 1);
    param_reset_cache();
    int bad = h_run_threads(2, tuned_rank, NULL);
    unsetenv("LOOM_TUNE_FILE");
    param_reset_cache();
    unlink(path);
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* The codec's fast bfloat16 path against the general conversion: for chunks of mixed
 * magnitudes, subnormal results, zeros, exact values, ties, short tails and non-finite values,
 * the wire bytes are what scaling by the header's power of two, red_narrow16's rounding and the
 * largest |widened x scale - x| give, and decoding gives back the widened values times the scale
 * (NaN kept, the chunk's largest finite magnitude reported). */
START_TEST(codec_bf16_reference)
{
    enum { N = FUSE_CHUNK * 9 + 77 };
    size_t elems = (N + FUSE_CHUNK - 1) / FUSE_CHUNK * FUSE_CHUNK;
    float *x = calloc(N, sizeof(float)), *back = calloc(elems, sizeof(float));
    uint8_t *w = calloc(fuse_wire_bytes(elems), 1);
    float *mx = calloc(elems / FUSE_CHUNK, sizeof(float));
    uint64_t st = 12345;
    for (size_t i = 0; i < N; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(st >> 33);
        size_t c = i / FUSE_CHUNK;
        float mag = ldexpf(1.0f, (int)(r % 60) - 30);
        x[i] = c == 0   ? 0.0f                            /* all zero */
               : c == 1 ? (float)((int)(r % 200) - 100)   /* integers */
               : c == 2 ? ldexpf((float)(r % 1024), -140) /* subnormal */
               : c == 3 ? (i % 2 ? 1.0f + ldexpf(1.0f, -8) : -1.0f - 3 * ldexpf(1, -8)) /* ties */
               : c == 4 ? (i == 4 * FUSE_CHUNK + 5 ? 1e30f : ldexpf((float)r, -40))     /* spread */
                        : (r & 1 ? mag : -mag) * (1.0f + (float)(r % 977) / 977.0f);
    }
    x[7 * FUSE_CHUNK + 3] = NAN;       /* a NaN chunk travels unscaled, by the general path */
    x[8 * FUSE_CHUNK + 9] = -INFINITY; /* and so does an infinite one */
    fuse_encode(loomFusionWireBf16, x, N, elems, NULL, w);
    for (size_t c = 0; c < elems / FUSE_CHUNK; c++) {
        const uint8_t *ck = w + c * fuse_wire_bytes(FUSE_CHUNK);
        float hdr[2];
        memcpy(hdr, ck, sizeof(hdr));
        size_t lo = c * FUSE_CHUNK, m = lo + FUSE_CHUNK <= N ? FUSE_CHUNK : N - lo;
        float y[FUSE_CHUNK] = {0}, yb[FUSE_CHUNK];
        uint16_t want[FUSE_CHUNK], got[FUSE_CHUNK];
        for (size_t i = 0; i < m; i++)
            y[i] = x[lo + i] / hdr[0];
        red_narrow16(loomBfloat16, want, y, FUSE_CHUNK);
        memcpy(got, ck + 8, sizeof(got));
        ck_assert_msg(memcmp(want, got, sizeof(got)) == 0, "chunk %zu: wire values differ", c);
        red_widen16(loomBfloat16, yb, want, FUSE_CHUNK);
        float err = 0;
        for (size_t i = 0; i < m; i++) {
            float e = fabsf(yb[i] * hdr[0] - x[lo + i]);
            err = e > err ? e : err;
        }
        bool nonfinite = c == 7 || c == 8;
        if (!nonfinite)
            ck_assert_msg(memcmp(&err, &hdr[1], sizeof(err)) == 0, "chunk %zu: error %a, header %a",
                          c, (double)err, (double)hdr[1]);
        ck_assert_msg(nonfinite == (hdr[0] == 1.0f) || c == 0, "chunk %zu: scale %a", c,
                      (double)hdr[0]);
    }
    fuse_decode(loomFusionWireBf16, w, elems, back, false, NULL, mx);
    for (size_t c = 0; c < elems / FUSE_CHUNK; c++) {
        float big = 0;
        for (size_t i = c * FUSE_CHUNK; i < (c + 1) * FUSE_CHUNK; i++)
            if (!isnan(back[i]) && fabsf(back[i]) > big) big = fabsf(back[i]);
        ck_assert_msg(mx[c] == big, "chunk %zu: largest magnitude %a, want %a", c, (double)mx[c],
                      (double)big);
    }
    ck_assert(isnan(back[7 * FUSE_CHUNK + 3]));
    ck_assert(back[8 * FUSE_CHUNK + 9] == -INFINITY);
    ck_assert(back[3] == 0.0f && back[FUSE_CHUNK + 1] == x[FUSE_CHUNK + 1]);
    free(x), free(back), free(w), free(mx);
}
END_TEST

START_TEST(edges)
{
    int bad = h_run_threads(3, empty_rank, NULL);
    ck_assert_int_eq(bad, 0);
}
END_TEST

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    Suite *s = suite_create("fusion");
    const h_case_t cases[] = {
        {"edges", edges, "lifetime", 60, 1},
        {"codec_bf16_reference", codec_bf16_reference, NULL, 60, 1},
        {"abort_threads", abort_threads, "lifetime", 120, 1},
        {"abort_compressed", abort_compressed, "lifetime", 120, 1},
        {"step_latency", step_latency, NULL, 60, 1},
        {"mismatch_one", mismatch, "lifetime", 120, 1},
        {"lists_shm", lists_shm, NULL, 240, 4},
        {"lists_tcp", lists_tcp, NULL, 240, 3},
        {"lists_flat", lists_flat, NULL, 240, 2},
        {"lists_varied_config", lists_varied_config, NULL, 240, 1},
        {"big_tensor", big_tensor, NULL, 240, 1},
        {"uneven_speeds", uneven_speeds, NULL, 240, 1},
        {"staggered_cuts", staggered_cuts, "timing", 120, 1},
        {"group_fused", group_fused, NULL, 120, 4},
        {"group_mismatch", group_mismatch, NULL, 60, 1},
        {"mismatch", mismatch, NULL, 120, 2 * MM_N},
        {"abort_in_flight", abort_in_flight, NULL, 120, 2},
        {"peer_gone", peer_gone, NULL, 60, 1},
        {"compressed", compressed, NULL, 240, 8},
        {"compressed_pipeline", compressed_pipeline, NULL, 240, 16},
        {"tuned_sizes", tuned_sizes, NULL, 60, 1},
    };
    h_add_cases(s, cases, sizeof(cases) / sizeof(cases[0]), 120);
    return h_check_main(s, false, CK_NORMAL);
}
