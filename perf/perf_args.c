/*
 * loom-perf's command line (see perf_args.h and README.md, "Reading loom-perf").
 *
 * nccl-tests' flags keep nccl-tests' letters, long names, meanings and defaults (-b/-e 32M,
 * -f 1 with -i 1M, -n 20, -w 5, -c 1, ...). Where loom-perf cannot do what a flag asks, the
 * flag is refused by name (exit 2) rather than ignored. Numbers are read strictly: decimal,
 * nothing after them but a size suffix where a size is meant, within the flag's range.
 */
#include "perf_args.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

const char *const perf_coll_names[C_NUM] = {"allreduce", "broadcast",     "reduce",
                                            "allgather", "reducescatter", "alltoall",
                                            "sendrecv",  "gather",        "scatter"};
const char *const perf_prog_names[C_NUM] = {
    "all_reduce_perf", "broadcast_perf", "reduce_perf", "all_gather_perf", "reduce_scatter_perf",
    "alltoall_perf",   "sendrecv_perf",  "gather_perf", "scatter_perf"};
/* nccl-tests' names, the 8-bit floats included */
const char *const perf_type_names[loomNumTypes] = {"int8",   "uint8",    "int32",  "uint32",
                                                   "int64",  "uint64",   "half",   "float",
                                                   "double", "bfloat16", "f8e4m3", "f8e5m2"};
const size_t perf_type_sizes[loomNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
const char *const perf_op_names[PERF_NUM_OPS] = {"sum", "prod", "max", "min", "avg", "mulsum"};

static const char *g_prog = "loom-perf";

/* The flag as the user wrote it: "-n" or "--iters". */
static char g_flag[64];

_Noreturn static void bad(const char *value, const char *why)
{
    if (value)
        fprintf(stderr, "%s: %s %s: %s\n", g_prog, g_flag, value, why);
    else
        fprintf(stderr, "%s: %s: %s\n", g_prog, g_flag, why);
    exit(2);
}

/* A whole decimal number in [lo, hi]; `what` names the quantity in the message. */
static long parse_int(const char *s, long lo, long hi, const char *what)
{
    char why[256];
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (*p < '0' || *p > '9') {
        snprintf(why, sizeof(why), "not a whole number (%s: %ld to %ld)", what, lo, hi);
        bad(s, why);
    }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end != '\0') {
        snprintf(why, sizeof(why), "not a whole number (%s: %ld to %ld)", what, lo, hi);
        bad(s, why);
    }
    if (errno == ERANGE || v < lo || v > hi) {
        snprintf(why, sizeof(why), "out of range (%s: %ld to %ld)", what, lo, hi);
        bad(s, why);
    }
    return v;
}

/* A size in bytes as nccl-tests reads one: a number, then K, M or G (binary: 1024, 1024^2,
 * 1024^3; either case), here also with an optional "iB" or "B" after it ("64M", "64MiB",
 * "1.5K"). Nothing else may follow; the bytes must be whole and at most 2^62. */
static uint64_t parse_size(const char *s, const char *what)
{
    char why[256];
    if (!((*s >= '0' && *s <= '9') || *s == '.')) {
        snprintf(why, sizeof(why), "not a size (%s: bytes, with K, M or G for KiB, MiB, GiB)",
                 what);
        bad(s, why);
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double unit = 1;
    switch (*end) {
    case 'k':
    case 'K': unit = 1024.0, end++; break;
    case 'm':
    case 'M': unit = 1024.0 * 1024, end++; break;
    case 'g':
    case 'G': unit = 1024.0 * 1024 * 1024, end++; break;
    default: break;
    }
    if (unit > 1 && (*end == 'i' || *end == 'I')) end++;
    if (*end == 'b' || *end == 'B') end++;
    if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v)) {
        snprintf(why, sizeof(why), "not a size (%s: bytes, with K, M or G for KiB, MiB, GiB)",
                 what);
        bad(s, why);
    }
    v *= unit;
    if (v > 4611686018427387904.0) { /* 2^62 */
        snprintf(why, sizeof(why), "too large (%s: at most 4611686018427387904 bytes)", what);
        bad(s, why);
    }
    if (v != floor(v)) {
        snprintf(why, sizeof(why), "not a whole number of bytes (%s)", what);
        bad(s, why);
    }
    return (uint64_t)v;
}

