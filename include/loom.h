/*
 * loom: collective communication built around allreduce.
 *
 * The API has NCCL's shape and semantics with the `loom` prefix, so that porting a program is a
 * rename. Buffers are detected per call. For host memory a call returns when the result is in
 * place. For CUDA device memory (builds with CUDA) a call returns once the operation is ordered
 * on the given stream, as with NCCL; see docs/device.md.
 *
 * Every function returns a loomResult_t. A failing call sets a text that loomGetLastError returns,
 * naming the cause (rank, peer, operation sequence number, system call).
 */
#ifndef LOOM_H
#define LOOM_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAJOR 0
#define LOOM_MINOR 1
#define LOOM_PATCH 0
/* Same encoding as NCCL_VERSION_CODE: major*10000 + minor*100 + patch. */
#define LOOM_VERSION_CODE (LOOM_MAJOR * 10000 + LOOM_MINOR * 100 + LOOM_PATCH)

/* A CUDA stream. Declared here the way the CUDA runtime declares it (an identical typedef is
 * legal in C11 and C++), so that host-only programs need no CUDA headers. Pass NULL for host
 * buffers. */
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;

/* Opaque communicator handle. */
typedef struct loomComm *loomComm_t;

/* 128 bytes, as ncclUniqueId: the root's address and a random per-job secret. Treat as opaque;
 * send it to every rank of the job over a trusted channel (whoever holds it can join). */
#define LOOM_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[LOOM_UNIQUE_ID_BYTES];
} loomUniqueId;

/* Result codes, one to one with ncclResult_t. */
typedef enum {
    loomSuccess = 0,
    loomUnhandledCudaError = 1,
    loomSystemError = 2,     /* a system call failed (socket, memory) */
    loomInternalError = 3,   /* a bug in loom */
    loomInvalidArgument = 4, /* a bad argument; nothing was changed */
    loomInvalidUsage = 5,    /* a call not allowed in this state (or not supported) */
    loomRemoteError = 6,     /* a peer died, stalled, misbehaved or reported an error */
    loomInProgress = 7,      /* non-blocking communicator still initialising */
    loomNumResults = 8
} loomResult_t;

/* Data types, numbered as ncclDataType_t. Float16, bfloat16 and the 8-bit floats are combined in
 * float32 and rounded to nearest even once per step; the 8-bit floats saturate to their largest
 * finite value (no infinities come out) and a NaN becomes the canonical NaN 0x7f. */
typedef enum {
    loomInt8 = 0,
    loomChar = 0,
    loomUint8 = 1,
    loomInt32 = 2,
    loomInt = 2,
    loomUint32 = 3,
    loomInt64 = 4,
    loomUint64 = 5,
    loomFloat16 = 6,
    loomHalf = 6,
    loomFloat32 = 7,
    loomFloat = 7,
    loomFloat64 = 8,
    loomDouble = 8,
    loomBfloat16 = 9,
    loomFloat8e4m3 = 10, /* OCP E4M3 (no infinities, largest finite 448) */
    loomFloat8e5m2 = 11, /* OCP E5M2 (largest finite 57344) */
    loomNumTypes = 12
} loomDataType_t;

/* Reduction operations, numbered as ncclRedOp_t. Values from loomNumOps up to loomMaxRedOp are
 * handles returned by loomRedOpCreatePreMulSum. */
typedef enum {
    loomSum = 0,
    loomProd = 1,
    loomMax = 2,
    loomMin = 3,
    loomAvg = 4, /* sum divided by the number of ranks (integer division for integer types) */
    loomNumOps = 5,
    loomMaxRedOp = 0x7fffffff
} loomRedOp_t;

/* Where loomRedOpCreatePreMulSum's scalar lives. */
typedef enum {
    loomScalarDevice = 0,       /* device memory, read when the collective runs */
    loomScalarHostImmediate = 1 /* host memory, read during loomRedOpCreatePreMulSum */
} loomScalarResidence_t;

