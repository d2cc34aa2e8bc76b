/*
 * Host reductions. Every hot loop is a plain element-wise loop left to the auto-vectoriser and
 * compiled three times (AVX-512, AVX2, baseline) with the copy picked at load time, so one binary
 * runs at memory speed on any x86-64; float16 conversion alone uses F16C where the CPU has it,
 * also picked at load time. Semantics worth knowing:
 *
 * - Integer sum, prod and scale wrap modulo 2^width. Signed types share the unsigned code: two's
 *   complement wrapping gives the same bits for signed and unsigned operands.
 * - Float max is (a > b ? a : b) and min (a < b ? a : b), the semantics of the x86 max/min
 *   instructions: when either input is NaN the result is the second operand b (so a NaN in b
 *   propagates and a NaN in a is dropped), and max(+0, -0) is b. apply_n folds left
 *   (acc op srcs[j]), so there a NaN in a later source wins.
 * - Float16, bfloat16 and the 8-bit floats (reduce_fp8.c) are widened exactly to float32, combined
 *   there, and rounded to nearest even once per output. Float16/bfloat16 narrowing keeps a NaN's
 *   sign and top payload bits and quiets it; the 8-bit floats saturate to their largest finite
 *   value and write the canonical NaN (the GPU's conversion).
 * - Any pointer may be misaligned, even for its element type: all loads and stores go through
 *   1-byte-aligned types.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* gcc 12 at -O2 uses the "very-cheap" vector cost model, which will not vectorise a loop whose
 * trip count is unknown or that needs an alias check, i.e. every loop here. Placed before the
 * includes so that every function in this file (inline ones from headers too) has the same
 * options and nothing is refused for inlining on an option mismatch. */
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

#include <string.h>

#include "reduce.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) &&       \
    defined(__GLIBC__)
/* x86-64-v4 has AVX-512 BW/VL (byte and word lanes for int8/half), v3 has AVX2; the baseline copy
 * is SSE2. Needs ifunc, hence glibc. */
#define RED_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define RED_X86_DISPATCH 1
#include <immintrin.h>
#else
#define RED_CLONES
#endif

/* Under-aligned views of the element types: buffers from users and from split counts may sit at
 * any byte address, and the vectoriser must not assume element alignment (a baseline SSE2 copy
 * that peeled to an "aligned" address would fault). */
typedef int8_t red_m_i8 __attribute__((aligned(1)));
typedef uint8_t red_m_u8 __attribute__((aligned(1)));
typedef int32_t red_m_i32 __attribute__((aligned(1)));
typedef uint32_t red_m_u32 __attribute__((aligned(1)));
typedef int64_t red_m_i64 __attribute__((aligned(1)));
typedef uint64_t red_m_u64 __attribute__((aligned(1)));
typedef uint16_t red_m_u16 __attribute__((aligned(1)));
typedef float red_m_f32 __attribute__((aligned(1)));
typedef double red_m_f64 __attribute__((aligned(1)));

/* Bytes per block of the accumulator for the k-input reduction of the byte/int/float types. */
#define RED_NBLOCK_BYTES 8192

typedef void (*red_bin_fn)(void *dst, const void *a, const void *b, size_t n);
typedef void (*red_scale_fn)(void *dst, const void *src, const void *scalar, size_t n);
typedef void (*red_div_fn)(void *dst, const void *src, int divisor, size_t n);

/* ---- Bit casts and the half/bfloat16 conversions ------------------------------------------ */

static inline float red_u2f(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = u};
    return v.f;
}

static inline uint32_t red_f2u(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    return v.u;
}

/* A select written as masks: gcc leaves some ?: as branches in the baseline copy, which stops
 * the vectoriser; this form never branches. */
static inline uint32_t red_sel(int cond, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - (uint32_t)cond;
    return (a & m) | (b & ~m);
}

/* Exact. The exponent is rebiased in the integer domain; a subnormal half is built as the normal
 * float 2^-14 * (1 + m/1024) and 2^-14 subtracted, which is exact and never touches a float32
 * subnormal (so it works under denormals-are-zero too). NaN payload and signalling bit are kept. */
