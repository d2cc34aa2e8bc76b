/*
 * The device executor's own state and the functions its files share; private to src/cuda (core
 * sees only dev.h). The files, one concern each:
 *   dev_setup.c  setup of the exchange (two allgathers), teardown, loomMemAlloc
 *   dev_local.c  same-node collectives: kernel arguments, the slot, direct and latency paths,
 *                launches, the order of a communicator's work across streams
 *   dev_ipc.c    user buffers mapped through CUDA IPC for the direct path (export and import)
 *   dev_win.c    registered windows: mapped once by every local peer, used by later calls
 *   dev_ce.c     the copy-engine path: large same-node collectives moved by cuMemcpyAsync
 *   dev_stage.c  device data crossing nodes through pinned host memory
 *   dev_watch.c  kernels' failure records and peers' exits turned into the communicator's error
 *   dev_calls.c  the node's ranks compare their device collectives (kind, count, type, op, root)
 */
#ifndef LOOM_CUDA_DEV_IMPL_H
#define LOOM_CUDA_DEV_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_tp.h"
#include "cudrv.h"
#include "dev.h"
#include "fifo.h"
#include "kernels.h"
#include "lru.h"
#include "schedule.h"

#define STAGE_RING 4       /* pinned pieces in flight per communicator (allreduce pipeline) */
#define DEV_IPC_CACHE 32   /* mapped user allocations per peer (LRU) */
#define DEV_TEXT_MAX 1024  /* error texts */
#define DEV_CE_STREAMS 8   /* copy-engine path: streams at most */
#define DEV_CALLS_RING 256 /* collectives of a rank kept for its peers' comparison */

/* Peers' allocations that a captured CUDA graph reads through (the direct path's buffers, mapped
 * at capture time): pinned in the IPC cache from the capture until CUDA lets go of the graph and
 * of every instance of it. A user object retained by the graph drops the graph's reference when
 * that happens (its destructor runs on a CUDA thread and touches nothing else); the
 * communicator's side unpins the mappings at its next look (dev_ipc_sweep). */
typedef struct dev_hold {
    struct dev_hold *next;
    atomic_int refs; /* 2: the communicator's and the graph's; 1: the graph is gone */
    uint64_t seq;    /* the captured call's device operation (for the log) */
    int npin;
    struct dev_hold_pin {
        int j;
        uint64_t id;
    } pin[2 * DEV_MAX_LOCAL];
} dev_hold_t;

typedef struct stage_job {
    struct stage_job *next;
    uint32_t val;
    int nops;
    host_op_t ops[];
} stage_job_t;

