/*
 * Deterministic mode (LOOM_DETERMINISTIC=1, src/algo/determ.c): floating-point allreduce, reduce
 * and reduce-scatter give, bit for bit, the left fold of the ranks' inputs in rank order, one
 * rounding per step, computed here by a single loop, whatever LOOM_ALGO, LOOM_NCHANNELS, the
 * slice, the transport, the node layout, group fusion or a fusion context's buckets. Inputs are
 * random (fixed seeds) of mixed magnitude, so that other summation orders give other bits: the
 * control case runs the same grid without the mode and must see results that differ from the
 * fold (proof that the comparison can fail). Integer sums stay exact. Ranks are threads of this
 * process on loopback (tests/meson.build sets LOOM_SOCKET_IFNAME=lo).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "loom.h"
#include "param.h"
#include "reduce.h"

#define NTYPES 4
static const loomDataType_t ftypes[NTYPES] = {loomFloat32, loomFloat16, loomBfloat16, loomFloat64};
#define NOPS 3
static const loomRedOp_t fops[NOPS] = {loomSum, loomAvg, loomProd};

enum {
    K_ALLREDUCE,
    K_ALLREDUCE_INPLACE,
    K_SMALL, /* all inputs within one 256-byte slice (float64: up to 4 ranks): determ's oneshot */
    K_SMALL_INPLACE,
    K_REDUCE,
    K_REDUCESCATTER,
    K_GROUP,
    K_FUSION,
    K_N
};
static const char *const kname[K_N] = {
    "allreduce", "allreduce in place", "small allreduce",    "small allreduce in place",
    "reduce",    "reduce-scatter",     "grouped allreduces", "fusion"};

#define COUNT 1037  /* allreduce and reduce; not a multiple of any rank count tried */
#define RSCOUNT 131 /* reduce-scatter, per rank */
#define SMALL 7

/* ---- inputs and the reference ------------------------------------------------------------ */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank r's element i for (type, op, tensor): random sign and mantissa, and an exponent spread
 * wide enough that the rounding of every partial sum depends on which values it holds; products
 * are of values near 1 (no overflow over 8 ranks). */
static double in_val(loomDataType_t t, loomRedOp_t op, int tensor, int r, size_t i)
{
    uint64_t h = mix(((uint64_t)t << 56) ^ ((uint64_t)op << 48) ^ ((uint64_t)tensor << 40) ^
                     ((uint64_t)r << 32) ^ i);
    double m = 1.0 + (double)(h >> 11) * 0x1p-53; /* [1, 2) */
    if (op == loomProd) return (h & 1 ? 0.75 : 1.0) * m;
    int span = t == loomFloat16 ? 8 : t == loomFloat64 ? 40 : 20;
    int e = (int)((h >> 1) % (uint64_t)(2 * span + 1)) - span;
    return ((h >> 8) & 1 ? -1 : 1) * ldexp(m, e);
}

static size_t tsize(loomDataType_t t)
{
    return t == loomFloat64 ? 8 : t == loomFloat32 ? 4 : 2;
}

static double get(loomDataType_t t, const void *b, size_t i)
{
    switch (t) {
    case loomFloat16: return red_half_to_float(((const uint16_t *)b)[i]);
    case loomBfloat16: return red_bf16_to_float(((const uint16_t *)b)[i]);
    case loomFloat32: return ((const float *)b)[i];
    default: return ((const double *)b)[i];
    }
}

/* Stores v rounded to the type (through float for the 16-bit types, as loom widens them). */
static void put(loomDataType_t t, void *b, size_t i, double v)
{
    switch (t) {
    case loomFloat16: ((uint16_t *)b)[i] = red_float_to_half((float)v); break;
    case loomBfloat16: ((uint16_t *)b)[i] = red_float_to_bf16((float)v); break;
    case loomFloat32: ((float *)b)[i] = (float)v; break;
    default: ((double *)b)[i] = v; break;
    }
}

/* One step of the fold in the type's arithmetic: float32 for float32 and the 16-bit types
 * (rounded back to the type once per step), float64 for float64. */
static void step(loomDataType_t t, loomRedOp_t op, void *acc, size_t i, const void *x, size_t j)
{
    if (t == loomFloat64) {
        double a = ((double *)acc)[i], b = ((const double *)x)[j];
        ((double *)acc)[i] = op == loomProd ? a * b : a + b;
        return;
    }
    float a = (float)get(t, acc, i), b = (float)get(t, x, j);
    put(t, acc, i, op == loomProd ? a * b : a + b);
}