/* loomCommSplit's colour for ranks that take no part in any new communicator. */
#define LOOM_SPLIT_NOCOLOR (-1)

#define LOOM_CONFIG_UNDEF_INT INT_MIN
#define LOOM_CONFIG_UNDEF_PTR NULL
#define LOOM_CONFIG_MAGIC 0x6c6f6f6du /* "loom" */
#define LOOM_CONFIG_VERSION 1

/*
 * Communicator configuration. Versioned by its first three fields (size, magic, version): loom
 * reads only the fields that the caller's size covers, so configs written by older headers (fewer
 * fields) and newer ones (more fields, ignored) are both accepted. Initialise with
 * LOOM_CONFIG_INITIALIZER and set what you need; unset fields take the parameter defaults.
 */
typedef struct loomConfig_v1 {
    size_t size;          /* sizeof(loomConfig_t) of the caller's header */
    unsigned int magic;   /* LOOM_CONFIG_MAGIC */
    unsigned int version; /* LOOM_CONFIG_VERSION */
    int blocking;         /* 0: init returns loomInProgress, poll loomCommGetAsyncError */
    int cudaDev;          /* bind to this CUDA device at init (else on first device buffer) */
    int nChannels;        /* parallel rings (LOOM_NCHANNELS) */
    const char *commName; /* shown in logs */
} loomConfig_t;

#define LOOM_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        sizeof(loomConfig_t), LOOM_CONFIG_MAGIC, LOOM_CONFIG_VERSION, LOOM_CONFIG_UNDEF_INT,       \
            LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_PTR                    \
    }

/* ---- Versions and errors ---------------------------------------------------------------- */

/* Writes LOOM_VERSION_CODE of the library (not of the header) to *version. */
loomResult_t loomGetVersion(int *version);

/* A static text describing a result code ("invalid argument", ...). */
const char *loomGetErrorString(loomResult_t result);

/*
 * The text of the last error. With comm == NULL: the calling thread's last error, or, when this
 * thread has none, the last error of the process. With a communicator: the error that broke that
 * communicator (its async error's text) if any, else as with NULL; when a call on this thread
 * was refused because the communicator had already failed, that text is followed by which call
 * it was ("this rank's loomAllReduce, which would have been collective seq 12, was refused").
 * Never NULL ("" when none).
 */
const char *loomGetLastError(loomComm_t comm);

/* ---- Communicators ---------------------------------------------------------------------- */

/*
 * Creates a unique id for a new job: picks the bootstrap interface (LOOM_SOCKET_IFNAME), starts
 * the rendezvous server in this process (a thread that exits once all ranks have met, or after
 * LOOM_TIMEOUT seconds without a new rank) and draws a random secret. Call on one process; send
 * the id to all ranks.
 */
loomResult_t loomGetUniqueId(loomUniqueId *uniqueId);

/* Creates rank `rank` of an `nranks` communicator. Blocks until every rank has joined. Collective
 * over all ranks. */
loomResult_t loomCommInitRank(loomComm_t *comm, int nranks, loomUniqueId commId, int rank);

/* loomCommInitRank with a configuration (may be NULL). With config->blocking == 0 the call may
 * return loomInProgress: poll loomCommGetAsyncError until it is no longer loomInProgress. */
loomResult_t loomCommInitRankConfig(loomComm_t *comm, int nranks, loomUniqueId commId, int rank,
                                    loomConfig_t *config);

/* Creates ndev communicators of one job in this process, comm[i] being rank i. devlist names the
 * CUDA device of each rank (NULL: 0..ndev-1); for host buffers devices are not touched. */
loomResult_t loomCommInitAll(loomComm_t *comm, int ndev, const int *devlist);

/*
 * Splits comm: ranks that pass the same colour form a new communicator, ordered by key (then by
 * old rank). LOOM_SPLIT_NOCOLOR yields *newcomm == NULL. Collective over all ranks of comm.
 */
loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t *newcomm,
                           loomConfig_t *config);

/* Completes outstanding operations; after it only loomCommDestroy is valid. */
loomResult_t loomCommFinalize(loomComm_t comm);

/*
 * Frees the communicator and its connections. Not collective. The handle is invalid at once:
 * every later call with it (destroy included) returns loomInvalidArgument, even if its memory
 * was reused. Inside this thread's open group (loomGroupStart without its loomGroupEnd yet),
 * destroy still succeeds; the operations queued on comm are then dropped, never run, and
 * loomGroupEnd returns loomInvalidUsage naming comm and how many were dropped, after running the
 * group's operations on other communicators (their failure, if any, is returned instead). comm's
 * memory and connections are released when the last group holding operations on it ends. The
 * same holds for loomCommAbort. While another thread is inside a call on comm (or holds an open
 * group with operations on it), destroy is loomInvalidUsage naming both calls and changes
 * nothing; so are loomCommSplit, loomCommFinalize, loomCommShrink and the window calls (one
 * thread per communicator at a time). loomCommAbort is the exception: it may be called from
 * another thread while a call is stuck, and ends that call.
 */
loomResult_t loomCommDestroy(loomComm_t comm);

/*
 * Aborts: any call blocked on comm (in any thread) returns loomRemoteError promptly, later calls
 * fail at once, peers see the connections close; then frees comm. Safe from another thread.
 */
loomResult_t loomCommAbort(loomComm_t comm);

/* The communicator's asynchronous error: loomSuccess, loomInProgress (non-blocking init still
 * running) or the error that broke it (text via loomGetLastError(comm)). */
loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t *asyncError);

loomResult_t loomCommCount(const loomComm_t comm, int *count);
loomResult_t loomCommUserRank(const loomComm_t comm, int *rank);
/* The CUDA device the communicator is bound to, or -1 if it has used host memory only. */
loomResult_t loomCommCuDevice(const loomComm_t comm, int *device);

/* ---- Reduction operators -------------------------------------------------------------- */

/*
 * Creates a pre-multiplied sum: each rank's input is multiplied by *scalar (a value of `datatype`)
 * before the sum. With loomScalarHostImmediate the scalar is read now.
 */
loomResult_t loomRedOpCreatePreMulSum(loomRedOp_t *op, void *scalar, loomDataType_t datatype,
                                      loomScalarResidence_t residence, loomComm_t comm);
loomResult_t loomRedOpDestroy(loomRedOp_t op, loomComm_t comm);

/* ---- Collectives ------------------------------------------------------------------------ */
/* Every rank calls collectives in the same order with the same count, type, op and root: a
 * mismatch is detected and reported naming the ranks. count == 0 is legal and does nothing.
 * sendbuff == recvbuff (or, for allgather/reduce-scatter, the rank's slice of the larger buffer)
 * means in place. */

/* recvbuff[i] = op over ranks of sendbuff[i], on every rank. */
loomResult_t loomAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                           cudaStream_t stream);

/* recvbuff = root's sendbuff, on every rank (sendbuff is read on root only). */
loomResult_t loomBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           loomDataType_t datatype, int root, loomComm_t comm, cudaStream_t stream);

/* On root, recvbuff = op over ranks of sendbuff (recvbuff is ignored elsewhere). */
loomResult_t loomReduce(const void *sendbuff, void *recvbuff, size_t count, loomDataType_t datatype,
                        loomRedOp_t op, int root, loomComm_t comm, cudaStream_t stream);

/* recvbuff[r*sendcount ...] = rank r's sendbuff (sendcount elements each). */
loomResult_t loomAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           loomDataType_t datatype, loomComm_t comm, cudaStream_t stream);

