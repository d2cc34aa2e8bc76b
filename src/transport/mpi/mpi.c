/*
 * MPI transport (LOOM_TRANSPORT=mpi): loom's messages as MPI point-to-point messages, for any
 * MPI library.
 *
 * Communicators: loom never sends on the application's communicators. It duplicates one
 * (MPI_COMM_WORLD at the first use, or the communicator handed to loomCommInitMpi) and keeps the
 * duplicate for the life of the process: a "base". A rank's connection handle lists the bases
 * it belongs to (a 32-bit id agreed at the duplication, and its rank there); two ranks talk on
 * the common base with the highest id. Every loom communicator has its own pair of tags on the
 * bases, derived from its id: one for data, one for control (heartbeats, aborts). Every message
 * header carries the communicator's id and a sequence number, so that two loom communicators
 * whose tags happened to collide are reported, never mixed.
 *
 * Messages: a send is two MPI messages on the data tag, a 64-byte header (type, communicator,
 * sequence number, length, the executor's metadata) and the payload, straight from the caller's
 * buffer; a receive posts both receives at once into the caller's buffer. MPI keeps messages of
 * one source and tag in order, which is loom's matching rule. A header whose length differs
 * from the posted receive's fails the connection with the same words as tcp.
 *
 * Progress: nothing blocks; the progress engine calls progress, which tests the outstanding
 * requests (MPI_Test drives the MPI library's own progress). MPI gives no descriptor to wait on:
 * the transport has TRANSPORT_CAP_POLL, so the engine wakes up every PROGRESS_POLL_NS instead of
 * sleeping on descriptors.
 *
 * Liveness: each connection sends a heartbeat on the control tag every transport_ping_ns(),
 * carrying whether this rank is inside a call (as tcp's do); a receive is always posted there.
 * Between calls the progress thread sends them (mpi_keepalive), where MPI grants
 * MPI_THREAD_MULTIPLE; below it that thread may not call MPI, so a rank computing between calls
 * is silent, and init says so (a computing rank is then taken for stalled after LOOM_TIMEOUT). A
 * peer whose heartbeats stop (stalled, dead) is named by the executor after LOOM_TIMEOUT like on
 * tcp; an abort tells every connected peer why, on the control tag. The duplicates have
 * MPI_ERRORS_RETURN: a failing MPI call fails the connection with MPI's text instead of killing the
 * process.
 *
 * Thread levels: see mpi_lib.h. Device memory: the transport advertises host memory; the
 * device executor stages device buffers through host memory. Whether the MPI library is
 * CUDA-aware (MPIX_Query_cuda_support, where mpi-ext.h has it) is logged at init.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#include "base.h"
#include "mpi_lib.h"
#include "param.h"
#include "progress.h"
#include "transport.h"

/* ---- the process's MPI ---- */

#define MPI_MAX_BASES 7

typedef struct {
    MPI_Comm comm;
    uint32_t id;
    int rank, size;
} mpi_base_t;

static struct {
    pthread_mutex_t lock;  /* serialises MPI calls below MPI_THREAD_MULTIPLE */
    pthread_mutex_t state; /* the fields below */
    bool up, we_init, multiple;
    int level;
    int tag_ub;
    mpi_base_t base[MPI_MAX_BASES];
    int nbases;
} ml = {.lock = PTHREAD_MUTEX_INITIALIZER, .state = PTHREAD_MUTEX_INITIALIZER};

bool mpi_lib_running(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

const char *mpi_lib_level_name(void)
{
    switch (ml.level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown MPI thread level";
    }
}

const char *mpi_lib_error_string(int code, char *buf, int len)
{
    int n = 0;
    if (MPI_Error_string(code, buf, &n) != MPI_SUCCESS || n <= 0)
        snprintf(buf, (size_t)len, "MPI error %d", code);
    return buf;
}

void mpi_lib_lock(void)
{
    if (!ml.multiple) pthread_mutex_lock(&ml.lock);
}

void mpi_lib_unlock(void)
{
    if (!ml.multiple) pthread_mutex_unlock(&ml.lock);
}

/* The progress thread's heartbeats between calls (mpi_keepalive) against MPI_Finalize at exit:
 * once closing is set no pass starts, and the finalisation waits for one that runs. */
static atomic_bool ml_closing;
static pthread_mutex_t ml_keepalive = PTHREAD_MUTEX_INITIALIZER;

static void mpi_lib_fini(void)
{
    /* Only the process that initialised MPI here finalises it (a forked child must not). */
    if (!mpi_lib_running()) return;
    atomic_store(&ml_closing, true);
    pthread_mutex_lock(&ml_keepalive);
    for (int i = 0; i < ml.nbases; i++)
        MPI_Comm_free(&ml.base[i].comm);
    ml.nbases = 0;
    MPI_Finalize();
    pthread_mutex_unlock(&ml_keepalive);
}

static pid_t ml_init_pid;
static void mpi_lib_atexit(void)
{
    if (ml_init_pid == getpid()) mpi_lib_fini();
}

loomResult_t mpi_lib_up(void)
{
    pthread_mutex_lock(&ml.state);
    loomResult_t r = loomSuccess;
    if (ml.up && mpi_lib_running()) goto out;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) {
        r = base_error(loomInvalidUsage, LOG_NET,
                       "mpi: MPI was already finalised (MPI_Finalize): loom cannot use it; "
                       "destroy loom's communicators before MPI_Finalize");
        goto out;
    }
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        int provided = MPI_THREAD_SINGLE;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            char e[MPI_MAX_ERROR_STRING];
            r = base_error(loomSystemError, LOG_NET, "mpi: MPI_Init_thread failed: %s",
                           mpi_lib_error_string(rc, e, sizeof(e)));
            goto out;
        }
        ml.we_init = true;
        ml_init_pid = getpid();
        atexit(mpi_lib_atexit);
    }
    MPI_Query_thread(&ml.level);
    ml.multiple = ml.level >= MPI_THREAD_MULTIPLE;
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    ml.tag_ub = flag && ub ? *(int *)ub : 32767;
    ml.up = true;
    int cuda = 0;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    cuda = MPIX_Query_cuda_support();
