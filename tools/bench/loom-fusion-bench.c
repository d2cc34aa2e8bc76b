/*
 * loom-fusion-bench: a model's gradients (data/fusion) all-reduced in backward order, as a
 * training step hands them over, in interleaved rounds of:
 *   per_tensor   one loomAllReduce per tensor
 *   fused        a fusion context with loom's defaults
 *   tuned        a fusion context with the tuning file's choice (loom-tune --fusion; LOOM_TUNE_FILE
 *                or --tune-file), the defaults where the file has none
 *   horovod      Horovod's settings replayed by loom: 64 MB buckets (no smaller first bucket,
 *                no segments), a 5 ms cycle
 *   monolithic   one allreduce of all the bytes at once, after the whole step
 *   fused_bf16   the fused mode with the compressed wire (loomFusionWireBf16: 16-bit values
 *                with a scale per 256), checked against the error bound it reports
 * With --gflops R, each tensor is preceded by its layer's simulated backward compute (a busy
 * loop of flops x batch / R), and the fused step is also run with it, against compute alone:
 * hidden_pct is the share of the fused communication that the compute hid.
 * Times are the slowest rank's, medians over the rounds; every step's results are checked
 * (exact-sum inputs), `wrong` counts the elements that were not the exact sum.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "ranks.h"
#include "replay.h"
#include "tunefile.h"

typedef struct {
    const char *model;
    int iters, warmup;
    double gflops; /* simulated compute rate, GFLOP/s; 0: none */
    int batch;
    unsigned modes; /* bit per mode run (--modes); every mode when 0 */
    bool dev;       /* --mem device */
} opts_t;

