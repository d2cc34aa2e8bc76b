/*
 * layout: does where a rank's buffers lie change what an allreduce costs? P forked local ranks
 * run a float sum of SIZE bytes, out of place, over buffers placed at chosen offsets from a 2 MiB
 * boundary (send at SOFF, receive at ROFF; `-H` asks for transparent huge pages on them), ITERS
 * timed calls after WARMUP, and rank 0 prints one line: "layout P ranks SIZE B send+SOFF
 * recv+ROFF [thp]: T us (median of ROUNDS rounds)". The transport and algorithm are whatever
 * LOOM_TRANSPORT and LOOM_ALGO say. Compare lines of several offsets run back to back (perf/
 * layout.sh interleaves them) to see the cost of a layout.
 * `-f` makes the communicator's first call an allreduce of one double (as a framework's first
 * barrier is), before the buffers are filled; `-F` makes it after they are filled; `-g` makes
 * it an allreduce of SIZE bytes on buffers of its own, freed before the timed ones are placed.
 * `-v` adds, for rank 0, the CPU time of each of its threads and its page faults and context
 * switches over the timed rounds (where does a slower call spend it).
 * usage: layout [-P RANKS] [-s SIZE] [-o SOFF] [-O ROFF] [-n ITERS] [-w WARMUP] [-r ROUNDS]
 *               [-H] [-f | -F | -g] [-v]
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

/* utime + stime of every thread of this process, in clock ticks, into cpu[] (at most max) */
static int thread_cpu(long *cpu, int max)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && n < max) {
        if (e->d_name[0] == '.') continue;
        char path[300], buf[1024];
        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = 0;
        char *q = strrchr(buf, ')'); /* fields after the command name */
        long ut = 0, st = 0;
        if (q &&
            sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) == 2)
            cpu[n++] = ut + st;
    }
    if (d) closedir(d);
    return n;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int rank_main(int rank, int p, loomUniqueId id, size_t size, size_t soff, size_t roff,
                     int iters, int warm, int rounds, int thp, int first, int verbose)
{
    loomComm_t comm;
    if (loomCommInitRank(&comm, p, id, rank) != loomSuccess) {
        fprintf(stderr, "layout: rank %d: init: %s\n", rank, loomGetLastError(NULL));
        return 1;
    }
    double bar = 0;
    size_t n = size / sizeof(float);
    if (first == 'f') loomAllReduce(&bar, &bar, 1, loomFloat64, loomSum, comm, NULL);
    if (first == 'g') {
        float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
        if (!a || !b) return 1;
        loomAllReduce(a, b, n, loomFloat32, loomSum, comm, NULL);
        free(a);
        free(b);
    }
    float *s = place(size, soff, thp), *r = place(size, roff, thp);
    if (!s || !r) return 1;
    for (size_t i = 0; i < n; i++)
        s[i] = (float)((i * 7 + (size_t)rank) % 17), r[i] = 0;
    if (first == 'F') loomAllReduce(&bar, &bar, 1, loomFloat64, loomSum, comm, NULL);
    long cpu0[64], cpu1[64];
    struct rusage ru0, ru1;
    int nt0 = thread_cpu(cpu0, 64);
    getrusage(RUSAGE_SELF, &ru0);
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
    getrusage(RUSAGE_SELF, &ru1);
    int nt1 = thread_cpu(cpu1, 64);
    qsort(t, (size_t)rounds, sizeof(double), cmp);
    const char *how = first == 'f'   ? " first-small"
                      : first == 'F' ? " first-small-after-fill"
                      : first == 'g' ? " first-large"
                                     : "";
    if (rank == 0)
        printf("layout %d ranks %zu B send+%zu recv+%zu%s%s: %.1f us (median of %d rounds, "
               "%.1f-%.1f)\n",
               p, size, soff, roff, thp ? " thp" : "", how, t[rounds / 2], rounds, t[0],
               t[rounds - 1]);
    if (rank == 0 && verbose) {
        printf("  rank 0: %d threads (%d before), cpu ticks per thread over the rounds:", nt1, nt0);
        for (int i = 0; i < nt1; i++)
            printf(" %ld", cpu1[i] - (i < nt0 ? cpu0[i] : 0));
        printf("; minflt %ld majflt %ld nvcsw %ld nivcsw %ld\n", ru1.ru_minflt - ru0.ru_minflt,
               ru1.ru_majflt - ru0.ru_majflt, ru1.ru_nvcsw - ru0.ru_nvcsw,
               ru1.ru_nivcsw - ru0.ru_nivcsw);
    }
    fflush(stdout); /* the rank ends in _exit */
    loomCommDestroy(comm);
    return 0;
}

int main(int argc, char **argv)
{
    int p = 4, iters = 10, warm = 3, rounds = 5, thp = 0, first = 0, verbose = 0, c;
    size_t size = 64u << 20, soff = 0, roff = 0;
    while ((c = getopt(argc, argv, "P:s:o:O:n:w:r:HfFgv")) != -1) {
        switch (c) {
        case 'P': p = atoi(optarg); break;
        case 's': size = strtoull(optarg, NULL, 0); break;
        case 'o': soff = strtoull(optarg, NULL, 0); break;
        case 'O': roff = strtoull(optarg, NULL, 0); break;
        case 'n': iters = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        case 'H': thp = 1; break;
        case 'f':
        case 'F':
        case 'g': first = c; break;
        case 'v': verbose = 1; break;
        default:
            fprintf(stderr,
                    "usage: layout [-P K] [-s B] [-o SOFF] [-O ROFF] [-n N] [-w W] [-r R] [-H] "
                    "[-f | -F | -g] [-v]\n");
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
            _exit(rank_main(k, p, id, size, soff, roff, iters, warm, rounds, thp, first, verbose));
    int rc = 0, st;
    while (wait(&st) > 0)
        if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
    return rc;
}