/* recvbuff (recvcount elements) = op over ranks of sendbuff[rank*recvcount ...]. */
loomResult_t loomReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               loomDataType_t datatype, loomRedOp_t op, loomComm_t comm,
                               cudaStream_t stream);

/* recvbuff[r*count ...] = rank r's sendbuff[rank*count ...]: count elements per pair. */
loomResult_t loomAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          loomDataType_t datatype, loomComm_t comm, cudaStream_t stream);

/* Point to point. Sends and receives between a pair match in the order they are posted; the
 * counts and types must agree. Outside a group each call is a group of its own (and so blocks
 * until the peer posts the matching call). */
loomResult_t loomSend(const void *sendbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, cudaStream_t stream);
loomResult_t loomRecv(void *recvbuff, size_t count, loomDataType_t datatype, int peer,
                      loomComm_t comm, cudaStream_t stream);

/* Groups: calls between loomGroupStart and loomGroupEnd are queued and run together at
 * loomGroupEnd (nesting allowed; the outermost end runs them). Point-to-point calls in a group
 * progress concurrently; operations on different communicators progress concurrently. A call
 * inside the group that fails (bad arguments, or a communicator that has failed) fails the whole
 * group, as in NCCL: the end runs none of the queued operations and returns that call's error,
 * its position in the group and its text ("loomGroupEnd: call 2 of the group failed, so none of
 * its 3 queued operations ran: ..."). */
loomResult_t loomGroupStart(void);
loomResult_t loomGroupEnd(void);

/* ---- Device memory (GPU builds) --------------------------------------------------------- */

/* Allocates device memory that peers can map cheaply (loomInvalidUsage without a GPU). */
loomResult_t loomMemAlloc(void **ptr, size_t size);
loomResult_t loomMemFree(void *ptr);
/* Registers a buffer for use in collectives (large device buffers are then mapped once). */
loomResult_t loomCommRegister(const loomComm_t comm, void *buff, size_t size, void **handle);
loomResult_t loomCommDeregister(const loomComm_t comm, void *handle);

/* ---- Registered windows (GPU builds) ------------------------------------------------------
 *
 * loomCommWindowRegister registers [buff, buff + size) of CUDA device memory (cudaMalloc,
 * loomMemAlloc) as this rank's part of a window; collective: every rank of comm calls it, with
 * the same flags, in the same order as its other window calls. Every other rank of the node maps
 * the buffer once, here, so that later collectives whose buffers lie in windows read and write the
 * peers' buffers where they are. With LOOM_WIN_COLL_SYMMETRIC (NCCL_WIN_COLL_SYMMETRIC's value)
 * every rank registers the same size, and a collective whose buffers lie in symmetric windows, at
 * the same offsets on every rank, runs with no exchange on the host at any size (also inside a
 * CUDA graph): allreduce, reduce-scatter, allgather and broadcast (docs/device.md, "Windows").
 * A buffer partly inside a window is refused (loomInvalidArgument). loomCommWindowDeregister is
 * collective too; it waits for the calls already queued on the communicator (any stream), which
 * may use the window, and must not be called while a captured graph that uses it may still run.
 */
#define LOOM_WIN_DEFAULT 0x00
#define LOOM_WIN_COLL_SYMMETRIC 0x01
typedef struct loomWindow *loomWindow_t;
loomResult_t loomCommWindowRegister(loomComm_t comm, void *buff, size_t size, loomWindow_t *win,
                                    int winFlags);
loomResult_t loomCommWindowDeregister(loomComm_t comm, loomWindow_t win);

/* ---- Extensions ------------------------------------------------------------------------- */

