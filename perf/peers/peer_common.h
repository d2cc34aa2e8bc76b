/*
 * Shared by the peer benchmarks (peer_mpi.c, peer_gloo.cc): option parsing, test data, result
 * checking and the nccl-tests style table and CSV, so that every peer reports in exactly the
 * format of loom-perf and its numbers can be compared column by column.
 *
 * Header-only and written in the common subset of C11 and C++14 so both programs include it.
 */
#ifndef LOOM_PERF_PEER_COMMON_H
#define LOOM_PERF_PEER_COMMON_H

#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum peer_dtype { PEER_FLOAT, PEER_DOUBLE, PEER_INT32 };

struct peer_opts {
    int nranks;            /* -P: ranks to fork (gloo only; mpirun decides for MPI) */
    size_t min_bytes;      /* -b */
    size_t max_bytes;      /* -e */
    size_t factor;         /* -f: sizes grow by this factor; <= 1 means only min_bytes */
    int iters;             /* -n */
    int warmup;            /* -w */
    enum peer_dtype dtype; /* -d */
    int check;             /* -c */
    const char *csv;       /* --csv */
    const char *algo;      /* -A (gloo only) */
    int timeout_s;         /* -t: a rank stuck this long on one size/algorithm is killed (gloo) */
    int verbose;           /* -v */
};

static inline size_t peer_type_size(enum peer_dtype t)
{
    return t == PEER_DOUBLE ? sizeof(double) : t == PEER_INT32 ? sizeof(int32_t) : sizeof(float);
}

static inline const char *peer_type_name(enum peer_dtype t)
{
    return t == PEER_DOUBLE ? "double" : t == PEER_INT32 ? "int32" : "float";
}

