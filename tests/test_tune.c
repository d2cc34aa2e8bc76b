/*
 * The tuning file (src/core/tunefile.c): written and read back exactly, sections replaced and
 * merged by key and specificity, malformed lines warned about by file and line, and its
 * constants used by the allreduce selection of a real communicator (a file that makes one
 * algorithm clearly cheapest changes the choice, and the TUNING log names the file). Each test
 * runs in its own process (the parameters are cached per process).
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"
#include "comm.h"
#include "harness.h"
#include "param.h"
#include "registry.h"
#include "search.h"
#include "tunefile.h"

static char dir[64];

/* The test's files, removed at its end (a failed test leaves them to look at). */
static void remove_dir(void)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.') unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void make_dir(void)
{
    snprintf(dir, sizeof(dir), "/tmp/loom-tune-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void path_in_dir(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    static char buf[65536];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The log goes to a file (LOOM_DEBUG_FILE) so that its WARN lines can be checked. */
static void log_to(const char *path, const char *level)
{
    unlink(path);
    setenv("LOOM_DEBUG_FILE", path, 1);
    setenv("LOOM_DEBUG", level, 1);
    log_reset();
}

static tune_entry_t sample_entry(void)
{
    tune_entry_t e;
    tune_entry_clear(&e);
    e.fusion_threshold = 3u << 20;
    e.fusion_segment = 1u << 19;
    e.fusion_cycle_us = 1234.5;
    e.alpha[TUNE_SHM][TUNE_LOCAL] = 4.1234567890123e-6;
    e.beta[TUNE_SHM][TUNE_LOCAL] = 1.0 / 7.3e9;
    e.alpha[TUNE_TCP][TUNE_NET] = 3.3e-5;
    e.beta[TUNE_TCP][TUNE_NET] = 1.0 / 1.17e9;
    e.gamma = 1.0 / 4.9e9;
    e.nalgos = 3;
    e.algo_from[0] = 0, e.algo_id[0] = ALGO_SEGMENT;
    e.algo_from[1] = 23170, e.algo_id[1] = ALGO_RD;
    e.algo_from[2] = 1u << 20, e.algo_id[2] = ALGO_RING;
    return e;
}

static void assert_entry_eq(const tune_entry_t *a, const tune_entry_t *b)
{
    ck_assert_uint_eq(a->fusion_threshold, b->fusion_threshold);
    ck_assert_uint_eq(a->fusion_segment, b->fusion_segment);
    ck_assert(a->fusion_cycle_us == b->fusion_cycle_us);
    ck_assert(a->gamma == b->gamma);
    ck_assert_int_eq(a->nalgos, b->nalgos);
    for (int i = 0; i < a->nalgos; i++) {
        ck_assert_uint_eq(a->algo_from[i], b->algo_from[i]);
        ck_assert_int_eq(a->algo_id[i], b->algo_id[i]);
    }
    for (int t = 0; t < TUNE_NTP; t++)
        for (int l = 0; l < TUNE_NLEVEL; l++) {
            ck_assert_msg(a->alpha[t][l] == b->alpha[t][l], "alpha %d %d: %.17g %.17g", t, l,
                          a->alpha[t][l], b->alpha[t][l]);
            ck_assert_msg(a->beta[t][l] == b->beta[t][l], "beta %d %d", t, l);
        }
}

/* Written, read back bit for bit; a second key's section is kept, an update of the first
 * merges over it; a key of other ranks, layout or memory finds nothing. */
START_TEST(test_round_trip)
{
    make_dir();
    char path[128], err[256];
    path_in_dir(path, sizeof(path), "tune.txt");
    tune_key_t k4 = {.nranks = 4, .nnodes = 1, .per_node = 4, .mem = TUNE_MEM_HOST};
    tune_key_t k8 = {.nranks = 8, .nnodes = 2, .per_node = 4, .mem = TUNE_MEM_HOST};
    tune_entry_t e = sample_entry(), back;
    ck_assert_int_eq(tunefile_update(path, &k4, &e, err, sizeof(err)), 0);
    ck_assert(tunefile_read(path, &k4, &back, true));
    ck_assert_int_eq(back.sections, 1);
    assert_entry_eq(&back, &e);
    ck_assert_msg(strstr(back.where, path) && strstr(back.where, ":2"), "%s", back.where);

    tune_entry_t e8;
    tune_entry_clear(&e8);
    e8.fusion_threshold = 64u << 20;
    ck_assert_int_eq(tunefile_update(path, &k8, &e8, err, sizeof(err)), 0);
    tune_entry_t upd;
    tune_entry_clear(&upd);
    upd.fusion_segment = 12345;
    ck_assert_int_eq(tunefile_update(path, &k4, &upd, err, sizeof(err)), 0);
    const char *text = read_text(path);
    ck_assert_ptr_nonnull(strstr(text, "[ranks=4 layout=1x4 mem=host]"));
    ck_assert_ptr_null(strstr(strstr(text, "[ranks=4 ") + 1, "[ranks=4 ")); /* replaced */
    ck_assert(tunefile_read(path, &k4, &back, true));
    tune_entry_t want = e;
    want.fusion_segment = 12345;
    assert_entry_eq(&back, &want);
    ck_assert(tunefile_read(path, &k8, &back, true));
    ck_assert_uint_eq(back.fusion_threshold, 64u << 20);
    ck_assert_uint_eq(back.fusion_segment, 0);

    tune_key_t other[] = {
        {5, 1, 5, TUNE_MEM_HOST}, {4, 2, 2, TUNE_MEM_HOST}, {4, 1, 4, TUNE_MEM_DEVICE}};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        ck_assert(tunefile_read(path, &other[i], &back, true));
        ck_assert_int_eq(back.sections, 0);
        ck_assert_uint_eq(back.fusion_threshold, 0);
        ck_assert(back.alpha[TUNE_SHM][TUNE_LOCAL] < 0);
    }
    remove_dir();
}
END_TEST

/* Wildcards apply to every key; the more specific section overrides them, whatever the order;
 * among equals the later one wins. */
START_TEST(test_specificity)
{
    make_dir();
    char path[128];
    path_in_dir(path, sizeof(path), "spec.txt");
    write_text(path, "[ranks=4 layout=1x4 mem=host]\n"
                     "fusion_threshold = 400\n"
                     "[ranks=* layout=* mem=*]   # everything\n"
                     "fusion_threshold = 100\n"
                     "fusion_segment = 7\n"
                     "gamma = 1e-10\n"
                     "[mem=host]\n"
                     "fusion_segment = 8\n"
                     "[mem=host]\n"
                     "fusion_segment = 9\n");
    tune_key_t k = {4, 1, 4, TUNE_MEM_HOST};
    tune_entry_t e;
    ck_assert(tunefile_read(path, &k, &e, true));
    ck_assert_int_eq(e.sections, 4);
    ck_assert_uint_eq(e.fusion_threshold, 400);
    ck_assert_uint_eq(e.fusion_segment, 9);
    ck_assert(e.gamma == 1e-10);
    ck_assert_msg(strstr(e.where, ":1"), "%s", e.where);
    tune_key_t kd = {4, 1, 4, TUNE_MEM_DEVICE};
    ck_assert(tunefile_read(path, &kd, &e, true));
    ck_assert_int_eq(e.sections, 1);
    ck_assert_uint_eq(e.fusion_threshold, 100);
    ck_assert_uint_eq(e.fusion_segment, 7);
    /* a layout of unequal nodes matches only "*" */
    int starts[] = {0, 3, 4};
    tune_key_t ku = tune_key_of(4, 2, starts, TUNE_MEM_HOST);
    ck_assert_int_eq(ku.nnodes, -1);
    ck_assert(tunefile_read(path, &ku, &e, true));
    ck_assert_int_eq(e.sections, 3);
    remove_dir();
}
END_TEST

/* Every kind of malformed line is one WARN naming the file and its line; the good lines around
 * them still apply; a missing file is a WARN naming it and the system call. */
START_TEST(test_malformed)
{
    make_dir();
    char path[128], logp[128];
    path_in_dir(path, sizeof(path), "bad.txt");
    path_in_dir(logp, sizeof(logp), "log.txt");
    write_text(path, "fusion_threshold = 5\n"          /* 1: before any section */
                     "[ranks=4 layout=1x4 mem=host]\n" /* 2 */
                     "fusion_threshold = 4096\n"       /* 3: good */
                     "fusion_segment = lots\n"         /* 4: not a number */
                     "alpha.ucx.local = 1e-6\n"        /* 5: unknown transport */
                     "beta.shm.local = -1\n"           /* 6: negative */
                     "fusion_segment = 1.5\n"          /* 7: not a whole size */
                     "no equals sign\n"                /* 8 */
                     "gamma = 2e-10\n"                 /* 9: good */
                     "[ranks=four]\n"                  /* 10: broken header */
                     "fusion_threshold = 1\n"          /* 11: in a skipped section */
                     "[ranks=4 layout=1x4 mem=host\n"  /* 12: unterminated */
                     "[ranks=4 layout=1by4]\n"         /* 13 */
                     "[ranks=4 colour=red]\n"          /* 14 */
                     "[ranks=4 mem=hbm]\n"             /* 15 */
                     "[ranks=4 layout=1x4 mem=*]\n"    /* 16 */
                     "allreduce_algos = 0:rd 9:fast\n" /* 17: unknown algorithm */
                     "allreduce_algos = 0:rd 0:ring\n" /* 18: sizes not rising */
                     "allreduce_algos = rd\n"          /* 19: no size */
                     "allreduce_algos = 0:auto\n"      /* 20: auto is not a row */
                     "allreduce_algos = -1:rd\n"       /* 21 */
                     "allreduce_algos =\n"             /* 22: no rows */
                     "allreduce_algos = 0:ring 4096:rd 65536:ring\n"); /* 23: good */
    log_to(logp, "WARN");
    tune_key_t k = {4, 1, 4, TUNE_MEM_HOST};
    tune_entry_t e;
    ck_assert(tunefile_read(path, &k, &e, true));
    ck_assert_uint_eq(e.fusion_threshold, 4096);
    ck_assert_uint_eq(e.fusion_segment, 0);
    ck_assert(e.gamma == 2e-10);
    ck_assert(e.beta[TUNE_SHM][TUNE_LOCAL] < 0);
    ck_assert_int_eq(e.nalgos, 3); /* line 23's, the broken ones before it left nothing */
    ck_assert_int_eq(tune_entry_algo(&e, 4095), ALGO_RING);
    ck_assert_int_eq(tune_entry_algo(&e, 4096), ALGO_RD);
    ck_assert_int_eq(tune_entry_algo(&e, 1u << 30), ALGO_RING);
    const char *log = read_text(logp);
    ck_assert_ptr_nonnull(log);
    const int bad[] = {1, 4, 5, 6, 7, 8, 10, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[160];
        snprintf(want, sizeof(want), "tuning file %s:%d: ", path, bad[i]);
        ck_assert_msg(strstr(log, want), "no warning for line %d; the log:\n%s", bad[i], log);
    }
    const int good[] = {2, 3, 9, 11, 16, 23};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char want[160];
        snprintf(want, sizeof(want), "tuning file %s:%d: ", path, good[i]);
        ck_assert_msg(!strstr(log, want), "line %d warned about; the log:\n%s", good[i], log);
    }
    char missing[128];
    path_in_dir(missing, sizeof(missing), "absent.txt");
    ck_assert(!tunefile_read(missing, &k, &e, true));
    log = read_text(logp);
    ck_assert_msg(strstr(log, missing) && strstr(log, "fopen"), "%s", log);
    remove_dir();
}
END_TEST

