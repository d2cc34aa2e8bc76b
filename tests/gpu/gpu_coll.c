/*
 * loom collectives on CUDA device buffers, checked bit for bit.
 *
 * A plain main() program (no Check). The CUDA driver is reached only through src/base/cudrv.c
 * (dlopen), so the binary builds and runs anywhere: with no driver or GPU it prints why and exits
 * 77 (skipped). The parent process never makes a CUDA call: it learns the GPU count from a probe
 * child, takes each group's unique ids with loomGetUniqueId, then forks one process per rank (rank
 * r on GPU r); the children do all CUDA work and record each case in a table in shared memory,
 * which the parent prints, one line per case, as cases complete. Every child has an alarm()
 * watchdog and dies with its parent; the parent reaps the children, says which died and of what,
 * and kills the survivors of a group whose rank died.
 *
 * Inputs are small integers (or values chosen so that every float sum is exact), so the expected
 * results are computed on the host exactly; outputs are poisoned before each call, and every
 * element, and the guard bytes around each view, are compared.
 *
 * Groups (select with --only/--skip; --list shows them):
 *   allreduce  10 types x sum/prod/max/min/avg (+premulsum for float, half, bfloat16, int32),
 *              counts 0 1 7 1023 65537 4194307, out of place and in place; half/bfloat16
 *              sum/avg with values whose float32 sum needs one rounding
 *   offset     views at every byte offset 0..15 of a larger allocation (float: multiples of 4)
 *   coll       broadcast and reduce (every root), allgather, reducescatter, alltoall, send/recv
 *   streams    3 communicators (loomCommSplit) on 3 streams at once; one communicator on 2 streams
 *   graph      CUDA graph capture of loom calls, replayed 100 times with new inputs
 *   burst      270 allreduces of changing sizes queued back to back, one synchronize
 *   big        one uint8 sum allreduce of 2^31+4099 elements (sampled check)
 *   initall    one process drives every GPU: loomCommInitAll, group from one thread, threads
 *   samegpu    two ranks of one communicator on GPU 0 must get loomInvalidUsage
 *   win        registered windows (2 ranks; on one GPU only with LOOM_CUDA_SHARE_GPU=1, as
 *              tests/gpu/windows.sh runs it): allreduce, reduce-scatter, allgather, broadcast on
 *              symmetric windows (float32/bfloat16, in/out of place, 4 B to 16 MiB), windows
 *              of a split communicator beside the parent's, misuse refused, deregistration after
 * queued calls, non-symmetric windows, window calls captured in a graph and replayed, windows on
 * VMM memory (plain paths) graphs     every same-node path (latency path, slots, direct, p2p,
 * symmetric and plain windows) captured in one CUDA graph and replayed 100 times with fresh inputs,
 *              an eager call between replays; 40 graphs of direct calls on fresh allocations,
 *              each destroyed (2 ranks; on one GPU only with LOOM_CUDA_SHARE_GPU=1, as
 *              tests/gpu/graphs.sh runs it)
 *   ce         the copy-engine path (2 ranks; tests/gpu/copyengine.sh runs it with
 * LOOM_CUDA_CE=1M): allreduce of 6 types x sum/max/avg, reduce-scatter, allgather, broadcast (every
 *              root) on plain buffers, in and out of place, at several view offsets
 *   mismatch   2 ranks whose device collectives differ (count, op, a broadcast's root, a group
 *              fused differently): both get an error naming the call's number and both sides
 *              within 3 s, no hang (on one GPU only with LOOM_CUDA_SHARE_GPU=1, as
 *              tests/gpu/mismatch.sh runs it)
 *   kill       2 ranks, LOOM_TIMEOUT=5: rank 1 is SIGKILLed, rank 0 must see an error naming
 *              rank 1 and its stream must drain (run in a fresh exec of this program), once at
 *              4 MiB (direct path), once at 4 KiB (latency path) and once at 4 MiB with both
 *              buffers in symmetric windows (the peer dies with its windows mapped); on one GPU
 *              with LOOM_CUDA_SHARE_GPU=1 (tests/gpu/windows.sh)
 *
 * Exit: 0 all passed, 1 some failed, 77 skipped (no GPU, or nothing selected could run).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../src/base/cudrv.h"
#include "loom.h"

#define MAXR 16       /* ranks (GPUs) at most */
#define MAXCASES 3072 /* cases per group */
#define NIDS 6        /* unique ids a group may use */
#define POISON 0xA5   /* byte written over outputs before each call */
#define GUARD 256     /* bytes checked on each side of a view */
#define P(x) ((void *)(uintptr_t)(x))

/* ---- Types and values ------------------------------------------------------------------- */

