/*
 * API-level tests: versions and error strings, config versioning, non-blocking init, split,
 * groups and point to point, avg and pre-multiplied sums, last-error semantics, loomCommInitAll,
 * finalize and statistics. Ranks are threads of this process over loopback TCP.
 *
 * Rank bodies never call ck_assert: Check's failure path is not meant for other threads (it
 * longjmps in CK_FORK=no mode). They print what went wrong and return non-zero; the test's
 * main thread asserts on the count.
 */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "harness.h"
#include "param.h"
#include "reduce.h"

/* Reports a failed condition inside a rank body and jumps to its cleanup (label `out`, with an
 * int `rc` in scope), so peers blocked on this rank see its connections close instead of
 * waiting for LOOM_TIMEOUT. */
#define RCHECK(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__,        \
                    #cond);                                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            rc = 1;                                                                                \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* The same without leaving: for a wrong result code after which the rest is still worth
 * checking. */
#define RSOFT(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__, __LINE__,        \
                    #cond);                                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            rc = 1;                                                                                \
        }                                                                                          \
    } while (0)

/* A loom call that must succeed; prints loom's own text when it does not. */
#define RCALL(call)                                                                                \
    do {                                                                                           \
        loomResult_t r_ = (call);                                                                  \
        RCHECK(r_ == loomSuccess, "%s returned %d (%s): %s", #call, (int)r_,                       \
               loomGetErrorString(r_), loomGetLastError(NULL));                                    \
    } while (0)

/* ---- A runner whose ranks make their own communicators ---------------------------------- */

/* h_run_threads creates and destroys the communicators itself; tests of init, finalize and
 * destroy need to do that in the rank body. */
typedef int (*raw_fn)(const loomUniqueId *id, int rank, int nranks, void *arg);

typedef struct {
    const loomUniqueId *id;
    int rank, nranks;
    raw_fn fn;
    void *arg;
    int rc;
} raw_rank_t;

static void *raw_main(void *p)
{
    raw_rank_t *t = p;
    t->rc = t->fn(t->id, t->rank, t->nranks, t->arg);
    return NULL;
}

/* Returns the number of ranks that failed. */
static int run_raw(int nranks, raw_fn fn, void *arg)
{
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess) {
        fprintf(stderr, "loomGetUniqueId failed: %s\n", loomGetLastError(NULL));
        return nranks;
    }
    raw_rank_t t[16];
    pthread_t th[16];
    for (int r = 0; r < nranks; r++) {
        t[r] = (raw_rank_t){.id = &id, .rank = r, .nranks = nranks, .fn = fn, .arg = arg};
        pthread_create(&th[r], NULL, raw_main, &t[r]);
    }
    int bad = 0;
    for (int r = 0; r < nranks; r++) {
        pthread_join(th[r], NULL);
        if (t[r].rc) bad++;
    }
    return bad;
}

/* ---- Element values for every type -------------------------------------------------------- */

static bool type_is_float(loomDataType_t t)
{
    return t == loomFloat16 || t == loomFloat32 || t == loomFloat64 || t == loomBfloat16 ||
           t == loomFloat8e4m3 || t == loomFloat8e5m2;
}

static bool type_is_fp8(loomDataType_t t)
{
    return t == loomFloat8e4m3 || t == loomFloat8e5m2;
}

static bool type_is_unsigned(loomDataType_t t)
{
    return t == loomUint8 || t == loomUint32 || t == loomUint64;
}

static void put_val(loomDataType_t t, void *buf, size_t i, double v)
{
    switch (t) {
    case loomInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case loomUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case loomInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case loomUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case loomInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case loomUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case loomFloat16: ((uint16_t *)buf)[i] = red_float_to_half((float)v); break;
    case loomFloat32: ((float *)buf)[i] = (float)v; break;
    case loomFloat64: ((double *)buf)[i] = v; break;
    case loomBfloat16: ((uint16_t *)buf)[i] = red_float_to_bf16((float)v); break;
    case loomFloat8e4m3:
    case loomFloat8e5m2: ((uint8_t *)buf)[i] = red_float_to_fp8(t, (float)v); break;
    default: break;
    }
}

static double get_val(loomDataType_t t, const void *buf, size_t i)
{
    switch (t) {
    case loomInt8: return ((const int8_t *)buf)[i];
    case loomUint8: return ((const uint8_t *)buf)[i];
    case loomInt32: return ((const int32_t *)buf)[i];
    case loomUint32: return ((const uint32_t *)buf)[i];
    case loomInt64: return (double)((const int64_t *)buf)[i];
    case loomUint64: return (double)((const uint64_t *)buf)[i];
    case loomFloat16: return red_half_to_float(((const uint16_t *)buf)[i]);
    case loomFloat32: return ((const float *)buf)[i];
    case loomFloat64: return ((const double *)buf)[i];
    case loomBfloat16: return red_bf16_to_float(((const uint16_t *)buf)[i]);
    case loomFloat8e4m3:
    case loomFloat8e5m2: return red_fp8_to_float(t, ((const uint8_t *)buf)[i]);
    default: return 0;
    }
}

/* Small values whose sums over 4 ranks, times 2, are exact in every type (int8 and bfloat16
 * included). Signed types get negatives, so that avg's truncation towards zero is visible;
 * float types get halves, so that their avg needs a rounded division. */
static double val(loomDataType_t t, int r, size_t i)
{
    int b = (int)((i * 7 + (size_t)r * 5) % 13);
    /* 8-bit floats: -1 .. 1 in halves, whose sums over 4 ranks (times 2 or 0.5) stay exact */
    if (type_is_fp8(t)) return (b % 5 - 2) * 0.5;
    if (type_is_unsigned(t)) return b;
    double v = b - 6;
    if (type_is_float(t) && i % 3 == 0) v += 0.5;
    return v;
}

/* avg = the sum divided once: truncating for integers, one correctly rounded division in the
 * type's arithmetic (float32 for half and bfloat16) for floats. */
static double expect_avg(loomDataType_t t, double sum, int n)
{
    switch (t) {
    case loomFloat16: return red_half_to_float(red_float_to_half((float)sum / (float)n));
    case loomBfloat16: return red_bf16_to_float(red_float_to_bf16((float)sum / (float)n));
    case loomFloat8e4m3:
    case loomFloat8e5m2: return red_fp8_to_float(t, red_float_to_fp8(t, (float)sum / (float)n));
    case loomFloat32: return (float)sum / (float)n;
    case loomFloat64: return sum / n;
    default: return (double)((int64_t)sum / n); /* C truncates towards zero */
    }
}

/* ---- 1. version and error strings ---------------------------------------------------------- */

START_TEST(test_version)
{
    int v = -1;
    ck_assert_int_eq(loomGetVersion(&v), loomSuccess);
    ck_assert_int_eq(v, LOOM_VERSION_CODE);
    ck_assert_int_eq(loomGetVersion(NULL), loomInvalidArgument);
    for (int a = 0; a < loomNumResults; a++) {
        const char *s = loomGetErrorString((loomResult_t)a);
        ck_assert_ptr_nonnull(s);
        ck_assert_msg(s[0] != '\0', "empty error string for %d", a);
        for (int b = 0; b < a; b++)
            ck_assert_msg(strcmp(s, loomGetErrorString((loomResult_t)b)) != 0,
                          "results %d and %d share the text '%s'", a, b, s);
    }
}
END_TEST

/* ---- 2. config versioning ------------------------------------------------------------------ */

/* What an older header's loomConfig_t looked like: the versioned prefix and `blocking`. */
typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
} old_config_t;

/* A newer header: today's fields first, then fields this library does not know. */
typedef struct {
    loomConfig_t base;
    int future_int;
    double future_double;
    const char *future_ptr;
} new_config_t;

/* Inits a one-rank communicator with `cfg`; when it is accepted, checks that it works and
 * returns it (the caller inspects and destroys it). */