typedef struct {
    uint64_t bytes;
    int pick[4];
    uint64_t bucket[4], segment[4];
} pick_arg_t;

static int pick_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)nranks;
    pick_arg_t *a = arg;
    a->pick[rank] = comm_pick_allreduce(comm, a->bytes);
    comm_fusion_sizes(comm, TUNE_MEM_HOST, &a->bucket[rank], &a->segment[rank]);
    return 0;
}

/* The communicator keeps its choices by size: asked again, in another order and after entries
 * were evicted (48 sizes for 16 entries, sizes that share one), it must answer what the model
 * answers with nothing kept. The sizes span rd's and the bandwidth algorithms' ranges, so an
 * entry answered for the wrong size shows. */
static int repick_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)rank;
    (void)nranks;
    (void)arg;
    uint64_t sizes[48];
    int first[48], kinds = 0;
    for (int i = 0; i < 48; i++) {
        sizes[i] = (8ull << (i % 27)) + (uint64_t)(i / 27) * 4;
        memset(comm->tune.picks, 0, sizeof(comm->tune.picks)); /* the model's own answer */
        first[i] = comm_pick_allreduce(comm, sizes[i]);
        kinds |= 1 << first[i];
    }
    memset(comm->tune.picks, 0, sizeof(comm->tune.picks));
    if ((kinds & (kinds - 1)) == 0) return 1; /* one row for every size: the test proves nothing */
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 48; k++) {
            int i = round == 1 ? 47 - k : (k * 7 + round) % 48;
            if (comm_pick_allreduce(comm, sizes[i]) != first[i]) return 1;
        }
    return 0;
}

