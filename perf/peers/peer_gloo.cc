/*
 * peer_gloo: Gloo's host-memory allreduce timed exactly like loom-perf times loomAllReduce, so
 * that the two tables (and CSVs) can be compared line by line.
 *
 * Like loom-perf it forks its -P ranks itself. They meet through a gloo::rendezvous::FileStore in
 * a fresh temporary directory (removed at the end) and talk over gloo's TCP transport on the
 * loopback interface, which is what loom's socket transport uses with LOOM_SOCKET_IFNAME=lo.
 *
 * Per size and algorithm: warmup, barrier, ITERS timed out-of-place calls; the same again in
 * place. The time reported is each rank's mean per call, averaged over ranks. With -A all (the
 * default) every algorithm that works at this rank count is timed and each column reports the
 * fastest, named in the last column ("oop/ip" when the two columns' winners differ). With -c 1
 * one more call of each kind runs after the timed loops on fresh data and is checked exactly.
 */
#include <ftw.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "peer_common.h"

namespace
{

enum Algo { RING, RING_CHUNKED, HALVING_DOUBLING, BCUBE, NEW_RING, NEW_BCUBE, NALGO };

/* new_*: the newer gloo::allreduce() entry point with AllreduceOptions, which also takes a
 * separate input buffer; the others are the classic in-place algorithm classes. */
const char *const kAlgoNames[NALGO] = {
    "ring", "ring_chunked", "halving_doubling", "bcube", "new_ring", "new_bcube",
};

/* Gloo's bcube splits ranks into groups of `base` (2) per step and only covers every rank when
 * the rank count is a power of the base; elsewhere it is not a valid choice. */
bool algo_supported(Algo a, int nranks)
{
    if (a == BCUBE || a == NEW_BCUBE) return nranks > 0 && (nranks & (nranks - 1)) == 0;
    return true;
}

/* One allreduce implementation bound to fixed buffers `in` and `out` of `count` elements. */
class Runner
{
  public:
    /* noexcept(false) like gloo::Algorithm's, whose destructors may throw on a transport error. */
    virtual ~Runner() noexcept(false) {}
    virtual void oop() = 0; /* out = sum over ranks of in */
    virtual void ip() = 0;  /* out = sum over ranks of out */
};

template <typename T, template <typename> class A> class ClassicRunner : public Runner
{
  public:
    ClassicRunner(const std::shared_ptr<gloo::Context> &ctx, const T *in, T *out, size_t count)
        : in_(in), out_(out), bytes_(count * sizeof(T)),
          algo_(ctx, std::vector<T *>{out}, static_cast<int>(count))
    {
    }
    /* The classic algorithms only reduce in place, so a caller who must keep its input copies
     * it first, and so do we: the copy is part of the out-of-place time. */
    void oop() override
    {
        memcpy(out_, in_, bytes_);
        algo_.run();
    }
    void ip() override { algo_.run(); }

  private:
    const T *in_;
    T *out_;
    size_t bytes_;
    A<T> algo_;
};

template <typename T> class OptionsRunner : public Runner
{
  public:
    OptionsRunner(const std::shared_ptr<gloo::Context> &ctx, T *in, T *out, size_t count,
                  gloo::AllreduceOptions::Algorithm algo)
        : ctx_(ctx), in_(in), out_(out), count_(count), algo_(algo)
    {
    }
    void oop() override { run(in_); }
    void ip() override { run(nullptr); }

  private:
    /* Options are built per call, as a caller of this API does (PyTorch's ProcessGroupGloo for
     * one); with tcp that only wraps the pointers. */
    void run(T *in)
    {
        gloo::AllreduceOptions opts(ctx_);
        opts.setAlgorithm(algo_);
        if (in != nullptr)
            opts.setInput(in, count_); /* without an input, the output is reduced in place */
        opts.setOutput(out_, count_);
        opts.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<T>));
        /* A fresh tag per call keeps a fast rank's next call from matching a slow rank's
         * messages of the previous one; every rank makes the same calls, so tags agree. */
        opts.setTag(tag_++);
        gloo::allreduce(opts);
    }

    std::shared_ptr<gloo::Context> ctx_;
    T *in_;
    T *out_;
    size_t count_;
    gloo::AllreduceOptions::Algorithm algo_;
    uint32_t tag_ = 0;
};

