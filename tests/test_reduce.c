/*
 * Unit tests of the host reductions (src/base/reduce.c) against plain scalar references written
 * here: element by element, no vector tricks, half/bfloat16 decoded with ldexp and rounded by a
 * nearest-value search. Results are compared bit for bit.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "reduce.h"

#define BIG_N 1000003
#define HALF_INF 0x7c00u
#define BF16_INF 0x7f80u

/* For checks inside loops over millions of values: a passing ck_assert records its location
 * (a write to Check's message file), which would dominate the run time. */
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

/* ---- Random numbers (fixed seed: failures must reproduce) ------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- Reference half / bfloat16 ----------------------------------------------------------- */

typedef struct {
    int mbits; /* stored mantissa bits */
    int bias;
    uint16_t inf;       /* bit pattern of +infinity */
    double mag[0x8000]; /* |value| of patterns 0..inf, inf decoded as if it were finite */
    float val[0x10000]; /* value of every pattern, NaN as NAN */
} fmt16_t;

static fmt16_t half_fmt = {.mbits = 10, .bias = 15, .inf = HALF_INF};
static fmt16_t bf16_fmt = {.mbits = 7, .bias = 127, .inf = BF16_INF};

static void fmt16_init(fmt16_t *f)
{
    for (unsigned b = 0; b <= f->inf; b++) {
        unsigned e = b >> f->mbits, m = b & ((1u << f->mbits) - 1);
        f->mag[b] = e == 0 ? ldexp(m, 1 - f->bias - f->mbits)
                           : ldexp(m + (1u << f->mbits), (int)e - f->bias - f->mbits);
    }
    for (unsigned b = 0; b < 0x10000; b++) {
        unsigned a = b & 0x7fffu;
        float v = a < f->inf ? (float)f->mag[a] : a == f->inf ? INFINITY : NAN;
        f->val[b] = (b & 0x8000u) ? -v : v;
    }
}

static int is_nan16(const fmt16_t *f, uint16_t b)
{
    return (b & 0x7fffu) > f->inf;
}

/* Nearest representable value, ties to the even pattern; past the largest finite value the
 * next step is infinity (so the overflow threshold is the midpoint to 2^(emax+1)). */
