/*
 * mpi_vs_loom: one interleaved run of the raw MPI operation against loom's over the mpi
 * transport, medians of rounds. Run under mpirun; rank 0 prints.
 *
 *   mpirun -np 2 build/mpi_vs_loom p2p [bytes=4M] [rounds=15] [iters=20]
 *       ping-pong between ranks 0 and 1 (the others idle): MPI_Send/MPI_Recv on MPI_COMM_WORLD
 *       against loomSend/loomRecv; bandwidth = 2 * bytes / round trip
 *   mpirun -np 4 build/mpi_vs_loom allreduce [bytes=64M] [rounds=7] [iters=3]
 *       MPI_Allreduce against loomAllReduce, float sum, out of place
 *
 * The loom communicator comes from loomCommInitMpi(MPI_COMM_WORLD); LOOM_TRANSPORT defaults to
 * mpi here (set it to compare another transport). Each round times `iters` calls of one, then
 * of the other (the order alternates between rounds), after a barrier; the first round is a
 * warm-up and not counted. Results are checked once at the end (exact sums).
 */
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"
#include "loom_mpi.h"

static int rank, nranks;

static void die(const char *what, loomComm_t comm)
{
    fprintf(stderr, "mpi_vs_loom: rank %d: %s: %s\n", rank, what, loomGetLastError(comm));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) {
        fprintf(stderr, "mpi_vs_loom: bad size '%s'\n", s);
        exit(2);
    }
    if (*end == 'K' || *end == 'k') v *= 1024;
    if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds per call of iters calls of one kind (which: 0 MPI, 1 loom), the slowest rank's. */
static double timed(int which, bool p2p, void *a, void *b, size_t bytes, int iters, loomComm_t comm)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    size_t count = bytes / sizeof(float);
    for (int i = 0; i < iters; i++) {
        if (p2p && rank > 1) continue;
        if (p2p) {
            int peer = 1 - rank;
            if (which == 0) {
                if (rank == 0) {
                    MPI_Send(a, (int)bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD);
                    MPI_Recv(b, (int)bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(b, (int)bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(a, (int)bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD);
                }
            } else if (rank == 0) {
                if (loomSend(a, bytes, loomUint8, peer, comm, NULL) != loomSuccess)
                    die("send", comm);
                if (loomRecv(b, bytes, loomUint8, peer, comm, NULL) != loomSuccess)
                    die("recv", comm);
            } else {
                if (loomRecv(b, bytes, loomUint8, peer, comm, NULL) != loomSuccess)
                    die("recv", comm);
                if (loomSend(a, bytes, loomUint8, peer, comm, NULL) != loomSuccess)
                    die("send", comm);
            }
        } else if (which == 0) {
            MPI_Allreduce(a, b, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else if (loomAllReduce(a, b, count, loomFloat32, loomSum, comm, NULL) != loomSuccess) {
            die("allreduce", comm);
        }
    }
    double t = (MPI_Wtime() - t0) / iters, worst;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    bool p2p = argc > 1 && strcmp(argv[1], "p2p") == 0;
    if (argc < 2 || (!p2p && strcmp(argv[1], "allreduce") != 0)) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_vs_loom p2p|allreduce [bytes] [rounds] [iters]\n");
        MPI_Finalize();
        return 2;
    }
    if (p2p && nranks < 2) {
        if (rank == 0) fprintf(stderr, "mpi_vs_loom p2p: needs 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    size_t bytes = parse_size(argc > 2 ? argv[2] : p2p ? "4M" : "64M");
    int rounds = argc > 3 ? atoi(argv[3]) : p2p ? 15 : 7;
    int iters = argc > 4 ? atoi(argv[4]) : p2p ? 20 : 3;
    if (rounds < 2 || iters < 1 || bytes > INT32_MAX) {
        if (rank == 0) fprintf(stderr, "mpi_vs_loom: rounds >= 2, iters >= 1, bytes < 2 GiB\n");
        MPI_Finalize();
        return 2;
    }
    bytes -= bytes % sizeof(float);
    setenv("LOOM_TRANSPORT", "mpi", 0);
    loomComm_t comm;
    if (loomCommInitMpi(&comm, MPI_COMM_WORLD) != loomSuccess) die("loomCommInitMpi", NULL);
    float *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) die("out of memory", NULL);
    size_t count = bytes / sizeof(float);
    for (size_t i = 0; i < count; i++)
        a[i] = (float)((rank + i) % 8);
    memset(b, 0, bytes);
    double *tm = calloc((size_t)rounds, sizeof(double)),
           *tl = calloc((size_t)rounds, sizeof(double));
    for (int r = 0; r < rounds; r++) {
        int first = r % 2;
        double t1 = timed(first, p2p, a, b, bytes, iters, comm);
        double t2 = timed(1 - first, p2p, a, b, bytes, iters, comm);
        tm[r] = first == 0 ? t1 : t2;
        tl[r] = first == 0 ? t2 : t1;
    }
    /* check once: loom's result */
    int bad = 0;
    if (!p2p) {
        if (loomAllReduce(a, b, count, loomFloat32, loomSum, comm, NULL) != loomSuccess)
            die("allreduce", comm);
        for (size_t i = 0; i < count && !bad; i++) {
            float want = 0;
            for (int q = 0; q < nranks; q++)
                want += (float)((q + i) % 8);
            bad = b[i] != want;
        }
    } else if (rank < 2) {
        for (size_t i = 0; i < count && !bad; i++)
            bad = b[i] != (float)((1 - rank + i) % 8);
    }
    int anybad = 0;
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double mm = median(tm + 1, rounds - 1), ml = median(tl + 1, rounds - 1);
    if (rank == 0) {
        const char *tp = getenv("LOOM_TRANSPORT");
        double unit = p2p ? 2.0 * (double)bytes : (double)bytes;
        printf("# mpi_vs_loom %s: %d ranks, %zu bytes, %d rounds of %d (first not counted), loom "
               "over %s\n",
               argv[1], nranks, bytes, rounds, iters, tp);
        printf("%-10s %12s %12s\n", "", "time_us", p2p ? "GB/s" : "algbw_GB/s");
        printf("%-10s %12.1f %12.3f\n", "MPI", mm * 1e6, unit / mm / 1e9);
        printf("%-10s %12.1f %12.3f\n", "loom", ml * 1e6, unit / ml / 1e9);
        printf("loom/MPI bandwidth: %.3f  #wrong: %d\n", mm / ml, anybad);
    }
    loomCommDestroy(comm);
    free(a);
    free(b);
    free(tm);
    free(tl);
    MPI_Finalize();
    return anybad;
}