/*
 * Creates this process's rank of a job started by a launcher: rank and size come from loom's own
 * LOOM_RANK/LOOM_WORLD_SIZE, torchrun (RANK, WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_*), PMIx
 * (PMIX_RANK), MPICH/Hydra (PMI_RANK, PMI_SIZE) or Slurm (SLURM_PROCID, SLURM_NTASKS), in that
 * order (README.md, "Launching"). The ranks meet through the launcher's PMIx server when there is
 * one (Open MPI's mpirun, srun --mpi=pmix; the job's secret travels with it), else at
 * MASTER_ADDR:MASTER_PORT, where rank 0 serves the rendezvous; torchrun's ranks always meet there.
 * That way the secret is LOOM_JOB_SECRET (any text the launcher exports to every rank); without
 * it the rendezvous trusts whoever reaches the port first, and rank 0 logs a warning saying so.
 * A launcher of several ranks with no way to meet, malformed numbers, or launchers that disagree
 * are errors naming the variables. Collective: every rank of the job calls it, in the same order.
 */
loomResult_t loomCommInitFromEnv(loomComm_t *comm, loomConfig_t *config);

/* Per-communicator statistics. */
typedef struct {
    uint64_t collectives; /* operations completed */
    uint64_t bytes_sent;  /* payload bytes sent to peers */
    uint64_t bytes_received;
} loomStats_t;
loomResult_t loomCommGetStats(const loomComm_t comm, loomStats_t *stats);

/* ---- Gradient-bucket fusion (docs/fusion.md) --------------------------------------------- */
/*
 * A fusion context turns many in-place allreduces (a training step's gradients, enqueued as
 * backward produces them) into a few large ones: tensors are packed into buckets in enqueue
 * order, a tensor larger than the segment size is cut into segments, and a bucket leaves as
 * soon as it is full or its oldest tensor has waited the cycle time. loom's progress thread runs
 * the buckets: loomFusionEnqueue never blocks on the network. Every rank forms the same buckets
 * whatever its timing (the cut is agreed among the ranks, never read off one rank's clock), and
 * ranks that enqueue different tensors (count, type, op, order, a missing one) get an error
 * naming the tensor's id, its position and the ranks, never a wrong sum and never a hang.
 *
 * While a context has tensors in flight (from an enqueue until the loomFusionWaitAll that covers
 * it returns) it owns its communicator: another call on that communicator meanwhile is refused
 * (loomInvalidUsage), because its order against the buckets would depend on timing. Create,
 * WaitAll and Destroy are collective: every rank calls them, in the same order.
 */
typedef struct loomFusion *loomFusion_t;
/* One enqueued tensor; owned by its context, valid until the loomFusionWaitAll that covers the
 * tensor returns (or the context is destroyed). */
typedef struct loomFusionTensor *loomFusionHandle_t;

/* How float32 buckets travel. Exact: as they are, results bit-identical to loomAllReduce of each
 * tensor. Bf16 / Fp16: as bfloat16 / float16 with a power-of-two scale per chunk of 256 values
 * (so that nothing overflows and small values keep their bits), accumulated in float32; sums and
 * averages only (other types and ops always travel exactly); loomFusionGetStats reports the error
 * it made. */
typedef enum {
    loomFusionWireExact = 0,
    loomFusionWireBf16 = 1,
    loomFusionWireFp16 = 2,
    loomFusionNumWires = 3
} loomFusionWire_t;

#define LOOM_FUSION_DEFAULT 0        /* any size or time field: loom's default (below) */
#define LOOM_FUSION_NEVER UINT64_MAX /* cycleUs: no timer (buckets leave full, or at a flush) */
#define LOOM_FUSION_CONFIG_MAGIC 0x6675736eu /* "fusn" */
#define LOOM_FUSION_CONFIG_VERSION 1

