/*
 * splitlat: the 8-byte allreduce of a communicator made by init against that of a child split
 * off it with every rank in one colour (the same ranks, the same node): the two differ only in
 * how they were made, so any gap is what the child lacks (before session 15: the node segment).
 * Interleaved rounds of N calls each, the median per-call time of each, the slowest rank's.
 * usage: splitlat [-P k] [-n N] [-r ROUNDS]   (default 4 ranks, 2000 calls, 7 rounds)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ranks.h"

typedef struct {
    int n, rounds;
} opts_t;

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per call of n 8-byte allreduces on c, the slowest rank's; negative on failure. */
static double timed(loomComm_t c, int n)
{
    double v = 1, w = 0;
    if (loomAllReduce(&v, &w, 1, loomFloat64, loomSum, c, NULL) != loomSuccess) return -1;
    double t0 = ranks_now();
    for (int i = 0; i < n; i++)
        if (loomAllReduce(&v, &w, 1, loomFloat64, loomSum, c, NULL) != loomSuccess) return -1;
    return ranks_max(c, (ranks_now() - t0) / n);
}

static int run(loomComm_t comm, int rank, int nranks, void *arg)
{
    const opts_t *o = arg;
    loomComm_t child = NULL;
    if (loomCommSplit(comm, 0, rank, &child, NULL) != loomSuccess) {
        fprintf(stderr, "splitlat: rank %d: loomCommSplit: %s\n", rank, loomGetLastError(comm));
        return 2;
    }
    double *t[2] = {calloc((size_t)o->rounds, sizeof(double)),
                    calloc((size_t)o->rounds, sizeof(double))};
    int rc = 0;
    for (int k = 0; k < o->rounds && rc == 0; k++)
        for (int w = 0; w < 2 && rc == 0; w++)
            if ((t[w][k] = timed(w ? child : comm, o->n)) < 0) rc = 2;
    if (rc == 0 && rank == 0) {
        qsort(t[0], (size_t)o->rounds, sizeof(double), cmp);
        qsort(t[1], (size_t)o->rounds, sizeof(double), cmp);
        double a = t[0][o->rounds / 2], b = t[1][o->rounds / 2];
        printf("splitlat ranks=%d calls=%d rounds=%d init_us=%.2f split_us=%.2f split/init=%.2f\n",
               nranks, o->n, o->rounds, a * 1e6, b * 1e6, b / a);
    }
    if (rc) fprintf(stderr, "splitlat: rank %d: an allreduce failed\n", rank);
    free(t[0]);
    free(t[1]);
    loomCommDestroy(child);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o = {.n = 2000, .rounds = 7};
    int k = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "-P") && v > 0)
            k = v;
        else if (!strcmp(argv[i], "-n") && v > 0)
            o.n = v;
        else if (!strcmp(argv[i], "-r") && v > 0)
            o.rounds = v;
        else {
            fprintf(stderr, "usage: splitlat [-P k] [-n N] [-r ROUNDS]\n");
            return 2;
        }
    }
    return ranks_run("splitlat", k, run, &o);
}
