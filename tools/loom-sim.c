/*
 * loom-sim: predicted allreduce (or reduce, broadcast) times of loom's algorithms on a modelled
 * machine of up to 1024 (or more) ranks, from the very schedules the planner builds
 * (src/sim/sim.h says the model).
 *
 *   loom-sim --ranks P[,P2...] --per-node G [-b MIN] [-e MAX] [-f F] [--algo NAME[,NAME...]]
 *            [--collective allreduce|reduce|broadcast] [--root R]
 *            [--machine h200|dev|testbed] [--fabric rail|fat-tree] [--oversub X]
 *            [--loc-alpha US] [--loc-bw GBPS] [--net-alpha US] [--net-bw GBPS]
 *            [--slice BYTES] [--channels C] [--csv FILE] [--plot PREFIX]
 *
 * --collective reduce or broadcast (root R, default 0) runs the rows that have that form (ring,
 * tree), with busbw = algbw as nccl-tests counts them.
 * Prints nccl-tests' table, one block per algorithm headed by its name, then the registry's
 * automatic choice per size and the simulated time of what it chose. --csv writes every point;
 * --plot PREFIX writes the CSV and draws PREFIX-busbw.png (busbw against size, per algorithm)
 * and, with several --ranks, PREFIX-scaling.png (time against rank count, per size) with
 * scripts/sim-plot.py under /usr/bin/python3 (matplotlib).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "registry.h"
#include "sim.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: loom-sim --ranks P[,P...] [--per-node G] [-b MIN] [-e MAX] [-f F]\n"
               "                [--algo NAME[,NAME...]] [--machine h200|dev|testbed] [--fabric "
               "rail|fat-tree]\n"
               "                [--oversub X] [--loc-alpha US] [--loc-bw GB/s] [--net-alpha US]\n"
               "                [--net-bw GB/s] [--slice BYTES] [--channels C] [--csv FILE]\n"
               "                [--plot PREFIX] [--collective allreduce|reduce|broadcast] "
               "[--root R]\n"
               "algorithms:");
    for (int i = 0; i < ALGO_COUNT; i++)
        fprintf(f, " %s", registry_get(i)->name);
    fprintf(f, " (default: every one that fits the layout)\n");
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k':
    case 'K': v *= 1024; break;
    case 'm':
    case 'M': v *= 1024 * 1024; break;
    case 'g':
    case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (uint64_t)v;
}

static int split_list(char *s, char **out, int max)
{
    int n = 0;
    for (char *t = strtok(s, ","); t && n < max; t = strtok(NULL, ","))
        out[n++] = t;
    return n;
}

/* Where this program's scripts/ is: beside the build tree's parent, or the source given by
 * LOOM_SIM_PLOT. */
static const char *plot_script(void)
{
    const char *e = getenv("LOOM_SIM_PLOT");
    if (e && *e) return e;
    static char path[4096];
    char self[4000];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        for (int up = 0; up < 4; up++) {
            char *sl = strrchr(self, '/');
            if (sl == NULL) break;
            *sl = '\0';
            snprintf(path, sizeof(path), "%s/scripts/sim-plot.py", self);
            if (access(path, R_OK) == 0) return path;
        }
    }
    return "scripts/sim-plot.py";
}