#endif
    INFO(LOG_NET,
         "mpi: MPI initialised by %s, %s granted, tag bound %d, CUDA-aware: %s (device buffers "
         "are staged through host memory)",
         init ? "the application" : "loom", mpi_lib_level_name(), ml.tag_ub, cuda ? "yes" : "no");
    if (!ml.multiple)
        WARN(LOG_NET,
             "mpi: %s granted, below MPI_THREAD_MULTIPLE: loom's progress thread may not call "
             "MPI, so between calls this rank sends no heartbeats over LOOM_TRANSPORT=mpi, and "
             "its peers take it for stalled when it computes longer than LOOM_TIMEOUT=%g s "
             "between collectives; initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE), or "
             "raise LOOM_TIMEOUT",
             mpi_lib_level_name(), param_double(PARAM_TIMEOUT));
out:
    pthread_mutex_unlock(&ml.state);
    return r;
}

/* Whether this thread may call MPI now (mpi_lib_thread_ok without the error text). */
static bool thread_may_call(void)
{
    if (ml.multiple) return true;
    if (progress_on_thread()) return false;
    int main_thread = 1;
    if (ml.level < MPI_THREAD_SERIALIZED) MPI_Is_thread_main(&main_thread);
    return main_thread != 0;
}

loomResult_t mpi_lib_thread_ok(const char *what)
{
    if (ml.multiple) return loomSuccess;
    if (progress_on_thread())
        return base_error(loomInvalidUsage, LOG_NET,
                          "mpi: %s on loom's progress thread, but MPI grants only %s: loom calls "
                          "MPI from other threads only at MPI_THREAD_MULTIPLE (initialise MPI "
                          "with MPI_Init_thread(MPI_THREAD_MULTIPLE); device buffers over the "
                          "mpi transport need it)",
                          what, mpi_lib_level_name());
    if (ml.level < MPI_THREAD_SERIALIZED) {
        int main_thread = 0;
        MPI_Is_thread_main(&main_thread);
        if (!main_thread)
            return base_error(loomInvalidUsage, LOG_NET,
                              "mpi: %s from a thread that did not initialise MPI, which grants "
                              "only %s: call loom from the main thread, or initialise MPI with "
                              "MPI_Init_thread(MPI_THREAD_SERIALIZED or MULTIPLE)",
                              what, mpi_lib_level_name());
    }
    return loomSuccess;
}