static void finish_avg(loomDataType_t t, void *acc, size_t i, int p)
{
    if (t == loomFloat64)
        ((double *)acc)[i] /= p;
    else
        put(t, acc, i, (float)get(t, acc, i) / (float)p);
}

/* Fills rank r's input of n elements (in the type). */
static void fill(loomDataType_t t, loomRedOp_t op, int tensor, int r, void *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put(t, b, i, in_val(t, op, tensor, r, i));
}

/* The reference: ((x0 op x1) op x2) ... op x(p-1) element by element, then / p for avg. */
static void *reference(loomDataType_t t, loomRedOp_t op, int tensor, int p, size_t n)
{
    size_t es = tsize(t);
    uint8_t *acc = malloc(n * es), *x = malloc(n * es);
    fill(t, op, tensor, 0, acc, n);
    for (int q = 1; q < p; q++) {
        fill(t, op, tensor, q, x, n);
        for (size_t i = 0; i < n; i++)
            step(t, op, acc, i, x, i);
    }
    if (op == loomAvg)
        for (size_t i = 0; i < n; i++)
            finish_avg(t, acc, i, p);
    free(x);
    return acc;
}

/* ---- one job ------------------------------------------------------------------------------ */

typedef struct {
    int p;
    /* per rank: elements that differ from the reference, and the first of them */
    long diff[8];
    char first[8][200];
    bool fusion; /* also run the fusion context case */
    long int_bad[8];
} job_t;

static void note(job_t *j, int r, long bad, const char *what, loomDataType_t t, loomRedOp_t op,
                 size_t at)
{
    if (bad == 0) return;
    if (j->diff[r] == 0)
        snprintf(j->first[r], sizeof(j->first[r]),
                 "rank %d: %s of %s op %d: %ld elements, first %zu", r, what, red_type_name(t),
                 (int)op, bad, at);
    j->diff[r] += bad;
}

static long compare(const void *got, const void *want, size_t n, size_t es, size_t *first)
{
    long bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const uint8_t *)got + i * es, (const uint8_t *)want + i * es, es) != 0) {
            if (bad == 0) *first = i;
            bad++;
        }
    return bad;
}

static int run_kind(loomComm_t comm, int r, int p, job_t *j, int k, loomDataType_t t,
                    loomRedOp_t op)
{
    size_t es = tsize(t), n = k == K_REDUCESCATTER                   ? RSCOUNT * (size_t)p
                              : k == K_SMALL || k == K_SMALL_INPLACE ? SMALL
                                                                     : COUNT;
    size_t first = 0;
    uint8_t *send = malloc(n * es), *recv = calloc(n, es);
    void *want = reference(t, op, 0, p, n);
    loomResult_t res = loomSuccess;
    fill(t, op, 0, r, send, n);
    switch (k) {
    case K_ALLREDUCE:
    case K_SMALL: res = loomAllReduce(send, recv, n, t, op, comm, NULL); break;
    case K_ALLREDUCE_INPLACE:
    case K_SMALL_INPLACE:
        memcpy(recv, send, n * es);
        res = loomAllReduce(recv, recv, n, t, op, comm, NULL);
        break;
    case K_REDUCE: res = loomReduce(send, recv, n, t, op, p - 1, comm, NULL); break;
    case K_REDUCESCATTER: res = loomReduceScatter(send, recv, RSCOUNT, t, op, comm, NULL); break;
    }
    if (res != loomSuccess) {
        fprintf(stderr, "rank %d: %s failed: %s\n", r, kname[k], loomGetLastError(comm));
        return 1;
    }
    long bad = 0;
    if (k == K_REDUCESCATTER)
        bad = compare(recv, (uint8_t *)want + (size_t)r * RSCOUNT * es, RSCOUNT, es, &first);
    else if (k != K_REDUCE || r == p - 1)
        bad = compare(recv, want, n, es, &first);
    note(j, r, bad, kname[k], t, op, first);
    free(send);
    free(recv);
    free(want);
    return 0;
}

/* Three allreduces in one group (loom packs them into one: src/fusion/fuse.c's group fusion),
 * each tensor against its own fold. */
