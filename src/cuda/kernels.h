/*
 * What the host and the device executor's kernel share: the launch arguments, the layout of
 * each rank's exchange region, and the error record.
 *
 * Every rank of a node owns one exchange region in its GPU's memory, mapped by every other rank
 * of the node (src/transport/cuda). A collective is one kernel per rank that moves byte streams
 * between ranks through those regions: the stream from rank w to rank r travels through r's
 * slots for w, in pieces of at most `slot` bytes, each block of the grid owning its own lane
 * (slots, flags and step counters), so that blocks never wait for one another, only for the
 * same block of a peer. Per lane and direction a step counter advances once per piece; a
 * writer publishes step s in the reader's rflag[w][b], the reader acknowledges it in the
 * writer's ack[r][b], and step s uses slot s mod nslot, so a writer reuses a slot only after
 * the step nslot before it was consumed. The counters live in device memory and advance on the
 * device, so a captured CUDA graph replays correctly.
 *
 * Modes: COPY delivers each stream into the receive buffer (broadcast, allgather, all-to-all,
 * send/recv); REDUCE combines the streams arriving at a rank with its own contribution, in rank
 * order, so every rank computes bit-identical results (allreduce one-shot, reduce-scatter,
 * reduce).
 */
#ifndef LOOM_CUDA_KERNELS_H
#define LOOM_CUDA_KERNELS_H

#define DEV_MAX_LOCAL 8    /* ranks of one node in one exchange */
#define DEV_MAX_BLOCKS 128 /* lanes per peer */
#define DEV_MIN_PIECE 4096ull
#define DEV_MAX_THREADS 512 /* threads per block: half push, half receive */

enum { DEV_COPY = 0, DEV_REDUCE = 1, DEV_DIRECT = 2, DEV_LLA = 3, DEV_MEET = 4, DEV_CE_REDUCE = 5 };
/* DEV_DIRECT (allreduce, two-shot, no slots): every rank maps the others' send and receive
 * buffers (CUDA IPC, cached by allocation), reads segment `me` of every input straight from the
 * peers, reduces it, and writes the result into every rank's receive buffer (a reduce-scatter:
 * into its own only, so only the inputs are mapped). Blocks meet their
 * peers' blocks twice: on arrival (the inputs are ready) and when done (nobody still reads my
 * input or writes my output). Local memory sees each byte about once. */
/* The copy-engine path (src/cuda/dev_ce.c) moves data with cuMemcpyAsync between mapped
 * buffers; the kernel only meets the peers and reduces what landed:
 * DEV_MEET (one block, lane 0): the arrival half of DEV_DIRECT's meeting, as a step of its own
 * (the lane's direct-operation count advances): when it ends, every peer's stream reached the
 * same meeting, so what each did before it (inputs written, pieces reduced, copies out of my
 * buffers finished) is done.
 * DEV_CE_REDUCE (a few blocks, no meeting): recv + self_dst = the reduction, in rank order, of
 * send + self_src (mine) and peer_send[j] (rank j's piece, already copied into my scratch), over
 * self_len bytes. */
/* DEV_LLA (allreduce of small and medium messages, one shot; reduce-scatter alike, with rank
 * j's segment going to rank j): every thread owns 8-byte chunks of the buffer; it pushes each
 * (premultiplied if asked) to every peer as one 16-byte
 * low-latency word {low half, step, high half, step} (dev_lla_word_t below, with its
 * invariants), then waits for the peers' words of the same chunks and reduces them with its own in
 * rank order. No fences, no barriers, no acknowledgements: each writer has two slots per chunk in a
 * reader's region, used by parity of the step, and a writer can reach the next use of a slot only
 * after finishing an allreduce in between, which needed the reader's words of that one, which the
 * reader pushed only after its kernel before had read everything (a communicator's kernels run one
 * at a time). Steps: the host numbers its calls (one step for every lane); a launch that a graph
 * may replay has no host step, and each lane counts from the step it last used (every lane
 * records it), so steps in a slot only grow. Chunk c belongs to block
 * (c / DEV_LLA_SPAN) mod nblocks in every launch. */
#define DEV_LLA_SPAN 512ull /* chunks of a block per round: one per thread of a full block */
enum { DEV_ERR_NONE = 0, DEV_ERR_TIMEOUT = 1, DEV_ERR_ABORT = 2 };
enum { DEV_WAIT_DATA = 0, DEV_WAIT_ACK = 1 };