static loomResult_t init_one(loomConfig_t *cfg, loomComm_t *out)
{
    loomUniqueId id;
    loomResult_t r = loomGetUniqueId(&id);
    if (r != loomSuccess) return r;
    loomComm_t comm = NULL;
    r = loomCommInitRankConfig(&comm, 1, id, 0, cfg);
    if (r == loomInProgress) {
        loomResult_t a = loomInProgress;
        for (int i = 0; i < 20000 && a == loomInProgress; i++) {
            if (loomCommGetAsyncError(comm, &a) != loomSuccess) break;
            if (a == loomInProgress) usleep(1000);
        }
        r = a;
    }
    if (r != loomSuccess) return r;
    int in[4] = {1, 2, 3, 4}, res[4] = {0};
    r = loomAllReduce(in, res, 4, loomInt32, loomSum, comm, NULL);
    if (r == loomSuccess && memcmp(in, res, sizeof(in)) != 0) r = loomInternalError;
    *out = comm;
    return r;
}

START_TEST(test_config_versions)
{
    loomComm_t comm = NULL;
    int def_channels = (int)param_int(PARAM_NCHANNELS);

    /* (a) no config */
    ck_assert_int_eq(init_one(NULL, &comm), loomSuccess);
    ck_assert_int_eq(loomCommDestroy(comm), loomSuccess);

    /* (b) today's initializer */
    loomConfig_t cur = LOOM_CONFIG_INITIALIZER;
    comm = NULL;
    ck_assert_int_eq(init_one(&cur, &comm), loomSuccess);
    ck_assert_int_eq(loomCommDestroy(comm), loomSuccess);

    /* (c) an older header: only the fields its size covers are read; the rest take defaults */
    old_config_t old;
    memset(&old, 0, sizeof(old)); /* padding too: loom may read it as the next field */
    old.size = sizeof(old);
    old.magic = LOOM_CONFIG_MAGIC;
    old.version = LOOM_CONFIG_VERSION;
    old.blocking = 1;
    comm = NULL;
    ck_assert_int_eq(init_one((loomConfig_t *)&old, &comm), loomSuccess);
    ck_assert_int_eq(comm->tune.nchannels, def_channels);
    ck_assert_int_eq(loomCommDestroy(comm), loomSuccess);
    /* ... and the one field it does carry is honoured */
    old.blocking = 0;
    comm = NULL;
    ck_assert_int_eq(init_one((loomConfig_t *)&old, &comm), loomSuccess);
    ck_assert_int_eq(loomCommDestroy(comm), loomSuccess);
    /* the bare prefix (size, magic, version) is a valid config as well */
    old.size = offsetof(loomConfig_t, blocking);
    comm = NULL;
    ck_assert_int_eq(init_one((loomConfig_t *)&old, &comm), loomSuccess);
    ck_assert_int_eq(loomCommDestroy(comm), loomSuccess);

    /* (d) a newer header: larger, with a later version; known fields are read, the others
     * ignored */
    new_config_t nw;
    memset(&nw, 0xa5, sizeof(nw)); /* garbage in the unknown fields must not matter */
    nw.base = (loomConfig_t)LOOM_CONFIG_INITIALIZER;
    nw.base.size = sizeof(nw);
    nw.base.version = LOOM_CONFIG_VERSION + 1;
    nw.base.nChannels = 1;
    nw.base.commName = "newer-header";
    nw.future_int = 42;
    nw.future_double = 1.5;
    nw.future_ptr = "ignored";
    comm = NULL;
    ck_assert_int_eq(init_one(&nw.base, &comm), loomSuccess);
    ck_assert_int_eq(comm->tune.nchannels, 1);
    ck_assert_str_eq(comm->lay.name, "newer-header");
    ck_assert_int_eq(loomCommDestroy(comm), loomSuccess);

    /* Rejected before anything happens: bad magic, and a size that does not cover the prefix.
     * The unique id is never looked at, so a zero one will do; *comm must stay untouched. */
    loomUniqueId zero;
    memset(&zero, 0, sizeof(zero));
    loomComm_t sentinel = (loomComm_t)(uintptr_t)0x1234;
    loomConfig_t bad = LOOM_CONFIG_INITIALIZER;
    bad.magic = 0xdeadbeefu;
    comm = sentinel;
    ck_assert_int_eq(loomCommInitRankConfig(&comm, 1, zero, 0, &bad), loomInvalidArgument);
    ck_assert_ptr_eq(comm, sentinel);
    ck_assert_ptr_nonnull(strstr(loomGetLastError(NULL), "magic"));
    loomConfig_t small = LOOM_CONFIG_INITIALIZER;
    small.size = offsetof(loomConfig_t, blocking) - 1;
    ck_assert_int_eq(loomCommInitRankConfig(&comm, 1, zero, 0, &small), loomInvalidArgument);
    small.size = sizeof(size_t);
    ck_assert_int_eq(loomCommInitRankConfig(&comm, 1, zero, 0, &small), loomInvalidArgument);
    small.size = 0;
    ck_assert_int_eq(loomCommInitRankConfig(&comm, 1, zero, 0, &small), loomInvalidArgument);
    ck_assert_ptr_eq(comm, sentinel);
}
END_TEST

/* ---- 3. non-blocking init ------------------------------------------------------------------ */

static int nonblocking_rank(const loomUniqueId *id, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0;
    loomComm_t comm = NULL;
    loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    loomResult_t r = loomCommInitRankConfig(&comm, nranks, *id, rank, &cfg);
    RCHECK(r == loomInProgress || r == loomSuccess, "init returned %d: %s", (int)r,
           loomGetLastError(NULL));
    RCHECK(comm != NULL, "no communicator returned");
    loomResult_t a = loomInProgress;
    for (int i = 0; i < 20000 && a == loomInProgress; i++) {
        RCALL(loomCommGetAsyncError(comm, &a));
        if (a == loomInProgress) usleep(1000);
    }
    RCHECK(a == loomSuccess, "async error %d after init: %s", (int)a, loomGetLastError(comm));
    int n = -1, me = -1;
    RCALL(loomCommCount(comm, &n));
    RCALL(loomCommUserRank(comm, &me));
    RCHECK(n == nranks && me == rank, "count %d rank %d", n, me);
    enum { N = 4099 };
    static _Thread_local int32_t in[N], res[N];
    for (int i = 0; i < N; i++)
        in[i] = rank * 100000 + i;
    RCALL(loomAllReduce(in, res, N, loomInt32, loomSum, comm, NULL));
    for (int i = 0; i < N; i++) {
        int32_t want = 100000 * (nranks * (nranks - 1) / 2) + nranks * i;
        RCHECK(res[i] == want, "element %d: %d, expected %d", i, res[i], want);
    }
out:
    if (comm) loomCommDestroy(comm);
    return rc;
}

START_TEST(test_nonblocking_init)
{
    ck_assert_int_eq(run_raw(3, nonblocking_rank, NULL), 0);
}
END_TEST

/* An init that fails in the background reports through the async error and
 * loomGetLastError(comm); the communicator can still be destroyed. */
START_TEST(test_nonblocking_init_error)
{
    loomUniqueId id;
    ck_assert_int_eq(loomGetUniqueId(&id), loomSuccess);
    /* The rank cannot pick a listening address: that fails at once, not after LOOM_TIMEOUT. */
    setenv("LOOM_SOCKET_IFNAME", "nosuchif", 1);
    param_reset_cache();
    loomComm_t comm = NULL;
    loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    loomResult_t r = loomCommInitRankConfig(&comm, 1, id, 0, &cfg);
    if (r != loomInProgress) {
        setenv("LOOM_SOCKET_IFNAME", "lo", 1);
        param_reset_cache();
        /* Failing synchronously is allowed too, with nothing returned. */
        ck_assert_int_eq(r, loomInvalidUsage);
        return;
    }
    ck_assert_ptr_nonnull(comm);
    loomResult_t a = loomInProgress;
    for (int i = 0; i < 10000 && a == loomInProgress; i++) {
        ck_assert_int_eq(loomCommGetAsyncError(comm, &a), loomSuccess);
        if (a == loomInProgress) usleep(1000);
    }
    /* Only now: the init thread reads the environment (and setenv races with getenv). */
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    param_reset_cache();
    ck_assert_int_eq(a, loomInvalidUsage);
    ck_assert_msg(strstr(loomGetLastError(comm), "nosuchif") != NULL,
                  "loomGetLastError(comm) = '%s'", loomGetLastError(comm));
    int32_t x = 1, y = 0;
    ck_assert_int_eq(loomAllReduce(&x, &y, 1, loomInt32, loomSum, comm, NULL), loomInvalidUsage);
    ck_assert_int_eq(loomCommDestroy(comm), loomSuccess);
}
END_TEST

