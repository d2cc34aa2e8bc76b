#include "param.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base.h"

/* The accepted values of each entry (param.h's param_desc_t). */
#define NUM(lo, hi, how) .min = (lo), .max = (hi), .bad = PARAM_BAD_##how
#define NAMES(list, how) .names = (list), .bad = PARAM_BAD_##how
#define ANY .names = NULL

static const param_desc_t params[PARAM_COUNT] = {
    [PARAM_DEBUG] = {"DEBUG", PARAM_T_STR, "WARN", "",
                     "log level: NONE, WARN (the default), INFO or TRACE",
                     NAMES("NONE|WARN|INFO|TRACE", DEFAULT)},
    [PARAM_DEBUG_SUBSYS] = {"DEBUG_SUBSYS", PARAM_T_STR, "ALL", "",
                            "subsystems to log: INIT,BOOT,NET,COLL,P2P,ENV,TUNING,SHM,CUDA,SHIM "
                            "or ALL; a leading ^ excludes the listed ones",
                            .names = "INIT|BOOT|NET|COLL|P2P|ENV|TUNING|SHM|CUDA|SHIM|ALL",
                            .list = true, .bad = PARAM_BAD_DEFAULT},
    [PARAM_DEBUG_FILE] = {"DEBUG_FILE", PARAM_T_STR, "", "",
                          "write the log to this file instead of stderr (%h: host, %p: pid)", ANY},
    [PARAM_TIMEOUT] =
        {"TIMEOUT", PARAM_T_DOUBLE, "30", "s",
         "seconds without a sign of life (data or heartbeat) from a peer a call waits on, after "
         "which the call fails naming it as dead, stopped or unreachable; inf: no limit",
         NUM(0.1, INFINITY, DEFAULT), .inf = true},
    [PARAM_HANDSHAKE_TIMEOUT] =
        {"HANDSHAKE_TIMEOUT", PARAM_T_DOUBLE, "5", "s",
         "seconds a connection may stay silent in the middle of its authentication (a peer that "
         "has not yet arrived is bounded by LOOM_TIMEOUT instead); inf: no limit",
         NUM(0.1, INFINITY, DEFAULT), .inf = true},
    [PARAM_OP_TIMEOUT] =
        {"OP_TIMEOUT", PARAM_T_DOUBLE, "0", "s",
         "seconds one operation may wait on live peers (computing, or not yet in the call) "
         "before it fails naming them; 0: no limit (the default)",
         NUM(0, INFINITY, DEFAULT), .inf = true},
    [PARAM_SOCKET_IFNAME] = {"SOCKET_IFNAME", PARAM_T_STR, "", "",
                             "interfaces to use: prefixes, '^' to exclude, '=' for exact names, "
                             "comma-separated (default: first non-loopback interface, else lo)",
                             ANY},
    [PARAM_SOCKET_FAMILY] = {"SOCKET_FAMILY", PARAM_T_STR, "", "",
                             "address family: 4 or 6 (default: the first address found)",
                             NAMES("4|6|ipv4|ipv6|AF_INET|AF_INET6", READER)},
    [PARAM_NSOCKS_PERPEER] = {"NSOCKS_PERPEER", PARAM_T_INT, "2", "",
                              "TCP sockets per peer connection (1-16)", NUM(1, 16, CLAMP)},
    [PARAM_NCHANNELS] = {"NCHANNELS", PARAM_T_INT, "2", "", "parallel rings per collective (1-16)",
                         NUM(1, 16, CLAMP)},
    [PARAM_SLICE_SIZE] = {"SLICE_SIZE", PARAM_T_SIZE, "256K", "bytes",
                          "pipeline slice: the unit sent, received and reduced at once",
                          NUM(64, INFINITY, CLAMP)},
    [PARAM_SLICES_IN_FLIGHT] = {"SLICES_IN_FLIGHT", PARAM_T_INT, "8", "",
                                "receive slices posted ahead per channel (staging buffers)",
                                NUM(1, 64, CLAMP)},
    [PARAM_MAX_MESSAGE] = {"MAX_MESSAGE", PARAM_T_SIZE, "64M", "bytes",
                           "largest frame accepted from a peer; longer headers are refused",
                           NUM(4096, INFINITY, CLAMP)},
    [PARAM_ALGO] =
        {"ALGO", PARAM_T_STR, "", "",
         "force the allreduce algorithm: ring, rd, rabenseifner, tree, hier, hier:tree, "
         "hier:rabenseifner, hier:rd, hier_leader, ps, determ, oneshot, segment (default: a cost "
         "model)",
         NAMES("ring|rd|rabenseifner|tree|hier|hier:tree|hier:rabenseifner|hier:rd|hier_leader|ps|"
               "determ|oneshot|segment",
               READER)},
    [PARAM_TRANSPORT] = {"TRANSPORT", PARAM_T_STR, "", "",
                         "force one transport for every peer: tcp, shm, mpi or ucx (ibv later)",
                         NAMES("tcp|shm|mpi|ucx|ibv|cuda", READER)},
    [PARAM_SOCKET_BUFFER] = {"SOCKET_BUFFER", PARAM_T_SIZE, "4M", "bytes",
                             "SO_SNDBUF/SO_RCVBUF asked for each data socket (0: system default)",
                             NUM(0, INFINITY, CLAMP)},
    /* 1000: a rank of an 8-rank ring waits longer than 50 us often enough that its neighbours
     * then wait for its wake-up (32 KiB: 206 us at 50, 47 us at 1000; 2 MiB 2.06 against 1.09 ms;
     * 16 idle cores, perf/RESULTS.md); nodes with more ranks than cores spin 100 us unless set,
     * yielding the core on every pass (comm.c's comm_tune_for_cores). */
    [PARAM_SPIN_US] = {"SPIN_US", PARAM_T_INT, "1000", "us",
                       "how long a waiting call polls without sleeping before it blocks",
                       NUM(0, 10000000, CLAMP)},
    [PARAM_NODE_ID] =
        {"NODE_ID", PARAM_T_STR, "", "",
         "override this rank's node identity (default host name + boot id + netns); a "
         "comma-separated list gives rank r the r-th name",
         ANY},
    [PARAM_JOB_SECRET] = {"JOB_SECRET", PARAM_T_STR, "", "",
                          "job secret for launches without a unique id (any text)", ANY},
    [PARAM_CUDA_BLOCKS] = {"CUDA_BLOCKS", PARAM_T_INT, "128", "",
                           "thread blocks (lanes per peer) of the device kernels, 1-128; rank 0's "
                           "value holds for the job",
                           NUM(1, 128, CLAMP)},
    [PARAM_CUDA_SLOT] = {"CUDA_SLOT", PARAM_T_SIZE, "64K", "bytes",
                         "largest piece one block moves per step through a peer's GPU memory",
                         NUM(4096, 16 << 20, CLAMP)},
    [PARAM_CUDA_NSLOT] = {"CUDA_NSLOT", PARAM_T_INT, "4", "",
                          "slots per block and peer (pieces in flight per lane), 2-16",
                          NUM(2, 16, CLAMP)},
    [PARAM_CUDA_THREADS] = {"CUDA_THREADS", PARAM_T_INT, "512", "",
                            "threads per block of the device kernels (half send, half receive)",
                            NUM(64, 512, CLAMP)},
    [PARAM_CUDA_PUSH_THREADS] = {"CUDA_PUSH_THREADS", PARAM_T_INT, "128", "",
                                 "threads of each block that send; the others receive",
                                 NUM(32, 480, CLAMP)},
    [PARAM_CUDA_COUPLE] = {"CUDA_COUPLE", PARAM_T_INT, "0", "",
                           "1: a block receives round k only after it pushed round k (as in "
                           "place), so its own input is still in L2 when it reduces",
                           NUM(0, 1, CLAMP)},
    [PARAM_CUDA_DIRECT] = {"CUDA_DIRECT", PARAM_T_SIZE, "4M", "bytes",
                           "allreduce from this size reads the peers' buffers where they are "
                           "(CUDA IPC, mapped once per allocation) instead of through loom's "
                           "slots; 0: never",
                           NUM(0, INFINITY, CLAMP)},
    [PARAM_CUDA_EMPTY] = {"CUDA_EMPTY", PARAM_T_INT, "0", "",
                          "debugging: launch kernels that return at once, to time the host "
                          "path alone (results are wrong)",
                          NUM(0, 1, CLAMP)},
    [PARAM_CUDA_ONESHOT] = {"CUDA_ONESHOT", PARAM_T_SIZE, "256K", "bytes",
                            "device allreduce up to this size reduces in one shot (every rank "
                            "reads all inputs); larger ones reduce-scatter then allgather. Two "
                            "ranks always use one shot (the same bytes on the link)",
                            NUM(0, INFINITY, CLAMP)},
    [PARAM_CUDA_STAGE_CHUNK] = {"CUDA_STAGE_CHUNK", PARAM_T_SIZE, "4M", "bytes",
                                "piece size when device data crosses nodes through pinned host "
                                "memory (copies overlap the network piece by piece)",
                                NUM(4096, INFINITY, CLAMP)},
    [PARAM_CUDA_LL] = {"CUDA_LL", PARAM_T_SIZE, "2M", "bytes",
                       "device allreduce of at most this many bytes times (ranks on the node - 1) "
                       "goes in low-latency words (one shot, no flags or fences; twice the "
                       "bytes on the link); 0: never. Rank 0's value holds for the job",
                       NUM(0, 64 << 20, CLAMP)},
    [PARAM_CUDA_PDL] = {"CUDA_PDL", PARAM_T_INT, "1", "",
                        "1: launch the low-latency allreduce as a programmatic dependent launch "
                        "(the GPU schedules it while the kernel before it is still running); "
                        "0: plain launches",
                        NUM(0, 1, CLAMP)},
    [PARAM_CUDA_COUNTED] = {"CUDA_COUNTED", PARAM_T_SIZE, "1K", "bytes",
                            "a low-latency allreduce of at most this many bytes marks its end by "
                            "a count in device memory (its blocks add 1 after a fence; a call on "
                            "another stream waits on it) instead of an event recorded after it: "
                            "less host time per call, more GPU time (the fence) from a few KiB; "
                            "0: always events",
                            NUM(0, INFINITY, CLAMP)},
    [PARAM_CUDA_SHARE_GPU] = {"CUDA_SHARE_GPU", PARAM_T_INT, "0", "",
                              "testing only: 1 lets ranks of one node share a GPU (their kernels "
                              "take turns, so every exchange waits for a time slice: slow); "
                              "otherwise that is loomInvalidUsage",
                              NUM(0, 1, CLAMP)},
    [PARAM_SHM_READ_STALL_MS] = {"SHM_READ_STALL_MS", PARAM_T_INT, "0", "ms",
                                 "testing only: a shared-memory receive of a large message waits "
                                 "this long between its look at the sender's withdrawal word and "
                                 "its read (what a rank stopped there does)",
                                 NUM(0, 60000, CLAMP)},
    [PARAM_CUDA_CE] = {"CUDA_CE", PARAM_T_SIZE, "512M", "bytes",
                       "same-node allreduce, reduce-scatter, allgather and broadcast of at least "
                       "this many bytes (the larger buffer) move their data on the copy engines "
                       "(cuMemcpyAsync between mapped buffers; the SMs only reduce); 0: never. "
                       "Rank 0's value holds for the job",
                       NUM(0, INFINITY, CLAMP)},
    [PARAM_CUDA_CE_SCRATCH] = {"CUDA_CE_SCRATCH", PARAM_T_SIZE, "64M", "bytes",
                               "device memory the copy-engine path lands the peers' pieces in "
                               "before it reduces them (allocated at its first call)",
                               NUM(1 << 20, INFINITY, CLAMP)},
    [PARAM_CUDA_CE_BLOCKS] = {"CUDA_CE_BLOCKS", PARAM_T_INT, "16", "",
                              "blocks (SMs) of the copy-engine path's reduction kernel",
                              NUM(1, 128, CLAMP)},
    [PARAM_CUDA_CE_STREAMS] = {"CUDA_CE_STREAMS", PARAM_T_INT, "4", "",
                               "streams the copy-engine path spreads its copies over (at least "
                               "the node's ranks - 1), 1-8",
                               NUM(1, 8, CLAMP)},
    [PARAM_FUSION_BUCKET] = {"FUSION_BUCKET", PARAM_T_SIZE, "32M", "bytes",
                             "fusion: a bucket leaves once this full (docs/fusion.md)",
                             NUM(4096, INFINITY, CLAMP)},
    [PARAM_FUSION_FIRST_BUCKET] = {"FUSION_FIRST_BUCKET", PARAM_T_SIZE, "1M", "bytes",
                                   "fusion: the limit of a step's first bucket (the last "
                                   "layers' gradients, ready first)",
                                   NUM(4096, INFINITY, CLAMP)},
    [PARAM_FUSION_SEGMENT] = {"FUSION_SEGMENT", PARAM_T_SIZE, "8M", "bytes",
                              "fusion: tensors larger than this are cut into segments of it "
                              "(at most the bucket size)",
                              NUM(4096, INFINITY, CLAMP)},
    [PARAM_FUSION_CYCLE_US] = {"FUSION_CYCLE_US", PARAM_T_INT, "2000", "us",
                               "fusion: a partial bucket leaves once its oldest tensor waited "
                               "this long (the cut is agreed among the ranks)",
                               NUM(1, 1e9, CLAMP)},
    /* 64K: past it the fold of p inputs on every rank costs more than the steps it saves
     * (perf/RESULTS.md, session 13). */
    [PARAM_SEGMENT] = {"SEGMENT", PARAM_T_SIZE, "64K", "bytes",
                       "largest allreduce that may go through the node's shared segment (every "
                       "rank copies its input in once and folds all of them in rank order; one "
                       "node, host memory); 0: no segment. Rank 0's value holds for the job",
                       NUM(0, 1 << 20, CLAMP)},
    [PARAM_FUSION_WIRE] = {"FUSION_WIRE", PARAM_T_STR, "exact", "",
                           "fusion: how float32 sums travel: exact, bf16 or fp16 (a power-of-two "
                           "scale per 256 values, float32 accumulation)",
                           NAMES("exact|bf16|fp16", DEFAULT)},
    [PARAM_FUSION_WIRE_PIECE] = {"FUSION_WIRE_PIECE", PARAM_T_SIZE, "64K", "values",
                                 "fusion, 16-bit wire: values per shard of a pipeline piece (a "
                                 "bucket travels in pieces, each encoded, sent and decoded while "
                                 "the next is on the wire; rounded to 256)",
                                 NUM(256, 1 << 26, CLAMP)},
    [PARAM_FUSION_GROUP] = {"FUSION_GROUP", PARAM_T_SIZE, "256K", "bytes",
                            "allreduces of at most this size inside loomGroupStart/End (one "
                            "communicator, type and op; host memory, or device memory on one "
                            "stream) are fused into one; 0: never",
                            NUM(0, INFINITY, CLAMP)},
    [PARAM_TUNE_FILE] = {"TUNE_FILE", PARAM_T_STR, "", "",
                         "tuning file written by loom-tune: fusion parameters and the cost "
                         "model's measured constants, read at init (docs/tuning.md)",
                         ANY},
    [PARAM_DETERMINISTIC] = {"DETERMINISTIC", PARAM_T_STR, "0", "",
                             "1: floating-point allreduce, reduce and reduce-scatter results are "
                             "the left fold of the inputs in rank order, bitwise the same for "
                             "any LOOM_ALGO, LOOM_NCHANNELS, slice, fusion bucket and layout "
                             "(src/algo/determ.c; host memory only); 0: the fastest order",
                             NAMES("0|1", READER)},
    [PARAM_SECURE] = {"SECURE", PARAM_T_STR, "0", "",
                      "1: every TCP frame is encrypted and authenticated (AEAD, keys per socket "
                      "and direction from the job secret); all ranks must agree. 0: off. "
                      "Anything else fails init (a job that asked for encryption must not run "
                      "in clear)",
                      NAMES("0|1", READER)},
    [PARAM_SHM_CMA] = {"SHM_CMA", PARAM_T_INT, "1", "",
                       "1: shared memory copies from the peer's buffer by cross-memory attach "
                       "(process_vm_readv) where the peers allow it; 0: through bounce "
                       "segments always (debugging, or where ptrace is restricted)",
                       NUM(0, 1, DEFAULT)},
};

