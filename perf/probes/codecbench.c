/*
 * codecbench: the fusion wire codec's speed (src/fusion/fuse.c), one core, in ns per element:
 * fuse_encode (with its per-chunk error bound) and fuse_decode (plain, and accumulating), for the
 * bf16 and fp16 wires over 4 Mi float32 values of mixed magnitudes; the best of 10 runs each.
 * usage: codecbench [ELEMENTS]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fuse.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)1 << 22;
    n = (n + FUSE_CHUNK - 1) / FUSE_CHUNK * FUSE_CHUNK;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint8_t *w = malloc(fuse_wire_bytes(n));
    if (!x || !y || !w) return 1;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 7) % 17 + 1) * (i % 3 ? 0.37f : -1.9e-3f);
    for (int wire = loomFusionWireBf16; wire <= loomFusionWireFp16; wire++) {
        double best[3] = {1e9, 1e9, 1e9};
        for (int r = 0; r < 10; r++) {
            double t0 = now();
            fuse_encode(wire, x, n, n, NULL, w);
            double t1 = now();
            fuse_decode(wire, w, n, y, false, NULL, NULL);
            double t2 = now();
            fuse_decode(wire, w, n, y, true, NULL, NULL);
            double t3 = now();
            double t[3] = {t1 - t0, t2 - t1, t3 - t2};
            for (int k = 0; k < 3; k++)
                best[k] = t[k] < best[k] ? t[k] : best[k];
        }
        printf("codecbench %s, %zu values: encode %.2f ns, decode %.2f ns, decode+add %.2f ns per "
               "value\n",
               wire == loomFusionWireBf16 ? "bf16" : "fp16", n, best[0] / n * 1e9,
               best[1] / n * 1e9, best[2] / n * 1e9);
    }
    return 0;
}