/*
 * Fusion configuration, versioned as loomConfig_t (size, magic, version first). Zero fields take
 * the defaults, which LOOM_FUSION_BUCKET, LOOM_FUSION_FIRST_BUCKET, LOOM_FUSION_SEGMENT,
 * LOOM_FUSION_CYCLE_US and LOOM_FUSION_WIRE override:
 * - bucketBytes 32 MiB: the host ring reaches its plateau from a few MiB per rank, and 32 MiB
 *   is where loom's allreduce leads at 4 ranks (perf/RESULTS.md); larger buckets only delay the
 *   first byte (PyTorch's 25 MB is the same idea, one step smaller).
 * - firstBucketBytes 1 MiB: the last layers' gradients come first and are small; a small first
 *   bucket puts the network to work while backward still runs (PyTorch uses 1 MB for the same).
 * - segmentBytes 8 MiB (at most bucketBytes): a tensor larger than this is cut, so one huge
 *   tensor fills buckets evenly instead of making one monster bucket.
 * - cycleUs 2000: a partial bucket waits at most 2 ms for company (Horovod's cycle is 1-5 ms);
 *   shorter costs extra agreement rounds, longer leaves the network idle at the step's end.
 * - wire exact.
 */
typedef struct loomFusionConfig_v1 {
    size_t size;             /* sizeof(loomFusionConfig_t) of the caller's header */
    unsigned int magic;      /* LOOM_FUSION_CONFIG_MAGIC */
    unsigned int version;    /* LOOM_FUSION_CONFIG_VERSION */
    size_t bucketBytes;      /* a bucket leaves once this full */
    size_t firstBucketBytes; /* the limit of a step's first bucket */
    size_t segmentBytes;     /* tensors above this are cut into segments of it */
    uint64_t cycleUs;        /* a partial bucket leaves once its oldest tensor waited this */
    int wire;                /* loomFusionWire_t */
} loomFusionConfig_t;

#define LOOM_FUSION_CONFIG_INITIALIZER                                                             \
    {                                                                                              \
        sizeof(loomFusionConfig_t), LOOM_FUSION_CONFIG_MAGIC, LOOM_FUSION_CONFIG_VERSION, 0, 0, 0, \
            0, loomFusionWireExact                                                                 \
    }

/* Called once per tensor when its result is in place (device tensors: when its bucket's work is
 * ordered on the context's stream; see loomFusionWait) or it failed (result and
 * loomGetLastError's text on that thread say why), on loom's progress thread or the thread
 * inside loomFusionWaitAll. It must not block and must not call into loom. */
typedef void (*loomFusionCallback_t)(uint64_t id, loomResult_t result, void *arg);

/* Creates a context on comm (config may be NULL: defaults). Collective. *config is copied;
 * loomFusionGetConfig returns the values in effect. */
loomResult_t loomFusionCreate(loomFusion_t *fusion, loomComm_t comm,
                              const loomFusionConfig_t *config);
loomResult_t loomFusionGetConfig(loomFusion_t fusion, loomFusionConfig_t *config);

/*
 * Enqueues buff (count elements of type, reduced with op across the ranks, in place). id names
 * the tensor in errors (a parameter index, a hash of its name). stream: NULL for host memory;
 * for CUDA device memory the tensor's stream: what was ordered there before the enqueue comes
 * before the tensor is read, and the bucket runs on the context's own stream (no host
 * synchronisation of either). A context's tensors are all host or all device memory (its first
 * tensor's kind). callback (may be NULL) is called when done; *handle (handle may be NULL) waits
 * for this tensor alone. Returns at once.
 */
loomResult_t loomFusionEnqueue(loomFusion_t fusion, void *buff, size_t count,
                               loomDataType_t datatype, loomRedOp_t op, uint64_t id,
                               cudaStream_t stream, loomFusionCallback_t callback,
                               void *callbackArg, loomFusionHandle_t *handle);

/* Closes the partial bucket now (agreed with the other ranks: it leaves once every rank has
 * flushed or cut there). Returns at once. */
loomResult_t loomFusionFlush(loomFusion_t fusion);

/* Waits for one tensor; returns its result. Its bucket leaves when full, at the cycle time or at
 * a flush: with cycleUs = LOOM_FUSION_NEVER, flush first (on every rank). A device tensor's
 * stream is then ordered after its bucket (the host does not wait for the GPU). */