static inline float red_h2f(uint16_t h)
{
    uint32_t x = h;
    uint32_t sign = (x & 0x8000u) << 16;
    uint32_t em = (x & 0x7fffu) << 13;
    uint32_t exp = em & 0x0f800000u;
    /* Rebiasing maps exponent 31 to 143 (0x8f); or-ing in 0x70 makes it 255 (inf/NaN). */
    uint32_t r = (em + (112u << 23)) | red_sel(exp == 0x0f800000u, 0x70u << 23, 0);
    uint32_t sub = red_f2u(red_u2f(em | (113u << 23)) - red_u2f(113u << 23));
    r = red_sel(exp == 0, sub, r);
    return red_u2f(r | sign);
}

/* Round to nearest even. Normal results: add the rounding bias (half an ulp minus one, plus the
 * kept lsb for ties to even) to the rebiased bits; a carry out of the mantissa correctly bumps the
 * exponent, up to infinity. Subnormal results: adding 0.5f aligns the value so that the float
 * adder itself rounds to a multiple of 2^-24 (the half subnormal step). Every candidate is kept
 * 13 bits up until the one final shift: selecting between 16-bit values lets gcc narrow each
 * candidate and mask separately (many packs per vector), which more than doubled the cost. */
static inline uint16_t red_f2h(float f)
{
    uint32_t u = red_f2u(f);
    uint32_t sign = (u & 0x80000000u) >> 3;
    u &= 0x7fffffffu;
    uint32_t norm = u - (112u << 23) + 0xfffu + ((u >> 13) & 1u);
    uint32_t sub = (red_f2u(red_u2f(u) + 0.5f) - (126u << 23)) << 13;
    uint32_t nan = (u & 0x007fe000u) | 0x0fc00000u; /* quiet, top 9 payload bits kept */
    int32_t a = (int32_t)u;                         /* signed compares: AVX2 has no unsigned ones */
    uint32_t r = red_sel(a < (113 << 23), sub, norm);
    r = red_sel(a >= (143 << 23), 0x0f800000u, r);
    r = red_sel(a > 0x7f800000, nan, r);
    return (uint16_t)((r | sign) >> 13);
}

static inline float red_bf2f(uint16_t b)
{
    return red_u2f((uint32_t)b << 16);
}

/* Same bias trick as red_f2h; bfloat16 has float32's exponent, so subnormals and overflow to
 * infinity need no special case, only NaN (whose payload could otherwise round to infinity).
 * Selected before the shift for the same reason as in red_f2h. */
static inline uint16_t red_f2bf(float f)
{
    uint32_t u = red_f2u(f);
    uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
    r = red_sel((int32_t)(u & 0x7fffffffu) > 0x7f800000, u | 0x00400000u, r);
    return (uint16_t)(r >> 16);
}

float red_half_to_float(uint16_t h)
{
    return red_h2f(h);
}

uint16_t red_float_to_half(float f)
{
    return red_f2h(f);
}

float red_bf16_to_float(uint16_t b)
{
    return red_bf2f(b);
}

uint16_t red_float_to_bf16(float f)
{
    return red_f2bf(f);
}

/* ---- Element operations ------------------------------------------------------------------ */

/* Wrapping arithmetic in the unsigned type (uint8 promotes to int, where 255 * 255 still fits). */
#define RED_OP_SUM(T, x, y) ((T)((x) + (y)))
#define RED_OP_PROD(T, x, y) ((T)((x) * (y)))
#define RED_OP_MAX(T, x, y) ((x) > (y) ? (x) : (y))
#define RED_OP_MIN(T, x, y) ((x) < (y) ? (x) : (y))

/* ---- Two-input loops for the native types ------------------------------------------------- */

/* No restrict: dst may be a or b. gcc versions the loop on a runtime check that accepts exact
 * aliasing (it only rejects |dst - src| below one vector), so in-place runs vectorised too. */
#define RED_DEF_BIN(name, M, T, OP)                                                                \
    RED_CLONES static void name(void *dst_, const void *a_, const void *b_, size_t n)              \
    {                                                                                              \
        M *dst = dst_;                                                                             \
        const M *a = a_, *b = b_;                                                                  \
        for (size_t i = 0; i < n; i++) {                                                           \
            T x = a[i], y = b[i];                                                                  \
            dst[i] = OP(T, x, y);                                                                  \
        }                                                                                          \
    }

