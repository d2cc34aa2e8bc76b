/*
 * Host reductions: vectorised loops for every loom data type and op.
 *
 * Float16, bfloat16 and the 8-bit floats are converted to float32, combined, and rounded once to
 * nearest even, so a
 * step that combines k inputs rounds once, not k-1 times. Integer ops wrap as unsigned arithmetic
 * does (no undefined behaviour on overflow).
 */
#ifndef LOOM_BASE_REDUCE_H
#define LOOM_BASE_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* The element operations the executors apply. Avg and pre-multiplied sum are built from these:
 * avg is a sum followed by red_host_div on the final value; premul-sum scales each rank's own
 * input with red_host_scale before summing. */
typedef enum { RED_SUM = 0, RED_PROD = 1, RED_MAX = 2, RED_MIN = 3, RED_NUM_OPS = 4 } red_op_t;

/* Size in bytes of one element of `type` (0 for an invalid type). */
size_t red_type_size(loomDataType_t type);
/* "float32", "bfloat16", ...; "invalid" for an out-of-range type. */
const char *red_type_name(loomDataType_t type);

/* dst[i] = a[i] op b[i], i < n. dst may be the same pointer as a or b (not partially overlapping).
 */
void red_host_apply(loomDataType_t type, red_op_t op, void *dst, const void *a, const void *b,
                    size_t n);

/* dst[i] = op over j < k of srcs[j][i]; k >= 1. dst may equal srcs[0]. Half and bfloat16
 * accumulate all k inputs in float32 and round once. */
void red_host_apply_n(loomDataType_t type, red_op_t op, void *dst, const void *const *srcs, int k,
                      size_t n);

/* dst[i] = src[i] * scalar, scalar pointing to one value of `type` (pre-multiplied sum). */
void red_host_scale(loomDataType_t type, void *dst, const void *src, const void *scalar, size_t n);

/* dst[i] = src[i] / divisor (avg): integer division for integer types, and for float16/bfloat16
 * float32 division rounded once. divisor >= 1. */
void red_host_div(loomDataType_t type, void *dst, const void *src, int divisor, size_t n);

/* IEEE binary16 and bfloat16 conversions, rounding to nearest even; NaN stays NaN. */
float red_half_to_float(uint16_t h);
uint16_t red_float_to_half(float f);
float red_bf16_to_float(uint16_t b);
uint16_t red_float_to_bf16(float f);
/* The same for n values at once (type loomFloat16 or loomBfloat16), vectorised (F16C where the
 * CPU has it): what the reductions use, and fusion's 16-bit wire. */
void red_widen16(loomDataType_t type, float *dst, const void *src, size_t n);
void red_narrow16(loomDataType_t type, void *dst, const float *src, size_t n);

/* The 8-bit floats (loomFloat8e4m3, loomFloat8e5m2; reduce_fp8.c): exact widening, narrowing to
 * nearest even saturated to the largest finite value, NaN to the canonical 0x7f. */
float red_fp8_to_float(loomDataType_t type, uint8_t v);
uint8_t red_float_to_fp8(loomDataType_t type, float f);
/* red_host_apply_n, red_host_scale and red_host_div for the 8-bit floats (called through them). */
void red_fp8_apply_n(loomDataType_t type, red_op_t op, void *dst, const void *const *srcs, int k,
                     size_t n);
void red_fp8_scale(loomDataType_t type, void *dst, const void *src, const void *scalar, size_t n);
void red_fp8_div(loomDataType_t type, void *dst, const void *src, int divisor, size_t n);

#endif