loomResult_t loomFusionWait(loomFusionHandle_t handle);
/* *done = 1 once the tensor finished (then returns its result), else 0 and loomSuccess. */
loomResult_t loomFusionTest(loomFusionHandle_t handle, int *done);

/* Flushes and waits for every tensor enqueued so far (collective: the ranks also agree that
 * nobody enqueued more); every stream that enqueued device tensors is then ordered after the
 * step's last bucket. Returns the first error; the context stays usable after success. */
loomResult_t loomFusionWaitAll(loomFusion_t fusion);

typedef struct {
    uint64_t tensors;   /* tensors completed */
    uint64_t segments;  /* pieces they were cut into (>= tensors) */
    uint64_t buckets;   /* allreduces run */
    uint64_t bytes;     /* payload bytes reduced (per rank, as float32/exact values) */
    uint64_t wireBytes; /* bytes this rank sent for the buckets */
    uint64_t rounds;    /* agreement rounds (small allgathers ahead of buckets) */
    uint64_t fullCuts;  /* buckets closed because full (or at a type/op change) */
    uint64_t timerCuts; /* ... because the cycle time passed */
    uint64_t flushCuts; /* ... by loomFusionFlush / loomFusionWaitAll */
    uint64_t compressedBuckets;
    double maxRelError;  /* compressed buckets: largest per-chunk relative error bound */
    double meanRelError; /* ... mean over chunks (see docs/fusion.md for the definition) */
    /* compressed buckets, where the time went (this rank; codec: CPU seconds of the thread that
     * ran it, so preemption by other work does not count; docs/fusion.md): */
    double encodeSeconds;     /* packing and encoding the bucket's float32 values */
    double reduceSeconds;     /* decoding the received shards, summing, re-encoding the sums */
    double decodeSeconds;     /* decoding the gathered sums and unpacking them */
    double compressedSeconds; /* wall time from a compressed bucket's start to its end */
} loomFusionStats_t;
loomResult_t loomFusionGetStats(loomFusion_t fusion, loomFusionStats_t *stats);

/* Waits for what is in flight (as loomFusionWaitAll, errors ignored), then frees the context.
 * Collective when tensors are pending; after loomCommAbort of its communicator, local. */
loomResult_t loomFusionDestroy(loomFusion_t fusion);

/* ---- Recovery: shrinking a communicator (NCCL 2.27's ncclCommShrink) -------------------- */

#define LOOM_SHRINK_DEFAULT 0x00 /* no operation may be outstanding on comm */
#define LOOM_SHRINK_ABORT 0x01   /* abort comm's outstanding operations first (after an error) */

/*
 * Creates *newcomm of comm's ranks that are not in excludeRanks (nExclude of them; the ranks that
 * died, or that leave), numbered in the order of their ranks in comm, without a new unique id:
 * the survivors meet through comm's own per-rank listeners, never through its links (which an
 * error has broken) and never waiting on an excluded rank. Collective over the survivors only:
 * excluded ranks do not call it. Every survivor must pass the same set (in any order): otherwise
 * every survivor that called gets loomInvalidUsage naming the ranks and their lists, and a
 * survivor that never calls is named after LOOM_TIMEOUT. With LOOM_SHRINK_ABORT, calls blocked on
 * comm (in other threads) return first and comm is aborted (peers see it closed); with
 * LOOM_SHRINK_DEFAULT, an operation in flight on comm is loomInvalidUsage naming both calls, and
 * comm stays usable.
 * Either way comm still needs loomCommDestroy (or loomCommAbort). config as for loomCommSplit.
 */
loomResult_t loomCommShrink(loomComm_t comm, const int *excludeRanks, int nExclude,
                            loomComm_t *newcomm, loomConfig_t *config, int flags);

#ifdef __cplusplus
}
#endif
#endif /* LOOM_H */