RED_DEF_BIN(red_u8_sum, red_m_u8, uint8_t, RED_OP_SUM)
RED_DEF_BIN(red_u8_prod, red_m_u8, uint8_t, RED_OP_PROD)
RED_DEF_BIN(red_i8_max, red_m_i8, int8_t, RED_OP_MAX)
RED_DEF_BIN(red_i8_min, red_m_i8, int8_t, RED_OP_MIN)
RED_DEF_BIN(red_u8_max, red_m_u8, uint8_t, RED_OP_MAX)
RED_DEF_BIN(red_u8_min, red_m_u8, uint8_t, RED_OP_MIN)
RED_DEF_BIN(red_u32_sum, red_m_u32, uint32_t, RED_OP_SUM)
RED_DEF_BIN(red_u32_prod, red_m_u32, uint32_t, RED_OP_PROD)
RED_DEF_BIN(red_i32_max, red_m_i32, int32_t, RED_OP_MAX)
RED_DEF_BIN(red_i32_min, red_m_i32, int32_t, RED_OP_MIN)
RED_DEF_BIN(red_u32_max, red_m_u32, uint32_t, RED_OP_MAX)
RED_DEF_BIN(red_u32_min, red_m_u32, uint32_t, RED_OP_MIN)
RED_DEF_BIN(red_u64_sum, red_m_u64, uint64_t, RED_OP_SUM)
RED_DEF_BIN(red_u64_prod, red_m_u64, uint64_t, RED_OP_PROD)
RED_DEF_BIN(red_i64_max, red_m_i64, int64_t, RED_OP_MAX)
RED_DEF_BIN(red_i64_min, red_m_i64, int64_t, RED_OP_MIN)
RED_DEF_BIN(red_u64_max, red_m_u64, uint64_t, RED_OP_MAX)
RED_DEF_BIN(red_u64_min, red_m_u64, uint64_t, RED_OP_MIN)
RED_DEF_BIN(red_f32_sum, red_m_f32, float, RED_OP_SUM)
RED_DEF_BIN(red_f32_prod, red_m_f32, float, RED_OP_PROD)
RED_DEF_BIN(red_f32_max, red_m_f32, float, RED_OP_MAX)
RED_DEF_BIN(red_f32_min, red_m_f32, float, RED_OP_MIN)
RED_DEF_BIN(red_f64_sum, red_m_f64, double, RED_OP_SUM)
RED_DEF_BIN(red_f64_prod, red_m_f64, double, RED_OP_PROD)
RED_DEF_BIN(red_f64_max, red_m_f64, double, RED_OP_MAX)
RED_DEF_BIN(red_f64_min, red_m_f64, double, RED_OP_MIN)

static const red_bin_fn red_f32_table[RED_NUM_OPS] = {
    red_f32_sum,
    red_f32_prod,
    red_f32_max,
    red_f32_min,
};

/* ---- Scale (pre-multiplied sum) ---------------------------------------------------------- */

/* The scalar is read once, before the loop, so it may point into dst. */
#define RED_DEF_SCALE(name, M, T, LOADS)                                                           \
    RED_CLONES static void name(void *dst_, const void *src_, const void *scalar, size_t n)        \
    {                                                                                              \
        M *dst = dst_;                                                                             \
        const M *src = src_;                                                                       \
        T s = LOADS(scalar);                                                                       \
        for (size_t i = 0; i < n; i++) {                                                           \
            T x = src[i];                                                                          \
            dst[i] = RED_OP_PROD(T, x, s);                                                         \
        }                                                                                          \
    }

#define RED_LOAD_U8(p) (*(const red_m_u8 *)(p))
#define RED_LOAD_U32(p) (*(const red_m_u32 *)(p))
#define RED_LOAD_U64(p) (*(const red_m_u64 *)(p))
#define RED_LOAD_F32(p) (*(const red_m_f32 *)(p))
#define RED_LOAD_F64(p) (*(const red_m_f64 *)(p))

RED_DEF_SCALE(red_u8_scale, red_m_u8, uint8_t, RED_LOAD_U8)
RED_DEF_SCALE(red_u32_scale, red_m_u32, uint32_t, RED_LOAD_U32)
RED_DEF_SCALE(red_u64_scale, red_m_u64, uint64_t, RED_LOAD_U64)
RED_DEF_SCALE(red_f32_scale, red_m_f32, float, RED_LOAD_F32)
RED_DEF_SCALE(red_f64_scale, red_m_f64, double, RED_LOAD_F64)

/* ---- Divide (avg) ------------------------------------------------------------------------ */