static void usage(void)
{
    printf(
        "usage: %s [options]  (nccl-tests' flags; the collective from the program's name:\n"
        "       all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf\n"
        "       alltoall_perf sendrecv_perf gather_perf scatter_perf, or loom-perf --collective)\n"
        "  -t, --nthreads N        threads per process [1]; loom-perf runs one rank per process: "
        "only 1\n"
        "  -g, --ngpus N           GPUs per thread [1]; only 1\n"
        "  -b, --minbytes SIZE     smallest size (K, M, G: KiB, MiB, GiB) [32M]\n"
        "  -e, --maxbytes SIZE     largest size [32M]\n"
        "  -i, --stepbytes SIZE    bytes added per step when -f is 1 [1M]\n"
        "  -f, --stepfactor N      size multiplied by N per step (whole number; 1: use -i) [1]\n"
        "  -n, --iters N           timed iterations [20]\n"
        "  -m, --agg_iters N       calls per iteration, inside one group [1]\n"
        "  -w, --warmup_iters N    untimed calls before each size's timed loop [5]\n"
        "  -N, --run_cycles N      sweeps over the sizes, each printed (0: until killed) [1]\n"
        "  -p, --parallel_init 0|1 threads initialise at once (one rank per process: no "
        "effect) [0]\n"
        "  -c, --check N           checked runs per size and placement, after the timed loop\n"
        "                          (exact inputs, every element compared; 0: none) [1]\n"
        "  -o, --op OP             sum prod max min avg mulsum (pre-multiplied sum), or all [sum]\n"
        "  -d, --datatype TYPE     int8 uint8 int32 uint32 int64 uint64 half float double\n"
        "                          bfloat16 f8e4m3 f8e5m2 (also float16 float32 float64 bf16),\n"
        "                          or all [float]\n"
        "  -r, --root R            root of broadcast, reduce, gather, scatter [0]\n"
        "  -z, --blocking 0|1      wait for each call to complete and meet after it [0]\n"
        "  -y, --stream_null 0|1   the NULL stream instead of a created one [0] (host memory "
        "has no stream)\n"
        "  -T, --timeout SECONDS   a wait for completion longer than this ends the run (0: "
        "none) [0]\n"
        "  -G, --cudagraph N       capture the timed loop's calls in a CUDA graph and time N\n"
        "                          launches of it (device memory; 0: no graph) [0]\n"
        "  -C, --report_cputime 0|1  report the host's time to issue the calls, not to "
        "complete them [0]\n"
        "  -a, --average 0|1|2|3   the time shown: rank 0's, mean, min or max over ranks [1]\n"
        "  -R, --local_register 0|1|2  register the buffers with the communicator (device "
        "memory):\n"
        "                          1 locally (loomCommRegister), 2 as symmetric windows\n"
        "                          (loomCommWindowRegister, LOOM_WIN_COLL_SYMMETRIC) [0]\n"
        "  -J, --output_file FILE  write the results as JSON (nccl-tests' layout, with loom's\n"
        "                          version, the arguments and the LOOM_*/NCCL_* variables)\n"
        "  -u, --cumask, -x, --cta_policy   refused: RCCL's CU mask and NCCL's CTA policy have\n"
        "                          no meaning for loom\n"
        "loom's own options:\n"
        "  --collective NAME       allreduce broadcast reduce allgather reducescatter alltoall\n"
        "                          sendrecv gather scatter [from the program's name; allreduce]\n"
        "  -P, --local-ranks K     fork K local ranks (default: one unless started by a "
        "launcher)\n"
        "  --mem host|device       buffer memory [host]. device: CUDA memory, one GPU per rank\n"
        "                          (rank mod GPU count with -P; LOCAL_RANK if set, else rank mod\n"
        "                          GPU count, under a launcher); collectives on a non-blocking\n"
        "                          stream, timed on the host clock through cuStreamSynchronize;\n"
        "                          outputs over 256 MiB are checked on 16 windows of 16 MiB\n"
        "  --backend loom|nccl     the library measured [loom]. nccl: the machine's NCCL, loaded\n"
        "                          at run time, same sweep; implies --mem device\n"
        "  --nccl-lib PATH         the NCCL library for --backend nccl [libnccl.so.2]\n"
        "  --csv FILE              write the results as CSV beside the table\n"
        "  --json FILE             the same as -J FILE\n"
        "  --host-time             device buffers: also print (stderr) each rank's host time per\n"
        "                          call spent enqueueing, beside the time per call in all\n"
        "  --gpu-time              device buffers, -P: the timed calls queue behind a gate on\n"
        "                          each stream, opened on every rank at once when all are\n"
        "                          queued: the GPUs' own time per call, without the host's\n"
        "                          launch cost (keep -n in the hundreds: a rank whose launch\n"
        "                          queue fills cannot finish queueing, and the gate then opens\n"
        "                          after 5 s with a warning)\n"
        "Launched one process per rank: by mpirun, srun or torchrun (their variables, as\n"
        "loomCommInitFromEnv reads them; the ranks meet through the launcher's PMIx server or\n"
        "at MASTER_ADDR:MASTER_PORT, LOOM_JOB_SECRET for the secret there), or LOOM_RANK,\n"
        "LOOM_WORLD_SIZE and LOOM_ID_FILE (rank 0 writes the unique id there, the others read\n"
        "it). With --backend nccl every way needs LOOM_ID_FILE: rank 0 writes NCCL's id there.\n",
        g_prog);
}