static int oversub_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    (void)nranks;
    ((int *)arg)[rank] = comm->tune.oversubscribed ? 1 : 0;
    return 0;
}

/* Ranks are counted against cores per machine, not per node: one more rank than this machine
 * has cores, as two pretend nodes (LOOM_NODE_ID) of at most that many each, is oversubscribed
 * on every rank (each node alone is not: before, none saw it); as many ranks as cores is not. */
START_TEST(test_machine_cores)
{
    unsetenv("LOOM_TUNE_FILE");
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1 || cores > 63) {
        fprintf(stderr, "machine_cores: %d cores, not run\n", cores);
        return;
    }
    for (int extra = 1; extra >= 0; extra--) {
        int p = cores + extra, over[64] = {0};
        if (p < 2) continue;
        char ids[64 * 2 + 1] = "";
        for (int r = 0; r < p; r++)
            strcat(ids, r < (p + 1) / 2 ? (r ? ",a" : "a") : ",b");
        setenv("LOOM_NODE_ID", ids, 1);
        param_reset_cache();
        ck_assert_int_eq(h_run_threads(p, oversub_rank, over), 0);
        for (int r = 0; r < p; r++)
            ck_assert_msg(over[r] == extra, "%d ranks on %d cores in nodes %s: rank %d %s", p,
                          cores, ids, r, over[r] ? "oversubscribed" : "not oversubscribed");
    }
    unsetenv("LOOM_NODE_ID");
    param_reset_cache();
}
END_TEST