/* ---- 4. split ------------------------------------------------------------------------------ */

#define SPLIT_NRANKS 6
#define SPLIT_NOCOLOR_RANK 5

static int split_color(int r)
{
    return r == SPLIT_NOCOLOR_RANK ? LOOM_SPLIT_NOCOLOR : r % 2;
}

/* The child rank of old rank r: order by key (-rank), then by old rank. */
static int split_expected_rank(int r, int *count)
{
    int c = split_color(r), k = 0, n = 0;
    for (int q = 0; q < SPLIT_NRANKS; q++) {
        if (split_color(q) != c) continue;
        if (-q < -r || (-q == -r && q < r)) k++;
        n++;
    }
    *count = n;
    return k;
}

static int split_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    (void)nranks;
    int rc = 0;
    loomComm_t child = NULL, grand = NULL;
    enum { N = 1000 };
    int64_t in[N], res[N];

    /* A negative colour other than LOOM_SPLIT_NOCOLOR is refused before any communication. */
    loomComm_t untouched = (loomComm_t)(uintptr_t)0x42;
    RCHECK(loomCommSplit(comm, -7, 0, &untouched, NULL) == loomInvalidArgument,
           "colour -7 accepted");
    RCHECK(untouched == (loomComm_t)(uintptr_t)0x42, "newcomm changed by a refused split");

    int color = split_color(rank);
    loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
    cfg.nChannels = 1;
    cfg.commName = "child";
    RCALL(loomCommSplit(comm, color, -rank, &child, &cfg));
    if (color == LOOM_SPLIT_NOCOLOR) {
        RCHECK(child == NULL, "LOOM_SPLIT_NOCOLOR gave a communicator");
        goto out;
    }
    RCHECK(child != NULL, "no child communicator");
    int want_n, want_r = split_expected_rank(rank, &want_n), cn = -1, cr = -1;
    RCALL(loomCommCount(child, &cn));
    RCALL(loomCommUserRank(child, &cr));
    RCHECK(cn == want_n && cr == want_r, "child rank %d of %d, expected %d of %d", cr, cn, want_r,
           want_n);
    RCHECK(child->tune.nchannels == 1 && strcmp(child->lay.name, "child") == 0,
           "the split's config was not applied (%d channels, name '%s')", child->tune.nchannels,
           child->lay.name);

    /* A child on one node has a node segment whenever its parent does (the same node, the same
     * transports): its small allreduces need no messages either. */
    RCHECK((child->net.seg != NULL) == (comm->net.seg != NULL),
           "the child %s a node segment and the parent %s", child->net.seg ? "has" : "lacks",
           comm->net.seg ? "has" : "lacks");

    /* ... and it is tuned for its own ranks per core as init tunes (a child whose node has more
     * ranks than cores spins with a yield instead of sleeping between steps: 4 ranks on 2 cores
     * took 55 us per 8-byte allreduce without it, 6 with it) */
    bool over = child->lay.peers[0].cores > 0 && cn > child->lay.peers[0].cores;
    RCHECK(child->tune.oversubscribed == over && (child->tune.hot_ns == 0) == over,
           "the child of %d ranks on %d cores: oversubscribed %d, hot_ns %llu", cn,
           child->lay.peers[0].cores, (int)child->tune.oversubscribed,
           (unsigned long long)child->tune.hot_ns);

    /* The data must follow the reported order: gather the old ranks by child rank. */
    int32_t mine = rank, olds[SPLIT_NRANKS];
    RCALL(loomAllGather(&mine, olds, 1, loomInt32, child, NULL));
    for (int k = 0; k < cn; k++) {
        int n_;
        RCHECK(split_color(olds[k]) == color && split_expected_rank(olds[k], &n_) == k,
               "child rank %d holds old rank %d", k, olds[k]);
    }

    /* Per-colour sums. */
    for (int i = 0; i < N; i++)
        in[i] = (int64_t)(rank + 1) * 1000 + i;
    RCALL(loomAllReduce(in, res, N, loomInt64, loomSum, child, NULL));
    for (int i = 0; i < N; i++) {
        int64_t want = 0;
        for (int q = 0; q < SPLIT_NRANKS; q++)
            if (split_color(q) == color) want += (int64_t)(q + 1) * 1000 + i;
        RCHECK(res[i] == want, "colour %d element %d: %lld, expected %lld", color, i,
               (long long)res[i], (long long)want);
    }

    /* Nested: child rank 0 leaves, the others keep one colour with equal keys, so the order
     * falls back to the child ranks. */
    int gcolor = cr == 0 ? LOOM_SPLIT_NOCOLOR : 0;
    RCALL(loomCommSplit(child, gcolor, 0, &grand, NULL));
    if (cr == 0) {
        RCHECK(grand == NULL, "LOOM_SPLIT_NOCOLOR gave a communicator (nested)");
    } else {
        int gn = -1, gr = -1;
        RCHECK(grand != NULL, "no grandchild communicator");
        RCALL(loomCommCount(grand, &gn));
        RCALL(loomCommUserRank(grand, &gr));
        RCHECK(gn == cn - 1 && gr == cr - 1, "grandchild rank %d of %d, expected %d of %d", gr, gn,
               cr - 1, cn - 1);
        RCHECK((grand->net.seg != NULL) == (gn > 1 && comm->net.seg != NULL),
               "the grandchild of %d ranks %s a node segment (the parent %s)", gn,
               grand->net.seg ? "has" : "lacks", comm->net.seg ? "has" : "lacks");
        int64_t v = rank, sum = -1, want = 0;
        for (int q = 0; q < SPLIT_NRANKS; q++) {
            int n_;
            if (split_color(q) == color && split_expected_rank(q, &n_) > 0) want += q;
        }
        RCALL(loomAllReduce(&v, &sum, 1, loomInt64, loomSum, grand, NULL));
        RCHECK(sum == want, "grandchild sum %lld, expected %lld", (long long)sum, (long long)want);
    }
    /* The parent still works after its children were made (all ranks but the no-colour one,
     * which left: use the child instead, all of whose ranks are still here). */
    RCALL(loomAllReduce(in, res, N, loomInt64, loomMax, child, NULL));
out:
    /* Not RCHECK here: it jumps back to this label. */
    if (grand && loomCommDestroy(grand) != loomSuccess) rc = 1;
    if (child && loomCommDestroy(child) != loomSuccess) rc = 1;
    return rc;
}

START_TEST(test_split)
{
    ck_assert_int_eq(h_run_threads(SPLIT_NRANKS, split_rank, NULL), 0);
}
END_TEST

/* ---- 5. groups and point to point ---------------------------------------------------------- */

static uint8_t pattern(int from, int msg, size_t byte)
{
    return (uint8_t)(from * 37 + msg * 11 + byte * 7 + (byte >> 8));
}

