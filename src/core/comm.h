/* The communicator and the pieces of core that share it. */
#ifndef LOOM_CORE_COMM_H
#define LOOM_CORE_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base.h"
#include "dev.h"
#include "reduce.h"
#include "registry.h"
#include "schedule.h"
#include "sock.h"
#include "transport.h"

#define COMM_MAGIC 0x6c6f6f6d636f6d6dull /* "loomcomm" */
#define COMM_DEAD_MAGIC 0xdeadc0de0000dead
#define ERR_TEXT_MAX 1024
#define HOST_NAME_LEN 64

/* Transports a communicator may use, by index. */
enum { TP_TCP = 0, TP_SHM = 1, TP_MAX = 2 };

typedef struct {
    const transport_ops_t *ops;
    transport_ctx_t *ctx;
} comm_tp_t;

/* A peer's connection and the transport that carries it. */
typedef struct {
    const transport_ops_t *ops;
    transport_conn_t *conn;
} comm_link_t;

/* What every rank tells the others at bootstrap. */
typedef struct {
    int32_t rank;
    int32_t cores;      /* online cores of its machine: job-wide tuning needs everyone's */
    uint64_t node_hash; /* node identity (host + boot id + netns, or LOOM_NODE_ID) */
    uint8_t handle[TP_MAX][TRANSPORT_HANDLE_BYTES]; /* per transport; empty: not offered */
    char host[HOST_NAME_LEN];
    uint8_t gpu_uuid[16]; /* the GPU named at init (config), all zero: none yet */
    int32_t gpu_dev;      /* its ordinal on that rank, -1: none */
    int32_t pad;
} peer_info_t;

/* The unique id's layout inside its 128 bytes. */
typedef struct {
    uint32_t magic;
    uint32_t version;
    uint8_t root_addr[32];
    uint8_t secret[16];
    uint64_t job_id;
    uint8_t reserved[64];
} uid_layout_t;
_Static_assert(sizeof(uid_layout_t) == LOOM_UNIQUE_ID_BYTES, "unique id layout");

/* A pre-multiplied sum created by loomRedOpCreatePreMulSum. */
typedef struct {
    bool used;
    loomDataType_t type;
    uint8_t scalar[8];
    const void *dev_ptr; /* loomScalarDevice in GPU memory: read when the collective runs */
} premul_t;

#define COMM_MAX_PREMUL 64

struct loomComm {
    uint64_t magic;
    int rank, nranks;
    uint64_t comm_id;
    uint8_t secret[16];
    char name[64];
    peer_info_t *peers;
    int node, nnodes, local_rank, local_size;
    int *node_of, *node_start, *node_ranks; /* the layout, for sched_topo_t */
    int algo;                               /* LOOM_ALGO, or ALGO_AUTO */
    int last_pick;                          /* the model's previous choice (for the log) */

    comm_tp_t tp[TP_MAX]; /* started transports (ops NULL: not started) */
    int forced_tp;        /* LOOM_TRANSPORT, or -1 */
    comm_link_t *links;   /* by peer; conn NULL until a schedule needs it */

    uint64_t coll_seq; /* collectives issued so far */
    uint64_t *p2p_send_seq, *p2p_recv_seq;
    int split_count;

    int nchannels;
    uint64_t slice_bytes;
    int slices_in_flight;
    uint64_t spin_ns;
    double timeout_s;

    premul_t premul[COMM_MAX_PREMUL];

    /* State shared with other threads: abort and the asynchronous error. */
    atomic_int aborting;
    atomic_int active_calls; /* API calls inside this communicator now */
    int wake_fd;             /* eventfd: written by abort to wake a blocked poll */
    pthread_mutex_t lock;
    atomic_int async_error; /* loomResult_t */
    char async_text[ERR_TEXT_MAX];
    bool finalized;
    int cuda_dev;                    /* bound GPU, -1 none */
    dev_host_t devh;                 /* this communicator as the device executor (src/cuda) sees it;
                                        devh.state is NULL until device memory is used */
    loomComm_t dev_stage, dev_cross; /* the host side of device work crossing nodes */