struct dev_state {
    dev_host_t *h; /* the communicator, as core shows it */
    /* the driver, the GPU's primary context, the kernels */
    struct dev_drv {
        const cudrv_t *d;
        int dev;
        CUdevice cudev;
        CUcontext ctx;
        CUmodule mod;
        CUfunction fn, fn_ce, fn_lla[loomNumTypes][4]; /* loom_exchange; loom_ce;
                                                        * loom_lla_<dtype>_<op> */
        CUfunction fn_copy;                            /* loom_fuse_copy */
    } drv;
    /* who is on this node and how the exchange is cut (rank 0's parameters hold for all) */
    struct dev_layout {
        int n, me;                /* ranks of this node in the exchange, and my index */
        int lrank[DEV_MAX_LOCAL]; /* their communicator ranks */
        int nblocks, nslot, threads, push_threads, empty, couple;
        uint64_t slot, oneshot;
    } lay;
    /* the latency path (DEV_LLA) */
    struct dev_lla {
        uint64_t max, cap; /* largest S*(n-1), chunks per writer and parity */
        uint64_t step;     /* the last step the host numbered */
        bool lanes;        /* since a captured call, the lanes count their steps */
        bool pdl;          /* programmatic dependent launches */
    } lla;
    /* what kernels and stream memory operations address: every local rank's exchange region,
     * and one page of host-mapped memory holding the error record (with the abort word) and,
     * 2 KiB in, the staging flags */
    struct dev_xchg {
        cuda_mem_t mem[DEV_MAX_LOCAL];
        dev_err_t *err; /* host-mapped */
        CUdeviceptr err_dev;
        uint32_t *flags; /* host-mapped: [0] ready (stream -> host), [1] done (host -> stream) */
        CUdeviceptr flags_dev;
    } xg;
    /* a group's small allreduces fused (dev_local.c, run_fused): the packed values, ordered
     * after this communicator's previous work like any call, so one buffer serves every stream */
    struct dev_fuse {
        CUdeviceptr buf;
        size_t cap;
    } fz;
    /* the order of this communicator's work across streams, and its launches */
    struct dev_run {
        CUevent ev;
        CUstream last;
        bool have_last;       /* a call was ordered on `last`, its completion marked by ... */
        bool last_counted;    /* ... the DEV_OFF_LDONE count reaching ldone_want, else by ev */
        bool ev_valid;        /* ev was recorded (after the last call that was not counted) */
        uint64_t counted_max; /* LOOM_CUDA_COUNTED (0 without 64-bit stream waits on this GPU) */
        bool counted;         /* this call's launch was counted (set by run_lla) */
        uint64_t ldone_want;  /* blocks of the counted DEV_LLA launches so far */
        uint64_t seq;
        uint64_t fused; /* allreduces run inside fused group runs (run_fused) */
        int opkind[64]; /* kind of the last launches, by seq, for error texts */
    } run;
    /* direct allreduce: user buffers mapped through CUDA IPC, cached by allocation identity
     * (CU_POINTER_ATTRIBUTE_BUFFER_ID: a caching allocator reuses addresses, never ids) */
    struct dev_ipc {
        bool direct_ok;
        uint64_t direct_min;
        lru_clock_t clock; /* one for both caches (src/base/lru.h: use 0 is an empty entry) */
        struct dev_ipc_out {
            uint64_t id, use;
            CUipcMemHandle h;
        } out[DEV_IPC_CACHE];
        struct dev_ipc_in {
            uint64_t id, use;
            CUdeviceptr base;
            int pin; /* windows and graphs holding the mapping (never evicted while > 0) */
        } in[DEV_MAX_LOCAL][DEV_IPC_CACHE];
        dev_hold_t *holds; /* captured graphs' mappings, newest first */
    } ipc;
    /* the copy-engine path (dev_ce.c): from `min` bytes (rank 0's value; 0: never), set up at
     * its first call */
    struct dev_ce {
        uint64_t min;
        bool ready, failed; /* set up; its setup failed (no second try) */
        int nst, blocks;    /* streams; blocks of the reduction kernel */
        size_t chunk_max;   /* largest piece of one peer's data in the scratch */
        CUstream st[DEV_CE_STREAMS];
        CUevent fork, copied[DEV_CE_STREAMS], reduced[2];
        CUdeviceptr scratch; /* [2][n - 1][chunk_max]: pieces landed, double-buffered */
        size_t scratch_bytes;
    } ce;
    /* registered windows (dev_win.c), in registration order; seq numbers them the same way on
     * every rank (registration is collective) */
    struct dev_wins {
        dev_win_t *list;
        uint64_t next_seq;
    } win;
    /* watchdog: peers' process exits and kernel failures; and the stop of everything the
     * executor has on core's progress thread */
    struct dev_watch {
        atomic_int stop;  /* teardown began: the poll functions start nothing more */
        bool attached;    /* watch_poll is on the progress thread */
        uint64_t next_ns; /* watch_poll's next look (its own) */
        int pidfd[DEV_MAX_LOCAL];
        int pid[DEV_MAX_LOCAL];
    } wd;
    /* the collectives this rank ordered, beside its node peers' (dev_calls.c): the shared
     * segment (NULL: no comparison), how far each peer was compared, whether they differed */
    struct dev_calls {
        void *base;
        size_t len;
        int fd; /* local rank 0: its memfd, open for the communicator's life (else -1) */
        bool failed;
        pthread_mutex_t lock; /* the caller's thread and the watchdog compare */
        uint64_t checked[DEV_MAX_LOCAL];
    } calls;
    /* across nodes */
    struct dev_stage {
        bool multinode, hier_ok;
        bool staged; /* the host side's communicators are open */
        uint32_t next_val;
        uint8_t *ring[STAGE_RING];
        size_t ring_bytes;
        uint8_t *arena;
        size_t arena_bytes;
        void **retired;
        int nretired;
        bool attached; /* stage_poll is on the progress thread */
        /* jobs posted by dev_run, taken in order by stage_poll */
        pthread_mutex_t qlock;
        FIFO(stage_job_t) q;
        /* stage_poll's own: the job it works on, whether its host part started (core's job) */
        stage_job_t *cur;
        bool started;
        void *job;
        uint64_t wait_ns; /* when it began to wait for the stream's ready flag */
        atomic_bool busy; /* a job between its start and its release (teardown waits for it) */
    } stg;
};

/* A registered window (loomCommWindowRegister): [base, base + size) of this rank, and where
 * every local rank's window of the same registration lies in this process. */
struct dev_win {
    dev_win_t *next;
    uint64_t seq;     /* registration number on this communicator (the same on every rank) */
    CUdeviceptr base; /* this rank's window */
    size_t size;
    int flags;                       /* DEV_WIN_* */
    bool mapped;                     /* the peers' windows are mapped here (else: plain paths) */
    CUdeviceptr peer[DEV_MAX_LOCAL]; /* local rank j's window start, mapped here (mine: base) */
    size_t peer_size[DEV_MAX_LOCAL];
    uint64_t peer_id[DEV_MAX_LOCAL]; /* its allocation's id (the pinned entry of ipc.in[j]) */
};

