/*
 * ce_rate: what the copy engines of one GPU move, for the copy-engine path's prediction
 * (perf/RESULTS.md). Copies SIZE bytes from one device buffer to another with cuMemcpyAsync,
 * cut into K pieces on K streams (K = 1, 2, 4, 8: one engine or several), and prints the rate
 * per K: the median of ROUNDS timed copies (events on the first stream around all K). A copy
 * inside one GPU reads and writes its memory, so this is the engines' rate on local memory, not
 * over NVLink (that needs two GPUs: issue 18).
 * usage: ce_rate [SIZE_BYTES] [ROUNDS]     (default 1 GiB, 9); exit 77 without a GPU
 */
#include <stdio.h>
#include <stdlib.h>

#include "cudrv.h"

#define CK(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "ce_rate: %s: %s\n", #x, cudrv_err(r_));                               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int cmp(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : (1ull << 30);
    int rounds = argc > 2 ? atoi(argv[2]) : 9;
    if (rounds < 1 || rounds > 99 || size < 4096) {
        fprintf(stderr, "usage: ce_rate [SIZE_BYTES >= 4096] [ROUNDS 1-99]\n");
        return 2;
    }
    const char *why = NULL;
    const cudrv_t *d = cudrv_get(&why);
    int ndev = 0;
    if (d == NULL || d->cuDeviceGetCount(&ndev) != CUDA_SUCCESS || ndev < 1) {
        printf("ce_rate: no GPU (%s): skipped\n", why ? why : "no device");
        return 77;
    }
    CUdevice dev;
    CUcontext ctx;
    CK(d->cuDeviceGet(&dev, 0));
    CK(d->cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(d->cuCtxSetCurrent(ctx));
    int ncopy = 0, nsm = 0;
    d->cuDeviceGetAttribute(&ncopy, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, dev);
    d->cuDeviceGetAttribute(&nsm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    CUdeviceptr a, b;
    CK(d->cuMemAlloc(&a, size));
    CK(d->cuMemAlloc(&b, size));
    CK(d->cuMemsetD8(a, 1, size));
    CUstream st[8];
    CUevent ev[8], t0, t1;
    for (int q = 0; q < 8; q++) {
        CK(d->cuStreamCreate(&st[q], CU_STREAM_NON_BLOCKING));
        CK(d->cuEventCreate(&ev[q], CU_EVENT_DISABLE_TIMING));
    }
    CK(d->cuEventCreate(&t0, 0));
    CK(d->cuEventCreate(&t1, 0));
    printf("# ce_rate: %zu bytes device to device on GPU 0 (%d async engines, %d SMs), median of "
           "%d\n# streams  GB/s\n",
           size, ncopy, nsm, rounds);
    for (int k = 1; k <= 8; k *= 2) {
        float ms[99];
        size_t piece = (size / (size_t)k + 4095) & ~(size_t)4095;
        for (int r = 0; r <= rounds; r++) {
            CK(d->cuEventRecord(t0, st[0]));
            for (int q = 1; q < k; q++)
                CK(d->cuStreamWaitEvent(st[q], t0, 0));
            for (int q = 0; q < k; q++) {
                size_t off = (size_t)q * piece;
                if (off >= size) break;
                size_t len = size - off < piece ? size - off : piece;
                CK(d->cuMemcpyAsync(b + off, a + off, len, st[q]));
                CK(d->cuEventRecord(ev[q], st[q]));
                CK(d->cuStreamWaitEvent(st[0], ev[q], 0));
            }
            CK(d->cuEventRecord(t1, st[0]));
            CK(d->cuEventSynchronize(t1));
            if (r > 0) CK(d->cuEventElapsedTime(&ms[r - 1], t0, t1)); /* the first warms up */
        }
        qsort(ms, (size_t)rounds, sizeof(float), cmp);
        printf("%9d  %.1f\n", k, (double)size / (ms[rounds / 2] * 1e-3) / 1e9);
    }
    return 0;
}
