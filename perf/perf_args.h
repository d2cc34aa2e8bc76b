/*
 * loom-perf's command line: nccl-tests' flags with nccl-tests' meanings, loom's own options under
 * long names, the collective chosen by the program's name (all_reduce_perf, ...) or
 * --collective. Every number is validated: a bad value is one line naming the flag and the
 * value, and exit status 2 (perf_args.c).
 */
#ifndef LOOM_PERF_ARGS_H
#define LOOM_PERF_ARGS_H

#include <stdint.h>

#include "loom.h"

typedef enum {
    C_ALLREDUCE,
    C_BROADCAST,
    C_REDUCE,
    C_ALLGATHER,
    C_REDUCESCATTER,
    C_ALLTOALL,
    C_SENDRECV,
    C_GATHER,
    C_SCATTER,
    C_NUM
} coll_t;

/* --collective's names, and the program names that choose each collective (nccl-tests'). */
extern const char *const perf_coll_names[C_NUM];
extern const char *const perf_prog_names[C_NUM];

typedef enum { BE_LOOM, BE_NCCL } backend_t;

/* -a: which rank's time the table shows */
typedef enum { AVG_RANK0 = 0, AVG_MEAN = 1, AVG_MIN = 2, AVG_MAX = 3 } average_t;

#define PERF_MAX_LOCAL_RANKS 4096

/* -o mulsum: loom's pre-multiplied sum (loomRedOpCreatePreMulSum), after loom's own ops */
#define PERF_OP_MULSUM loomNumOps
#define PERF_NUM_OPS (loomNumOps + 1)

typedef struct {
    /* nccl-tests' flags */
    int nthreads, ngpus;             /* -t, -g: 1 (one rank per process) */
    uint64_t minb, maxb;             /* -b, -e */
    uint64_t step;                   /* -i: bytes added per step when the factor is 1 */
    uint64_t factor;                 /* -f: sizes multiplied by this when above 1 */
    int iters, warmup;               /* -n, -w */
    int agg;                         /* -m: calls per iteration, grouped */
    int cycles;                      /* -N: sweeps (0: until killed) */
    int parallel_init;               /* -p (one rank per process: no effect) */
    int check;                       /* -c: checked runs per size and placement */
    int types[loomNumTypes], ntypes; /* -d */
    int ops[PERF_NUM_OPS], nops;     /* -o */
    int root;                        /* -r */
    int blocking;                    /* -z: synchronise and meet after every call */
    int stream_null;                 /* -y */
    int timeout_s;                   /* -T: a wait longer than this is fatal (0: none) */
    int graphs;                      /* -G (0 only) */
    int cputime;                     /* -C: report the time to enqueue, not to complete */
    average_t average;               /* -a */
    int local_register;              /* -R: register the device buffers with the communicator */
    const char *json;                /* -J */
    /* loom's own */
    coll_t coll;      /* --collective, or the program's name */
    int nranks_local; /* -P */
    int mem_device;   /* --mem */
    int host_time, gpu_time;
    backend_t backend;
    const char *nccl_lib, *csv;
    /* what was run */
    const char *prog; /* basename of argv[0] */
    int argc;
    char **argv;
} opts_t;

/* Parses argv into o; on any bad flag or value prints one line and exits 2 (--help: usage, 0). */
void perf_parse(int argc, char **argv, opts_t *o);

/* The checks that need the job's size (-r against the ranks): one line and exit 2 on failure.
 * Returns 0 when fine, else 2 with the line already printed (quiet: print nothing). */
int perf_check_job(const opts_t *o, int nranks, int quiet);

/* The benchmark's names of loom's types and ops */
extern const char *const perf_type_names[loomNumTypes];
extern const size_t perf_type_sizes[loomNumTypes];
extern const char *const perf_op_names[PERF_NUM_OPS];

#endif