START_TEST(test_pick_cache)
{
    unsetenv("LOOM_TUNE_FILE");
    param_reset_cache();
    ck_assert_int_eq(h_run_threads(4, repick_rank, NULL), 0);
}
END_TEST

/* The automatic choice of 4 ranks on one node (shm) at `bytes`, with LOOM_TUNE_FILE = file
 * (NULL: unset); every rank must agree. The fusion sizes they would use go to *fs (may be
 * NULL). */
static int choice_fusion(const char *file, uint64_t bytes, uint64_t fs[2])
{
    if (file)
        setenv("LOOM_TUNE_FILE", file, 1);
    else
        unsetenv("LOOM_TUNE_FILE");
    param_reset_cache();
    pick_arg_t a = {.bytes = bytes};
    ck_assert_int_eq(h_run_threads(4, pick_rank, &a), 0);
    for (int r = 1; r < 4; r++)
        ck_assert_int_eq(a.pick[r], a.pick[0]);
    if (fs) fs[0] = a.bucket[0], fs[1] = a.segment[0];
    return a.pick[0];
}

static int choice(const char *file, uint64_t bytes)
{
    return choice_fusion(file, bytes, NULL);
}

/* Fusion sizes: the parameters' defaults without a file, the file's with one, LOOM_FUSION_*
 * over both. */
START_TEST(test_fusion_sizes)
{
    make_dir();
    char path[128];
    path_in_dir(path, sizeof(path), "fusion.txt");
    write_text(path, "[ranks=4 mem=host]\nfusion_threshold = 5000000\nfusion_segment = 300000\n");
    uint64_t fs[2];
    choice_fusion(NULL, 8, fs);
    ck_assert_uint_eq(fs[0], param_size(PARAM_FUSION_BUCKET));
    ck_assert_uint_eq(fs[1], param_size(PARAM_FUSION_SEGMENT));
    choice_fusion(path, 8, fs);
    ck_assert_uint_eq(fs[0], 5000000);
    ck_assert_uint_eq(fs[1], 300000);
    setenv("LOOM_FUSION_BUCKET", "1M", 1);
    choice_fusion(path, 8, fs);
    ck_assert_uint_eq(fs[0], 1u << 20);
    ck_assert_uint_eq(fs[1], 300000);
    unsetenv("LOOM_FUSION_BUCKET");
    remove_dir();
}
END_TEST