/* There is no SIMD integer division. 8- and 32-bit quotients go through float/double instead,
 * which is exact: for |x| < 2^w and a real quotient q = x/d that is not an integer, q lies at
 * least 1/d from the next integer while the rounding error is below 2^(w-p)/d (p = 24 or 53), so
 * truncating the rounded quotient gives C's truncated integer quotient. The divisor is >= 1. */

RED_CLONES static void red_i8_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_i8 *dst = dst_;
    const red_m_i8 *src = src_;
    float fd = (float)d; /* rounded when d > 2^24, where every quotient is 0 anyway */
    for (size_t i = 0; i < n; i++)
        dst[i] = (int8_t)((float)src[i] / fd);
}

RED_CLONES static void red_u8_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_u8 *dst = dst_;
    const red_m_u8 *src = src_;
    float fd = (float)d;
    for (size_t i = 0; i < n; i++)
        dst[i] = (uint8_t)(int32_t)((float)src[i] / fd);
}

RED_CLONES static void red_i32_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_i32 *dst = dst_;
    const red_m_i32 *src = src_;
    double dd = d;
    for (size_t i = 0; i < n; i++)
        dst[i] = (int32_t)((double)src[i] / dd);
}

/* AVX2 has no unsigned 32-bit conversions, so bias through int32 (exact). Needs d >= 2 so that
 * the quotient fits int32 on the way back. */
RED_CLONES static void red_u32_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_u32 *dst = dst_;
    const red_m_u32 *src = src_;
    double dd = d;
    for (size_t i = 0; i < n; i++) {
        double x = (double)(int32_t)(src[i] ^ 0x80000000u) + 2147483648.0;
        dst[i] = (uint32_t)(int32_t)(x / dd);
    }
}

/* 64-bit: a shift for powers of two (the common rank counts), otherwise the round-up
 * multiply-high method (Granlund and Montgomery 1994; Hacker's Delight 10-8): a 64x64->128
 * multiply per element instead of a 30-90 cycle div. */
__extension__ typedef unsigned __int128 red_u128;

typedef struct {
    uint64_t magic;
    unsigned shift; /* powers of two: log2 d; otherwise ceil(log2 d) - 1 */
    int pow2;
} red_udiv_t;

static red_udiv_t red_udiv_prepare(uint64_t d)
{
    unsigned l = 0;
    while ((1ull << l) < d)
        l++; /* d < 2^31 */
    if ((d & (d - 1)) == 0) return (red_udiv_t){0, l, 1};
    uint64_t magic = (uint64_t)((((red_u128)((1ull << l) - d)) << 64) / d) + 1;
    return (red_udiv_t){magic, l - 1, 0};
}

static inline uint64_t red_udiv_magic(uint64_t x, uint64_t magic, unsigned shift)
{
    uint64_t t = (uint64_t)(((red_u128)magic * x) >> 64);
    return (t + ((x - t) >> 1)) >> shift;
}

RED_CLONES static void red_u64_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_u64 *dst = dst_;
    const red_m_u64 *src = src_;
    red_udiv_t u = red_udiv_prepare((uint64_t)d);
    if (u.pow2) {
        for (size_t i = 0; i < n; i++)
            dst[i] = src[i] >> u.shift;
    } else {
        for (size_t i = 0; i < n; i++)
            dst[i] = red_udiv_magic(src[i], u.magic, u.shift);
    }
}

/* Truncation toward zero is sign(x) * (|x| / d), |x| taken in uint64 so INT64_MIN is fine. */
RED_CLONES static void red_i64_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_i64 *dst = dst_;
    const red_m_i64 *src = src_;
    red_udiv_t u = red_udiv_prepare((uint64_t)d);
    if (u.pow2) {
        for (size_t i = 0; i < n; i++) {
            uint64_t x = (uint64_t)src[i], neg = x >> 63;
            uint64_t q = (neg ? 0 - x : x) >> u.shift;
            dst[i] = (int64_t)(neg ? 0 - q : q);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint64_t x = (uint64_t)src[i], neg = x >> 63;
            uint64_t q = red_udiv_magic(neg ? 0 - x : x, u.magic, u.shift);
            dst[i] = (int64_t)(neg ? 0 - q : q);
        }
    }
}

RED_CLONES static void red_f32_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_f32 *dst = dst_;
    const red_m_f32 *src = src_;
    float fd = (float)d;
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] / fd;
}