static int p2p_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0;
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    /* Several messages per pair, of several types, including empty ones and ones larger than
     * a 256 KiB slice. */
    static const struct {
        loomDataType_t type;
        size_t count;
    } msgs[] = {
        {loomFloat, 0},      {loomInt8, 1},    {loomInt32, 1000},
        {loomFloat, 100003}, {loomDouble, 77}, {loomUint8, 0},
        {loomUint8, 300000}, {loomHalf, 5},    {loomInt64, 70000},
    };
    enum { NM = sizeof(msgs) / sizeof(msgs[0]) };
    uint8_t *sb[NM] = {0}, *rb[NM] = {0};
    int32_t *a2a_send = NULL, *a2a_p2p = NULL, *a2a_coll = NULL;
    float *ar_in = NULL, *ar_out = NULL;

    RCHECK(loomGroupEnd() == loomInvalidUsage, "loomGroupEnd without loomGroupStart accepted");
    for (int k = 0; k < NM; k++) {
        size_t bytes = msgs[k].count * red_type_size(msgs[k].type);
        sb[k] = malloc(bytes + 1);
        rb[k] = malloc(bytes + 1);
        RCHECK(sb[k] && rb[k], "out of memory");
        for (size_t b = 0; b < bytes; b++)
            sb[k][b] = pattern(rank, k, b);
        memset(rb[k], 0xee, bytes + 1);
    }

    /* Ring exchange inside one group. */
    RCALL(loomGroupStart());
    for (int k = 0; k < NM; k++) {
        RCALL(loomSend(sb[k], msgs[k].count, msgs[k].type, next, comm, NULL));
        RCALL(loomRecv(rb[k], msgs[k].count, msgs[k].type, prev, comm, NULL));
    }
    RCALL(loomGroupEnd());
    for (int k = 0; k < NM; k++) {
        size_t bytes = msgs[k].count * red_type_size(msgs[k].type);
        for (size_t b = 0; b < bytes; b++)
            RCHECK(rb[k][b] == pattern(prev, k, b), "ring message %d byte %zu: %u, expected %u", k,
                   b, rb[k][b], pattern(prev, k, b));
        RCHECK(rb[k][bytes] == 0xee, "ring message %d wrote past its end", k);
    }

    /* Sends to self meet receives from self in order, whichever is posted first. */
    {
        int32_t s1[50], s2[60], r1[50], r2[60];
        for (int i = 0; i < 50; i++)
            s1[i] = rank * 1000 + i;
        for (int i = 0; i < 60; i++)
            s2[i] = -(rank * 1000 + i);
        memset(r1, 0, sizeof(r1));
        memset(r2, 0, sizeof(r2));
        /* Nested: only the outermost loomGroupEnd runs the queued calls. */
        RCALL(loomGroupStart());
        RCALL(loomGroupStart());
        RCALL(loomSend(s1, 50, loomInt32, rank, comm, NULL));
        RCALL(loomRecv(r1, 50, loomInt32, rank, comm, NULL));
        RCALL(loomRecv(r2, 60, loomInt32, rank, comm, NULL));
        RCALL(loomSend(s2, 60, loomInt32, rank, comm, NULL));
        RCALL(loomGroupEnd());
        RCHECK(r1[1] == 0 && r2[1] == 0, "an inner loomGroupEnd ran the group");
        RCALL(loomGroupEnd());
        RCHECK(memcmp(s1, r1, sizeof(s1)) == 0, "first self message differs");
        RCHECK(memcmp(s2, r2, sizeof(s2)) == 0, "second self message differs");
    }

    /* All-to-all from sends and receives in a group, against loomAlltoAll. */
    enum { C = 1000 };
    size_t tot = (size_t)C * (size_t)nranks;
    a2a_send = malloc(tot * sizeof(int32_t));
    a2a_p2p = malloc(tot * sizeof(int32_t));
    a2a_coll = malloc(tot * sizeof(int32_t));
    RCHECK(a2a_send && a2a_p2p && a2a_coll, "out of memory");
    for (int q = 0; q < nranks; q++)
        for (int i = 0; i < C; i++)
            a2a_send[q * C + i] = (rank << 20) | (q << 12) | i;
    memset(a2a_p2p, 0, tot * sizeof(int32_t));
    memset(a2a_coll, 0, tot * sizeof(int32_t));
    RCALL(loomGroupStart());
    for (int q = 0; q < nranks; q++) {
        RCALL(loomSend(a2a_send + q * C, C, loomInt32, q, comm, NULL));
        RCALL(loomRecv(a2a_p2p + q * C, C, loomInt32, q, comm, NULL));
    }
    RCALL(loomGroupEnd());
    RCALL(loomAlltoAll(a2a_send, a2a_coll, C, loomInt32, comm, NULL));
    for (int q = 0; q < nranks; q++)
        for (int i = 0; i < C; i++) {
            int32_t want = (q << 20) | (rank << 12) | i;
            RCHECK(a2a_p2p[q * C + i] == want, "p2p all-to-all from %d [%d]: %x, expected %x", q, i,
                   a2a_p2p[q * C + i], want);
            RCHECK(a2a_coll[q * C + i] == want, "loomAlltoAll from %d [%d]: %x, expected %x", q, i,
                   a2a_coll[q * C + i], want);
        }

    /* A group mixing a collective with point to point, in both orders. */
    enum { AR = 70001 };
    ar_in = malloc(AR * sizeof(float));
    ar_out = malloc(AR * sizeof(float));
    RCHECK(ar_in && ar_out, "out of memory");
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < AR; i++)
            ar_in[i] = (float)(rank + 1 + (i % 100));
        memset(ar_out, 0, AR * sizeof(float));
        int32_t token = rank * 10 + round, got = -1;
        RCALL(loomGroupStart());
        if (round == 0) RCALL(loomAllReduce(ar_in, ar_out, AR, loomFloat, loomSum, comm, NULL));
        RCALL(loomSend(&token, 1, loomInt32, next, comm, NULL));
        RCALL(loomRecv(&got, 1, loomInt32, prev, comm, NULL));
        if (round == 1) RCALL(loomAllReduce(ar_in, ar_out, AR, loomFloat, loomSum, comm, NULL));
        RCALL(loomGroupEnd());
        RCHECK(got == prev * 10 + round, "round %d: token %d from %d", round, got, prev);
        for (int i = 0; i < AR; i++) {
            float want = (float)(nranks * (nranks + 1) / 2 + nranks * (i % 100));
            RCHECK(ar_out[i] == want, "round %d: allreduce [%d] = %g, expected %g", round, i,
                   (double)ar_out[i], (double)want);
        }
    }

    /* Outside a group: each call is its own group and blocks until the peer's matching call. */
    if (rank == 0) {
        RCALL(loomSend(sb[3], msgs[3].count, msgs[3].type, 1, comm, NULL));
        RCALL(loomSend(sb[2], msgs[2].count, msgs[2].type, 1, comm, NULL));
    } else if (rank == 1) {
        memset(rb[3], 0, msgs[3].count * sizeof(float));
        memset(rb[2], 0, msgs[2].count * sizeof(int32_t));
        RCALL(loomRecv(rb[3], msgs[3].count, msgs[3].type, 0, comm, NULL));
        RCALL(loomRecv(rb[2], msgs[2].count, msgs[2].type, 0, comm, NULL));
        for (size_t b = 0; b < msgs[3].count * sizeof(float); b++)
            RCHECK(rb[3][b] == pattern(0, 3, b), "ungrouped message byte %zu", b);
        for (size_t b = 0; b < msgs[2].count * sizeof(int32_t); b++)
            RCHECK(rb[2][b] == pattern(0, 2, b), "second ungrouped message byte %zu", b);
    }
    /* The communicator is still in step afterwards. */
    RCALL(loomAllReduce(ar_in, ar_out, 16, loomFloat, loomSum, comm, NULL));
out:
    for (int k = 0; k < NM; k++) {
        free(sb[k]);
        free(rb[k]);
    }
    free(a2a_send);
    free(a2a_p2p);
    free(a2a_coll);
    free(ar_in);
    free(ar_out);
    return rc;
}

START_TEST(test_p2p_groups)
{
    ck_assert_int_eq(h_run_threads(4, p2p_rank, NULL), 0);
}
END_TEST

/* Rank 0 sends scount elements of stype, rank 1 receives rcount of rtype: they disagree, so
 * the receive must fail without writing past its buffer, and the sender's communicator must
 * learn of it (its next call fails instead of hanging). */
typedef struct {
    loomDataType_t stype, rtype;
    size_t scount, rcount;
} mismatch_t;

#define GUARD 64

static int mismatch_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)nranks;
    const mismatch_t *m = arg;
    int rc = 0;
    uint8_t *buf = NULL;
    size_t sbytes = m->scount * red_type_size(m->stype);
    size_t rbytes = m->rcount * red_type_size(m->rtype);
    buf = malloc(LOOM_MAX(sbytes, rbytes) + GUARD);
    RCHECK(buf, "out of memory");
    if (rank == 0) {
        for (size_t b = 0; b < sbytes; b++)
            buf[b] = (uint8_t)(b * 13 + 1);
        /* The send may complete (the bytes fit in the socket buffer) or fail; either is fine. */
        loomResult_t r = loomSend(buf, m->scount, m->stype, 1, comm, NULL);
        (void)r;
        int32_t x = 0;
        r = loomRecv(&x, 1, loomInt32, 1, comm, NULL);
        RCHECK(r != loomSuccess, "the sender's next receive succeeded after the mismatch");
    } else {
        memset(buf, 0x5a, rbytes + GUARD);
        loomResult_t r = loomRecv(buf, m->rcount, m->rtype, 0, comm, NULL);
        RCHECK(r != loomSuccess, "a receive of %zu %s matched a send of %zu %s", m->rcount,
               red_type_name(m->rtype), m->scount, red_type_name(m->stype));
        RCHECK(loomGetLastError(NULL)[0] != '\0', "no error text");
        for (size_t b = rbytes; b < rbytes + GUARD; b++)
            RCHECK(buf[b] == 0x5a, "byte %zu past the %zu-byte receive buffer was written", b,
                   rbytes);
        loomResult_t a = loomSuccess;
        RCALL(loomCommGetAsyncError(comm, &a));
        RCHECK(a != loomSuccess, "the communicator is not marked broken");
    }
