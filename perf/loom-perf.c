/*
 * loom-perf: collective benchmarks with the table of nccl-tests, so results read beside NCCL's.
 *
 * time   mean per iteration of the timed loop, in microseconds, averaged over ranks
 * algbw  bytes / time, bytes being the size column (GB/s = 1e9 bytes/s)
 * busbw  algbw scaled to what each link carries: allreduce 2(p-1)/p, reduce-scatter and
 *        allgather (p-1)/p, broadcast, reduce and alltoall (p-1)/p for alltoall, 1 otherwise
 * #wrong elements differing from the exact expected result, summed over ranks (-c 1)
 *
 * Ranks: `-P k` forks k local ranks as children of this process (no launcher needed); otherwise
 * one rank per process from the launcher's environment (LOOM_RANK/LOOM_WORLD_SIZE with an id
 * file, see --help).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

typedef enum { C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER, C_ALLTOALL } coll_t;
static const char *coll_names[] = {"allreduce", "broadcast", "reduce", "allgather",
                                   "reducescatter", "alltoall"};

typedef struct {
    uint64_t minb, maxb;
    double factor;
    uint64_t step;
    int iters, warmup, check, root, nranks_local;
    int types[loomNumTypes], ntypes;
    int ops[loomNumOps], nops;
    coll_t coll;
    int mem_device;
    const char *csv, *json;
    int blocking_inplace; /* 0: oop only, 1: both */
} opts_t;

static const char *type_names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                   "half", "float", "double", "bfloat16"};
static const size_t type_sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};

static void die(int rank, const char *what, loomResult_t r, loomComm_t comm)
{
    fprintf(stderr, "loom-perf: rank %d: %s failed: %s (%s)\n", rank, what,
            loomGetErrorString(r), loomGetLastError(comm));
    fflush(stderr);
    _exit(2);
}