/* Region layout: seven tables of u64 [DEV_MAX_LOCAL][DEV_MAX_BLOCKS] (RFLAG, ACK, SSTEP, RSTEP,
 * ARRIVE, DONE, DSTEP) in the first eight table-sized places (the fifth holds only the word a
 * failing block claims, kernels.cu's DEV_OFF_CLAIM; DSTEP's rows 1 and 2 are LSTEP and LDONE),
 * then the slots. */
#define DEV_TABLE_BYTES (8ull * DEV_MAX_LOCAL * DEV_MAX_BLOCKS)
#define DEV_OFF_RFLAG 0ull                   /* [writer][block]: step published to me */
#define DEV_OFF_ACK (1 * DEV_TABLE_BYTES)    /* [reader][block]: step the reader consumed */
#define DEV_OFF_SSTEP (2 * DEV_TABLE_BYTES)  /* [peer][block]: my last step sent (private) */
#define DEV_OFF_RSTEP (3 * DEV_TABLE_BYTES)  /* [peer][block]: my last step received */
#define DEV_OFF_ARRIVE (5 * DEV_TABLE_BYTES) /* [peer][block]: direct ops the peer started */
#define DEV_OFF_DONE (6 * DEV_TABLE_BYTES)   /* [peer][block]: direct ops the peer finished */
#define DEV_OFF_DSTEP (7 * DEV_TABLE_BYTES)  /* [0][block]: my direct ops (private) */
#define DEV_OFF_LSTEP (DEV_OFF_DSTEP + 8ull * DEV_MAX_BLOCKS) /* [1][block]: DEV_LLA steps */
/* [2][0]: blocks of host-numbered DEV_LLA launches that finished (each adds 1 after its
 * stores): the host orders a later call on another stream after it with a stream wait on this
 * count instead of an event recorded after every call */
#define DEV_OFF_LDONE (DEV_OFF_DSTEP + 16ull * DEV_MAX_BLOCKS)
#define DEV_OFF_SLOTS 65536ull
/* Slot p (of nslot) for writer w, block b, in a region of nblocks lanes of `slot` bytes. */
#define DEV_SLOT_OFF(w, b, p, nblocks, nslot, slot)                                                \
    (DEV_OFF_SLOTS +                                                                               \
     ((((unsigned long long)(w) * (nblocks) + (b)) * (unsigned long long)(nslot) + (p)) * (slot)))

#ifdef __CUDACC__
#define DEV_HD __host__ __device__
#else
#define DEV_HD
#endif

/* The piece size of a stream of len bytes over nb lanes: an even share, 16-byte aligned, at
 * least DEV_MIN_PIECE, at most a slot. Host and device cut streams the same way. */
static DEV_HD inline unsigned long long dev_piece_bytes(unsigned long long len, int nb,
                                                        unsigned long long slot)
{
    unsigned long long c = (len + (unsigned long long)nb - 1) / (unsigned long long)nb;
    c = (c + 15) & ~15ull;
    if (c < DEV_MIN_PIECE) c = DEV_MIN_PIECE;
    if (c > slot) c = slot;
    return c;
}

/*
 * Small pieces travel in low-latency form (as NCCL's LL protocol): each 8-byte word carries 4
 * bytes of data and the 32-bit step, written with one 64-bit store, so the receiver needs no
 * separate flag, no fence and no barrier before it reads. They have their own slots (a stale
 * word of a bulk piece could look like a valid step) after the bulk slots, and an unpack area
 * per lane where the receiver gathers a peer's piece before it reduces.
 */
#define DEV_LL_PIECE 4096ull /* data bytes of one low-latency piece */
#define DEV_LL_MAX 65536ull  /* streams up to this length go in low-latency pieces */
#define DEV_LL_SLOT (2 * DEV_LL_PIECE)
#define DEV_LL_BASE(n, nb, nslot, slot)                                                            \
    (DEV_OFF_SLOTS + (unsigned long long)(n) * (nb) * (nslot) * (slot))
#define DEV_LL_SLOT_OFF(w, b, p, n, nb, nslot, slot)                                               \
    (DEV_LL_BASE(n, nb, nslot, slot) +                                                             \
     ((((unsigned long long)(w) * (nb) + (b)) * (unsigned long long)(nslot) + (p)) * DEV_LL_SLOT))