RED_CLONES static void red_f64_div(void *dst_, const void *src_, int d, size_t n)
{
    red_m_f64 *dst = dst_;
    const red_m_f64 *src = src_;
    double dd = d;
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i] / dd;
}

/* ---- Float16 / bfloat16 ------------------------------------------------------------------ */

/* Two inputs (the allreduce hot path) run as one fused loop: widen, combine in float32, narrow
 * (bfloat16 always, float16 with F16C). Everything else runs in blocks: widen each input block
 * into an L1-resident float32 buffer, combine with the float32 loops above, narrow once; there
 * the conversions are separate loops, which vectorise without register spills. Either way the
 * float32 step is exactly the loomFloat32 operation. */
#define RED_HBLOCK 1024

typedef void (*red_widen_fn)(float *dst, const void *src, size_t n);
typedef void (*red_narrow_fn)(void *dst, const float *src, size_t n);

/* Exact aliasing of dst with a or b is safe for the same reason as in RED_DEF_BIN. */
#define RED_DEF_BIN16(name, WIDEN, NARROW, OP)                                                     \
    RED_CLONES static void name(void *dst_, const void *a_, const void *b_, size_t n)              \
    {                                                                                              \
        red_m_u16 *dst = dst_;                                                                     \
        const red_m_u16 *a = a_, *b = b_;                                                          \
        for (size_t i = 0; i < n; i++) {                                                           \
            float x = WIDEN(a[i]), y = WIDEN(b[i]);                                                \
            dst[i] = NARROW(OP(float, x, y));                                                      \
        }                                                                                          \
    }

RED_DEF_BIN16(red_bf16_sum, red_bf2f, red_f2bf, RED_OP_SUM)
RED_DEF_BIN16(red_bf16_prod, red_bf2f, red_f2bf, RED_OP_PROD)
RED_DEF_BIN16(red_bf16_max, red_bf2f, red_f2bf, RED_OP_MAX)
RED_DEF_BIN16(red_bf16_min, red_bf2f, red_f2bf, RED_OP_MIN)

RED_CLONES static void red_h2f_bits(float *restrict dst, const void *src_, size_t n)
{
    const red_m_u16 *src = src_;
    for (size_t i = 0; i < n; i++)
        dst[i] = red_h2f(src[i]);
}

RED_CLONES static void red_f2h_bits(void *dst_, const float *restrict src, size_t n)
{
    red_m_u16 *dst = dst_;
    for (size_t i = 0; i < n; i++)
        dst[i] = red_f2h(src[i]);
}

RED_CLONES static void red_bf2f_block(float *restrict dst, const void *src_, size_t n)
{
    const red_m_u16 *src = src_;
    for (size_t i = 0; i < n; i++)
        dst[i] = red_bf2f(src[i]);
}

RED_CLONES static void red_f2bf_block(void *dst_, const float *restrict src, size_t n)
{
    red_m_u16 *dst = dst_;
    for (size_t i = 0; i < n; i++)
        dst[i] = red_f2bf(src[i]);
}

static void red_16_apply_n(loomDataType_t type, red_op_t op, void *dst, const void *const *srcs,
                           int k, size_t n);

#ifdef RED_X86_DISPATCH
/* In bit tricks a half conversion is some twenty vector operations per direction, which leaves
 * half well below memory speed; F16C does it in one instruction. F16C cannot go into a
 * target_clones body (the baseline copy could not compile it), so these functions get their own
 * ifuncs below. The hardware rounds to nearest even (immediate rounding mode, not MXCSR), quiets
 * a NaN keeping its top payload bits and converts subnormals exactly: the same results as the
 * bit tricks, which also do the tails. */
__attribute__((target("f16c"))) static void red_h2f_f16c(float *restrict dst, const void *src,
                                                         size_t n)
{
    const char *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 2 * i))));
    for (; i < n; i++)
        dst[i] = red_h2f(((const red_m_u16 *)src)[i]);
}

__attribute__((target("f16c"))) static void red_f2h_f16c(void *dst, const float *restrict src,
                                                         size_t n)
{
    char *d = dst;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        ((red_m_u16 *)dst)[i] = red_f2h(src[i]);
}

/* _mm256_max_ps(x, y) is x > y ? x : y and _mm256_min_ps(x, y) is x < y ? x : y, as RED_OP_*.
 * Both inputs of 8 elements are loaded before their 8 results are stored, so exact aliasing is
 * safe. */