loomResult_t mpi_lib_add_base(MPI_Comm comm, MPI_Comm *dup)
{
    LOOM_CHECK(mpi_lib_up());
    LOOM_CHECK(mpi_lib_thread_ok("duplicating a communicator"));
    pthread_mutex_lock(&ml.state);
    loomResult_t r = loomSuccess;
    mpi_lib_lock();
    for (int i = 0; i < ml.nbases; i++) {
        int same = MPI_UNEQUAL;
        MPI_Comm_compare(ml.base[i].comm, comm, &same);
        if (same == MPI_CONGRUENT || same == MPI_IDENT) {
            if (dup) *dup = ml.base[i].comm;
            goto unlock;
        }
    }
    if (ml.nbases == MPI_MAX_BASES) {
        r = base_error(loomInvalidUsage, LOG_NET,
                       "mpi: loom already uses %d MPI communicators (the most it keeps)",
                       MPI_MAX_BASES);
        goto unlock;
    }
    mpi_base_t *b = &ml.base[ml.nbases];
    char e[MPI_MAX_ERROR_STRING];
    int rc = MPI_Comm_dup(comm, &b->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(b->comm, &b->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(b->comm, &b->size);
    uint32_t id = 0;
    while (rc == MPI_SUCCESS && b->rank == 0 && id == 0) {
        base_random(&id, sizeof(id));
        for (int i = 0; i < ml.nbases; i++)
            if (ml.base[i].id == id) id = 0;
    }
    if (rc == MPI_SUCCESS) rc = MPI_Bcast(&id, 1, MPI_UINT32_T, 0, b->comm);
    if (rc != MPI_SUCCESS) {
        r = base_error(loomSystemError, LOG_NET, "mpi: duplicating a communicator failed: %s",
                       mpi_lib_error_string(rc, e, sizeof(e)));
        goto unlock;
    }
    b->id = id;
    ml.nbases++;
    if (dup) *dup = b->comm;
    TRACE(LOG_NET, "mpi: communicator %08x duplicated (rank %d of %d)", id, b->rank, b->size);
unlock:
    mpi_lib_unlock();
    pthread_mutex_unlock(&ml.state);
    return r;
}

/* ---- the transport ---- */

#define MT_MAGIC 0x4c4d5049u /* "LMPI" */
enum { MT_DATA = 1, MT_PING = 2, MT_ABORT = 3 };

typedef struct {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint64_t comm_id;
    uint64_t seq;
    uint64_t len;
    uint8_t meta[TRANSPORT_META_BYTES];
} mt_hdr_t;
_Static_assert(sizeof(mt_hdr_t) == 64, "header layout");

typedef struct {
    mt_hdr_t h;
    char text[TRANSPORT_ABORT_TEXT_MAX];
} mt_ctrl_t;

/* The connection handle: version, how many bases, the pid, then (id, rank) per base. */
typedef struct {
    uint8_t version;
    uint8_t nbases;
    uint16_t reserved;
    uint32_t pid;
    struct {
        uint32_t id;
        int32_t rank;
    } base[MPI_MAX_BASES];
} mt_handle_t;
_Static_assert(sizeof(mt_handle_t) == TRANSPORT_HANDLE_BYTES, "handle layout");

struct transport_req {
    struct transport_req *next, *prev;
    transport_conn_t *conn;
    bool send;
    bool hdr_done; /* receives: the header arrived and was checked */
    bool complete;
    bool bad_len;
    uint64_t seq;        /* receives: the sequence number the header must carry */
    MPI_Request mreq[2]; /* header, payload (MPI_REQUEST_NULL when none or done) */
    void *buf;
    size_t len;
    mt_hdr_t hdr;
};

struct transport_conn {
    transport_conn_head_t head; /* first: the shared ops read it */
    transport_ctx_t *ctx;
    int peer;
    MPI_Comm comm;                     /* the base both ranks share */
    int mrank;                         /* the peer's rank there */
    uint64_t send_seq, recv_seq;       /* messages posted each way */
    transport_req_t *reqs, *reqs_tail; /* outstanding, in posting order */
    MPI_Request ctrl_rreq, ping_sreq, abort_sreq;
    mt_ctrl_t ctrl_in;
    mt_hdr_t ping_out;
    mt_ctrl_t abort_out;
    uint64_t last_ping_ns;
};
TRANSPORT_CONN_HEAD_FIRST(struct transport_conn, head);

struct transport_ctx {
    transport_setup_t setup;
    int data_tag, ctrl_tag;
    uint64_t ping_ns;
    mt_handle_t mine;
    transport_conn_t **conns; /* by rank */
    transport_conn_t **active;
    int nactive;
    transport_abort_t abort;
    bool thread_failed; /* an MPI call was refused on this thread: said once per call */
    /* An abort from a peer this rank had no connection with yet (mpi_callers took it): its
     * connection fails with it once made. */
    int early_abort_peer;
    char early_abort[TRANSPORT_ABORT_TEXT_MAX];
};

#define conn_fail(c, ...) transport_fail(&(c)->head.fail, __VA_ARGS__)

static void mt_mpi_failed(transport_conn_t *c, const char *call, const char *what, int rc)
{
    char e[MPI_MAX_ERROR_STRING];
    conn_fail(c, loomRemoteError, "%s %s %s failed: %s (the peer died?)", call, what, c->head.name,
              mpi_lib_error_string(rc, e, sizeof(e)));
}

static loomResult_t mpi_init(const transport_setup_t *setup, transport_ctx_t **out,
                             uint8_t handle[TRANSPORT_HANDLE_BYTES])
{
    LOOM_CHECK(mpi_lib_up());
    LOOM_CHECK(mpi_lib_thread_ok("starting the mpi transport"));
    if (ml.nbases == 0) LOOM_CHECK(mpi_lib_add_base(MPI_COMM_WORLD, NULL));
    transport_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx) {
        ctx->conns = calloc((size_t)setup->nranks, sizeof(*ctx->conns));
        ctx->active = calloc((size_t)setup->nranks, sizeof(*ctx->active));
    }
    if (ctx == NULL || ctx->conns == NULL || ctx->active == NULL) {
        if (ctx) {
            free(ctx->conns);
            free(ctx->active);
        }
        free(ctx);
        return base_error(loomSystemError, LOG_NET, "out of memory (mpi context)");
    }
    ctx->setup = *setup;
    ctx->ping_ns = transport_ping_ns();
    ctx->early_abort_peer = -1;
    /* Two tags per communicator, below the MPI library's bound. */
    uint64_t npairs = (uint64_t)(ml.tag_ub - 1) / 2;
    uint64_t t = base_hash64(&setup->comm_id, sizeof(setup->comm_id), 0x6d7069) % npairs;
    ctx->data_tag = (int)(2 * t);
    ctx->ctrl_tag = (int)(2 * t + 1);
    pthread_mutex_lock(&ml.state);
    ctx->mine.version = 1;
    ctx->mine.pid = (uint32_t)getpid();
    for (int i = 0; i < ml.nbases; i++) {
        ctx->mine.base[i].id = ml.base[i].id;
        ctx->mine.base[i].rank = ml.base[i].rank;
    }
    ctx->mine.nbases = (uint8_t)ml.nbases;
    pthread_mutex_unlock(&ml.state);
    memcpy(handle, &ctx->mine, TRANSPORT_HANDLE_BYTES);
    INFO(LOG_NET, "mpi: rank %d on %d MPI communicators, tags %d/%d, %s", setup->rank,
         ctx->mine.nbases, ctx->data_tag, ctx->ctrl_tag, mpi_lib_level_name());
    *out = ctx;
    return loomSuccess;
}

static void post_ctrl_recv(transport_conn_t *c)
{
    mpi_lib_lock();
    int rc = MPI_Irecv(&c->ctrl_in, sizeof(c->ctrl_in), MPI_BYTE, c->mrank, c->ctx->ctrl_tag,
                       c->comm, &c->ctrl_rreq);
    mpi_lib_unlock();
    if (rc != MPI_SUCCESS) {
        c->ctrl_rreq = MPI_REQUEST_NULL;
        mt_mpi_failed(c, "MPI_Irecv", "of heartbeats from", rc);
    }
}

static loomResult_t mpi_connect(transport_ctx_t *ctx, int peer,
                                const uint8_t handle[TRANSPORT_HANDLE_BYTES],
                                transport_conn_t **out)
{
    if (ctx->conns[peer]) {
        *out = ctx->conns[peer];
        return loomSuccess;
    }
    mt_handle_t h;
    memcpy(&h, handle, sizeof(h));
    if (h.version != 1 || h.nbases > MPI_MAX_BASES)
        return base_error(loomInternalError, LOG_NET, "mpi: bad connection handle for rank %d",
                          peer);
    /* The common base with the highest id: both ranks pick the same one. */
    int pick = -1, prank = -1;
    uint32_t best = 0;
    for (int i = 0; i < ctx->mine.nbases; i++)
        for (int k = 0; k < h.nbases; k++)
            if (h.base[k].id == ctx->mine.base[i].id && h.base[k].id >= best) {
                best = h.base[k].id;
                pick = i;
                prank = h.base[k].rank;
            }
    if (pick < 0)
        return base_error(loomInvalidUsage, LOG_NET,
                          "mpi: rank %d (pid %u) shares no MPI communicator with this rank: loom "
                          "reaches over MPI only the ranks of MPI_COMM_WORLD or of the "
                          "communicator given to loomCommInitMpi",
                          peer, h.pid);
    transport_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (mpi connection)");
    c->ctx = ctx;
    c->peer = peer;
    pthread_mutex_lock(&ml.state);
    for (int i = 0; i < ml.nbases; i++)
        if (ml.base[i].id == best) c->comm = ml.base[i].comm;
    pthread_mutex_unlock(&ml.state);
    c->mrank = prank;
    c->ctrl_rreq = c->ping_sreq = c->abort_sreq = MPI_REQUEST_NULL;
    c->head.last_activity_ns = base_coarse_ns();
    char where[64];
    snprintf(where, sizeof(where), "MPI rank %d of communicator %08x, pid %u", prank, best, h.pid);
    transport_conn_name(&c->head, peer, where);
    ctx->conns[peer] = c;
    ctx->active[ctx->nactive++] = c;
    (void)pick;
    if (ctx->early_abort_peer == peer) {
        ctx->early_abort_peer = -1;
        conn_fail(c, loomRemoteError, "%s aborted: %s", c->head.name, ctx->early_abort);
    }
    post_ctrl_recv(c);
    TRACE(LOG_NET, "mpi: connected to %s", c->head.name);
    *out = c;
    return loomSuccess;
}

static loomResult_t conn_check(transport_conn_t *c)
{
    return transport_conn_check(&c->head, &c->ctx->abort);
}

/* This thread may call MPI for c, else c fails with the reason (the executor names it). */
static loomResult_t conn_thread_ok(transport_conn_t *c, const char *what)
{
    loomResult_t r = mpi_lib_thread_ok(what);
    if (r == loomSuccess) return loomSuccess;
    conn_fail(c, r, "%s", base_last_error());
    return c->head.fail.code;
}

static void req_link(transport_conn_t *c, transport_req_t *r)
{
    r->prev = c->reqs_tail;
    r->next = NULL;
    if (c->reqs_tail)
        c->reqs_tail->next = r;
    else
        c->reqs = r;
    c->reqs_tail = r;
    c->head.pending++;
}

static void req_unlink(transport_conn_t *c, transport_req_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        c->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        c->reqs_tail = r->prev;
    r->next = r->prev = NULL;
    c->head.pending--;
}

static loomResult_t mpi_isend(transport_conn_t *c, const void *buf, size_t len,
                              const uint8_t meta[TRANSPORT_META_BYTES], transport_req_t **out)
{
    LOOM_CHECK(conn_check(c));
    LOOM_CHECK(conn_thread_ok(c, "a send"));
    if (len > INT32_MAX)
        return base_error(loomInternalError, LOG_NET, "mpi: message of %zu bytes to %s", len,
                          c->head.name);
    transport_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (send request)");
    r->conn = c;
    r->send = true;
    r->buf = (void *)buf;
    r->len = len;
    r->hdr = (mt_hdr_t){.magic = MT_MAGIC,
                        .type = MT_DATA,
                        .comm_id = c->ctx->setup.comm_id,
                        .seq = c->send_seq++,
                        .len = len};
    memcpy(r->hdr.meta, meta, TRANSPORT_META_BYTES);
    r->mreq[0] = r->mreq[1] = MPI_REQUEST_NULL;
    mpi_lib_lock();
    int rc = MPI_Isend(&r->hdr, sizeof(r->hdr), MPI_BYTE, c->mrank, c->ctx->data_tag, c->comm,
                       &r->mreq[0]);
    if (rc == MPI_SUCCESS && len)
        rc = MPI_Isend(buf, (int)len, MPI_BYTE, c->mrank, c->ctx->data_tag, c->comm, &r->mreq[1]);
    mpi_lib_unlock();
    req_link(c, r);
    if (rc != MPI_SUCCESS) {
        mt_mpi_failed(c, "MPI_Isend", "to", rc);
        return c->head.fail.code;
    }
    *out = r;
    return loomSuccess;
}

static loomResult_t mpi_irecv(transport_conn_t *c, void *buf, size_t len, transport_req_t **out)
{
    LOOM_CHECK(conn_check(c));
    LOOM_CHECK(conn_thread_ok(c, "a receive"));
    if (len > INT32_MAX)
        return base_error(loomInternalError, LOG_NET, "mpi: message of %zu bytes from %s", len,
                          c->head.name);
    transport_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (recv request)");
    r->conn = c;
    r->buf = buf;
    r->len = len;
    r->seq = c->recv_seq++; /* receives may complete out of order: each knows its number */
    r->mreq[0] = r->mreq[1] = MPI_REQUEST_NULL;
    mpi_lib_lock();
    int rc = MPI_Irecv(&r->hdr, sizeof(r->hdr), MPI_BYTE, c->mrank, c->ctx->data_tag, c->comm,
                       &r->mreq[0]);
    if (rc == MPI_SUCCESS && len)
        rc = MPI_Irecv(buf, (int)len, MPI_BYTE, c->mrank, c->ctx->data_tag, c->comm, &r->mreq[1]);
    mpi_lib_unlock();
    req_link(c, r);
    if (rc != MPI_SUCCESS) {
        mt_mpi_failed(c, "MPI_Irecv", "from", rc);
        return c->head.fail.code;
    }
    *out = r;
    return loomSuccess;
}

static loomResult_t mpi_test(transport_req_t *r, int *done, uint8_t meta[TRANSPORT_META_BYTES])
{
    if (!r->complete) {
        *done = 0;
        return conn_check(r->conn);
    }
    loomResult_t res = transport_req_finish(&r->conn->head, r->bad_len, r->hdr.meta, done, meta);
    free(r);
    return res;
}

/* Cancels a receive nobody will complete (the caller holds the lock). */
static void cancel_recv(MPI_Request *q)
{
    if (*q == MPI_REQUEST_NULL) return;
    MPI_Cancel(q);
    MPI_Request_free(q);
    *q = MPI_REQUEST_NULL;
}

/* A received header: checked against the posted receive. False when the connection failed. */
static bool header_ok(transport_conn_t *c, transport_req_t *r)
{
    const mt_hdr_t *h = &r->hdr;
    if (h->magic != MT_MAGIC || h->type != MT_DATA) {
        conn_fail(c, loomRemoteError,
                  "malformed message from %s: magic 0x%08x type %u (message %llu)", c->head.name,
                  h->magic, h->type, (unsigned long long)r->seq);
        return false;
    }
    if (h->comm_id != c->ctx->setup.comm_id) {
        conn_fail(c, loomInternalError,
                  "message from %s belongs to another communicator (id %016llx, this one is "
                  "%016llx): their MPI tags collide (tag %d)",
                  c->head.name, (unsigned long long)h->comm_id,
                  (unsigned long long)c->ctx->setup.comm_id, c->ctx->data_tag);
        return false;
    }
    if (h->seq != r->seq) {
        conn_fail(c, loomRemoteError,
                  "malformed message from %s: sequence %llu where %llu was expected", c->head.name,
                  (unsigned long long)h->seq, (unsigned long long)r->seq);
        return false;
    }
    if (h->len != r->len) {
        conn_fail(c, loomRemoteError,
                  "%s sent a message of %llu bytes where %zu were expected (message %llu): the "
                  "ranks disagree on the operation",
                  c->head.name, (unsigned long long)h->len, r->len, (unsigned long long)h->seq);
        r->bad_len = true;
        return false;
    }
    return true;
}

static void req_complete(transport_conn_t *c, transport_req_t *r)
{
    req_unlink(c, r);
    r->complete = true;
    c->head.last_activity_ns = base_coarse_ns();
}

/* Tests one request (the caller holds the lock). */
static void req_progress(transport_conn_t *c, transport_req_t *r, bool *progressed)
{
    int flag = 0, rc;
    if (r->send) {
        rc = MPI_Testall(2, r->mreq, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            mt_mpi_failed(c, "MPI_Testall", "on a send to", rc);
            return;
        }
        if (flag) {
            req_complete(c, r);
            *progressed = true;
        }
        return;
    }
    if (!r->hdr_done) {
        MPI_Status st;
        rc = MPI_Test(&r->mreq[0], &flag, &st);
        if (rc != MPI_SUCCESS) {
            mt_mpi_failed(c, "MPI_Test", "on a receive from", rc);
            return;
        }
        if (!flag) return;
        *progressed = true;
        c->head.last_activity_ns = base_coarse_ns();
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (count != (int)sizeof(mt_hdr_t)) {
            conn_fail(c, loomRemoteError,
                      "malformed message from %s: a header of %d bytes (message %llu)",
                      c->head.name, count, (unsigned long long)r->seq);
            return;
        }
        r->hdr_done = true;
        if (!header_ok(c, r)) {
            cancel_recv(&r->mreq[1]);
            if (r->bad_len) req_complete(c, r);
            return;
        }
    }
    rc = MPI_Test(&r->mreq[1], &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
        mt_mpi_failed(c, "MPI_Test", "on a receive from", rc);
        return;
    }
    if (flag) {
        req_complete(c, r);
        *progressed = true;
    }
}

/* The control receive: heartbeats and aborts (the caller holds the lock). */
static void ctrl_progress(transport_conn_t *c, bool *progressed)
{
    for (int k = 0; k < 16 && c->ctrl_rreq != MPI_REQUEST_NULL && !c->head.fail.failed; k++) {
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Test(&c->ctrl_rreq, &flag, &st);
        if (rc != MPI_SUCCESS) {
            mt_mpi_failed(c, "MPI_Test", "on heartbeats from", rc);
            return;
        }
        if (!flag) return;
        c->head.last_activity_ns = base_coarse_ns();
        const mt_hdr_t *h = &c->ctrl_in.h;
        if (h->magic == MT_MAGIC && h->comm_id == c->ctx->setup.comm_id && h->type == MT_ABORT) {
            int count = 0;
            MPI_Get_count(&st, MPI_BYTE, &count);
            size_t n = count > (int)sizeof(mt_hdr_t) ? (size_t)count - sizeof(mt_hdr_t) : 0;
            n = LOOM_MIN(n, sizeof(c->ctrl_in.text) - 1);
            c->ctrl_in.text[n] = '\0';
            conn_fail(c, loomRemoteError, "%s aborted: %s", c->head.name, c->ctrl_in.text);
            return;
        }
        if (h->magic != MT_MAGIC || h->comm_id != c->ctx->setup.comm_id || h->type != MT_PING) {
            conn_fail(c, loomRemoteError,
                      "malformed control message from %s (magic 0x%08x, type %u): another "
                      "communicator's MPI tags collide with this one's?",
                      c->head.name, h->magic, h->type);
            return;
        }
        *progressed = true;
        transport_peer_call_set(&c->head, h->flags);
        int erc = MPI_Irecv(&c->ctrl_in, sizeof(c->ctrl_in), MPI_BYTE, c->mrank, c->ctx->ctrl_tag,
                            c->comm, &c->ctrl_rreq);
        if (erc != MPI_SUCCESS) {
            c->ctrl_rreq = MPI_REQUEST_NULL;
            mt_mpi_failed(c, "MPI_Irecv", "of heartbeats from", erc);
        }
    }
}

/* A heartbeat, when the last one left and ping_ns passed (the caller holds the lock). */
static void maybe_ping(transport_conn_t *c, uint64_t now)
{
    if (now - c->last_ping_ns < c->ctx->ping_ns) return;
    int flag = 1;
    if (c->ping_sreq != MPI_REQUEST_NULL) MPI_Test(&c->ping_sreq, &flag, MPI_STATUS_IGNORE);
    if (!flag) return; /* the previous one has not left: the peer is not taking them */
    c->ping_out = (mt_hdr_t){.magic = MT_MAGIC,
                             .type = MT_PING,
                             .flags = (uint16_t)transport_my_call(&c->ctx->setup),
                             .comm_id = c->ctx->setup.comm_id,
                             .seq = (uint64_t)c->ctx->setup.rank};
    int rc = MPI_Isend(&c->ping_out, sizeof(c->ping_out), MPI_BYTE, c->mrank, c->ctx->ctrl_tag,
                       c->comm, &c->ping_sreq);
    if (rc != MPI_SUCCESS) {
        c->ping_sreq = MPI_REQUEST_NULL;
        mt_mpi_failed(c, "MPI_Isend", "of a heartbeat to", rc);
        return;
    }
    c->last_ping_ns = now;
}

static loomResult_t mpi_progress(transport_ctx_t *ctx, bool *progressed)
{
    if (ctx->abort.aborted || ctx->nactive == 0) return loomSuccess;
    loomResult_t tr = mpi_lib_thread_ok("progress");
    if (tr != loomSuccess) {
        /* Every connection fails with the reason: the executor names the operation. */
        for (int i = 0; i < ctx->nactive; i++)
            conn_fail(ctx->active[i], tr, "%s", base_last_error());
        return loomSuccess;
    }
    uint64_t now = base_coarse_ns();
    mpi_lib_lock();
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->head.fail.failed) continue;
        ctrl_progress(c, progressed);
        for (transport_req_t *r = c->reqs, *n; r && !c->head.fail.failed; r = n) {
            n = r->next;
            req_progress(c, r, progressed);
        }
        if (!c->head.fail.failed) maybe_ping(c, now);
    }
    mpi_lib_unlock();
    return loomSuccess;
}