static inline const char *dev_kind_name(int k)
{
    return sched_opkind_name(k);
}

/* dev_setup.c: the GPU's context made current for a call, and the caller's back */
CUcontext dev_ctx_enter(dev_state_t *s);
void dev_ctx_leave(dev_state_t *s, CUcontext prev);

/* dev_local.c */
/* Waits on the host for every kernel of this communicator launched so far. */
void dev_drain(dev_state_t *s);
void dev_args_init(dev_state_t *s, dev_args_t *a, int mode, int kind, const void *send, void *recv);
void dev_set_reduction(dev_args_t *a, const dev_op_t *o, loomRedOp_t op);
void dev_seg_of(size_t count, size_t es, int n, int j, size_t *start, size_t *len);
loomResult_t dev_launch(dev_state_t *s, dev_args_t *a, CUstream st);
loomResult_t dev_launch_direct(dev_state_t *s, dev_args_t *a, CUstream st, const char *path);
loomResult_t dev_launch_grid(dev_state_t *s, dev_args_t *a, unsigned grid, unsigned threads,
                             CUstream st, const char *path);

/* dev_ipc.c */
bool dev_ipc_export(dev_state_t *s, const void *p, uint64_t *id, uint64_t *off, CUipcMemHandle *h);
/* pin: the mapping is a window's, kept until dev_ipc_unpin */
loomResult_t dev_ipc_import(dev_state_t *s, int j, uint64_t id, const CUipcMemHandle *h,
                            CUdeviceptr *base, bool pin);
void dev_ipc_unpin(dev_state_t *s, int j, uint64_t id);
void dev_ipc_close_all(dev_state_t *s);
/* A graph being captured reads rank pin[k].j's allocation pin[k].id (each imported with pin):
 * they stay mapped until CUDA destroys the graph and its instances. On failure they are unpinned.
 */
loomResult_t dev_ipc_hold(dev_state_t *s, CUgraph g, uint64_t seq, const struct dev_hold_pin *pin,
                          int npin);
/* Unpins what graphs that are gone held. */
void dev_ipc_sweep(dev_state_t *s);

/* dev_win.c */
/* A same-node collective on buffers inside symmetric windows, read and written where they are
 * with no exchange on the host: *done says whether it was taken (never without launch: then
 * only a buffer partly inside a window is refused). */
loomResult_t dev_win_run(dev_state_t *s, const dev_op_t *o, CUstream st, bool launch, bool *done);
/* The mapped window holding [p, p + len) (NULL: none); a range partly inside one is an error. */
loomResult_t dev_win_find(dev_state_t *s, const void *p, size_t len, const char *what,
                          dev_win_t **w);
void dev_win_free_all(dev_state_t *s);

/* dev_ce.c */
/* Whether a same-node call of kind with `total` bytes (its larger buffer) takes the copy engines
 * (the same answer on every rank). */
bool dev_ce_wanted(const dev_state_t *s, int kind, size_t total);
/* Sets the path up at its first call; false (with a WARN) if it cannot be (its scratch does not
 * fit on the GPU): then this rank's large calls stay on the SM paths, and so do all ranks'. */
bool dev_ce_prepare(dev_state_t *s, const dev_op_t *o);
/* Runs o on the copy engines (after dev_ce_prepare on every rank), the peers' buffers mapped
 * here (psend[j], precv[j]; mine: NULL). */
loomResult_t dev_ce_run(dev_state_t *s, const dev_op_t *o, CUstream st, const char *const *psend,
                        char *const *precv);
void dev_ce_free(dev_state_t *s);

/* dev_stage.c */
loomResult_t dev_stage_open(dev_state_t *s);
loomResult_t dev_stage_allreduce(dev_state_t *s, const dev_op_t *o, CUstream st, bool cap);
loomResult_t dev_stage_generic(dev_state_t *s, const dev_op_t *o, int nops, CUstream st, bool cap);
void dev_stage_detach(dev_state_t *s);

/* dev_watch.c */
/* dev_calls.c: local rank 0 makes the segment (its memfd, or -1) for n ranks; every rank maps
 * it after the second allgather (the check is off where it cannot); a call's collectives are
 * written and compared before they are ordered (an error when they differ from a peer's); the
 * watchdog compares what arrived since. */
int dev_calls_offer(int n, uint64_t *nonce);
void dev_calls_attach(dev_state_t *s, int pid, int fd, uint64_t nonce);
loomResult_t dev_calls_log(dev_state_t *s, const dev_op_t *ops, int nops);
void dev_calls_check(dev_state_t *s);
void dev_calls_free(dev_state_t *s);
loomResult_t dev_watch_start(dev_state_t *s);
void dev_watch_detach(dev_state_t *s);

#endif
