/*
 * callcost: what the primitives of a host call cost on this machine, in ns (the best of 5 runs of
 * N each), and the round trip of one cache line between two cores: to tell a machine whose
 * per-call overhead is high (perf/RESULTS.md, session 13: a one-rank 8-byte loomAllReduce takes
 * 2.2 us on the GPU host's cores and 0.6 on the dev VM's) by which primitive is slow there.
 * usage: callcost [CPU_A CPU_B]   (the cores of the ping-pong; default 0 and 1)
 * Build: cc -O2 -pthread perf/probes/callcost.c -o callcost -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

#define N 200000
static volatile uint64_t sink;

/* The best of 5 runs of N calls of `body`, in ns per call. */
#define TIME(name, body)                                                                           \
    do {                                                                                           \
        double best = 1e30;                                                                        \
        for (int run = 0; run < 5; run++) {                                                        \
            double t0 = now_ns();                                                                  \
            for (int i = 0; i < N; i++) {                                                          \
                body;                                                                              \
            }                                                                                      \
            double dt = (now_ns() - t0) / N;                                                       \
            if (dt < best) best = dt;                                                              \
        }                                                                                          \
        printf("%-34s %8.1f ns\n", name, best);                                                    \
    } while (0)

typedef struct {
    _Alignas(64) _Atomic uint64_t ping;
    _Alignas(64) _Atomic uint64_t pong;
    int cpu;
} pp_t;

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof(s), &s) != 0) perror("sched_setaffinity");
}

static void *ponger(void *arg)
{
    pp_t *p = arg;
    pin(p->cpu);
    for (uint64_t k = 1; k <= N; k++) {
        while (atomic_load_explicit(&p->ping, memory_order_acquire) != k) {
        }
        atomic_store_explicit(&p->pong, k, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int ca = argc > 2 ? atoi(argv[1]) : 0, cb = argc > 2 ? atoi(argv[2]) : 1;
    pin(ca);
    struct timespec ts;
    TIME("clock_gettime(MONOTONIC)", clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec);
    TIME("clock_gettime(MONOTONIC_COARSE)", clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
         sink += ts.tv_nsec);
    TIME("malloc(2048) + free", void *m = malloc(2048); sink += (uintptr_t)m; free(m));
    TIME("calloc(1, 2048) + free", void *m = calloc(1, 2048); sink += (uintptr_t)m; free(m));
    static char buf[2048];
    TIME("memset 2 KiB", memset(buf, (int)i, sizeof(buf)); sink += buf[7]);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    TIME("pthread_mutex lock + unlock", pthread_mutex_lock(&mu); pthread_mutex_unlock(&mu));
    static _Atomic uint64_t a;
    TIME("atomic fetch_add (uncontended)", atomic_fetch_add(&a, 1));
    TIME("sched_yield", sched_yield());
#if defined(__x86_64__)
    TIME("pause", _mm_pause());
    TIME("rdtscp", unsigned aux; sink += __rdtscp(&aux));
#endif
    /* What loom's check of a buffer's memory type costs where a CUDA driver is installed
     * (base/memtype.c): one cuPointerGetAttribute on host memory, before and after cuInit. */
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cu) {
        typedef int (*init_fn)(unsigned);
        typedef int (*attr_fn)(void *, int, unsigned long long);
        init_fn init = (init_fn)dlsym(cu, "cuInit");
        attr_fn attr = (attr_fn)dlsym(cu, "cuPointerGetAttribute");
        unsigned ty = 0;
        if (attr) {
            int e = attr(&ty, 2, (unsigned long long)(uintptr_t)buf);
            TIME("cuPointerGetAttribute, no cuInit",
                 sink += (uint64_t)attr(&ty, 2, (uintptr_t)buf));
            printf("%-34s %8d\n", "  (its result)", e);
        }
        if (init && attr && init(0) == 0) {
            TIME("cuPointerGetAttribute (host)", sink += (uint64_t)attr(&ty, 2, (uintptr_t)buf));
        }
    } else {
        printf("%-34s %8s\n", "cuPointerGetAttribute", "no libcuda");
    }
    pp_t *p = aligned_alloc(64, sizeof(*p));
    memset(p, 0, sizeof(*p));
    p->cpu = cb;
    pthread_t t;
    pthread_create(&t, NULL, ponger, p);
    double t0 = now_ns();
    for (uint64_t k = 1; k <= N; k++) {
        atomic_store_explicit(&p->ping, k, memory_order_release);
        while (atomic_load_explicit(&p->pong, memory_order_acquire) != k) {
        }
    }
    double rt = (now_ns() - t0) / N;
    pthread_join(t, NULL);
    printf("%-34s %8.1f ns (cpus %d and %d)\n", "cache line round trip", rt, ca, cb);
    return (int)(sink & 0);
}
