/*
 * p2p_bw: one-way point-to-point bandwidth through loom (loomSend/loomRecv), shaped like
 * `ucx_perftest -t tag_bw`: rank 0 streams messages of SIZE bytes to rank 1, WINDOW of them in
 * flight at a time (one group of WINDOW sends, and of WINDOW receives, per step). Two forked
 * local ranks; the transport is whatever LOOM_TRANSPORT (and, for ucx, the UCX_* variables)
 * select. Prints one line: "p2p_bw size SIZE window W iters N: X GB/s" (GB = 1e9 bytes),
 * measured at the receiver from the end of the warm-up to the last message.
 * usage: p2p_bw [SIZE_BYTES] [ITERS] [WINDOW] [WARMUP]     (default 4194304 200 16 20)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static int step(loomComm_t comm, int rank, char *buf, size_t size, int window)
{
    if (loomGroupStart() != loomSuccess) return 1;
    for (int k = 0; k < window; k++) {
        loomResult_t r = rank == 0 ? loomSend(buf, size, loomUint8, 1, comm, NULL)
                                   : loomRecv(buf, size, loomUint8, 0, comm, NULL);
        if (r != loomSuccess) return 1;
    }
    return loomGroupEnd() != loomSuccess;
}

static int run_rank(int rank, loomUniqueId id, size_t size, int iters, int window, int warmup)
{
    loomComm_t comm;
    if (loomCommInitRank(&comm, 2, id, rank) != loomSuccess) {
        fprintf(stderr, "p2p_bw: rank %d: init: %s\n", rank, loomGetLastError(NULL));
        return 1;
    }
    char *buf = malloc(size ? size : 1);
    if (buf == NULL) return 1;
    memset(buf, rank + 1, size);
    int bad = 0;
    for (int i = 0; i < warmup && !bad; i++)
        bad = step(comm, rank, buf, size, window);
    double t0 = now();
    for (int i = 0; i < iters && !bad; i++)
        bad = step(comm, rank, buf, size, window);
    double dt = now() - t0;
    /* The receiver's clock ends with the last byte; a zero-byte reply closes the sender's. */
    char ack = 0;
    if (!bad)
        bad = rank == 1 ? loomSend(&ack, 1, loomUint8, 0, comm, NULL) != loomSuccess
                        : loomRecv(&ack, 1, loomUint8, 1, comm, NULL) != loomSuccess;
    if (bad) fprintf(stderr, "p2p_bw: rank %d: %s\n", rank, loomGetLastError(comm));
    if (!bad && rank == 1)
        printf("p2p_bw size %zu window %d iters %d: %.3f GB/s\n", size, window, iters,
               (double)size * window * iters / dt / 1e9);
    fflush(stdout); /* rank 1 leaves through _exit */
    free(buf);
    loomCommDestroy(comm);
    return bad;
}

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : 4194304;
    int iters = argc > 2 ? atoi(argv[2]) : 200;
    int window = argc > 3 ? atoi(argv[3]) : 16;
    int warmup = argc > 4 ? atoi(argv[4]) : 20;
    if (size == 0 || iters < 1 || window < 1 || warmup < 0) {
        fprintf(stderr, "usage: p2p_bw [SIZE_BYTES] [ITERS] [WINDOW] [WARMUP]\n");
        return 2;
    }
    loomUniqueId id;
    if (loomGetUniqueId(&id) != loomSuccess) {
        fprintf(stderr, "p2p_bw: %s\n", loomGetLastError(NULL));
        return 1;
    }
    fflush(stdout);
    pid_t kid = fork();
    if (kid < 0) return 1;
    if (kid == 0) _exit(run_rank(1, id, size, iters, window, warmup));
    int bad = run_rank(0, id, size, iters, window, warmup);
    int st = 0;
    waitpid(kid, &st, 0);
    return bad || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}