static int run_group(loomComm_t comm, int r, int p, job_t *j, loomDataType_t t, loomRedOp_t op)
{
    static const size_t n[3] = {5, 300, 77};
    size_t es = tsize(t);
    void *b[3];
    for (int x = 0; x < 3; x++) {
        b[x] = malloc(n[x] * es);
        fill(t, op, 1 + x, r, b[x], n[x]);
    }
    loomGroupStart();
    for (int x = 0; x < 3; x++)
        loomAllReduce(b[x], b[x], n[x], t, op, comm, NULL);
    if (loomGroupEnd() != loomSuccess) {
        fprintf(stderr, "rank %d: group failed: %s\n", r, loomGetLastError(comm));
        return 1;
    }
    for (int x = 0; x < 3; x++) {
        void *want = reference(t, op, 1 + x, p, n[x]);
        size_t first = 0;
        note(j, r, compare(b[x], want, n[x], es, &first), kname[K_GROUP], t, op, first);
        free(want);
        free(b[x]);
    }
    return 0;
}

/* A fusion context with small buckets and segments: tensors are cut and packed at offsets that
 * differ from their own; each must still equal its fold. */
static int run_fusion(loomComm_t comm, int r, int p, job_t *j)
{
    static const size_t n[4] = {1000, 3, 2500, 64};
    loomFusionConfig_t cfg = LOOM_FUSION_CONFIG_INITIALIZER;
    cfg.bucketBytes = 4096;
    cfg.firstBucketBytes = 1024;
    cfg.segmentBytes = 1536;
    loomFusion_t f;
    if (loomFusionCreate(&f, comm, &cfg) != loomSuccess) {
        fprintf(stderr, "rank %d: fusion create: %s\n", r, loomGetLastError(comm));
        return 1;
    }
    float *b[4];
    for (int x = 0; x < 4; x++) {
        b[x] = malloc(n[x] * sizeof(float));
        fill(loomFloat32, loomSum, 10 + x, r, b[x], n[x]);
        if (loomFusionEnqueue(f, b[x], n[x], loomFloat32, loomSum, (uint64_t)x, NULL, NULL, NULL,
                              NULL) != loomSuccess) {
            fprintf(stderr, "rank %d: fusion enqueue: %s\n", r, loomGetLastError(comm));
            return 1;
        }
    }
    if (loomFusionWaitAll(f) != loomSuccess) {
        fprintf(stderr, "rank %d: fusion wait: %s\n", r, loomGetLastError(comm));
        return 1;
    }
    loomFusionDestroy(f);
    for (int x = 0; x < 4; x++) {
        void *want = reference(loomFloat32, loomSum, 10 + x, p, n[x]);
        size_t first = 0;
        note(j, r, compare(b[x], want, n[x], 4, &first), kname[K_FUSION], loomFloat32, loomSum,
             first);
        free(want);
        free(b[x]);
    }
    return 0;
}

/* Integer sums: exact whatever the order (wrapping as unsigned arithmetic does). */
static int run_int(loomComm_t comm, int r, int p, job_t *j)
{
    size_t n = COUNT;
    int32_t *send = malloc(n * 4), *recv = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        send[i] = (int32_t)(uint32_t)mix(((uint64_t)r << 32) ^ i);
    if (loomAllReduce(send, recv, n, loomInt32, loomSum, comm, NULL) != loomSuccess) {
        fprintf(stderr, "rank %d: int32 allreduce: %s\n", r, loomGetLastError(comm));
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t want = 0;
        for (int q = 0; q < p; q++)
            want += (uint32_t)mix(((uint64_t)q << 32) ^ i);
        if ((uint32_t)recv[i] != want) j->int_bad[r]++;
    }
    free(send);
    free(recv);
    return 0;
}

static int job_rank(loomComm_t comm, int r, int p, void *arg)
{
    job_t *j = arg;
    for (int ti = 0; ti < NTYPES; ti++)
        for (int oi = 0; oi < NOPS; oi++) {
            for (int k = K_ALLREDUCE; k <= K_REDUCESCATTER; k++)
                if (run_kind(comm, r, p, j, k, ftypes[ti], fops[oi])) return 1;
            if (oi == 0 && run_group(comm, r, p, j, ftypes[ti], fops[oi])) return 1;
        }
    if (run_int(comm, r, p, j)) return 1;
    if (j->fusion && run_fusion(comm, r, p, j)) return 1;
    return 0;
}

/* ---- the grid ----------------------------------------------------------------------------- */

static const char *const algos[] = {
    "ring",    "rd",          "rabenseifner", "tree",   "hier", "hier:tree", "hier:rabenseifner",
    "hier:rd", "hier_leader", "ps",           "determ", ""};
