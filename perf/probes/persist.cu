/*
 * persist: what a small allreduce between two GPUs costs per call, back to back, when each call
 * is (a) its own kernel launch, or (b) a doorbell to a kernel that stays resident, ordered on the
 * caller's stream with stream memory operations (cuStreamWriteValue64 rings, cuStreamWaitValue64
 * holds the stream until the resident kernel says done). Also the floors: empty launches back to
 * back, with and without programmatic dependent launch (PDL), and a doorbell round trip to a
 * resident kernel that does no exchange; and (a) again with an event recorded after each launch
 * (does a stream operation between two kernels undo what PDL overlaps?).
 *
 * One process, one host thread per GPU (each with its own stream), peer access over NVLink.
 * Both variants do the same exchange: a thread per 8 bytes stores a 16-byte low-latency word
 * {lo, step, hi, step} into the peer's memory and polls its own for the peer's word, then sums.
 * Results are checked (exact integer-valued floats).
 *
 * build: nvcc -O3 -arch=sm_90 -o persist perf/probes/persist.cu -lcuda
 * usage: persist [ITERS] [BLOCKS]
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* loom's own latency kernel (loom_lla), compiled in, to launch it here beside the probe's */
#include "../../src/cuda/kernels.cu"

#include "probe.h"

#define RING 1024
#define MAXB (64 << 10)
#define CAP (MAXB / 8)
#define LLA_BASE 65536ull /* loom_lla's words start here in a region (its tables before) */

struct desc {
    const float *send;
    float *recv;
    u64 len, seq;
};
struct ctrl {
    u64 doorbell, pad1[15];
    u64 done, pad2[15];
};

/* one call's exchange: chunks of 8 bytes, one per thread of the grid */
static __device__ __forceinline__ void exchange(const float *send, float *recv, u64 len,
                                                unsigned step, char *mine, char *peer, int me)
{
    u64 n = len / 8, stride = (u64)gridDim.x * blockDim.x;
    int par = step & 1;
    for (u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x; c < n; c += stride) {
        u64 w = ((const u64 *)send)[c];
        u64 off = ((u64)par * CAP + c) * 16;
        lla_put(peer + off, w, step); /* loom's low-latency word store and load */
        u64 pw;
        unsigned seen;
        while (!lla_get(mine + off, step, &pw, &seen)) {
        }
        union {
            u64 v;
            float f[2];
        } a, b;
        a.v = w;
        b.v = pw;
        /* rank order: the same sum on both GPUs */
        float s0 = me == 0 ? a.f[0] + b.f[0] : b.f[0] + a.f[0];
        float s1 = me == 0 ? a.f[1] + b.f[1] : b.f[1] + a.f[1];
        ((float2 *)recv)[c] = make_float2(s0, s1);
    }
}

__global__ void k_empty(int pdl)
{
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
}

__global__ void k_launch(const float *send, float *recv, u64 len, unsigned step, char *mine,
                         char *peer, int me)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    exchange(send, recv, len, step, mine, peer, me);
}

struct pad600 {
    char b[600];
};
/* k_launch with loom's argument size and its end (a block barrier, then one store) */
__global__ void k_launch_big(const float *send, float *recv, u64 len, unsigned step, char *mine,
                             char *peer, int me, const __grid_constant__ pad600 pad)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    exchange(send, recv, len, step, mine, peer, me);
    __syncthreads();
    if (threadIdx.x == 0 && pad.b[0] == 0)
        *(volatile unsigned *)(mine + 2ull * CAP * 16) = step; /* past the slots */
}

/* resident: serves calls in order until quit */
__global__ void k_persist(ctrl *c, volatile desc *ring, char *mine, char *peer, int me,
                          volatile int *quit, volatile u64 *consumed, int doexchange)
{
    __shared__ desc d;
    __shared__ int q;
    if (threadIdx.x == 0) q = 0;
    for (u64 k = 1;; k++) {
        if (threadIdx.x == 0) {
            volatile desc *r = &ring[k % RING];
            unsigned it = 0;
            while (r->seq != k && !q)
                if ((++it & 1023) == 0 && *quit) q = 1;
            d.send = r->send;
            d.recv = r->recv;
            d.len = r->len;
            if (blockIdx.x == 0) *consumed = k;
            u64 db = 0;
            while (!q) {
                asm volatile("ld.acquire.gpu.global.u64 %0, [%1];"
                             : "=l"(db)
                             : "l"(&c->doorbell)
                             : "memory");
                if (db >= k) break;
                if ((++it & 1023) == 0 && *quit) q = 1;
            }
        }
        __syncthreads();
        if (q) return;
        if (doexchange) exchange(d.send, d.recv, d.len, (unsigned)k, mine, peer, me);
        __syncthreads();
        if (threadIdx.x == 0)
            asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&c->done) : "memory");
    }
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static pthread_barrier_t bar;
static unsigned *gate_h; /* host memory both GPUs map: the gate the streams wait on */
static void *gate_d;
static volatile double gate_t0;
static int iters = 2000, blocks = 1;
static char *region[2];