enum {
    OPT_COLL = 1000,
    OPT_MEM,
    OPT_BACKEND,
    OPT_NCCL_LIB,
    OPT_CSV,
    OPT_JSON,
    OPT_HOST_TIME,
    OPT_GPU_TIME,
};

static const struct option long_opts[] = {{"nthreads", required_argument, 0, 't'},
                                          {"ngpus", required_argument, 0, 'g'},
                                          {"minbytes", required_argument, 0, 'b'},
                                          {"maxbytes", required_argument, 0, 'e'},
                                          {"stepbytes", required_argument, 0, 'i'},
                                          {"stepfactor", required_argument, 0, 'f'},
                                          {"iters", required_argument, 0, 'n'},
                                          {"agg_iters", required_argument, 0, 'm'},
                                          {"warmup_iters", required_argument, 0, 'w'},
                                          {"run_cycles", required_argument, 0, 'N'},
                                          {"parallel_init", required_argument, 0, 'p'},
                                          {"check", required_argument, 0, 'c'},
                                          {"op", required_argument, 0, 'o'},
                                          {"datatype", required_argument, 0, 'd'},
                                          {"root", required_argument, 0, 'r'},
                                          {"blocking", required_argument, 0, 'z'},
                                          {"stream_null", required_argument, 0, 'y'},
                                          {"timeout", required_argument, 0, 'T'},
                                          {"cudagraph", required_argument, 0, 'G'},
                                          {"report_cputime", required_argument, 0, 'C'},
                                          {"average", required_argument, 0, 'a'},
                                          {"local_register", required_argument, 0, 'R'},
                                          {"output_file", required_argument, 0, 'J'},
                                          {"cumask", required_argument, 0, 'u'},
                                          {"cta_policy", required_argument, 0, 'x'},
                                          {"local-ranks", required_argument, 0, 'P'},
                                          {"collective", required_argument, 0, OPT_COLL},
                                          {"mem", required_argument, 0, OPT_MEM},
                                          {"backend", required_argument, 0, OPT_BACKEND},
                                          {"nccl-lib", required_argument, 0, OPT_NCCL_LIB},
                                          {"csv", required_argument, 0, OPT_CSV},
                                          {"json", required_argument, 0, OPT_JSON},
                                          {"host-time", no_argument, 0, OPT_HOST_TIME},
                                          {"gpu-time", no_argument, 0, OPT_GPU_TIME},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};