enum { I8, U8, I32, U32, I64, U64, F16, F32, F64, BF16, F8E4, F8E5, NT };
static const size_t TS[NT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
static const char *TN[NT] = {"int8", "uint8", "int32",  "uint32",   "int64",   "uint64",
                             "half", "float", "double", "bfloat16", "fp8e4m3", "fp8e5m2"};
/* Generator kinds: the op indices 0..4, then premulsum, values needing one rounding, copies. */
enum { K_SUM, K_PROD, K_MAX, K_MIN, K_AVG, K_PREMUL, K_ROUND, K_COPY };
#define OP_PREMUL 5
static const char *ON[6] = {"sum", "prod", "max", "min", "avg", "premulsum"};

static bool is_float(int t)
{
    return t == F16 || t == F32 || t == F64 || t == BF16 || t == F8E4 || t == F8E5;
}
static bool is_signed(int t)
{
    return t != U8 && t != U32 && t != U64;
}

static uint16_t f2h(float f) /* round to nearest even */
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u;
    if (ax >= 0x47800000u) return sign | 0x7c00u;
    int e = (int)(ax >> 23) - 127;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    if (e >= -14) {
        uint32_t h = ((uint32_t)(e + 15) << 10) | ((m >> 13) & 0x3ffu);
        uint32_t rem = m & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    int shift = -e - 1;
    if (shift > 24) return sign;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

static float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    float f;
    if (e == 0x1f) {
        x = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        f = (float)m * 0x1p-24f;
        memcpy(&x, &f, 4);
        x |= sign;
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    memcpy(&f, &x, 4);
    return f;
}

static uint16_t f2bf(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf2f(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* The 8-bit floats (E4M3: 3 mantissa bits, bias 7, largest 448, no infinities; E5M2: 2, 15,
 * 57344): the value of a code, and the code of a double rounded to nearest even, saturated to
 * the largest finite value (loom's documented rounding), NaN as 0x7f. Written with frexp/ldexp
 * arithmetic, independently of loom's bit-level conversion. */
static double fp8_val(int t, uint8_t c)
{
    int mb = t == F8E4 ? 3 : 2, bias = t == F8E4 ? 7 : 15, emax = t == F8E4 ? 15 : 31;
    int e = (c & 0x7f) >> mb, m = c & ((1 << mb) - 1);
    double s = (c & 0x80) ? -1 : 1;
    if (t == F8E5 && e == emax) return m ? NAN : s * INFINITY;
    if (t == F8E4 && e == emax && m == (1 << mb) - 1) return NAN;
    return s * (e ? ldexp(1.0 + m / (double)(1 << mb), e - bias) : ldexp(m, 1 - bias - mb));
}

static uint8_t fp8_code(int t, double v)
{
    int mb = t == F8E4 ? 3 : 2, bias = t == F8E4 ? 7 : 15;
    double maxv = t == F8E4 ? 448 : 57344;
    if (isnan(v)) return 0x7f;
    uint8_t sign = signbit(v) ? 0x80 : 0;
    double a = fabs(v);
    if (a >= maxv) return sign | (t == F8E4 ? 0x7e : 0x7b);
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;       /* a in [2^e, 2^(e+1)) */
    if (e < 1 - bias) e = 1 - bias;
    double q = ldexp(1, e - mb), r = nearbyint(a / q) * q; /* ties to even */
    if (r > maxv) r = maxv;
    for (int c = 0; c < 0x80; c++) /* the code of the (representable) r */
        if (fp8_val(t, (uint8_t)c) == r) return (uint8_t)(sign | c);
    return 0xff; /* unreachable: r is representable */
}

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t hsh(uint64_t salt, int r, size_t i)
{
    return mix(mix(salt ^ ((uint64_t)(unsigned)r << 56)) ^ (uint64_t)i);
}

/* Stores v (representable in t, or rounded to nearest even for floating types) at p. */
static void put_val(int t, double v, uint8_t *p)
{
    switch (t) {
    case F16: {
        uint16_t h = f2h((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case BF16: {
        uint16_t h = f2bf((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case F32: {
        float f = (float)v;
        memcpy(p, &f, 4);
        break;
    }
    case F64: memcpy(p, &v, 8); break;
    case F8E4:
    case F8E5: *p = fp8_code(t, v); break;
    default: {
        uint64_t u = (uint64_t)(int64_t)v;
        memcpy(p, &u, TS[t]); /* little endian: the low bytes, wrapped */
    }
    }
}

static void put_int(int t, int64_t v, uint8_t *p)
{
    uint64_t u = (uint64_t)v;
    memcpy(p, &u, TS[t]);
}

static double range(uint64_t h, int64_t lo, int64_t hi)
{
    return (double)(lo + (int64_t)(h % (uint64_t)(hi - lo + 1)));
}

/* Rank r's value at index i for a case of kind k: chosen so that every sum, product and
 * pre-multiplied sum over up to MAXR ranks is exact in the accumulation type (and, except for
 * K_ROUND, in the type itself, whatever the order of the partial sums). */
static double gen_val(int k, int t, uint64_t salt, int r, int n, size_t i)
{
    uint64_t h = hsh(salt, r, i);
    switch (k) {
    case K_SUM:
    case K_AVG:
        switch (t) {
        case F8E4:
        case F8E5: return r < 8 ? range(h, -1, 1) : 0; /* partial sums within +-8: exact */
        case I8: return range(h, -7, 7);
        case U8: return range(h, 0, 15);
        case BF16: return range(h, -15, 15);
        case F16: return range(h, -100, 100);
        case U32:
        case U64: return range(h, 0, 2000);
        default: return range(h, -1000, 1000);
        }
    case K_MAX:
    case K_MIN:
        switch (t) {
        case F8E4:
        case F8E5: return range(h, -8, 8);
        case I8: return range(h, -100, 100);
        case U8: return range(h, 0, 200);
        case BF16: return range(h, -250, 250);
        case F16: return range(h, -2000, 2000);
        case U32:
        case U64: return range(h, 0, 4000000);
        default: return range(h, -1000000, 1000000);
        }
    case K_PROD:
        if (i % (size_t)n ==
            (size_t)r) { /* one rank per element brings 0, 2, 3 or their negatives */
            static const int sp_s[6] = {2, 3, -2, 0, -3, 1}, sp_u[4] = {2, 3, 0, 1};
            return is_signed(t) ? sp_s[(h >> 8) % 6] : sp_u[(h >> 8) % 4];
        }
        return (is_signed(t) && (h & 1)) ? -1 : 1;
    case K_PREMUL:
        if (t == I32) return range(h, -1000, 1000);
        if (t == BF16) return range(h, -2, 2);
        return range(h, -8, 8);
    case K_ROUND: /* exact in the type, their sum exact in float32 but not in the type */
        if (t == F16) return 256.0 + (double)(h % 1024) * 0.25;
        if (t == BF16) return 1.0 + (double)(h % 128) / 128.0;
        return range(h, -1000, 1000);
    default: return 0;
    }
}

/* Rank r's premulsum scalar. */
static double premul_scalar(int t, int r)
{
    return t == I32 ? (double)(r % 4 - 1) : 0.5 * (1 + r % 4);
}

static double round_to(int t, double v)
{
    switch (t) {
    case F16: return h2f(f2h((float)v));
    case BF16: return bf2f(f2bf((float)v));
    case F8E4:
    case F8E5: return fp8_val(t, fp8_code(t, v));
    case F32: return (float)v;
    default: return v;
    }
}

/* The reference result of op over the ranks' values x[0..n). */
static void ref_elem(int op, int t, int n, const double *x, uint8_t *out)
{
    if (!is_float(t)) {
        int64_t acc = (int64_t)x[0];
        if (op == OP_PREMUL) acc = (int64_t)premul_scalar(t, 0) * acc;
        for (int r = 1; r < n; r++) {
            int64_t v = (int64_t)x[r];
            switch (op) {
            case K_SUM:
            case K_AVG: acc += v; break;
            case K_PROD: acc *= v; break;
            case K_MAX: acc = v > acc ? v : acc; break;
            case K_MIN: acc = v < acc ? v : acc; break;
            case OP_PREMUL: acc += (int64_t)premul_scalar(t, r) * v; break;
            }
        }
        if (op == K_AVG) acc = is_signed(t) ? acc / n : (int64_t)((uint64_t)acc / (uint64_t)n);
        put_int(t, acc, out);
        return;
    }
    double acc = 0; /* exact: the inputs are chosen so */
    for (int r = 0; r < n; r++) {
        double v = x[r];
        if (op == OP_PREMUL) v = round_to(t, premul_scalar(t, r) * v); /* product rounded first */
        if (r == 0) {
            acc = v;
            continue;
        }
        switch (op) {
        case K_SUM:
        case K_AVG:
        case OP_PREMUL: acc += v; break;
        case K_PROD: acc *= v; break;
        case K_MAX: acc = v > acc ? v : acc; break;
        case K_MIN: acc = v < acc ? v : acc; break;
        }
    }
    if (op == K_AVG) acc = t == F64 ? acc / n : (double)((float)acc / (float)n);
    put_val(t, acc, out); /* half/bfloat16: float32 sum, rounded once */
}

static void gen_fill(int k, int t, uint64_t salt, int r, int n, size_t i0, size_t cnt, uint8_t *dst)
{
    size_t es = TS[t];
    for (size_t j = 0; j < cnt; j++) {
        uint8_t *p = dst + j * es;
        if (k == K_COPY) {
            uint64_t h = hsh(salt, r, i0 + j);
            if (!is_float(t))
                memcpy(p, &h, es);
            else
                put_val(t, ((double)(int64_t)(h % 2000001) - 1000000.0) / 16.0, p);
        } else {
            put_val(t, gen_val(k, t, salt, r, n, i0 + j), p);
        }
    }
}

static void ref_fill(int k, int op, int t, uint64_t salt, int n, size_t i0, size_t cnt,
                     uint8_t *dst)
{
    double x[MAXR] = {0};
    for (size_t j = 0; j < cnt; j++) {
        for (int r = 0; r < n; r++)
            x[r] = gen_val(k, t, salt, r, n, i0 + j);
        ref_elem(op, t, n, x, dst + j * TS[t]);
    }
}

static void fmt_elem(int t, const uint8_t *p, char *buf, size_t len)
{
    int8_t i8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t u16;
    float f;
    double d;
    switch (t) {
    case I8:
        memcpy(&i8, p, 1);
        snprintf(buf, len, "%d", i8);
        break;
    case U8: snprintf(buf, len, "%u", p[0]); break;
    case I32:
        memcpy(&i32, p, 4);
        snprintf(buf, len, "%" PRId32, i32);
        break;
    case U32:
        memcpy(&u32, p, 4);
        snprintf(buf, len, "%" PRIu32, u32);
        break;
    case I64:
        memcpy(&i64, p, 8);
        snprintf(buf, len, "%" PRId64, i64);
        break;
    case U64:
        memcpy(&u64, p, 8);
        snprintf(buf, len, "%" PRIu64, u64);
        break;
    case F16:
        memcpy(&u16, p, 2);
        snprintf(buf, len, "%.9g (0x%04x)", (double)h2f(u16), u16);
        break;
    case BF16:
        memcpy(&u16, p, 2);
        snprintf(buf, len, "%.9g (0x%04x)", (double)bf2f(u16), u16);
        break;
    case F8E4:
    case F8E5: snprintf(buf, len, "%.9g (0x%02x)", fp8_val(t, *p), *p); break;
    case F32:
        memcpy(&f, p, 4);
        memcpy(&u32, p, 4);
        snprintf(buf, len, "%.9g (0x%08" PRIx32 ")", (double)f, u32);
        break;
    default:
        memcpy(&d, p, 8);
        memcpy(&u64, p, 8);
        snprintf(buf, len, "%.17g (0x%016" PRIx64 ")", d, u64);
    }
}

/* ---- Results table (shared with the parent) ------------------------------------------- */

typedef struct {
    char name[176];
    int expect;             /* ranks that report it */
    int named;              /* 0, 1 being written, 2 written */
    int done;               /* ranks that reported */
    unsigned char st[MAXR]; /* 0 not reported, 1 ok, 2 failed */
    char msg[MAXR][232];
} case_t;

typedef struct {
    int ncases;
    int cur[MAXR]; /* the case each rank is in, -1 none */
    case_t c[MAXCASES];
} table_t;

static table_t *tab;

typedef struct {
    int rank, nranks, ngpu, dev;
    loomUniqueId ids[NIDS];
    const cudrv_t *d;
    CUdevice cudev;
    CUcontext ctx;
    CUstream s;
    loomComm_t comm;
    int next_case, cur;
    bool failed;
    char msg[232];
    const char *group;
} ctx_t;

static int verbose;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void case_begin(ctx_t *c, int expect, const char *fmt, ...)
{
    int idx = c->next_case++;
    c->failed = false;
    c->msg[0] = '\0';
    c->cur = idx < MAXCASES ? idx : -1;
    if (c->cur < 0) return;
    case_t *k = &tab->c[idx];
    int zero = 0;
    if (__atomic_compare_exchange_n(&k->named, &zero, 1, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(k->name, sizeof(k->name), fmt, ap);
        va_end(ap);
        k->expect = expect;
        __atomic_store_n(&k->named, 2, __ATOMIC_RELEASE);
    }
    int n = __atomic_load_n(&tab->ncases, __ATOMIC_ACQUIRE);
    while (n < idx + 1 && !__atomic_compare_exchange_n(&tab->ncases, &n, idx + 1, false,
                                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    __atomic_store_n(&tab->cur[c->rank], idx, __ATOMIC_RELEASE);
    if (verbose) {
        while (__atomic_load_n(&k->named, __ATOMIC_ACQUIRE) != 2) {
        }
        fprintf(stderr, "[rank %d] %s\n", c->rank, k->name);
    }
}

static void case_fail(ctx_t *c, const char *fmt, ...)
{
    if (c->failed) return; /* the first failure of a case is the one reported */
    c->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
    va_end(ap);
    if (verbose) fprintf(stderr, "[rank %d] FAIL: %s\n", c->rank, c->msg);
}

static void case_info(ctx_t *c, const char *fmt, ...)
{
    if (c->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
    va_end(ap);
}

static bool case_end(ctx_t *c)
{
    bool ok = !c->failed;
    if (c->cur >= 0) {
        case_t *k = &tab->c[c->cur];
        memcpy(k->msg[c->rank], c->msg, sizeof(c->msg));
        __atomic_store_n(&k->st[c->rank], ok ? 1 : 2, __ATOMIC_RELEASE);
        __atomic_add_fetch(&k->done, 1, __ATOMIC_ACQ_REL);
    }
    __atomic_store_n(&tab->cur[c->rank], -1, __ATOMIC_RELEASE);
    c->cur = -1;
    return ok;
}

/* Reports a failure the rank cannot go on from, and exits (the parent then stops its peers). */
static void fatal(ctx_t *c, const char *fmt, ...)
{
    char buf[232];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (c->cur < 0) case_begin(c, 1, "%s: rank %d cannot go on", c->group, c->rank);
    case_fail(c, "%s", buf);
    case_end(c);
    fflush(stderr);
    _exit(2);
}

static bool cu_ok(ctx_t *c, CUresult r, const char *what, int line)
{
    if (r == CUDA_SUCCESS) return true;
    case_fail(c, "%s: %s (line %d)", what, cudrv_err(r), line);
    return false;
}
#define CU(call) cu_ok(c, (call), #call, __LINE__)

static bool lok(ctx_t *c, loomResult_t r, loomComm_t comm, const char *what)
{
    if (r == loomSuccess) return true;
    case_fail(c, "%s returned %s: %s", what, loomGetErrorString(r), loomGetLastError(comm));
    return false;
}

/* Waits for stream s, then checks comm's asynchronous error. */
static bool sync_ok(ctx_t *c, CUstream s, loomComm_t comm)
{
    bool ok = CU(c->d->cuStreamSynchronize(s));
    loomResult_t ae = loomSuccess;
    if (comm && loomCommGetAsyncError(comm, &ae) == loomSuccess && ae != loomSuccess) {
        case_fail(c, "async error %s: %s", loomGetErrorString(ae), loomGetLastError(comm));
        ok = false;
    }
    return ok;
}

static CUdeviceptr dalloc(ctx_t *c, size_t bytes)
{
    CUdeviceptr p = 0;
    CUresult r = c->d->cuMemAlloc(&p, bytes ? bytes : 1);
    if (r != CUDA_SUCCESS) fatal(c, "cuMemAlloc(%zu) on GPU %d: %s", bytes, c->dev, cudrv_err(r));
    return p;
}

static void *halloc(ctx_t *c, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) fatal(c, "out of host memory (%zu bytes)", bytes);
    return p;
}

/* ---- Device regions: a device range and its expected contents --------------------------- */

typedef struct {
    CUdeviceptr base;
    size_t cap, total; /* allocated; in use (from base) */
    uint8_t *img;      /* expected contents of [base, base+total) */
    uint8_t *dc;       /* optional: 1 = don't care */
} reg_t;

static void reg_alloc(ctx_t *c, reg_t *r, size_t cap)
{
    memset(r, 0, sizeof(*r));
    r->base = dalloc(c, cap);
    r->cap = r->total = cap;
    r->img = halloc(c, cap);
}

static void reg_free(ctx_t *c, reg_t *r)
{
    if (r->base) c->d->cuMemFree(r->base);
    free(r->img);
    free(r->dc);
    memset(r, 0, sizeof(*r));
}

/* Uses the first `total` bytes, all poisoned (on c->s). */
static void reg_poison(ctx_t *c, reg_t *r, size_t total)
{
    if (total > r->cap) fatal(c, "internal: region of %zu bytes used for %zu", r->cap, total);
    r->total = total;
    CU(c->d->cuMemsetD8Async(r->base, POISON, total, c->s));
    memset(r->img, POISON, total);
    if (r->dc) memset(r->dc, 0, r->cap);
}

/* Writes host data at off (on c->s); it is expected to stay. */
static void reg_put(ctx_t *c, reg_t *r, size_t off, const void *src, size_t bytes)
{
    if (bytes == 0) return;
    CU(c->d->cuMemcpyHtoDAsync(r->base + off, src, bytes, c->s));
    memcpy(r->img + off, src, bytes);
}

static void reg_expect(reg_t *r, size_t off, const void *src, size_t bytes)
{
    if (bytes) memcpy(r->img + off, src, bytes);
}

static void reg_dontcare(ctx_t *c, reg_t *r, size_t off, size_t bytes)
{
    if (r->dc == NULL) {
        r->dc = calloc(1, r->cap);
        if (r->dc == NULL) fatal(c, "out of host memory");
    }
    memset(r->dc + off, 1, bytes);
}

static uint8_t *scratch;
static size_t scratch_cap;

/* Copies the region back (after c->s) and compares it with its image; the view
 * [off, off+len) holds elements of type t. */
static bool reg_check(ctx_t *c, reg_t *r, size_t off, size_t len, int t, const char *what)
{
    if (scratch_cap < r->total) {
        free(scratch);
        scratch_cap = r->total;
        scratch = malloc(scratch_cap);
        if (scratch == NULL) fatal(c, "out of host memory");
    }
    memset(scratch, POISON ^ 0xff, r->total);
    if (!CU(c->d->cuMemcpyDtoHAsync(scratch, r->base, r->total, c->s)) ||
        !CU(c->d->cuStreamSynchronize(c->s)))
        return false;
    size_t first = SIZE_MAX, nbad = 0;
    for (size_t b = 0; b < r->total; b++) {
        if (scratch[b] == r->img[b] || (r->dc && r->dc[b])) continue;
        if (first == SIZE_MAX) first = b;
        nbad++;
    }
    if (first == SIZE_MAX) return true;
    size_t es = TS[t];
    if (first >= off && first < off + len) {
        size_t e = (first - off) / es, at = off + e * es;
        char got[64], want[64];
        fmt_elem(t, scratch + at, got, sizeof(got));
        fmt_elem(t, r->img + at, want, sizeof(want));
        case_fail(c, "%s: first bad index %zu of %zu, got %s, want %s (%zu bad bytes)", what, e,
                  len / es, got, want, nbad);
    } else {
        long long rel =
            first < off ? (long long)first - (long long)off : (long long)(first - off - len);
        case_fail(c,
                  "%s: byte %s the view was written (%s%+lld): got 0x%02x, want 0x%02x "
                  "(%zu bad bytes)",
                  what, first < off ? "before" : "after", first < off ? "start" : "end",
                  first < off ? rel : rel + 1, scratch[first], r->img[first], nbad);
    }
    return false;
}

/* ---- allreduce -------------------------------------------------------------------------- */

static void ar_run(ctx_t *c, reg_t *A, reg_t *B, int t, const char *opn, loomRedOp_t op,
                   size_t count, bool inplace, const uint8_t *in, const uint8_t *exp,
                   const char *tag)
{
    size_t bytes = count * TS[t];
    case_begin(c, c->nranks, "allreduce %s %s n=%zu%s %s", TN[t], opn, count, tag,
               inplace ? "inplace" : "outofplace");
    reg_poison(c, A, bytes + 2 * GUARD);
    reg_put(c, A, GUARD, in, bytes);
    if (!inplace) reg_poison(c, B, bytes + 2 * GUARD);
    CUdeviceptr sp = A->base + GUARD, rp = inplace ? sp : B->base + GUARD;
    lok(c, loomAllReduce(P(sp), P(rp), count, (loomDataType_t)t, op, c->comm, c->s), c->comm,
        "loomAllReduce");
    sync_ok(c, c->s, c->comm);
    if (inplace) {
        reg_expect(A, GUARD, exp, bytes);
        reg_check(c, A, GUARD, bytes, t, "recvbuff");
    } else {
        reg_check(c, A, GUARD, bytes, t, "sendbuff (must stay unchanged)");
        reg_expect(B, GUARD, exp, bytes);
        reg_check(c, B, GUARD, bytes, t, "recvbuff");
    }
    case_end(c);
}

static void grp_allreduce(ctx_t *c)
{
    static const size_t counts[] = {0, 1, 7, 1023, 65537, ((size_t)1 << 22) + 3};
    const size_t ncounts = sizeof(counts) / sizeof(counts[0]);
    size_t maxb = counts[ncounts - 1] * 8;
    reg_t A, B;
    reg_alloc(c, &A, maxb + 2 * GUARD);
    reg_alloc(c, &B, maxb + 2 * GUARD);
    uint8_t *in = halloc(c, maxb), *exp = halloc(c, maxb);
    for (int t = 0; t < NT; t++) {
        bool premul = t == F32 || t == F16 || t == BF16 || t == I32;
        for (int o = 0; o < (premul ? 6 : 5); o++) {
            loomRedOp_t op = (loomRedOp_t)o;
            if (o == OP_PREMUL) {
                uint8_t scal[8];
                put_val(t, premul_scalar(t, c->rank), scal);
                case_begin(c, c->nranks, "allreduce %s premulsum: loomRedOpCreatePreMulSum", TN[t]);
                lok(c,
                    loomRedOpCreatePreMulSum(&op, scal, (loomDataType_t)t, loomScalarHostImmediate,
                                             c->comm),
                    c->comm, "loomRedOpCreatePreMulSum");
                case_end(c);
            }
            for (size_t ci = 0; ci < ncounts; ci++) {
                size_t count = counts[ci];
                uint64_t salt = mix(((uint64_t)t << 40) ^ ((uint64_t)o << 32) ^ count);
                gen_fill(o, t, salt, c->rank, c->nranks, 0, count, in);
                ref_fill(o, o, t, salt, c->nranks, 0, count, exp);
                for (int ip = 0; ip < 2; ip++)
                    ar_run(c, &A, &B, t, ON[o], op, count, ip, in, exp, "");
            }
            if (o == OP_PREMUL) loomRedOpDestroy(op, c->comm);
        }
    }
    /* half/bfloat16 accumulate in float32 and round once (sum, and avg = sum / nranks); the
     * 8-bit floats' rounding is covered by avg above (sum / nranks rounded once). */
    for (int t = F16; t <= BF16; t += BF16 - F16)
        for (int o = K_SUM; o <= K_AVG; o += K_AVG - K_SUM) {
            size_t count = 65537;
            uint64_t salt = mix(0x70756e64ull ^ ((uint64_t)t << 8) ^ (uint64_t)o);
            gen_fill(K_ROUND, t, salt, c->rank, c->nranks, 0, count, in);
            ref_fill(K_ROUND, o, t, salt, c->nranks, 0, count, exp);
            for (int ip = 0; ip < 2; ip++)
                ar_run(c, &A, &B, t, ON[o], (loomRedOp_t)o, count, ip, in, exp, " round-once");
        }
    free(in);
    free(exp);
    reg_free(c, &A);
    reg_free(c, &B);
}

/* ---- offsets ---------------------------------------------------------------------------- */

static void grp_offset(ctx_t *c)
{
    static const int types[3] = {F32, I8, U8};
    const size_t count = 100003, extra = 4096;
    for (int ti = 0; ti < 3; ti++) {
        int t = types[ti];
        size_t es = TS[t], bytes = count * es, alloc = bytes + 16 + extra;
        reg_t A, B;
        reg_alloc(c, &A, alloc);
        reg_alloc(c, &B, alloc);
        uint8_t *in = halloc(c, bytes), *exp = halloc(c, bytes);
        uint64_t salt = mix(0x6f6666ull + (uint64_t)t);
        gen_fill(K_SUM, t, salt, c->rank, c->nranks, 0, count, in);
        ref_fill(K_SUM, K_SUM, t, salt, c->nranks, 0, count, exp);
        for (size_t o = 0; o < 16; o += es) {
            size_t other = t == F32 ? (o + 4) % 16 : (o * 7 + 3) % 16;
            for (int v = 0; v < 3; v++) {
                bool inplace = v == 2;
                size_t so = o, ro = inplace ? o : v == 0 ? o : other;
                case_begin(c, c->nranks, "offset allreduce %s sum n=%zu send+%zu recv+%zu %s",
                           TN[t], count, so, ro, inplace ? "inplace" : "outofplace");
                reg_poison(c, &A, alloc);
                reg_put(c, &A, so, in, bytes);
                if (!inplace) reg_poison(c, &B, alloc);
                CUdeviceptr sp = A.base + so, rp = inplace ? sp : B.base + ro;
                lok(c,
                    loomAllReduce(P(sp), P(rp), count, (loomDataType_t)t, loomSum, c->comm, c->s),
                    c->comm, "loomAllReduce");
                sync_ok(c, c->s, c->comm);
                if (inplace) {
                    reg_expect(&A, so, exp, bytes);
                    reg_check(c, &A, so, bytes, t, "recvbuff");
                } else {
                    reg_check(c, &A, so, bytes, t, "sendbuff (must stay unchanged)");
                    reg_expect(&B, ro, exp, bytes);
                    reg_check(c, &B, ro, bytes, t, "recvbuff");
                }
                case_end(c);
            }
        }
        free(in);
        free(exp);
        reg_free(c, &A);
        reg_free(c, &B);
    }
}

/* ---- other collectives ------------------------------------------------------------------ */

/* the last makes float's reduce-scatter take the direct path (from 4 x LOOM_CUDA_DIRECT bytes
 * of input, 16 MiB on 2 ranks) and int8's the slots; odd, so that the ranks' segments start
 * off 16-byte boundaries */
static const size_t coll_counts[] = {0, 1, 1023, 262147, 2097157};
#define NCC (sizeof(coll_counts) / sizeof(coll_counts[0]))
#define COLL_MAX 2097157

static void grp_coll(ctx_t *c)
{
    int n = c->nranks, me = c->rank;
    size_t cap = (size_t)n * COLL_MAX * 8 + 2 * GUARD;
    reg_t A, B, C, D;
    reg_alloc(c, &A, cap);
    reg_alloc(c, &B, cap);
    reg_alloc(c, &C, cap);
    reg_alloc(c, &D, cap);
    uint8_t *h1 = halloc(c, cap), *h2 = halloc(c, cap), *e1 = halloc(c, cap), *e2 = halloc(c, cap);
    static const int ctypes[2] = {I8, F32};
    /* reductions: (type, op) */
    static const int rtypes[2][2] = {{F32, K_SUM}, {I8, K_MAX}};

    /* broadcast */
    for (int root = 0; root < n; root++)
        for (int ti = 0; ti < 2; ti++)
            for (size_t ci = 0; ci < NCC; ci++)
                for (int ip = 0; ip < 2; ip++) {
                    int t = ctypes[ti];
                    size_t count = coll_counts[ci], bytes = count * TS[t];
                    uint64_t salt =
                        mix(0xbcull ^ ((uint64_t)root << 8) ^ ((uint64_t)t << 16) ^ count);
                    case_begin(c, n, "broadcast %s n=%zu root=%d %s", TN[t], count, root,
                               ip ? "inplace" : "outofplace");
                    gen_fill(K_COPY, t, salt, me, n, 0, count, h1);   /* own data */
                    gen_fill(K_COPY, t, salt, root, n, 0, count, e1); /* root's */
                    reg_poison(c, &A, bytes + 2 * GUARD);
                    reg_put(c, &A, GUARD, h1, bytes);
                    if (!ip) reg_poison(c, &B, bytes + 2 * GUARD);
                    CUdeviceptr sp = A.base + GUARD, rp = ip ? sp : B.base + GUARD;
                    lok(c,
                        loomBroadcast(P(sp), P(rp), count, (loomDataType_t)t, root, c->comm, c->s),
                        c->comm, "loomBroadcast");
                    sync_ok(c, c->s, c->comm);
                    if (ip) {
                        reg_expect(&A, GUARD, e1, bytes);
                        reg_check(c, &A, GUARD, bytes, t, "buffer");
                    } else {
                        reg_check(c, &A, GUARD, bytes, t, "sendbuff (must stay unchanged)");
                        reg_expect(&B, GUARD, e1, bytes);
                        reg_check(c, &B, GUARD, bytes, t, "recvbuff");
                    }
                    case_end(c);
                }

    /* reduce */
    for (int root = 0; root < n; root++)
        for (int ti = 0; ti < 2; ti++)
            for (size_t ci = 0; ci < NCC; ci++)
                for (int ip = 0; ip < 2; ip++) {
                    int t = rtypes[ti][0], o = rtypes[ti][1];
                    size_t count = coll_counts[ci], bytes = count * TS[t];
                    uint64_t salt =
                        mix(0x7edull ^ ((uint64_t)root << 8) ^ ((uint64_t)t << 16) ^ count);
                    case_begin(c, n, "reduce %s %s n=%zu root=%d %s", TN[t], ON[o], count, root,
                               ip ? "inplace" : "outofplace");
                    gen_fill(o, t, salt, me, n, 0, count, h1);
                    ref_fill(o, o, t, salt, n, 0, count, e1);
                    reg_poison(c, &A, bytes + 2 * GUARD);
                    reg_put(c, &A, GUARD, h1, bytes);
                    if (!ip) reg_poison(c, &B, bytes + 2 * GUARD);
                    CUdeviceptr sp = A.base + GUARD, rp = ip ? sp : B.base + GUARD;
                    lok(c,
                        loomReduce(P(sp), P(rp), count, (loomDataType_t)t, (loomRedOp_t)o, root,
                                   c->comm, c->s),
                        c->comm, "loomReduce");
                    sync_ok(c, c->s, c->comm);
                    if (ip) {
                        if (me == root)
                            reg_expect(&A, GUARD, e1, bytes);
                        else
                            reg_dontcare(c, &A, GUARD, bytes);
                        reg_check(c, &A, GUARD, bytes, t, "buffer");
                    } else {
                        reg_check(c, &A, GUARD, bytes, t, "sendbuff (must stay unchanged)");
                        if (me == root) {
                            reg_expect(&B, GUARD, e1, bytes);
                            reg_check(c, &B, GUARD, bytes, t, "recvbuff");
                        }
                    }
                    case_end(c);
                }

    /* allgather */
    for (int ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < NCC; ci++)
            for (int ip = 0; ip < 2; ip++) {
                int t = ctypes[ti];
                size_t count = coll_counts[ci], bytes = count * TS[t];
                uint64_t salt = mix(0xa9ull ^ ((uint64_t)t << 16) ^ count);
                case_begin(c, n, "allgather %s n=%zu %s", TN[t], count,
                           ip ? "inplace" : "outofplace");
                gen_fill(K_COPY, t, salt, me, n, 0, count, h1);
                for (int r = 0; r < n; r++)
                    gen_fill(K_COPY, t, salt, r, n, 0, count, e1 + r * bytes);
                reg_poison(c, &B, (size_t)n * bytes + 2 * GUARD);
                CUdeviceptr sp;
                if (ip) {
                    reg_put(c, &B, GUARD + (size_t)me * bytes, h1, bytes);
                    sp = B.base + GUARD + (size_t)me * bytes;
                } else {
                    reg_poison(c, &A, bytes + 2 * GUARD);
                    reg_put(c, &A, GUARD, h1, bytes);
                    sp = A.base + GUARD;
                }
                lok(c,
                    loomAllGather(P(sp), P(B.base + GUARD), count, (loomDataType_t)t, c->comm,
                                  c->s),
                    c->comm, "loomAllGather");
                sync_ok(c, c->s, c->comm);
                if (!ip) reg_check(c, &A, GUARD, bytes, t, "sendbuff (must stay unchanged)");
                reg_expect(&B, GUARD, e1, (size_t)n * bytes);
                reg_check(c, &B, GUARD, (size_t)n * bytes, t, "recvbuff");
                case_end(c);
            }

    /* reducescatter */
    for (int ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < NCC; ci++)
            for (int ip = 0; ip < 2; ip++) {
                int t = rtypes[ti][0], o = rtypes[ti][1];
                size_t count = coll_counts[ci], bytes = count * TS[t];
                uint64_t salt = mix(0x25ull ^ ((uint64_t)t << 16) ^ count);
                case_begin(c, n, "reducescatter %s %s n=%zu %s", TN[t], ON[o], count,
                           ip ? "inplace" : "outofplace");
                gen_fill(o, t, salt, me, n, 0, (size_t)n * count, h1);
                ref_fill(o, o, t, salt, n, (size_t)me * count, count, e1);
                reg_poison(c, &A, (size_t)n * bytes + 2 * GUARD);
                reg_put(c, &A, GUARD, h1, (size_t)n * bytes);
                CUdeviceptr rp;
                if (ip) {
                    rp = A.base + GUARD + (size_t)me * bytes;
                } else {
                    reg_poison(c, &B, bytes + 2 * GUARD);
                    rp = B.base + GUARD;
                }
                lok(c,
                    loomReduceScatter(P(A.base + GUARD), P(rp), count, (loomDataType_t)t,
                                      (loomRedOp_t)o, c->comm, c->s),
                    c->comm, "loomReduceScatter");
                sync_ok(c, c->s, c->comm);
                if (ip) {
                    /* only this rank's slice is defined afterwards */
                    reg_dontcare(c, &A, GUARD, (size_t)n * bytes);
                    reg_expect(&A, GUARD + (size_t)me * bytes, e1, bytes);
                    if (A.dc) memset(A.dc + GUARD + (size_t)me * bytes, 0, bytes);
                    reg_check(c, &A, GUARD + (size_t)me * bytes, bytes, t, "recvbuff (own slice)");
                } else {
                    reg_check(c, &A, GUARD, (size_t)n * bytes, t, "sendbuff (must stay unchanged)");
                    reg_expect(&B, GUARD, e1, bytes);
                    reg_check(c, &B, GUARD, bytes, t, "recvbuff");
                }
                case_end(c);
            }

    /* alltoall (out of place only) */
    for (int ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < NCC; ci++) {
            int t = ctypes[ti];
            size_t count = coll_counts[ci], bytes = count * TS[t];
            uint64_t salt = mix(0xa2aull ^ ((uint64_t)t << 16) ^ count);
            case_begin(c, n, "alltoall %s n=%zu outofplace", TN[t], count);
            gen_fill(K_COPY, t, salt, me, n, 0, (size_t)n * count, h1);
            for (int r = 0; r < n; r++)
                gen_fill(K_COPY, t, salt, r, n, (size_t)me * count, count, e1 + r * bytes);
            reg_poison(c, &A, (size_t)n * bytes + 2 * GUARD);
            reg_put(c, &A, GUARD, h1, (size_t)n * bytes);
            reg_poison(c, &B, (size_t)n * bytes + 2 * GUARD);
            lok(c,
                loomAlltoAll(P(A.base + GUARD), P(B.base + GUARD), count, (loomDataType_t)t,
                             c->comm, c->s),
                c->comm, "loomAlltoAll");
            sync_ok(c, c->s, c->comm);
            reg_check(c, &A, GUARD, (size_t)n * bytes, t, "sendbuff (must stay unchanged)");
            reg_expect(&B, GUARD, e1, (size_t)n * bytes);
            reg_check(c, &B, GUARD, (size_t)n * bytes, t, "recvbuff");
            case_end(c);
        }

    /* send/recv in a group: a ring (to next, from previous) and both directions at once */
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (int ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < NCC; ci++)
            for (int bidir = 0; bidir < 2; bidir++) {
                int t = ctypes[ti];
                size_t count = coll_counts[ci], bytes = count * TS[t];
                uint64_t salt = mix(0x5e4dull ^ ((uint64_t)t << 16) ^ count);
                uint64_t salt2 = mix(salt + 1);
                case_begin(c, n, "sendrecv %s n=%zu %s", TN[t], count,
                           bidir ? "both directions (group of 2 sends, 2 recvs)"
                                 : "ring (group of send to next, recv from previous)");
                gen_fill(K_COPY, t, salt, me, n, 0, count, h1);
                gen_fill(K_COPY, t, salt2, me, n, 0, count, h2);
                gen_fill(K_COPY, t, salt, prev, n, 0, count, e1);  /* prev's first buffer */
                gen_fill(K_COPY, t, salt2, next, n, 0, count, e2); /* next's second buffer */
                reg_poison(c, &A, bytes + 2 * GUARD);
                reg_put(c, &A, GUARD, h1, bytes);
                reg_poison(c, &B, bytes + 2 * GUARD);
                reg_poison(c, &C, bytes + 2 * GUARD);
                reg_put(c, &C, GUARD, h2, bytes);
                reg_poison(c, &D, bytes + 2 * GUARD);
                loomDataType_t dt = (loomDataType_t)t;
                lok(c, loomGroupStart(), c->comm, "loomGroupStart");
                lok(c, loomSend(P(A.base + GUARD), count, dt, next, c->comm, c->s), c->comm,
                    "loomSend");
                if (bidir)
                    lok(c, loomSend(P(C.base + GUARD), count, dt, prev, c->comm, c->s), c->comm,
                        "loomSend");
                lok(c, loomRecv(P(B.base + GUARD), count, dt, prev, c->comm, c->s), c->comm,
                    "loomRecv");
                if (bidir)
                    lok(c, loomRecv(P(D.base + GUARD), count, dt, next, c->comm, c->s), c->comm,
                        "loomRecv");
                lok(c, loomGroupEnd(), c->comm, "loomGroupEnd");
                sync_ok(c, c->s, c->comm);
                reg_check(c, &A, GUARD, bytes, t, "sendbuff (must stay unchanged)");
                reg_expect(&B, GUARD, e1, bytes);
                reg_check(c, &B, GUARD, bytes, t, "recvbuff from previous");
                if (bidir) {
                    reg_check(c, &C, GUARD, bytes, t, "second sendbuff (must stay unchanged)");
                    reg_expect(&D, GUARD, e2, bytes);
                    reg_check(c, &D, GUARD, bytes, t, "recvbuff from next");
                } else {
                    reg_check(c, &D, GUARD, bytes, t, "unused buffer");
                }
                case_end(c);
            }
    free(h1);
    free(h2);
    free(e1);
    free(e2);
    reg_free(c, &A);
    reg_free(c, &B);
    reg_free(c, &C);
    reg_free(c, &D);
}

/* ---- streams ---------------------------------------------------------------------------- */

static void grp_streams(ctx_t *c)
{
    const cudrv_t *d = c->d;
    int n = c->nranks;
    loomComm_t sc[3] = {NULL, NULL, NULL};
    CUstream ss[3] = {NULL, NULL, NULL};
    case_begin(c, n, "streams: loomCommSplit into 3 communicators, 3 streams");
    for (int k = 0; k < 3; k++) {
        lok(c, loomCommSplit(c->comm, 0, c->rank, &sc[k], NULL), c->comm, "loomCommSplit");
        CU(d->cuStreamCreate(&ss[k], CU_STREAM_NON_BLOCKING));
    }
    if (!case_end(c)) fatal(c, "cannot go on without the split communicators");

    static const struct {
        int t, o;
        size_t count;
    } spec[3] = {{F32, K_SUM, 1048577}, {I32, K_MIN, 300007}, {F16, K_SUM, 65537}};
    enum { ROUNDS = 4 };
    reg_t in[3][ROUNDS], out[3][ROUNDS];
    uint8_t *h = halloc(c, 1048577 * 4), *e = halloc(c, 1048577 * 4);
    case_begin(c, n,
               "streams: 3 communicators on 3 streams concurrently, %d rounds (float sum "
               "n=1048577, int32 min n=300007, half sum n=65537)",
               ROUNDS);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < ROUNDS; j++) {
            int t = spec[k].t, o = spec[k].o;
            size_t bytes = spec[k].count * TS[t];
            uint64_t salt = mix(0x57ull ^ ((uint64_t)k << 8) ^ (uint64_t)j);
            reg_alloc(c, &in[k][j], bytes + 2 * GUARD);
            reg_alloc(c, &out[k][j], bytes + 2 * GUARD);
            gen_fill(o, t, salt, c->rank, n, 0, spec[k].count, h);
            ref_fill(o, o, t, salt, n, 0, spec[k].count, e);
            reg_poison(c, &in[k][j], bytes + 2 * GUARD);
            reg_put(c, &in[k][j], GUARD, h, bytes);
            reg_poison(c, &out[k][j], bytes + 2 * GUARD);
            reg_expect(&out[k][j], GUARD, e, bytes);
            CU(d->cuStreamSynchronize(c->s)); /* h is reused */
        }
    for (int j = 0; j < ROUNDS; j++)
        for (int k = 0; k < 3; k++)
            lok(c,
                loomAllReduce(P(in[k][j].base + GUARD), P(out[k][j].base + GUARD), spec[k].count,
                              (loomDataType_t)spec[k].t, (loomRedOp_t)spec[k].o, sc[k], ss[k]),
                sc[k], "loomAllReduce");
    for (int k = 0; k < 3; k++)
        sync_ok(c, ss[k], sc[k]);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < ROUNDS; j++) {
            char what[64];
            snprintf(what, sizeof(what), "communicator %d round %d recvbuff", k, j);
            reg_check(c, &out[k][j], GUARD, spec[k].count * TS[spec[k].t], spec[k].t, what);
        }
    case_end(c);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < ROUNDS; j++) {
            reg_free(c, &in[k][j]);
            reg_free(c, &out[k][j]);
        }

    /* one communicator, calls alternating between two streams, no synchronisation between */
    enum { ALT = 6 };
    const size_t cnt = 262147, bytes = cnt * 4;
    reg_t X[ALT], Y[ALT];
    case_begin(c, n, "streams: one communicator, %d allreduces alternating between 2 streams", ALT);
    for (int j = 0; j < ALT; j++) {
        uint64_t salt = mix(0xa17ull + (uint64_t)j);
        reg_alloc(c, &X[j], bytes + 2 * GUARD);
        reg_alloc(c, &Y[j], bytes + 2 * GUARD);
        gen_fill(K_SUM, F32, salt, c->rank, n, 0, cnt, h);
        ref_fill(K_SUM, K_SUM, F32, salt, n, 0, cnt, e);
        reg_poison(c, &X[j], bytes + 2 * GUARD);
        reg_put(c, &X[j], GUARD, h, bytes);
        reg_poison(c, &Y[j], bytes + 2 * GUARD);
        reg_expect(&Y[j], GUARD, e, bytes);
        CU(d->cuStreamSynchronize(c->s));
    }
    for (int j = 0; j < ALT; j++)
        lok(c,
            loomAllReduce(P(X[j].base + GUARD), P(Y[j].base + GUARD), cnt, loomFloat32, loomSum,
                          c->comm, ss[j % 2]),
            c->comm, "loomAllReduce");
    sync_ok(c, ss[0], c->comm);
    sync_ok(c, ss[1], c->comm);
    for (int j = 0; j < ALT; j++) {
        char what[64];
        snprintf(what, sizeof(what), "call %d (stream %c) recvbuff", j, j % 2 ? 'B' : 'A');
        reg_check(c, &Y[j], GUARD, bytes, F32, what);
    }
    case_end(c);

    /* stream B waits (event) for stream A's allreduce, whose result it reduces again */
    case_begin(c, n,
               "streams: one communicator, stream B waits on an event after stream A's "
               "allreduce and reduces its result");
    CUevent ev = NULL;
    CU(d->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    uint64_t salt = mix(0xe7e7ull);
    gen_fill(K_SUM, F32, salt, c->rank, n, 0, cnt, h);
    ref_fill(K_SUM, K_SUM, F32, salt, n, 0, cnt, e);
    reg_poison(c, &X[0], bytes + 2 * GUARD);
    reg_put(c, &X[0], GUARD, h, bytes);
    reg_poison(c, &Y[0], bytes + 2 * GUARD);
    reg_poison(c, &Y[1], bytes + 2 * GUARD);
    reg_expect(&Y[0], GUARD, e, bytes);
    for (size_t i = 0; i < cnt; i++) {
        float f;
        memcpy(&f, e + i * 4, 4);
        f *= (float)n;
        memcpy(e + i * 4, &f, 4);
    }
    reg_expect(&Y[1], GUARD, e, bytes);
    CU(d->cuStreamSynchronize(c->s));
    lok(c,
        loomAllReduce(P(X[0].base + GUARD), P(Y[0].base + GUARD), cnt, loomFloat32, loomSum,
                      c->comm, ss[0]),
        c->comm, "loomAllReduce (stream A)");
    CU(d->cuEventRecord(ev, ss[0]));
    CU(d->cuStreamWaitEvent(ss[1], ev, 0));
    lok(c,
        loomAllReduce(P(Y[0].base + GUARD), P(Y[1].base + GUARD), cnt, loomFloat32, loomSum,
                      c->comm, ss[1]),
        c->comm, "loomAllReduce (stream B)");
    sync_ok(c, ss[1], c->comm);
    sync_ok(c, ss[0], c->comm);
    reg_check(c, &Y[0], GUARD, bytes, F32, "stream A recvbuff");
    reg_check(c, &Y[1], GUARD, bytes, F32, "stream B recvbuff (nranks x A's)");
    if (ev) d->cuEventDestroy(ev);
    case_end(c);

    /* no user events: each call reduces, in place, what the call before it produced on the
     * other stream; the communicator runs its calls in call order (the latency path marks a
     * small call's end by a count in device memory that the next stream waits on, others by
     * an event), so the result is the first call's times nranks^(CHAIN-1) */
    enum { CHAIN = 8 };
    /* 148 B: the end marked by a count (LOOM_CUDA_COUNTED); larger: by events; all fit X/Y */
    static const size_t chain_cnt[3] = {37, 4099, 250007};
    for (int q = 0; q < 3; q++) {
        size_t cc = chain_cnt[q], cb = cc * 4;
        case_begin(c, n,
                   "streams: one communicator, %d in-place allreduces chained across 2 streams "
                   "without events (float sum n=%zu)",
                   CHAIN, cc);
        salt = mix(0xc4a1ull + (uint64_t)q);
        gen_fill(K_SUM, F32, salt, c->rank, n, 0, cc, h);
        ref_fill(K_SUM, K_SUM, F32, salt, n, 0, cc, e);
        for (size_t i = 0; i < cc; i++) {
            float f;
            memcpy(&f, e + i * 4, 4);
            for (int r = 1; r < CHAIN; r++)
                f *= (float)n;
            memcpy(e + i * 4, &f, 4);
        }
        reg_poison(c, &Y[2], cb + 2 * GUARD);
        reg_put(c, &Y[2], GUARD, h, cb);
        reg_expect(&Y[2], GUARD, e, cb);
        CU(d->cuStreamSynchronize(c->s));
        for (int r = 0; r < CHAIN; r++)
            lok(c,
                loomAllReduce(P(Y[2].base + GUARD), P(Y[2].base + GUARD), cc, loomFloat32, loomSum,
                              c->comm, ss[r % 2]),
                c->comm, "loomAllReduce (chained)");
        sync_ok(c, ss[(CHAIN - 1) % 2], c->comm);
        sync_ok(c, ss[CHAIN % 2], c->comm);
        reg_check(c, &Y[2], GUARD, cb, F32, "recvbuff after the chain");
        case_end(c);
    }
    for (int j = 0; j < ALT; j++) {
        reg_free(c, &X[j]);
        reg_free(c, &Y[j]);
    }
    free(h);
    free(e);
    for (int k = 0; k < 3; k++) {
        if (sc[k]) loomCommDestroy(sc[k]);
        if (ss[k]) d->cuStreamDestroy(ss[k]);
    }
}

/* ---- bursts ----------------------------------------------------------------------------- */

/* Many allreduces of changing sizes queued back to back with one synchronize at the end: the
 * low-latency path reuses its slots without acknowledgements, by step parity per lane, and the
 * sizes here change the number of lanes a launch uses from call to call (1 block, a few, all of
 * them, then the slot path just past the low-latency limit) so that any slot reused too early
 * shows up as a wrong result. */
static void grp_burst(ctx_t *c)
{
    static const size_t counts[] = {1, 300, 2048, 65536, 262144, 262145, 5, 131072, 1025};
    enum { NC = sizeof(counts) / sizeof(counts[0]), NOPS = 270 };
    size_t off[NOPS], total = 0;
    for (int i = 0; i < NOPS; i++) {
        off[i] = total;
        total += (counts[i % NC] * 4 + 255) & ~(size_t)255;
    }
    reg_t A, B;
    reg_alloc(c, &A, total);
    reg_alloc(c, &B, total);
    uint8_t *in = halloc(c, total), *exp = halloc(c, total);
    memset(in, POISON, total);
    memset(exp, POISON, total);
    for (int i = 0; i < NOPS; i++) {
        int t = i % 2 ? I32 : F32, o = i % 2 ? K_MAX : K_SUM;
        uint64_t salt = mix(0x6275727374ull ^ (uint64_t)i);
        gen_fill(o, t, salt, c->rank, c->nranks, 0, counts[i % NC], in + off[i]);
        ref_fill(o, o, t, salt, c->nranks, 0, counts[i % NC], exp + off[i]);
    }
    case_begin(c, c->nranks,
               "burst: %d allreduces back to back (float sum / int32 max, %d sizes 4 B..1 MiB+4, "
               "every third in place), one synchronize",
               NOPS, (int)NC);
    reg_poison(c, &A, total);
    reg_poison(c, &B, total);
    for (int i = 0; i < NOPS; i++) {
        size_t bytes = counts[i % NC] * 4;
        if (i % 3 == 2)
            reg_put(c, &B, off[i], in + off[i], bytes);
        else
            reg_put(c, &A, off[i], in + off[i], bytes);
    }
    for (int i = 0; i < NOPS; i++) {
        int t = i % 2 ? I32 : F32;
        CUdeviceptr sp = (i % 3 == 2 ? B.base : A.base) + off[i], rp = B.base + off[i];
        if (!lok(c,
                 loomAllReduce(P(sp), P(rp), counts[i % NC], (loomDataType_t)t,
                               i % 2 ? loomMax : loomSum, c->comm, c->s),
                 c->comm, "loomAllReduce"))
            break;
    }
    if (sync_ok(c, c->s, c->comm)) {
        for (int i = 0; i < NOPS; i++)
            reg_expect(&B, off[i], exp + off[i], counts[i % NC] * 4);
        reg_check(c, &A, 0, total, F32, "sendbuffs (must stay unchanged)");
        reg_check(c, &B, 0, total, F32, "recvbuffs");
    }
    case_end(c);
    free(in);
    free(exp);
    reg_free(c, &A);
    reg_free(c, &B);
}

/* ---- CUDA graphs ------------------------------------------------------------------------ */

static void grp_graph(ctx_t *c)
{
    const cudrv_t *d = c->d;
    int n = c->nranks, root = n - 1;
    const size_t na = 1048579, nc = 4099, nd = 3001;
    const size_t ba = na * 4, bc = nc * 4, bd = nd;
    reg_t A, B, C, D, E;
    reg_alloc(c, &A, ba + 2 * GUARD);
    reg_alloc(c, &B, ba + 2 * GUARD);
    reg_alloc(c, &C, bc + 2 * GUARD);
    reg_alloc(c, &D, bd + 2 * GUARD);
    reg_alloc(c, &E, bd + 2 * GUARD);
    uint8_t *h = halloc(c, ba), *e = halloc(c, ba);
    CUgraph g = NULL;
    CUgraphExec ge = NULL;

    case_begin(c, n,
               "graph: capture (relaxed) allreduce float sum n=%zu, allreduce int32 max n=%zu "
               "inplace, broadcast int8 n=%zu root=%d; instantiate",
               na, nc, nd, root);
    bool capturing = CU(d->cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_RELAXED));
    if (capturing) {
        lok(c,
            loomAllReduce(P(A.base + GUARD), P(B.base + GUARD), na, loomFloat32, loomSum, c->comm,
                          c->s),
            c->comm, "loomAllReduce (captured)");
        lok(c,
            loomAllReduce(P(C.base + GUARD), P(C.base + GUARD), nc, loomInt32, loomMax, c->comm,
                          c->s),
            c->comm, "loomAllReduce (captured)");
        lok(c,
            loomBroadcast(P(D.base + GUARD), P(E.base + GUARD), nd, loomInt8, root, c->comm, c->s),
            c->comm, "loomBroadcast (captured)");
        if (CU(d->cuStreamEndCapture(c->s, &g)) && g) CU(d->cuGraphInstantiate(&ge, g, 0));
    }
    bool have = case_end(c) && ge != NULL;

    enum { REPS = 100 };
    case_begin(c, n, "graph: %d replays, inputs changed between replays (cuMemcpyHtoDAsync)", REPS);
    int bad_rep = -1;
    for (int rep = 0; have && rep < REPS; rep++) {
        bool was = c->failed;
        uint64_t s1 = mix(0x6a1ull + (uint64_t)rep), s2 = mix(s1), s3 = mix(s2);
        gen_fill(K_SUM, F32, s1, c->rank, n, 0, na, h);
        ref_fill(K_SUM, K_SUM, F32, s1, n, 0, na, e);
        reg_poison(c, &A, ba + 2 * GUARD);
        reg_put(c, &A, GUARD, h, ba);
        reg_poison(c, &B, ba + 2 * GUARD);
        reg_expect(&B, GUARD, e, ba);
        CU(d->cuStreamSynchronize(c->s));
        gen_fill(K_MAX, I32, s2, c->rank, n, 0, nc, h);
        ref_fill(K_MAX, K_MAX, I32, s2, n, 0, nc, e);
        reg_poison(c, &C, bc + 2 * GUARD);
        reg_put(c, &C, GUARD, h, bc);
        CU(d->cuStreamSynchronize(c->s));
        reg_expect(&C, GUARD, e, bc);
        gen_fill(K_COPY, I8, s3, c->rank, n, 0, nd, h);
        reg_poison(c, &D, bd + 2 * GUARD);
        reg_put(c, &D, GUARD, h, bd);
        reg_poison(c, &E, bd + 2 * GUARD);
        gen_fill(K_COPY, I8, s3, root, n, 0, nd, e);
        reg_expect(&E, GUARD, e, bd);
        CU(d->cuGraphLaunch(ge, c->s));
        sync_ok(c, c->s, c->comm);
        reg_check(c, &A, GUARD, ba, F32, "allreduce sendbuff (must stay unchanged)");
        reg_check(c, &B, GUARD, ba, F32, "allreduce recvbuff");
        reg_check(c, &C, GUARD, bc, I32, "in-place allreduce buffer");
        reg_check(c, &D, GUARD, bd, I8, "broadcast sendbuff (must stay unchanged)");
        reg_check(c, &E, GUARD, bd, I8, "broadcast recvbuff");
        if (!was && c->failed) {
            bad_rep = rep;
            char first[232];
            memcpy(first, c->msg, sizeof(first));
            snprintf(c->msg, sizeof(c->msg), "replay %d: %.200s", rep, first);
        }
    }
    if (!have)
        case_fail(c, "no graph to replay");
    else if (bad_rep < 0)
        case_info(c, "%d replays checked", REPS);
    case_end(c);
    if (ge) d->cuGraphExecDestroy(ge);
    if (g) d->cuGraphDestroy(g);
    free(h);
    free(e);
    reg_free(c, &A);
    reg_free(c, &B);
    reg_free(c, &C);
    reg_free(c, &D);
    reg_free(c, &E);
}

/* ---- 2^31 elements ---------------------------------------------------------------------- */

/* The expected sum at i: in the windows, rank r holds 1 + hash % 16; elsewhere 1. */
static uint8_t big_want(const size_t *ws, const size_t *wl, int nw, int n, uint64_t salt, size_t i)
{
    for (int k = 0; k < nw; k++)
        if (i >= ws[k] && i < ws[k] + wl[k]) {
            unsigned s = 0;
            for (int r = 0; r < n; r++)
                s += (unsigned)(1 + hsh(salt, r, i) % 16);
            return (uint8_t)s; /* wraps mod 256 past 16 ranks, as uint8 sums do */
        }
    return (uint8_t)n;
}

static void grp_big(ctx_t *c)
{
    const cudrv_t *d = c->d;
    int n = c->nranks;
    const size_t count = ((size_t)1 << 31) + 4099, tail = 4096;
    const uint64_t salt = 0xb16b16ull;
    enum { NW = 18, WLEN = 4096, NS = 16, SLEN = 1 << 20 };
    size_t ws[NW], wl[NW];
    ws[0] = 0;
    wl[0] = 65536;
    ws[1] = ((size_t)1 << 31) - 65536;
    wl[1] = count - ws[1]; /* through the last element */
    for (int k = 2; k < NW; k++) {
        ws[k] = (size_t)(mix(salt + (uint64_t)k) % (count - WLEN));
        wl[k] = WLEN;
    }
    case_begin(c, n,
               "allreduce uint8 sum n=%zu outofplace (windows, samples and the last %zu "
               "elements checked)",
               count, wl[1]);
    CUdeviceptr in = dalloc(c, count), out = dalloc(c, count + tail);
    size_t maxw = wl[1] > SLEN ? wl[1] : SLEN;
    uint8_t *h = halloc(c, maxw), *g = halloc(c, maxw);
    CU(d->cuMemsetD8Async(in, 1, count, c->s));
    CU(d->cuMemsetD8Async(out, POISON, count + tail, c->s));
    /* in the windows, rank r holds 1 + hash % 16 (the sum wraps mod 256 past 16 ranks) */
    for (int k = 0; k < NW; k++) {
        for (size_t i = 0; i < wl[k]; i++)
            h[i] = (uint8_t)(1 + hsh(salt, c->rank, ws[k] + i) % 16);
        CU(d->cuMemcpyHtoDAsync(in + ws[k], h, wl[k], c->s));
        CU(d->cuStreamSynchronize(c->s));
    }
    double t0 = now();
    lok(c, loomAllReduce(P(in), P(out), count, loomUint8, loomSum, c->comm, c->s), c->comm,
        "loomAllReduce");
    sync_ok(c, c->s, c->comm);
    double secs = now() - t0;
    for (int k = 0; k < NW + NS && !c->failed; k++) {
        size_t st, len;
        if (k < NW) {
            st = ws[k];
            len = wl[k];
        } else {
            st = (size_t)(mix(salt ^ 0x5a5aull ^ (uint64_t)k) % (count - SLEN));
            len = SLEN;
        }
        if (!CU(d->cuMemcpyDtoHAsync(g, out + st, len, c->s)) || !CU(d->cuStreamSynchronize(c->s)))
            break;
        for (size_t i = 0; i < len; i++) {
            uint8_t w = big_want(ws, wl, NW, n, salt, st + i);
            if (g[i] != w) {
                case_fail(c, "recvbuff: first bad index %zu, got %u, want %u", st + i, g[i], w);
                break;
            }
        }
    }
    if (!c->failed && CU(d->cuMemcpyDtoHAsync(g, out + count, tail, c->s)) &&
        CU(d->cuStreamSynchronize(c->s)))
        for (size_t i = 0; i < tail; i++)
            if (g[i] != POISON) {
                case_fail(c, "byte after the view was written (end+%zu): got 0x%02x, want 0x%02x",
                          i + 1, g[i], POISON);
                break;
            }
    case_info(c, "%.2f s, %.1f GB/s algorithm bandwidth", secs, (double)count / secs / 1e9);
    case_end(c);
    free(h);
    free(g);
    d->cuMemFree(in);
    d->cuMemFree(out);
}

/* ---- one process, every GPU ------------------------------------------------------------- */

typedef struct {
    const cudrv_t *d;
    CUcontext ctx;
    CUstream s;
    loomComm_t comm;
    CUdeviceptr sp, rp;
    size_t count;
    loomResult_t r;
    CUresult cr;
    char err[200];
} ia_thread_t;

static void *ia_thread(void *p)
{
    ia_thread_t *a = p;
    a->cr = a->d->cuCtxSetCurrent(a->ctx);
    if (a->cr != CUDA_SUCCESS) return NULL;
    a->r = loomAllReduce(P(a->sp), P(a->rp), a->count, loomFloat32, loomSum, a->comm, a->s);
    if (a->r != loomSuccess) snprintf(a->err, sizeof(a->err), "%s", loomGetLastError(a->comm));
    return NULL;
}

static void grp_initall(ctx_t *c)
{
    const cudrv_t *d = c->d;
    int n = c->ngpu;
    const size_t na = 1048579, nc = 4099, ba = na * 4, bc = nc * 4;
    CUcontext ctx[MAXR];
    CUstream st[MAXR];
    reg_t A[MAXR], B[MAXR], C[MAXR];
    uint8_t *h = halloc(c, ba), *ea = halloc(c, ba), *ec = halloc(c, bc);

    case_begin(c, 1, "initall: contexts, buffers and streams on %d GPU%s", n, n > 1 ? "s" : "");
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        if (!CU(d->cuDeviceGet(&dev, i)) || !CU(d->cuDevicePrimaryCtxRetain(&ctx[i], dev)) ||
            !CU(d->cuCtxSetCurrent(ctx[i])) ||
            !CU(d->cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING)))
            fatal(c, "GPU %d: %s", i, c->msg);
        c->dev = i;
        reg_alloc(c, &A[i], ba + 2 * GUARD);
        reg_alloc(c, &B[i], ba + 2 * GUARD);
        reg_alloc(c, &C[i], bc + 2 * GUARD);
    }
    case_end(c);

    /* Runs a group of 2 allreduces per communicator from this thread; comm i's buffers are on
     * GPU devlist[i]. The current context is left at the last GPU on purpose: loom must use
     * each communicator's own device. */
    for (int variant = 0; variant < 2; variant++) {
        int devlist[MAXR];
        for (int i = 0; i < n; i++)
            devlist[i] = variant ? n - 1 - i : i;
        if (variant && n < 2) break;
        loomComm_t comms[MAXR] = {NULL};
        case_begin(c, 1, "initall: loomCommInitAll(%d, %s)", n,
                   variant ? "devlist reversed" : "devlist NULL");
        bool ok =
            lok(c, loomCommInitAll(comms, n, variant ? devlist : NULL), NULL, "loomCommInitAll");
        for (int i = 0; ok && i < n; i++) {
            int cnt = -1, rank = -1;
            loomCommCount(comms[i], &cnt);
            loomCommUserRank(comms[i], &rank);
            if (cnt != n || rank != i) case_fail(c, "comm %d: count %d rank %d", i, cnt, rank);
        }
        if (!case_end(c)) continue;

        case_begin(c, 1,
                   "initall: one thread, group of %d x (allreduce float sum n=%zu, allreduce int32 "
                   "max n=%zu inplace)%s",
                   n, na, nc, variant ? ", devlist reversed" : "");
        uint64_t s1 = mix(0x1a11ull + (uint64_t)variant), s2 = mix(s1);
        ref_fill(K_SUM, K_SUM, F32, s1, n, 0, na, ea);
        ref_fill(K_MAX, K_MAX, I32, s2, n, 0, nc, ec);
        for (int i = 0; i < n; i++) {
            int g = devlist[i];
            CU(d->cuCtxSetCurrent(ctx[g]));
            c->s = st[g];
            gen_fill(K_SUM, F32, s1, i, n, 0, na, h);
            reg_poison(c, &A[g], ba + 2 * GUARD);
            reg_put(c, &A[g], GUARD, h, ba);
            reg_poison(c, &B[g], ba + 2 * GUARD);
            reg_expect(&B[g], GUARD, ea, ba);
            CU(d->cuStreamSynchronize(c->s));
            gen_fill(K_MAX, I32, s2, i, n, 0, nc, h);
            reg_poison(c, &C[g], bc + 2 * GUARD);
            reg_put(c, &C[g], GUARD, h, bc);
            reg_expect(&C[g], GUARD, ec, bc);
            CU(d->cuStreamSynchronize(c->s));
        }
        lok(c, loomGroupStart(), NULL, "loomGroupStart");
        for (int i = 0; i < n; i++) {
            int g = devlist[i];
            lok(c,
                loomAllReduce(P(A[g].base + GUARD), P(B[g].base + GUARD), na, loomFloat32, loomSum,
                              comms[i], st[g]),
                comms[i], "loomAllReduce");
            lok(c,
                loomAllReduce(P(C[g].base + GUARD), P(C[g].base + GUARD), nc, loomInt32, loomMax,
                              comms[i], st[g]),
                comms[i], "loomAllReduce");
        }
        lok(c, loomGroupEnd(), NULL, "loomGroupEnd");
        for (int i = 0; i < n; i++) {
            int g = devlist[i];
            CU(d->cuCtxSetCurrent(ctx[g]));
            c->s = st[g];
            sync_ok(c, st[g], comms[i]);
            char what[64];
            snprintf(what, sizeof(what), "rank %d (GPU %d) recvbuff", i, g);
            reg_check(c, &B[g], GUARD, ba, F32, what);
            snprintf(what, sizeof(what), "rank %d (GPU %d) in-place buffer", i, g);
            reg_check(c, &C[g], GUARD, bc, I32, what);
            int cd = -2;
            loomCommCuDevice(comms[i], &cd);
            if (cd != g) case_fail(c, "loomCommCuDevice(rank %d) = %d, want %d", i, cd, g);
        }
        case_end(c);

        if (!variant) {
            case_begin(c, 1, "initall: one thread per communicator, allreduce float sum n=%zu", na);
            ia_thread_t a[MAXR];
            pthread_t th[MAXR];
            uint64_t s3 = mix(0x7123ull);
            ref_fill(K_SUM, K_SUM, F32, s3, n, 0, na, ea);
            for (int i = 0; i < n; i++) {
                CU(d->cuCtxSetCurrent(ctx[i]));
                c->s = st[i];
                gen_fill(K_SUM, F32, s3, i, n, 0, na, h);
                reg_poison(c, &A[i], ba + 2 * GUARD);
                reg_put(c, &A[i], GUARD, h, ba);
                reg_poison(c, &B[i], ba + 2 * GUARD);
                reg_expect(&B[i], GUARD, ea, ba);
                CU(d->cuStreamSynchronize(c->s));
                a[i] = (ia_thread_t){.d = d,
                                     .ctx = ctx[i],
                                     .s = st[i],
                                     .comm = comms[i],
                                     .sp = A[i].base + GUARD,
                                     .rp = B[i].base + GUARD,
                                     .count = na};
            }
            int started = 0;
            for (; started < n; started++)
                if (pthread_create(&th[started], NULL, ia_thread, &a[started]) != 0) {
                    case_fail(c, "pthread_create failed");
                    break;
                }
            for (int i = 0; i < started; i++)
                pthread_join(th[i], NULL);
            for (int i = 0; i < started; i++) {
                if (a[i].cr != CUDA_SUCCESS)
                    case_fail(c, "thread %d: cuCtxSetCurrent: %s", i, cudrv_err(a[i].cr));
                else if (a[i].r != loomSuccess)
                    case_fail(c, "thread %d: loomAllReduce returned %s: %s", i,
                              loomGetErrorString(a[i].r), a[i].err);
                CU(d->cuCtxSetCurrent(ctx[i]));
                c->s = st[i];
                sync_ok(c, st[i], comms[i]);
                char what[64];
                snprintf(what, sizeof(what), "rank %d recvbuff", i);
                reg_check(c, &B[i], GUARD, ba, F32, what);
            }
            case_end(c);
        }
        for (int i = 0; i < n; i++)
            if (comms[i]) loomCommDestroy(comms[i]);
    }
    for (int i = 0; i < n; i++) {
        d->cuCtxSetCurrent(ctx[i]);
        reg_free(c, &A[i]);
        reg_free(c, &B[i]);
        reg_free(c, &C[i]);
        d->cuStreamDestroy(st[i]);
    }
    c->s = NULL;
    free(h);
    free(ea);
    free(ec);
}

/* ---- registered windows ----------------------------------------------------------------- */

/* Counts of the window cases: the latency path's sizes (or, with LOOM_CUDA_LL=0, the window
 * kernels at every size), the one shot below LOOM_CUDA_DIRECT (4 MiB), two shots above it. */
static const size_t win_counts[] = {1, 7, 1023, 65537, 786433, 1048579, 4194307};
#define NWC (sizeof(win_counts) / sizeof(win_counts[0]))
#define WIN_MAX 4194307

static bool win_reg(ctx_t *c, CUdeviceptr p, size_t size, int flags, loomWindow_t *w)
{
    *w = NULL;
    return lok(c, loomCommWindowRegister(c->comm, P(p), size, w, flags), c->comm,
               "loomCommWindowRegister");
}

static void win_dereg(ctx_t *c, loomWindow_t *w)
{
    if (*w) lok(c, loomCommWindowDeregister(c->comm, *w), c->comm, "loomCommWindowDeregister");
    *w = NULL;
}

/* A call that must fail with `want` and a text holding `text` on this rank. */
static void want_err(ctx_t *c, loomResult_t r, loomResult_t want, const char *text,
                     const char *what)
{
    const char *e = loomGetLastError(c->comm);
    if (r != want)
        case_fail(c, "%s: got %s, want %s (%s)", what, loomGetErrorString(r),
                  loomGetErrorString(want), e ? e : "");
    else if (!e || !strstr(e, text))
        case_fail(c, "%s: error text \"%s\" lacks \"%s\"", what, e ? e : "(null)", text);
    else
        case_info(c, "%s", e);
}

/* One allreduce, reduce-scatter, allgather or broadcast case on A (send) and B (recv), views at
 * GUARD + soff / roff; checks both regions. */
static void win_case(ctx_t *c, reg_t *A, reg_t *B, int kind, int t, size_t count, bool ip, int root,
                     size_t soff, size_t roff, const char *tag, uint8_t *h1, uint8_t *e1)
{
    int n = c->nranks, me = c->rank;
    size_t bytes = count * TS[t], nb = (size_t)n * bytes;
    static const char *kn[4] = {"allreduce", "reducescatter", "allgather", "broadcast"};
    uint64_t salt = mix(0x3131ull ^ ((uint64_t)kind << 40) ^ ((uint64_t)t << 32) ^ count ^
                        ((uint64_t)root << 48) ^ ((uint64_t)ip << 56));
    case_begin(c, n, "%s %s %s n=%zu%s %s", tag, kn[kind], TN[t], count,
               kind == 3 ? (root ? " root=1" : " root=0") : "", ip ? "inplace" : "outofplace");
    size_t sbytes = kind == 1 ? nb : bytes, rbytes = kind == 2 ? nb : bytes;
    if (kind <= 1) {
        gen_fill(K_SUM, t, salt, me, n, 0, sbytes / TS[t], h1);
        ref_fill(K_SUM, K_SUM, t, salt, n, kind == 1 ? (size_t)me * count : 0, count, e1);
    } else {
        gen_fill(K_COPY, t, salt, me, n, 0, count, h1);
        for (int r = 0; r < n; r++)
            if (kind == 2 || r == root) gen_fill(K_COPY, t, salt, r, n, 0, count, e1 + r * bytes);
    }
    size_t stot = GUARD + soff + sbytes + GUARD, rtot = GUARD + roff + rbytes + GUARD;
    CUdeviceptr sp, rp;
    reg_t *R = ip ? A : B;
    if (ip) { /* one buffer: in place at the rank's slice (reduce-scatter's output, allgather's
               * input) */
        size_t tot = GUARD + soff + (sbytes > rbytes ? sbytes : rbytes) + GUARD;
        reg_poison(c, A, tot);
        rp = A->base + GUARD + soff;
        sp = kind == 2 ? rp + (size_t)me * bytes : rp;
        reg_put(c, A, (size_t)(sp - A->base), h1, sbytes);
        if (kind == 1) rp = sp + (size_t)me * bytes;
    } else {
        reg_poison(c, A, stot);
        reg_put(c, A, GUARD + soff, h1, sbytes);
        reg_poison(c, B, rtot);
        sp = A->base + GUARD + soff;
        rp = B->base + GUARD + roff;
    }
    loomResult_t r = loomSuccess;
    switch (kind) {
    case 0:
        r = loomAllReduce(P(sp), P(rp), count, (loomDataType_t)t, loomSum, c->comm, c->s);
        break;
    case 1:
        r = loomReduceScatter(P(sp), P(rp), count, (loomDataType_t)t, loomSum, c->comm, c->s);
        break;
    case 2: r = loomAllGather(P(sp), P(rp), count, (loomDataType_t)t, c->comm, c->s); break;
    default: r = loomBroadcast(P(sp), P(rp), count, (loomDataType_t)t, root, c->comm, c->s);
    }
    lok(c, r, c->comm, kn[kind]);
    sync_ok(c, c->s, c->comm);
    size_t ro = (size_t)(rp - R->base);
    if (kind == 1 && ip) { /* only this rank's slice is defined afterwards */
        reg_dontcare(c, A, (size_t)(sp - A->base), nb);
        if (A->dc) memset(A->dc + ro, 0, bytes);
    }
    if (!ip) reg_check(c, A, GUARD + soff, sbytes, t, "sendbuff (must stay unchanged)");
    reg_expect(R, ro, kind == 3 ? e1 + (size_t)root * bytes : e1, rbytes);
    reg_check(c, R, ro, rbytes, t, "recvbuff");
    case_end(c);
}

static void grp_win(ctx_t *c)
{
    const cudrv_t *d = c->d;
    int n = c->nranks, me = c->rank;
    size_t cap = (size_t)n * WIN_MAX * 4 + 2 * GUARD + 8192;
    reg_t A, B;
    reg_alloc(c, &A, cap);
    reg_alloc(c, &B, cap);
    uint8_t *h1 = halloc(c, cap), *e1 = halloc(c, cap);
    loomWindow_t wa = NULL, wb = NULL;

    /* symmetric windows over both allocations: every kind, size, type, in and out of place */
    case_begin(c, n, "win: register symmetric windows of %zu bytes (send and receive)", cap);
    win_reg(c, A.base, cap, LOOM_WIN_COLL_SYMMETRIC, &wa);
    win_reg(c, B.base, cap, LOOM_WIN_COLL_SYMMETRIC, &wb);
    if (!case_end(c)) fatal(c, "cannot go on without windows");
    static const int wtypes[2] = {F32, BF16};
    for (int kind = 0; kind < 4; kind++)
        for (int ti = 0; ti < 2; ti++)
            for (size_t ci = 0; ci < NWC; ci++)
                for (int ip = 0; ip < 2; ip++)
                    for (int root = 0; root < (kind == 3 ? n : 1); root++) {
                        size_t count = win_counts[ci];
                        if (kind != 0 && count > 1048579) continue; /* n x the size: enough */
                        win_case(c, &A, &B, kind, wtypes[ti], count, ip, root, 0, 0, "win sym", h1,
                                 e1);
                    }

    /* windows of a communicator split from this one, on allocations of their own, while this
     * one's stay registered; then this one's again once the split one is gone */
    {
        loomComm_t parent = c->comm, sub = NULL;
        size_t cap2 = (size_t)n * 1048579 * 4 + 2 * GUARD + 8192;
        reg_t A2, B2;
        reg_alloc(c, &A2, cap2);
        reg_alloc(c, &B2, cap2);
        loomWindow_t sa = NULL, sb = NULL;
        case_begin(c, n, "win: loomCommSplit; symmetric windows on the new communicator");
        if (lok(c, loomCommSplit(parent, 0, me, &sub, NULL), parent, "loomCommSplit")) {
            c->comm = sub;
            win_reg(c, A2.base, cap2, LOOM_WIN_COLL_SYMMETRIC, &sa);
            win_reg(c, B2.base, cap2, LOOM_WIN_COLL_SYMMETRIC, &sb);
        }
        bool split_ok = case_end(c);
        if (split_ok) {
            for (int kind = 0; kind < 4; kind++)
                for (int ip = 0; ip < 2; ip++)
                    win_case(c, &A2, &B2, kind, F32, kind == 0 ? 1048579 : 65537, ip, n - 1, 0, 0,
                             "win split", h1, e1);
            c->comm = parent; /* the parent's windows between the split one's calls */
            win_case(c, &A, &B, 0, BF16, 65537, false, 0, 0, 0, "win parent beside split,", h1, e1);
            c->comm = sub;
            win_case(c, &A2, &B2, 0, BF16, 4099, true, 0, 0, 0, "win split again,", h1, e1);
        }
        case_begin(c, n, "win: deregister the split communicator's windows; destroy it");
        if (sub) {
            c->comm = sub;
            win_dereg(c, &sa);
            win_dereg(c, &sb);
            lok(c, loomCommDestroy(sub), NULL, "loomCommDestroy (split)");
        }
        c->comm = parent;
        case_end(c);
        win_case(c, &A, &B, 0, F32, 1048579, true, 0, 0, 0, "win parent after split,", h1, e1);
        reg_free(c, &A2);
        reg_free(c, &B2);
    }

    /* calls on symmetric windows need no exchange on the host: captured in a CUDA graph, they
     * replay with new inputs (a one-shot allreduce out of place, a two-shot one in place) */
    case_begin(c, n,
               "win: capture allreduce float n=786433 outofplace and n=4194307 inplace on "
               "windows, 10 replays with new inputs");
    {
        const size_t n1 = 786433, n2 = 4194307, b1 = n1 * 4, b2 = n2 * 4, o2 = GUARD + (4u << 20);
        CUgraph g = NULL;
        CUgraphExec ge = NULL;
        if (CU(d->cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_RELAXED))) {
            lok(c,
                loomAllReduce(P(A.base + GUARD), P(B.base + GUARD), n1, loomFloat32, loomSum,
                              c->comm, c->s),
                c->comm, "loomAllReduce (captured, one shot)");
            lok(c,
                loomAllReduce(P(B.base + o2), P(B.base + o2), n2, loomFloat32, loomSum, c->comm,
                              c->s),
                c->comm, "loomAllReduce (captured, two shots, in place)");
            if (CU(d->cuStreamEndCapture(c->s, &g)) && g) CU(d->cuGraphInstantiate(&ge, g, 0));
        }
        for (int rep = 0; ge && rep < 10 && !c->failed; rep++) {
            uint64_t s1 = mix(0x9a1ull + (uint64_t)rep), s2 = mix(s1);
            reg_poison(c, &A, GUARD + b1 + GUARD);
            gen_fill(K_SUM, F32, s1, me, n, 0, n1, h1);
            reg_put(c, &A, GUARD, h1, b1);
            reg_poison(c, &B, o2 + b2 + GUARD);
            ref_fill(K_SUM, K_SUM, F32, s1, n, 0, n1, e1);
            reg_expect(&B, GUARD, e1, b1);
            gen_fill(K_SUM, F32, s2, me, n, 0, n2, h1);
            reg_put(c, &B, o2, h1, b2);
            ref_fill(K_SUM, K_SUM, F32, s2, n, 0, n2, e1);
            reg_expect(&B, o2, e1, b2);
            CU(d->cuGraphLaunch(ge, c->s));
            sync_ok(c, c->s, c->comm);
            reg_check(c, &A, GUARD, b1, F32, "sendbuff (must stay unchanged)");
            reg_check(c, &B, o2, b2, F32, "recvbuffs of the replay");
            if (c->failed) {
                char first[232];
                memcpy(first, c->msg, sizeof(first));
                snprintf(c->msg, sizeof(c->msg), "replay %d: %.200s", rep, first);
            }
        }
        if (ge == NULL) case_fail(c, "no graph to replay");
        if (ge) d->cuGraphExecDestroy(ge);
        if (g) d->cuGraphDestroy(g);
    }
    case_end(c);

    /* misuse, each refused on every rank with the rank, window and addresses named; the
     * communicator stays usable */
    case_begin(c, n, "win: a buffer partly inside a window -> loomInvalidArgument");
    {
        loomWindow_t wh = NULL;
        win_dereg(c, &wb);
        win_reg(c, B.base, cap / 2, LOOM_WIN_COLL_SYMMETRIC, &wh);
        CUdeviceptr rp = B.base + cap / 2 - 4096;
        for (int k = 0; k < 2; k++) { /* latency-path size and window-kernel size */
            size_t cnt = k ? 1048579 : 4096;
            want_err(c, loomAllReduce(P(A.base), P(rp), cnt, loomFloat32, loomSum, c->comm, c->s),
                     loomInvalidArgument, "partly inside window",
                     "allreduce across a window's end");
        }
        sync_ok(c, c->s, c->comm);
        win_dereg(c, &wh);
        win_reg(c, B.base, cap, LOOM_WIN_COLL_SYMMETRIC, &wb);
    }
    case_end(c);
    case_begin(c, n, "win: symmetric windows of different sizes -> loomInvalidArgument");
    {
        loomWindow_t w = NULL;
        want_err(c,
                 loomCommWindowRegister(c->comm, P(B.base), cap - (size_t)me * 4096, &w,
                                        LOOM_WIN_COLL_SYMMETRIC),
                 loomInvalidArgument, "same size on every rank", "loomCommWindowRegister");
        if (w) case_fail(c, "*win set after a failure");
    }
    case_end(c);
    case_begin(c, n, "win: different flags on the ranks -> loomInvalidArgument");
    {
        loomWindow_t w = NULL;
        want_err(c,
                 loomCommWindowRegister(c->comm, P(B.base), 4096, &w,
                                        me ? LOOM_WIN_DEFAULT : LOOM_WIN_COLL_SYMMETRIC),
                 loomInvalidArgument, "same flags", "loomCommWindowRegister");
    }
    case_end(c);
    case_begin(c, n, "win: a buffer past its allocation's end -> loomInvalidArgument");
    {
        loomWindow_t w = NULL;
        want_err(c, loomCommWindowRegister(c->comm, P(A.base + cap - 100), (size_t)1 << 30, &w, 0),
                 loomInvalidArgument, "runs past the end of its allocation",
                 "loomCommWindowRegister");
    }
    case_end(c);
    case_begin(c, n, "win: host memory, unknown and twice-deregistered windows -> errors");
    {
        loomWindow_t w = NULL;
        want_err(c, loomCommWindowRegister(c->comm, h1, 4096, &w, 0), loomInvalidArgument,
                 "host memory", "loomCommWindowRegister on host memory");
        int junk = 0;
        want_err(c, loomCommWindowDeregister(c->comm, (loomWindow_t)(void *)&junk),
                 loomInvalidArgument, "not a window registered", "deregister of a non-window");
        loomWindow_t w2 = NULL;
        win_reg(c, A.base, 8192, 0, &w2);
        loomWindow_t copy = w2;
        win_dereg(c, &w2);
        want_err(c, loomCommWindowDeregister(c->comm, copy), loomInvalidArgument,
                 "not a window registered", "second deregister of a window");
    }
    case_end(c);
    win_case(c, &A, &B, 0, F32, 1048579, false, 0, 0, 0, "win after the errors,", h1, e1);

    /* deregistration waits for the calls queued on the window: 8 allreduces on two streams,
     * deregister, then overwrite the input at once (the legacy stream, not ordered after them) */
    case_begin(c, n, "win: deregister ordered after 8 queued allreduces on 2 streams");
    {
        CUstream s2 = NULL;
        CU(d->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
        size_t count = 1048579, bytes = count * 4;
        uint64_t salt = mix(0xde7ull);
        gen_fill(K_SUM, F32, salt, me, n, 0, count, h1);
        ref_fill(K_SUM, K_SUM, F32, salt, n, 0, count, e1);
        reg_poison(c, &A, bytes);
        reg_put(c, &A, 0, h1, bytes);
        reg_poison(c, &B, 8 * bytes);
        CU(d->cuStreamSynchronize(c->s));
        for (int k = 0; k < 8; k++)
            lok(c,
                loomAllReduce(P(A.base), P(B.base + (size_t)k * bytes), count, loomFloat32, loomSum,
                              c->comm, k % 2 ? s2 : c->s),
                c->comm, "loomAllReduce");
        win_dereg(c, &wa);
        win_dereg(c, &wb);
        CU(d->cuMemsetD8(A.base, 0, bytes));
        CU(d->cuCtxSynchronize());
        memset(A.img, 0, bytes);
        for (int k = 0; k < 8; k++)
            reg_expect(&B, (size_t)k * bytes, e1, bytes);
        reg_check(c, &B, 0, 8 * bytes, F32, "recvbuff of the queued calls");
        d->cuStreamDestroy(s2);
    }
    case_end(c);

    /* windows without the flag, at different sizes and offsets on the ranks: the direct path
     * through the windows (offsets exchanged per call), the slots below it */
    case_begin(c, n, "win: register non-symmetric windows (sizes differ by rank)");
    win_reg(c, A.base + (size_t)me * 512, cap - 8192 - (size_t)me * 1024, 0, &wa);
    win_reg(c, B.base, cap - (size_t)me * 4096, 0, &wb);
    case_end(c);
    for (int ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < NWC; ci++)
            for (int ip = 0; ip < 2; ip++)
                win_case(c, &A, &B, 0, wtypes[ti], win_counts[ci], ip, 0, 512 + (size_t)me * 64,
                         (size_t)me * 128, "win nonsym", h1, e1);
    win_case(c, &A, &B, 1, F32, 1048579, false, 0, 512 + (size_t)me * 64, 0, "win nonsym", h1, e1);
    case_begin(c, n, "win: deregister the non-symmetric windows");
    win_dereg(c, &wa);
    win_dereg(c, &wb);
    case_end(c);

    /* memory from the VMM API has no legacy IPC handle: its windows are registered but never
     * mapped, and calls on them take the paths of unregistered memory */
    case_begin(c, n, "win: symmetric windows on VMM memory (cuMemCreate): registered, plain paths");
    {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = c->dev;
        size_t gran = 0, vsz = 0;
        CUmemGenericAllocationHandle vh = 0;
        CUdeviceptr va = 0;
        bool made = false;
        if (CU(d->cuMemGetAllocationGranularity(&gran, &prop,
                                                CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))) {
            vsz = (2 * (size_t)4194307 * 4 + 2 * GUARD + gran - 1) / gran * gran;
            made = CU(d->cuMemCreate(&vh, vsz, &prop, 0)) &&
                   CU(d->cuMemAddressReserve(&va, vsz, 0, 0, 0)) &&
                   CU(d->cuMemMap(va, vsz, 0, vh, 0));
            CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->dev},
                                   .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
            made = made && CU(d->cuMemSetAccess(va, vsz, &acc, 1));
        }
        loomWindow_t wv = NULL;
        if (made && win_reg(c, va, vsz, LOOM_WIN_COLL_SYMMETRIC, &wv)) {
            static const size_t vc[2] = {65537, 4194307};
            for (int k = 0; k < 2 && !c->failed; k++) {
                size_t count = vc[k], bytes = count * 4;
                uint64_t salt = mix(0x7a7ull + (uint64_t)k);
                gen_fill(K_SUM, F32, salt, me, n, 0, count, h1);
                ref_fill(K_SUM, K_SUM, F32, salt, n, 0, count, e1);
                CU(d->cuMemcpyHtoDAsync(va + GUARD, h1, bytes, c->s));
                lok(c,
                    loomAllReduce(P(va + GUARD), P(va + GUARD), count, loomFloat32, loomSum,
                                  c->comm, c->s),
                    c->comm, "loomAllReduce on a VMM window");
                sync_ok(c, c->s, c->comm);
                CU(d->cuMemcpyDtoH(h1, va + GUARD, bytes));
                if (!c->failed && memcmp(h1, e1, bytes) != 0)
                    case_fail(c, "allreduce in place n=%zu on a VMM window: wrong result", count);
            }
            win_dereg(c, &wv);
        }
        if (made) d->cuMemUnmap(va, vsz);
        if (va) d->cuMemAddressFree(va, vsz);
        if (vh) d->cuMemRelease(vh);
    }
    case_end(c);
    free(h1);
    free(e1);
    reg_free(c, &A);
    reg_free(c, &B);
}

/* ---- graphs: every same-node path captured, replayed many times ------------------------- */

/* One captured call of grp_graphs: its kind, buffers (each its own allocation; in a window or
 * not) and the path it is meant to take on two ranks with the defaults. */
enum { GK_AR, GK_RS, GK_AG, GK_BC, GK_RD, GK_A2A, GK_SR };
static const char *const GKN[] = {"allreduce", "reducescatter", "allgather", "broadcast",
                                  "reduce",    "alltoall",      "sendrecv"};
typedef struct {
    int kind, t, op;
    size_t count;
    int ip, root;
    int win; /* 0: plain memory; 1: symmetric windows; 2: windows without the flag */
    const char *path;
    reg_t S, R;
    loomWindow_t ws, wr;
} gcall_t;

/* designated, so that the buffers (zero) need no initializer */
#define GC(k, ty, o, n, inplace, rt, w, p)                                                         \
    {                                                                                              \
        .kind = k, .t = ty, .op = o, .count = n, .ip = inplace, .root = rt, .win = w, .path = p    \
    }
static gcall_t gcalls[] = {
    GC(GK_AR, F32, K_SUM, 1, 0, 0, 0, "latency path"),
    GC(GK_AR, BF16, K_SUM, 4099, 1, 0, 0, "latency path"),
    GC(GK_AR, I32, K_MAX, 65537, 0, 0, 0, "latency path"),
    GC(GK_RS, F32, K_SUM, 1023, 0, 0, 0, "latency path"),
    GC(GK_AR, F32, K_SUM, 786433, 0, 0, 0, "slots, one shot"),
    GC(GK_AR, F32, K_SUM, 1048579, 0, 0, 0, "direct"),
    GC(GK_AR, F32, K_SUM, 1048579, 1, 0, 0, "direct"),
    GC(GK_RS, F32, K_SUM, 2097157, 0, 0, 0, "direct"),
    GC(GK_AG, I8, K_COPY, 3001, 0, 0, 0, "slots"),
    GC(GK_BC, I32, K_COPY, 262147, 1, -1, 0, "slots"),
    GC(GK_RD, F32, K_SUM, 4099, 0, 0, 0, "slots"),
    GC(GK_A2A, I32, K_COPY, 1023, 0, 0, 0, "slots"),
    GC(GK_SR, I8, K_COPY, 5000, 0, 0, 0, "slots"),
    GC(GK_AR, F32, K_SUM, 4099, 0, 0, 1, "latency path (windows with LOOM_CUDA_LL=0)"),
    GC(GK_AR, F32, K_SUM, 786433, 0, 0, 1, "one shot on windows"),
    GC(GK_AR, F32, K_SUM, 1048579, 1, 0, 1, "two shots on windows"),
    GC(GK_RS, F32, K_SUM, 65537, 0, 0, 1, "latency path (windows with LOOM_CUDA_LL=0)"),
    GC(GK_AG, F32, K_COPY, 65537, 1, 0, 1, "allgather on windows"),
    GC(GK_BC, F32, K_COPY, 65537, 0, 0, 1, "broadcast on windows"),
    GC(GK_AR, F32, K_SUM, 1048579, 0, 0, 2, "direct through non-symmetric windows"),
    GC(GK_AR, F32, K_SUM, 7, 1, 0, 0, "latency path"),
};
#define NGCALLS ((int)(sizeof(gcalls) / sizeof(gcalls[0])))

/* Elements of the send and receive buffers of a call on n ranks. */
static size_t gc_in(const gcall_t *g, int n)
{
    return g->kind == GK_RS || g->kind == GK_A2A ? (size_t)n * g->count : g->count;
}
static size_t gc_out(const gcall_t *g, int n)
{
    return g->kind == GK_AG || g->kind == GK_A2A ? (size_t)n * g->count : g->count;
}

static void gc_alloc(ctx_t *c, gcall_t *g)
{
    int n = c->nranks;
    size_t es = TS[g->t];
    if (g->root < 0) g->root = n - 1;
    reg_alloc(c, &g->S, gc_in(g, n) * es + 2 * GUARD);
    reg_alloc(c, &g->R, gc_out(g, n) * es + 2 * GUARD);
    if (g->win) {
        int fl = g->win == 1 ? LOOM_WIN_COLL_SYMMETRIC : LOOM_WIN_DEFAULT;
        win_reg(c, g->S.base, g->S.cap, fl, &g->ws);
        win_reg(c, g->R.base, g->R.cap, fl, &g->wr);
    }
}

static void gc_free(ctx_t *c, gcall_t *g)
{
    win_dereg(c, &g->ws);
    win_dereg(c, &g->wr);
    reg_free(c, &g->S);
    reg_free(c, &g->R);
}

/* Where the call reads and writes (device addresses). */
static void gc_ptrs(const ctx_t *c, const gcall_t *g, CUdeviceptr *sp, CUdeviceptr *rp)
{
    size_t bytes = g->count * TS[g->t];
    *sp = g->S.base + GUARD;
    *rp = g->R.base + GUARD;
    if (!g->ip) return;
    switch (g->kind) {
    case GK_AR:
    case GK_BC: *rp = *sp; break;
    case GK_RS: *rp = *sp + (size_t)c->rank * bytes; break;
    case GK_AG: *sp = *rp + (size_t)c->rank * bytes; break;
    default: break;
    }
}

/* Fresh inputs from salt on the stream, outputs poisoned, the images expected after the call. */
static void gc_prepare(ctx_t *c, gcall_t *g, uint64_t salt, uint8_t *h, uint8_t *e)
{
    int n = c->nranks, me = c->rank, t = g->t, o = g->op;
    size_t es = TS[t], cnt = g->count, bytes = cnt * es;
    size_t ib = gc_in(g, n) * es, ob = gc_out(g, n) * es;
    reg_t *S = &g->S, *R = &g->R;
    reg_poison(c, S, ib + 2 * GUARD);
    reg_poison(c, R, ob + 2 * GUARD);
    int prev = (me + n - 1) % n;
    switch (g->kind) {
    case GK_AR:
        gen_fill(o, t, salt, me, n, 0, cnt, h);
        reg_put(c, S, GUARD, h, bytes);
        ref_fill(o, o, t, salt, n, 0, cnt, e);
        reg_expect(g->ip ? S : R, GUARD, e, bytes);
        break;
    case GK_RS:
        gen_fill(o, t, salt, me, n, 0, (size_t)n * cnt, h);
        reg_put(c, S, GUARD, h, (size_t)n * bytes);
        ref_fill(o, o, t, salt, n, (size_t)me * cnt, cnt, e);
        if (g->ip) { /* only this rank's slice is defined afterwards */
            reg_dontcare(c, S, GUARD, (size_t)n * bytes);
            memset(S->dc + GUARD + (size_t)me * bytes, 0, bytes);
            reg_expect(S, GUARD + (size_t)me * bytes, e, bytes);
        } else {
            reg_expect(R, GUARD, e, bytes);
        }
        break;
    case GK_AG:
        gen_fill(K_COPY, t, salt, me, n, 0, cnt, h);
        reg_put(c, g->ip ? R : S, GUARD + (g->ip ? (size_t)me * bytes : 0), h, bytes);
        for (int r = 0; r < n; r++)
            gen_fill(K_COPY, t, salt, r, n, 0, cnt, e + (size_t)r * bytes);
        reg_expect(R, GUARD, e, (size_t)n * bytes);
        break;
    case GK_BC:
        gen_fill(K_COPY, t, salt, me, n, 0, cnt, h);
        reg_put(c, S, GUARD, h, bytes);
        gen_fill(K_COPY, t, salt, g->root, n, 0, cnt, e);
        reg_expect(g->ip ? S : R, GUARD, e, bytes);
        break;
    case GK_RD:
        gen_fill(o, t, salt, me, n, 0, cnt, h);
        reg_put(c, S, GUARD, h, bytes);
        ref_fill(o, o, t, salt, n, 0, cnt, e);
        if (me == g->root)
            reg_expect(R, GUARD, e, bytes);
        else /* NCCL's contract: only the root's recvbuff is meant */
            reg_dontcare(c, R, GUARD, bytes);
        break;
    case GK_A2A:
        gen_fill(K_COPY, t, salt, me, n, 0, (size_t)n * cnt, h);
        reg_put(c, S, GUARD, h, (size_t)n * bytes);
        for (int r = 0; r < n; r++)
            gen_fill(K_COPY, t, salt, r, n, (size_t)me * cnt, cnt, e + (size_t)r * bytes);
        reg_expect(R, GUARD, e, (size_t)n * bytes);
        break;
    default: /* GK_SR: a ring, to the next rank, from the previous */
        gen_fill(K_COPY, t, salt, me, n, 0, cnt, h);
        reg_put(c, S, GUARD, h, bytes);
        gen_fill(K_COPY, t, salt, prev, n, 0, cnt, e);
        reg_expect(R, GUARD, e, bytes);
        break;
    }
}

static loomResult_t gc_issue(ctx_t *c, const gcall_t *g)
{
    int n = c->nranks, me = c->rank;
    CUdeviceptr sp, rp;
    gc_ptrs(c, g, &sp, &rp);
    loomDataType_t dt = (loomDataType_t)g->t;
    loomRedOp_t op = (loomRedOp_t)g->op;
    switch (g->kind) {
    case GK_AR: return loomAllReduce(P(sp), P(rp), g->count, dt, op, c->comm, c->s);
    case GK_RS: return loomReduceScatter(P(sp), P(rp), g->count, dt, op, c->comm, c->s);
    case GK_AG: return loomAllGather(P(sp), P(rp), g->count, dt, c->comm, c->s);
    case GK_BC: return loomBroadcast(P(sp), P(rp), g->count, dt, g->root, c->comm, c->s);
    case GK_RD: return loomReduce(P(sp), P(rp), g->count, dt, op, g->root, c->comm, c->s);
    case GK_A2A: return loomAlltoAll(P(sp), P(rp), g->count, dt, c->comm, c->s);
    default: {
        loomResult_t r = loomGroupStart();
        if (r == loomSuccess) r = loomSend(P(sp), g->count, dt, (me + 1) % n, c->comm, c->s);
        if (r == loomSuccess) r = loomRecv(P(rp), g->count, dt, (me + n - 1) % n, c->comm, c->s);
        loomResult_t e = loomGroupEnd();
        return r == loomSuccess ? e : r;
    }
    }
}

/* Both regions of the call against their images (the stream synchronised first). */
static void gc_check(ctx_t *c, gcall_t *g, int i)
{
    char what[96];
    snprintf(what, sizeof(what), "call %d (%s %s n=%zu, %s) sendbuff", i, GKN[g->kind], TN[g->t],
             g->count, g->path);
    size_t es = TS[g->t];
    reg_check(c, &g->S, GUARD, gc_in(g, c->nranks) * es, g->t, what);
    snprintf(what, sizeof(what), "call %d (%s %s n=%zu, %s) recvbuff", i, GKN[g->kind], TN[g->t],
             g->count, g->path);
    reg_check(c, &g->R, GUARD, gc_out(g, c->nranks) * es, g->t, what);
}

/* The first failure of a replay names the replay. */
static void name_replay(ctx_t *c, bool was, int rep)
{
    if (was || !c->failed) return;
    char first[232];
    memcpy(first, c->msg, sizeof(first));
    snprintf(c->msg, sizeof(c->msg), "replay %d: %.200s", rep, first);
}

static void grp_graphs(ctx_t *c)
{
    const cudrv_t *d = c->d;
    int n = c->nranks, me = c->rank;
    size_t hmax = 0;
    for (int i = 0; i < NGCALLS; i++) {
        size_t a = gc_in(&gcalls[i], n), b = gc_out(&gcalls[i], n);
        size_t m = (a > b ? a : b) * TS[gcalls[i].t];
        if (m > hmax) hmax = m;
    }
    uint8_t *h = halloc(c, hmax), *e = halloc(c, hmax);
    case_begin(c, n, "graphs: %d calls' buffers, windows registered (symmetric and not)", NGCALLS);
    for (int i = 0; i < NGCALLS; i++)
        gc_alloc(c, &gcalls[i]);
    if (!case_end(c)) fatal(c, "cannot go on without the buffers");

    /* one graph: every path, back to back (consecutive latency-path calls keep their
     * programmatic dependent launches as programmatic edges) */
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    case_begin(c, n, "graphs: capture (relaxed) %d calls of every same-node path; instantiate",
               NGCALLS);
    if (CU(d->cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_RELAXED))) {
        for (int i = 0; i < NGCALLS; i++) {
            char what[96];
            snprintf(what, sizeof(what), "call %d (%s n=%zu, %s), captured", i, GKN[gcalls[i].kind],
                     gcalls[i].count, gcalls[i].path);
            lok(c, gc_issue(c, &gcalls[i]), c->comm, what);
        }
        if (CU(d->cuStreamEndCapture(c->s, &g)) && g) CU(d->cuGraphInstantiate(&ge, g, 0));
    }
    bool have = case_end(c) && ge != NULL;

    /* replays with fresh inputs; between them an eager latency-path call (the lanes count their
     * own steps since the capture) and an eager direct one (the IPC cache serves it) */
    enum { REPS = 100 };
    reg_t EA, EB;
    const size_t ec = 1023;
    reg_alloc(c, &EA, ec * 4 + 2 * GUARD);
    reg_alloc(c, &EB, ec * 4 + 2 * GUARD);
    uint8_t *eh = halloc(c, ec * 4), *ee = halloc(c, ec * 4);
    case_begin(c, n,
               "graphs: %d replays, fresh inputs each, bit for bit; eager allreduces (latency "
               "path, direct) between replays",
               REPS);
    /* every rank goes through every replay, failed or not, so that none waits for a peer that
     * stopped */
    for (int rep = 0; have && rep < REPS; rep++) {
        bool was = c->failed;
        for (int i = 0; i < NGCALLS; i++)
            gc_prepare(c, &gcalls[i], mix(0x9a9ull + (uint64_t)rep * 131 + (uint64_t)i), h, e);
        CU(d->cuGraphLaunch(ge, c->s));
        sync_ok(c, c->s, c->comm);
        for (int i = 0; i < NGCALLS && !c->failed; i++)
            gc_check(c, &gcalls[i], i);
        name_replay(c, was, rep);
        /* eager */
        uint64_t salt = mix(0xea9ull + (uint64_t)rep);
        gen_fill(K_SUM, F32, salt, me, n, 0, ec, eh);
        ref_fill(K_SUM, K_SUM, F32, salt, n, 0, ec, ee);
        reg_poison(c, &EA, ec * 4 + 2 * GUARD);
        reg_put(c, &EA, GUARD, eh, ec * 4);
        reg_poison(c, &EB, ec * 4 + 2 * GUARD);
        reg_expect(&EB, GUARD, ee, ec * 4);
        was = c->failed;
        lok(c,
            loomAllReduce(P(EA.base + GUARD), P(EB.base + GUARD), ec, loomFloat32, loomSum, c->comm,
                          c->s),
            c->comm, "loomAllReduce (eager, between replays)");
        sync_ok(c, c->s, c->comm);
        reg_check(c, &EB, GUARD, ec * 4, F32, "eager allreduce recvbuff");
        name_replay(c, was, rep);
        /* an eager direct call on a graph's buffers: the mappings the graph holds serve it */
        was = c->failed;
        gc_prepare(c, &gcalls[5], mix(0xeadull + (uint64_t)rep), h, e);
        lok(c, gc_issue(c, &gcalls[5]), c->comm, "loomAllReduce (eager direct, between replays)");
        sync_ok(c, c->s, c->comm);
        gc_check(c, &gcalls[5], 5);
        name_replay(c, was, rep);
    }
    if (!have) case_fail(c, "no graph to replay");
    if (have && !c->failed) case_info(c, "%d replays of %d calls checked", REPS, NGCALLS);
    case_end(c);
    if (ge) d->cuGraphExecDestroy(ge);
    if (g) d->cuGraphDestroy(g);
    free(eh);
    free(ee);
    reg_free(c, &EA);
    reg_free(c, &EB);
    /* the strictest capture mode (PyTorch's default): any call of any thread that CUDA deems
     * unsafe would end the capture; a latency-path call, a direct one (IPC handles opened at
     * capture time), two on windows */
    static const int strict[] = {0, 5, 15, 19, 3};
    const int nstrict = (int)(sizeof(strict) / sizeof(strict[0]));
    case_begin(c, n,
               "graphs: capture in global mode (latency path, direct, windows two shots, direct "
               "on plain windows, latency reduce-scatter), 5 replays");
    g = NULL;
    ge = NULL;
    if (CU(d->cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_GLOBAL))) {
        for (int k = 0; k < nstrict; k++)
            lok(c, gc_issue(c, &gcalls[strict[k]]), c->comm, "captured in global mode");
        if (CU(d->cuStreamEndCapture(c->s, &g)) && g) CU(d->cuGraphInstantiate(&ge, g, 0));
    }
    for (int rep = 0; ge && rep < 5; rep++) {
        bool was = c->failed;
        for (int k = 0; k < nstrict; k++)
            gc_prepare(c, &gcalls[strict[k]], mix(0x610ull + (uint64_t)rep * 17 + (uint64_t)k), h,
                       e);
        CU(d->cuGraphLaunch(ge, c->s));
        sync_ok(c, c->s, c->comm);
        for (int k = 0; k < nstrict && !c->failed; k++)
            gc_check(c, &gcalls[strict[k]], strict[k]);
        name_replay(c, was, rep);
    }
    if (ge == NULL && !c->failed) case_fail(c, "no graph to replay");
    if (ge) d->cuGraphExecDestroy(ge);
    if (g) d->cuGraphDestroy(g);
    case_end(c);

    /* the graphs are gone: their windows may go */
    case_begin(c, n, "graphs: windows deregistered after the graph was destroyed");
    for (int i = 0; i < NGCALLS; i++)
        gc_free(c, &gcalls[i]);
    case_end(c);

    /* a graph holds the peers' mappings of its direct calls for its life only: 40 graphs on
     * fresh allocations (2 mapped per graph and peer, more than the 32 the cache keeps), each
     * destroyed after its replays, so later captures must find their mappings let go */
    enum { ROUNDS = 40 };
    case_begin(c, n,
               "graphs: %d graphs of a direct allreduce on fresh allocations, 2 replays each, "
               "then destroyed (the graph's mappings are let go)",
               ROUNDS);
    for (int k = 0; k < ROUNDS; k++) {
        gcall_t one = GC(GK_AR, F32, K_SUM, 1048579, 0, 0, 0, "direct");
        gc_alloc(c, &one);
        CUgraph g1 = NULL;
        CUgraphExec ge1 = NULL;
        if (CU(d->cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))) {
            lok(c, gc_issue(c, &one), c->comm, "loomAllReduce (captured, fresh buffers)");
            if (CU(d->cuStreamEndCapture(c->s, &g1)) && g1) CU(d->cuGraphInstantiate(&ge1, g1, 0));
        }
        if (g1) d->cuGraphDestroy(g1); /* the instance keeps what the graph held */
        for (int rep = 0; ge1 && rep < 2; rep++) {
            bool was = c->failed;
            gc_prepare(c, &one, mix(0x40ull + (uint64_t)k * 7 + (uint64_t)rep), h, e);
            CU(d->cuGraphLaunch(ge1, c->s));
            sync_ok(c, c->s, c->comm);
            gc_check(c, &one, k);
            name_replay(c, was, rep);
        }
        if (ge1 == NULL && !c->failed) case_fail(c, "round %d: no graph", k);
        if (ge1) d->cuGraphExecDestroy(ge1);
        gc_free(c, &one);
    }
    case_end(c);
    free(h);
    free(e);
}

/* ---- two ranks on one GPU --------------------------------------------------------------- */

static void grp_samegpu(ctx_t *c)
{
    const cudrv_t *d = c->d;
    const size_t cnt = 1024;
    CUdeviceptr buf = dalloc(c, cnt * 4);
    CU(d->cuMemsetD8Async(buf, 0, cnt * 4, c->s));
    CU(d->cuStreamSynchronize(c->s));
    for (int variant = 0; variant < 2; variant++) {
        case_begin(c, 2, "samegpu: 2 ranks on GPU 0 (%s) fail with loomInvalidUsage",
                   variant ? "config.cudaDev = 0, at init or first device call"
                           : "no config, at the first device allreduce");
        loomComm_t comm = NULL;
        loomConfig_t cfg = LOOM_CONFIG_INITIALIZER;
        cfg.cudaDev = 0;
        loomResult_t r = variant ? loomCommInitRankConfig(&comm, 2, c->ids[variant], c->rank, &cfg)
                                 : loomCommInitRank(&comm, 2, c->ids[variant], c->rank);
        const char *where = "init";
        char text[200] = "";
        if (r == loomSuccess) {
            where = "loomAllReduce";
            r = loomAllReduce(P(buf), P(buf), cnt, loomFloat32, loomSum, comm, c->s);
            if (r == loomSuccess) {
                where = "asynchronous error";
                d->cuStreamSynchronize(c->s);
                loomCommGetAsyncError(comm, &r);
            }
        }
        snprintf(text, sizeof(text), "%s", loomGetLastError(comm));
        if (r != loomInvalidUsage)
            case_fail(c, "%s: got %s, want loomInvalidUsage (%s)", where, loomGetErrorString(r),
                      text);
        else
            case_info(c, "%s: %s", where, text);
        if (comm) loomCommDestroy(comm);
        case_end(c);
    }
    d->cuMemFree(buf);
}

/* ---- a peer killed -------------------------------------------------------------------- */

static bool names_rank1(const char *s)
{
    for (const char *p = s; *p; p++)
        if (strncasecmp(p, "rank 1", 6) == 0 && !isdigit((unsigned char)p[6])) return true;
    return false;
}

/* Elements of the kill test's allreduces (--kill-count): the parent runs it at 4 MiB (the
 * direct path, reading the peer's buffers) and at 4 KiB (the latency path, waiting on
 * low-latency words), each in a fresh exec. */
static size_t kill_count = 1048576;
static bool kill_win; /* --kill-win: both buffers inside registered symmetric windows */

static void grp_kill(ctx_t *c)
{
    const cudrv_t *d = c->d;
    const size_t cnt = kill_count, bytes = cnt * 4;
    reg_t A, B;
    reg_alloc(c, &A, bytes + 2 * GUARD);
    reg_alloc(c, &B, bytes + 2 * GUARD);
    uint8_t *h = halloc(c, bytes), *e = halloc(c, bytes);
    loomWindow_t wa = NULL, wb = NULL;
    if (kill_win) { /* the peer dies with its windows mapped here (left registered: broken) */
        case_begin(c, 2, "kill: symmetric windows over both buffers (%zu bytes each)",
                   bytes + 2 * GUARD);
        win_reg(c, A.base, bytes + 2 * GUARD, LOOM_WIN_COLL_SYMMETRIC, &wa);
        win_reg(c, B.base, bytes + 2 * GUARD, LOOM_WIN_COLL_SYMMETRIC, &wb);
        case_end(c);
    }
    case_begin(c, 2, "kill: 5 allreduces (float sum n=%zu%s) before rank 1 is killed", cnt,
               kill_win ? ", in windows" : "");
    for (int k = 0; k < 5; k++) {
        uint64_t salt = mix(0x4b1ull + (uint64_t)k);
        gen_fill(K_SUM, F32, salt, c->rank, 2, 0, cnt, h);
        ref_fill(K_SUM, K_SUM, F32, salt, 2, 0, cnt, e);
        reg_poison(c, &A, bytes + 2 * GUARD);
        reg_put(c, &A, GUARD, h, bytes);
        reg_poison(c, &B, bytes + 2 * GUARD);
        reg_expect(&B, GUARD, e, bytes);
        lok(c,
            loomAllReduce(P(A.base + GUARD), P(B.base + GUARD), cnt, loomFloat32, loomSum, c->comm,
                          c->s),
            c->comm, "loomAllReduce");
        sync_ok(c, c->s, c->comm);
        reg_check(c, &B, GUARD, bytes, F32, "recvbuff");
    }
    case_end(c);
    if (c->rank == 1) {
        usleep(500000); /* let rank 0 finish reading the 5th result and start the 6th call */
        fflush(stderr);
        kill(getpid(), SIGKILL);
        _exit(3);
    }
    /* rank 0: keep calling (every 100 ms, 100 calls at most) and polling the asynchronous error
     * (every 20 ms) until something fails */
    double t0 = now(), seen = -1, last_call = 0;
    int calls = 0;
    loomResult_t err = loomSuccess;
    const char *how = "";
    while (now() - t0 < 60) {
        if (calls < 100 && now() - last_call >= 0.1) {
            last_call = now();
            loomResult_t r = loomAllReduce(P(A.base + GUARD), P(B.base + GUARD), cnt, loomFloat32,
                                           loomSum, c->comm, c->s);
            calls++;
            if (r != loomSuccess) {
                err = r;
                how = "a call";
                break;
            }
        }
        loomResult_t ae = loomSuccess;
        loomCommGetAsyncError(c->comm, &ae);
        if (ae != loomSuccess && ae != loomInProgress) {
            err = ae;
            how = "loomCommGetAsyncError";
            break;
        }
        usleep(20000);
    }
    seen = now() - t0;
    char text[200];
    snprintf(text, sizeof(text), "%s", loomGetLastError(c->comm));
    if (err == loomSuccess)
        case_fail(c, "no error after %.0f s and %d calls", seen, calls);
    else if (!names_rank1(text))
        case_fail(c, "%s after %.1f s: %s, but the text does not name rank 1: %s", how, seen,
                  loomGetErrorString(err), text);
    else
        case_info(c, "%s after %.1f s (%d calls): %s: %s", how, seen, calls,
                  loomGetErrorString(err), text);
    case_end(c);

    case_begin(c, 1, "kill: cuStreamSynchronize on rank 0's stream returns within 60 s");
    alarm(90);
    t0 = now();
    CUresult cr = d->cuStreamSynchronize(c->s);
    double s = now() - t0;
    if (s > 60)
        case_fail(c, "returned after %.1f s (%s)", s, cudrv_err(cr));
    else
        case_info(c, "returned %s after %.1f s",
                  cr == CUDA_SUCCESS ? "CUDA_SUCCESS" : cudrv_err(cr), s);
    case_end(c);

    case_begin(c, 1, "kill: loomCommAbort on rank 0 returns");
    alarm(60);
    loomResult_t r = loomCommAbort(c->comm);
    c->comm = NULL;
    if (r != loomSuccess) case_fail(c, "loomCommAbort returned %s", loomGetErrorString(r));
    case_end(c);
    free(h);
    free(e);
    /* the context may be unusable after a killed kernel: leave without freeing */
    fflush(stderr);
    _exit(0);
}

/* ---- ranks whose device collectives differ ------------------------------------------------ */

/* One mismatch on a fresh communicator: rank r calls `kind` (0 allreduce, 1 broadcast, 2 a
 * group of allreduces) with n[r] floats, op[r], root[r]; both ranks must get an error (from the
 * call or asynchronously) within 3 s whose text says the call differs and holds both wants.
 * With LOOM_NODE_ID naming two nodes (tests/gpu/mismatch.sh's second run) the calls cross
 * through pinned host memory and the host collectives' descriptors catch the difference: the
 * text is then the executor's "operation mismatch" holding both xwants. */
static void mm_case(ctx_t *c, int id, const char *label, int kind, const size_t n[2],
                    const loomRedOp_t op[2], const int root[2], const char *want0,
                    const char *want1, const char *xwant0, const char *xwant1)
{
    const char *nodes = getenv("LOOM_NODE_ID");
    bool across = nodes && strchr(nodes, ',');
    const char *kindtext = across ? "operation mismatch" : "differs between ranks";
    if (across) want0 = xwant0, want1 = xwant1;
    const cudrv_t *d = c->d;
    case_begin(c, 2, "mismatch: %s", label);
    loomComm_t comm = NULL;
    if (!lok(c, loomCommInitRank(&comm, 2, c->ids[id], c->rank), NULL, "loomCommInitRank")) {
        case_end(c);
        return;
    }
    size_t most = n[0] > n[1] ? n[0] : n[1];
    CUdeviceptr b = dalloc(c, 2 * most * 4 + 64);
    CU(d->cuMemsetD8(b, 0, 2 * most * 4 + 64));
    /* a first call that agrees: the device setup, and proof that agreeing calls pass */
    lok(c, loomAllReduce(P(b), P(b), 16, loomFloat32, loomSum, comm, c->s), comm, "loomAllReduce");
    sync_ok(c, c->s, comm);
    size_t cnt = n[c->rank];
    double t0 = now();
    loomResult_t r;
    if (kind == 1) {
        r = loomBroadcast(P(b), P(b), cnt, loomFloat32, root[c->rank], comm, c->s);
    } else if (kind == 2) {
        /* rank 0: two allreduces of n[0] in a group, rank 1: one of n[1] = 2 n[0] */
        loomGroupStart();
        r = loomAllReduce(P(b), P(b), cnt, loomFloat32, op[c->rank], comm, c->s);
        if (c->rank == 0 && r == loomSuccess)
            r = loomAllReduce(P(b + cnt * 4), P(b + cnt * 4), cnt, loomFloat32, op[0], comm, c->s);
        loomResult_t e = loomGroupEnd();
        if (r == loomSuccess) r = e;
    } else {
        r = loomAllReduce(P(b), P(b), cnt, loomFloat32, op[c->rank], comm, c->s);
    }
    loomResult_t err = r;
    const char *how = "the call";
    while (err == loomSuccess && now() - t0 < 10) {
        loomResult_t ae = loomSuccess;
        loomCommGetAsyncError(comm, &ae);
        if (ae != loomSuccess && ae != loomInProgress) err = ae, how = "loomCommGetAsyncError";
        usleep(10000);
    }
    double secs = now() - t0;
    char text[1200];
    snprintf(text, sizeof(text), "%s", loomGetLastError(comm));
    if (err == loomSuccess)
        case_fail(c, "no error within 10 s");
    else if (!strstr(text, kindtext) || !strstr(text, want0) || !strstr(text, want1))
        case_fail(c, "%s after %.2f s: %s, but the text lacks '%s' or '%s': %s", how, secs,
                  loomGetErrorString(err), want0, want1, text);
    else if (secs > 3)
        case_fail(c, "the error came after %.1f s", secs);
    else
        case_info(c, "%s after %.2f s: %s", how, secs, text);
    alarm(60);
    CU(d->cuStreamSynchronize(c->s)); /* a kernel waiting on the other rank gave up */
    loomCommAbort(comm);
    d->cuMemFree(b);
    case_end(c);
}

static void grp_mismatch(ctx_t *c)
{
    const loomRedOp_t sum2[2] = {loomSum, loomSum}, summax[2] = {loomSum, loomMax};
    const int root0[2] = {0, 0}, root01[2] = {0, 1};
    mm_case(c, 1, "allreduce of 1000 floats against 3000", 0, (const size_t[2]){1000, 3000}, sum2,
            root0, "allreduce of 1000 float32 sum", "allreduce of 3000 float32 sum",
            "(count 1000, float32, sum)", "(count 3000, float32, sum)");
    mm_case(c, 2, "allreduce sum against max, 4096 floats", 0, (const size_t[2]){4096, 4096},
            summax, root0, "float32 sum", "float32 max", "float32, sum)", "float32, max)");
    mm_case(c, 3, "broadcast from root 0 against root 1", 1, (const size_t[2]){2048, 2048}, sum2,
            root01, "root 0", "root 1", "root 0)", "root 1)");
    mm_case(c, 4, "a group of two allreduces of 512 against one of 1024", 2,
            (const size_t[2]){512, 1024}, sum2, root0, "of 512 float32", "of 1024 float32",
            "allreduce", "count 1024");
    if (c->comm) {
        loomCommDestroy(c->comm);
        c->comm = NULL;
    }
}

/* ---- the copy-engine path ---------------------------------------------------------------- */

/* Run with the path's threshold lowered (tests/gpu/copyengine.sh: LOOM_CUDA_CE=1M and a scratch
 * of 2 MiB, so that every segment is cut into pieces of 1 MiB and both halves of the scratch are
 * reused): allreduce of six types and three ops, reduce-scatter, allgather and broadcast (every
 * root) on plain buffers at views of several offsets, in and out of place, checked bit for bit
 * (the same reduction order as the SM paths). Sizes below the threshold run on the SM paths in
 * the same job, so both paths alternate on one communicator. */
static void grp_ce(ctx_t *c)
{
    int n = c->nranks, me = c->rank;
    static const size_t counts[] = {262147, 1048579, 4194307};
    static const int types[] = {F32, BF16, F16, I32, F8E4, F64};
    static const int ops[] = {K_SUM, K_MAX, K_AVG};
    const size_t ncounts = sizeof(counts) / sizeof(counts[0]);
    size_t cap = (size_t)n * counts[ncounts - 1] * 8 + 2 * GUARD + 8192;
    reg_t A, B;
    reg_alloc(c, &A, cap);
    reg_alloc(c, &B, cap);
    uint8_t *h1 = halloc(c, cap), *e1 = halloc(c, cap);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++)
        for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++)
            for (size_t ci = 0; ci < ncounts; ci++) {
                int t = types[ti], o = ops[oi];
                size_t count = counts[ci];
                uint64_t salt = mix(0xce00ull ^ ((uint64_t)t << 40) ^ ((uint64_t)o << 32) ^ count);
                gen_fill(o, t, salt, me, n, 0, count, h1);
                ref_fill(o, o, t, salt, n, 0, count, e1);
                for (int ip = 0; ip < 2; ip++)
                    ar_run(c, &A, &B, t, ON[o], (loomRedOp_t)o, count, ip, h1, e1,
                           " (copy engines from 1 MiB)");
            }
    static const int wtypes[2] = {F32, BF16};
    for (int kind = 1; kind < 4; kind++)
        for (int ti = 0; ti < 2; ti++)
            for (size_t ci = 0; ci < 2; ci++)
                for (int ip = 0; ip < 2; ip++)
                    for (int root = 0; root < (kind == 3 ? n : 1); root++) {
                        /* views at 16-byte and odd 4-byte offsets, different on each rank */
                        size_t soff = ip ? 0 : 16 * (size_t)me + 4 * ci,
                               roff = ip ? 0 : 32 + 4 * (size_t)(ti + me);
                        win_case(c, &A, &B, kind, wtypes[ti], counts[ci + 1], ip, root, soff, roff,
                                 "ce", h1, e1);
                    }
    /* an allreduce of the largest size right after a small one and before a broadcast: the
     * paths' counters stay in step */
    win_case(c, &A, &B, 0, F32, 7, false, 0, 0, 0, "ce then small", h1, e1);
    win_case(c, &A, &B, 0, F32, counts[ncounts - 1], true, 0, 0, 0, "ce after small", h1, e1);
    win_case(c, &A, &B, 3, I32, counts[1], false, n - 1, 0, 0, "ce after large", h1, e1);
    free(h1);
    free(e1);
    reg_free(c, &A);
    reg_free(c, &B);
}

/* ---- fusion contexts on device tensors ------------------------------------------------- */

typedef struct {
    int t, o;
    size_t count;
    reg_t r;      /* its own allocation (NULL base: a view of the flat buffer at off) */
    size_t off;   /* where its values start: in r, or in the flat buffer */
    uint8_t *exp; /* the exact result */
    bool second;  /* enqueued on the second stream */
    loomFusionHandle_t h;
} fz_t;

static uint64_t fz_rng(uint64_t *s)
{
    *s = mix(*s + 0x9e3779b97f4a7c15ull);
    return *s;
}

enum { FZ_FLAT = 1, FZ_MIXED = 2, FZ_STREAMS = 4, FZ_WAIT_EACH = 8 };

/* The context's bucket and segment sizes must be `bucket` and `seg`. */
static void fz_config_is(ctx_t *c, loomFusion_t f, unsigned long long bucket,
                         unsigned long long seg, const char *when)
{
    loomFusionConfig_t g = LOOM_FUSION_CONFIG_INITIALIZER;
    if (!lok(c, loomFusionGetConfig(f, &g), c->comm, "loomFusionGetConfig")) return;
    if (g.bucketBytes != bucket || g.segmentBytes != seg)
        case_fail(c, "%s: buckets %zu, segments %zu (want %llu, %llu from the tuning file)", when,
                  g.bucketBytes, g.segmentBytes, bucket, seg);
}

/* One step of n tensors through a context with buckets of `bucket` bytes and segments of
 * `seg` (the same list on every rank, from `seed`), each rank sleeping at random between its
 * enqueues; the results bit for bit after loomFusionWaitAll (checked on the first stream, which
 * the step's end orders after the buckets). FZ_FLAT: float tensors back to back in one
 * allocation (buckets reduced in place); FZ_MIXED: several types and ops (separate buckets);
 * FZ_STREAMS: every other tensor written and enqueued on a second stream; FZ_WAIT_EACH:
 * loomFusionWait on every tensor before the step's end. `steps` steps on one context. */
static void fz_case(ctx_t *c, const char *label, int n, uint64_t seed, int flags, size_t bucket,
                    size_t seg, int steps)
{
    static const size_t sizes[] = {1, 3, 255, 1000, 4097, 65537, 300001, 1048577};
    static const int mtypes[] = {F32, I32, BF16, F64, U8, I64};
    /* tests/gpu/fusion.sh's tuning-file run: GPU_COLL_FUSION_TUNED="HB HS DB DS", the file's
     * host and device sections' bucket and segment sizes; a context left to the tuning starts
     * with the host ones and takes the device ones at its first device tensor */
    unsigned long long tuned[4] = {0};
    const char *tv = getenv("GPU_COLL_FUSION_TUNED");
    bool check_tuned =
        bucket == 0 && tv &&
        sscanf(tv, "%llu %llu %llu %llu", &tuned[0], &tuned[1], &tuned[2], &tuned[3]) == 4;
    case_begin(c, c->nranks, "fusion %s%s: %d tensors, buckets %zu, segments %zu, %d step%s", label,
               check_tuned ? " (from the tuning file: host, then device section)" : "", n, bucket,
               seg, steps, steps > 1 ? "s" : "");
    loomFusionConfig_t cfg = LOOM_FUSION_CONFIG_INITIALIZER;
    cfg.bucketBytes = bucket;
    cfg.firstBucketBytes = bucket / 4;
    cfg.segmentBytes = seg;
    cfg.cycleUs = 500;
    loomFusion_t f = NULL;
    if (!lok(c, loomFusionCreate(&f, c->comm, &cfg), c->comm, "loomFusionCreate")) {
        case_end(c);
        return;
    }
    if (check_tuned) fz_config_is(c, f, tuned[0], tuned[1], "before the first tensor");
    CUstream s2 = NULL;
    if (flags & FZ_STREAMS) CU(c->d->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    fz_t *v = calloc((size_t)n, sizeof(*v));
    if (v == NULL) fatal(c, "out of host memory");
    uint64_t rs = seed, js = mix(seed ^ (uint64_t)(c->rank + 1) * 0x51ull);
    size_t flat_bytes = 0;
    for (int i = 0; i < n; i++) {
        fz_t *x = &v[i];
        x->t = F32;
        x->o = K_SUM;
        if (flags & FZ_MIXED) {
            x->t = mtypes[fz_rng(&rs) % 6];
            x->o = (int)(fz_rng(&rs) % 5);
            if (x->o == K_PROD && x->t == U8) x->o = K_MAX;
        }
        x->count = sizes[fz_rng(&rs) % 8];
        x->second = (flags & FZ_STREAMS) && (i & 1);
        x->off = flat_bytes;
        flat_bytes += x->count * TS[x->t];
    }
    reg_t flat = {0};
    if (flags & FZ_FLAT) reg_alloc(c, &flat, flat_bytes + 2 * GUARD);
    for (int i = 0; i < n; i++) {
        fz_t *x = &v[i];
        size_t b = x->count * TS[x->t];
        x->exp = halloc(c, b);
        if (!(flags & FZ_FLAT)) reg_alloc(c, &x->r, b + 2 * GUARD);
    }
    uint8_t *in = halloc(c, 1048577 * 8);
    for (int step = 0; step < steps && !c->failed; step++) {
        if (flags & FZ_FLAT) reg_poison(c, &flat, flat_bytes + 2 * GUARD);
        for (int i = 0; i < n; i++) {
            fz_t *x = &v[i];
            size_t b = x->count * TS[x->t];
            uint64_t salt = mix(seed ^ ((uint64_t)i << 20) ^ (uint64_t)step);
            gen_fill(x->o, x->t, salt, c->rank, c->nranks, 0, x->count, in);
            ref_fill(x->o, x->o, x->t, salt, c->nranks, 0, x->count, x->exp);
            reg_t *R = (flags & FZ_FLAT) ? &flat : &x->r;
            size_t at = (flags & FZ_FLAT) ? GUARD + x->off : GUARD;
            if (!(flags & FZ_FLAT)) reg_poison(c, R, b + 2 * GUARD);
            if (x->second) { /* written on the second stream, after the first's poison */
                CU(c->d->cuStreamSynchronize(c->s));
                CU(c->d->cuMemcpyHtoDAsync(R->base + at, in, b, s2));
                memcpy(R->img + at, in, b);
            } else {
                reg_put(c, R, at, in, b);
            }
            reg_expect(R, at, x->exp, b);
            /* the producer's kernels would run here: the ranks reach tensors at other times */
            if (fz_rng(&js) % 4 == 0) usleep((useconds_t)(fz_rng(&js) % 400));
            char what[64];
            snprintf(what, sizeof(what), "loomFusionEnqueue (tensor %d)", i);
            if (!lok(c,
                     loomFusionEnqueue(f, P(R->base + at), x->count, (loomDataType_t)x->t,
                                       (loomRedOp_t)x->o, (uint64_t)i,
                                       x->second ? (cudaStream_t)s2 : (cudaStream_t)c->s, NULL,
                                       NULL, &x->h),
                     c->comm, what))
                break;
        }
        if (check_tuned && step == 0)
            fz_config_is(c, f, tuned[2], tuned[3], "after the first (device) tensor");
        if (flags & FZ_WAIT_EACH)
            for (int i = 0; i < n && !c->failed; i++)
                lok(c, loomFusionWait(v[i].h), c->comm, "loomFusionWait");
        if (!c->failed) lok(c, loomFusionWaitAll(f), c->comm, "loomFusionWaitAll");
        if (c->failed) break;
        if (s2) CU(c->d->cuStreamSynchronize(s2));
        if (flags & FZ_FLAT) {
            reg_check(c, &flat, GUARD, flat_bytes, F32, "flat buffer");
        } else {
            for (int i = 0; i < n && !c->failed; i++) {
                char what[64];
                snprintf(what, sizeof(what), "tensor %d (%s %s, %zu)", i, TN[v[i].t], ON[v[i].o],
                         v[i].count);
                reg_check(c, &v[i].r, GUARD, v[i].count * TS[v[i].t], v[i].t, what);
            }
        }
    }
    loomFusionStats_t st;
    if (!c->failed && lok(c, loomFusionGetStats(f, &st), c->comm, "loomFusionGetStats")) {
        if (st.tensors != (uint64_t)n * (uint64_t)steps || st.buckets < 2)
            case_fail(c, "stats: %llu tensors (want %d), %llu buckets (want >= 2)",
                      (unsigned long long)st.tensors, n * steps, (unsigned long long)st.buckets);
        else
            case_info(c, "%llu buckets, %llu segments, cuts: %llu full %llu timer %llu flush",
                      (unsigned long long)st.buckets, (unsigned long long)st.segments,
                      (unsigned long long)st.fullCuts, (unsigned long long)st.timerCuts,
                      (unsigned long long)st.flushCuts);
    }
    lok(c, loomFusionDestroy(f), c->comm, "loomFusionDestroy");
    for (int i = 0; i < n; i++) {
        free(v[i].exp);
        if (!(flags & FZ_FLAT)) reg_free(c, &v[i].r);
    }
    if (flags & FZ_FLAT) reg_free(c, &flat);
    if (s2) c->d->cuStreamDestroy(s2);
    free(v);
    free(in);
    case_end(c);
}

/* An error that must be loomInvalidUsage with `want` in its text. */
static void fz_expect(ctx_t *c, loomResult_t r, const char *want, const char *what)
{
    const char *txt = loomGetLastError(c->comm);
    if (r != loomInvalidUsage)
        case_fail(c, "%s returned %s (want loomInvalidUsage): %s", what, loomGetErrorString(r),
                  txt);
    else if (strstr(txt, want) == NULL)
        case_fail(c, "%s: text \"%s\" lacks \"%s\"", what, txt, want);
}

static void grp_fusion(ctx_t *c)
{
    fz_case(c, "float sum, own allocations", 60, 0x66757331, 0, 1 << 20, 256 << 10, 2);
    fz_case(c, "mixed types and ops", 48, 0x66757332, FZ_MIXED, 1 << 20, 128 << 10, 1);
    fz_case(c, "flat buffer (in place)", 40, 0x66757333, FZ_FLAT, 2 << 20, 512 << 10, 2);
    fz_case(c, "two streams, loomFusionWait each", 30, 0x66757334, FZ_STREAMS | FZ_WAIT_EACH,
            1 << 20, 256 << 10, 2);
    fz_case(c, "default sizes", 24, 0x66757335, FZ_MIXED, 0, 0, 1);

    /* misuse: a host tensor after a device one; a 16-bit wire; a disagreement between ranks */
    reg_t R;
    reg_alloc(c, &R, 4096 * 4);
    loomFusion_t f = NULL;
    case_begin(c, c->nranks, "fusion: a host tensor in a context of device tensors is refused");
    if (lok(c, loomFusionCreate(&f, c->comm, NULL), c->comm, "loomFusionCreate")) {
        float host[16] = {0};
        lok(c,
            loomFusionEnqueue(f, P(R.base), 4096, loomFloat32, loomSum, 1, (cudaStream_t)c->s, NULL,
                              NULL, NULL),
            c->comm, "loomFusionEnqueue (device)");
        fz_expect(c,
                  loomFusionEnqueue(f, host, 16, loomFloat32, loomSum, 2, NULL, NULL, NULL, NULL),
                  "this context's tensors are CUDA device memory", "loomFusionEnqueue (host)");
        lok(c, loomFusionWaitAll(f), c->comm, "loomFusionWaitAll");
        sync_ok(c, c->s, c->comm);
        loomFusionDestroy(f);
    }
    case_end(c);
    case_begin(c, c->nranks, "fusion: device tensors on a bf16 wire are refused");
    loomFusionConfig_t cfg = LOOM_FUSION_CONFIG_INITIALIZER;
    cfg.wire = loomFusionWireBf16;
    if (lok(c, loomFusionCreate(&f, c->comm, &cfg), c->comm, "loomFusionCreate")) {
        fz_expect(c,
                  loomFusionEnqueue(f, P(R.base), 4096, loomFloat32, loomSum, 1, (cudaStream_t)c->s,
                                    NULL, NULL, NULL),
                  "device tensors travel exact", "loomFusionEnqueue");
        lok(c, loomFusionWaitAll(f), c->comm, "loomFusionWaitAll");
        loomFusionDestroy(f);
    }
    case_end(c);
    case_begin(c, c->nranks, "fusion: ranks that enqueue different counts are told which tensor");
    if (lok(c, loomFusionCreate(&f, c->comm, NULL), c->comm, "loomFusionCreate")) {
        for (int i = 0; i < 4; i++) {
            size_t cnt = i == 2 && c->rank == 1 ? 1000 : 1024;
            lok(c,
                loomFusionEnqueue(f, P(R.base + (size_t)i * 4096), cnt, loomFloat32, loomSum,
                                  (uint64_t)(100 + i), (cudaStream_t)c->s, NULL, NULL, NULL),
                c->comm, "loomFusionEnqueue");
        }
        fz_expect(c, loomFusionWaitAll(f), "ranks disagree at tensor position 2",
                  "loomFusionWaitAll");
        loomFusionDestroy(f);
    }
    case_end(c);
    reg_free(c, &R);
}

/* ---- a group's small device allreduces fused (src/cuda/dev_local.c, run_fused) ----------- */

typedef struct {
    int t, o;
    size_t count;
    bool inplace;
    int stream; /* 0: c->s, 1: the second stream */
    reg_t A, B;
    uint8_t *exp;
} gf_op_t;

/* One group of n allreduces (the same list on every rank, from seed), then, without a sync in
 * between, a second group of the same list on the other stream, whose fused run packs into the
 * buffer the first run may still read; both checked bit for bit. big: every 7th call above
 * LOOM_FUSION_GROUP (it breaks the run). */
static void gf_case(ctx_t *c, const char *label, int n, uint64_t seed, bool mixed, bool big,
                    CUstream s2)
{
    static const int mtypes[] = {F32, I32, BF16, F64, U8, I64};
    case_begin(c, c->nranks, "group fusion %s: 2 groups of %d allreduces on 2 streams", label, n);
    gf_op_t *v = calloc((size_t)(2 * n), sizeof(*v));
    if (v == NULL) fatal(c, "out of host memory");
    uint64_t rs = seed;
    uint8_t *in = halloc(c, 1 << 20);
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < n; i++) {
            gf_op_t *x = &v[g * n + i];
            if (g == 0) {
                x->t = mixed ? mtypes[fz_rng(&rs) % 6] : F32;
                x->o = mixed ? (int)(fz_rng(&rs) % 5) : K_SUM;
                x->count = 1 + fz_rng(&rs) % (big && i % 7 == 6 ? 120000 : 30000);
                if (big && i % 7 == 6) x->count += 70000;
                x->inplace = fz_rng(&rs) % 2;
            } else {
                *x = v[i];
            }
            x->stream = g;
            size_t b = x->count * TS[x->t];
            reg_alloc(c, &x->A, b + 2 * GUARD);
            if (!x->inplace) reg_alloc(c, &x->B, b + 2 * GUARD);
            x->exp = halloc(c, b);
            uint64_t salt = mix(seed ^ ((uint64_t)(g * n + i) << 16));
            gen_fill(x->o, x->t, salt, c->rank, c->nranks, 0, x->count, in);
            ref_fill(x->o, x->o, x->t, salt, c->nranks, 0, x->count, x->exp);
            reg_poison(c, &x->A, b + 2 * GUARD);
            reg_put(c, &x->A, GUARD, in, b);
            if (!x->inplace) reg_poison(c, &x->B, b + 2 * GUARD);
        }
    CU(c->d->cuStreamSynchronize(c->s)); /* the inputs are in place before either stream runs */
    for (int g = 0; g < 2 && !c->failed; g++) {
        lok(c, loomGroupStart(), c->comm, "loomGroupStart");
        for (int i = 0; i < n; i++) {
            gf_op_t *x = &v[g * n + i];
            CUdeviceptr sp = x->A.base + GUARD, rp = x->inplace ? sp : x->B.base + GUARD;
            if (!lok(c,
                     loomAllReduce(P(sp), P(rp), x->count, (loomDataType_t)x->t, (loomRedOp_t)x->o,
                                   c->comm, g ? (cudaStream_t)s2 : (cudaStream_t)c->s),
                     c->comm, "loomAllReduce"))
                break;
        }
        lok(c, loomGroupEnd(), c->comm, "loomGroupEnd");
    }
    CU(c->d->cuStreamSynchronize(s2));
    sync_ok(c, c->s, c->comm);
    for (int i = 0; i < 2 * n && !c->failed; i++) {
        gf_op_t *x = &v[i];
        size_t b = x->count * TS[x->t];
        char what[96];
        snprintf(what, sizeof(what), "group %d call %d (%s %s, %zu, %s)", i / n, i % n, TN[x->t],
                 ON[x->o], x->count, x->inplace ? "in place" : "out of place");
        if (x->inplace) {
            reg_expect(&x->A, GUARD, x->exp, b);
            reg_check(c, &x->A, GUARD, b, x->t, what);
        } else {
            reg_check(c, &x->A, GUARD, b, x->t, "sendbuff (must stay unchanged)");
            reg_expect(&x->B, GUARD, x->exp, b);
            reg_check(c, &x->B, GUARD, b, x->t, what);
        }
    }
    for (int i = 0; i < 2 * n; i++) {
        reg_free(c, &v[i].A);
        if (!v[i].inplace) reg_free(c, &v[i].B);
        free(v[i].exp);
    }
    free(v);
    free(in);
    case_end(c);
}

static void grp_groupfuse(ctx_t *c)
{
    CUstream s2 = NULL;
    if (!CU(c->d->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING))) return;
    gf_case(c, "float sum", 40, 0x67663031, false, false, s2);
    gf_case(c, "mixed types and ops", 60, 0x67663032, true, false, s2);
    gf_case(c, "a large call every 7th", 35, 0x67663033, false, true, s2);
    gf_case(c, "150 calls (the buffer grows)", 150, 0x67663034, false, false, s2);
    c->d->cuStreamDestroy(s2);
}

/* ---- groups and the parent ------------------------------------------------------------ */

enum { M_ALL, M_SINGLE, M_SAMEGPU, M_TWO, M_WIN };

typedef struct {
    const char *name;
    void (*fn)(ctx_t *);
    int mode, min_gpu, watchdog, nids;
    const char *help;
} group_t;

static const group_t groups[] = {
    {"allreduce", grp_allreduce, M_ALL, 1, 300, 1,
     "10 types x 5 ops (+premulsum), counts 0..4194307, in/out of place"},
    {"offset", grp_offset, M_ALL, 1, 120, 1, "views at byte offsets 0..15 of a larger allocation"},
    {"coll", grp_coll, M_ALL, 1, 240, 1,
     "broadcast, reduce (every root), allgather, reducescatter, alltoall, send/recv"},
    {"streams", grp_streams, M_ALL, 1, 150, 1, "3 comms on 3 streams; one comm on 2 streams"},
    {"graph", grp_graph, M_ALL, 1, 150, 1, "CUDA graph capture, 100 replays"},
    {"burst", grp_burst, M_ALL, 1, 120, 1, "270 allreduces of 9 sizes back to back, one sync"},
    {"big", grp_big, M_ALL, 1, 240, 1, "allreduce of 2^31+4099 uint8"},
    {"initall", grp_initall, M_SINGLE, 1, 150, 0, "one process, every GPU (loomCommInitAll)"},
    {"samegpu", grp_samegpu, M_SAMEGPU, 1, 90, 2, "2 ranks on GPU 0 -> loomInvalidUsage"},
    {"kill", grp_kill, M_TWO, 2, 150, 1, "rank 1 SIGKILLed; rank 0 gets an error, no hang"},
    {"win", grp_win, M_WIN, 1, 420, 1,
     "registered windows: 4 collectives on them, misuse, deregistration order (2 ranks; on one "
     "GPU with LOOM_CUDA_SHARE_GPU=1)"},
    {"ce", grp_ce, M_WIN, 1, 420, 1,
     "the copy-engine path: allreduce (6 types, 3 ops), reduce-scatter, allgather, broadcast on "
     "plain buffers (2 ranks; run with LOOM_CUDA_CE=1M as tests/gpu/copyengine.sh does)"},
    {"fusion", grp_fusion, M_WIN, 1, 300, 1,
     "fusion contexts on device tensors: buckets, segments, types, streams, misuse (2 ranks; "
     "on one GPU with LOOM_CUDA_SHARE_GPU=1)"},
    {"groupfuse", grp_groupfuse, M_WIN, 1, 240, 1,
     "a group's small device allreduces fused: types, ops, in and out of place, a large call "
     "between, two streams sharing the buffer (2 ranks; on one GPU with LOOM_CUDA_SHARE_GPU=1)"},
    {"mismatch", grp_mismatch, M_WIN, 1, 120, 5,
     "ranks whose device collectives differ: count, op, root, a group fused differently; an "
     "error naming both sides on both ranks within 3 s (2 ranks; on one GPU with "
     "LOOM_CUDA_SHARE_GPU=1)"},
    {"graphs", grp_graphs, M_WIN, 1, 420, 1,
     "every same-node path captured in one CUDA graph, 100 replays; graphs' mappings let go (2 "
     "ranks; on one GPU with LOOM_CUDA_SHARE_GPU=1)"},
};
#define NGROUPS ((int)(sizeof(groups) / sizeof(groups[0])))

static void child_main(const group_t *g, ctx_t *c)
{
    const char *why = "?";
    c->d = cudrv_get(&why);
    c->cur = -1;
    if (c->d == NULL) fatal(c, "no CUDA driver in the child: %s", why);
    bool comm_first = g->mode == M_TWO; /* kill: join the 5 s rendezvous before CUDA start-up */
    if (g->mode != M_SINGLE) {
        case_begin(c, c->nranks, "%s: setup (%d ranks, rank r on GPU %s)", g->name, c->nranks,
                   g->mode == M_SAMEGPU ? "0" : "r");
        if (comm_first)
            lok(c, loomCommInitRank(&c->comm, c->nranks, c->ids[0], c->rank), NULL,
                "loomCommInitRank");
        if (CU(c->d->cuDeviceGet(&c->cudev, c->dev)) &&
            CU(c->d->cuDevicePrimaryCtxRetain(&c->ctx, c->cudev)) &&
            CU(c->d->cuCtxSetCurrent(c->ctx)))
            CU(c->d->cuStreamCreate(&c->s, CU_STREAM_NON_BLOCKING));
        if (!comm_first && g->mode != M_SAMEGPU && !c->failed)
            lok(c, loomCommInitRank(&c->comm, c->nranks, c->ids[0], c->rank), NULL,
                "loomCommInitRank");
        if (!case_end(c)) {
            fflush(stderr);
            _exit(2);
        }
    }
    g->fn(c);
    if (c->comm) loomCommDestroy(c->comm);
    if (c->s) c->d->cuStreamDestroy(c->s);
    if (c->ctx) c->d->cuDevicePrimaryCtxRelease(c->cudev);
    fflush(stderr);
    _exit(0);
}

static int npass, nfail, next_print;

static void print_case(int idx)
{
    case_t *k = &tab->c[idx];
    int first = -1, nf = 0, info = -1;
    for (int r = 0; r < MAXR; r++) {
        unsigned char st = __atomic_load_n(&k->st[r], __ATOMIC_ACQUIRE);
        if (st == 2 && nf++ == 0) first = r;
        if (st == 1 && info < 0 && k->msg[r][0]) info = r;
    }
    if (first >= 0) {
        printf("FAIL %s: rank %d: %s", k->name, first, k->msg[first]);
        if (nf > 1) printf(" (%d ranks failed)", nf);
        printf("\n");
        nfail++;
    } else if (__atomic_load_n(&k->done, __ATOMIC_ACQUIRE) < k->expect) {
        printf("FAIL %s: only %d of %d ranks finished it (see above which died)\n", k->name,
               k->done, k->expect);
        nfail++;
    } else {
        printf("ok  %s%s%s\n", k->name, info >= 0 ? ": " : "", info >= 0 ? k->msg[info] : "");
        npass++;
    }
}

/* Prints the cases every rank has reported, in order; with final, all that were begun. */
static void flush_cases(bool final)
{
    int total = __atomic_load_n(&tab->ncases, __ATOMIC_ACQUIRE);
    while (next_print < total && next_print < MAXCASES) {
        case_t *k = &tab->c[next_print];
        if (__atomic_load_n(&k->named, __ATOMIC_ACQUIRE) != 2) {
            if (!final) break;
            next_print++;
            continue;
        }
        if (!final && __atomic_load_n(&k->done, __ATOMIC_ACQUIRE) < k->expect) break;
        print_case(next_print++);
    }
    fflush(stdout);
}

static void describe(int st, int watchdog, char *buf, size_t len)
{
    if (WIFEXITED(st)) {
        if (WEXITSTATUS(st) == 2)
            snprintf(buf, len, "gave up after a failure it reported (exit 2)");
        else
            snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        if (sig == SIGALRM)
            snprintf(buf, len, "killed by its watchdog (SIGALRM after %d s: hung)", watchdog);
        else
            snprintf(buf, len, "killed by signal %d (%s)", sig, strsignal(sig));
    } else {
        snprintf(buf, len, "ended with wait status 0x%x", st);
    }
}

static void run_group(const group_t *g, int ngpu)
{
    int np = g->mode == M_ALL ? ngpu : g->mode == M_SINGLE ? 1 : 2;
    /* windows and the kill test: two ranks, on two GPUs or sharing the one
     * (LOOM_CUDA_SHARE_GPU=1; main skips these groups on one GPU without it) */
    const bool win_shared = (g->mode == M_WIN || g->mode == M_TWO) && ngpu < 2;
    memset(tab, 0, sizeof(*tab));
    for (int r = 0; r < MAXR; r++)
        tab->cur[r] = -1;
    next_print = 0;
    ctx_t base;
    memset(&base, 0, sizeof(base));
    base.nranks = np;
    base.ngpu = ngpu;
    base.group = g->name;
    for (int k = 0; k < g->nids; k++)
        if (loomGetUniqueId(&base.ids[k]) != loomSuccess) {
            printf("FAIL %s: loomGetUniqueId: %s\n", g->name, loomGetLastError(NULL));
            nfail++;
            return;
        }
    printf("== %s: %s (%d process%s)\n", g->name, g->help, np, np > 1 ? "es" : "");
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid(), pids[MAXR];
    bool alive[MAXR] = {false}, stopped[MAXR] = {false};
    int started = 0;
    for (; started < np; started++) {
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(2);
            alarm((unsigned)g->watchdog);
            ctx_t c = base;
            c.rank = started;
            c.dev = g->mode == M_SAMEGPU || win_shared ? 0 : started;
            c.cur = -1;
            child_main(g, &c);
        }
        if (pid < 0) {
            printf("FAIL %s: fork: %s\n", g->name, strerror(errno));
            nfail++;
            break;
        }
        pids[started] = pid;
        alive[started] = true;
    }
    int nalive = started;
    double deadline = now() + g->watchdog + 20, grace = 0;
    if (started < np) grace = now();
    while (nalive > 0) {
        for (int r = 0; r < started; r++) {
            int st;
            if (!alive[r] || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
            alive[r] = false;
            nalive--;
            bool expected = g->mode == M_TWO && r == 1 && WIFSIGNALED(st) &&
                            WTERMSIG(st) == SIGKILL && !stopped[r];
            if (expected) continue;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                if (grace == 0) grace = now(); /* its peers should finish about as soon */
                continue;
            }
            char why[160];
            describe(st, g->watchdog, why, sizeof(why));
            int cur = tab->cur[r];
            flush_cases(false);
            printf("FAIL %s: rank %d (pid %d, GPU %d) %s%s%s%s%s\n", g->name, r, (int)pids[r],
                   g->mode == M_SAMEGPU  ? 0
                   : g->mode == M_SINGLE ? -1
                                         : r,
                   stopped[r] ? "was stopped by the test (still running 45 s after a peer ended, "
                                "or past the group's deadline): "
                              : "",
                   why, cur >= 0 ? " during '" : "", cur >= 0 ? tab->c[cur].name : "",
                   cur >= 0 ? "'" : "");
            nfail++;
            if (grace == 0) grace = now();
        }
        flush_cases(false);
        if (nalive == 0) break;
        double t = now();
        if ((grace > 0 && t - grace > 45) || t > deadline) {
            for (int r = 0; r < started; r++)
                if (alive[r] && !stopped[r]) {
                    stopped[r] = true;
                    kill(pids[r], SIGKILL);
                }
        }
        usleep(20000);
    }
    flush_cases(true);
}

/* The kill group runs in a fresh exec of this program, with LOOM_TIMEOUT=5 in its environment:
 * loom reads its parameters once per process, and this one has read them already. */
static void run_kill_reexec(int ngpu, size_t count, bool win)
{
    int fd[2];
    if (pipe(fd) != 0) {
        printf("FAIL kill: pipe: %s\n", strerror(errno));
        nfail++;
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        setenv("LOOM_TIMEOUT", "5", 1);
        char fdarg[16], ng[16], kc[32];
        snprintf(fdarg, sizeof(fdarg), "%d", fd[1]);
        snprintf(ng, sizeof(ng), "%d", ngpu);
        snprintf(kc, sizeof(kc), "%zu", count);
        char *args[] = {"gpu_coll",
                        "--only",
                        "kill",
                        "--report-fd",
                        fdarg,
                        "--ngpus",
                        ng,
                        "--kill-count",
                        kc,
                        win ? "--kill-win" : "-q",
                        verbose ? "-v" : NULL,
                        NULL};
        execv("/proc/self/exe", args);
        printf("FAIL kill: exec /proc/self/exe: %s\n", strerror(errno));
        fflush(stdout);
        _exit(127);
    }
    close(fd[1]);
    if (pid < 0) {
        printf("FAIL kill: fork: %s\n", strerror(errno));
        nfail++;
        close(fd[0]);
        return;
    }
    int st = 0;
    double deadline = now() + 400;
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(50000);
    }
    char buf[64] = "";
    fcntl(fd[0], F_SETFL, O_NONBLOCK);
    ssize_t got = read(fd[0], buf, sizeof(buf) - 1);
    close(fd[0]);
    int p = 0, f = 0;
    if (got > 0 && (buf[got] = '\0', sscanf(buf, "%d %d", &p, &f) == 2)) {
        npass += p;
        nfail += f;
    } else {
        char why[160];
        describe(st, 400, why, sizeof(why));
        printf("FAIL kill: the run with LOOM_TIMEOUT=5 %s without reporting\n", why);
        nfail++;
    }
}