out:
    free(buf);
    return rc;
}

/* Messages to self are matched inside the group, so a mismatch there is the caller's error
 * (loomInvalidUsage), found before anything moves: the buffers and the communicator are left
 * as they were. */
static int self_mismatch_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0;
    int32_t s[60], r[60];
    for (int i = 0; i < 60; i++)
        s[i] = i + 1;
    memset(r, 0, sizeof(r));
    loomResult_t res;
    RCALL(loomGroupStart());
    RCALL(loomSend(s, 50, loomInt32, rank, comm, NULL));
    RCALL(loomRecv(r, 60, loomInt32, rank, comm, NULL));
    res = loomGroupEnd();
    RCHECK(res != loomSuccess, "send of 50 to self met a receive of 60 from self");
    RSOFT(res == loomInvalidUsage, "send of 50 to self and receive of 60 from self: %d (%s)",
          (int)res, loomGetLastError(NULL));
    for (int i = 0; i < 60; i++)
        RCHECK(r[i] == 0, "receive buffer written at %d", i);
    /* Outside a group, a send to self has no receive to meet. */
    res = loomSend(s, 10, loomInt32, rank, comm, NULL);
    RCHECK(res != loomSuccess, "lone send to self succeeded");
    RSOFT(res == loomInvalidUsage, "lone send to self: %d (%s)", (int)res, loomGetLastError(NULL));
    /* Nothing was sent: the communicator is still in step. */
    int32_t one = 1, n = 0;
    RCALL(loomAllReduce(&one, &n, 1, loomInt32, loomSum, comm, NULL));
    RCHECK(n == nranks, "sum %d", n);
out:
    return rc;
}

/* A call of a group that fails its checks fails the group: loomGroupEnd runs none of the
 * queued operations and returns that call's error, with its position. Before, the end ran the
 * rest and returned success, and a receive queued beside a refused send was read as a result
 * although nothing had been written to it. */
static int group_bad_call_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0, other = (rank + 1) % nranks;
    int32_t s[16], r[16];
    for (int i = 0; i < 16; i++)
        s[i] = i, r[i] = -7;
    RCALL(loomGroupStart());
    RCALL(loomRecv(r, 16, loomInt32, other, comm, NULL));
    loomResult_t res = loomSend(s, 16, (loomDataType_t)99, other, comm, NULL);
    RCHECK(res == loomInvalidArgument, "send with datatype 99: %d", (int)res);
    RCALL(loomSend(s, 16, loomInt32, other, comm, NULL));
    res = loomGroupEnd();
    const char *t = loomGetLastError(NULL);
    RCHECK(res == loomInvalidArgument, "group end after a failed call: %d (%s)", (int)res, t);
    RCHECK(strstr(t, "call 2") && strstr(t, "none of its 2 queued") && strstr(t, "datatype 99"),
           "group end's text '%s' (wanted the call's position, the 2 operations not run, and "
           "the call's own error)",
           t);
    for (int i = 0; i < 16; i++)
        RCHECK(r[i] == -7, "receive buffer written at %d", i);
    /* Nothing moved on either rank: the communicator is in step, and a later group runs. */
    RCALL(loomGroupStart());
    RCALL(loomSend(s, 16, loomInt32, other, comm, NULL));
    RCALL(loomRecv(r, 16, loomInt32, (rank + nranks - 1) % nranks, comm, NULL));
    RCALL(loomGroupEnd());
    for (int i = 0; i < 16; i++)
        RCHECK(r[i] == i, "receive %d: %d", i, r[i]);
out:
    return rc;
}

START_TEST(test_group_bad_call)
{
    ck_assert_int_eq(h_run_threads(2, group_bad_call_rank, NULL), 0);
}
END_TEST

START_TEST(test_p2p_self_mismatch)
{
    ck_assert_int_eq(h_run_threads(2, self_mismatch_rank, NULL), 0);
}
END_TEST

START_TEST(test_p2p_count_mismatch)
{
    static const mismatch_t cases[] = {
        {loomFloat, loomFloat, 100, 50},       /* sender longer */
        {loomFloat, loomFloat, 50, 100},       /* receiver longer */
        {loomUint8, loomFloat, 100, 25},       /* same bytes, different type and count */
        {loomFloat, loomFloat, 100000, 99999}, /* sliced, off by one element */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(h_run_threads(2, mismatch_rank, (void *)&cases[i]) == 0, "mismatch case %zu",
                      i);
}
END_TEST

/* ---- 6. avg and pre-multiplied sums -------------------------------------------------------- */

static const loomDataType_t all_types[] = {
    loomInt8,    loomUint8,   loomInt32,   loomUint32,   loomInt64,      loomUint64,
    loomFloat16, loomFloat32, loomFloat64, loomBfloat16, loomFloat8e4m3, loomFloat8e5m2};

/* Creates a pre-multiplied sum with `scalar` expressed in type t. */
static loomResult_t make_premul(loomRedOp_t *op, loomDataType_t t, double scalar, loomComm_t comm)
{
    uint8_t s[8];
    memset(s, 0, sizeof(s));
    put_val(t, s, 0, scalar);
    return loomRedOpCreatePreMulSum(op, s, t, loomScalarHostImmediate, comm);
}

static int avg_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0;
    enum { N = 1003, RC = 257 };
    const int root = 1;
    size_t rsn = (size_t)RC * (size_t)nranks, nel = LOOM_MAX(rsn, (size_t)N);
    uint8_t *in = malloc(nel * 8), *res = malloc(nel * 8);
    RCHECK(in && res, "out of memory");
    for (size_t ti = 0; ti < sizeof(all_types) / sizeof(all_types[0]); ti++) {
        loomDataType_t t = all_types[ti];
        const char *tn = red_type_name(t);
        for (size_t i = 0; i < nel; i++)
            put_val(t, in, i, val(t, rank, i));

        /* allreduce avg */
        memset(res, 0xcd, nel * 8);
        RCALL(loomAllReduce(in, res, N, t, loomAvg, comm, NULL));
        for (size_t i = 0; i < N; i++) {
            double sum = 0;
            for (int q = 0; q < nranks; q++)
                sum += val(t, q, i);
            double want = expect_avg(t, sum, nranks), got = get_val(t, res, i);
            RCHECK(got == want, "%s allreduce avg [%zu]: %.17g, expected %.17g (sum %g)", tn, i,
                   got, want, sum);
        }

        /* reduce avg */
        memset(res, 0xcd, nel * 8);
        RCALL(loomReduce(in, res, N, t, loomAvg, root, comm, NULL));
        if (rank == root)
            for (size_t i = 0; i < N; i++) {
                double sum = 0;
                for (int q = 0; q < nranks; q++)
                    sum += val(t, q, i);
                double want = expect_avg(t, sum, nranks), got = get_val(t, res, i);
                RCHECK(got == want, "%s reduce avg [%zu]: %.17g, expected %.17g", tn, i, got, want);
            }

        /* reduce-scatter avg */
        memset(res, 0xcd, nel * 8);
        RCALL(loomReduceScatter(in, res, RC, t, loomAvg, comm, NULL));
        for (size_t i = 0; i < RC; i++) {
            size_t j = (size_t)rank * RC + i;
            double sum = 0;
            for (int q = 0; q < nranks; q++)
                sum += val(t, q, j);
            double want = expect_avg(t, sum, nranks), got = get_val(t, res, i);
            RCHECK(got == want, "%s reduce-scatter avg [%zu]: %.17g, expected %.17g", tn, i, got,
                   want);
        }

        /* pre-multiplied sums: 2 for every type, 0.5 for float types */
        double scalars[2] = {2, 0.5};
        int nsc = type_is_float(t) ? 2 : 1;
        for (int si = 0; si < nsc; si++) {
            double sc = scalars[si];
            loomRedOp_t op;
            RCALL(make_premul(&op, t, sc, comm));
            RCHECK((int)op >= loomNumOps, "premulsum handle %d collides with a built-in op",
                   (int)op);
            memset(res, 0xcd, nel * 8);
            RCALL(loomAllReduce(in, res, N, t, op, comm, NULL));
            for (size_t i = 0; i < N; i++) {
                double want = 0;
                for (int q = 0; q < nranks; q++)
                    want += sc * val(t, q, i);
                double got = get_val(t, res, i);
                RCHECK(got == want, "%s allreduce premulsum(%g) [%zu]: %.17g, expected %.17g", tn,
                       sc, i, got, want);
            }
            memset(res, 0xcd, nel * 8);
            RCALL(loomReduceScatter(in, res, RC, t, op, comm, NULL));
            for (size_t i = 0; i < RC; i++) {
                size_t j = (size_t)rank * RC + i;
                double want = 0;
                for (int q = 0; q < nranks; q++)
                    want += sc * val(t, q, j);
                double got = get_val(t, res, i);
                RCHECK(got == want, "%s reduce-scatter premulsum(%g) [%zu]: %.17g, expected %.17g",
                       tn, sc, i, got, want);
            }
            memset(res, 0xcd, nel * 8);
            RCALL(loomReduce(in, res, N, t, op, root, comm, NULL));
            if (rank == root)
                for (size_t i = 0; i < N; i++) {
                    double want = 0;
                    for (int q = 0; q < nranks; q++)
                        want += sc * val(t, q, i);
                    double got = get_val(t, res, i);
                    RCHECK(got == want, "%s reduce premulsum(%g) [%zu]: %.17g, expected %.17g", tn,
                           sc, i, got, want);
                }
            /* The operator belongs to its type: another type is refused. */
            loomDataType_t other = t == loomFloat ? loomDouble : loomFloat;
            RCHECK(loomAllReduce(in, res, N, other, op, comm, NULL) == loomInvalidArgument,
                   "%s premulsum used with %s accepted", tn, red_type_name(other));
            RCALL(loomRedOpDestroy(op, comm));
            /* Destroyed: refused locally by every rank, so nothing is sent. */
            RCHECK(loomAllReduce(in, res, N, t, op, comm, NULL) == loomInvalidArgument,
                   "%s: destroyed premulsum accepted by allreduce", tn);
            RCHECK(loomReduce(in, res, N, t, op, root, comm, NULL) == loomInvalidArgument,
                   "%s: destroyed premulsum accepted by reduce", tn);
            RCHECK(loomRedOpDestroy(op, comm) == loomInvalidArgument,
                   "%s: premulsum destroyed twice", tn);
        }
    }
    /* The communicator is still healthy after the refused calls. */
    {
        int32_t one = 1, n = 0;
        RCALL(loomAllReduce(&one, &n, 1, loomInt32, loomSum, comm, NULL));
        RCHECK(n == nranks, "final sum %d", n);
    }
out:
    free(in);
    free(res);
    return rc;
}