#define DEV_UNPACK_OFF(j, b, n, nb, nslot, slot)                                                   \
    (DEV_LL_BASE(n, nb, nslot, slot) + (unsigned long long)(n) * (nb) * (nslot)*DEV_LL_SLOT +      \
     ((unsigned long long)(j) * (nb) + (b)) * DEV_LL_PIECE)
#ifdef __cplusplus
#define DEV_ALIGNAS(n) alignas(n)
#define DEV_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define DEV_ALIGNAS(n) _Alignas(n)
#define DEV_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif

/*
 * DEV_LLA's low-latency word: 8 data bytes of one chunk and the writer's step, the step in both
 * halves, written and read as one 16-byte access (st/ld.volatile.global.v4.u32), so a reader that
 * finds its step in both halves has that step's data, with no flag, fence or barrier. Only the
 * low 32 bits of the step travel. What keeps a reader from taking a stale or a future word:
 * - Each writer has two slots per chunk in a reader's region, chosen by the parity of the step
 *   (DEV_LLA_OFF's `par`), so step s never overwrites the word of step s-1.
 * - A writer reaches a slot again (step s+2) only after an allreduce in between (s+1), which
 *   needed the reader's words of s+1, which the reader pushed only after its kernel of step s
 *   had read everything (a communicator's kernels run one at a time, in stream order).
 * - Steps in a slot only grow: the host numbers its calls (dev_args_t's lla_step, one step for
 *   every lane); from the first call made while a graph is being captured (a replayed launch
 *   carries no new number) lla_step is 0 and each lane counts on from the step it last used,
 *   which every lane records at DEV_OFF_LSTEP (docs/device.md, "Inside a node").
 */
typedef struct {
    DEV_ALIGNAS(16) unsigned lo; /* data bytes 0-3 */
    unsigned step;               /* the step (low 32 bits) */
    unsigned hi;                 /* data bytes 4-7 */
    unsigned step2;              /* the step again: a torn word never matches in both */
} dev_lla_word_t;
DEV_STATIC_ASSERT(sizeof(dev_lla_word_t) == 16, "one DEV_LLA word is one 16-byte access");

/* DEV_LLA's slots: [writer][parity][chunk] words, `cap` chunks per writer and parity (0 when the
 * communicator has no DEV_LLA path). */
#define DEV_LLA_BASE(n, nb, nslot, slot) DEV_UNPACK_OFF(n, 0, n, nb, nslot, slot)
#define DEV_LLA_OFF(w, par, c, cap)                                                                \
    ((((unsigned long long)(w)*2 + (par)) * (unsigned long long)(cap) + (c)) *                     \
     (unsigned long long)sizeof(dev_lla_word_t))
#define DEV_REGION_BYTES(n, nb, nslot, slot, cap)                                                  \
    (DEV_LLA_BASE(n, nb, nslot, slot) + DEV_LLA_OFF(n, 0, 0, cap))

/* Whether a stream of len bytes goes in low-latency pieces (premul pushes are typed: bulk). */
static DEV_HD inline int dev_is_ll(unsigned long long len, int nb, unsigned long long slot,
                                   int premul_push)
{
    return len > 0 && len <= DEV_LL_MAX && !premul_push &&
           dev_piece_bytes(len, nb, slot) <= DEV_LL_PIECE;
}

/* DEV_LLA's launch for len bytes over nb lanes: every lane with chunks, full blocks unless one
 * block suffices (then a warp multiple of threads, one per chunk). */
static DEV_HD inline void dev_lla_launch(unsigned long long len, int nb, unsigned *grid,
                                         unsigned *threads)
{
    unsigned long long chunks = (len + 7) / 8, spans = (chunks + DEV_LLA_SPAN - 1) / DEV_LLA_SPAN;
    *grid = (unsigned)(spans < (unsigned long long)nb ? spans : (unsigned long long)nb);
    if (*grid == 0) *grid = 1;
    *threads =
        chunks >= DEV_LLA_SPAN ? (unsigned)DEV_LLA_SPAN : (unsigned)((chunks + 31) / 32 * 32);
    if (*threads == 0) *threads = 32;
}

/* Round k of a stream of len bytes for block b of nb: *pos and *plen; 0 if the block has no
 * piece in that round. The kernel and the host (launch sizes, tests) cut streams this way. */
