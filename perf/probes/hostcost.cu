/*
 * hostcost: what each driver call on loom's per-call host path costs the calling thread, on one
 * GPU, in ns per call (median of 7 batches of 2048; the stream synchronised between batches,
 * outside the timing, so a full launch queue never blocks the host).
 *
 * With P > 1, P processes measure at once, process i on GPU i mod (GPUs), as the ranks of a
 * benchmark launch side by side.
 *
 * build: nvcc -O3 -arch=sm_90 -o hostcost perf/probes/hostcost.cu -lcuda
 * usage: hostcost [P]
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "probe.h"

struct big {
    char b[656]; /* about loom's dev_args_t */
};
struct small {
    char b[96];
};

extern "C" __global__ void k_small(const __grid_constant__ small a)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (a.b[0] == 42 && threadIdx.x == 999) printf("x");
}
extern "C" __global__ void k_big(const __grid_constant__ big a)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (a.b[0] == 42 && threadIdx.x == 999) printf("x");
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static CUstream st;
static CUevent ev;
static CUfunction fs, fb;
static CUdeviceptr dptr;
static void *hptr;
static small as;
static big ab;

static unsigned nthreads = 32;

static void launch(CUfunction f, void *arg, int pdl)
{
    void *params[] = {arg};
    if (!pdl) {
        DK(cuLaunchKernel(f, 1, 1, 1, nthreads, 1, 1, 0, st, params, NULL));
        return;
    }
    CUlaunchAttribute at;
    memset(&at, 0, sizeof(at));
    at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    at.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = nthreads;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = st;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    DK(cuLaunchKernelEx(&cfg, f, params, NULL));
}

static void op(int which)
{
    switch (which) {
    case 0: {
        CUcontext c;
        cuCtxGetCurrent(&c);
        break;
    }
    case 1: {
        CUstreamCaptureStatus cs;
        cuStreamIsCapturing(st, &cs);
        break;
    }
    case 2:
    case 3: {
        unsigned type = 0, managed = 0;
        int ord = -1;
        CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                     CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                     CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
        void *val[3] = {&type, &managed, &ord};
        cuPointerGetAttributes(3, at, val, which == 2 ? dptr : (CUdeviceptr)hptr);
        break;
    }
    case 4: DK(cuEventRecord(ev, st)); break;
    case 5: launch(fs, &as, 0); break;
    case 6: launch(fb, &ab, 0); break;
    case 7: launch(fs, &as, 1); break;
    case 8: launch(fb, &ab, 1); break;
    case 9:
        launch(fb, &ab, 1);
        DK(cuEventRecord(ev, st));
        break;
    case 10: DK(cuStreamWaitEvent(st, ev, 0)); break;
    case 11: {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        break;
    }
    case 13:
        nthreads = 512;
        launch(fb, &ab, 1);
        nthreads = 32;
        break;
    case 12: {
        void *volatile p = calloc(1, 512);
        free(p);
        break;
    }
    }
}

static const char *names[] = {"cuCtxGetCurrent",
                              "cuStreamIsCapturing",
                              "cuPointerGetAttributes (device buffer, 3 attributes)",
                              "cuPointerGetAttributes (malloc'd host buffer)",
                              "cuEventRecord",
                              "cuLaunchKernel, 96-byte arguments",
                              "cuLaunchKernel, 656-byte arguments",
                              "cuLaunchKernelEx + PDL, 96-byte arguments",
                              "cuLaunchKernelEx + PDL, 656-byte arguments",
                              "cuLaunchKernelEx + PDL 656 B, then cuEventRecord",
                              "cuStreamWaitEvent (event already complete)",
                              "clock_gettime(CLOCK_MONOTONIC)",
                              "calloc + free of 512 bytes",
                              "cuLaunchKernelEx + PDL, 656-byte arguments, 512 threads"};

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int procs = argc > 1 ? atoi(argv[1]) : 1, me = 0;
    for (int i = 1; i < procs; i++)
        if (fork() == 0) {
            me = i;
            break;
        }
    DK(cuInit(0));
    int ngpu = 1;
    DK(cuDeviceGetCount(&ngpu));
    if (cudaSetDevice(me % ngpu) != cudaSuccess || cudaFree(0) != cudaSuccess) {
        fprintf(stderr, "hostcost: no usable GPU\n");
        return 77;
    }
    DK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    DK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    DK(cuMemAlloc(&dptr, 1 << 20));
    hptr = malloc(1 << 20);
    cudaFunction_t f1, f2;
    if (cudaGetFuncBySymbol(&f1, (const void *)k_small) != cudaSuccess ||
        cudaGetFuncBySymbol(&f2, (const void *)k_big) != cudaSuccess) {
        fprintf(stderr, "hostcost: cudaGetFuncBySymbol failed\n");
        return 1;
    }
    fs = (CUfunction)f1;
    fb = (CUfunction)f2;
    const int nops = sizeof(names) / sizeof(names[0]), batch = 2048, reps = 7;
    for (int w = 0; w < nops; w++) {
        double t[reps];
        for (int r = 0; r < reps + 1; r++) {
            double t0 = now_ns();
            for (int i = 0; i < batch; i++)
                op(w);
            double t1 = now_ns();
            DK(cuStreamSynchronize(st));
            if (r) t[r - 1] = (t1 - t0) / batch;
        }
        qsort(t, reps, sizeof(double), cmp);
        printf("%d/%d %8.0f ns  %s\n", me, procs, t[reps / 2], names[w]);
    }
    if (me == 0)
        while (wait(NULL) > 0) {
        }
    return 0;
}
