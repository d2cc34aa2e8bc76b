/*
 * The shim header's half of tests/test_shim_abi.c: evaluates nccl_abi.def under loom's
 * src/shim/nccl.h. The test evaluates the same list under NVIDIA's nccl.h (the two headers
 * cannot meet in one translation unit: their names clash) and compares the numbers. Linked into
 * the test only, never into the library.
 */
#include <stddef.h>

#include "nccl.h"

/* Prototypes: a mismatch with the list is a compile error here, as it is in the test for the
 * real header, so both headers declare the same types. (ncclResetDebugInit is deprecated.) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define ABI_VALUE(expr)
#define ABI_PROTO(ret, name, args)                                                                 \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret(*) args), #name);           \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&p##name), ret(*) args), "p" #name);
#define ABI_PROTO_NOP(ret, name, args) ABI_PROTO(ret, name, args)
#include "nccl_abi.def"
#undef ABI_VALUE
#undef ABI_PROTO
#undef ABI_PROTO_NOP
#pragma GCC diagnostic pop

size_t loom_shim_abi_values(long long *out, size_t max);

/* Writes up to max values in list order; returns how many the list has. */
size_t loom_shim_abi_values(long long *out, size_t max)
{
    const ncclConfig_t abi_config = NCCL_CONFIG_INITIALIZER;
    const ncclSimInfo_t abi_siminfo = NCCL_SIM_INFO_INITIALIZER;
    size_t n = 0;
#define ABI_VALUE(expr)                                                                            \
    if (n < max) out[n] = (long long)(expr);                                                       \
    n++;
#define ABI_PROTO(ret, name, args)
#define ABI_PROTO_NOP(ret, name, args)
#include "nccl_abi.def"
#undef ABI_VALUE
#undef ABI_PROTO
#undef ABI_PROTO_NOP
    (void)abi_siminfo;
    return n;
}