typedef struct {
    const char *text;
    int64_t i;
    uint64_t size;
    double d;
    char canon[256]; /* a string's names in the table's spelling */
} param_slot_t;

/* Two slots: a reload (after param_forget or param_reset_cache) fills the one not in use and then
 * publishes it, so a thread still reading the values it loaded before never sees them rewritten
 * under it. */
typedef struct {
    bool loaded;
    int cur; /* the slot readers use */
    param_slot_t slot[2];
} param_value_t;

static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;
static param_value_t values[PARAM_COUNT];

const param_desc_t *param_desc(param_id_t id)
{
    return &params[id];
}

/* "[min, max]" with the unit, or the names. */
const char *param_range_text(param_id_t id, char *buf, size_t len)
{
    const param_desc_t *d = &params[id];
    if (d->type == PARAM_T_STR) {
        if (d->names == NULL)
            snprintf(buf, len, "any");
        else
            snprintf(buf, len, "%s%s", d->names, d->list ? " (comma-separated, ^ excludes)" : "");
        return buf;
    }
    char hi[32];
    if (isinf(d->max))
        snprintf(hi, sizeof(hi), "%s", d->inf ? "inf" : "no bound");
    else
        snprintf(hi, sizeof(hi), "%.15g", d->max);
    snprintf(buf, len, "[%.15g, %s]%s%s", d->min, hi, d->unit[0] ? " " : "", d->unit);
    return buf;
}