    /* Non-blocking init. */
    pthread_t init_thread;
    bool init_thread_live;

    loomStats_t stats;
    /* Staging for receive-and-reduce, kept between calls (one schedule runs at a time per
     * communicator) so that big calls do not map and fault fresh pages each time. */
    uint8_t *staging;
    size_t staging_bytes;
    uint8_t *tmp_buf; /* schedules' scratch (SCHED_BUF_TMP), kept likewise */
    size_t tmp_bytes;
    sched_t sched; /* point-to-point schedules, rebuilt each time */
    /* Collective schedules by shape: a training loop repeats the same few calls, and building
     * a schedule (with its dependencies) costs more than small calls themselves. */
    struct comm_sched_cache {
        bool used;
        uint64_t key[6];
        uint64_t last_use;
        sched_t s;
    } cache[8];
    uint64_t cache_clock;
};

/* The allreduce algorithm (registry.h's ALGO_*) for `bytes` on this communicator: LOOM_ALGO, or
 * the registry's choice under this communicator's transports, logged as TUNING. */
int comm_pick_allreduce(loomComm_t comm, uint64_t bytes);
sched_topo_t comm_topo(loomComm_t comm);

/* Valid, usable communicator? Sets the error text otherwise. */
loomResult_t comm_check(loomComm_t comm, const char *fn);
/* Marks the communicator broken with res/text (first error wins) and tells peers. */
void comm_set_error(loomComm_t comm, loomResult_t res, const char *text);
/* The connection to a peer, created on first use over the transport chosen for the pair. */
loomResult_t comm_conn(loomComm_t comm, int peer, comm_link_t **link);
/* Stops the communicator without freeing it: later calls fail, blocked calls and kernels in
 * flight leave, peers learn `reason`. False if a call was still inside after 10 s. */
bool comm_stop(loomComm_t comm, const char *reason);
/* Fills in comm->devh (src/core/devhost.c) before the device executor first sees it. */
void comm_devhost_fill(loomComm_t comm);
/* Tells every started transport to abort (peers learn `reason`). */
void comm_abort_transports(loomComm_t comm, const char *reason);

/* Bootstrap (bootstrap.c). */
loomResult_t boot_uid_create(loomUniqueId *id);
loomResult_t boot_uid_parse(const loomUniqueId *id, uid_layout_t *out);
/* The id of a job launched torchrun's way (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); rank 0
 * starts the rendezvous at MASTER_ADDR:MASTER_PORT. */
loomResult_t boot_uid_from_env(loomUniqueId *id, int *rank, int *nranks);
/* Meets the other ranks through the root and fills comm->peers. */
loomResult_t boot_rendezvous(loomComm_t comm, const uid_layout_t *uid, const peer_info_t *mine);
uint64_t boot_node_hash(char *host, size_t hostlen);

/* Executor (exec.c). */
typedef struct exec exec_t;
typedef struct {
    void **bufs; /* pointer per schedule buffer id */
    uint32_t nbufs;
} exec_bufs_t;
loomResult_t exec_create(loomComm_t comm, const sched_t *sched, void *const *bufs,
                         loomDataType_t type, red_op_t op, exec_t **out);
/* Advances; *done when the schedule finished. */
loomResult_t exec_progress(exec_t *e, bool *done, bool *progressed);
int exec_pollfds(exec_t *e, struct pollfd *fds, int max);
/* Gives up when no peer made progress for LOOM_TIMEOUT: the error names the peers waited for. */
loomResult_t exec_check_timeout(exec_t *e);
void exec_free(exec_t *e);
/* Runs a schedule to completion on the calling thread. */
loomResult_t exec_run(loomComm_t comm, const sched_t *sched, void *const *bufs, loomDataType_t type,
                      red_op_t op);

#endif
