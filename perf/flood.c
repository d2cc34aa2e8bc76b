/*
 * loom-flood: what a stranger's connection flood costs a running job (issue 14, item 3).
 *
 * A job of N ranks (threads of this process, LOOM_TRANSPORT=tcp on loopback) runs allreduces of
 * S bytes of int32, each result checked bit for bit. First without strangers (the baseline),
 * then while a flooder keeps C idle TCP connections open to every rank's data listener, closing
 * and reopening them all every R seconds (connections that never say a word: no secret needed).
 * Prints the median and 90th percentile iteration time of both phases, how many connections
 * the flooder made and how many loom dropped, and how many log lines loom wrote about them.
 *
 *   loom-flood [-n ranks] [-c conns per rank] [-r reopen s] [-s bytes] [-t seconds per phase]
 *              [--check]
 *
 * --check (the flood test of tests/meson.build): fails unless every result is exact, both
 * phases finish, loom's refusal lines stay within a small bound (one line and one summary per
 * listener and 10 s window) and the flooded median stays within 3x the baseline plus 10 ms.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "loom.h"
#include "sock.h"

#define MAX_RANKS 16
#define MAX_ITERS 100000

typedef struct {
    int nranks, conns;
    double reopen_s, phase_s;
    size_t bytes;
    loomUniqueId id;
    sock_addr_t addr[MAX_RANKS];
    atomic_int naddrs;
    atomic_int flood_on, flood_quit;
    atomic_long opened, dropped;
    double iter_ms[2][MAX_ITERS];
    int niters[2];
    char fail[MAX_RANKS][512];
} flood_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One phase of checked allreduces, for phase_s seconds (rank 0's clock decides for all). */
static int run_phase(flood_t *F, loomComm_t comm, int rank, int phase, int32_t *send, int32_t *recv,
                     size_t count)
{
    int32_t tri = F->nranks * (F->nranks + 1) / 2;
    double end = now_s() + F->phase_s;
    for (int it = 0; it < MAX_ITERS; it++) {
        uint32_t salt = (uint32_t)it * 2654435761u + (uint32_t)phase;
        for (size_t i = 0; i < count; i++)
            send[i] = (int32_t)((uint32_t)(rank + 1) * ((i ^ salt) & 0xffff));
        double t0 = now_s();
        loomResult_t r = loomAllReduce(send, recv, count, loomInt32, loomSum, comm, NULL);
        double dt = now_s() - t0;
        if (r != loomSuccess) {
            snprintf(F->fail[rank], sizeof(F->fail[rank]), "phase %d iteration %d: %d: %.400s",
                     phase, it, (int)r, loomGetLastError(comm));
            return 1;
        }
        for (size_t i = 0; i < count; i++)
            if (recv[i] != tri * (int32_t)((i ^ salt) & 0xffff)) {
                snprintf(F->fail[rank], sizeof(F->fail[rank]),
                         "phase %d iteration %d: [%zu] = %d, want %d", phase, it, i, recv[i],
                         tri * (int32_t)((i ^ salt) & 0xffff));
                return 1;
            }
        if (rank == 0) {
            F->iter_ms[phase][it] = dt * 1e3;
            F->niters[phase] = it + 1;
        }
        int32_t more = now_s() < end, any = 0;
        if (loomAllReduce(&more, &any, 1, loomInt32, loomMax, comm, NULL) != loomSuccess) {
            snprintf(F->fail[rank], sizeof(F->fail[rank]), "phase %d: flag: %.400s", phase,
                     loomGetLastError(comm));
            return 1;
        }
        if (!any) break;
    }
    return 0;
}