static const char short_opts[] = ":t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:R:J:u:x:P:h";

static void set_flag_name(int c, int longindex)
{
    if (longindex >= 0)
        snprintf(g_flag, sizeof(g_flag), "--%s", long_opts[longindex].name);
    else
        snprintf(g_flag, sizeof(g_flag), "-%c", c);
}

/* Whether the collective reduces (takes -o) or has a root (takes -r). */
static int coll_reduces(coll_t c)
{
    return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER;
}

/* How many bytes of host memory a local rank needs at the largest size: its two buffers (host
 * memory) and a margin for loom's own state, the input tape and the staging buffer. */
static double rank_host_bytes(const opts_t *o)
{
    double margin = 64.0 * 1024 * 1024;
    return o->mem_device ? margin : 2.0 * (double)o->maxb + margin;
}

static long read_proc_long(const char *path)
{
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* MemAvailable from /proc/meminfo in bytes, or -1. */
static double mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            v = (double)kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* -P k against what the machine can hold: processes and threads (RLIMIT_NPROC, the kernel's
 * threads-max and pid_max), host memory (MemAvailable) and descriptors per rank (RLIMIT_NOFILE,
 * for the collectives that reach every peer). One line and exit 2 when k is too many. */
#define TASKS_PER_RANK 4 /* the rank's thread, loom's progress thread, and a margin */
static void check_local_ranks(const opts_t *o)
{
    long k = o->nranks_local;
    char why[512], kv[32];
    snprintf(kv, sizeof(kv), "%ld", k);
    snprintf(g_flag, sizeof(g_flag), "-P");
    struct rlimit rl;
    if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        long most = (long)(rl.rlim_cur / TASKS_PER_RANK);
        if (k > most) {
            snprintf(why, sizeof(why),
                     "more ranks than this machine can hold: RLIMIT_NPROC allows %llu "
                     "processes and threads for this user, and each rank needs about %d "
                     "(at most %ld ranks)",
                     (unsigned long long)rl.rlim_cur, TASKS_PER_RANK, most);
            bad(kv, why);
        }
    }
    const char *sysf[] = {"/proc/sys/kernel/threads-max", "/proc/sys/kernel/pid_max"};
    for (int i = 0; i < 2; i++) {
        long v = read_proc_long(sysf[i]);
        if (v > 0 && k > v / TASKS_PER_RANK) {
            snprintf(why, sizeof(why),
                     "more ranks than this machine can hold: %s is %ld, and each rank needs "
                     "about %d tasks (at most %ld ranks)",
                     sysf[i], v, TASKS_PER_RANK, v / TASKS_PER_RANK);
            bad(kv, why);
        }
    }
    double avail = mem_available(), need = rank_host_bytes(o);
    if (avail > 0 && (double)k * need > avail) {
        snprintf(why, sizeof(why),
                 "more ranks than this machine can hold: %.1f GiB of memory available "
                 "(MemAvailable), about %.0f MiB per rank at -e %llu (at most %ld ranks)",
                 avail / 1073741824.0, need / 1048576.0, (unsigned long long)o->maxb,
                 (long)(avail / need));
        bad(kv, why);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        int all_peers = o->coll == C_ALLTOALL || o->coll == C_GATHER || o->coll == C_SCATTER;
        /* LOOM_NSOCKS_PERPEER (2) sockets per peer and a margin, plus loom's own */
        double fds = 64 + (all_peers ? 3.0 * (double)(k - 1) : 0);
        if (fds > (double)rl.rlim_cur) {
            snprintf(why, sizeof(why),
                     "more ranks than this machine can hold: %s reaches every peer, about %.0f "
                     "descriptors per rank, and RLIMIT_NOFILE is %llu (ulimit -n)",
                     perf_coll_names[o->coll], fds, (unsigned long long)rl.rlim_cur);
            bad(kv, why);
        }
    }
}

