#include "param.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

static const param_desc_t params[PARAM_COUNT] = {
    [PARAM_DEBUG] = {"DEBUG", PARAM_T_STR, "", "",
                     "log level: NONE, WARN (the default), INFO or TRACE"},
    [PARAM_DEBUG_SUBSYS] = {"DEBUG_SUBSYS", PARAM_T_STR, "ALL", "",
                            "subsystems to log: INIT,BOOT,NET,COLL,P2P,ENV,TUNING,SHM,CUDA,SHIM "
                            "or ALL; a leading ^ excludes the listed ones"},
    [PARAM_DEBUG_FILE] = {"DEBUG_FILE", PARAM_T_STR, "", "",
                          "write the log to this file instead of stderr (%h: host, %p: pid)"},
    [PARAM_TIMEOUT] = {"TIMEOUT", PARAM_T_DOUBLE, "30", "s",
                       "seconds without progress from a peer after which a wait fails naming it"},
    [PARAM_HANDSHAKE_TIMEOUT] = {"HANDSHAKE_TIMEOUT", PARAM_T_DOUBLE, "5", "s",
                                 "seconds an incoming connection may take to authenticate"},
    [PARAM_SOCKET_IFNAME] = {"SOCKET_IFNAME", PARAM_T_STR, "", "",
                             "interfaces to use: prefixes, '^' to exclude, '=' for exact names, "
                             "comma-separated (default: first non-loopback interface, else lo)"},
    [PARAM_SOCKET_FAMILY] = {"SOCKET_FAMILY", PARAM_T_STR, "", "",
                             "address family: 4 or 6 (default: the first address found)"},
    [PARAM_NSOCKS_PERPEER] = {"NSOCKS_PERPEER", PARAM_T_INT, "2", "",
                              "TCP sockets per peer connection (1-16)"},
    [PARAM_NCHANNELS] = {"NCHANNELS", PARAM_T_INT, "2", "", "parallel rings per collective (1-16)"},
    [PARAM_SLICE_SIZE] = {"SLICE_SIZE", PARAM_T_SIZE, "256K", "bytes",
                          "pipeline slice: the unit sent, received and reduced at once"},
    [PARAM_SLICES_IN_FLIGHT] = {"SLICES_IN_FLIGHT", PARAM_T_INT, "8", "",
                                "receive slices posted ahead per channel (staging buffers)"},
    [PARAM_MAX_MESSAGE] = {"MAX_MESSAGE", PARAM_T_SIZE, "64M", "bytes",
                           "largest frame accepted from a peer; longer headers are refused"},
    [PARAM_ALGO] =
        {"ALGO", PARAM_T_STR, "", "",
         "force the allreduce algorithm: ring, rd, hier, hier_leader, ps (default: a cost model)"},
    [PARAM_TRANSPORT] = {"TRANSPORT", PARAM_T_STR, "", "",
                         "force one transport for every peer: tcp or shm (mpi, ucx, ibv later)"},
    [PARAM_SOCKET_BUFFER] = {"SOCKET_BUFFER", PARAM_T_SIZE, "4M", "bytes",
                             "SO_SNDBUF/SO_RCVBUF asked for each data socket (0: system default)"},
    [PARAM_SPIN_US] = {"SPIN_US", PARAM_T_INT, "50", "us",
                       "how long a waiting call polls without sleeping before it blocks"},
    [PARAM_NODE_ID] =
        {"NODE_ID", PARAM_T_STR, "", "",
         "override this rank's node identity (default host name + boot id + netns); a "
         "comma-separated list gives rank r the r-th name"},
    [PARAM_JOB_SECRET] = {"JOB_SECRET", PARAM_T_STR, "", "",
                          "job secret for launches without a unique id (any text)"},
    [PARAM_CUDA_BLOCKS] = {"CUDA_BLOCKS", PARAM_T_INT, "128", "",
                           "thread blocks (lanes per peer) of the device kernels, 1-128; rank 0's "
                           "value holds for the job"},
    [PARAM_CUDA_SLOT] = {"CUDA_SLOT", PARAM_T_SIZE, "64K", "bytes",
                         "largest piece one block moves per step through a peer's GPU memory"},
    [PARAM_CUDA_NSLOT] = {"CUDA_NSLOT", PARAM_T_INT, "4", "",
                          "slots per block and peer (pieces in flight per lane), 2-16"},
    [PARAM_CUDA_THREADS] = {"CUDA_THREADS", PARAM_T_INT, "512", "",
                            "threads per block of the device kernels (half send, half receive)"},
    [PARAM_CUDA_PUSH_THREADS] = {"CUDA_PUSH_THREADS", PARAM_T_INT, "128", "",
                                 "threads of each block that send; the others receive"},
    [PARAM_CUDA_COUPLE] = {"CUDA_COUPLE", PARAM_T_INT, "0", "",
                           "1: a block receives round k only after it pushed round k (as in "
                           "place), so its own input is still in L2 when it reduces"},
    [PARAM_CUDA_DIRECT] = {"CUDA_DIRECT", PARAM_T_SIZE, "4M", "bytes",
                           "allreduce from this size reads the peers' buffers where they are "
                           "(CUDA IPC, mapped once per allocation) instead of through loom's "
                           "slots; 0: never"},
    [PARAM_CUDA_EMPTY] = {"CUDA_EMPTY", PARAM_T_INT, "0", "",
                          "debugging: launch kernels that return at once, to time the host "
                          "path alone (results are wrong)"},
    [PARAM_CUDA_ONESHOT] = {"CUDA_ONESHOT", PARAM_T_SIZE, "256K", "bytes",
                            "device allreduce up to this size reduces in one shot (every rank "
                            "reads all inputs); larger ones reduce-scatter then allgather. Two "
                            "ranks always use one shot (the same bytes on the link)"},
    [PARAM_CUDA_STAGE_CHUNK] = {"CUDA_STAGE_CHUNK", PARAM_T_SIZE, "4M", "bytes",
                                "piece size when device data crosses nodes through pinned host "
                                "memory (copies overlap the network piece by piece)"},
    [PARAM_CUDA_LL] = {"CUDA_LL", PARAM_T_SIZE, "2M", "bytes",
                       "device allreduce of at most this many bytes times (ranks on the node - 1) "
                       "goes in low-latency words (one shot, no flags or fences; twice the "
                       "bytes on the link); 0: never. Rank 0's value holds for the job"},
    [PARAM_CUDA_PDL] = {"CUDA_PDL", PARAM_T_INT, "1", "",
                        "1: launch the low-latency allreduce as a programmatic dependent launch "
                        "(the GPU schedules it while the kernel before it is still running); "
                        "0: plain launches"},
    [PARAM_CUDA_COUNTED] = {"CUDA_COUNTED", PARAM_T_SIZE, "1K", "bytes",
                            "a low-latency allreduce of at most this many bytes marks its end by "
                            "a count in device memory (its blocks add 1 after a fence; a call on "
                            "another stream waits on it) instead of an event recorded after it: "
                            "less host time per call, more GPU time (the fence) from a few KiB; "
                            "0: always events"},
    [PARAM_CUDA_SHARE_GPU] = {"CUDA_SHARE_GPU", PARAM_T_INT, "0", "",
                              "testing only: 1 lets ranks of one node share a GPU (their kernels "
                              "take turns, so every exchange waits for a time slice: slow); "
                              "otherwise that is loomInvalidUsage"},
};