#define NALGOS ((int)(sizeof(algos) / sizeof(algos[0])))
static const int nchs[] = {1, 2, 4};

/* Node names for LOOM_NODE_ID: one node, or two (uneven where p is odd). */
static void layout(int p, bool two, char *buf, size_t len)
{
    size_t o = 0;
    for (int r = 0; r < p && o < len; r++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", r ? "," : "",
                              !two || r < (p + 1) / 2 ? "a" : "b");
}

/* The transports, cycling: tcp alone over two nodes, shm alone on one node (it reaches no other),
 * and the default (shm inside each of two nodes, tcp between them). */
static const char *const transports[] = {"tcp", "shm", ""};

typedef struct {
    long diff, int_bad;
    int failed;
    char first[200];
} run_result_t;

static run_result_t run_job(int p, const char *algo, int nch, const char *transport,
                            const char *nodes, bool determ, bool fusion)
{
    setenv("LOOM_ALGO", algo, 1);
    char v[16];
    snprintf(v, sizeof(v), "%d", nch);
    setenv("LOOM_NCHANNELS", v, 1);
    setenv("LOOM_TRANSPORT", transport, 1);
    setenv("LOOM_NODE_ID", nodes, 1);
    setenv("LOOM_DETERMINISTIC", determ ? "1" : "0", 1);
    /* small slices: many pieces per block, so slicing would show if it mattered */
    setenv("LOOM_SLICE_SIZE", "256", 1);
    param_reset_cache();
    job_t j = {.p = p, .fusion = fusion};
    run_result_t out = {0};
    out.failed = h_run_threads(p, job_rank, &j);
    for (int r = 0; r < p; r++) {
        out.diff += j.diff[r];
        out.int_bad += j.int_bad[r];
        if (j.diff[r] && out.first[0] == '\0')
            snprintf(out.first, sizeof(out.first), "%s", j.first[r]);
    }
    return out;
}

static void clear_env(void)
{
    unsetenv("LOOM_ALGO");
    unsetenv("LOOM_NCHANNELS");
    unsetenv("LOOM_TRANSPORT");
    unsetenv("LOOM_NODE_ID");
    unsetenv("LOOM_DETERMINISTIC");
    unsetenv("LOOM_SLICE_SIZE");
    param_reset_cache();
}

/* Loop index _i: the rank count p = 2 + _i (2..8). Every algorithm once per p, with the channel
 * count and the transport cycling, so that each value of each axis meets several rank counts. */
START_TEST(determ_grid)
{
    int p = 2 + _i;
    for (int a = 0; a < NALGOS; a++) {
        int nch = nchs[(a + p) % 3];
        const char *tp = transports[(a + 2 * p) % 3];
        char nodes[64];
        layout(p, strcmp(tp, "shm") != 0, nodes, sizeof(nodes));
        run_result_t r = run_job(p, algos[a], nch, tp, nodes, true, a == 0 || a == 4);
        ck_assert_msg(r.failed == 0,
                      "p=%d LOOM_ALGO=%s nch=%d transport '%s' nodes %s: %d ranks failed", p,
                      algos[a], nch, tp, nodes, r.failed);
        ck_assert_msg(r.diff == 0,
                      "LOOM_DETERMINISTIC=1, p=%d LOOM_ALGO=%s nch=%d transport '%s' nodes %s: %ld "
                      "elements "
                      "differ from the rank-order fold; %s",
                      p, algos[a], nch, tp, nodes, r.diff, r.first);
        ck_assert_msg(r.int_bad == 0, "p=%d %s: %ld int32 sums wrong", p, algos[a], r.int_bad);
    }
    clear_env();
}
END_TEST

/* The same inputs without the mode: the algorithms' own orders give other bits somewhere (so the
 * comparison above can fail), while integer sums stay exact. */
START_TEST(determ_control)
{
    long differ = 0;
    int cases = 0;
    for (int p = 3; p <= 5; p++)
        for (int a = 0; a < 4; a++) {
            char nodes[64];
            layout(p, false, nodes, sizeof(nodes));
            run_result_t r = run_job(p, algos[a], 2, "shm", nodes, false, false);
            ck_assert_msg(r.failed == 0, "p=%d %s: %d ranks failed", p, algos[a], r.failed);
            ck_assert_msg(r.int_bad == 0, "p=%d %s: %ld int32 sums wrong", p, algos[a], r.int_bad);
            differ += r.diff;
            cases += r.diff > 0;
        }
    clear_env();
    fprintf(stderr,
            "control: %d of 12 jobs without LOOM_DETERMINISTIC differ from the fold (%ld "
            "elements)\n",
            cases, differ);
    ck_assert_msg(cases > 0, "without LOOM_DETERMINISTIC no result differed from the rank-order "
                             "fold: the inputs cannot tell orders apart");
}
END_TEST