enum { M_PER, M_FUSED, M_TUNED, M_HOROVOD, M_MONO, M_BF16, M_FUSED_C, M_COMPUTE, M_N };
static const char *const mode_names[M_N] = {"per_tensor", "fused",      "tuned",         "horovod",
                                            "monolithic", "fused_bf16", "fused+compute", "compute"};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int bench_rank(loomComm_t comm, int rank, int nranks, void *arg)
{
    const opts_t *o = arg;
    replay_model_t m;
    char err[512];
    if (replay_load(o->model, &m, err, sizeof(err)) != 0) {
        if (rank == 0) fprintf(stderr, "loom-fusion-bench: %s\n", err);
        return 2;
    }
    replay_t r;
    double spf = o->gflops > 0 ? (double)o->batch / (o->gflops * 1e9) : 0;
    if (replay_init(&r, comm, &m, spf, o->dev) != 0) {
        fprintf(stderr, "loom-fusion-bench: rank %d: %s\n", rank, r.err);
        return 2;
    }
    /* the tuning file's entry for this communicator, read by loom at init */
    const tune_entry_t *te = &comm->tune.file[TUNE_MEM_HOST];
    size_t tb = te->fusion_threshold, ts = te->fusion_segment;
    loomFusion_t fx[M_N] = {NULL};
    fx[M_FUSED] = fx[M_FUSED_C] = replay_fusion(&r, 0, 0, 0, 0, loomFusionWireExact);
    fx[M_TUNED] = replay_fusion(&r, tb, 0, ts, 0, loomFusionWireExact);
    fx[M_HOROVOD] = replay_fusion(&r, 64000000, 64000000, 64000000, 5000, loomFusionWireExact);
    /* device tensors travel exact: the compressed mode is host memory's */
    fx[M_BF16] = replay_fusion(&r, 0, 0, 0, 0, o->dev ? loomFusionWireExact : loomFusionWireBf16);
    if (!fx[M_FUSED] || !fx[M_TUNED] || !fx[M_HOROVOD] || !fx[M_BF16]) {
        fprintf(stderr, "loom-fusion-bench: %s\n", r.err);
        return 2;
    }
    int nm = o->gflops > 0 ? M_N : M_FUSED_C;
    unsigned modes = o->modes;
    if (o->dev) modes = (modes ? modes : (1u << M_N) - 1) & ~(1u << M_BF16);
    double *t[M_N];
    for (int k = 0; k < M_N; k++)
        t[k] = calloc((size_t)o->iters, sizeof(double));
    if (rank == 0) {
        loomFusionConfig_t c = LOOM_FUSION_CONFIG_INITIALIZER;
        loomFusionGetConfig(fx[M_FUSED], &c);
        printf("# loom-fusion-bench: model %s, %d tensors, %zu floats (%.1f MB), %d ranks, "
               "%d rounds after %d warm-up, %s memory\n",
               m.name, m.n, m.total, (double)m.total * 4 / 1e6, nranks, o->iters, o->warmup,
               o->dev ? "device" : "host");
        printf("# fused: bucket %zu, first bucket %zu, segment %zu, cycle %llu us\n", c.bucketBytes,
               c.firstBucketBytes, c.segmentBytes, (unsigned long long)c.cycleUs);
        loomFusionGetConfig(fx[M_TUNED], &c);
        printf("# tuned: bucket %zu, segment %zu (%s)\n", c.bucketBytes, c.segmentBytes,
               te->sections ? te->where : "no tuning file entry: the defaults");
        if (spf > 0)
            printf("# simulated compute: %.3g GFLOP per sample x batch %d at %.0f GFLOP/s = "
                   "%.1f ms per step\n",
                   m.flops / 1e9, o->batch, o->gflops, m.flops * spf * 1e3);
        fflush(stdout);
    }
    int rc = 0;
    for (int it = -o->warmup; it < o->iters && rc == 0; it++)
        for (int k = 0; k < nm; k++) {
            replay_mode_t mode = k == M_PER       ? REPLAY_PER_TENSOR
                                 : k == M_MONO    ? REPLAY_MONOLITHIC
                                 : k == M_COMPUTE ? REPLAY_COMPUTE_ONLY
                                                  : REPLAY_FUSED;
            if (modes && !(modes >> k & 1)) continue;
            double s = replay_step(&r, mode, fx[k], k >= M_FUSED_C);
            if (s < 0) {
                fprintf(stderr, "loom-fusion-bench: %s\n", r.err);
                rc = 2;
                break;
            }
            if (it >= 0) t[k][it] = s;
        }
    double med[M_N] = {0};
    for (int k = 0; k < nm && rc == 0; k++)
        if (!modes || modes >> k & 1) med[k] = median(t[k], o->iters);
    /* every rank's wrong elements, summed */
    double wrong = (double)r.wrong;
    if (loomAllReduce(&wrong, &wrong, 1, loomFloat64, loomSum, comm, NULL) != loomSuccess) rc = 2;
    double hidden = 0;
    if (nm == M_N && med[M_FUSED] > 0) {
        hidden = (med[M_FUSED] + med[M_COMPUTE] - med[M_FUSED_C]) / med[M_FUSED] * 100;
        hidden = hidden < 0 ? 0 : hidden > 100 ? 100 : hidden;
    }
    if (rank == 0 && rc == 0) {
        printf("# %-14s %12s %10s\n", "mode", "median_us", "vs_fused");
        for (int k = 0; k < nm; k++)
            if (!modes || modes >> k & 1)
                printf("  %-14s %12.1f %10.2f\n", mode_names[k], med[k] * 1e6,
                       med[M_FUSED] > 0 ? med[k] / med[M_FUSED] : 0);
        if (nm == M_N)
            printf("# hidden: fused %.1f us + compute %.1f us, together %.1f us\n",
                   med[M_FUSED] * 1e6, med[M_COMPUTE] * 1e6, med[M_FUSED_C] * 1e6);
        printf("fusion model=%s ranks=%d per_tensor_us=%.1f fused_us=%.1f tuned_us=%.1f "
               "monolithic_us=%.1f hidden_pct=%.1f wrong=%.0f\n",
               m.name, nranks, med[M_PER] * 1e6, med[M_FUSED] * 1e6, med[M_TUNED] * 1e6,
               med[M_MONO] * 1e6, hidden, wrong);
        printf("# horovod_us=%.1f\n", med[M_HOROVOD] * 1e6);
        loomFusionStats_t st = {0};
        if (!o->dev && loomFusionGetStats(fx[M_BF16], &st) == loomSuccess)
            printf("# fused_bf16_us=%.1f wire_bytes_per_step=%.0f exact_bytes_per_step=%.0f "
                   "max_rel_error=%.3g mean_rel_error=%.3g\n",
                   med[M_BF16] * 1e6, (double)st.wireBytes / (o->iters + o->warmup),
                   (double)m.total * 4 * 2 * (nranks - 1) / nranks, st.maxRelError,
                   st.meanRelError);
        /* where the compressed buckets' time went, per step (every round, warm-up included) */
        double steps = o->iters + o->warmup;
        if (st.compressedBuckets)
            printf("# fused_bf16 per step: buckets %.1f, wall %.1f us, encode %.1f us, reduce "
                   "%.1f us, decode %.1f us (the codec's CPU time on the progress thread, "
                   "overlapped with the transfers where the pipeline allows)\n",
                   (double)st.compressedBuckets / steps, st.compressedSeconds / steps * 1e6,
                   st.encodeSeconds / steps * 1e6, st.reduceSeconds / steps * 1e6,
                   st.decodeSeconds / steps * 1e6);
    }
    loomFusionDestroy(fx[M_BF16]);
    loomFusionDestroy(fx[M_HOROVOD]);
    loomFusionDestroy(fx[M_TUNED]);
    loomFusionDestroy(fx[M_FUSED]);
    for (int k = 0; k < M_N; k++)
        free(t[k]);
    replay_free(&r);
    replay_free_model(&m);
    return rc ? rc : wrong > 0 ? 1 : 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: loom-fusion-bench [-P k] [-m MODEL] [-n ROUNDS] [-w WARMUP] [--gflops R "
            "[--batch B]] [--tune-file FILE]\n"
            "  -P k             fork k local ranks (default: a launcher's ranks, else 1)\n"
            "  -m MODEL         resnet50 (default), bert-base, llm24x2048 (data/fusion), or a "
            "path to such a list\n"
            "  -n ROUNDS        timed rounds, each running every mode once (default 5)\n"
            "  -w WARMUP        untimed rounds first (default 1)\n"
            "  --gflops R       simulate backward compute at R GFLOP/s per rank (default: none)\n"
            "  --batch B        samples per rank for the compute (default 32)\n"
            "  --tune-file F    the tuning file for the tuned mode (default: LOOM_TUNE_FILE)\n"
            "  --modes LIST     run only these modes, comma-separated (say fused,fused_bf16)\n"
            "  --mem host|device  where the tensors live (default host); device: each rank's GPU "
            "(its local rank), the calls on a stream, a step timed until the stream is done; no "
            "fused_bf16, no --gflops\n"
            "Ends with: fusion model=.. ranks=.. per_tensor_us=.. fused_us=.. tuned_us=.. "
            "monolithic_us=.. hidden_pct=.. wrong=..\n");
}