template <typename T>
std::unique_ptr<Runner> make_runner(Algo a, const std::shared_ptr<gloo::Context> &ctx, T *in,
                                    T *out, size_t count)
{
    switch (a) {
    case RING:
        return std::unique_ptr<Runner>(
            new ClassicRunner<T, gloo::AllreduceRing>(ctx, in, out, count));
    case RING_CHUNKED:
        return std::unique_ptr<Runner>(
            new ClassicRunner<T, gloo::AllreduceRingChunked>(ctx, in, out, count));
    case HALVING_DOUBLING:
        return std::unique_ptr<Runner>(
            new ClassicRunner<T, gloo::AllreduceHalvingDoubling>(ctx, in, out, count));
    case BCUBE:
        return std::unique_ptr<Runner>(
            new ClassicRunner<T, gloo::AllreduceBcube>(ctx, in, out, count));
    case NEW_RING:
        return std::unique_ptr<Runner>(
            new OptionsRunner<T>(ctx, in, out, count, gloo::AllreduceOptions::Algorithm::RING));
    case NEW_BCUBE:
        return std::unique_ptr<Runner>(
            new OptionsRunner<T>(ctx, in, out, count, gloo::AllreduceOptions::Algorithm::BCUBE));
    case NALGO: break;
    }
    return nullptr;
}

/* Mean seconds per call of `iters` calls of f after `warmup` untimed ones. */
template <typename F> double time_loop(F f, gloo::BarrierAllToAll &barrier, int warmup, int iters)
{
    for (int i = 0; i < warmup; i++)
        f();
    /* Start together, so no rank's time includes waiting for a late peer to arrive. */
    barrier.run();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++)
        f();
    std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0;
    return d.count() / iters;
}

struct Column {
    double us = INFINITY;
    Algo algo = NALGO;
};

