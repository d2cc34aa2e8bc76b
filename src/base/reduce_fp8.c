/*
 * 8-bit floats on the host: loomFloat8e4m3 (OCP E4M3, "FN": bias 7, no infinities, one NaN
 * pattern per sign, largest finite 448) and loomFloat8e5m2 (bias 15, IEEE-like, largest finite
 * 57344).
 *
 * Like float16 and bfloat16, every input is widened exactly to float32, combined there, and
 * rounded once per output to nearest even. Narrowing saturates to the largest finite value (what
 * NVIDIA's __nv_fp8_* constructors and the GPU's cvt.rn.satfinite do, so host and device give the
 * same bits): a result beyond the range, infinity included, becomes +-448 or +-57344, and a NaN
 * becomes the canonical NaN 0x7f of either format, sign and payload dropped, as the GPU writes it.
 *
 * These are slow loops compared with the native types (a table lookup per input, a few integer
 * operations per output); fp8 traffic is small and the float32 combine dominates anyway.
 */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "reduce.h"

typedef uint8_t red_m8 __attribute__((aligned(1)));

typedef struct {
    int exp_bits, man_bits, bias;
    uint8_t max_finite; /* the magnitude code of the largest finite value */
    bool has_inf;       /* E5M2: exponent all ones is infinity (mantissa 0) or NaN */
} fp8_fmt_t;

static const fp8_fmt_t fmt_e4m3 = {4, 3, 7, 0x7e, false};
static const fp8_fmt_t fmt_e5m2 = {5, 2, 15, 0x7b, true};

static const fp8_fmt_t *fp8_fmt(loomDataType_t type)
{
    return type == loomFloat8e4m3 ? &fmt_e4m3 : &fmt_e5m2;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Exact: every fp8 value is a float32. */
static float fp8_decode(const fp8_fmt_t *m, uint8_t v)
{
    uint32_t sign = (uint32_t)(v >> 7) << 31;
    int e = (v >> m->man_bits) & ((1 << m->exp_bits) - 1);
    uint32_t man = v & ((1u << m->man_bits) - 1);
    int emax = (1 << m->exp_bits) - 1;
    if (m->has_inf && e == emax) return u2f(sign | 0x7f800000u | (man << (23 - m->man_bits)));
    if (!m->has_inf && e == emax && man == (1u << m->man_bits) - 1) return u2f(sign | 0x7fc00000u);
    if (e == 0) { /* subnormal: man * 2^(1 - bias - man_bits) */
        float f = (float)man;
        for (int i = 0; i < m->bias - 1 + m->man_bits; i++)
            f *= 0.5f;
        return u2f(sign | f2u(f));
    }
    return u2f(sign | (uint32_t)(e - m->bias + 127) << 23 | man << (23 - m->man_bits));
}

/* Round to nearest even, saturating to the largest finite value. */
static uint8_t fp8_encode(const fp8_fmt_t *m, float f)
{
    uint32_t u = f2u(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f; /* NaN */
    int shift_man = 23 - m->man_bits;
    int e = (int)(a >> 23) - 127 + m->bias; /* the fp8 exponent field if normal */
    uint32_t code;
    if (e >= 1) {
        /* normal: keep man_bits of the mantissa, round the rest */
        uint32_t mant = a & 0x7fffffu;
        code = ((uint32_t)e << m->man_bits) | (mant >> shift_man);
        uint32_t rest = mant & ((1u << shift_man) - 1), half = 1u << (shift_man - 1);
        if (rest > half || (rest == half && (code & 1))) code++;
    } else {
        /* subnormal (or zero): the value in units of the smallest subnormal, rounded */
        int shift = shift_man + 1 - e; /* >= shift_man + 1 */
        if (shift > 31) return sign;   /* below half the smallest subnormal (float32 ones too) */
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        code = mant >> shift;
        uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (code & 1))) code++;
    }
    if (code > m->max_finite) code = m->max_finite; /* beyond the range, infinity included */
    return sign | (uint8_t)code;
}

/* Decoding is a table per format, filled once (pthread_once) at first use. */
static float fp8_table[2][256];
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;

static void fp8_fill(void)
{
    for (int v = 0; v < 256; v++) {
        fp8_table[0][v] = fp8_decode(&fmt_e4m3, (uint8_t)v);
        fp8_table[1][v] = fp8_decode(&fmt_e5m2, (uint8_t)v);
    }
}

static const float *fp8_widen_table(loomDataType_t type)
{
    pthread_once(&fp8_once, fp8_fill);
    return fp8_table[type == loomFloat8e4m3 ? 0 : 1];
}

float red_fp8_to_float(loomDataType_t type, uint8_t v)
{
    return fp8_widen_table(type)[v];
}

uint8_t red_float_to_fp8(loomDataType_t type, float f)
{
    return fp8_encode(fp8_fmt(type), f);
}

static float fp8_op(red_op_t op, float x, float y)
{
    switch (op) {
    case RED_SUM: return x + y;
    case RED_PROD: return x * y;
    case RED_MAX: return x > y ? x : y;
    default: return x < y ? x : y;
    }
}

/* k inputs folded in order in float32, rounded once; dst may equal any source (each element's
 * inputs are read before it is written). */
void red_fp8_apply_n(loomDataType_t type, red_op_t op, void *dst, const void *const *srcs, int k,
                     size_t n)
{
    const float *w = fp8_widen_table(type);
    const fp8_fmt_t *m = fp8_fmt(type);
    red_m8 *d = dst;
    for (size_t i = 0; i < n; i++) {
        float acc = w[((const red_m8 *)srcs[0])[i]];
        for (int j = 1; j < k; j++)
            acc = fp8_op(op, acc, w[((const red_m8 *)srcs[j])[i]]);
        d[i] = fp8_encode(m, acc);
    }
}

void red_fp8_scale(loomDataType_t type, void *dst, const void *src, const void *scalar, size_t n)
{
    const float *w = fp8_widen_table(type);
    const fp8_fmt_t *m = fp8_fmt(type);
    float s = w[*(const uint8_t *)scalar];
    const red_m8 *in = src;
    red_m8 *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = fp8_encode(m, w[in[i]] * s);
}

void red_fp8_div(loomDataType_t type, void *dst, const void *src, int divisor, size_t n)
{
    const float *w = fp8_widen_table(type);
    const fp8_fmt_t *m = fp8_fmt(type);
    float fd = (float)divisor;
    const red_m8 *in = src;
    red_m8 *d = dst;
    for (size_t i = 0; i < n; i++)
        d[i] = fp8_encode(m, w[in[i]] / fd);
}