static DEV_HD inline int dev_piece_of(unsigned long long len, unsigned long long k, int nb, int b,
                                      unsigned long long slot, unsigned long long *pos,
                                      unsigned long long *plen)
{
    if (len == 0) return 0;
    unsigned long long ch = dev_piece_bytes(len, nb, slot),
                       p = (k * (unsigned long long)nb + b) * ch;
    if (p >= len) return 0;
    *pos = p;
    *plen = len - p < ch ? len - p : ch;
    return 1;
}

/* Rounds a stream of len bytes takes over nb lanes. */
static DEV_HD inline unsigned long long dev_rounds_of(unsigned long long len, int nb,
                                                      unsigned long long slot)
{
    if (len == 0) return 0;
    unsigned long long per = dev_piece_bytes(len, nb, slot) * (unsigned long long)nb;
    return (len + per - 1) / per;
}

/* Shared with the host through mapped host memory. */
typedef struct {
    volatile int abort; /* the host sets it (abort, a dead peer); the device sets it on failure */
    volatile int code;  /* DEV_ERR_*; the first failing block writes the record */
    int peer, block, wait_kind, pad;
    unsigned long long step, seen, seq, waited_ns;
} dev_err_t;

/* One peer's part of a call, in bytes. */
typedef struct {
    unsigned long long send_off, send_len; /* from the send buffer to that peer */
    unsigned long long recv_off, recv_len; /* from that peer into the receive buffer */
} dev_io_t;

typedef struct {
    /* what every kernel reads first, together (one pass through the constant cache) */
    int n, me, mode, dtype, op, avg, nblocks, premul;
    int alias;        /* the receive buffer overlaps the send buffer (in place) */
    int nslot;        /* slots per lane: pieces a lane has in flight */
    int push_threads; /* the first push_threads of a block push, the rest receive */
    int empty;        /* debugging: the kernel returns at once (LOOM_CUDA_EMPTY) */
    const char *send;
    char *recv;
    /* COPY: my own part (send + self_src -> recv + self_dst, self_len bytes).
     * REDUCE: my contribution is send + self_src, the result goes to recv + self_dst, and
     * self_len is the length of the reduced range (0: I only send). */
    unsigned long long self_src, self_dst, self_len;
    unsigned long long lla_base, lla_cap; /* DEV_LLA: slot offset in the regions, chunks */
    unsigned long long lla_step; /* DEV_LLA: the call's step, or 0: each lane counts its own */
    unsigned long long lla_seg;  /* DEV_LLA: 0 (allreduce), or a reduce-scatter's segment bytes */
    int lla_count, lla_pad;      /* DEV_LLA: 1: every block adds 1 at DEV_OFF_LDONE when done */
    char *region[DEV_MAX_LOCAL]; /* every local rank's exchange region, mapped here */
    /* the rest */
    unsigned long long slot;
    unsigned long long seq, timeout_ns;
    double scale_f;        /* pre-multiplied sum scalar, host immediate (floating types) */
    long long scale_i;     /* ... integer types */
    const void *scale_dev; /* ... or in device memory (read when the kernel runs) */
    const char *peer_send[DEV_MAX_LOCAL]; /* DEV_DIRECT: the ranks' buffers, mapped here */
    char *peer_recv[DEV_MAX_LOCAL];
    int direct_fanout; /* DEV_DIRECT: 1 (allreduce): the result into every output */
    /* DEV_DIRECT on registered windows (src/cuda/dev_win.c): direct_copy 1: no reduction, each
     * io[j] (j = me too) copies recv_len bytes from rank j's buffer at send_off into recv at
     * recv_off (allgather, broadcast); direct_stage 1: a one-shot allreduce in place, the block's
     * result staged in its own slots until the peers are done reading */
    int direct_copy, direct_stage, direct_pad;
    dev_err_t *err; /* device address of the host-mapped error record */
    dev_io_t io[DEV_MAX_LOCAL];
} dev_args_t;

/* loom_fuse_copy: up to DEV_COPY_MAX byte ranges copied in one launch (a fusion context's pack
 * and unpack of a device bucket, src/fusion). Grid (x, n): the blocks of row i copy range i, in
 * the widest word that the range's addresses and length allow. */
#define DEV_COPY_MAX 64
typedef struct {
    unsigned long long src[DEV_COPY_MAX], dst[DEV_COPY_MAX], bytes[DEV_COPY_MAX];
    int n;
} dev_copies_t;

#endif