START_TEST(test_avg_premulsum)
{
    ck_assert_int_eq(h_run_threads(3, avg_rank, NULL), 0);
    ck_assert_int_eq(h_run_threads(4, avg_rank, NULL), 0);
}
END_TEST

/* ---- 7. last error ------------------------------------------------------------------------- */

/* Two threads taking turns: one waits until the other has reached a stage. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stage;
} stage_t;
#define STAGE_INITIALIZER                                                                          \
    {                                                                                              \
        PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0                                     \
    }

static void stage_wait(stage_t *s, int stage)
{
    pthread_mutex_lock(&s->lock);
    while (s->stage < stage)
        pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

static void stage_set(stage_t *s, int stage)
{
    pthread_mutex_lock(&s->lock);
    s->stage = stage;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

typedef struct {
    stage_t st;
    char a_text[1024];
    char seen[1024];
    int rc;
} lasterr_t;

/* Thread A: a bad call, then (after B made another one) its own text must be unchanged. */
static void *lasterr_a(void *p)
{
    lasterr_t *s = p;
    loomResult_t r = loomAllReduce(NULL, NULL, 1, loomFloat, loomSum, NULL, NULL);
    if (r != loomInvalidArgument) s->rc |= 1;
    snprintf(s->a_text, sizeof(s->a_text), "%s", loomGetLastError(NULL));
    stage_set(&s->st, 1);
    stage_wait(&s->st, 2);
    if (strcmp(loomGetLastError(NULL), s->a_text) != 0) s->rc |= 2;
    return NULL;
}

/* Thread B: made no call yet, so it sees the process's last error; then fails differently. */
static void *lasterr_b(void *p)
{
    lasterr_t *s = p;
    snprintf(s->seen, sizeof(s->seen), "%s", loomGetLastError(NULL));
    if (loomCommCount(NULL, NULL) != loomInvalidArgument) s->rc |= 4;
    return NULL;
}

/* Thread C: made no call, so it sees B's error, the latest of the process. */
static void *lasterr_c(void *p)
{
    lasterr_t *s = p;
    snprintf(s->seen, sizeof(s->seen), "%s", loomGetLastError(NULL));
    return NULL;
}

START_TEST(test_last_error_threads)
{
    lasterr_t s = {.st = STAGE_INITIALIZER};
    pthread_t a, b, c;
    pthread_create(&a, NULL, lasterr_a, &s);
    stage_wait(&s.st, 1);
    ck_assert_msg(strstr(s.a_text, "loomAllReduce") != NULL,
                  "thread A's last error does not name the function: '%s'", s.a_text);
    pthread_create(&b, NULL, lasterr_b, &s);
    pthread_join(b, NULL);
    ck_assert_msg(s.seen[0] != '\0', "a fresh thread sees no last error");
    ck_assert_msg(strcmp(s.seen, s.a_text) == 0,
                  "a fresh thread sees '%s', not the process's last error '%s'", s.seen, s.a_text);
    stage_set(&s.st, 2);
    pthread_join(a, NULL);
    pthread_create(&c, NULL, lasterr_c, &s);
    pthread_join(c, NULL);
    ck_assert_msg(strstr(s.seen, "loomCommCount") != NULL,
                  "a fresh thread does not see the latest process error: '%s'", s.seen);
    ck_assert_msg(!(s.rc & 1), "thread A's bad call did not fail with loomInvalidArgument");
    ck_assert_msg(!(s.rc & 2), "thread A's last error was replaced by thread B's");
    ck_assert_msg(!(s.rc & 4), "thread B's bad call did not fail with loomInvalidArgument");
}
END_TEST

typedef struct {
    int mentions_mismatch[2];
} broken_t;

static int broken_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)nranks;
    broken_t *b = arg;
    int rc = 0;
    float in[16], out[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)i;
    /* Same count and type, different op: the schedules match, the operations do not. */
    loomResult_t r =
        loomAllReduce(in, out, 16, loomFloat, rank == 0 ? loomSum : loomMax, comm, NULL);
    RCHECK(r != loomSuccess, "mismatched allreduce succeeded");
    char thread_text[1024], comm_text[1024];
    snprintf(thread_text, sizeof(thread_text), "%s", loomGetLastError(NULL));
    snprintf(comm_text, sizeof(comm_text), "%s", loomGetLastError(comm));
    RCHECK(thread_text[0] != '\0', "no text for the failed call");
    RCHECK(comm_text[0] != '\0', "no text for the broken communicator");
    loomResult_t a = loomSuccess;
    RCALL(loomCommGetAsyncError(comm, &a));
    RCHECK(a != loomSuccess && a != loomInProgress, "async error %d", (int)a);
    /* Another error in this thread replaces the thread's text, not the communicator's. */
    RCHECK(loomGetVersion(NULL) == loomInvalidArgument, "loomGetVersion(NULL) accepted");
    RCHECK(strstr(loomGetLastError(NULL), "loomGetVersion") != NULL, "thread text: '%s'",
           loomGetLastError(NULL));
    RCHECK(strcmp(loomGetLastError(comm), comm_text) == 0,
           "loomGetLastError(comm) changed to '%s' (was '%s')", loomGetLastError(comm), comm_text);
    /* Later calls fail at once with the same error. */
    r = loomAllReduce(in, out, 16, loomFloat, loomSum, comm, NULL);
    RCHECK(r == a, "call on the broken communicator returned %d, async error %d", (int)r, (int)a);
    b->mentions_mismatch[rank] = strstr(comm_text, "mismatch") != NULL;
