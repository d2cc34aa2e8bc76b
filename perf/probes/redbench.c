/*
 * redbench: host reduction speed (src/base/reduce.c), per data type, for a cache-resident and a
 * memory-sized buffer: dst = a + b (red_host_apply, the allreduce's step) and an 8-input
 * red_host_apply_n. Prints GB/s of input read (best of REPS runs) at the CPU level in use, or at
 * every level this CPU runs with --all-levels.
 * usage: redbench [--all-levels] [SMALL_KIB] [BIG_MIB] [REPS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reduce.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Best seconds per call of red_host_apply (k == 2) or red_host_apply_n over `bytes`. */
static double time_one(loomDataType_t t, int k, char **bufs, char *dst, size_t bytes, int reps)
{
    size_t n = bytes / red_type_size(t);
    const void *srcs[8];
    for (int j = 0; j < k; j++)
        srcs[j] = bufs[j];
    size_t inner = bytes >= (8u << 20) ? 1 : (64u << 20) / bytes; /* ~64 MiB per timing */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (size_t i = 0; i < inner; i++) {
            if (k == 2)
                red_host_apply(t, RED_SUM, dst, srcs[0], srcs[1], n);
            else
                red_host_apply_n(t, RED_SUM, dst, srcs, k, n);
        }
        double dt = (now() - t0) / (double)inner;
        if (dt < best) best = dt;
    }
    return best;
}

static void run_level(size_t small, size_t big, int reps)
{
    static const loomDataType_t types[] = {loomInt8,    loomInt32,   loomInt64,   loomFloat16,
                                           loomFloat32, loomFloat64, loomBfloat16};
    char *bufs[8], *dst = malloc(big);
    for (int j = 0; j < 8; j++) {
        bufs[j] = malloc(big);
        for (size_t i = 0; i < big; i++)
            bufs[j][i] = (char)((i * 7 + (size_t)j) & 0x3f); /* small finite values for halves */
    }
    memset(dst, 0, big);
    printf("level %s\n", red_host_isa());
    printf("%-9s %12s %12s %12s %12s\n", "type", "2in-small", "2in-big", "8in-small", "8in-big");
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        double r[4];
        size_t sz[4] = {small, big, small, big};
        int ks[4] = {2, 2, 8, 8};
        for (int c = 0; c < 4; c++)
            r[c] = (double)sz[c] * ks[c] / time_one(types[i], ks[c], bufs, dst, sz[c], reps) / 1e9;
        printf("%-9s %9.2f GB/s %7.2f GB/s %7.2f GB/s %7.2f GB/s\n", red_type_name(types[i]), r[0],
               r[1], r[2], r[3]);
    }
    for (int j = 0; j < 8; j++)
        free(bufs[j]);
    free(dst);
}

int main(int argc, char **argv)
{
    int all = 0, a = 1;
    if (argc > 1 && strcmp(argv[1], "--all-levels") == 0) all = 1, a = 2;
    size_t small = (size_t)(argc > a ? atoi(argv[a]) : 64) << 10;
    size_t big = (size_t)(argc > a + 1 ? atoi(argv[a + 1]) : 64) << 20;
    int reps = argc > a + 2 ? atoi(argv[a + 2]) : 5;
    if (!all) {
        run_level(small, big, reps);
        return 0;
    }
    for (int level = 0; level < 8; level++)
        if (red_host_isa_set(level)) run_level(small, big, reps);
    return 0;
}