/* The built-in constants take a bandwidth algorithm at 64 MiB (ring, or rabenseifner where the
 * ranks outnumber the cores and every step costs a wake-up) and the node segment at 8 bytes on 4
 * ranks of one node (rd with LOOM_SEGMENT=0: no segment); a file
 * whose shm latency is a full second makes rd (2 steps against 4 or 6) clearly cheapest at
 * 64 MiB, and one of zero latency makes ring (1.5 buffers sent and 0.75 reduced, the least of
 * all) cheapest at 8 bytes. The TUNING log names the
 * file and line the constants came from. */
START_TEST(test_selection)
{
    make_dir();
    char slow[128], fast[128], logp[128];
    path_in_dir(slow, sizeof(slow), "slow.txt");
    path_in_dir(fast, sizeof(fast), "fast.txt");
    path_in_dir(logp, sizeof(logp), "log.txt");
    write_text(slow, "[ranks=4 layout=1x4 mem=host]\nalpha.shm.local = 1\n");
    write_text(fast, "[ranks=* mem=host]\nalpha.shm.local = 0\nbeta.shm.local = 1e-10\n");
    int big = choice(NULL, 64u << 20);
    ck_assert_msg(big == ALGO_RING || big == ALGO_RAB, "64 MiB took row %d", big);
    ck_assert_int_eq(choice(NULL, 8), ALGO_SEGMENT);
    setenv("LOOM_SEGMENT", "0", 1);
    param_reset_cache();
    ck_assert_int_eq(choice(NULL, 8), ALGO_RD);
    unsetenv("LOOM_SEGMENT");
    param_reset_cache();
    log_to(logp, "INFO");
    setenv("LOOM_DEBUG_SUBSYS", "TUNING", 1);
    log_reset();
    ck_assert_int_eq(choice(slow, 64u << 20), ALGO_RD);
    const char *log = read_text(logp);
    char want[160];
    snprintf(want, sizeof(want), "[constants: %s:1]", slow);
    ck_assert_msg(log && strstr(log, want) && strstr(log, "-> rd, predicted"), "%s", log);
    ck_assert_int_eq(choice(fast, 8), ALGO_RING);
    /* a file with nothing for this key leaves the defaults */
    write_text(fast, "[ranks=3]\nalpha.shm.local = 0\n");
    ck_assert_int_eq(choice(fast, 8), ALGO_SEGMENT);
    remove_dir();
}
END_TEST

/* A measured table (allreduce_algos) overrides the model where the communicator can run its
 * row, and only there: below its first size, and for a row that cannot run here (hier on one
 * node; the segment past its limit), the model decides. The TUNING log says which. */
START_TEST(test_measured_table)
{
    make_dir();
    char path[128], logp[128];
    path_in_dir(path, sizeof(path), "table.txt");
    path_in_dir(logp, sizeof(logp), "log.txt");
    write_text(path, "[ranks=4 layout=1x4 mem=host]\n"
                     "allreduce_algos = 0:tree 1000:rd 100000:ring 1000000:hier 4000000:segment\n");
    int model_big = choice(NULL, 2u << 20), model_huge = choice(NULL, 64u << 20);
    log_to(logp, "INFO");
    setenv("LOOM_DEBUG_SUBSYS", "TUNING", 1);
    log_reset();
    ck_assert_int_eq(choice(path, 8), ALGO_TREE); /* the model's is the segment */
    ck_assert_int_eq(choice(path, 999), ALGO_TREE);
    ck_assert_int_eq(choice(path, 1000), ALGO_RD);
    ck_assert_int_eq(choice(path, 512u << 10), ALGO_RING);
    ck_assert_int_eq(choice(path, 2u << 20), model_big);   /* hier: one node */
    ck_assert_int_eq(choice(path, 64u << 20), model_huge); /* past the segment's limit */
    const char *log = read_text(logp);
    char want[200];
    snprintf(want, sizeof(want),
             "taken from the tuning file's measured table (%s:1: rd from 1000 bytes)", path);
    ck_assert_msg(log && strstr(log, want), "%s", log);
    ck_assert_msg(
        strstr(log, "the tuning file's table names hier here, which cannot run it (one node)"),
        "%s", log);
    /* a table that starts above 8 bytes leaves the small sizes to the model */
    write_text(path, "[ranks=4 layout=1x4 mem=host]\nallreduce_algos = 4096:ring\n");
    ck_assert_int_eq(choice(path, 8), ALGO_SEGMENT);
    ck_assert_int_eq(choice(path, 4096), ALGO_RING);
    unsetenv("LOOM_DEBUG_SUBSYS");
    remove_dir();
}
END_TEST