static uint16_t ref_round(const fmt16_t *f, float x)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    double a = fabs((double)x);
    if (a >= f->mag[f->inf]) return sign | f->inf;
    unsigned lo = 0, hi = f->inf; /* mag[lo] <= a < mag[hi] */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (f->mag[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double dlo = a - f->mag[lo], dhi = f->mag[hi] - a;
    unsigned r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
    return (uint16_t)(sign | r);
}

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint16_t to16(const fmt16_t *f, float x)
{
    return f == &half_fmt ? red_float_to_half(x) : red_float_to_bf16(x);
}

static float from16(const fmt16_t *f, uint16_t b)
{
    return f == &half_fmt ? red_half_to_float(b) : red_bf16_to_float(b);
}

static void setup(void)
{
    fmt16_init(&half_fmt);
    fmt16_init(&bf16_fmt);
}

/* Every pattern: decoding matches ldexp, and encoding the decoded value gives the pattern back
 * (NaN: stays NaN with its sign and payload, and comes back quieted). */
static void exhaustive(const fmt16_t *f)
{
    uint32_t quiet = 1u << (f->mbits - 1);
    int shift = 23 - f->mbits;
    for (uint32_t b = 0; b < 0x10000; b++) {
        float x = from16(f, (uint16_t)b);
        if (is_nan16(f, (uint16_t)b)) {
            EXPECT(isnan(x), "pattern 0x%04x: not NaN", b);
            EXPECT((fbits(x) >> 31) == (b >> 15), "pattern 0x%04x: NaN sign", b);
            EXPECT(((fbits(x) >> shift) & ((1u << f->mbits) - 1)) == (b & ((1u << f->mbits) - 1)),
                   "pattern 0x%04x: NaN payload", b);
            EXPECT(to16(f, x) == (b | quiet), "pattern 0x%04x: NaN comes back as 0x%04x", b,
                   to16(f, x));
            continue;
        }
        EXPECT(fbits(x) == fbits(f->val[b]), "pattern 0x%04x decodes to %a, want %a", b, (double)x,
               (double)f->val[b]);
        EXPECT(to16(f, x) == b, "pattern 0x%04x round-trips to 0x%04x", b, to16(f, x));
    }
}

START_TEST(test_half_exhaustive)
{
    exhaustive(&half_fmt);
}
END_TEST

START_TEST(test_bf16_exhaustive)
{
    exhaustive(&bf16_fmt);
}
END_TEST

static void check_round(const fmt16_t *f, float x)
{
    uint16_t got = to16(f, x), want = ref_round(f, x);
    EXPECT(got == want, "%s(%a) = 0x%04x, want 0x%04x", f == &half_fmt ? "half" : "bf16", (double)x,
           got, want);
}

/* Every midpoint between neighbours (ties go to even), the floats just either side of it, and
 * random float bit patterns over the whole range (subnormal, overflowing, tiny). */
static void rounding(const fmt16_t *f)
{
    for (unsigned b = 0; b < f->inf; b++) {
        float mid = (float)((f->mag[b] + f->mag[b + 1]) / 2);
        EXPECT((double)mid == (f->mag[b] + f->mag[b + 1]) / 2, "midpoint %a inexact", (double)mid);
        for (int s = 0; s < 2; s++) {
            float m = s ? -mid : mid;
            check_round(f, m);
            EXPECT((to16(f, m) & 1) == 0, "tie at %a not to even", (double)m);
            check_round(f, nextafterf(m, INFINITY));
            check_round(f, nextafterf(m, -INFINITY));
        }
    }
    for (int i = 0; i < 200000; i++) {
        float x = bitsf((uint32_t)rng());
        if (!isnan(x)) check_round(f, x);
    }
}

START_TEST(test_half_rounding)
{
    rounding(&half_fmt);
}
END_TEST

START_TEST(test_bf16_rounding)
{
    rounding(&bf16_fmt);
}
END_TEST

/* The vector conversion loops (F16C or bit tricks, whichever this machine runs) on every pattern:
 * max(-inf, p) is p, so the result must be exactly what the scalar conversions give. Runs both
 * through the two-input loop and through the k-input block path. */
START_TEST(test_vector_conversions)
{
    loomDataType_t t = _i ? loomBfloat16 : loomFloat16;
    const fmt16_t *f = _i ? &bf16_fmt : &half_fmt;
    static uint16_t pat[0x10000], ninf[0x10000], out[0x10000];
    for (uint32_t b = 0; b < 0x10000; b++) {
        pat[b] = (uint16_t)b;
        ninf[b] = (uint16_t)(0x8000u | f->inf);
    }
    for (int k = 2; k <= 3; k++) {
        const void *two[2] = {ninf, pat}, *three[3] = {ninf, ninf, pat};
        memset(out, 0, sizeof(out));
        red_host_apply_n(t, RED_MAX, out, k == 2 ? two : three, k, 0x10000);
        for (uint32_t b = 0; b < 0x10000; b++) {
            uint16_t want = to16(f, from16(f, (uint16_t)b));
            EXPECT(out[b] == want, "%s k=%d: max(-inf, 0x%04x) = 0x%04x, want 0x%04x",
                   red_type_name(t), k, b, out[b], want);
        }
    }
}
END_TEST

/* ---- Reference 8-bit floats ---------------------------------------------------------------- */

typedef struct {
    loomDataType_t type;
    int ebits, mbits, bias;
    int has_inf;      /* E5M2: exponent all ones is infinity or NaN; E4M3: only S.1111.111 is NaN */
    double mag[0x80]; /* |value| of codes 0..0x7f (NaN and infinity codes unused) */
    int finite[0x80]; /* the code is a finite value */
    float val[0x100]; /* value of every code, NaN as NAN */
} fmt8_t;

static fmt8_t e4m3_fmt = {.type = loomFloat8e4m3, .ebits = 4, .mbits = 3, .bias = 7};
static fmt8_t e5m2_fmt = {.type = loomFloat8e5m2, .ebits = 5, .mbits = 2, .bias = 15, .has_inf = 1};

static void fmt8_init(fmt8_t *f)
{
    unsigned emax = (1u << f->ebits) - 1, mmax = (1u << f->mbits) - 1;
    for (unsigned b = 0; b < 0x80; b++) {
        unsigned e = b >> f->mbits, m = b & mmax;
        f->mag[b] = e == 0 ? ldexp(m, 1 - f->bias - f->mbits)
                           : ldexp(m + (1u << f->mbits), (int)e - f->bias - f->mbits);
        f->finite[b] = f->has_inf ? e != emax : !(e == emax && m == mmax);
        float v = f->finite[b] ? (float)f->mag[b] : (f->has_inf && m == 0) ? INFINITY : NAN;
        f->val[b] = v;
        f->val[b | 0x80] = -v;
    }
}

/* Nearest finite value by search, ties to the even code, saturating at the largest finite value
 * (infinity too); NaN is the canonical 0x7f. */
static uint8_t ref_round8(const fmt8_t *f, float x)
{
    if (isnan(x)) return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    unsigned top = 0x7f;
    while (!f->finite[top])
        top--;
    if (a >= f->mag[top]) return (uint8_t)(sign | top);
    int best = -1;
    double bd = 0;
    for (unsigned b = 0; b < 0x80; b++) {
        if (!f->finite[b]) continue;
        double d = fabs(a - f->mag[b]);
        if (best < 0 || d < bd || (d == bd && (best & 1))) best = (int)b, bd = d;
    }
    return (uint8_t)(sign | best);
}

static void setup8(void)
{
    fmt8_init(&e4m3_fmt);
    fmt8_init(&e5m2_fmt);
}

static const fmt8_t *fmt8_of(loomDataType_t t)
{
    return t == loomFloat8e4m3 ? &e4m3_fmt : t == loomFloat8e5m2 ? &e5m2_fmt : NULL;
}

/* Every code decodes to its value and comes back; midpoints, their neighbours and random floats
 * round as the search says. */
START_TEST(test_fp8_conversions)
{
    setup8();
    const fmt8_t *f = _i ? &e5m2_fmt : &e4m3_fmt;
    for (unsigned b = 0; b < 0x100; b++) {
        float x = red_fp8_to_float(f->type, (uint8_t)b);
        if (isnan(f->val[b])) {
            EXPECT(isnan(x), "code 0x%02x: not NaN", b);
            EXPECT(red_float_to_fp8(f->type, x) == 0x7f, "NaN code 0x%02x comes back as 0x%02x", b,
                   red_float_to_fp8(f->type, x));
            continue;
        }
        EXPECT(fbits(x) == fbits(f->val[b]), "code 0x%02x decodes to %a, want %a", b, (double)x,
               (double)f->val[b]);
        if (isinf(x)) continue;
        EXPECT(red_float_to_fp8(f->type, x) == b, "code 0x%02x round-trips to 0x%02x", b,
               red_float_to_fp8(f->type, x));
    }
    for (unsigned b = 0; b + 1 < 0x80; b++) {
        if (!f->finite[b] || !f->finite[b + 1]) continue;
        float mid = (float)((f->mag[b] + f->mag[b + 1]) / 2);
        for (int sg = 0; sg < 2; sg++) {
            float m = sg ? -mid : mid;
            float xs[3] = {m, nextafterf(m, INFINITY), nextafterf(m, -INFINITY)};
            for (int k = 0; k < 3; k++)
                EXPECT(red_float_to_fp8(f->type, xs[k]) == ref_round8(f, xs[k]),
                       "%s(%a) = 0x%02x, want 0x%02x", red_type_name(f->type), (double)xs[k],
                       red_float_to_fp8(f->type, xs[k]), ref_round8(f, xs[k]));
        }
    }
    for (int i = 0; i < 100000; i++) {
        float x = bitsf((uint32_t)rng());
        if (i & 1) x = ldexpf((float)(rng() % 4096) / 256.0f, (int)(rng() % 40) - 24);
        EXPECT(red_float_to_fp8(f->type, x) == ref_round8(f, x), "%s(%a) = 0x%02x, want 0x%02x",
               red_type_name(f->type), (double)x, red_float_to_fp8(f->type, x), ref_round8(f, x));
    }
}
END_TEST

START_TEST(test_fp8_edges)
{
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, 1.0f), 0x38);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, 448.0f), 0x7e);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, 1e6f), 0x7e); /* saturates */
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, -INFINITY), 0xfe);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, ldexpf(1, -9)), 0x01);  /* min subnormal */
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, ldexpf(1, -10)), 0x00); /* tie to even */
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, -0.0f), 0x80);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e4m3, NAN), 0x7f);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e5m2, 1.0f), 0x3c);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e5m2, 57344.0f), 0x7b);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e5m2, INFINITY), 0x7b); /* saturates */
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e5m2, ldexpf(1, -16)), 0x01);
    ck_assert_uint_eq(red_float_to_fp8(loomFloat8e5m2, -NAN), 0x7f);
    ck_assert(red_fp8_to_float(loomFloat8e5m2, 0x7c) == INFINITY);
    ck_assert(isnan(red_fp8_to_float(loomFloat8e4m3, 0xff)));
    ck_assert(red_fp8_to_float(loomFloat8e4m3, 0x7e) == 448.0f);
    ck_assert(red_fp8_to_float(loomFloat8e4m3, 0xf8) == -256.0f);
}
END_TEST