void perf_parse(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    const char *base = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    g_prog = base ? base + 1 : (argc > 0 && argv[0] && argv[0][0] ? argv[0] : "loom-perf");
    o->prog = g_prog;
    o->argc = argc;
    o->argv = argv;
    /* nccl-tests' defaults */
    o->nthreads = o->ngpus = 1;
    o->minb = o->maxb = 32ull << 20;
    o->step = 1ull << 20;
    o->factor = 1;
    o->iters = 20;
    o->warmup = 5;
    o->agg = 1;
    o->cycles = 1;
    o->check = 1;
    o->types[o->ntypes++] = loomFloat32;
    o->ops[o->nops++] = loomSum;
    o->average = AVG_MEAN;
    /* loom's */
    int prog_coll = -1;
    for (int c = 0; c < C_NUM; c++)
        if (!strcmp(g_prog, perf_prog_names[c])) prog_coll = c;
    o->coll = prog_coll >= 0 ? (coll_t)prog_coll : C_ALLREDUCE;
    o->backend = BE_LOOM;
    o->nccl_lib = "libnccl.so.2";
    const char *mem = NULL, *backend = NULL;

    opterr = 0;
    optind = 1;
    for (;;) {
        int longindex = -1;
        int c = getopt_long(argc, argv, short_opts, long_opts, &longindex);
        if (c == -1) break;
        char why[512];
        if (c == '?' || c == ':') {
            const char *arg = argv[optind - 1];
            if (c == '?' && optopt)
                snprintf(g_flag, sizeof(g_flag), "-%c", optopt);
            else
                snprintf(g_flag, sizeof(g_flag), "%.60s", arg);
            if (c == ':') bad(NULL, "needs a value (see --help)");
            bad(NULL, "unknown option (see --help)");
        }
        set_flag_name(c, longindex);
        switch (c) {
        case 't':
            o->nthreads = (int)parse_int(optarg, 1, INT_MAX, "threads per process");
            if (o->nthreads != 1)
                bad(optarg, "loom-perf runs one rank per process and thread: only 1 (use -P K "
                            "for K local ranks, or a launcher)");
            break;
        case 'g':
            o->ngpus = (int)parse_int(optarg, 1, INT_MAX, "GPUs per thread");
            if (o->ngpus != 1)
                bad(optarg, "loom-perf drives one GPU per rank process: only 1 (use -P K, or a "
                            "launcher, for K GPUs)");
            break;
        case 'b': o->minb = parse_size(optarg, "the smallest size"); break;
        case 'e': o->maxb = parse_size(optarg, "the largest size"); break;
        case 'i': o->step = parse_size(optarg, "bytes added per step"); break;
        case 'f':
            o->factor = (uint64_t)parse_int(optarg, 1, 1L << 32, "size factor per step");
            break;
        case 'n': o->iters = (int)parse_int(optarg, 1, INT_MAX, "timed iterations"); break;
        case 'm': o->agg = (int)parse_int(optarg, 1, 1 << 20, "calls per iteration"); break;
        case 'w': o->warmup = (int)parse_int(optarg, 0, INT_MAX, "warm-up iterations"); break;
        case 'N': o->cycles = (int)parse_int(optarg, 0, INT_MAX, "sweeps, 0 for no end"); break;
        case 'p': o->parallel_init = (int)parse_int(optarg, 0, 1, "0 or 1"); break;
        case 'c': o->check = (int)parse_int(optarg, 0, INT_MAX, "checked runs"); break;
        case 'o': {
            o->nops = 0;
            for (int t = 0; t < PERF_NUM_OPS; t++)
                if (!strcmp(optarg, "all") || !strcmp(optarg, perf_op_names[t]))
                    o->ops[o->nops++] = t;
            if (o->nops == 0) bad(optarg, "unknown op (sum prod max min avg mulsum, or all)");
            break;
        }
        case 'd': {
            o->ntypes = 0;
            for (int t = 0; t < loomNumTypes; t++)
                if (!strcmp(optarg, "all") || !strcmp(optarg, perf_type_names[t]) ||
                    (!strcmp(optarg, "float32") && t == loomFloat32) ||
                    (!strcmp(optarg, "float16") && t == loomFloat16) ||
                    (!strcmp(optarg, "float64") && t == loomFloat64) ||
                    (!strcmp(optarg, "bf16") && t == loomBfloat16))
                    o->types[o->ntypes++] = t;
            if (o->ntypes == 0)
                bad(optarg, "unknown type (int8 uint8 int32 uint32 int64 uint64 half float "
                            "double bfloat16 f8e4m3 f8e5m2, or all)");
            break;
        }
        case 'r': o->root = (int)parse_int(optarg, 0, INT_MAX, "a rank"); break;
        case 'z': o->blocking = (int)parse_int(optarg, 0, 1, "0 or 1"); break;
        case 'y': o->stream_null = (int)parse_int(optarg, 0, 1, "0 or 1"); break;
        case 'T': o->timeout_s = (int)parse_int(optarg, 0, 1 << 30, "seconds, 0 for none"); break;
        case 'G': o->graphs = (int)parse_int(optarg, 0, INT_MAX, "graph launches"); break;
        case 'C': o->cputime = (int)parse_int(optarg, 0, 1, "0 or 1"); break;
        case 'a':
            o->average = (average_t)parse_int(optarg, 0, 3, "0 rank 0, 1 mean, 2 min, 3 max");
            break;
        case 'R':
            o->local_register = (int)parse_int(optarg, 0, 2, "0 none, 1 local, 2 symmetric");
            break;
        case 'J':
        case OPT_JSON: o->json = optarg; break;
        case 'u':
            bad(optarg, "a CU mask (RCCL's --cumask) has no meaning for loom, which launches "
                        "no kernels onto chosen compute units");
        case 'x': bad(optarg, "the CTA policy is NCCL's (ncclConfig_t.CTAPolicy); loom has none");
        case 'P': {
            snprintf(why, sizeof(why), "local ranks to fork");
            o->nranks_local = (int)parse_int(optarg, 1, PERF_MAX_LOCAL_RANKS, why);
            break;
        }
        case OPT_COLL: {
            int f = -1;
            for (int t = 0; t < C_NUM; t++)
                if (!strcmp(optarg, perf_coll_names[t])) f = t;
            if (f < 0)
                bad(optarg, "unknown collective (allreduce broadcast reduce allgather "
                            "reducescatter alltoall sendrecv gather scatter)");
            if (prog_coll >= 0 && f != prog_coll) {
                snprintf(why, sizeof(why),
                         "this program measures %s (%s); run loom-perf "
                         "--collective %s, or %s",
                         perf_coll_names[prog_coll], g_prog, optarg, perf_prog_names[f]);
                bad(optarg, why);
            }
            o->coll = (coll_t)f;
            break;
        }
        case OPT_MEM:
            if (strcmp(optarg, "host") && strcmp(optarg, "device"))
                bad(optarg, "unknown memory (host or device)");
            mem = optarg;
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "loom") && strcmp(optarg, "nccl"))
                bad(optarg, "unknown backend (loom or nccl)");
            backend = optarg;
            break;
        case OPT_NCCL_LIB: o->nccl_lib = optarg; break;
        case OPT_CSV: o->csv = optarg; break;
        case OPT_HOST_TIME: o->host_time = 1; break;
        case OPT_GPU_TIME: o->gpu_time = 1; break;
        case 'h': usage(); exit(0);
        default: bad(NULL, "unknown option (see --help)");
        }
    }
    if (optind < argc) {
        snprintf(g_flag, sizeof(g_flag), "%.60s", argv[optind]);
        bad(NULL, "not an option (every value follows its flag; see --help)");
    }
    if (o->minb > o->maxb) {
        snprintf(g_flag, sizeof(g_flag), "-b");
        char v[32], why[128];
        snprintf(v, sizeof(v), "%llu", (unsigned long long)o->minb);
        snprintf(why, sizeof(why), "larger than -e (%llu bytes)", (unsigned long long)o->maxb);
        bad(v, why);
    }
    if (o->factor == 1 && o->step == 0 && o->minb < o->maxb) {
        snprintf(g_flag, sizeof(g_flag), "-i");
        bad("0", "with -f 1 the sizes grow by -i bytes: at least 1");
    }
    o->mem_device = mem && !strcmp(mem, "device");
    if (backend && !strcmp(backend, "nccl")) {
        o->backend = BE_NCCL;
        if (mem && !strcmp(mem, "host")) {
            snprintf(g_flag, sizeof(g_flag), "--backend");
            bad("nccl", "NCCL takes device memory only; drop --mem host");
        }
        o->mem_device = 1;
    }