/* LOOM_DETERMINISTIC takes 0 or 1; anything else fails init naming the variable. */

START_TEST(determ_bad_value)
{
    setenv("LOOM_DETERMINISTIC", "yes", 1);
    param_reset_cache();
    loomUniqueId id;
    ck_assert_int_eq(loomGetUniqueId(&id), loomSuccess);
    loomComm_t c = NULL;
    loomResult_t r = loomCommInitRank(&c, 1, id, 0);
    char e[512];
    snprintf(e, sizeof(e), "%s", loomGetLastError(NULL));
    clear_env();
    ck_assert_int_eq(r, loomInvalidUsage);
    ck_assert_msg(strstr(e, "LOOM_DETERMINISTIC=yes") != NULL, "%s", e);
}
END_TEST

/* A 16-bit fusion wire rounds by bucket: refused in deterministic mode, with the reason. */
static int wire_rank(loomComm_t comm, int r, int p, void *arg)
{
    (void)p, (void)arg;
    loomFusionConfig_t cfg = LOOM_FUSION_CONFIG_INITIALIZER;
    cfg.wire = loomFusionWireBf16;
    loomFusion_t f = NULL;
    loomResult_t res = loomFusionCreate(&f, comm, &cfg);
    if (res != loomInvalidUsage || strstr(loomGetLastError(comm), "LOOM_DETERMINISTIC") == NULL) {
        fprintf(stderr, "rank %d: bf16 wire in deterministic mode gave %d: %s\n", r, (int)res,
                loomGetLastError(comm));
        return 1;
    }
    return 0;
}

START_TEST(determ_wire_refused)
{
    setenv("LOOM_DETERMINISTIC", "1", 1);
    param_reset_cache();
    int bad = h_run_threads(2, wire_rank, NULL);
    clear_env();
    ck_assert_int_eq(bad, 0);
}
END_TEST

/* Ranks that disagree on the mode run different schedules: the call fails on both, naming the
 * variable, instead of mixing two orders (or hanging). Two forked processes, each with its own
 * environment. */
static int mismatch_body(int r, const loomUniqueId *id, void *p)
{
    int(*fds)[2] = p;
    setenv("LOOM_DETERMINISTIC", r ? "1" : "0", 1);
    param_reset_cache();
    loomComm_t c = NULL;
    if (loomCommInitRank(&c, 2, *id, r) != loomSuccess) return 2;
    float *b = calloc(4096, sizeof(float));
    loomResult_t res = loomAllReduce(b, b, 4096, loomFloat32, loomSum, c, NULL);
    char text[1024];
    int n = snprintf(text, sizeof(text), "%d %s", (int)res, loomGetLastError(c));
    if (write(fds[r][1], text, (size_t)n) < 0) return 3;
    loomCommAbort(c);
    return 0;
}

START_TEST(determ_mismatch)
{
    int fds[2][2], status[2];
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(pipe(fds[r]), 0);
    h_fork_procs(2, mismatch_body, fds, 60, status);
    for (int r = 0; r < 2; r++)
        close(fds[r][1]);
    int named = 0;
    for (int r = 0; r < 2; r++) {
        char text[1025] = "";
        ssize_t n = read(fds[r][0], text, sizeof(text) - 1);
        close(fds[r][0]);
        ck_assert_msg(status[r] == 0, "rank %d: status %d", r, status[r]);
        ck_assert_msg(n > 0 && atoi(text) != loomSuccess, "rank %d succeeded: '%s'", r, text);
        named += strstr(text, "LOOM_DETERMINISTIC") != NULL;
        fprintf(stderr, "mismatch, rank %d: %s\n", r, text);
    }
    ck_assert_msg(named > 0, "no rank's error names LOOM_DETERMINISTIC");
}
END_TEST

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    Suite *s = suite_create("determ");
    TCase *tc = tcase_create("determ");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, determ_grid, 0, 7);
    tcase_add_test(tc, determ_control);
    tcase_add_test(tc, determ_bad_value);
    tcase_add_test(tc, determ_wire_refused);
    tcase_add_test(tc, determ_mismatch);
    suite_add_tcase(s, tc);
    return h_check_main(s, false, CK_NORMAL);
}