typedef struct {
    flood_t *F;
    int rank;
    int rc;
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    flood_t *F = a->F;
    loomComm_t comm;
    if (loomCommInitRank(&comm, F->nranks, F->id, a->rank) != loomSuccess) {
        snprintf(F->fail[a->rank], sizeof(F->fail[a->rank]), "init: %.400s",
                 loomGetLastError(NULL));
        a->rc = 1;
        return NULL;
    }
    if (a->rank == 0) {
        for (int r = 0; r < F->nranks; r++)
            sock_addr_unpack(comm->lay.peers[r].handle[TP_TCP], &F->addr[r]);
        atomic_store(&F->naddrs, F->nranks);
    }
    size_t count = F->bytes / sizeof(int32_t);
    int32_t *send = malloc(count * sizeof(int32_t)), *recv = malloc(count * sizeof(int32_t));
    int rc = send == NULL || recv == NULL;
    /* Warm-up: connections made, pages touched. */
    for (int i = 0; i < 3 && rc == 0; i++)
        if (loomAllReduce(send, recv, count, loomInt32, loomSum, comm, NULL) != loomSuccess) {
            snprintf(F->fail[a->rank], sizeof(F->fail[a->rank]), "warm-up: %.400s",
                     loomGetLastError(comm));
            rc = 1;
        }
    if (rc == 0) rc = run_phase(F, comm, a->rank, 0, send, recv, count);
    if (rc == 0) {
        /* Everyone waits for the flood to be in place. */
        if (a->rank == 0) {
            atomic_store(&F->flood_on, 1);
            while (atomic_load(&F->flood_on) == 1)
                usleep(10000);
        }
        int32_t z = 0, o = 0;
        if (loomAllReduce(&z, &o, 1, loomInt32, loomSum, comm, NULL) != loomSuccess) rc = 1;
    }
    if (rc == 0) rc = run_phase(F, comm, a->rank, 1, send, recv, count);
    free(send);
    free(recv);
    loomCommDestroy(comm);
    a->rc = rc;
    return NULL;
}

/* Opens the idle connections; every reopen_s closes them all (counting those loom had already
 * closed) and opens them again. */
static void *flooder_main(void *p)
{
    flood_t *F = p;
    while (atomic_load(&F->flood_on) == 0 && !atomic_load(&F->flood_quit))
        usleep(10000);
    int n = F->nranks * F->conns;
    int *fds = malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++)
        fds[i] = -1;
    bool first = true;
    while (!atomic_load(&F->flood_quit)) {
        for (int i = 0; i < n; i++) {
            if (fds[i] >= 0) {
                /* Closed by loom (its challenge may still be unread): the peer hung up. */
                struct pollfd pf = {.fd = fds[i], .events = POLLRDHUP};
                if (poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP)))
                    atomic_fetch_add(&F->dropped, 1);
                close(fds[i]);
            }
            if (sock_connect_start(&F->addr[i % F->nranks], &fds[i]) != loomSuccess)
                fds[i] = -1;
            else
                atomic_fetch_add(&F->opened, 1);
        }
        if (first) {
            first = false;
            usleep(500000); /* let them pile up before the timed phase */
            atomic_store(&F->flood_on, 2);
        }
        double until = now_s() + F->reopen_s;
        while (now_s() < until && !atomic_load(&F->flood_quit))
            usleep(20000);
    }
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);
    return NULL;
}

static void stats(const double *v, int n, double *med, double *p90)
{
    double *c = malloc((size_t)(n ? n : 1) * sizeof(double));
    memcpy(c, v, (size_t)n * sizeof(double));
    qsort(c, (size_t)n, sizeof(double), cmp_double);
    *med = n ? c[n / 2] : 0;
    *p90 = n ? c[(n * 9) / 10] : 0;
    free(c);
}