/* Learns the GPUs in a child, so that this process makes no CUDA call before it forks.
 * Returns their number, 0 with *info saying why there are none, -1 if the probe died. */
static int probe(char *info, size_t len)
{
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(info, len, "pipe: %s", strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(120);
        const char *why = "?";
        const cudrv_t *d = cudrv_get(&why);
        char buf[4096];
        int off;
        if (d == NULL) {
            off = snprintf(buf, sizeof(buf), "0 %s", why);
        } else {
            off = snprintf(buf, sizeof(buf), "%d CUDA driver %d.%d;", d->ndev,
                           d->driver_version / 1000, d->driver_version % 1000 / 10);
            for (int i = 0; i < d->ndev && off < (int)sizeof(buf) - 160; i++) {
                CUdevice dev;
                char name[128] = "?";
                if (d->cuDeviceGet(&dev, i) == CUDA_SUCCESS)
                    d->cuDeviceGetName(name, sizeof(name), dev);
                off += snprintf(buf + off, sizeof(buf) - (size_t)off, " %d: %s;", i, name);
            }
        }
        if (write(fd[1], buf, (size_t)off) < 0) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    if (pid < 0) {
        close(fd[0]);
        snprintf(info, len, "fork: %s", strerror(errno));
        return -1;
    }
    char buf[4096];
    size_t have = 0;
    ssize_t k;
    while (have < sizeof(buf) - 1 && (k = read(fd[0], buf + have, sizeof(buf) - 1 - have)) > 0)
        have += (size_t)k;
    buf[have] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    int n = -1, used = 0;
    if (have == 0 || sscanf(buf, "%d %n", &n, &used) < 1) {
        char why[160];
        describe(st, 120, why, sizeof(why));
        snprintf(info, len, "the GPU probe %s", why);
        return -1;
    }
    snprintf(info, len, "%s", buf + used);
    return n;
}

static bool listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && strncmp(p, name, n) == 0) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: gpu_coll [--only G[,G...]] [--skip G[,G...]] [--ngpus N] [-v] [--list]\n"
               "  --only   run only these groups      --skip  run all but these groups\n"
               "  --ngpus  use at most N GPUs          -v      each rank logs its cases to stderr\n"
               "groups:\n");
    for (int i = 0; i < NGROUPS; i++)
        fprintf(f, "  %-10s %s%s\n", groups[i].name, groups[i].help,
                groups[i].min_gpu > 1 ? " (needs 2 GPUs)" : "");
    fprintf(f, "exit: 0 all passed, 1 a failure, 77 skipped (no GPU)\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *only = NULL, *skip = NULL;
    int maxgpu = MAXR, report_fd = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = 1;
        } else if (!strcmp(a, "--list") || !strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strncmp(a, "--only=", 7)) {
            only = a + 7;
        } else if (!strncmp(a, "--skip=", 7)) {
            skip = a + 7;
        } else if (v && !strcmp(a, "--only")) {
            only = argv[++i];
        } else if (v && !strcmp(a, "--skip")) {
            skip = argv[++i];
        } else if (v && !strcmp(a, "--ngpus")) {
            maxgpu = atoi(argv[++i]);
        } else if (v && !strcmp(a, "--report-fd")) {
            report_fd = atoi(argv[++i]);
        } else if (!strcmp(a, "--kill-win")) {
            kill_win = true;
        } else if (!strcmp(a, "-q")) {
            /* (a placeholder argument of the kill group's re-exec) */
        } else if (v && !strcmp(a, "--kill-count")) {
            kill_count = (size_t)strtoull(argv[++i], NULL, 10);
            if (kill_count == 0) kill_count = 1;
        } else {
            fprintf(stderr, "gpu_coll: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    for (const char *l = only; l; l = l == only ? skip : NULL) {
        for (const char *p = l; *p;) {
            const char *e = strchr(p, ',');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            bool known = false;
            for (int g = 0; g < NGROUPS; g++)
                known |= strlen(groups[g].name) == n && !strncmp(groups[g].name, p, n);
            if (!known) {
                fprintf(stderr, "gpu_coll: no group '%.*s'\n", (int)n, p);
                usage(stderr);
                return 2;
            }
            p = e ? e + 1 : p + n;
        }
        if (l == skip) break;
    }
    setenv("LOOM_SOCKET_IFNAME", "lo", 0); /* every rank is on this machine */

    char info[4096];
    int ngpu = probe(info, sizeof(info));
    if (ngpu < 0) {
        printf("FAIL %s\n0 passed, 1 failed\n", info);
        return 1;
    }
    if (ngpu == 0) {
        printf("gpu_coll: skipped: %s\n", info);
        return 77;
    }
    if (report_fd < 0) printf("gpu_coll: %d GPU%s: %s\n", ngpu, ngpu > 1 ? "s" : "", info);
    if (ngpu > maxgpu && maxgpu > 0) ngpu = maxgpu;
    if (ngpu > MAXR) ngpu = MAXR;
    tab = mmap(NULL, sizeof(table_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (tab == MAP_FAILED) {
        printf("FAIL mmap: %s\n", strerror(errno));
        return 1;
    }
    int skipped = 0;
    for (int i = 0; i < NGROUPS; i++) {
        const group_t *g = &groups[i];
        if ((only && !listed(only, g->name)) || listed(skip, g->name)) continue;
        const char *sh = getenv("LOOM_CUDA_SHARE_GPU");
        bool share = sh && strcmp(sh, "1") == 0;
        if (g->mode == M_WIN && ngpu < 2) {
            if (!share) {
                printf("skip %s: one GPU: run with LOOM_CUDA_SHARE_GPU=1 (tests/gpu/%s.sh)\n",
                       g->name, strcmp(g->name, "win") ? g->name : "windows");
                skipped++;
                continue;
            }
        }
        /* the kill test's two ranks may share one GPU (LOOM_CUDA_SHARE_GPU=1, as
         * tests/gpu/windows.sh runs it): the peer then dies with its windows mapped there */
        if (g->min_gpu > ngpu && !(g->mode == M_TWO && share)) {
            printf("skip %s: needs %d GPUs, using %d\n", g->name, g->min_gpu, ngpu);
            skipped++;
            continue;
        }
        if (!strcmp(g->name, "kill") && report_fd < 0) {
            run_kill_reexec(ngpu, 1048576, false); /* 4 MiB: the direct path */
            run_kill_reexec(ngpu, 1024, false);    /* 4 KiB: the latency path */
            run_kill_reexec(ngpu, 1048576, true);  /* 4 MiB in windows mapped by the peer */
        } else
            run_group(g, ngpu);
    }
    if (report_fd >= 0) {
        dprintf(report_fd, "%d %d\n", npass, nfail);
        return nfail ? 1 : 0;
    }
    if (skipped) printf("(%d group%s skipped)\n", skipped, skipped > 1 ? "s" : "");
    printf("%d passed, %d failed\n", npass, nfail);
    if (npass + nfail == 0) return 77;
    return nfail ? 1 : 0;
}
