/*
 * layout: does where a rank's buffers lie change what an allreduce costs? P forked local ranks
 * run a float sum of SIZE bytes, out of place, over buffers placed at chosen offsets from a 2 MiB
 * boundary (send at SOFF, receive at ROFF; `-H` asks for transparent huge pages on them), ITERS
 * timed calls after WARMUP, and rank 0 prints one line: "layout P ranks SIZE B send+SOFF
 * recv+ROFF [thp]: T us (median of ROUNDS rounds)". The transport and algorithm are whatever
 * LOOM_TRANSPORT and LOOM_ALGO say. Compare lines of several offsets run back to back (perf/
 * layout.sh interleaves them) to see the cost of a layout.
 * `-f` makes the communicator's first call an allreduce of one double (as a framework's first
 * barrier is), before the buffers are filled.
 * usage: layout [-P RANKS] [-s SIZE] [-o SOFF] [-O ROFF] [-n ITERS] [-w WARMUP] [-r ROUNDS]
 *               [-H] [-f]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define ALIGN (2u << 20)

/* bytes at offset off past a 2 MiB boundary of a fresh anonymous mapping */
static void *place(size_t bytes, size_t off, int thp)
{
    size_t len = bytes + off + 2 * ALIGN;
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *base = (uint8_t *)(((uintptr_t)m + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
    madvise(base, bytes + off + ALIGN, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return base + off;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int rank_main(int rank, int p, loomUniqueId id, size_t size, size_t soff, size_t roff,
                     int iters, int warm, int rounds, int thp, int first)
{
    loomComm_t comm;
    if (loomCommInitRank(&comm, p, id, rank) != loomSuccess) {
        fprintf(stderr, "layout: rank %d: init: %s\n", rank, loomGetLastError(NULL));
        return 1;
    }
    double bar = 0;
    if (first) loomAllReduce(&bar, &bar, 1, loomFloat64, loomSum, comm, NULL);
    size_t n = size / sizeof(float);
    float *s = place(size, soff, thp), *r = place(size, roff, thp);
    if (!s || !r) return 1;
    for (size_t i = 0; i < n; i++)
        s[i] = (float)((i * 7 + (size_t)rank) % 17), r[i] = 0;
    double *t = calloc((size_t)rounds, sizeof(double));
    for (int k = 0; k < rounds; k++) {
        for (int i = 0; i < warm; i++)
            loomAllReduce(s, r, n, loomFloat32, loomSum, comm, NULL);
        loomAllReduce(&bar, &bar, 1, loomFloat64, loomSum, comm, NULL);
        double t0 = now();
        for (int i = 0; i < iters; i++)
            if (loomAllReduce(s, r, n, loomFloat32, loomSum, comm, NULL) != loomSuccess) {
                fprintf(stderr, "layout: rank %d: %s\n", rank, loomGetLastError(comm));
                return 1;
            }
        t[k] = (now() - t0) / iters * 1e6;
        loomAllReduce(&t[k], &t[k], 1, loomFloat64, loomMax, comm, NULL);
    }
    qsort(t, (size_t)rounds, sizeof(double), cmp);
    if (rank == 0)
        printf("layout %d ranks %zu B send+%zu recv+%zu%s%s: %.1f us (median of %d rounds, "
               "%.1f-%.1f)\n",
               p, size, soff, roff, thp ? " thp" : "", first ? " first-small" : "", t[rounds / 2],
               rounds, t[0], t[rounds - 1]);
    fflush(stdout); /* the rank ends in _exit */
    loomCommDestroy(comm);
    return 0;
}

int main(int argc, char **argv)
{
    int p = 4, iters = 10, warm = 3, rounds = 5, thp = 0, first = 0, c;
    size_t size = 64u << 20, soff = 0, roff = 0;
    while ((c = getopt(argc, argv, "P:s:o:O:n:w:r:Hf")) != -1) {
        switch (c) {
        case 'P': p = atoi(optarg); break;
        case 's': size = strtoull(optarg, NULL, 0); break;
        case 'o': soff = strtoull(optarg, NULL, 0); break;
        case 'O': roff = strtoull(optarg, NULL, 0); break;
        case 'n': iters = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        case 'H': thp = 1; break;
        case 'f': first = 1; break;
        default:
            fprintf(stderr,
                    "usage: layout [-P K] [-s B] [-o SOFF] [-O ROFF] [-n N] [-w W] [-r R] [-H]\n");
            return 2;
        }
    }
    if (p < 1 || iters < 1 || rounds < 1 || size < sizeof(float) || soff % 4 || roff % 4) {
        fprintf(stderr, "layout: bad arguments\n");
        return 2;
    }
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess) return 1;
    fflush(stdout);
    for (int k = 0; k < p; k++)
        if (fork() == 0)
            _exit(rank_main(k, p, id, size, soff, roff, iters, warm, rounds, thp, first));
    int rc = 0, st;
    while (wait(&st) > 0)
        if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
    return rc;
}