/* The table's spelling of `tok` (n bytes) among d->names, or NULL. */
static const char *param_name_of(const param_desc_t *d, const char *tok, size_t n, char *out,
                                 size_t outlen)
{
    for (const char *p = d->names; *p;) {
        const char *e = strchr(p, '|');
        size_t m = e ? (size_t)(e - p) : strlen(p);
        if (m == n && strncasecmp(p, tok, n) == 0 && m < outlen) {
            memcpy(out, p, m);
            out[m] = '\0';
            return out;
        }
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

/* Checks a string against its names; writes the canonical spelling to canon (false: not one). */
static bool param_check_names(const param_desc_t *d, const char *text, char *canon, size_t len)
{
    if (!d->list) return param_name_of(d, text, strlen(text), canon, len) != NULL;
    size_t o = 0;
    const char *p = text;
    if (*p == '^') {
        if (len < 2) return false;
        canon[o++] = '^';
        p++;
    }
    for (;;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char one[64];
        if (!param_name_of(d, p, n, one, sizeof(one))) return false;
        int w = snprintf(canon + o, len - o, "%s%s", one, e ? "," : "");
        if (w < 0 || (size_t)w >= len - o) return false;
        o += (size_t)w;
        if (!e) return true;
        p = e + 1;
    }
}

/* Parses and checks one value; a bad one becomes the default or the nearest bound and is
 * described in `why` (empty when it was good), which the caller logs once the lock is free
 * (logging reads parameters itself). */
static void param_parse(param_id_t id, param_slot_t *v, bool from_env, char *why, size_t wlen)
{
    const param_desc_t *d = &params[id];
    const char *text = v->text;
    char range[160];
    why[0] = '\0';
    if (d->type == PARAM_T_STR) {
        if (!from_env || d->names == NULL) return;
        if (param_check_names(d, text, v->canon, sizeof(v->canon))) {
            v->text = v->canon;
            return;
        }
        if (d->bad == PARAM_BAD_READER) return;
        snprintf(why, wlen, "LOOM_%s='%s' is not one of %s; using the default %s", d->name, text,
                 param_range_text(id, range, sizeof(range)), d->def);
        v->text = d->def;
        return;
    }
    double x = 0;
    bool parsed = false;
    if (d->type == PARAM_T_SIZE) {
        uint64_t u = 0;
        parsed = base_parse_size(text, &u);
        x = (double)u;
    } else {
        char *end = NULL;
        x = d->type == PARAM_T_INT ? (double)strtoll(text, &end, 0) : strtod(text, &end);
        parsed = end != text && *end == '\0' && !isnan(x);
    }
    const char *kind = d->type == PARAM_T_INT    ? "an integer"
                       : d->type == PARAM_T_SIZE ? "a size (e.g. 64K, 1M)"
                                                 : "a number";
    bool no_limit = parsed && d->inf && isinf(x) && x > 0;
    if (parsed && !no_limit && (x < d->min || x > d->max)) {
        if (d->bad == PARAM_BAD_CLAMP) {
            x = x < d->min ? d->min : d->max;
            snprintf(why, wlen, "LOOM_%s='%s' is outside %s; using %.15g", d->name, text,
                     param_range_text(id, range, sizeof(range)), x);
        } else {
            parsed = false;
            snprintf(why, wlen, "LOOM_%s='%s' is outside %s; using the default %s", d->name, text,
                     param_range_text(id, range, sizeof(range)), d->def);
        }
    } else if (!parsed && from_env) {
        snprintf(why, wlen, "LOOM_%s='%s' is not %s in %s; using the default %s", d->name, text,
                 kind, param_range_text(id, range, sizeof(range)), d->def);
    }
    if (!parsed) {
        v->text = d->def;
        if (d->type == PARAM_T_SIZE) {
            uint64_t u = 0;
            base_parse_size(d->def, &u);
            x = (double)u;
        } else {
            x = strtod(d->def, NULL);
        }
    }
    if (d->inf && x > PARAM_NO_LIMIT_S) x = PARAM_NO_LIMIT_S;
    v->d = x;
    /* x is a bound or the default unless the text itself was good: only then can it exceed
     * what the integer types hold, and sizes are read again exactly. */
    if (d->type == PARAM_T_SIZE) {
        if (parsed && why[0] == '\0')
            base_parse_size(text, &v->size);
        else
            v->size = (uint64_t)x;
    } else if (d->type == PARAM_T_INT) {
        v->i = (int64_t)x;
    }
}

extern char **environ;

/* LOOM_<name>'s value, NULL when unset: the exact name, else a variable whose name differs from
 * it only in case (`loom_timeout`), which `note` (may be NULL) then says, for a WARN: the
 * documented form is upper case, and a job must not lose a setting to its spelling. */
static const char *param_env(const char *name, char *note, size_t len)
{
    char env[64];
    snprintf(env, sizeof(env), "LOOM_%s", name);
    const char *text = getenv(env);
    if (text) return text;
    size_t n = strlen(env);
    for (char **e = environ; e && *e; e++)
        if (strncasecmp(*e, env, n) == 0 && (*e)[n] == '=') {
            if (note)
                snprintf(note, len,
                         "%.*s read as %s (loom's variable names are case-insensitive; the "
                         "documented form is upper case)",
                         (int)n, *e, env);
            return *e + n + 1;
        }
    return NULL;
}

static const param_slot_t *param_load(param_id_t id)
{
    param_value_t *v = &values[id];
    if (__atomic_load_n(&v->loaded, __ATOMIC_ACQUIRE))
        return &v->slot[__atomic_load_n(&v->cur, __ATOMIC_ACQUIRE)];
    char why[512] = "", note[192] = "";
    pthread_mutex_lock(&param_lock);
    if (!v->loaded) {
        const char *text = param_env(params[id].name, note, sizeof(note));
        bool from_env = text != NULL && text[0] != '\0';
        int next = 1 - __atomic_load_n(&v->cur, __ATOMIC_ACQUIRE);
        param_slot_t *sl = &v->slot[next];
        sl->text = from_env ? text : params[id].def;
        sl->i = 0;
        sl->size = 0;
        sl->d = 0;
        param_parse(id, sl, from_env, why, sizeof(why));
        __atomic_store_n(&v->cur, next, __ATOMIC_RELEASE);
        __atomic_store_n(&v->loaded, true, __ATOMIC_RELEASE);
    }
    const param_slot_t *out = &v->slot[__atomic_load_n(&v->cur, __ATOMIC_ACQUIRE)];
    pthread_mutex_unlock(&param_lock);
    if (note[0]) WARN(LOG_ENV, "%s", note);
    if (why[0]) WARN(LOG_ENV, "%s", why);
    return out;
}

const char *param_text(param_id_t id)
{
    return param_load(id)->text;
}

bool param_is_set(param_id_t id)
{
    const char *text = param_env(params[id].name, NULL, 0);
    return text != NULL && text[0] != '\0';
}

int64_t param_int(param_id_t id)
{
    return param_load(id)->i;
}
uint64_t param_size(param_id_t id)
{
    return param_load(id)->size;
}
double param_double(param_id_t id)
{
    return param_load(id)->d;
}
const char *param_str(param_id_t id)
{
    return param_load(id)->text;
}

void param_forget(param_id_t id)
{
    pthread_mutex_lock(&param_lock);
    __atomic_store_n(&values[id].loaded, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&param_lock);
}

void param_reset_cache(void)
{
    pthread_mutex_lock(&param_lock);
    for (int i = 0; i < PARAM_COUNT; i++)
        __atomic_store_n(&values[i].loaded, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&param_lock);
    __atomic_store_n(&log_level_cached, -1, __ATOMIC_RELEASE);
}

void param_atfork(base_fork_phase_t phase)
{
    if (phase == BASE_FORK_PREPARE)
        pthread_mutex_lock(&param_lock);
    else if (phase == BASE_FORK_PARENT)
        pthread_mutex_unlock(&param_lock);
    else
        pthread_mutex_unlock(&param_lock);
}