#define RED_DEF_F16C_BIN(name, VOP, OP)                                                            \
    __attribute__((target("f16c"))) static void name(void *dst, const void *a, const void *b,      \
                                                     size_t n)                                     \
    {                                                                                              \
        char *d = dst;                                                                             \
        const char *x = a, *y = b;                                                                 \
        size_t i = 0;                                                                              \
        for (; i + 8 <= n; i += 8) {                                                               \
            __m256 fx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + 2 * i)));            \
            __m256 fy = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + 2 * i)));            \
            _mm_storeu_si128((__m128i *)(d + 2 * i),                                               \
                             _mm256_cvtps_ph(VOP(fx, fy), _MM_FROUND_TO_NEAREST_INT));             \
        }                                                                                          \
        const red_m_u16 *ta = a, *tb = b;                                                          \
        for (; i < n; i++) {                                                                       \
            float fx = red_h2f(ta[i]), fy = red_h2f(tb[i]);                                        \
            ((red_m_u16 *)dst)[i] = red_f2h(OP(float, fx, fy));                                    \
        }                                                                                          \
    }

RED_DEF_F16C_BIN(red_f16_sum_f16c, _mm256_add_ps, RED_OP_SUM)
RED_DEF_F16C_BIN(red_f16_prod_f16c, _mm256_mul_ps, RED_OP_PROD)
RED_DEF_F16C_BIN(red_f16_max_f16c, _mm256_max_ps, RED_OP_MAX)
RED_DEF_F16C_BIN(red_f16_min_f16c, _mm256_min_ps, RED_OP_MIN)

typedef void (*red_apply2_fn)(red_op_t op, void *dst, const void *a, const void *b, size_t n);

static void red_f16_apply2_f16c(red_op_t op, void *dst, const void *a, const void *b, size_t n)
{
    static const red_bin_fn table[RED_NUM_OPS] = {
        red_f16_sum_f16c,
        red_f16_prod_f16c,
        red_f16_max_f16c,
        red_f16_min_f16c,
    };
    table[op](dst, a, b, n);
}

static void red_f16_apply2_bits(red_op_t op, void *dst, const void *a, const void *b, size_t n)
{
    const void *srcs[2] = {a, b};
    red_16_apply_n(loomFloat16, op, dst, srcs, 2, n);
}

static int red_have_f16c(void)
{
    __builtin_cpu_init(); /* resolvers run before constructors */
    return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}

static red_widen_fn red_resolve_h2f(void)
{
    return red_have_f16c() ? red_h2f_f16c : red_h2f_bits;
}

static red_narrow_fn red_resolve_f2h(void)
{
    return red_have_f16c() ? red_f2h_f16c : red_f2h_bits;
}

static red_apply2_fn red_resolve_f16_apply2(void)
{
    return red_have_f16c() ? red_f16_apply2_f16c : red_f16_apply2_bits;
}

static void red_h2f_block(float *dst, const void *src, size_t n)
    __attribute__((ifunc("red_resolve_h2f")));
static void red_f2h_block(void *dst, const float *src, size_t n)
    __attribute__((ifunc("red_resolve_f2h")));
static void red_f16_apply2(red_op_t op, void *dst, const void *a, const void *b, size_t n)
    __attribute__((ifunc("red_resolve_f16_apply2")));
#else
#define red_h2f_block red_h2f_bits
#define red_f2h_block red_f2h_bits

static void red_f16_apply2(red_op_t op, void *dst, const void *a, const void *b, size_t n)
{
    const void *srcs[2] = {a, b};
    red_16_apply_n(loomFloat16, op, dst, srcs, 2, n);
}
#endif

/* k inputs folded in order in float32 and rounded once. Every input of a block is read before
 * that block of dst is written, so dst may equal any source. */
static void red_16_apply_n(loomDataType_t type, red_op_t op, void *dst, const void *const *srcs,
                           int k, size_t n)
{
    red_widen_fn widen = type == loomFloat16 ? red_h2f_block : red_bf2f_block;
    red_narrow_fn narrow = type == loomFloat16 ? red_f2h_block : red_f2bf_block;
    red_bin_fn fn = red_f32_table[op];
    _Alignas(64) float acc[RED_HBLOCK], in[RED_HBLOCK];
    for (size_t off = 0; off < n; off += RED_HBLOCK) {
        size_t m = n - off < RED_HBLOCK ? n - off : RED_HBLOCK;
        widen(acc, (const uint16_t *)srcs[0] + off, m);
        for (int j = 1; j < k; j++) {
            widen(in, (const uint16_t *)srcs[j] + off, m);
            fn(acc, acc, in, m);
        }
        narrow((uint16_t *)dst + off, acc, m);
    }
}