template <typename T>
int run_rank(const peer_opts &o, const std::vector<Algo> &algos, int rank, int nranks,
             const std::string &dir)
{
    gloo::transport::tcp::attr attr;
    attr.iface = "lo";
    attr.ai_family = AF_INET; /* "lo" has ::1 too; one family keeps every pair on 127.0.0.1 */
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    auto rctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    /* Gloo's default of 30 s per operation could fire on a large size on an oversubscribed
     * machine; our own alarm() is the real bound. */
    rctx->setTimeout(std::chrono::seconds(o.timeout_s));
    rctx->connectFullMesh(store, dev);
    std::shared_ptr<gloo::Context> ctx = rctx;

    gloo::BarrierAllToAll barrier(ctx);
    double stats[4];
    gloo::AllreduceRing<double> stats_reduce(ctx, std::vector<double *>{stats}, 4);

    const size_t max_count = o.max_bytes / sizeof(T);
    void *pin = nullptr, *pout = nullptr;
    /* Page alignment, like any sensibly allocated buffer, so alignment is not what we measure. */
    if (posix_memalign(&pin, 4096, max_count * sizeof(T) + 1) != 0 ||
        posix_memalign(&pout, 4096, max_count * sizeof(T) + 1) != 0) {
        fprintf(stderr, "peer_gloo: rank %d: out of memory\n", rank);
        return 1;
    }
    T *in = static_cast<T *>(pin), *out = static_cast<T *>(pout);

    FILE *csv = nullptr;
    if (rank == 0) {
        if (o.csv != nullptr && (csv = peer_csv_open(o.csv)) == nullptr) return 1;
        printf("# gloo algorithms timed, the fastest reported per column:");
        for (Algo a : algos)
            printf(" %s", kAlgoNames[a]);
        printf("\n");
        peer_print_header(&o, "peer_gloo", nranks, "algorithm");
    }

    double wrong_total = 0, busbw_sum = 0;
    int nbusbw = 0;
    for (size_t bytes = o.min_bytes; bytes != 0; bytes = peer_next_size(&o, bytes)) {
        const size_t count = bytes / sizeof(T);
        if (count == 0) continue; /* nothing to reduce; nccl-tests would print a meaningless row */
        Column best[2];
        double wrong[2] = {0, 0};
        for (Algo a : algos) {
            /* A watchdog rather than a bound on the whole run: a long sweep is fine, a step that
             * makes no progress (a peer died, a connection stalled) ends the rank. */
            alarm(static_cast<unsigned>(o.timeout_s));
            std::unique_ptr<Runner> r = make_runner<T>(a, ctx, in, out, count);
            /* Fill both so that no page is first touched inside a timed loop. */
            peer_fill(in, count, o.dtype, rank);
            peer_fill(out, count, o.dtype, rank);
            stats[0] = time_loop([&] { r->oop(); }, barrier, o.warmup, o.iters);
            /* In place the buffer is summed into itself call after call; the values grow but
             * stay finite for float/double at any sensible ITERS, and int32 wraps (-fwrapv). */
            peer_fill(out, count, o.dtype, rank);
            stats[1] = time_loop([&] { r->ip(); }, barrier, o.warmup, o.iters);
            stats[2] = stats[3] = 0;
            if (o.check) {
                memset(out, 0xff, count * sizeof(T)); /* stale results must not pass */
                r->oop();
                stats[2] = static_cast<double>(peer_count_wrong(out, count, o.dtype, nranks));
                peer_fill(out, count, o.dtype, rank);
                r->ip();
                stats[3] = static_cast<double>(peer_count_wrong(out, count, o.dtype, nranks));
            }
            stats_reduce.run();
            for (int c = 0; c < 2; c++) {
                double us = stats[c] / nranks * 1e6;
                if (us < best[c].us) {
                    best[c].us = us;
                    best[c].algo = a;
                }
                /* Every algorithm's errors count, not just the winner's: a fast wrong result
                 * must not go unnoticed. */
                wrong[c] += stats[2 + c];
            }
            if (rank == 0 && o.verbose)
                printf("#   %-16s %12zu B  oop %10.2f us  ip %10.2f us  wrong %.0f/%.0f\n",
                       kAlgoNames[a], count * sizeof(T), stats[0] / nranks * 1e6,
                       stats[1] / nranks * 1e6, stats[2], stats[3]);
        }
        if (rank == 0) {
            peer_result res;
            res.bytes = count * sizeof(T);
            res.count = count;
            res.oop_us = best[0].us;
            res.ip_us = best[1].us;
            res.oop_wrong = wrong[0];
            res.ip_wrong = wrong[1];
            std::string name = kAlgoNames[best[0].algo];
            if (best[1].algo != best[0].algo) name += std::string("/") + kAlgoNames[best[1].algo];
            peer_print_row(&o, &res, nranks, name.c_str());
            if (csv != nullptr) peer_csv_row(csv, &o, &res, nranks);
            wrong_total += wrong[0] + wrong[1];
            /* nccl-tests averages the bus bandwidth over both columns. */
            busbw_sum += peer_busbw(res.bytes, res.oop_us, nranks) +
                         peer_busbw(res.bytes, res.ip_us, nranks);
            nbusbw += 2;
        }
    }
    if (rank == 0) {
        peer_print_footer(&o, wrong_total, busbw_sum, nbusbw);
        if (csv != nullptr) fclose(csv);
    }
    /* Nobody leaves while a peer may still read from its sockets. */
    barrier.run();
    free(pin);
    free(pout);
    /* Wrong results are a failure, so a script cannot mistake a broken run for a fast one. */
    return wrong_total != 0 ? 1 : 0;
}

int run_rank_typed(const peer_opts &o, const std::vector<Algo> &algos, int rank, int nranks,
                   const std::string &dir)
{
    try {
        switch (o.dtype) {
        case PEER_FLOAT: return run_rank<float>(o, algos, rank, nranks, dir);
        case PEER_DOUBLE: return run_rank<double>(o, algos, rank, nranks, dir);
        case PEER_INT32: return run_rank<int32_t>(o, algos, rank, nranks, dir);
        }
    } catch (const std::exception &e) {
        fprintf(stderr, "peer_gloo: rank %d: %s\n", rank, e.what());
    }
    return 1;
}

