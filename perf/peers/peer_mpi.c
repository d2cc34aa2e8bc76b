/*
 * peer_mpi: MPI_Allreduce timed exactly like loom-perf times loomAllReduce, so that the two
 * tables (and CSVs) can be compared line by line. Run under mpirun; rank 0 prints.
 *
 * Per size: warmup, barrier, ITERS timed out-of-place calls; the same again in place
 * (MPI_IN_PLACE). The time reported is each rank's mean per call, averaged over ranks. With -c 1
 * one more call of each kind runs after the timed loops on fresh data and is checked exactly; the
 * timed loops themselves never touch the data so checking cannot slow them down.
 */
#include <mpi.h>

#include "peer_common.h"

static MPI_Datatype mpi_type(enum peer_dtype t)
{
    return t == PEER_DOUBLE ? MPI_DOUBLE : t == PEER_INT32 ? MPI_INT32_T : MPI_FLOAT;
}

/* Mean seconds per call of `iters` allreduces; in place when sendbuf is MPI_IN_PLACE. */
static double time_loop(const void *sendbuf, void *recvbuf, size_t count, MPI_Datatype dt,
                        int warmup, int iters)
{
    for (int i = 0; i < warmup; i++)
        MPI_Allreduce(sendbuf, recvbuf, (int)count, dt, MPI_SUM, MPI_COMM_WORLD);
    /* Start together, so no rank's time includes waiting for a late peer to arrive. */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        MPI_Allreduce(sendbuf, recvbuf, (int)count, dt, MPI_SUM, MPI_COMM_WORLD);
    return (MPI_Wtime() - t0) / iters;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    struct peer_opts o;
    int rc = peer_parse_args(argc, argv, &o, 0);
    if (rc != 0) {
        MPI_Finalize();
        return rc < 0 ? 2 : 0;
    }
    const size_t tsize = peer_type_size(o.dtype);
    const MPI_Datatype dt = mpi_type(o.dtype);
    if (o.max_bytes / tsize > (size_t)INT32_MAX) {
        if (rank == 0)
            fprintf(stderr, "peer_mpi: %zu bytes exceeds MPI's int count\n", o.max_bytes);
        MPI_Finalize();
        return 2;
    }

    const size_t max_count = o.max_bytes / tsize;
    void *sendbuf = NULL, *recvbuf = NULL;
    /* Page alignment, like any sensibly allocated buffer, so alignment is not what we measure. */
    if (posix_memalign(&sendbuf, 4096, max_count * tsize + 1) != 0 ||
        posix_memalign(&recvbuf, 4096, max_count * tsize + 1) != 0) {
        fprintf(stderr, "peer_mpi: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    FILE *csv = NULL;
    if (rank == 0) {
        if (o.csv != NULL && (csv = peer_csv_open(o.csv)) == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
        peer_print_header(&o, "peer_mpi", nranks, NULL);
    }

    double wrong_total = 0, busbw_sum = 0;
    int rows = 0;
    for (size_t bytes = o.min_bytes; bytes != 0; bytes = peer_next_size(&o, bytes)) {
        const size_t count = bytes / tsize;
        if (count == 0) continue; /* nothing to reduce; nccl-tests would print a meaningless row */

        /* Fill both so that no page is first touched inside a timed loop. */
        peer_fill(sendbuf, count, o.dtype, rank);
        peer_fill(recvbuf, count, o.dtype, rank);
        double t[2];
        t[0] = time_loop(sendbuf, recvbuf, count, dt, o.warmup, o.iters);
        /* In place the buffer is summed into itself call after call; the values grow but stay
         * finite for float/double at any sensible ITERS, and int32 wraps harmlessly. */
        peer_fill(recvbuf, count, o.dtype, rank);
        t[1] = time_loop(MPI_IN_PLACE, recvbuf, count, dt, o.warmup, o.iters);

        double wrong[2] = {0, 0};
        if (o.check) {
            memset(recvbuf, 0xff, count * tsize); /* stale results must not pass the check */
            MPI_Allreduce(sendbuf, recvbuf, (int)count, dt, MPI_SUM, MPI_COMM_WORLD);
            wrong[0] = (double)peer_count_wrong(recvbuf, count, o.dtype, nranks);
            peer_fill(recvbuf, count, o.dtype, rank);
            MPI_Allreduce(MPI_IN_PLACE, recvbuf, (int)count, dt, MPI_SUM, MPI_COMM_WORLD);
            wrong[1] = (double)peer_count_wrong(recvbuf, count, o.dtype, nranks);
        }

        double tsum[2], wsum[2];
        MPI_Reduce(t, tsum, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Reduce(wrong, wsum, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            struct peer_result r;
            r.bytes = count * tsize;
            r.count = count;
            r.oop_us = tsum[0] / nranks * 1e6;
            r.ip_us = tsum[1] / nranks * 1e6;
            r.oop_wrong = wsum[0];
            r.ip_wrong = wsum[1];
            peer_print_row(&o, &r, nranks, NULL);
            if (csv != NULL) peer_csv_row(csv, &o, &r, nranks);
            wrong_total += wsum[0] + wsum[1];
            /* nccl-tests averages the bus bandwidth over both columns. */
            busbw_sum +=
                peer_busbw(r.bytes, r.oop_us, nranks) + peer_busbw(r.bytes, r.ip_us, nranks);
            rows += 2;
        }
    }

    if (rank == 0) {
        peer_print_footer(&o, wrong_total, busbw_sum, rows);
        if (csv != NULL) fclose(csv);
    }
    free(sendbuf);
    free(recvbuf);
    MPI_Finalize();
    /* Wrong results are a failure, so a script cannot mistake a broken run for a fast one. */
    return (rank == 0 && wrong_total != 0) ? 1 : 0;
}