out:
    return rc;
}

START_TEST(test_last_error_comm)
{
    broken_t b = {{0, 0}};
    ck_assert_int_eq(h_run_threads(2, broken_rank, &b), 0);
    /* The rank that detects the mismatch names it; the other may only see the abort. */
    ck_assert_msg(b.mentions_mismatch[0] || b.mentions_mismatch[1],
                  "neither rank's communicator error mentions the mismatch");
}
END_TEST

/* ---- 8. loomCommInitAll ------------------------------------------------------------------- */

START_TEST(test_init_all)
{
    enum { ND = 3, N = 200003 };
    loomComm_t comms[ND] = {0};
    ck_assert_int_eq(loomCommInitAll(comms, ND, NULL), loomSuccess);
    float *in[ND], *out[ND];
    for (int d = 0; d < ND; d++) {
        int n = -1, r = -1, dev = 7;
        ck_assert_ptr_nonnull(comms[d]);
        ck_assert_int_eq(loomCommCount(comms[d], &n), loomSuccess);
        ck_assert_int_eq(loomCommUserRank(comms[d], &r), loomSuccess);
        ck_assert_int_eq(loomCommCuDevice(comms[d], &dev), loomSuccess);
        ck_assert_int_eq(n, ND);
        ck_assert_int_eq(r, d);
        ck_assert_int_eq(dev, -1);
        in[d] = malloc(N * sizeof(float));
        out[d] = calloc(N, sizeof(float));
        ck_assert(in[d] && out[d]);
        for (int i = 0; i < N; i++)
            in[d][i] = (float)((d + 1) * (i % 1000));
    }
    /* One thread drives every rank: only a group lets the three make progress together. */
    ck_assert_int_eq(loomGroupStart(), loomSuccess);
    for (int d = 0; d < ND; d++)
        ck_assert_int_eq(loomAllReduce(in[d], out[d], N, loomFloat, loomSum, comms[d], NULL),
                         loomSuccess);
    ck_assert_int_eq(loomGroupEnd(), loomSuccess);
    for (int d = 0; d < ND; d++) {
        for (int i = 0; i < N; i++)
            if (out[d][i] != (float)(6 * (i % 1000)))
                ck_abort_msg("comm %d element %d: %g, expected %d", d, i, (double)out[d][i],
                             6 * (i % 1000));
        ck_assert_int_eq(loomCommDestroy(comms[d]), loomSuccess);
        free(in[d]);
        free(out[d]);
    }

    /* A device list names each rank's GPU, as with NCCL; nothing touches the devices until a
     * device buffer arrives, so this works without a GPU. */
    const int devs[ND] = {2, 0, 1};
    ck_assert_int_eq(loomCommInitAll(comms, ND, devs), loomSuccess);
    for (int d = 0; d < ND; d++) {
        int dev = 7;
        ck_assert_int_eq(loomCommCuDevice(comms[d], &dev), loomSuccess);
        ck_assert_int_eq(dev, devs[d]);
        ck_assert_int_eq(loomCommDestroy(comms[d]), loomSuccess);
    }

    /* Duplicates are refused before anything is created. */
    const int dup[ND] = {0, 1, 0};
    loomComm_t sentinel[ND] = {(loomComm_t)(uintptr_t)1, (loomComm_t)(uintptr_t)2,
                               (loomComm_t)(uintptr_t)3};
    memcpy(comms, sentinel, sizeof(comms));
    ck_assert_int_eq(loomCommInitAll(comms, ND, dup), loomInvalidArgument);
    ck_assert_mem_eq(comms, sentinel, sizeof(comms));
    const int dup2[2] = {4, 4};
    ck_assert_int_eq(loomCommInitAll(comms, 2, dup2), loomInvalidArgument);
    ck_assert_int_eq(loomCommInitAll(comms, 0, NULL), loomInvalidArgument);
}
END_TEST

/* A negative device is refused wherever it appears in the list (the error text says so). */
START_TEST(test_init_all_negative_device)
{
    loomComm_t comms[3] = {0};
    const int later[3] = {0, 1, -1};
    ck_assert_int_eq(loomCommInitAll(comms, 3, later), loomInvalidArgument);
    const int first[3] = {-1, 0, 1};
    loomResult_t r = loomCommInitAll(comms, 3, first);
    if (r == loomSuccess)
        for (int d = 0; d < 3; d++)
            loomCommDestroy(comms[d]);
    ck_assert_msg(r == loomInvalidArgument, "devlist {-1, 0, 1} gave %d, not loomInvalidArgument",
                  (int)r);
}
END_TEST

/* ---- 9. finalize --------------------------------------------------------------------------- */

static int finalize_rank(const loomUniqueId *id, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0;
    loomComm_t comm = NULL;
    RCALL(loomCommInitRank(&comm, nranks, *id, rank));
    int32_t one = 1, sum = 0;
    RCALL(loomAllReduce(&one, &sum, 1, loomInt32, loomSum, comm, NULL));
    RCHECK(sum == nranks, "sum %d", sum);
    RCALL(loomCommFinalize(comm));
    /* After finalize only loomCommDestroy is valid: everything else is invalid usage, refused
     * locally (so no rank waits for another). */
    RCHECK(loomAllReduce(&one, &sum, 1, loomInt32, loomSum, comm, NULL) == loomInvalidUsage,
           "allreduce after finalize not refused with loomInvalidUsage");
    RCHECK(strstr(loomGetLastError(NULL), "final") != NULL, "error text '%s'",
           loomGetLastError(NULL));
    RCHECK(loomBroadcast(&one, &sum, 1, loomInt32, 0, comm, NULL) == loomInvalidUsage,
           "broadcast after finalize");
    RCHECK(loomSend(&one, 1, loomInt32, (rank + 1) % nranks, comm, NULL) == loomInvalidUsage,
           "send after finalize");
    RCHECK(loomCommFinalize(comm) == loomInvalidUsage, "finalize twice");
    RCALL(loomCommDestroy(comm));
    comm = NULL;
out:
    if (comm) loomCommDestroy(comm);
    return rc;
}

START_TEST(test_finalize)
{
    ck_assert_int_eq(run_raw(2, finalize_rank, NULL), 0);
}
END_TEST

/* ---- 10. statistics ------------------------------------------------------------------------ */

static int stats_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    int rc = 0;
    /* Divisible by every rank count used, so ring chunks are equal and the bytes exact. */
    enum { N = 6000, OPS = 3 };
    float *in = malloc(N * sizeof(float)), *out = malloc(N * sizeof(float));
    RCHECK(in && out, "out of memory");
    loomStats_t st;
    RCALL(loomCommGetStats(comm, &st));
    RCHECK(st.collectives == 0 && st.bytes_sent == 0 && st.bytes_received == 0,
           "fresh communicator has stats %llu/%llu/%llu", (unsigned long long)st.collectives,
           (unsigned long long)st.bytes_sent, (unsigned long long)st.bytes_received);
    for (int i = 0; i < N; i++)
        in[i] = (float)(rank + i % 7);
    for (int k = 0; k < OPS; k++)
        RCALL(loomAllReduce(in, out, N, loomFloat, loomSum, comm, NULL));
    for (int i = 0; i < N; i++)
        RCHECK(out[i] == (float)(nranks * (nranks - 1) / 2 + nranks * (i % 7)), "result [%d]", i);
    RCALL(loomCommGetStats(comm, &st));
    /* A ring allreduce sends and receives 2(p-1)/p of the buffer. */
    uint64_t want = (uint64_t)OPS * 2 * (uint64_t)(nranks - 1) * N / (uint64_t)nranks * 4;
    RCHECK(st.collectives == OPS, "collectives %llu, expected %d",
           (unsigned long long)st.collectives, OPS);
    RCHECK(st.bytes_sent == want, "bytes sent %llu, expected %llu",
           (unsigned long long)st.bytes_sent, (unsigned long long)want);
    RCHECK(st.bytes_received == want, "bytes received %llu, expected %llu",
           (unsigned long long)st.bytes_received, (unsigned long long)want);
    RCHECK(loomCommGetStats(comm, NULL) == loomInvalidArgument, "NULL stats accepted");
out:
    free(in);
    free(out);
    return rc;
}