/* Whether the keepalive's work (mpi_keepalive, mpi_callers) may call MPI now: this thread may
 * (the progress thread at MPI_THREAD_MULTIPLE only) and the exit's MPI_Finalize has not begun.
 * True holds ml_keepalive, which the caller releases. */
static bool idle_enter(void)
{
    if (!thread_may_call() || atomic_load(&ml_closing) || pthread_mutex_trylock(&ml_keepalive) != 0)
        return false;
    if (!atomic_load(&ml_closing) && mpi_lib_running()) return true;
    pthread_mutex_unlock(&ml_keepalive);
    return false;
}

/* Between calls, on the progress thread (exec's keepalive): heartbeats where idle_enter lets. */
static loomResult_t mpi_keepalive(transport_ctx_t *ctx, bool *progressed)
{
    if (!idle_enter()) return loomSuccess;
    loomResult_t r = mpi_progress(ctx, progressed);
    pthread_mutex_unlock(&ml_keepalive);
    return r;
}

/* Peers whose heartbeats (or abort) reached this rank before it made its connection with them:
 * a rank computing before its first call with a peer answers it this way (core connects them
 * from the progress thread). The messages are taken off MPI's queue; their header names the
 * sender's loom rank. Only where idle_enter lets. */
static int mpi_callers(transport_ctx_t *ctx, int *peers, int max)
{
    if (ctx->abort.aborted || !idle_enter()) return 0;
    int n = 0;
    pthread_mutex_lock(&ml.state);
    int nb = ml.nbases;
    MPI_Comm comms[MPI_MAX_BASES];
    for (int i = 0; i < nb; i++)
        comms[i] = ml.base[i].comm;
    pthread_mutex_unlock(&ml.state);
    mpi_lib_lock(); /* after ml.state, in the order mpi_lib_add_base takes them */
    for (int b = 0; b < nb; b++) {
        for (int k = 0; k < 16 && n < max; k++) {
            int flag = 0;
            MPI_Message msg;
            MPI_Status st;
            if (MPI_Improbe(MPI_ANY_SOURCE, ctx->ctrl_tag, comms[b], &flag, &msg, &st) !=
                    MPI_SUCCESS ||
                !flag)
                break;
            mt_ctrl_t in;
            int count = 0;
            MPI_Get_count(&st, MPI_BYTE, &count);
            if (MPI_Mrecv(&in, (int)sizeof(in), MPI_BYTE, &msg, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                break;
            /* Another communicator's (only where two hash to the same tags, which the
             * connections report as colliding), or nothing loom sent: dropped. */
            if (count < (int)sizeof(mt_hdr_t) || in.h.magic != MT_MAGIC ||
                in.h.comm_id != ctx->setup.comm_id || in.h.seq >= (uint64_t)ctx->setup.nranks)
                continue;
            int from = (int)in.h.seq;
            if (from == ctx->setup.rank || ctx->conns[from]) continue;
            if (in.h.type == MT_ABORT) {
                size_t tl = LOOM_MIN((size_t)count - sizeof(mt_hdr_t), sizeof(in.text) - 1);
                in.text[tl] = '\0';
                ctx->early_abort_peer = from;
                snprintf(ctx->early_abort, sizeof(ctx->early_abort), "%s", in.text);
            }
            bool dup = false;
            for (int i = 0; i < n; i++)
                dup = dup || peers[i] == from;
            if (!dup) peers[n++] = from;
        }
    }
    mpi_lib_unlock();
    pthread_mutex_unlock(&ml_keepalive);
    return n;
}

static int mpi_pollfds(transport_ctx_t *ctx, struct pollfd *fds, int max)
{
    (void)ctx;
    (void)fds;
    (void)max;
    return 0; /* MPI has no descriptor: TRANSPORT_CAP_POLL makes the engine poll */
}

static uint64_t mpi_idle_ns(transport_conn_t *c, bool *pending)
{
    return transport_conn_idle_ns(&c->head, false, pending);
}

/* The abort's grace: the messages that tell the peers why get a moment to leave. */
static bool abort_grace_step(void *arg, bool *prog)
{
    transport_ctx_t *ctx = arg;
    bool busy = false;
    mpi_lib_lock();
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->abort_sreq == MPI_REQUEST_NULL) continue;
        int flag = 0;
        if (MPI_Test(&c->abort_sreq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            c->abort_sreq = MPI_REQUEST_NULL;
            continue;
        }
        if (flag)
            *prog = true;
        else
            busy = true;
    }
    mpi_lib_unlock();
    return busy;
}

static void mpi_abort(transport_ctx_t *ctx, const char *reason)
{
    if (ctx->abort.aborted) return;
    transport_abort_set(&ctx->abort, reason);
    /* Below MPI_THREAD_MULTIPLE, an abort from a thread that may not call MPI (loomCommAbort
     * from another thread) only marks the context: the peers learn it by their timeout. */
    if (!thread_may_call()) return;
    size_t rl = LOOM_MIN(strlen(reason), sizeof(ctx->active[0]->abort_out.text));
    mpi_lib_lock();
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        c->abort_out.h = (mt_hdr_t){.magic = MT_MAGIC,
                                    .type = MT_ABORT,
                                    .comm_id = ctx->setup.comm_id,
                                    .seq = (uint64_t)ctx->setup.rank};
        memcpy(c->abort_out.text, reason, rl);
        int rc = MPI_Isend(&c->abort_out, (int)(sizeof(mt_hdr_t) + rl), MPI_BYTE, c->mrank,
                           ctx->ctrl_tag, c->comm, &c->abort_sreq);
        if (rc != MPI_SUCCESS) c->abort_sreq = MPI_REQUEST_NULL;
    }
    mpi_lib_unlock();
    transport_abort_grace(abort_grace_step, ctx);
}