static void red_16_scale(loomDataType_t type, void *dst, const void *src, const void *scalar,
                         size_t n)
{
    red_widen_fn widen = type == loomFloat16 ? red_h2f_block : red_bf2f_block;
    red_narrow_fn narrow = type == loomFloat16 ? red_f2h_block : red_f2bf_block;
    float s;
    widen(&s, scalar, 1);
    _Alignas(64) float acc[RED_HBLOCK];
    for (size_t off = 0; off < n; off += RED_HBLOCK) {
        size_t m = n - off < RED_HBLOCK ? n - off : RED_HBLOCK;
        widen(acc, (const uint16_t *)src + off, m);
        red_f32_scale(acc, acc, &s, m);
        narrow((uint16_t *)dst + off, acc, m);
    }
}

static void red_16_div(loomDataType_t type, void *dst, const void *src, int divisor, size_t n)
{
    red_widen_fn widen = type == loomFloat16 ? red_h2f_block : red_bf2f_block;
    red_narrow_fn narrow = type == loomFloat16 ? red_f2h_block : red_f2bf_block;
    _Alignas(64) float acc[RED_HBLOCK];
    for (size_t off = 0; off < n; off += RED_HBLOCK) {
        size_t m = n - off < RED_HBLOCK ? n - off : RED_HBLOCK;
        widen(acc, (const uint16_t *)src + off, m);
        red_f32_div(acc, acc, divisor, m);
        narrow((uint16_t *)dst + off, acc, m);
    }
}

/* Indexed by loomDataType_t (whose values are fixed, NCCL's numbering) then red_op_t; float16
 * goes through red_f16_apply2 instead. */
static const red_bin_fn red_bin_table[loomNumTypes][RED_NUM_OPS] = {
    [loomInt8] = {red_u8_sum, red_u8_prod, red_i8_max, red_i8_min},
    [loomUint8] = {red_u8_sum, red_u8_prod, red_u8_max, red_u8_min},
    [loomInt32] = {red_u32_sum, red_u32_prod, red_i32_max, red_i32_min},
    [loomUint32] = {red_u32_sum, red_u32_prod, red_u32_max, red_u32_min},
    [loomInt64] = {red_u64_sum, red_u64_prod, red_i64_max, red_i64_min},
    [loomUint64] = {red_u64_sum, red_u64_prod, red_u64_max, red_u64_min},
    [loomFloat32] = {red_f32_sum, red_f32_prod, red_f32_max, red_f32_min},
    [loomFloat64] = {red_f64_sum, red_f64_prod, red_f64_max, red_f64_min},
    [loomBfloat16] = {red_bf16_sum, red_bf16_prod, red_bf16_max, red_bf16_min},
};

static int red_is16(loomDataType_t type)
{
    return type == loomFloat16 || type == loomBfloat16;
}

static int red_is8f(loomDataType_t type)
{
    return type == loomFloat8e4m3 || type == loomFloat8e5m2;
}

/* ---- Types ------------------------------------------------------------------------------- */

size_t red_type_size(loomDataType_t type)
{
    switch (type) {
    case loomInt8:
    case loomUint8:
    case loomFloat8e4m3:
    case loomFloat8e5m2: return 1;
    case loomFloat16:
    case loomBfloat16: return 2;
    case loomInt32:
    case loomUint32:
    case loomFloat32: return 4;
    case loomInt64:
    case loomUint64:
    case loomFloat64: return 8;
    default: return 0;
    }
}

const char *red_type_name(loomDataType_t type)
{
    static const char *const names[loomNumTypes] = {
        "int8",    "uint8",   "int32",   "uint32",   "int64",      "uint64",
        "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2",
    };
    if ((unsigned)type >= loomNumTypes) return "invalid";
    return names[type];
}

static int red_valid(loomDataType_t type, red_op_t op)
{
    return (unsigned)type < loomNumTypes && (unsigned)op < RED_NUM_OPS;
}

/* ---- Public entry points ----------------------------------------------------------------- */

/* Invalid type or op: nothing is written (callers validate; this only keeps a bad value from
 * indexing past the tables). */
