/* The communicator and the pieces of core that share it. */
#ifndef LOOM_CORE_COMM_H
#define LOOM_CORE_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base.h"
#include "dev.h"
#include "exec.h"
#include "jobstate.h"
#include "lru.h"
#include "nodeseg.h"
#include "reduce.h"
#include "registry.h"
#include "schedule.h"
#include "sock.h"
#include "transport.h"
#include "tunefile.h"

#define COMM_MAGIC 0x6c6f6f6d636f6d6dull /* "loomcomm" */
#define COMM_DEAD_MAGIC 0xdeadc0de0000dead
#define ERR_TEXT_MAX 1024
#define HOST_NAME_LEN 64

/* Transports a communicator may use, by index. */
enum { TP_TCP = 0, TP_SHM = 1, TP_MPI = 2, TP_UCX = 3, TP_MAX = 4 };

/* What every rank tells the others at bootstrap. */
typedef struct {
    int32_t rank;
    int32_t cores;      /* online cores of its machine: job-wide tuning needs everyone's */
    uint64_t node_hash; /* node identity (host + boot id + netns, or LOOM_NODE_ID) */
    uint8_t handle[TP_MAX][TRANSPORT_HANDLE_BYTES]; /* per transport; empty: not offered */
    char host[HOST_NAME_LEN];
    uint8_t gpu_uuid[16]; /* the GPU named at init (config), all zero: none yet */
    int32_t gpu_dev;      /* its ordinal on that rank, -1: none */
    /* Bytes of transport addresses too large for a handle (UCX's worker address) that follow
     * this record in the bootstrap and in split: see comm_peer_addr. */
    uint32_t addr_bytes;
    uint32_t tune_hash;      /* LOOM_TUNE_FILE's contents hashed (0: unset): ranks that read
                                different files would choose different algorithms */
    uint8_t shrink_addr[32]; /* its shrink listener (shrink.c), packed; all zero: none */
    int32_t pid;
    uint32_t machine;    /* host + boot id hashed: the kernel whose cores it shares, whatever its
                            node (network namespaces of one host are nodes that share cores) */
    nodeseg_offer_t seg; /* rank 0's node segment (nodeseg.h); zero elsewhere or none */
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

/* Identity and layout (comm.c, bootstrap.c, split.c; read by the planner). */
typedef struct {
    uint64_t comm_id;
    uint8_t secret[16];
    char name[64];
    peer_info_t *peers;
    int node, nnodes, local_rank, local_size;
    int *node_of, *node_start, *node_ranks; /* the layout, for sched_topo_t */
    uint8_t *addrs;   /* the peers' large addresses, in rank order (peers[q].addr_bytes each) */
    size_t *addr_off; /* where peer q's start in addrs */
} comm_layout_t;

/* Transports and links (comm.c). */
typedef struct {
    exec_tp_t tp[TP_MAX]; /* started transports (ops NULL: not started) */
    int forced_tp;        /* LOOM_TRANSPORT, or -1 */
    exec_link_t *links;   /* by peer; conn NULL until a schedule needs it */
    uint8_t *my_addr;     /* this rank's large addresses (comm_peer_addr's layout) */
    uint32_t my_addr_len;
    int shrink_fd; /* the shrink listener (shrink.c), -1: none */
    /* The node segment (nodeseg.h): NULL unless every rank of a one-node communicator made by
     * init mapped it. */
    nodeseg_t *seg;
} comm_net_t;

/* Tuning: fixed at init from the parameters, the config and the job's layout (comm.c); read
 * by the planner, the registry's selection and the executor. */
typedef struct {
    int algo;                /* LOOM_ALGO, or ALGO_AUTO */
    int last_pick;           /* the model's previous choice (for the log) */
    int last_pick_rooted[2]; /* the same for reduce and broadcast (ROOTED_*) */
    /* The model's allreduce choices by size (the model is fixed for the communicator's life,
     * and a training step asks for the same few sizes again and again: evaluating every row
     * was a tenth of an 8-byte call). algo1: the row + 1, 0 for an empty entry. */
    struct {
        uint64_t bytes;
        int algo1;
    } picks[16];
    /* LOOM_DETERMINISTIC=1: every reducing collective runs src/algo/determ.c (comm.c's
     * comm_pick_allreduce, coll.c), and device memory reductions are refused (enqueue.c) */
    bool deterministic;
    int nchannels;
    uint64_t slice_bytes;
    int slices_in_flight;
    uint64_t spin_ns;
    uint64_t hot_ns; /* the part of spin_ns without yielding the core (progress.h) */
    double timeout_s;
    bool oversubscribed; /* some machine of the job has more ranks than cores */
    /* LOOM_TUNE_FILE's sections that fit this communicator, per memory type (tunefile.h);
     * sections == 0: none (no file, or nothing in it for this key). */
    tune_entry_t file[TUNE_NMEM];
} comm_tune_t;

/* The spin of a waiter on a node with more ranks than cores, where each pass yields the core
 * (comm_tune_for_cores): a peer that has the core sees its message taken at once, and the
 * waiter's pass costs the others a few system calls, not a timeslice. */
#define COMM_SPIN_SHARED_NS 100000ull

/* Operation order: every rank numbers its operations alike (coll.c, split.c). */
typedef struct {
    uint64_t coll;                 /* collectives issued so far */
    uint64_t *p2p_send, *p2p_recv; /* point-to-point messages, by peer */
    int split;                     /* splits so far */
    int shrink;                    /* shrinks so far (shrink.c) */
} comm_seq_t;

/* Error and abort state, shared with other threads (comm.c). */
typedef struct {
    atomic_int aborting;
    atomic_int active_calls; /* API calls inside this communicator now */
    /* The thread whose call (or open group) uses the communicator now, 0 when none: one thread
     * at a time, NCCL's rule. Its call's name and thread id are for the other thread's error. */
    atomic_uintptr_t owner;
    _Atomic(const char *) owner_call;
    atomic_int owner_tid;
    int wake_fd; /* eventfd: written by abort to wake a blocked poll */
    pthread_mutex_t lock;
    atomic_int async_error; /* loomResult_t */
    char async_text[ERR_TEXT_MAX];
    bool finalized;
    pthread_t init_thread; /* non-blocking init */
    bool init_thread_live;
    /* The application's handle plus one per operation queued in some thread's open group: the
     * memory outlives loomCommDestroy until the last queued operation has left its queue. */
    atomic_int refs;
    atomic_int destroyed; /* loomCommDestroy or loomCommAbort ran: queued operations drop */
} comm_state_t;

/* Device buffers (enqueue.c, devhost.c). */
typedef struct {
    int cuda_dev;            /* bound GPU, -1 none */
    dev_host_t host;         /* this communicator as the device executor (src/cuda) sees it;
                                host.state is NULL until device memory is used */
    loomComm_t stage, cross; /* the host side of device work crossing nodes */
} comm_dev_t;

/* What coll.c keeps between calls. */
typedef struct {
    /* Schedules' scratch (SCHED_BUF_TMP), kept between calls (one schedule runs at a time per
     * communicator) so that big calls do not map and fault fresh pages each time. */
    uint8_t *tmp_buf;
    size_t tmp_bytes;
    sched_t p2p; /* point-to-point schedules, rebuilt each time */
    /* Collective schedules by shape: a training loop repeats the same few calls, and building
     * a schedule (with its dependencies) costs more than small calls themselves. */
    struct comm_sched_cache {
        uint64_t key[6];
        uint64_t last_use; /* lru.h's stamp; 0: empty */
        sched_t s;
    } slot[8];
    lru_clock_t clock;
} comm_cache_t;

struct loomComm {
    uint64_t magic;
    int rank, nranks;
    comm_layout_t lay;
    comm_net_t net;
    comm_tune_t tune;
    comm_seq_t seq;
    comm_state_t st;
    comm_dev_t dev;
    premul_t premul[COMM_MAX_PREMUL]; /* loomRedOpCreatePreMulSum's operators (comm.c) */
    loomStats_t stats;
    exec_host_t exech; /* this communicator as the host executor sees it (comm_exec_fill) */
    comm_cache_t cache;
    /* Its connection to the job-state service (jobstate.h; bootstrap.c starts it, comm_free
     * stops it); NULL for communicators made by split or without a service. */
    js_client_t *js;
};

/* The allreduce algorithm (registry.h's ALGO_*) for `bytes` on this communicator: LOOM_ALGO, or
 * the registry's choice under this communicator's transports, logged as TUNING. */
int comm_pick_allreduce(loomComm_t comm, uint64_t bytes);
/* Why automatic selection cannot give this communicator's allreduce of `bytes` to registry row
 * algo (NULL: it can; loom-tune --algos measures those that can). */
const char *comm_algo_unfit(loomComm_t comm, int algo, uint64_t bytes);
/* The same for a reduce or broadcast (op: ROOTED_*) of `bytes` to or from root: LOOM_ALGO's row
 * when it has that form, else the model's choice among the rows that do, said in the TUNING
 * log like the allreduce's. */
int comm_pick_rooted(loomComm_t comm, int op, uint64_t bytes, int root);

/* The fusion bucket and segment sizes for a context's fields left 0, for memory type mem
 * (TUNE_MEM_*): LOOM_FUSION_BUCKET / LOOM_FUSION_SEGMENT when set, else the tuning file's
 * fusion_threshold / fusion_segment for this communicator, else the parameters' defaults. */
void comm_fusion_sizes(loomComm_t comm, int mem, uint64_t *bucket, uint64_t *segment);
sched_topo_t comm_topo(loomComm_t comm);

/* Valid, usable communicator? Sets the error text otherwise. */
loomResult_t comm_check(loomComm_t comm, const char *fn);
/* Whether comm is in the process's set of live communicators; never reads *comm, so a
 * destroyed (freed, perhaps reused) handle is refused safely. */
bool comm_live(loomComm_t comm);
/* A queued operation's hold on comm (enqueue.c); the last comm_unref of a destroyed
 * communicator frees it. */
void comm_ref(loomComm_t comm);
void comm_unref(loomComm_t comm);
/* One thread per communicator (enqueue.c): a lifecycle call (destroy, split, finalize, shrink,
 * windows) claims comm for its duration like a collective does, so that a call on another thread
 * is loomInvalidUsage naming both calls. *held says whether this thread already held it (a call
 * inside its own open group); pass it back to comm_leave. wait_ms: how long another thread's
 * claim may take to go (after comm_stop), 0 for none. loomCommAbort never claims: it is the call
 * meant to run while another thread is stuck inside the communicator. */
loomResult_t comm_enter(loomComm_t comm, const char *fn, int wait_ms, bool *held);
void comm_leave(loomComm_t comm, bool held);
/* Marks the communicator broken with res/text (first error wins) and tells peers. */
void comm_set_error(loomComm_t comm, loomResult_t res, const char *text);
/* The piece size of point-to-point messages to or from a peer: the slice, or more where the
 * pair's transport asks for larger ones (transport_ops_t's p2p_piece). */
size_t comm_p2p_piece(loomComm_t comm, int peer);
/* The connection to a peer, created on first use over the transport chosen for the pair. */
loomResult_t comm_conn(loomComm_t comm, int peer, exec_link_t **link);
/* Stops the communicator without freeing it: later calls fail, blocked calls and kernels in
 * flight leave, peers learn `reason`. False if a call was still inside after 10 s. */
bool comm_stop(loomComm_t comm, const char *reason);
/* Pieces of the lifecycle shared by init (comm.c) and split (split.c). comm_alloc applies the
 * parameters and the config (no communication yet); comm_start_transport starts the transports
 * and writes this rank's handles; comm_layout derives the node layout from the peers' node
 * identities; comm_free frees everything (the communicator is gone after it). */
loomResult_t comm_alloc(int nranks, int rank, const loomConfig_t *cfg, loomComm_t *out);
loomResult_t comm_start_transport(loomComm_t comm, uint8_t handles[TP_MAX][TRANSPORT_HANDLE_BYTES]);
loomResult_t comm_layout(loomComm_t comm);
void comm_free(loomComm_t comm);
/* Reads the fields of a caller's config that its size covers (older headers have fewer). */
loomResult_t comm_config_read(const loomConfig_t *in, loomConfig_t *out);
/* The child of `comm` for `color` (LOOM_SPLIT_NOCOLOR: none, *newcomm NULL), ranked by key;
 * collective over comm, arguments already checked (split.c). */
loomResult_t comm_split(loomComm_t comm, int color, int key, const loomConfig_t *cfg,
                        loomComm_t *newcomm);
/* loomCommShrink (shrink.c). comm_shrink_listen opens this rank's shrink listener for comm and
 * writes its packed address (every communicator has one from its creation, published in
 * peer_info_t.shrink_addr); comm_shrink builds the child of the ranks not in exclude (checked:
 * in range, no duplicates, not this rank), collective over those survivors only. */
loomResult_t comm_shrink_listen(loomComm_t comm, uint8_t addr[32]);
loomResult_t comm_shrink(loomComm_t comm, const int *exclude, int nexclude, const loomConfig_t *cfg,
                         loomComm_t *newcomm);
/* The node segment of a communicator whose ranks share one node (init, split, shrink): each maps
 * the one its rank 0 offered (lay.peers[0].seg; fd: rank 0's descriptor, -1 elsewhere, closed
 * here), and one allgather over comm says whether all did, or none uses it. Collective. */
loomResult_t comm_seg_setup(loomComm_t comm, int fd);
/* Fills in comm->exech (at allocation: what it points to lives as long as the communicator). */
void comm_exec_fill(loomComm_t comm);
/* Fills in comm->devh (src/core/devhost.c) before the device executor first sees it. */
void comm_devhost_fill(loomComm_t comm);
/* With CUDA (devhost.c): comm_dev_op makes the device executor's operation of a queued call o
 * of comm (its fields, and the pre-multiplied sum's scalar); comm_dev_run hands m of them to
 * comm's executor at once and counts them as m calls of comm. */
struct coll_op_s;
void comm_dev_op(loomComm_t comm, const struct coll_op_s *o, dev_op_t *d);
loomResult_t comm_dev_run(loomComm_t comm, const dev_op_t *d, int m);
/* Large transport addresses. A transport whose address does not fit a handle publishes it
 * through ops->address; comm_start_transport packs every such address of this rank into
 * net.my_addr (for each transport in TP_* order: a 32-bit length, then the bytes), which the
 * bootstrap (or split's allgather) carries after the rank's peer_info_t. comm_set_peer_addrs
 * takes the peers' blobs concatenated in rank order (buf is kept, freed with the communicator)
 * and comm_peer_addr finds one transport's address of one peer (NULL, *len 0: none). */
loomResult_t comm_set_peer_addrs(loomComm_t comm, uint8_t *buf, size_t len);
const uint8_t *comm_peer_addr(loomComm_t comm, int peer, int tp, size_t *len);
/* Tells every started transport to abort (peers learn `reason`). */
void comm_abort_transports(loomComm_t comm, const char *reason);

/* Bootstrap (bootstrap.c). */
loomResult_t boot_uid_create(loomUniqueId *id);
loomResult_t boot_uid_parse(const loomUniqueId *id, uid_layout_t *out);
/* The id of a job whose ranks meet at MASTER_ADDR:MASTER_PORT (torchrun's way; launch.c checked
 * the variables): rank 0 starts the rendezvous there. The secret comes from LOOM_JOB_SECRET. */
loomResult_t boot_uid_master(const char *maddr, const char *mport, int rank, int nranks,
                             loomUniqueId *id);
/* Meets the other ranks through the root and fills comm->peers. */
loomResult_t boot_rendezvous(loomComm_t comm, const uid_layout_t *uid, const peer_info_t *mine);
/* The node's identity (host + boot id + netns, or LOOM_NODE_ID); *machine (may be NULL): host +
 * boot id alone, which processes share one kernel's cores. */
uint64_t boot_node_hash(char *host, size_t hostlen, uint32_t *machine);
/* A communicator made from another (loomCommSplit, loomCommShrink) gets a job-state service of
 * its own: its rank 0 starts one (a root thread, as loomGetUniqueId does), tells the others
 * where over the child, and every rank joins it as at init, keeping only the connection (the
 * child has its table). Collective over the child; an error only if that exchange fails.
 * Without a service (a warning says why) the child still works on link-based detection. */
loomResult_t boot_child_service(loomComm_t child);
/* What the job-state client calls back into (comm.c): fail with the job's verdict, this rank's
 * state line and its current operation. */
void comm_js_hooks(loomComm_t comm, js_hooks_t *hooks);

#endif