int main(int argc, char **argv)
{
    opts_t o = {.model = "resnet50", .iters = 5, .warmup = 1, .batch = 32};
    int k = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(), 0;
        if (!v) return usage(), 2;
        char *end;
        if (!strcmp(a, "-P"))
            k = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "-m"))
            o.model = v, end = (char *)"";
        else if (!strcmp(a, "-n"))
            o.iters = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "-w"))
            o.warmup = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--gflops"))
            o.gflops = strtod(v, &end);
        else if (!strcmp(a, "--batch"))
            o.batch = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--modes")) {
            end = (char *)"";
            o.modes = 0;
            char buf[256];
            snprintf(buf, sizeof(buf), "%s", v);
            for (char *sv, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
                int m = 0;
                while (m < M_N && strcmp(tok, mode_names[m]) != 0)
                    m++;
                if (m == M_N || m == M_FUSED_C || m == M_COMPUTE) {
                    fprintf(stderr, "loom-fusion-bench: --modes: unknown mode '%s'\n", tok);
                    return 2;
                }
                o.modes |= 1u << m;
            }
            if (o.modes & (1u << M_FUSED)) o.modes |= 1u << M_FUSED_C | 1u << M_COMPUTE;
        } else if (!strcmp(a, "--mem")) {
            end = (char *)"";
            if (!strcmp(v, "device"))
                o.dev = true;
            else if (strcmp(v, "host") != 0)
                end = (char *)"x";
        } else if (!strcmp(a, "--tune-file"))
            setenv("LOOM_TUNE_FILE", v, 1), end = (char *)"";
        else
            return usage(), 2;
        if (*end || k < 0 || k > 1024 || o.iters < 1 || o.warmup < 0 || o.gflops < 0 ||
            o.batch < 1) {
            fprintf(stderr, "loom-fusion-bench: %s %s: not a valid value\n", a, v);
            return 2;
        }
        i++;
    }
    if (o.dev && o.gflops > 0) {
        fprintf(stderr, "loom-fusion-bench: --gflops simulates compute on the host; it does not "
                        "apply to --mem device\n");
        return 2;
    }
    return ranks_run("loom-fusion-bench", k, bench_rank, &o);
}