int main(int argc, char **argv)
{
    char *ranks_arg = NULL, *algo_arg = NULL, *csv = NULL, *plot = NULL;
    const char *machine = "h200";
    uint64_t lo = 8, hi = 8ull << 30;
    double f = 2;
    int per_node = -1;
    sim_machine_t ov = {0};
    const char *fabric = NULL;
    double oversub = 0;
    const char *coll_arg = "allreduce";
    int root = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            fprintf(stderr, "loom-sim: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--ranks") == 0 || strcmp(a, "-P") == 0)
            ranks_arg = argv[i + 1];
        else if (strcmp(a, "--per-node") == 0 || strcmp(a, "-G") == 0)
            per_node = atoi(v);
        else if (strcmp(a, "-b") == 0)
            lo = parse_size(v);
        else if (strcmp(a, "-e") == 0)
            hi = parse_size(v);
        else if (strcmp(a, "-f") == 0)
            f = atof(v);
        else if (strcmp(a, "--algo") == 0)
            algo_arg = argv[i + 1];
        else if (strcmp(a, "--machine") == 0)
            machine = v;
        else if (strcmp(a, "--fabric") == 0)
            fabric = v;
        else if (strcmp(a, "--oversub") == 0)
            oversub = atof(v);
        else if (strcmp(a, "--loc-alpha") == 0)
            ov.loc_alpha = atof(v) * 1e-6;
        else if (strcmp(a, "--loc-bw") == 0)
            ov.loc_bw = atof(v) * 1e9;
        else if (strcmp(a, "--net-alpha") == 0)
            ov.net_alpha = atof(v) * 1e-6;
        else if (strcmp(a, "--net-bw") == 0)
            ov.net_bw = atof(v) * 1e9;
        else if (strcmp(a, "--slice") == 0)
            ov.slice_bytes = parse_size(v);
        else if (strcmp(a, "--channels") == 0)
            ov.nchannels = atoi(v);
        else if (strcmp(a, "--csv") == 0)
            csv = argv[i + 1];
        else if (strcmp(a, "--plot") == 0)
            plot = argv[i + 1];
        else if (strcmp(a, "--collective") == 0)
            coll_arg = v;
        else if (strcmp(a, "--root") == 0)
            root = atoi(v);
        else
            takes = false;
        if (!takes) {
            fprintf(stderr, "loom-sim: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        i++;
    }
    sim_machine_t base;
    if (!sim_machine_preset(machine, &base)) {
        fprintf(stderr, "loom-sim: --machine %s: unknown (h200, dev, testbed)\n", machine);
        return 2;
    }
    if (ranks_arg == NULL) {
        usage(stderr);
        return 2;
    }
    if (per_node >= 0) base.per_node = per_node;
    if (fabric) {
        if (strcmp(fabric, "rail") == 0)
            base.fabric = SIM_RAIL;
        else if (strcmp(fabric, "fat-tree") == 0)
            base.fabric = SIM_FAT_TREE;
        else {
            fprintf(stderr, "loom-sim: --fabric %s: unknown (rail, fat-tree)\n", fabric);
            return 2;
        }
    }
    if (oversub > 0) base.oversub = oversub;
    if (ov.loc_alpha > 0) base.loc_alpha = ov.loc_alpha;
    if (ov.loc_bw > 0) base.loc_bw = ov.loc_bw;
    if (ov.net_alpha > 0) base.net_alpha = ov.net_alpha;
    if (ov.net_bw > 0) base.net_bw = ov.net_bw;
    if (ov.slice_bytes > 0) base.slice_bytes = ov.slice_bytes;
    if (ov.nchannels > 0) base.nchannels = ov.nchannels;
    if (lo < 4) lo = 4;
    if (f <= 1 || hi < lo) {
        fprintf(stderr, "loom-sim: sizes -b %llu -e %llu -f %g: need -f > 1 and -e >= -b\n",
                (unsigned long long)lo, (unsigned long long)hi, f);
        return 2;
    }
    sim_coll_t coll;
    if (strcmp(coll_arg, "allreduce") == 0)
        coll = SIM_ALLREDUCE;
    else if (strcmp(coll_arg, "reduce") == 0)
        coll = SIM_REDUCE;
    else if (strcmp(coll_arg, "broadcast") == 0)
        coll = SIM_BROADCAST;
    else {
        fprintf(stderr, "loom-sim: --collective %s: unknown (allreduce, reduce, broadcast)\n",
                coll_arg);
        return 2;
    }
    int rop = coll == SIM_REDUCE ? ROOTED_REDUCE : ROOTED_BROADCAST;
    char *rk[64];
    int nr = split_list(ranks_arg, rk, 64);
    int algos[ALGO_COUNT], na = 0;
    bool explicit_algos = algo_arg != NULL;
    if (algo_arg) {
        char *names[ALGO_COUNT + 1];
        int n = split_list(algo_arg, names, ALGO_COUNT + 1);
        for (int i = 0; i < n; i++) {
            int id;
            if (registry_parse(names[i], &id) != loomSuccess || id == ALGO_AUTO) {
                fprintf(stderr, "loom-sim: --algo %s: unknown\n", names[i]);
                usage(stderr);
                return 2;
            }
            if (coll != SIM_ALLREDUCE && registry_rooted_forced(id, rop) < 0) {
                fprintf(stderr, "loom-sim: --algo %s: no %s form\n", names[i], coll_arg);
                return 2;
            }
            algos[na++] = id;
        }
    } else {
        for (int i = 0; i < ALGO_COUNT; i++)
            if (coll == SIM_ALLREDUCE || registry_rooted_forced(i, rop) >= 0) algos[na++] = i;
    }
    FILE *out = NULL;
    char csvpath[4096];
    if (plot && !csv) {
        snprintf(csvpath, sizeof(csvpath), "%s.csv", plot);
        csv = csvpath;
    }
    if (csv) {
        out = fopen(csv, "w");
        if (out == NULL) {
            fprintf(stderr, "loom-sim: %s: %s\n", csv, strerror(errno));
            return 1;
        }
        fprintf(out, "ranks,per_node,algo,bytes,time_us,algbw,busbw,steps,slice\n");
    }
    int nsizes = 0;
    uint64_t sizes[128];
    for (double s = (double)lo; s <= (double)hi * 1.0000001 && nsizes < 128; s *= f)
        sizes[nsizes++] = ((uint64_t)(s + 0.5)) & ~(uint64_t)3;
    for (int ri = 0; ri < nr; ri++) {
        sim_machine_t m = base;
        m.ranks = atoi(rk[ri]);
        if (m.ranks < 1) {
            fprintf(stderr, "loom-sim: --ranks %s: not a rank count\n", rk[ri]);
            return 2;
        }
        if (coll != SIM_ALLREDUCE && (root < 0 || root >= m.ranks)) {
            fprintf(stderr, "loom-sim: --root %d: not one of %d ranks\n", root, m.ranks);
            return 2;
        }
        int g = m.per_node > 0 && m.per_node < m.ranks ? m.per_node : m.ranks;
        /* as comm.c does: nodes with more ranks than cores get 4x slices job-wide */
        if (m.cores > 0 && g > m.cores && ov.slice_bytes == 0) m.slice_bytes *= 4;
        int nn = (m.ranks + g - 1) / g;
        registry_model_t model = {.nranks = m.ranks,
                                  .nnodes = nn,
                                  .a_net = m.net_alpha + m.step_alpha,
                                  .b_net = 1 / m.net_bw,
                                  .a_loc = m.loc_alpha + m.step_alpha,
                                  .b_loc = 1 / m.loc_bw,
                                  .shared_mem = m.cores > 0,
                                  .oversubscribed = m.cores > 0 && g > m.cores};
        printf("# loom-sim: %s, %d ranks, %d nodes of %d, machine %s (%s, oversubscription %g)\n",
               coll_arg, m.ranks, nn, g, machine,
               m.fabric == SIM_RAIL ? "rail-optimised" : "fat tree", m.oversub);
        printf("# node-local links %.1f us, %.1f GB/s; NICs %.1f us, %.1f GB/s; slice %llu B, "
               "%d channels\n",
               m.loc_alpha * 1e6, m.loc_bw / 1e9, m.net_alpha * 1e6, m.net_bw / 1e9,
               (unsigned long long)m.slice_bytes, m.nchannels);
        double *times = calloc((size_t)ALGO_COUNT * (size_t)nsizes, sizeof(double));
        if (times == NULL) return 1;
        for (int ai = 0; ai < na; ai++) {
            int a = algos[ai];
            const registry_algo_t *row = registry_get(a);
            if (!explicit_algos && row->unfit && row->unfit(&model) &&
                strstr(row->unfit(&model), "one node")) {
                printf("#\n# %s: skipped (%s)\n", row->name, row->unfit(&model));
                continue;
            }
            printf("#\n# algorithm: %s\n", row->name);
            printf("#%11s %13s %9s %7s %7s %11s %9s %9s\n", "size", "count", "type", "redop",
                   "root", "time", "algbw", "busbw");
            printf("#%11s %13s %9s %7s %7s %11s %9s %9s\n", "(B)", "(elements)", "", "", "", "(us)",
                   "(GB/s)", "(GB/s)");
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int si = 0; si < nsizes; si++) {
                sim_result_t res;
                if (sim_collective(&m, coll, a, sizes[si], root, &res) != loomSuccess) {
                    fprintf(stderr, "loom-sim: %s\n", base_last_error());
                    return 1;
                }
                double t = res.time, algbw = t > 0 ? (double)sizes[si] / t / 1e9 : 0;
                double busbw =
                    coll == SIM_ALLREDUCE ? algbw * 2.0 * (m.ranks - 1) / m.ranks : algbw;
                times[(size_t)a * (size_t)nsizes + (size_t)si] = t;
                printf("%12llu %13llu %9s %7s %7d %11.2f %9.2f %9.2f%s\n",
                       (unsigned long long)sizes[si], (unsigned long long)(sizes[si] / 4), "float",
                       coll == SIM_BROADCAST ? "none" : "sum", coll == SIM_ALLREDUCE ? -1 : root,
                       t * 1e6, algbw, busbw,
                       res.slice_bytes != m.slice_bytes ? "  (coarser slices)" : "");
                if (out)
                    fprintf(out, "%d,%d,%s,%llu,%.4f,%.4f,%.4f,%llu,%llu\n", m.ranks, g, row->name,
                            (unsigned long long)sizes[si], t * 1e6, algbw, busbw,
                            (unsigned long long)res.steps, (unsigned long long)res.slice_bytes);
                fflush(stdout);
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("# %s: simulated in %.2f s\n", row->name,
                   (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        }
        /* the registry's automatic choice, against the simulation */
        printf("#\n# auto: the registry's choice on this layout (its model fed the machine's "
               "constants)\n");
        printf("#%11s %16s %11s %16s %11s\n", "size", "choice", "time(us)", "best simulated",
               "time(us)");
        for (int si = 0; si < nsizes; si++) {
            int pick = coll == SIM_ALLREDUCE ? registry_pick(&model, sizes[si])
                                             : registry_pick_rooted(&model, rop, sizes[si]);
            int best = -1;
            for (int ai = 0; ai < na; ai++) {
                double t = times[(size_t)algos[ai] * (size_t)nsizes + (size_t)si];
                if (t > 0 && (best < 0 || t < times[(size_t)best * (size_t)nsizes + (size_t)si]))
                    best = algos[ai];
            }
            double tp = times[(size_t)pick * (size_t)nsizes + (size_t)si];
            char tps[32] = "-", tbs[32] = "-";
            if (tp > 0) snprintf(tps, sizeof(tps), "%.2f", tp * 1e6);
            if (best >= 0)
                snprintf(tbs, sizeof(tbs), "%.2f",
                         times[(size_t)best * (size_t)nsizes + (size_t)si] * 1e6);
            printf("%12llu %16s %11s %16s %11s\n", (unsigned long long)sizes[si],
                   registry_get(pick)->name, tps, best >= 0 ? registry_get(best)->name : "-", tbs);
        }
        free(times);
    }
    if (out) fclose(out);
    if (plot) {
        pid_t pid = fork();
        if (pid == 0) {
            execl("/usr/bin/python3", "python3", plot_script(), csv, plot, (char *)NULL);
            fprintf(stderr, "loom-sim: /usr/bin/python3: %s\n", strerror(errno));
            _exit(127);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "loom-sim: the plot script (%s) failed\n", plot_script());
            return 1;
        }
    }
    return 0;
}