/* Parses -A: "all", or a comma-separated list of names. */
bool parse_algos(const char *spec, int nranks, std::vector<Algo> *algos)
{
    std::string s(spec);
    if (s == "all") {
        for (int a = 0; a < NALGO; a++) {
            /* Measured on loopback (Debian 12, gloo 0.5.0 of 2022-05): beyond 2 ranks new_ring's
             * 1 MiB segments stall on TCP retransmission timeouts, 3.6 s for one 4 MiB call at
             * 4 ranks where the classic algorithms take 25-60 ms; at 64 MiB it would dominate the
             * run for nothing. It can still be asked for by name. */
            if (a == NEW_RING && nranks > 2) continue;
            if (algo_supported(static_cast<Algo>(a), nranks))
                algos->push_back(static_cast<Algo>(a));
        }
        return true;
    }
    size_t pos = 0;
    while (pos <= s.size()) {
        size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        std::string name = s.substr(pos, end - pos);
        int a = 0;
        while (a < NALGO && name != kAlgoNames[a])
            a++;
        if (a == NALGO) {
            fprintf(stderr, "peer_gloo: unknown algorithm '%s'; known:", name.c_str());
            for (int k = 0; k < NALGO; k++)
                fprintf(stderr, " %s", kAlgoNames[k]);
            fprintf(stderr, " all\n");
            return false;
        }
        if (!algo_supported(static_cast<Algo>(a), nranks)) {
            fprintf(stderr, "peer_gloo: %s needs a power-of-two rank count\n", name.c_str());
            return false;
        }
        algos->push_back(static_cast<Algo>(a));
        pos = end + 1;
    }
    return !algos->empty();
}

/* The parent's children, for the signal handler: a parent stopped by timeout(1) or ^C passes
 * the signal on, so no rank outlives it (each also has its own alarm as a last resort). */
pid_t g_children[1024];
volatile sig_atomic_t g_nchildren = 0;

extern "C" void forward_signal(int sig)
{
    for (sig_atomic_t i = 0; i < g_nchildren; i++)
        if (g_children[i] > 0) kill(g_children[i], sig == SIGINT ? SIGINT : SIGTERM);
}

extern "C" int remove_entry(const char *path, const struct stat *, int, struct FTW *)
{
    return remove(path);
}

} // namespace

int main(int argc, char **argv)
{
    peer_opts o;
    int rc = peer_parse_args(argc, argv, &o, 1);
    if (rc != 0) return rc < 0 ? 2 : 0;
    std::vector<Algo> algos;
    if (!parse_algos(o.algo, o.nranks, &algos)) return 2;
    if (o.nranks > static_cast<int>(sizeof g_children / sizeof g_children[0])) {
        fprintf(stderr, "peer_gloo: at most %zu ranks\n", sizeof g_children / sizeof g_children[0]);
        return 2;
    }
    /* The classic algorithms count elements in an int. */
    if (o.max_bytes / peer_type_size(o.dtype) > static_cast<size_t>(INT_MAX)) {
        fprintf(stderr, "peer_gloo: %zu bytes exceeds gloo's int count\n", o.max_bytes);
        return 2;
    }

    const char *tmp = getenv("TMPDIR");
    std::string templ =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/peer_gloo.XXXXXX";
    std::vector<char> dirbuf(templ.begin(), templ.end());
    dirbuf.push_back('\0');
    if (mkdtemp(dirbuf.data()) == nullptr) {
        perror("peer_gloo: mkdtemp");
        return 1;
    }
    const std::string dir(dirbuf.data());

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGHUP, &sa, nullptr);

    fflush(nullptr); /* or the children would print the parent's buffered output again */
    bool failed = false;
    for (int r = 0; r < o.nranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("peer_gloo: fork");
            failed = true;
            forward_signal(SIGTERM);
            break;
        }
        if (pid == 0) {
            signal(SIGTERM, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            /* A rank stuck on a dead peer must not hang the benchmark forever; run_rank re-arms
             * this for every size and algorithm. */
            alarm(static_cast<unsigned>(o.timeout_s));
            int crc = run_rank_typed(o, algos, r, o.nranks, dir);
            fflush(nullptr);
            /* _exit: gloo's device threads and static state need no teardown in a child. */
            _exit(crc);
        }
        g_children[r] = pid;
        g_nchildren = r + 1;
    }

    int remaining = g_nchildren;
    while (remaining > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        remaining--;
        int r = 0;
        while (r < g_nchildren && g_children[r] != pid)
            r++;
        if (r < g_nchildren) g_children[r] = 0;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (WIFSIGNALED(status))
                fprintf(stderr, "peer_gloo: rank %d killed by signal %d%s\n", r, WTERMSIG(status),
                        WTERMSIG(status) == SIGALRM ? " (timeout)" : "");
            else
                fprintf(stderr, "peer_gloo: rank %d exited with %d\n", r, WEXITSTATUS(status));
            /* The others would only wait for the lost rank until gloo's timeout. */
            if (!failed) forward_signal(SIGTERM);
            failed = true;
        }
    }
    nftw(dir.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return failed ? 1 : 0;
}