struct rank {
    int me;
    cudaStream_t st, side;
    float *send, *recv;
    ctrl *c;
    desc *ring; /* host, mapped */
    desc *ring_d;
    int *quit, *quit_d;
    u64 *consumed, *consumed_d;
    u64 seq;
    double t[64];
    unsigned round;
    int bad;
};

static const u64 sizes[] = {8, 1024, 4096, 16384, 65536};
#define NS (sizeof(sizes) / sizeof(sizes[0]))

static void launch_pdl(cudaStream_t st, unsigned grid, unsigned threads, void *fn, void **args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.stream = st;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelExC(&cfg, fn, args));
}

static unsigned step_launch;

static void check(struct rank *r, u64 len)
{
    int n = (int)(len / 4);
    float *h = (float *)malloc(len);
    CK(cudaMemcpy(h, r->recv, len, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (h[i] != (float)(3 + 2 * (i % 13))) {
            if (!r->bad) fprintf(stderr, "rank %d: %llu B: [%d] = %g\n", r->me, len, i, h[i]);
            r->bad++;
            break;
        }
    free(h);
}

static void *rank_main(void *arg)
{
    struct rank *r = (struct rank *)arg;
    int me = r->me, pe = 1 - me;
    CK(cudaSetDevice(me));
    char *mine = region[me], *peer = region[pe];
    /* 1. empty launches back to back */
    for (int pdl = 0; pdl < 2; pdl++) {
        for (int rep = 0; rep < 2; rep++) {
            pthread_barrier_wait(&bar);
            double t0 = now_us();
            for (int i = 0; i < iters; i++) {
                void *args[] = {&pdl};
                if (pdl)
                    launch_pdl(r->st, 1, 32, (void *)k_empty, args);
                else
                    k_empty<<<1, 32, 0, r->st>>>(0);
            }
            double te = now_us();
            CK(cudaStreamSynchronize(r->st));
            double t1 = now_us();
            if (rep) {
                r->t[2 * pdl] = (t1 - t0) / iters;
                r->t[2 * pdl + 1] = (te - t0) / iters;
            }
        }
    }
    /* 2. one launch per call */
    cudaEvent_t evt;
    CK(cudaEventCreateWithFlags(&evt, cudaEventDisableTiming));
    for (int withev = 0; withev < 2; withev++)
        for (unsigned s = 0; s < NS; s++) {
            u64 len = sizes[s];
            unsigned chunks = (unsigned)(len / 8),
                     threads = chunks < 512 ? (chunks + 31) / 32 * 32 : 512;
            unsigned grid = (chunks + threads - 1) / threads;
            for (int rep = 0; rep < 2; rep++) {
                pthread_barrier_wait(&bar);
                unsigned base = step_launch;
                double t0 = now_us();
                for (int i = 0; i < iters; i++) {
                    unsigned step = base + 1 + i;
                    void *args[] = {&r->send, &r->recv, &len, &step, &mine, &peer, &me};
                    launch_pdl(r->st, grid, threads, (void *)k_launch, args);
                    if (withev) CK(cudaEventRecord(evt, r->st));
                }
                CK(cudaStreamSynchronize(r->st));
                double t1 = now_us();
                pthread_barrier_wait(&bar);
                if (me == 0) step_launch = base + iters;
                pthread_barrier_wait(&bar);
                if (rep) r->t[(withev ? 20 : 4) + s] = (t1 - t0) / iters;
            }
            check(r, len);
        }
    /* 2b. the same, queued behind a gate on the stream and released on both GPUs at once:
     * the GPUs' own time per call, without the host's launch cost */
    {
        static pad600 pad;
        const int gi = 300;
        static dev_err_t *errh;
        static void *errd;
        if (me == 0 && !errh) {
            CK(cudaHostAlloc(&errh, sizeof(dev_err_t),
                             cudaHostAllocMapped | cudaHostAllocPortable));
            memset(errh, 0, sizeof(*errh));
            CK(cudaHostGetDevicePointer(&errd, errh, 0));
        }
        pthread_barrier_wait(&bar);
        for (int v = 0; v < 4; v++)
            for (unsigned s = 0; s < NS; s++) {
                u64 len = sizes[s];
                unsigned chunks = (unsigned)(len / 8),
                         threads = chunks < 512 ? (chunks + 31) / 32 * 32 : 512;
                unsigned grid = (chunks + threads - 1) / threads;
                for (int rep = 0; rep < 2; rep++) {
                    pthread_barrier_wait(&bar);
                    unsigned base = step_launch, round = ++r->round;
                    DK(cuStreamWaitValue32((CUstream)r->st, (CUdeviceptr)gate_d, round,
                                           CU_STREAM_WAIT_VALUE_GEQ));
                    for (int i = 0; i < gi; i++) {
                        unsigned step = base + 1 + i;
                        void *args[] = {&r->send, &r->recv, &len, &step, &mine, &peer, &me, &pad};
                        if (v == 0)
                            launch_pdl(r->st, grid, threads, (void *)k_launch, args);
                        else if (v == 1)
                            launch_pdl(r->st, grid, threads, (void *)k_launch_big, args);
                        else if (v == 2)
                            CK(cudaLaunchKernel((void *)k_launch, grid, threads, args, 0, r->st));
                        else {
                            dev_args_t a;
                            memset(&a, 0, sizeof(a));
                            a.n = 2, a.me = me, a.mode = DEV_LLA, a.dtype = 7, a.nblocks = 128;
                            a.send = (const char *)r->send, a.recv = (char *)r->recv;
                            a.self_len = len, a.lla_base = LLA_BASE, a.lla_cap = CAP;
                            a.lla_step = step, a.region[0] = region[0], a.region[1] = region[1];
                            a.seq = step, a.timeout_ns = 10000000000ull, a.err = (dev_err_t *)errd;
                            unsigned lg, lt;
                            dev_lla_launch(len, 128, &lg, &lt);
                            void *la[] = {&a};
                            launch_pdl(r->st, lg, lt, (void *)loom_lla_7_0, la);
                        }
                    }
                    pthread_barrier_wait(&bar);
                    if (me == 0) {
                        gate_t0 = now_us();
                        __atomic_store_n(gate_h, round, __ATOMIC_RELEASE);
                    }
                    pthread_barrier_wait(&bar);
                    double t0 = gate_t0;
                    CK(cudaStreamSynchronize(r->st));
                    double t1 = now_us();
                    pthread_barrier_wait(&bar);
                    if (me == 0) step_launch = base + gi;
                    pthread_barrier_wait(&bar);
                    if (rep) r->t[24 + v * NS + s] = (t1 - t0) / gi;
                }
                check(r, len);
            }
    }
    CK(cudaMemset(mine, 0, 2ull * CAP * 16));
    CK(cudaDeviceSynchronize());
    pthread_barrier_wait(&bar);
    /* 3. resident kernel: without, then with the exchange */
    for (int ex = 0; ex < 2; ex++) {
        CK(cudaMemset(r->c, 0, sizeof(ctrl)));
        memset(r->ring, 0, RING * sizeof(desc));
        *(volatile int *)r->quit = 0;
        *(volatile u64 *)r->consumed = 0;
        CK(cudaDeviceSynchronize());
        pthread_barrier_wait(&bar);
        k_persist<<<blocks, 512, 0, r->side>>>(r->c, r->ring_d, mine, peer, me, r->quit_d,
                                               r->consumed_d, ex);
        CK(cudaGetLastError());
        u64 k = 0;
        for (unsigned s = 0; s < (ex ? NS : 1); s++) {
            u64 len = sizes[s];
            for (int rep = 0; rep < 2; rep++) {
                pthread_barrier_wait(&bar);
                double t0 = now_us();
                for (int i = 0; i < iters; i++) {
                    k++;
                    volatile desc *d = &r->ring[k % RING];
                    while (k >= *(volatile u64 *)r->consumed + RING) { /* ring full */
                    }
                    d->send = r->send;
                    d->recv = r->recv;
                    d->len = len;
                    __sync_synchronize();
                    d->seq = k;
                    DK(cuStreamWriteValue64((CUstream)r->st, (CUdeviceptr)&r->c->doorbell, k, 0));
                    DK(cuStreamWaitValue64((CUstream)r->st, (CUdeviceptr)&r->c->done,
                                           k * (u64)blocks, CU_STREAM_WAIT_VALUE_GEQ));
                }
                CK(cudaStreamSynchronize(r->st));
                double t1 = now_us();
                if (rep) r->t[9 + ex * NS + s] = (t1 - t0) / iters;
            }
            if (ex) check(r, len);
        }
        *(volatile int *)r->quit = 1;
        CK(cudaStreamSynchronize(r->side));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1) iters = atoi(argv[1]);
    if (argc > 2) blocks = atoi(argv[2]);
    int nd = 0;
    CK(cudaGetDeviceCount(&nd));
    if (nd < 2) {
        fprintf(stderr, "persist: needs two GPUs (found %d)\n", nd);
        return 77;
    }
    DK(cuInit(0));
    struct rank rk[2];
    for (int g = 0; g < 2; g++) {
        struct rank *r = &rk[g];
        memset(r, 0, sizeof(*r));
        r->me = g;
        CK(cudaSetDevice(g));
        cudaError_t pe = cudaDeviceEnablePeerAccess(1 - g, 0);
        if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) CK(pe);
        (void)cudaGetLastError();
        CUdevice dev;
        DK(cuDeviceGet(&dev, g));
        int a64 = 0;
        DK(cuDeviceGetAttribute(&a64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
        printf("GPU %d: 64-bit stream memory operations: %d\n", g, a64);
        CK(cudaStreamCreateWithFlags(&r->st, cudaStreamNonBlocking));
        CK(cudaStreamCreateWithFlags(&r->side, cudaStreamNonBlocking));
        CK(cudaMalloc(&region[g], LLA_BASE + 4ull * CAP * 16 + 64));
        CK(cudaMemset(region[g], 0, LLA_BASE + 4ull * CAP * 16 + 64));
        CK(cudaMalloc(&r->send, MAXB));
        CK(cudaMalloc(&r->recv, MAXB));
        float *h = (float *)malloc(MAXB);
        for (int i = 0; i < MAXB / 4; i++)
            h[i] = (float)(1 + g + (i % 13));
        CK(cudaMemcpy(r->send, h, MAXB, cudaMemcpyHostToDevice));
        free(h);
        CK(cudaMalloc(&r->c, sizeof(ctrl)));
        CK(cudaHostAlloc(&r->ring, RING * sizeof(desc),
                         cudaHostAllocMapped | cudaHostAllocPortable));
        CK(cudaHostGetDevicePointer(&r->ring_d, r->ring, 0));
        CK(cudaHostAlloc(&r->quit, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
        CK(cudaHostGetDevicePointer(&r->quit_d, r->quit, 0));
        CK(cudaHostAlloc(&r->consumed, sizeof(u64), cudaHostAllocMapped | cudaHostAllocPortable));
        CK(cudaHostGetDevicePointer(&r->consumed_d, r->consumed, 0));
    }
    CK(cudaHostAlloc(&gate_h, 4096, cudaHostAllocMapped | cudaHostAllocPortable));
    *gate_h = 0;
    CK(cudaHostGetDevicePointer(&gate_d, gate_h, 0));
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t th[2];
    for (int g = 0; g < 2; g++)
        pthread_create(&th[g], NULL, rank_main, &rk[g]);
    for (int g = 0; g < 2; g++)
        pthread_join(th[g], NULL);
    printf("iterations %d, resident blocks %d; us per call, slower of the two GPUs\n", iters,
           blocks);
#define MX(i) (rk[0].t[i] > rk[1].t[i] ? rk[0].t[i] : rk[1].t[i])
    printf("empty launch, plain: %.2f (host enqueue %.2f)\n", MX(0), MX(1));
    printf("empty launch, PDL:   %.2f (host enqueue %.2f)\n", MX(2), MX(3));
    printf("resident, doorbell round trip, no exchange: %.2f\n", MX(9));
    printf("%8s %12s %18s %12s\n", "bytes", "launch+PDL", "+ event record", "resident");
    for (unsigned s = 0; s < NS; s++)
        printf("%8llu %12.2f %18.2f %12.2f\n", sizes[s], MX(4 + s), MX(20 + s), MX(9 + NS + s));
    printf("gated (GPU time: 300 calls queued behind a stream wait, both GPUs released at "
           "once)\n%8s %12s %24s %12s\n",
           "bytes", "launch+PDL", "+600 B args, end store", "plain launch");
    for (unsigned s = 0; s < NS; s++)
        printf("%8llu %12.2f %24.2f %12.2f   loom_lla (PDL) %.2f\n", sizes[s], MX(24 + s),
               MX(24 + NS + s), MX(24 + 2 * NS + s), MX(24 + 3 * NS + s));
    int bad = rk[0].bad + rk[1].bad;
    printf("%s\n", bad ? "WRONG RESULTS" : "results correct");
    return bad ? 1 : 0;
}