START_TEST(test_half_edges)
{
    ck_assert_uint_eq(red_float_to_half(0.0f), 0x0000);
    ck_assert_uint_eq(red_float_to_half(-0.0f), 0x8000);
    ck_assert_uint_eq(red_float_to_half(1.0f), 0x3c00);
    ck_assert_uint_eq(red_float_to_half(-2.0f), 0xc000);
    ck_assert_uint_eq(red_float_to_half(65504.0f), 0x7bff);  /* max finite */
    ck_assert_uint_eq(red_float_to_half(65519.99f), 0x7bff); /* just below the tie */
    ck_assert_uint_eq(red_float_to_half(65520.0f), 0x7c00);  /* tie: overflows */
    ck_assert_uint_eq(red_float_to_half(1e10f), 0x7c00);
    ck_assert_uint_eq(red_float_to_half(-FLT_MAX), 0xfc00);
    ck_assert_uint_eq(red_float_to_half(INFINITY), 0x7c00);
    ck_assert_uint_eq(red_float_to_half(-INFINITY), 0xfc00);
    ck_assert_uint_eq(red_float_to_half(ldexpf(1, -14)), 0x0400); /* min normal */
    ck_assert_uint_eq(red_float_to_half(ldexpf(1, -24)), 0x0001); /* min subnormal */
    ck_assert_uint_eq(red_float_to_half(ldexpf(1, -25)), 0x0000); /* tie to even: 0 */
    ck_assert_uint_eq(red_float_to_half(ldexpf(3, -25)), 0x0002); /* tie to even: 2 */
    ck_assert_uint_eq(red_float_to_half(ldexpf(3, -26)), 0x0001);
    ck_assert_uint_eq(red_float_to_half(ldexpf(1023, -24) + ldexpf(1, -25)), 0x0400);
    ck_assert_uint_eq(red_float_to_half(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even */
    ck_assert_uint_eq(red_float_to_half(1.0f + ldexpf(3, -11)), 0x3c02); /* tie to even */
    ck_assert_uint_eq(red_float_to_half(FLT_MIN / 4), 0x0000);           /* float subnormal */
    ck_assert_uint_eq(red_float_to_half(-ldexpf(1, -149)), 0x8000);
    ck_assert(isnan(red_half_to_float(red_float_to_half(NAN))));
    ck_assert(isnan(red_half_to_float(red_float_to_half(-NAN))));
    ck_assert(red_half_to_float(0x0001) == ldexpf(1, -24));
    ck_assert(red_half_to_float(0x03ff) == ldexpf(1023, -24));
    ck_assert(red_half_to_float(0x7bff) == 65504.0f);
    ck_assert(red_half_to_float(0xfc00) == -INFINITY);
    ck_assert(signbit(red_half_to_float(0x8000)) && red_half_to_float(0x8000) == 0.0f);
}
END_TEST

START_TEST(test_bf16_edges)
{
    ck_assert_uint_eq(red_float_to_bf16(0.0f), 0x0000);
    ck_assert_uint_eq(red_float_to_bf16(-0.0f), 0x8000);
    ck_assert_uint_eq(red_float_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(red_float_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80); /* tie to even */
    ck_assert_uint_eq(red_float_to_bf16(1.0f + ldexpf(3, -8)), 0x3f82); /* tie to even */
    ck_assert_uint_eq(red_float_to_bf16(bitsf(0x7f7f7fffu)), 0x7f7f);   /* max finite */
    ck_assert_uint_eq(red_float_to_bf16(bitsf(0x7f7f8000u)), 0x7f80);   /* tie: overflows */
    ck_assert_uint_eq(red_float_to_bf16(FLT_MAX), 0x7f80);
    ck_assert_uint_eq(red_float_to_bf16(-INFINITY), 0xff80);
    ck_assert_uint_eq(red_float_to_bf16(ldexpf(1, -133)), 0x0001); /* min subnormal */
    ck_assert_uint_eq(red_float_to_bf16(ldexpf(1, -134)), 0x0000); /* tie to even */
    ck_assert_uint_eq(red_float_to_bf16(ldexpf(3, -134)), 0x0002);
    ck_assert_uint_eq(red_float_to_bf16(bitsf(0x007fffffu)), 0x0080); /* up to min normal */
    ck_assert_uint_eq(red_float_to_bf16(bitsf(0x7fffffffu)), 0x7fff); /* NaN, not inf */
    ck_assert_uint_eq(red_float_to_bf16(bitsf(0x7f800001u)), 0x7fc0); /* sNaN quieted */
    ck_assert_uint_eq(red_float_to_bf16(bitsf(0xff800001u)), 0xffc0);
    ck_assert(red_bf16_to_float(0x0001) == ldexpf(1, -133));
    ck_assert(red_bf16_to_float(0x7f80) == INFINITY);
}
END_TEST

START_TEST(test_type_info)
{
    static const size_t sizes[loomNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    for (int t = 0; t < loomNumTypes; t++) {
        ck_assert_uint_eq(red_type_size((loomDataType_t)t), sizes[t]);
        ck_assert_str_ne(red_type_name((loomDataType_t)t), "invalid");
    }
    ck_assert_str_eq(red_type_name(loomFloat32), "float32");
    ck_assert_str_eq(red_type_name(loomBfloat16), "bfloat16");
    ck_assert_str_eq(red_type_name(loomFloat8e4m3), "float8e4m3");
    ck_assert_str_eq(red_type_name(loomFloat8e5m2), "float8e5m2");
    ck_assert_uint_eq(red_type_size(loomNumTypes), 0);
    ck_assert_str_eq(red_type_name(loomNumTypes), "invalid");
    ck_assert_str_eq(red_type_name((loomDataType_t)-1), "invalid");
}
END_TEST

/* ---- Scalar reference of the element operations ----------------------------------------- */

static int is_int(loomDataType_t t)
{
    return t <= loomUint64;
}

static int is_unsigned(loomDataType_t t)
{
    return t == loomUint8 || t == loomUint32 || t == loomUint64;
}

static const fmt16_t *fmt_of(loomDataType_t t)
{
    return t == loomFloat16 ? &half_fmt : t == loomBfloat16 ? &bf16_fmt : NULL;
}

/* Integers widened to 64 bits: sign-extended for signed types, zero-extended otherwise. */
static uint64_t ld_int(loomDataType_t t, const void *p, size_t i)
{
    const char *c = (const char *)p + i * red_type_size(t);
    switch (t) {
    case loomInt8: {
        int8_t v;
        memcpy(&v, c, 1);
        return (uint64_t)(int64_t)v;
    }
    case loomUint8: {
        uint8_t v;
        memcpy(&v, c, 1);
        return v;
    }
    case loomInt32: {
        int32_t v;
        memcpy(&v, c, 4);
        return (uint64_t)(int64_t)v;
    }
    case loomUint32: {
        uint32_t v;
        memcpy(&v, c, 4);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, c, 8);
        return v;
    }
    }
}

/* Keeps the low bits: the value modulo 2^width. */
static void st_int(loomDataType_t t, void *p, size_t i, uint64_t v)
{
    char *c = (char *)p + i * red_type_size(t);
    uint8_t v8 = (uint8_t)v;
    uint32_t v32 = (uint32_t)v;
    switch (red_type_size(t)) {
    case 1: memcpy(c, &v8, 1); break;
    case 4: memcpy(c, &v32, 4); break;
    default: memcpy(c, &v, 8); break;
    }
}

static uint64_t ref_int_op(loomDataType_t t, red_op_t op, uint64_t x, uint64_t y)
{
    int gt = is_unsigned(t) ? x > y : (int64_t)x > (int64_t)y;
    int lt = is_unsigned(t) ? x < y : (int64_t)x < (int64_t)y;
    switch (op) {
    case RED_SUM: return x + y;
    case RED_PROD: return x * y;
    case RED_MAX: return gt ? x : y;
    default: return lt ? x : y;
    }
}

static float ref_f32_op(red_op_t op, float x, float y)
{
    switch (op) {
    case RED_SUM: return x + y;
    case RED_PROD: return x * y;
    case RED_MAX: return x > y ? x : y;
    default: return x < y ? x : y;
    }
}

static double ref_f64_op(red_op_t op, double x, double y)
{
    switch (op) {
    case RED_SUM: return x + y;
    case RED_PROD: return x * y;
    case RED_MAX: return x > y ? x : y;
    default: return x < y ? x : y;
    }
}

static uint16_t ld16(const void *p, size_t i)
{
    uint16_t v;
    memcpy(&v, (const char *)p + 2 * i, 2);
    return v;
}

static void st16(void *p, size_t i, uint16_t v)
{
    memcpy((char *)p + 2 * i, &v, 2);
}

/* out[i] = fold left over srcs; half/bf16 fold in float32 and round once. */
static void ref_apply_n(loomDataType_t t, red_op_t op, void *out, const void *const *srcs, int k,
                        size_t n)
{
    const fmt16_t *f = fmt_of(t);
    const fmt8_t *f8 = fmt8_of(t);
    for (size_t i = 0; i < n; i++) {
        if (f8 && k == 1) { /* a copy: NaN codes kept as they are */
            ((uint8_t *)out)[i] = ((const uint8_t *)srcs[0])[i];
        } else if (f8) {
            float acc = f8->val[((const uint8_t *)srcs[0])[i]];
            for (int j = 1; j < k; j++)
                acc = ref_f32_op(op, acc, f8->val[((const uint8_t *)srcs[j])[i]]);
            ((uint8_t *)out)[i] = ref_round8(f8, acc);
        } else if (is_int(t)) {
            uint64_t acc = ld_int(t, srcs[0], i);
            for (int j = 1; j < k; j++)
                acc = ref_int_op(t, op, acc, ld_int(t, srcs[j], i));
            st_int(t, out, i, acc);
        } else if (f) {
            float acc = f->val[ld16(srcs[0], i)];
            for (int j = 1; j < k; j++)
                acc = ref_f32_op(op, acc, f->val[ld16(srcs[j], i)]);
            st16(out, i, ref_round(f, acc));
        } else if (t == loomFloat32) {
            float acc, x;
            memcpy(&acc, (const char *)srcs[0] + 4 * i, 4);
            for (int j = 1; j < k; j++) {
                memcpy(&x, (const char *)srcs[j] + 4 * i, 4);
                acc = ref_f32_op(op, acc, x);
            }
            memcpy((char *)out + 4 * i, &acc, 4);
        } else {
            double acc, x;
            memcpy(&acc, (const char *)srcs[0] + 8 * i, 8);
            for (int j = 1; j < k; j++) {
                memcpy(&x, (const char *)srcs[j] + 8 * i, 8);
                acc = ref_f64_op(op, acc, x);
            }
            memcpy((char *)out + 8 * i, &acc, 8);
        }
    }
}

/* ---- Inputs ------------------------------------------------------------------------------ */

/* A random half/bf16 value of moderate magnitude (2^-12 .. 2^9), sometimes a signed zero: sums
 * and products of up to 8 of them exercise rounding, subnormal results and overflow to infinity
 * while staying exact or identically rounded in float32. */
static uint16_t rand16(const fmt16_t *f)
{
    uint64_t r = rng();
    if (r % 16 == 0) return (uint16_t)(r & 0x8000u);
    int e = f->bias - 12 + (int)((r >> 8) % 21);
    return (uint16_t)(((r >> 4) & 0x8000u) | ((unsigned)e << f->mbits) |
                      ((r >> 32) & ((1u << f->mbits) - 1)));
}

/* Integers: any bits (wrapping is under test). float32/64: small integers and signed zeros, so
 * every result is exact. */
static void fill(loomDataType_t t, void *p, size_t n)
{
    const fmt16_t *f = fmt_of(t);
    for (size_t i = 0; i < n; i++) {
        if (fmt8_of(t)) {
            /* any code: NaN, infinity and saturation are under test too */
            ((uint8_t *)p)[i] = (uint8_t)rng();
        } else if (is_int(t)) {
            st_int(t, p, i, rng());
        } else if (f) {
            st16(p, i, rand16(f));
        } else if (t == loomFloat32) {
            uint64_t r = rng();
            float v = (float)((int)(r % 15) - 7);
            if (v == 0 && (r & 0x100)) v = -0.0f; /* max(+0, -0) depends on operand order */
            memcpy((char *)p + 4 * i, &v, 4);
        } else {
            uint64_t r = rng();
            double v = (double)((int)(r % 15) - 7);
            if (v == 0 && (r & 0x100)) v = -0.0;
            memcpy((char *)p + 8 * i, &v, 8);
        }
    }
}

static void check_same(loomDataType_t t, const char *what, const void *got, const void *want,
                       size_t n)
{
    size_t size = red_type_size(t);
    if (memcmp(got, want, n * size) == 0) return;
    size_t i = 0;
    while (memcmp((const char *)got + i * size, (const char *)want + i * size, size) == 0)
        i++;
    uint64_t g = 0, w = 0;
    memcpy(&g, (const char *)got + i * size, size);
    memcpy(&w, (const char *)want + i * size, size);
    ck_abort_msg("%s %s: n=%zu, element %zu is 0x%llx, want 0x%llx", red_type_name(t), what, n, i,
                 (unsigned long long)g, (unsigned long long)w);
}

/* Buffers are kept and reused from case to case: faulting in fresh megabytes for every case
 * would take most of the run time. */
#define NUM_SLOTS 10
static char *scratch(int slot, size_t bytes)
{
    static char *buf[NUM_SLOTS];
    static size_t cap[NUM_SLOTS];
    if (bytes > cap[slot]) {
        free(buf[slot]);
        buf[slot] = malloc(bytes);
        ck_assert(buf[slot]);
        cap[slot] = bytes;
    }
    return buf[slot];
}

/* A destination that still holds an earlier case's bytes must not pass by accident. */
static char *scratch_dst(int slot, size_t bytes)
{
    char *p = scratch(slot, bytes);
    memset(p, 0xa5, bytes);
    return p;
}

static const char *const op_names[RED_NUM_OPS] = {"sum", "prod", "max", "min"};

/* ---- red_host_apply ---------------------------------------------------------------------- */

enum { MODE_OUT, MODE_DST_A, MODE_DST_B, MODE_DST_AB, NUM_MODES };

static void one_apply(loomDataType_t t, red_op_t op, size_t n, int mode, unsigned off)
{
    size_t size = red_type_size(t), bytes = n * size;
    char *ba = scratch(0, bytes + 16), *bb = scratch(1, bytes + 16);
    char *bd = scratch_dst(2, bytes + 16), *want = scratch(3, bytes + 1);
    char *a = ba + off % 16, *b = bb + (off * 7 + 3) % 16, *d = bd + (off * 5 + 1) % 16;
    fill(t, a, n);
    fill(t, b, n);
    if (mode == MODE_DST_AB) b = a;
    const void *srcs[2] = {a, b};
    ref_apply_n(t, op, want, srcs, 2, n);
    if (mode == MODE_DST_A || mode == MODE_DST_AB) d = a;
    if (mode == MODE_DST_B) d = b;
    red_host_apply(t, op, d, a, b, n);
    char what[64];
    snprintf(what, sizeof(what), "apply %s mode %d offset %u", op_names[op], mode, off);
    check_same(t, what, d, want, n);
}

START_TEST(test_apply)
{
    loomDataType_t t = (loomDataType_t)_i;
    static const size_t sizes[] = {0, 1, 7, 33, 100, 1027};
    for (int op = 0; op < RED_NUM_OPS; op++) {
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
            for (int mode = 0; mode < NUM_MODES; mode++)
                for (unsigned off = 0; off < 16; off++)
                    one_apply(t, (red_op_t)op, sizes[s], mode, off);
        one_apply(t, (red_op_t)op, BIG_N, op == RED_SUM ? MODE_DST_A : MODE_OUT, (unsigned)op + 1);
    }
}
END_TEST

/* The documented NaN behaviour of max/min: the result is b whenever either input is NaN. */
START_TEST(test_nan_max_min)
{
    float a[2] = {NAN, 1.0f}, b[2] = {1.0f, NAN}, d[2];
    red_host_apply(loomFloat32, RED_MAX, d, a, b, 2);
    ck_assert(d[0] == 1.0f && isnan(d[1]));
    red_host_apply(loomFloat32, RED_MIN, d, a, b, 2);
    ck_assert(d[0] == 1.0f && isnan(d[1]));
    uint16_t ha[2] = {0x7e00, 0x3c00}, hb[2] = {0x3c00, 0xfe01}, hd[2];
    red_host_apply(loomFloat16, RED_MAX, hd, ha, hb, 2);
    ck_assert_uint_eq(hd[0], 0x3c00);
    ck_assert_uint_eq(hd[1], 0xfe01);
    uint16_t sum[2];
    red_host_apply(loomBfloat16, RED_SUM, sum, (uint16_t[]){0x7fc1, 0x3f80},
                   (uint16_t[]){0x3f80, 0xff80}, 2);
    ck_assert(isnan(red_bf16_to_float(sum[0])));
    ck_assert_uint_eq(sum[1], 0xff80); /* 1 + -inf */
}
END_TEST

/* ---- red_host_apply_n -------------------------------------------------------------------- */

static void one_apply_n(loomDataType_t t, red_op_t op, size_t n, int k, int in_place, unsigned off)
{
    size_t size = red_type_size(t), bytes = n * size;
    const void *srcs[8];
    for (int j = 0; j < k; j++) {
        char *p = scratch(j, bytes + 16) + (off + 3 * (unsigned)j) % 16;
        fill(t, p, n);
        srcs[j] = p;
    }
    char *bd = scratch_dst(8, bytes + 16), *want = scratch(9, bytes + 1);
    ref_apply_n(t, op, want, srcs, k, n);
    void *d = in_place ? (void *)srcs[0] : bd + (off * 5 + 1) % 16;
    red_host_apply_n(t, op, d, srcs, k, n);
    char what[80];
    snprintf(what, sizeof(what), "apply_n %s k=%d in_place=%d offset %u", op_names[op], k, in_place,
             off);
    check_same(t, what, d, want, n);
}

START_TEST(test_apply_n)
{
    loomDataType_t t = (loomDataType_t)_i;
    static const int ks[] = {1, 2, 3, 8};
    static const size_t sizes[] = {0, 1, 7, 100, 5000};
    for (int op = 0; op < RED_NUM_OPS; op++) {
        for (size_t ki = 0; ki < 4; ki++) {
            for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
                for (unsigned off = 0; off < 16; off += 5) {
                    one_apply_n(t, (red_op_t)op, sizes[s], ks[ki], 0, off);
                    one_apply_n(t, (red_op_t)op, sizes[s], ks[ki], 1, off);
                }
        }
        one_apply_n(t, (red_op_t)op, BIG_N, 3, 1, 2);
    }
}
END_TEST

/* ---- red_host_scale ---------------------------------------------------------------------- */

static void one_scale(loomDataType_t t, size_t n, int in_place, unsigned off)
{
    size_t size = red_type_size(t), bytes = n * size;
    char *bs = scratch(0, bytes + 16), *bd = scratch_dst(1, bytes + 16);
    char *want = scratch(2, bytes + 1);
    char scalar_buf[24];
    char *src = bs + off % 16, *scalar = scalar_buf + 1 + off % 8;
    fill(t, src, n);
    fill(t, scalar, 1);
    const fmt16_t *f = fmt_of(t);
    const fmt8_t *f8 = fmt8_of(t);
    for (size_t i = 0; i < n; i++) {
        if (f8) {
            ((uint8_t *)want)[i] =
                ref_round8(f8, f8->val[((uint8_t *)src)[i]] * f8->val[*(uint8_t *)scalar]);
        } else if (is_int(t)) {
            st_int(t, want, i, ld_int(t, src, i) * ld_int(t, scalar, 0));
        } else if (f) {
            st16(want, i, ref_round(f, f->val[ld16(src, i)] * f->val[ld16(scalar, 0)]));
        } else if (t == loomFloat32) {
            float x, s;
            memcpy(&x, src + 4 * i, 4);
            memcpy(&s, scalar, 4);
            x = x * s;
            memcpy(want + 4 * i, &x, 4);
        } else {
            double x, s;
            memcpy(&x, src + 8 * i, 8);
            memcpy(&s, scalar, 8);
            x = x * s;
            memcpy(want + 8 * i, &x, 8);
        }
    }
    void *d = in_place ? src : bd + (off * 3 + 2) % 16;
    red_host_scale(t, d, src, scalar, n);
    check_same(t, in_place ? "scale in place" : "scale", d, want, n);
}

START_TEST(test_scale)
{
    loomDataType_t t = (loomDataType_t)_i;
    static const size_t sizes[] = {0, 1, 7, 100, 1027};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
        for (unsigned off = 0; off < 16; off++) {
            one_scale(t, sizes[s], 0, off);
            one_scale(t, sizes[s], 1, off);
        }
    one_scale(t, BIG_N, 0, 1);
    one_scale(t, BIG_N, 1, 0);
}
END_TEST

/* ---- red_host_div ------------------------------------------------------------------------ */

static void one_div(loomDataType_t t, size_t n, int divisor, int in_place, unsigned off)
{
    size_t size = red_type_size(t), bytes = n * size;
    char *bs = scratch(0, bytes + 16), *bd = scratch_dst(1, bytes + 16);
    char *want = scratch(2, bytes + 1);
    char *src = bs + off % 16;
    fill(t, src, n);
    if (is_int(t)) {
        /* The edges of the range and of the divisor's multiples. */
        const uint64_t d = (uint64_t)divisor;
        const uint64_t edges[] = {0,
                                  1,
                                  (uint64_t)-1,
                                  d,
                                  d - 1,
                                  d + 1,
                                  0 - d,
                                  0 - d + 1,
                                  (uint64_t)INT64_MIN,
                                  (uint64_t)INT64_MAX,
                                  0x80000000u,
                                  0x7fffffffu,
                                  0xffffffffu,
                                  0x80u,
                                  0x7fu,
                                  0xffu};
        for (size_t i = 0; i < n && i < sizeof(edges) / sizeof(edges[0]); i++)
            st_int(t, src, i, edges[i]);
    }
    const fmt16_t *f = fmt_of(t);
    const fmt8_t *f8 = fmt8_of(t);
    for (size_t i = 0; i < n; i++) {
        if (f8 && divisor == 1) { /* a copy: NaN codes kept as they are */
            ((uint8_t *)want)[i] = ((uint8_t *)src)[i];
        } else if (f8) {
            ((uint8_t *)want)[i] = ref_round8(f8, f8->val[((uint8_t *)src)[i]] / (float)divisor);
        } else if (is_int(t)) {
            uint64_t x = ld_int(t, src, i), q;
            if (is_unsigned(t))
                q = x / (uint64_t)divisor;
            else
                q = (uint64_t)((int64_t)x / (int64_t)divisor);
            st_int(t, want, i, q);
        } else if (f) {
            st16(want, i, ref_round(f, f->val[ld16(src, i)] / (float)divisor));
        } else if (t == loomFloat32) {
            float x;
            memcpy(&x, src + 4 * i, 4);
            x = x / (float)divisor;
            memcpy(want + 4 * i, &x, 4);
        } else {
            double x;
            memcpy(&x, src + 8 * i, 8);
            x = x / (double)divisor;
            memcpy(want + 8 * i, &x, 8);
        }
    }
    void *d = in_place ? src : bd + (off * 3 + 2) % 16;
    red_host_div(t, d, src, divisor, n);
    char what[64];
    snprintf(what, sizeof(what), "div by %d%s", divisor, in_place ? " in place" : "");
    check_same(t, what, d, want, n);
}

START_TEST(test_div)
{
    loomDataType_t t = (loomDataType_t)_i;
    static const int divisors[] = {
        1,       2,          3,    4,     5,     6,       7,
        8,       10,         12,   16,    100,   127,     128,
        255,     256,        1000, 65535, 65536, 1 << 24, (1 << 24) + 1,
        1 << 30, 0x7fffffff,
    };
    static const size_t sizes[] = {0, 1, 7, 100, 1027};
    for (size_t v = 0; v < sizeof(divisors) / sizeof(divisors[0]); v++)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            unsigned off = (unsigned)(v + s) % 16;
            one_div(t, sizes[s], divisors[v], 0, off);
            one_div(t, sizes[s], divisors[v], 1, off);
        }
    one_div(t, BIG_N, 3, 0, 1);
    one_div(t, BIG_N, 8, 1, 0);
}
END_TEST

/* ---- Runner ------------------------------------------------------------------------------ */

static Suite *reduce_suite(void)
{
    Suite *s = suite_create("reduce");
    TCase *conv = tcase_create("conversions");
    tcase_add_unchecked_fixture(conv, setup, NULL);
    tcase_set_timeout(conv, 60);
    tcase_add_test(conv, test_half_exhaustive);
    tcase_add_test(conv, test_bf16_exhaustive);
    tcase_add_test(conv, test_half_rounding);
    tcase_add_test(conv, test_bf16_rounding);
    tcase_add_loop_test(conv, test_vector_conversions, 0, 2);
    tcase_add_test(conv, test_half_edges);
    tcase_add_test(conv, test_bf16_edges);
    tcase_add_test(conv, test_type_info);
    tcase_add_loop_test(conv, test_fp8_conversions, 0, 2);
    tcase_add_test(conv, test_fp8_edges);
    suite_add_tcase(s, conv);

    TCase *ops = tcase_create("operations");
    tcase_add_unchecked_fixture(ops, setup, NULL);
    tcase_add_unchecked_fixture(ops, setup8, NULL);
    tcase_set_timeout(ops, 60);
    tcase_add_loop_test(ops, test_apply, 0, loomNumTypes);
    tcase_add_test(ops, test_nan_max_min);
    tcase_add_loop_test(ops, test_apply_n, 0, loomNumTypes);
    tcase_add_loop_test(ops, test_scale, 0, loomNumTypes);
    tcase_add_loop_test(ops, test_div, 0, loomNumTypes);
    suite_add_tcase(s, ops);
    return s;
}

int main(void)
{
    return h_check_main(reduce_suite(), false, CK_NORMAL);
}