/* nccl-tests' parsesize: binary suffixes, so 64M is 64 MiB like in loom-perf. */
static inline int peer_parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s) return -1;
    unsigned long long mult = 1;
    switch (*end) {
    case 'G':
    case 'g':
        mult = 1ULL << 30;
        end++;
        break;
    case 'M':
    case 'm':
        mult = 1ULL << 20;
        end++;
        break;
    case 'K':
    case 'k':
        mult = 1ULL << 10;
        end++;
        break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0') return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static inline void peer_usage(FILE *f, const char *prog, int gloo)
{
    fprintf(f,
            "usage: %s%s [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
            "       [-d float|double|int32] [-o sum] [-c 0|1] [--csv FILE]%s [-v]\n"
            "sizes take K/M/G (binary) suffixes; defaults -b 32M -e 32M -f 2 -n 20 -w 5 -c 1\n",
            prog, gloo ? " [-P NRANKS]" : "",
            gloo ? " [-A ALGO[,ALGO...]|all] [-t TIMEOUT_S]" : "");
}

/* Returns 0 on success, 1 after printing help, -1 on a bad option. */
static inline int peer_parse_args(int argc, char **argv, struct peer_opts *o, int gloo)
{
    static const struct option longopts[] = {
        {"csv", required_argument, NULL, 'C'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    o->nranks = 2;
    o->min_bytes = o->max_bytes = 32u << 20;
    o->factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->dtype = PEER_FLOAT;
    o->check = 1;
    o->csv = NULL;
    o->algo = "all";
    o->timeout_s = 600;
    o->verbose = 0;

    int c;
    while ((c = getopt_long(argc, argv, gloo ? "P:b:e:f:n:w:d:o:c:A:t:vh" : "b:e:f:n:w:d:o:c:vh",
                            longopts, NULL)) != -1) {
        switch (c) {
        case 'P': o->nranks = atoi(optarg); break;
        case 'b':
            if (peer_parse_size(optarg, &o->min_bytes) != 0) goto bad;
            break;
        case 'e':
            if (peer_parse_size(optarg, &o->max_bytes) != 0) goto bad;
            break;
        case 'f': o->factor = (size_t)strtoull(optarg, NULL, 10); break;
        case 'n': o->iters = atoi(optarg); break;
        case 'w': o->warmup = atoi(optarg); break;
        case 'd':
            if (strcasecmp(optarg, "float") == 0 || strcasecmp(optarg, "float32") == 0)
                o->dtype = PEER_FLOAT;
            else if (strcasecmp(optarg, "double") == 0 || strcasecmp(optarg, "float64") == 0)
                o->dtype = PEER_DOUBLE;
            else if (strcasecmp(optarg, "int32") == 0 || strcasecmp(optarg, "int") == 0)
                o->dtype = PEER_INT32;
            else
                goto bad;
            break;
        case 'o':
            /* The comparison is about sum; other ops would only add untested code paths. */
            if (strcmp(optarg, "sum") != 0) goto bad;
            break;
        case 'c': o->check = atoi(optarg) != 0; break;
        case 'C': o->csv = optarg; break;
        case 'A': o->algo = optarg; break;
        case 't': o->timeout_s = atoi(optarg); break;
        case 'v': o->verbose = 1; break;
        case 'h': peer_usage(stdout, argv[0], gloo); return 1;
        default: goto bad;
        }
    }
    if (optind != argc || o->nranks < 1 || o->iters < 1 || o->warmup < 0 ||
        o->min_bytes > o->max_bytes || o->timeout_s < 1)
        goto bad;
    return 0;
bad:
    peer_usage(stderr, argv[0], gloo);
    return -1;
}

/*
 * Test data: small rank-dependent integers, so every partial sum is exact in float, double and
 * int32 whatever order an algorithm adds in, and the result can be checked with ==.
 */
#define PEER_PATTERN 13

static inline void peer_fill(void *buf, size_t count, enum peer_dtype t, int rank)
{
    size_t i;
    switch (t) {
    case PEER_FLOAT:
        for (i = 0; i < count; i++)
            ((float *)buf)[i] = (float)((rank + 1) * (int)(i % PEER_PATTERN + 1));
        break;
    case PEER_DOUBLE:
        for (i = 0; i < count; i++)
            ((double *)buf)[i] = (double)((rank + 1) * (int)(i % PEER_PATTERN + 1));
        break;
    case PEER_INT32:
        for (i = 0; i < count; i++)
            ((int32_t *)buf)[i] = (int32_t)((rank + 1) * (int)(i % PEER_PATTERN + 1));
        break;
    }
}

/* Counts elements that differ from sum over ranks r of (r + 1) * (i % PEER_PATTERN + 1). */
static inline size_t peer_count_wrong(const void *buf, size_t count, enum peer_dtype t, int nranks)
{
    const long tri = (long)nranks * (nranks + 1) / 2;
    size_t i, wrong = 0;
    switch (t) {
    case PEER_FLOAT:
        for (i = 0; i < count; i++)
            wrong += ((const float *)buf)[i] != (float)(tri * (long)(i % PEER_PATTERN + 1));
        break;
    case PEER_DOUBLE:
        for (i = 0; i < count; i++)
            wrong += ((const double *)buf)[i] != (double)(tri * (long)(i % PEER_PATTERN + 1));
        break;
    case PEER_INT32:
        for (i = 0; i < count; i++)
            wrong += ((const int32_t *)buf)[i] != (int32_t)(tri * (long)(i % PEER_PATTERN + 1));
        break;
    }
    return wrong;
}

/* algbw in GB/s (1e9, as nccl-tests) from bytes and microseconds; busbw scales it by the
 * 2(p-1)/p bytes each rank must move in an allreduce. */
static inline double peer_algbw(size_t bytes, double us)
{
    return us > 0 ? (double)bytes / 1e3 / us : 0.0;
}

static inline double peer_busbw(size_t bytes, double us, int nranks)
{
    return peer_algbw(bytes, us) * 2.0 * (nranks - 1) / nranks;
}

static inline void peer_print_header(const struct peer_opts *o, const char *prog, int nranks,
                                     const char *extra_col)
{
    printf("# %s: nranks %d minBytes %zu maxBytes %zu step: %zu(factor) warmup iters: %d "
           "iters: %d validation: %d\n",
           prog, nranks, o->min_bytes, o->max_bytes, o->factor, o->warmup, o->iters, o->check);
    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
           "          \n",
           "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s%s%s\n", "size",
           "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
           "busbw", "#wrong", extra_col ? "  " : "", extra_col ? extra_col : "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "");
}

/* nccl-tests keeps the time column 7 wide by dropping decimals as the time grows. */
static inline void peer_fmt_time(char *s, size_t n, double us)
{
    snprintf(s, n, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

struct peer_result {
    size_t bytes, count;
    double oop_us, ip_us;
    double oop_wrong, ip_wrong; /* summed over ranks; ignored when checking is off */
};

static inline void peer_print_row(const struct peer_opts *o, const struct peer_result *r,
                                  int nranks, const char *extra)
{
    char t1[32], t2[32], w1[32], w2[32];
    peer_fmt_time(t1, sizeof t1, r->oop_us);
    peer_fmt_time(t2, sizeof t2, r->ip_us);
    if (o->check) {
        snprintf(w1, sizeof w1, "%5.0f", r->oop_wrong);
        snprintf(w2, sizeof w2, "%5.0f", r->ip_wrong);
    } else {
        snprintf(w1, sizeof w1, "%5s", "N/A");
        snprintf(w2, sizeof w2, "%5s", "N/A");
    }
    printf("%12zu  %12zu  %8s  %6s  %6i  %7s  %6.2f  %6.2f  %5s  %7s  %6.2f  %6.2f  %5s%s%s\n",
           r->bytes, r->count, peer_type_name(o->dtype), "sum", -1, t1,
           peer_algbw(r->bytes, r->oop_us), peer_busbw(r->bytes, r->oop_us, nranks), w1, t2,
           peer_algbw(r->bytes, r->ip_us), peer_busbw(r->bytes, r->ip_us, nranks), w2,
           extra ? "  " : "", extra ? extra : "");
    fflush(stdout);
}

static inline void peer_print_footer(const struct peer_opts *o, double wrong_total,
                                     double busbw_sum, int nbusbw)
{
    if (o->check)
        printf("# Out of bounds values : %.0f %s\n", wrong_total,
               wrong_total == 0 ? "OK" : "FAILED");
    printf("# Avg bus bandwidth    : %g \n", nbusbw > 0 ? busbw_sum / nbusbw : 0.0);
    printf("#\n");
    fflush(stdout);
}

static inline FILE *peer_csv_open(const char *path)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    fprintf(f, "size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
               "ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
    return f;
}

static inline void peer_csv_row(FILE *f, const struct peer_opts *o, const struct peer_result *r,
                                int nranks)
{
    char w1[32], w2[32];
    if (o->check) {
        snprintf(w1, sizeof w1, "%.0f", r->oop_wrong);
        snprintf(w2, sizeof w2, "%.0f", r->ip_wrong);
    } else {
        snprintf(w1, sizeof w1, "N/A");
        snprintf(w2, sizeof w2, "N/A");
    }
    fprintf(f, "%zu,%zu,%s,sum,-1,%.3f,%.4f,%.4f,%s,%.3f,%.4f,%.4f,%s\n", r->bytes, r->count,
            peer_type_name(o->dtype), r->oop_us, peer_algbw(r->bytes, r->oop_us),
            peer_busbw(r->bytes, r->oop_us, nranks), w1, r->ip_us, peer_algbw(r->bytes, r->ip_us),
            peer_busbw(r->bytes, r->ip_us, nranks), w2);
    fflush(f);
}

/* Next size in the sweep, or 0 when done; a factor <= 1 runs min_bytes only. */
static inline size_t peer_next_size(const struct peer_opts *o, size_t bytes)
{
    if (o->factor <= 1 || bytes == 0 || bytes > o->max_bytes / o->factor) return 0;
    return bytes * o->factor;
}

#endif /* LOOM_PERF_PEER_COMMON_H */