typedef struct {
    bool loaded;
    const char *text;
    int64_t i;
    uint64_t size;
    double d;
} param_value_t;

static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;
static param_value_t values[PARAM_COUNT];

const param_desc_t *param_desc(param_id_t id)
{
    return &params[id];
}

static const param_value_t *param_load(param_id_t id)
{
    param_value_t *v = &values[id];
    if (__atomic_load_n(&v->loaded, __ATOMIC_ACQUIRE)) return v;
    pthread_mutex_lock(&param_lock);
    if (!v->loaded) {
        char env[64];
        snprintf(env, sizeof(env), "LOOM_%s", params[id].name);
        const char *text = getenv(env);
        bool from_env = text != NULL && text[0] != '\0';
        if (!from_env) text = params[id].def;
        v->text = text;
        v->i = 0;
        v->size = 0;
        v->d = 0;
        switch (params[id].type) {
        case PARAM_T_INT: {
            char *end = NULL;
            long long x = strtoll(text, &end, 0);
            if (from_env && (end == text || *end != '\0')) {
                WARN(LOG_ENV, "%s='%s' is not an integer; using the default %s", env, text,
                     params[id].def);
                x = strtoll(params[id].def, NULL, 0);
            }
            v->i = x;
            break;
        }
        case PARAM_T_SIZE:
            if (!base_parse_size(text, &v->size)) {
                WARN(LOG_ENV, "%s='%s' is not a size (e.g. 64K, 1M); using the default %s", env,
                     text, params[id].def);
                base_parse_size(params[id].def, &v->size);
            }
            break;
        case PARAM_T_DOUBLE: {
            char *end = NULL;
            double x = strtod(text, &end);
            if (from_env && (end == text || *end != '\0')) {
                WARN(LOG_ENV, "%s='%s' is not a number; using the default %s", env, text,
                     params[id].def);
                x = strtod(params[id].def, NULL);
            }
            v->d = x;
            break;
        }
        case PARAM_T_STR: break;
        }
        __atomic_store_n(&v->loaded, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&param_lock);
    return v;
}

const char *param_text(param_id_t id)
{
    return param_load(id)->text;
}

bool param_is_set(param_id_t id)
{
    char env[64];
    snprintf(env, sizeof(env), "LOOM_%s", params[id].name);
    const char *text = getenv(env);
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

void param_reset_cache(void)
{
    pthread_mutex_lock(&param_lock);
    for (int i = 0; i < PARAM_COUNT; i++)
        __atomic_store_n(&values[i].loaded, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&param_lock);
    log_level_cached = -1;
}