#ifndef LOOM_HAVE_CUDA
    if (o->backend == BE_NCCL) {
        snprintf(g_flag, sizeof(g_flag), "--backend");
        bad("nccl", "this build of loom has no GPU support (no CUDA toolkit at build time), and "
                    "NCCL needs device memory");
    }
    if (o->mem_device) {
        snprintf(g_flag, sizeof(g_flag), "--mem");
        bad("device", "this build of loom has no GPU support (no CUDA device or toolkit); use "
                      "--mem host");
    }
#endif
    if (o->gpu_time && (!o->mem_device || o->nranks_local < 1)) {
        snprintf(g_flag, sizeof(g_flag), "--gpu-time");
        bad(NULL, "needs device memory and -P (the ranks share the gate through memory mapped "
                  "before they fork)");
    }
    if (o->local_register && !o->mem_device) {
        snprintf(g_flag, sizeof(g_flag), "-R");
        bad(o->local_register == 2 ? "2" : "1",
            "registration is for device buffers (--mem device); host buffers need none");
    }
    if (o->graphs > 0 && !o->mem_device) {
        snprintf(g_flag, sizeof(g_flag), "-G");
        char v[32];
        snprintf(v, sizeof(v), "%d", o->graphs);
        bad(v, "a CUDA graph captures work on a stream: it needs device buffers (--mem device)");
    }
    if (o->graphs > 0 && o->blocking) {
        snprintf(g_flag, sizeof(g_flag), "-z");
        bad("1", "a blocking loop waits for each call on the host, which a captured CUDA graph "
                 "(-G) cannot do");
    }
    if (o->stream_null && o->mem_device) {
        snprintf(g_flag, sizeof(g_flag), "-y");
        bad("1", "the NULL stream with device memory is not supported by loom-perf (0 only)");
    }
    if (o->gpu_time && o->agg > 1) {
        snprintf(g_flag, sizeof(g_flag), "-m");
        char v[32];
        snprintf(v, sizeof(v), "%d", o->agg);
        bad(v, "grouped calls are not timed behind --gpu-time's gate (1 only)");
    }
    if (o->nranks_local > 0) {
        check_local_ranks(o);
    }
    if (!coll_reduces(o->coll)) {
        /* nccl-tests runs these once, with no op ("none" in the table) */
        o->ops[0] = loomSum;
        o->nops = 1;
    }
}

int perf_check_job(const opts_t *o, int nranks, int quiet)
{
    int rooted = o->coll == C_BROADCAST || o->coll == C_REDUCE || o->coll == C_GATHER ||
                 o->coll == C_SCATTER;
    if (rooted && o->root >= nranks) {
        if (!quiet)
            fprintf(stderr, "%s: -r %d: not a rank of this job (0 to %d: %d ranks)\n", g_prog,
                    o->root, nranks - 1, nranks);
        return 2;
    }
    return 0;
}