/* How long a destroy waits for the requests MPI still holds. */
#define MT_FINI_WAIT_NS 1000000000ull

/* Tests one request that fini waits for: true once MPI is done with it (MPI_REQUEST_NULL). */
static bool fini_done(MPI_Request *q)
{
    if (*q == MPI_REQUEST_NULL) return true;
    int flag = 0;
    if (MPI_Test(q, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        /* a failed request (the peer died): MPI has given it up */
        if (*q != MPI_REQUEST_NULL) MPI_Request_free(q);
        *q = MPI_REQUEST_NULL;
        return true;
    }
    return flag != 0;
}

/* Whether every request of c (its own and its transfers') is done; tests each once. */
static bool fini_conn_done(transport_conn_t *c)
{
    bool done = fini_done(&c->ctrl_rreq);
    done = fini_done(&c->ping_sreq) && done;
    done = fini_done(&c->abort_sreq) && done;
    for (transport_req_t *r = c->reqs; r; r = r->next)
        for (int k = 0; k < 2; k++)
            done = fini_done(&r->mreq[k]) && done;
    return done;
}

/*
 * The communicator goes away with requests outstanding (it failed or was abandoned): their
 * buffers (the caller's, the executor's, the headers inside the requests) are freed right after.
 * Receives nothing has matched are cancelled; the others, and every send, are waited for, up to
 * MT_FINI_WAIT_NS: MPI would otherwise write a message that arrives late into freed memory, or
 * read a send's freed buffer when the peer's receive matches it (a stalled rank continued after
 * its peers gave up: their sends match its receives while it destroys). Whatever MPI still holds
 * at the bound is left to it (MPI_Request_free) and its connection's memory is not freed.
 */
static void mpi_fini(transport_ctx_t *ctx)
{
    if (ctx == NULL) return;
    bool may_call = mpi_lib_running() && thread_may_call();
    int kept = 0;
    if (may_call) {
        mpi_lib_lock();
        for (int i = 0; i < ctx->nactive; i++) {
            transport_conn_t *c = ctx->active[i];
            if (c->ctrl_rreq != MPI_REQUEST_NULL) MPI_Cancel(&c->ctrl_rreq);
            for (transport_req_t *r = c->reqs; r; r = r->next)
                for (int k = 0; k < 2 && !r->send; k++)
                    if (r->mreq[k] != MPI_REQUEST_NULL) MPI_Cancel(&r->mreq[k]);
        }
        uint64_t end = base_now_ns() + MT_FINI_WAIT_NS;
        for (;;) {
            bool all = true;
            for (int i = 0; i < ctx->nactive; i++)
                all = fini_conn_done(ctx->active[i]) && all;
            if (all || base_now_ns() >= end) break;
            mpi_lib_unlock();
            usleep(1000);
            mpi_lib_lock();
        }
        for (int i = 0; i < ctx->nactive; i++) {
            transport_conn_t *c = ctx->active[i];
            if (fini_conn_done(c)) continue;
            int ns = 0, nr = 0;
            MPI_Request *qs[3] = {&c->ctrl_rreq, &c->ping_sreq, &c->abort_sreq};
            for (int k = 0; k < 3; k++)
                if (*qs[k] != MPI_REQUEST_NULL) {
                    MPI_Request_free(qs[k]);
                    *(k ? &ns : &nr) += 1;
                }
            for (transport_req_t *r = c->reqs; r; r = r->next)
                for (int k = 0; k < 2; k++)
                    if (r->mreq[k] != MPI_REQUEST_NULL) {
                        MPI_Request_free(&r->mreq[k]);
                        *(r->send ? &ns : &nr) += 1;
                    }
            /* after a failure, usually sends the peer will never receive (it gave up too) */
            INFO(LOG_NET,
                 "mpi: %d sends and %d receives with %s still in MPI's hands %.1f s after the "
                 "communicator was destroyed: left to MPI",
                 ns, nr, c->head.name, MT_FINI_WAIT_NS / 1e9);
            ctx->active[i] = NULL; /* MPI may still write its header and control buffers */
            kept++;
        }
        mpi_lib_unlock();
    }
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c == NULL) continue;
        for (transport_req_t *r = c->reqs, *n; r; r = n) {
            n = r->next;
            free(r);
        }
        free(c);
    }
    if (kept) TRACE(LOG_NET, "mpi: %d connections' memory kept for MPI", kept);
    free(ctx->conns);
    free(ctx->active);
    free(ctx);
}

const transport_ops_t transport_mpi = {
    .name = "mpi",
    .caps = TRANSPORT_CAP_MSG | TRANSPORT_CAP_POLL,
    .reach = TRANSPORT_REACH_NODE | TRANSPORT_REACH_NET,
    .mem_types = TRANSPORT_MEM_HOST,
    .bw_GBps = 2.0,
    .latency_us = 5.0,
    .init = mpi_init,
    .connect = mpi_connect,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .progress = mpi_progress,
    .keepalive = mpi_keepalive,
    .callers = mpi_callers,
    .pollfds = mpi_pollfds,
    .abort = mpi_abort,
    .idle_ns = mpi_idle_ns,
    .peer_name = transport_peer_name,
    .conn_error = transport_conn_error,
    .reg_mr = NULL,
    .fini = mpi_fini,
};