#define CHECK(rank, comm, call)                                                                   \
    do {                                                                                          \
        loomResult_t r_ = (call);                                                                 \
        if (r_ != loomSuccess) die(rank, #call, r_, comm);                                        \
    } while (0)

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1024; end++; break;
    case 'm': case 'M': v *= 1024 * 1024; end++; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* ---- exact inputs ---- */

static uint16_t f2h(float f)
{
    /* values are small integers: exact in half */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    if (f == 0) return (uint16_t)sign;
    int e = (int)((x >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | ((uint32_t)e << 10) | ((x >> 13) & 0x3ff));
}
static float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0 && m == 0) x = sign;
    else if (e == 0) { float v = ldexpf((float)m, -24); return (h & 0x8000) ? -v : v; }
    else x = sign | ((e - 15 + 127) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static uint16_t f2bf(float f) { uint32_t x; memcpy(&x, &f, 4); return (uint16_t)(x >> 16); }
static float bf2f(uint16_t b) { uint32_t x = (uint32_t)b << 16; float f; memcpy(&f, &x, 4); return f; }

/* Rank r's value at element i for op: chosen so that any order of the reduction is exact. */
static double input_value(int type, int op, int r, size_t i, int p)
{
    (void)p;
    switch (op) {
    case loomProd:
        /* at most one rank contributes 2 or -1 per element: products stay tiny */
        return ((size_t)r == i % (size_t)p) ? ((i / (size_t)p) % 3 == 0 ? -1 : 2) : 1;
    case loomMax:
    case loomMin: {
        int v = (int)((i * 7 + (size_t)r * 13) % 31);
        bool is_unsigned = type == loomUint8 || type == loomUint32 || type == loomUint64;
        return is_unsigned ? v : v - 15;
    }
    default: {
        int span = (type == loomHalf || type == loomBfloat16 || type == loomInt8 ||
                    type == loomUint8) ? 3 : 17;
        int v = (int)((i * 5 + (size_t)r * 3) % (size_t)span);
        bool is_unsigned = type == loomUint8 || type == loomUint32 || type == loomUint64;
        return is_unsigned ? v : v - span / 2;
    }
    }
}

static void store(int type, void *buf, size_t i, double v)
{
    switch (type) {
    case loomInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case loomUint8: ((uint8_t *)buf)[i] = (uint8_t)(int)v; break;
    case loomInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case loomUint32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case loomInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case loomUint64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case loomHalf: ((uint16_t *)buf)[i] = f2h((float)v); break;
    case loomFloat: ((float *)buf)[i] = (float)v; break;
    case loomDouble: ((double *)buf)[i] = v; break;
    case loomBfloat16: ((uint16_t *)buf)[i] = f2bf((float)v); break;
    }
}

static double load(int type, const void *buf, size_t i)
{
    switch (type) {
    case loomInt8: return ((const int8_t *)buf)[i];
    case loomUint8: return ((const uint8_t *)buf)[i];
    case loomInt32: return ((const int32_t *)buf)[i];
    case loomUint32: return ((const uint32_t *)buf)[i];
    case loomInt64: return (double)((const int64_t *)buf)[i];
    case loomUint64: return (double)((const uint64_t *)buf)[i];
    case loomHalf: return h2f(((const uint16_t *)buf)[i]);
    case loomFloat: return ((const float *)buf)[i];
    case loomDouble: return ((const double *)buf)[i];
    case loomBfloat16: return bf2f(((const uint16_t *)buf)[i]);
    }
    return 0;
}

/* What element i must hold after a reduction over p ranks (inputs of input_value). */
static double expected_reduced(int type, int op, size_t i, int p)
{
    double acc = input_value(type, op, 0, i, p);
    for (int r = 1; r < p; r++) {
        double v = input_value(type, op, r, i, p);
        switch (op) {
        case loomProd: acc *= v; break;
        case loomMax: acc = v > acc ? v : acc; break;
        case loomMin: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (op == loomAvg) {
        bool integer = type <= loomUint64;
        if (integer) acc = trunc(acc / p);
        else if (type == loomFloat) acc = (double)((float)acc / (float)p);
        else if (type == loomHalf) acc = (double)((float)acc / (float)p);
        else if (type == loomBfloat16) acc = (double)((float)acc / (float)p);
        else acc = acc / p;
    }
    return acc;
}

/* The value the type holds for v (inputs and exact results are small integers, so this is
 * exact; avg of float16/bfloat16 is compared with a tolerance below). */
static double as_type(int type, double v)
{
    uint8_t tmp[8];
    store(type, tmp, 0, v);
    return load(type, tmp, 0);
}

typedef struct {
    loomComm_t comm;
    int rank, nranks;
    const opts_t *o;
} ctx_t;

static size_t out_count(coll_t c, size_t count, int p)
{
    return (c == C_ALLGATHER || c == C_ALLTOALL) ? count * (size_t)p : count;
}
static size_t in_count(coll_t c, size_t count, int p)
{
    return (c == C_REDUCESCATTER || c == C_ALLTOALL) ? count * (size_t)p : count;
}

/* size column semantics as nccl-tests: bytes of the larger buffer */
static size_t count_for_bytes(coll_t c, uint64_t bytes, size_t es, int p)
{
    size_t n = (size_t)(bytes / es);
    if (c == C_ALLGATHER || c == C_REDUCESCATTER || c == C_ALLTOALL) n /= (size_t)p;
    return n;
}

static double bus_factor(coll_t c, int p)
{
    switch (c) {
    case C_ALLREDUCE: return p > 1 ? 2.0 * (p - 1) / p : 0;
    case C_ALLGATHER:
    case C_REDUCESCATTER:
    case C_ALLTOALL: return p > 1 ? (double)(p - 1) / p : 0;
    default: return 1;
    }
}

static loomResult_t run_coll(ctx_t *x, const void *s, void *r, size_t count, int type, int op)
{
    switch (x->o->coll) {
    case C_ALLREDUCE: return loomAllReduce(s, r, count, type, op, x->comm, NULL);
    case C_BROADCAST: return loomBroadcast(s, r, count, type, x->o->root, x->comm, NULL);
    case C_REDUCE: return loomReduce(s, r, count, type, op, x->o->root, x->comm, NULL);
    case C_ALLGATHER: return loomAllGather(s, r, count, type, x->comm, NULL);
    case C_REDUCESCATTER: return loomReduceScatter(s, r, count, type, op, x->comm, NULL);
    case C_ALLTOALL: return loomAlltoAll(s, r, count, type, x->comm, NULL);
    }
    return loomInvalidArgument;
}

/* Fills this rank's input; for in place the input lives inside the output buffer. */
static void fill_input(ctx_t *x, void *buf, size_t count, int type, int op)
{
    int p = x->nranks, r = x->rank;
    size_t n = in_count(x->o->coll, count, p);
    for (size_t i = 0; i < n; i++) {
        size_t gi = i;
        if (x->o->coll == C_ALLTOALL) gi = (i % count) + (size_t)r * count + (i / count) * 7;
        store(type, buf, i, input_value(type, op, r, gi, p));
    }
}

static long check_output(ctx_t *x, const void *buf, size_t count, int type, int op)
{
    int p = x->nranks, r = x->rank;
    long wrong = 0;
    coll_t c = x->o->coll;
    if (c == C_REDUCE && r != x->o->root) return 0;
    size_t n = out_count(c, count, p);
    for (size_t i = 0; i < n; i++) {
        double want;
        switch (c) {
        case C_ALLREDUCE:
        case C_REDUCE: want = expected_reduced(type, op, i, p); break;
        case C_REDUCESCATTER: want = expected_reduced(type, op, (size_t)r * count + i, p); break;
        case C_BROADCAST: want = input_value(type, op, x->o->root, i, p); break;
        case C_ALLGATHER: want = input_value(type, op, (int)(i / count), i % count, p); break;
        case C_ALLTOALL: {
            /* rank `from` filled the element bound for rank r with this index */
            int from = (int)(i / count);
            size_t gi = (i % count) + (size_t)from * count + (size_t)r * 7;
            want = input_value(type, op, from, gi, p);
            break;
        }
        default: want = 0;
        }
        want = as_type(type, want);
        double got = load(type, buf, i);
        double tol = 0;
        if (op == loomAvg && (type == loomHalf || type == loomBfloat16))
            tol = fabs(want) * (type == loomHalf ? 1e-3 : 8e-3);
        if (fabs(got - want) > tol) wrong++;
    }
    return wrong;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Mean over ranks of each value; sum over ranks of wrong counts. */
static void reduce_results(ctx_t *x, double *t, int nt, long *w, int nw)
{
    double buf[8];
    memcpy(buf, t, sizeof(double) * (size_t)nt);
    for (int i = 0; i < nw; i++) buf[nt + i] = (double)w[i];
    CHECK(x->rank, x->comm, loomAllReduce(buf, buf, (size_t)(nt + nw), loomDouble, loomSum,
                                          x->comm, NULL));
    for (int i = 0; i < nt; i++) t[i] = buf[i] / x->nranks;
    for (int i = 0; i < nw; i++) w[i] = (long)buf[nt + i];
}

static int run_rank(ctx_t *x)
{
    const opts_t *o = x->o;
    int p = x->nranks;
    FILE *csv = NULL, *json = NULL;
    if (x->rank == 0) {
        printf("# loom-perf %s: %d ranks, %d warmup + %d timed iterations, check %s\n",
               coll_names[o->coll], p, o->warmup, o->iters, o->check ? "on" : "off");
        printf("#\n#                                                  out-of-place                "
               "       in-place\n");
        printf("#       size         count      type   redop    root     time   algbw   busbw "
               "#wrong     time   algbw   busbw #wrong\n");
        printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)   "
               "          (us)  (GB/s)  (GB/s)\n");
        fflush(stdout);
        if (o->csv && !(csv = fopen(o->csv, "w"))) {
            fprintf(stderr, "loom-perf: cannot write %s: %s\n", o->csv, strerror(errno));
            return 2;
        }
        if (csv)
            fprintf(csv, "size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
                         "ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
        if (o->json && !(json = fopen(o->json, "w"))) {
            fprintf(stderr, "loom-perf: cannot write %s: %s\n", o->json, strerror(errno));
            return 2;
        }
        if (json) fprintf(json, "{\"collective\": \"%s\", \"ranks\": %d, \"results\": [\n",
                          coll_names[o->coll], p);
    }
    uint64_t maxb = o->maxb;
    int first_json = 1;
    long total_wrong = 0;
    double bw_sum = 0;
    int nbw = 0;
    for (int ti = 0; ti < o->ntypes; ti++) {
        int type = o->types[ti];
        size_t es = type_sizes[type];
        size_t maxcount = count_for_bytes(o->coll, maxb, es, p);
        size_t maxin = in_count(o->coll, maxcount, p), maxout = out_count(o->coll, maxcount, p);
        size_t big = maxin > maxout ? maxin : maxout;
        uint8_t *sbuf = malloc(maxin * es + 64), *rbuf = malloc(big * es + 64);
        if (!sbuf || !rbuf) {
            fprintf(stderr, "loom-perf: out of memory for %zu bytes\n", big * es);
            return 2;
        }
        memset(sbuf, 0, maxin * es);
        memset(rbuf, 0, big * es);
        for (int oi = 0; oi < o->nops; oi++) {
            int op = o->ops[oi];
            for (uint64_t bytes = o->minb; bytes <= maxb;) {
                size_t count = count_for_bytes(o->coll, bytes, es, p);
                size_t sizeb = out_count(o->coll, count, p) * es;
                if (o->coll == C_REDUCESCATTER) sizeb = count * (size_t)p * es;
                double t[2] = {0, 0};
                long w[2] = {0, 0};
                for (int ip = 0; ip < 2; ip++) {
                    void *s = sbuf, *r = rbuf;
                    if (ip) {
                        r = rbuf;
                        s = rbuf;
                        if (o->coll == C_ALLGATHER) s = rbuf + (size_t)x->rank * count * es;
                    }
                    void *inbuf = s;
                    if (ip && o->coll == C_REDUCESCATTER) inbuf = rbuf, r = rbuf + (size_t)x->rank * count * es;
                    if (o->check) {
                        fill_input(x, inbuf, count, type, op);
                        CHECK(x->rank, x->comm, run_coll(x, s, r, count, type, op));
                        w[ip] = check_output(x, r, count, type, op);
                    }
                    for (int i = 0; i < o->warmup; i++)
                        CHECK(x->rank, x->comm, run_coll(x, s, r, count, type, op));
                    CHECK(x->rank, x->comm, loomAllReduce(t, t, 0, loomDouble, loomSum, x->comm, NULL));
                    double bar = 0;
                    CHECK(x->rank, x->comm, loomAllReduce(&bar, &bar, 1, loomDouble, loomSum, x->comm, NULL));
                    double t0 = now_us();
                    for (int i = 0; i < o->iters; i++)
                        CHECK(x->rank, x->comm, run_coll(x, s, r, count, type, op));
                    t[ip] = (now_us() - t0) / (o->iters > 0 ? o->iters : 1);
                }
                reduce_results(x, t, 2, w, 2);
                total_wrong += w[0] + w[1];
                if (x->rank == 0) {
                    double alg[2], bus[2];
                    for (int i = 0; i < 2; i++) {
                        alg[i] = t[i] > 0 ? (double)sizeb / t[i] / 1e3 : 0;
                        bus[i] = alg[i] * bus_factor(o->coll, p);
                    }
                    bw_sum += bus[0];
                    nbw++;
                    int root = (o->coll == C_BROADCAST || o->coll == C_REDUCE) ? o->root : -1;
                    printf("%12zu  %12zu  %8s  %6s  %6d  %8.2f  %6.2f  %6.2f  %5ld  %8.2f  %6.2f  "
                           "%6.2f  %5ld\n",
                           sizeb, count, type_names[type], op_names[op], root, t[0], alg[0],
                           bus[0], o->check ? w[0] : -1L, t[1], alg[1], bus[1],
                           o->check ? w[1] : -1L);
                    fflush(stdout);
                    if (csv)
                        fprintf(csv, "%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%ld,%.3f,%.4f,%.4f,%ld\n",
                                sizeb, count, type_names[type], op_names[op], root, t[0], alg[0],
                                bus[0], w[0], t[1], alg[1], bus[1], w[1]);
                    if (json) {
                        fprintf(json,
                                "%s  {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", "
                                "\"redop\": \"%s\", \"root\": %d, \"oop\": {\"time_us\": %.3f, "
                                "\"algbw\": %.4f, \"busbw\": %.4f, \"wrong\": %ld}, "
                                "\"ip\": {\"time_us\": %.3f, \"algbw\": %.4f, \"busbw\": %.4f, "
                                "\"wrong\": %ld}}",
                                first_json ? "" : ",\n", sizeb, count, type_names[type],
                                op_names[op], root, t[0], alg[0], bus[0], w[0], t[1], alg[1],
                                bus[1], w[1]);
                        first_json = 0;
                    }
                }
                if (o->step) bytes += o->step;
                else {
                    uint64_t nb = (uint64_t)((double)bytes * o->factor);
                    bytes = nb > bytes ? nb : bytes + 1;
                }
            }
        }
        free(sbuf);
        free(rbuf);
    }
    if (x->rank == 0) {
        printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g\n#\n", nbw ? bw_sum / nbw : 0.0);
        fflush(stdout);
        if (csv) fclose(csv);
        if (json) {
            fprintf(json, "\n]}\n");
            fclose(json);
        }
    }
    return total_wrong ? 1 : 0;
}

static void usage(void)
{
    printf("usage: loom-perf [options]\n"
           "  -P k            fork k local ranks (default: 1 unless launched with LOOM_RANK)\n"
           "  -b, -e SIZE     minimum and maximum size in bytes (K, M, G suffixes) [8, 64M]\n"
           "  -f F            multiply the size by F each step [2]; -i S adds S instead\n"
           "  -n N, -w N      timed and warm-up iterations [20, 5]\n"
           "  -d TYPE         int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 "
           "or all [float]\n"
           "  -o OP           sum prod max min avg or all [sum]\n"
           "  -r ROOT         root of broadcast and reduce [0]\n"
           "  -c 0|1          check results (exact inputs, compared bit for bit) [1]\n"
           "  -C COLL         allreduce broadcast reduce allgather reducescatter alltoall "
           "[allreduce]\n"
           "  --mem host|device  buffer memory [device where a GPU is found, else host]\n"
           "  --csv FILE, --json FILE  write the results beside the table\n"
           "Launched one process per rank: torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR,\n"
           "MASTER_PORT; LOOM_JOB_SECRET for the secret), or LOOM_RANK, LOOM_WORLD_SIZE and\n"
           "LOOM_ID_FILE (rank 0 writes the unique id there, the others read it).\n");
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->minb = 8;
    o->maxb = 64ull << 20;
    o->factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->types[o->ntypes++] = loomFloat;
    o->ops[o->nops++] = loomSum;
    o->nranks_local = 0;
    const char *mem = NULL;
    static struct option lo[] = {{"mem", required_argument, 0, 'M'},
                                 {"csv", required_argument, 0, 'S'},
                                 {"json", required_argument, 0, 'J'},
                                 {"help", no_argument, 0, 'h'},
                                 {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "P:b:e:f:i:n:w:d:o:r:c:C:h", lo, NULL)) != -1) {
        switch (c) {
        case 'P': o->nranks_local = atoi(optarg); break;
        case 'b': if (parse_size(optarg, &o->minb)) return -1; break;
        case 'e': if (parse_size(optarg, &o->maxb)) return -1; break;
        case 'f': o->factor = atof(optarg); break;
        case 'i': if (parse_size(optarg, &o->step)) return -1; break;
        case 'n': o->iters = atoi(optarg); break;
        case 'w': o->warmup = atoi(optarg); break;
        case 'c': o->check = atoi(optarg); break;
        case 'r': o->root = atoi(optarg); break;
        case 'd': {
            o->ntypes = 0;
            for (int t = 0; t < loomNumTypes; t++)
                if (!strcmp(optarg, "all") || !strcmp(optarg, type_names[t]) ||
                    (!strcmp(optarg, "float32") && t == loomFloat) ||
                    (!strcmp(optarg, "float16") && t == loomHalf) ||
                    (!strcmp(optarg, "float64") && t == loomDouble) ||
                    (!strcmp(optarg, "bf16") && t == loomBfloat16))
                    o->types[o->ntypes++] = t;
            if (o->ntypes == 0) return -1;
            break;
        }
        case 'o': {
            o->nops = 0;
            for (int t = 0; t < loomNumOps; t++)
                if (!strcmp(optarg, "all") || !strcmp(optarg, op_names[t])) o->ops[o->nops++] = t;
            if (o->nops == 0) return -1;
            break;
        }
        case 'C': {
            int f = -1;
            for (int t = 0; t < 6; t++)
                if (!strcmp(optarg, coll_names[t])) f = t;
            if (f < 0) return -1;
            o->coll = (coll_t)f;
            break;
        }
        case 'M': mem = optarg; break;
        case 'S': o->csv = optarg; break;
        case 'J': o->json = optarg; break;
        case 'h': usage(); exit(0);
        default: return -1;
        }
    }
    if (o->minb > o->maxb || o->factor < 1 || o->iters < 0 || o->warmup < 0) return -1;
    if (mem && strcmp(mem, "host") && strcmp(mem, "device")) return -1;
    if (mem && !strcmp(mem, "device")) {
        fprintf(stderr, "loom-perf: --mem device: this build of loom has no GPU support "
                        "(no CUDA device or toolkit); use --mem host\n");
        exit(2);
    }
    return 0;
}

static int rank_main(const opts_t *o, loomUniqueId id, int rank, int nranks)
{
    ctx_t x = {.rank = rank, .nranks = nranks, .o = o};
    CHECK(rank, NULL, loomCommInitRank(&x.comm, nranks, id, rank));
    int rc = run_rank(&x);
    loomCommDestroy(x.comm);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o;
    if (parse_opts(argc, argv, &o) != 0) {
        usage();
        return 2;
    }
    /* loom-perf's own local launch stays on loopback unless told otherwise. */
    if (o.nranks_local > 0) setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    if (o.nranks_local == 0 && getenv("RANK") && getenv("WORLD_SIZE") && getenv("MASTER_ADDR")) {
        /* Started the way torchrun starts ranks: one process per rank. */
        ctx_t x = {.o = &o};
        int rank = atoi(getenv("RANK"));
        CHECK(rank, NULL, loomCommInitFromEnv(&x.comm, NULL));
        loomCommUserRank(x.comm, &x.rank);
        loomCommCount(x.comm, &x.nranks);
        int rc = run_rank(&x);
        loomCommDestroy(x.comm);
        return rc;
    }
    const char *er = getenv("LOOM_RANK"), *ew = getenv("LOOM_WORLD_SIZE");
    if (o.nranks_local == 0 && er && ew) {
        int rank = atoi(er), n = atoi(ew);
        const char *idf = getenv("LOOM_ID_FILE");
        if (!idf) {
            fprintf(stderr, "loom-perf: LOOM_RANK set but no LOOM_ID_FILE\n");
            return 2;
        }
        loomUniqueId id;
        if (rank == 0) {
            CHECK(0, NULL, loomGetUniqueId(&id));
            char tmp[4096];
            snprintf(tmp, sizeof(tmp), "%s.tmp", idf);
            FILE *f = fopen(tmp, "wb");
            if (!f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, idf)) {
                fprintf(stderr, "loom-perf: cannot write %s\n", idf);
                return 2;
            }
        } else {
            FILE *f = NULL;
            for (int i = 0; i < 600 && !(f = fopen(idf, "rb")); i++) usleep(100000);
            if (!f || fread(&id, sizeof(id), 1, f) != 1) {
                fprintf(stderr, "loom-perf: rank %d cannot read the id from %s\n", rank, idf);
                return 2;
            }
            fclose(f);
        }
        return rank_main(&o, id, rank, n);
    }
    int k = o.nranks_local > 0 ? o.nranks_local : 1;
    loomUniqueId id;
    CHECK(0, NULL, loomGetUniqueId(&id));
    fflush(stdout);
    pid_t *pids = calloc((size_t)k, sizeof(pid_t));
    for (int r = 0; r < k; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("loom-perf: fork");
            return 2;
        }
        if (pid == 0) {
            /* Children die with the parent, so an interrupted run leaves nothing behind. */
            signal(SIGINT, SIG_DFL);
            _exit(rank_main(&o, id, r, k));
        }
        pids[r] = pid;
    }
    int rc = 0;
    for (int n = 0; n < k; n++) {
        int st;
        pid_t pid = wait(&st);
        if (pid < 0) break;
        int r = 0;
        while (r < k && pids[r] != pid) r++;
        if (WIFSIGNALED(st)) {
            fprintf(stderr, "loom-perf: rank %d (pid %d) was killed by signal %d\n", r, (int)pid,
                    WTERMSIG(st));
            rc = 2;
        } else if (WEXITSTATUS(st) != 0) {
            if (WEXITSTATUS(st) > rc) rc = WEXITSTATUS(st);
        }
    }
    free(pids);
    return rc;
}