void red_host_apply(loomDataType_t type, red_op_t op, void *dst, const void *a, const void *b,
                    size_t n)
{
    if (!red_valid(type, op) || n == 0) return;
    if (red_is8f(type)) {
        const void *srcs[2] = {a, b};
        red_fp8_apply_n(type, op, dst, srcs, 2, n);
    } else if (type == loomFloat16)
        red_f16_apply2(op, dst, a, b, n);
    else
        red_bin_table[type][op](dst, a, b, n);
}

void red_host_apply_n(loomDataType_t type, red_op_t op, void *dst, const void *const *srcs, int k,
                      size_t n)
{
    if (!red_valid(type, op) || k < 1 || n == 0) return;
    size_t size = red_type_size(type);
    if (k == 1) {
        if (dst != srcs[0]) memmove(dst, srcs[0], n * size);
        return;
    }
    if (k == 2) {
        red_host_apply(type, op, dst, srcs[0], srcs[1], n);
        return;
    }
    if (red_is16(type)) {
        red_16_apply_n(type, op, dst, srcs, k, n);
        return;
    }
    if (red_is8f(type)) {
        red_fp8_apply_n(type, op, dst, srcs, k, n);
        return;
    }
    red_bin_fn fn = red_bin_table[type][op];
    /* Folding pass by pass over dst would stream dst through memory k-1 times; a cache-resident
     * block accumulator reads each input once and writes dst once. The last step writes dst
     * directly, after every input of the block has been read, so dst may equal any source. */
    _Alignas(64) unsigned char acc[RED_NBLOCK_BYTES];
    size_t block = sizeof(acc) / size;
    for (size_t off = 0; off < n; off += block) {
        size_t m = n - off < block ? n - off : block;
        size_t at = off * size;
        fn(acc, (const char *)srcs[0] + at, (const char *)srcs[1] + at, m);
        for (int j = 2; j < k - 1; j++)
            fn(acc, acc, (const char *)srcs[j] + at, m);
        fn((char *)dst + at, acc, (const char *)srcs[k - 1] + at, m);
    }
}

void red_host_scale(loomDataType_t type, void *dst, const void *src, const void *scalar, size_t n)
{
    static const red_scale_fn table[loomNumTypes] = {
        [loomInt8] = red_u8_scale,     [loomUint8] = red_u8_scale,    [loomInt32] = red_u32_scale,
        [loomUint32] = red_u32_scale,  [loomInt64] = red_u64_scale,   [loomUint64] = red_u64_scale,
        [loomFloat32] = red_f32_scale, [loomFloat64] = red_f64_scale,
    };
    if ((unsigned)type >= loomNumTypes || n == 0) return;
    if (red_is16(type))
        red_16_scale(type, dst, src, scalar, n);
    else if (red_is8f(type))
        red_fp8_scale(type, dst, src, scalar, n);
    else
        table[type](dst, src, scalar, n);
}

void red_host_div(loomDataType_t type, void *dst, const void *src, int divisor, size_t n)
{
    static const red_div_fn table[loomNumTypes] = {
        [loomInt8] = red_i8_div,     [loomUint8] = red_u8_div,    [loomInt32] = red_i32_div,
        [loomUint32] = red_u32_div,  [loomInt64] = red_i64_div,   [loomUint64] = red_u64_div,
        [loomFloat32] = red_f32_div, [loomFloat64] = red_f64_div,
    };
    if ((unsigned)type >= loomNumTypes || n == 0 || divisor < 1) return;
    if (divisor == 1) {
        /* x / 1 == x for every type (a NaN keeps its bits here, where a divide would quiet it). */
        if (dst != src) memmove(dst, src, n * red_type_size(type));
        return;
    }
    if (red_is16(type))
        red_16_div(type, dst, src, divisor, n);
    else if (red_is8f(type))
        red_fp8_div(type, dst, src, divisor, n);
    else
        table[type](dst, src, divisor, n);
}

void red_widen16(loomDataType_t type, float *dst, const void *src, size_t n)
{
    if (type == loomFloat16)
        red_h2f_block(dst, src, n);
    else
        red_bf2f_block(dst, src, n);
}

void red_narrow16(loomDataType_t type, void *dst, const float *src, size_t n)
{
    if (type == loomFloat16)
        red_f2h_block(dst, src, n);
    else
        red_f2bf_block(dst, src, n);
}