/* A bowl in log2 of each value, lowest at (3 MiB, 200 KiB): 1 + 0.1 per octave squared. */
static double bowl(void *arg, const uint64_t *v)
{
    int *calls = arg;
    (*calls)++;
    double a = log2((double)v[0] / (3 << 20)), b = log2((double)v[1] / (200 << 10));
    return 1 + 0.1 * a * a + 0.1 * b * b;
}

/* Alternately 1 and 2: noise of 50%, nothing to gain below it. */
static double noisy(void *arg, const uint64_t *v)
{
    (void)v;
    int *calls = arg;
    return (*calls)++ % 2 ? 2.0 : 1.0;
}

/* The coarse-to-fine search lands within one finest step (2^(1/4)) of a smooth minimum in each
 * parameter, measures every point once with its repetitions, and stops refining as soon as a
 * stage gains less than the noise. */
START_TEST(test_search)
{
    int calls = 0;
    tune_search_t s = {.ndims = 2,
                       .reps = 3,
                       .dims = {{"bucket", 64 << 10, 256u << 20, 32u << 20, 4096},
                                {"segment", 4096, 64u << 20, 8u << 20, 4096}}};
    ck_assert_int_eq(tune_search_run(&s, bowl, &calls), 0);
    double r0 = (double)s.best[0] / (3 << 20), r1 = (double)s.best[1] / (200 << 10);
    ck_assert_msg(r0 > 0.84 && r0 < 1.19 && r1 > 0.84 && r1 < 1.19, "best %llu %llu",
                  (unsigned long long)s.best[0], (unsigned long long)s.best[1]);
    ck_assert_int_eq(calls, s.npts * 3);
    for (int i = 0; i < s.npts; i++) {
        ck_assert_uint_eq(s.pts[i].vals[0] % 4096, 0);
        for (int j = 0; j < i; j++)
            ck_assert(memcmp(s.pts[i].vals, s.pts[j].vals, sizeof(s.pts[i].vals)) != 0);
    }
    ck_assert(s.noise == 0);
    tune_search_free(&s);

    /* a parameter bounded by an earlier one is searched up to that one's choice only */
    calls = 0;
    tune_search_t b = {.ndims = 2,
                       .reps = 1,
                       .dims = {{"bucket", 64 << 10, 1u << 20, 1u << 20, 4096},
                                {"segment", 4096, 64u << 20, 8u << 20, 4096, 1}}};
    ck_assert_int_eq(tune_search_run(&b, bowl, &calls), 0);
    ck_assert_uint_eq(b.best[0], 1u << 20);
    for (int i = 0; i < b.npts; i++)
        if (b.pts[i].dim == 1) ck_assert_uint_le(b.pts[i].vals[1], b.best[0]);
    ck_assert_uint_ge(b.best[1], 168u << 10);
    tune_search_free(&b);

    calls = 0;
    tune_search_t n = {.ndims = 1, .reps = 2, .dims = {{"bucket", 64 << 10, 1u << 30, 0, 4096}}};
    ck_assert_int_eq(tune_search_run(&n, noisy, &calls), 0);
    ck_assert(n.noise > 0.3);
    /* 9 coarse points (64K..1G by 4), then one stage of two neighbours at most */
    ck_assert_int_le(n.npts, 11);
    for (int i = 0; i < n.npts; i++)
        ck_assert_str_ne(n.pts[i].stage, "x1.41");
    tune_search_free(&n);
}
END_TEST

static Suite *tune_suite(void)
{
    Suite *s = suite_create("tune");
    const h_case_t tests[] = {
        {.name = "round_trip", .test = test_round_trip},
        {.name = "specificity", .test = test_specificity},
        {.name = "malformed", .test = test_malformed},
        {.name = "selection", .test = test_selection},
        {.name = "measured_table", .test = test_measured_table},
        {.name = "pick_cache", .test = test_pick_cache},
        {.name = "machine_cores", .test = test_machine_cores},
        {.name = "search", .test = test_search},
        {.name = "fusion_sizes", .test = test_fusion_sizes},
    };
    h_add_cases(s, tests, sizeof(tests) / sizeof(tests[0]), 60);
    return s;
}

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    setenv("LOOM_TIMEOUT", "10", 1);
    return h_check_main(tune_suite(), true, CK_NORMAL);
}