START_TEST(test_stats)
{
    /* the byte counts are the ring's: forced, since the automatic choice depends on the
     * machine's cores (with more ranks than cores it prefers fewer steps) */
    setenv("LOOM_ALGO", "ring", 1);
    param_reset_cache();
    ck_assert_int_eq(h_run_threads(2, stats_rank, NULL), 0);
    ck_assert_int_eq(h_run_threads(3, stats_rank, NULL), 0);
    unsetenv("LOOM_ALGO");
    param_reset_cache();
}
END_TEST

/* ---- 11. destroy inside an open group --------------------------------------------------- */

/* Two one-rank communicators (each its own job) queue an allreduce in one group; one of them
 * is destroyed before loomGroupEnd. Its operation must be dropped, not run on freed memory, the
 * group must say so naming it, and the other communicator's operation must still run. */
START_TEST(test_destroy_in_group)
{
    loomComm_t a = NULL, b = NULL;
    ck_assert_int_eq(loomCommInitAll(&a, 1, NULL), loomSuccess);
    ck_assert_int_eq(loomCommInitAll(&b, 1, NULL), loomSuccess);
    int32_t ia = 3, oa = 0, ib = 5, ob = 0;
    ck_assert_int_eq(loomGroupStart(), loomSuccess);
    ck_assert_int_eq(loomAllReduce(&ia, &oa, 1, loomInt32, loomSum, a, NULL), loomSuccess);
    ck_assert_int_eq(loomAllReduce(&ib, &ob, 1, loomInt32, loomSum, b, NULL), loomSuccess);
    ck_assert_int_eq(loomAllReduce(&ib, &ob, 1, loomInt32, loomSum, b, NULL), loomSuccess);
    ck_assert_int_eq(loomCommDestroy(b), loomSuccess);
    /* Once destroyed the handle is refused, even while its queued operations still hold it. */
    int n = -1;
    ck_assert_int_eq(loomCommCount(b, &n), loomInvalidArgument);
    ck_assert_int_eq(loomGroupEnd(), loomInvalidUsage);
    char want[64];
    snprintf(want, sizeof(want), "%p", (void *)b);
    const char *txt = loomGetLastError(NULL);
    ck_assert_msg(strstr(txt, want) && strstr(txt, "destroyed") && strstr(txt, "2 operation"),
                  "error text '%s' does not name %s, destroyed, and its 2 operations", txt, want);
    ck_assert_int_eq(oa, 3);
    ck_assert_int_eq(ob, 0);
    /* The thread's queue is empty again: a later group runs normally. */
    oa = 0;
    ck_assert_int_eq(loomGroupStart(), loomSuccess);
    ck_assert_int_eq(loomAllReduce(&ia, &oa, 1, loomInt32, loomSum, a, NULL), loomSuccess);
    ck_assert_int_eq(loomGroupEnd(), loomSuccess);
    ck_assert_int_eq(oa, 3);
    ck_assert_int_eq(loomCommDestroy(a), loomSuccess);
}
END_TEST

/* Another thread's open group holds an operation on the communicator: that thread is inside the
 * communicator until its loomGroupEnd, so this thread's destroy is loomInvalidUsage naming both
 * calls and changes nothing; the group then runs. A thread that ends with a group left open lets
 * go of the communicator, and the destroy succeeds (checked for use after free and leaks under
 * valgrind). */
typedef struct {
    loomComm_t c;
    stage_t st; /* 1: queued, 2: destroy refused, 3: ended and queued again, leaving */
    loomResult_t queued, ended;
    int32_t y;
    char text[512];
} other_t;

static void *other_main(void *p)
{
    other_t *o = p;
    int32_t x = 1;
    loomGroupStart();
    o->queued = loomAllReduce(&x, &o->y, 1, loomInt32, loomSum, o->c, NULL);
    stage_set(&o->st, 1);
    stage_wait(&o->st, 2);
    o->ended = loomGroupEnd();
    snprintf(o->text, sizeof(o->text), "%s", loomGetLastError(NULL));
    int32_t z = 0;
    loomGroupStart();
    loomAllReduce(&x, &z, 1, loomInt32, loomSum, o->c, NULL);
    return NULL; /* the group is left open: the thread's exit drops it */
}

START_TEST(test_destroy_other_thread_group)
{
    other_t o = {.st = STAGE_INITIALIZER};
    ck_assert_int_eq(loomCommInitAll(&o.c, 1, NULL), loomSuccess);
    pthread_t th;
    pthread_create(&th, NULL, other_main, &o);
    stage_wait(&o.st, 1);
    ck_assert_int_eq(loomCommDestroy(o.c), loomInvalidUsage);
    const char *txt = loomGetLastError(NULL);
    ck_assert_msg(strstr(txt, "loomCommDestroy on thread") &&
                      strstr(txt, "while loomAllReduce runs on thread"),
                  "error text '%s' does not name both calls", txt);
    int n = -1;
    ck_assert_int_eq(loomCommCount(o.c, &n), loomSuccess); /* still live */
    stage_set(&o.st, 2);
    pthread_join(th, NULL);
    ck_assert_int_eq(o.queued, loomSuccess);
    ck_assert_msg(o.ended == loomSuccess, "loomGroupEnd: %d '%s'", (int)o.ended, o.text);
    ck_assert_int_eq(o.y, 1);
    ck_assert_int_eq(loomCommDestroy(o.c), loomSuccess);
}
END_TEST

/* A thread that called loom frees its group queue when it ends (valgrind's leak check sees a
 * lost block otherwise). */
static void *one_call_main(void *p)
{
    int32_t x = 2, y = 0;
    *(loomResult_t *)p = loomAllReduce(&x, &y, 1, loomInt32, loomSum, *(loomComm_t *)p, NULL);
    return NULL;
}

START_TEST(test_thread_queue_freed)
{
    loomComm_t c = NULL;
    ck_assert_int_eq(loomCommInitAll(&c, 1, NULL), loomSuccess);
    for (int i = 0; i < 4; i++) {
        union {
            loomComm_t c;
            loomResult_t r;
        } arg = {.c = c};
        pthread_t th;
        pthread_create(&th, NULL, one_call_main, &arg);
        pthread_join(th, NULL);
        ck_assert_int_eq(arg.r, loomSuccess);
    }
    ck_assert_int_eq(loomCommDestroy(c), loomSuccess);
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------- */

static Suite *api_suite(void)
{
    Suite *s = suite_create("api");
    /* tags "lifetime": also run under valgrind (tests/meson.build) */
    const h_case_t tests[] = {
        {.name = "version", .test = test_version},
        {.name = "config", .test = test_config_versions},
        {.name = "nonblocking", .test = test_nonblocking_init},
        {.name = "nonblocking_error", .test = test_nonblocking_init_error},
        {.name = "split", .test = test_split, .tags = "transport"},
        {.name = "p2p", .test = test_p2p_groups, .tags = "transport"},
        {.name = "p2p_mismatch", .test = test_p2p_count_mismatch, .tags = "lifetime transport"},
        {.name = "p2p_self_mismatch", .test = test_p2p_self_mismatch},
        {.name = "group_bad_call", .test = test_group_bad_call},
        {.name = "avg_premulsum", .test = test_avg_premulsum, .tags = "transport"},
        {.name = "last_error_threads", .test = test_last_error_threads},
        {.name = "last_error_comm", .test = test_last_error_comm},
        {.name = "init_all", .test = test_init_all},
        {.name = "init_all_negative", .test = test_init_all_negative_device},
        {.name = "finalize", .test = test_finalize},
        {.name = "stats", .test = test_stats},
        {.name = "destroy_in_group", .test = test_destroy_in_group, .tags = "lifetime"},
        {.name = "destroy_other_thread",
         .test = test_destroy_other_thread_group,
         .tags = "lifetime"},
        {.name = "thread_queue_freed", .test = test_thread_queue_freed, .tags = "lifetime"},
    };
    /* LOOM_TIMEOUT bounds every wait; this only catches a wedged test. */
    h_add_cases(s, tests, sizeof(tests) / sizeof(tests[0]), 60);
    return s;
}

int main(void)
{
    /* Loopback only, and no wait longer than 10 s: a hang becomes a failure with a message. */
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    unsetenv("LOOM_SOCKET_FAMILY");
    return h_check_main(api_suite(), false, CK_NORMAL);
}