int main(int argc, char **argv)
{
    static flood_t F;
    F.nranks = 2;
    F.conns = 300;
    F.reopen_s = 5;
    F.bytes = 4u << 20;
    F.phase_s = 5;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--check"))
            check = true;
        else if (!strcmp(a, "-n") && v)
            F.nranks = atoi(argv[++i]);
        else if (!strcmp(a, "-c") && v)
            F.conns = atoi(argv[++i]);
        else if (!strcmp(a, "-r") && v)
            F.reopen_s = atof(argv[++i]);
        else if (!strcmp(a, "-s") && v)
            F.bytes = (size_t)strtoull(argv[++i], NULL, 0);
        else if (!strcmp(a, "-t") && v)
            F.phase_s = atof(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [-n ranks] [-c conns per rank] [-r reopen s] [-s bytes] "
                    "[-t seconds per phase] [--check]\n",
                    argv[0]);
            return 2;
        }
    }
    if (F.nranks < 2 || F.nranks > MAX_RANKS || F.conns < 0 || F.bytes < 4) {
        fprintf(stderr, "loom-flood: 2 to %d ranks, conns >= 0, bytes >= 4\n", MAX_RANKS);
        return 2;
    }
    setenv("LOOM_TRANSPORT", "tcp", 1);
    if (getenv("LOOM_SOCKET_IFNAME") == NULL) setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* loom's log (its refusal lines) goes to a file, counted at the end. */
    char logpath[] = "/tmp/loom-flood-log-XXXXXX";
    int logfd = mkstemp(logpath);
    int saved_err = dup(2);
    if (logfd < 0 || saved_err < 0) {
        perror("loom-flood: log file");
        return 1;
    }
    dup2(logfd, 2);
    if (loomGetUniqueId(&F.id) != loomSuccess) {
        dup2(saved_err, 2);
        fprintf(stderr, "loom-flood: loomGetUniqueId: %s\n", loomGetLastError(NULL));
        return 1;
    }
    pthread_t fl, t[MAX_RANKS];
    rank_arg_t ra[MAX_RANKS];
    pthread_create(&fl, NULL, flooder_main, &F);
    double t0 = now_s();
    for (int r = 0; r < F.nranks; r++) {
        ra[r] = (rank_arg_t){.F = &F, .rank = r};
        pthread_create(&t[r], NULL, rank_main, &ra[r]);
    }
    int bad = 0;
    for (int r = 0; r < F.nranks; r++) {
        pthread_join(t[r], NULL);
        bad += ra[r].rc != 0;
    }
    atomic_store(&F.flood_quit, 1);
    pthread_join(fl, NULL);
    double wall = now_s() - t0;
    fflush(stderr);
    dup2(saved_err, 2);
    /* Count loom's lines about strangers. */
    FILE *lf = fopen(logpath, "r");
    int lines = 0, refusal_lines = 0;
    char line[4096];
    while (lf && fgets(line, sizeof(line), lf)) {
        lines++;
        if (strstr(line, "refused") || strstr(line, "dropped")) {
            refusal_lines++;
            if (refusal_lines <= 8) fprintf(stderr, "  log: %s", line);
        }
    }
    if (lf) fclose(lf);
    unlink(logpath);
    double bmed, b90, fmed, f90;
    stats(F.iter_ms[0], F.niters[0], &bmed, &b90);
    stats(F.iter_ms[1], F.niters[1], &fmed, &f90);
    printf("loom-flood: %d ranks, %zu-byte int32 allreduce over tcp, %d idle connections per rank "
           "reopened every %.1f s\n",
           F.nranks, F.bytes, F.conns, F.reopen_s);
    printf("  baseline: %5d iterations, median %8.2f ms, p90 %8.2f ms\n", F.niters[0], bmed, b90);
    printf("  flooded:  %5d iterations, median %8.2f ms, p90 %8.2f ms\n", F.niters[1], fmed, f90);
    printf("  flooder opened %ld connections, found %ld closed by loom; loom wrote %d log lines, "
           "%d about refusals (%.1f s in all)\n",
           atomic_load(&F.opened), atomic_load(&F.dropped), lines, refusal_lines, wall);
    for (int r = 0; r < F.nranks; r++)
        if (F.fail[r][0]) printf("  rank %d failed: %s\n", r, F.fail[r]);
    if (bad) return 1;
    if (!check) return 0;
    /* Per listener: a first line and one summary per 10 s window (and one more window at the
     * edges). */
    int windows = (int)(wall / 10) + 2;
    int bound = F.nranks * 2 * windows;
    int rc = 0;
    if (refusal_lines > bound) {
        printf("FAIL: %d refusal lines, more than %d\n", refusal_lines, bound);
        rc = 1;
    }
    if (F.niters[0] < 3 || F.niters[1] < 3) {
        printf("FAIL: too few iterations\n");
        rc = 1;
    }
    if (F.conns > 0 && atomic_load(&F.opened) < F.conns * F.nranks) {
        printf("FAIL: the flooder could not open its connections\n");
        rc = 1;
    }
    if (fmed > 3 * bmed + 10) {
        printf("FAIL: flooded median %.2f ms, more than 3x the baseline %.2f ms + 10 ms\n", fmed,
               bmed);
        rc = 1;
    }
    if (rc == 0) printf("loom-flood: check passed\n");
    return rc;
}
