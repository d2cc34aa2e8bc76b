/*
 * membw: this machine's memory floors for the host allreduce, to print beside loom's numbers.
 *   memcpy       one core copying (read + write)
 *   c = a + b    one core adding float32 (the reduction's shape)
 *   CMA          process_vm_readv from another process, in slices, into a big buffer and into
 *                a small buffer that stays in cache (shm's receive-and-reduce path)
 * and, from those, the bound for an allreduce of SIZE bytes on P local ranks sharing the cores:
 * each rank must receive 2(P-1)/P of the buffer and reduce (P-1)/P of it.
 * usage: membw [SIZE_MIB] [P] [CORES]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64;
    int p = argc > 2 ? atoi(argv[2]) : 2;
    int cores = argc > 3 ? atoi(argv[3]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    size_t n = mib << 20, nf = n / sizeof(float);
    float *a = malloc(n), *b = malloc(n), *c = malloc(n);
    char *stage = malloc(1 << 20);
    memset(a, 1, n);
    memset(b, 2, n);
    memset(c, 0, n);
    const int reps = 5;
    double t0 = now();
    for (int i = 0; i < reps; i++)
        memcpy(c, a, n);
    double cp = n / ((now() - t0) / reps);
    t0 = now();
    for (int i = 0; i < reps; i++)
        for (size_t k = 0; k < nf; k++)
            c[k] = a[k] + b[k];
    double add = n / ((now() - t0) / reps);
    pid_t child = fork();
    if (child == 0) {
        sleep(60);
        _exit(0);
    }
    size_t sl = 256 << 10;
    t0 = now();
    for (int i = 0; i < reps; i++)
        for (size_t o = 0; o < n; o += sl) {
            struct iovec l = {(char *)c + o, sl}, r = {(char *)a + o, sl};
            process_vm_readv(child, &l, 1, &r, 1, 0);
        }
    double cma = n / ((now() - t0) / reps);
    t0 = now();
    for (int i = 0; i < reps; i++)
        for (size_t o = 0; o < n; o += sl) {
            struct iovec l = {stage, sl}, r = {(char *)a + o, sl};
            process_vm_readv(child, &l, 1, &r, 1, 0);
        }
    double cma_stage = n / ((now() - t0) / reps);
    kill(child, 9);
    waitpid(child, NULL, 0);
    printf("memcpy            %.2f GB/s per core\n", cp / 1e9);
    printf("c = a + b         %.2f GB/s of output per core\n", add / 1e9);
    printf("CMA -> buffer     %.2f GB/s per core (256 KiB slices)\n", cma / 1e9);
    printf("CMA -> in cache   %.2f GB/s per core (256 KiB slices)\n", cma_stage / 1e9);
    /* Per rank: receive 2(P-1)/P n (one copy each way), reduce (P-1)/P n; ranks share cores. */
    double per_rank = 2.0 * (p - 1) / p * n / cp + (double)(p - 1) / p * n / add;
    double share = p > cores ? (double)p / cores : 1.0;
    printf("bound for an allreduce of %zu MiB on %d ranks, %d cores (one copy per byte "
           "received, at memcpy speed, plus the reduction): %.1f ms\n",
           mib, p, cores, per_rank * share * 1e3);
    return 0;
}
