/* Communicator lifecycle: init, finalize, destroy, abort, errors and queries (split: split.c). */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "coll.h"
#include "comm.h"
#include "fork.h"
#include "loom_internal.h"
#include "memtype.h"
#include "param.h"
#include "progress.h"
#ifdef LOOM_HAVE_CUDA
#include "cudrv.h"
#include "dev.h"
#endif

LOOM_EXPORT loomResult_t loomGetVersion(int *version)
{
    if (version == NULL)
        return base_error(loomInvalidArgument, LOG_INIT, "loomGetVersion: version is NULL");
    *version = LOOM_VERSION_CODE;
    return loomSuccess;
}

LOOM_EXPORT const char *loomGetErrorString(loomResult_t r)
{
    switch (r) {
    case loomSuccess: return "no error";
    case loomUnhandledCudaError:
        return "unhandled cuda error (run with LOOM_DEBUG=WARN for details)";
    case loomSystemError: return "unhandled system error (run with LOOM_DEBUG=WARN for details)";
    case loomInternalError:
        return "internal error - please report this issue to the loom developers";
    case loomInvalidArgument: return "invalid argument (run with LOOM_DEBUG=WARN for details)";
    case loomInvalidUsage: return "invalid usage (run with LOOM_DEBUG=WARN for details)";
    case loomRemoteError: return "remote process exited or there was a network error";
    case loomInProgress: return "operation in progress";
    default: return "unknown result code";
    }
}

/* ---- the live communicators ---- */

/* Every communicator of the process, by address, so that the liveness check looks a handle up
 * instead of reading through it: a destroyed handle points at freed (or reused) memory, and its
 * old magic number proves nothing. Open addressing with linear probing; deletion shifts the
 * cluster back, so no tombstones pile up in jobs that create and destroy many communicators. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static loomComm_t *live_set;
static size_t live_cap, live_len; /* live_cap: 0 or a power of two */

void comm_atfork(base_fork_phase_t phase)
{
    if (phase == BASE_FORK_PREPARE)
        pthread_mutex_lock(&live_lock);
    else if (phase == BASE_FORK_PARENT)
        pthread_mutex_unlock(&live_lock);
    else
        pthread_mutex_unlock(&live_lock);
}

static size_t live_home(loomComm_t c)
{
    uint64_t x = (uint64_t)(uintptr_t)c * 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 32) & (live_cap - 1);
}

/* The slot holding c, or of the empty slot where it would go (lock held, live_cap > 0). */
static size_t live_slot(loomComm_t c)
{
    size_t i = live_home(c);
    while (live_set[i] != NULL && live_set[i] != c)
        i = (i + 1) & (live_cap - 1);
    return i;
}

static bool live_add(loomComm_t c)
{
    core_fork_init();
    pthread_mutex_lock(&live_lock);
    if ((live_len + 1) * 2 > live_cap) {
        size_t ocap = live_cap, ncap = live_cap ? live_cap * 2 : 64;
        loomComm_t *old = live_set, *n = calloc(ncap, sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&live_lock);
            return false;
        }
        live_set = n;
        live_cap = ncap;
        for (size_t i = 0; i < ocap; i++)
            if (old[i]) live_set[live_slot(old[i])] = old[i];
        free(old);
    }
    size_t i = live_slot(c);
    if (live_set[i] == NULL) live_len++;
    live_set[i] = c;
    pthread_mutex_unlock(&live_lock);
    return true;
}

/* Removes c; true if it was there (once per communicator: a second destroy is refused). */
static bool live_del(loomComm_t c)
{
    pthread_mutex_lock(&live_lock);
    bool was = false;
    if (live_cap > 0) {
        size_t i = live_slot(c);
        if (live_set[i] == c) {
            was = true;
            live_set[i] = NULL;
            live_len--;
            /* Re-place the rest of the cluster so that lookups never stop at the hole. */
            for (size_t j = (i + 1) & (live_cap - 1); live_set[j]; j = (j + 1) & (live_cap - 1)) {
                loomComm_t m = live_set[j];
                live_set[j] = NULL;
                live_set[live_slot(m)] = m;
            }
        }
    }
    pthread_mutex_unlock(&live_lock);
    return was;
}

bool comm_live(loomComm_t comm)
{
    if (comm == NULL) return false;
    pthread_mutex_lock(&live_lock);
    bool live = live_cap > 0 && live_set[live_slot(comm)] == comm;
    pthread_mutex_unlock(&live_lock);
    return live;
}

void comm_ref(loomComm_t comm)
{
    atomic_fetch_add(&comm->st.refs, 1);
}

void comm_unref(loomComm_t comm)
{
    if (atomic_fetch_sub(&comm->st.refs, 1) == 1) comm_free(comm);
}

/* The end of the application's handle: refused from now on, freed once no open group holds
 * operations on it. False if it was not live. */
static bool comm_retire(loomComm_t comm)
{
    if (!live_del(comm)) return false;
    atomic_store(&comm->st.destroyed, 1);
    comm_unref(comm);
    return true;
}

/* The last call this thread saw refused because its communicator had already failed: the
 * communicator's cause, then which call it was (the cause may have come while this rank was
 * outside calls, and then names none). Keyed by pointer and id, so that a new communicator at a
 * reused address does not get an old one's text. */
static _Thread_local struct {
    loomComm_t comm;
    uint64_t id;
    char text[ERR_TEXT_MAX + 192];
} refused;

static void note_refused(loomComm_t comm, const char *fn)
{
    refused.comm = comm;
    refused.id = comm->lay.comm_id;
    bool p2p = strncmp(fn, "loomSend", 8) == 0 || strncmp(fn, "loomRecv", 8) == 0;
    snprintf(refused.text, sizeof(refused.text),
             "%s (this rank's %s, %s %llu%s, was refused: the communicator had failed before it)",
             comm->st.async_text, fn, p2p ? "after" : "which would have been collective seq",
             (unsigned long long)comm->seq.coll, p2p ? " collectives" : "");
    base_set_error_text(refused.text);
}

LOOM_EXPORT const char *loomGetLastError(loomComm_t comm)
{
    if (comm_live(comm) && atomic_load(&comm->st.async_error) != loomSuccess &&
        atomic_load(&comm->st.async_error) != loomInProgress) {
        if (refused.comm == comm && refused.id == comm->lay.comm_id) return refused.text;
        return comm->st.async_text;
    }
    return base_last_error();
}

loomResult_t comm_check(loomComm_t comm, const char *fn)
{
    if (comm == NULL) return base_error(loomInvalidArgument, LOG_COLL, "%s: comm is NULL", fn);
    if (!comm_live(comm))
        return base_error(loomInvalidArgument, LOG_COLL,
                          "%s: %p is not a live loom communicator (destroyed, or not one)", fn,
                          (void *)comm);
    if (comm->st.finalized)
        return base_error(loomInvalidUsage, LOG_COLL,
                          "%s: the communicator was finalized; only loomCommDestroy is allowed",
                          fn);
    if (comm->st.init_thread_live) {
        pthread_join(comm->st.init_thread, NULL);
        comm->st.init_thread_live = false;
    }
    loomResult_t a = (loomResult_t)atomic_load(&comm->st.async_error);
    if (a == loomInProgress) {
        base_set_error_text(comm->st.async_text);
        return a;
    }
    if (a != loomSuccess) {
        note_refused(comm, fn);
        return a;
    }
    if (atomic_load(&comm->st.aborting))
        return base_error(loomInvalidUsage, LOG_COLL, "%s: the communicator is being aborted", fn);
    return loomSuccess;
}

/* First error wins: stores it, tells the peers over the links, wakes a blocked wait. */
static void comm_store_error(loomComm_t comm, loomResult_t res, const char *text)
{
    pthread_mutex_lock(&comm->st.lock);
    bool first = atomic_load(&comm->st.async_error) == loomSuccess;
    if (first) {
        snprintf(comm->st.async_text, sizeof(comm->st.async_text), "%s", text);
        atomic_store(&comm->st.async_error, res);
    }
    pthread_mutex_unlock(&comm->st.lock);
    /* Tell the peers at once, so that they fail now with this reason instead of waiting for
     * LOOM_TIMEOUT; the communicator cannot be used any more. */
    if (first) {
        comm_abort_transports(comm, text);
        uint64_t one = 1;
        ssize_t n = write(comm->st.wake_fd, &one, sizeof(one));
        (void)n;
    }
}

void comm_set_error(loomComm_t comm, loomResult_t res, const char *text)
{
    if (atomic_load(&comm->st.async_error) != loomSuccess) return;
    /* The job-state service turns this rank's error, and every other rank's, into the job's
     * one verdict (the first cause, or the rank that died): wait for it (bounded), so that the
     * peers told over the links hear the same cause. */
    char job[ERR_TEXT_MAX];
    js_client_error(comm->js, text, job, sizeof(job));
    comm_store_error(comm, res, job);
}

/* The job-state client's hooks (jobstate.h). */
static void js_fail(void *arg, const char *text)
{
    loomComm_t comm = arg;
    WARN(LOG_COLL, "%s", text);
    comm_store_error(comm, loomRemoteError, text);
}

static bool js_line(void *arg, char *buf, size_t len)
{
    loomComm_t comm = arg;
    return exec_host_status(&comm->exech, buf, len);
}

static void js_current(void *arg, char *buf, size_t len)
{
    loomComm_t comm = arg;
    exec_host_current(&comm->exech, buf, len);
}

void comm_js_hooks(loomComm_t comm, js_hooks_t *hk)
{
    *hk = (js_hooks_t){.rank = comm->rank,
                       .nranks = comm->nranks,
                       .arg = comm,
                       .fail = js_fail,
                       .line = js_line,
                       .current = js_current};
}

void comm_abort_transports(loomComm_t comm, const char *reason)
{
    exec_host_lock(&comm->exech); /* the progress thread's keepalive moves them too */
    for (int t = 0; t < TP_MAX; t++)
        if (comm->net.tp[t].ctx) comm->net.tp[t].ops->abort(comm->net.tp[t].ctx, reason);
    nodeseg_abort(comm->net.seg, reason);
    exec_host_unlock(&comm->exech);
}

static const char *const tp_names[TP_MAX] = {"tcp", "shm", "mpi", "ucx"};

/* Same node: shared memory when started; other nodes: UCX where both ranks started it (only
 * on an RDMA fabric, see pick_transports), else TCP; LOOM_TRANSPORT forces one. */
static loomResult_t pick_link_transport(loomComm_t comm, int peer, int *tp)
{
    bool local = comm->lay.peers[peer].node_hash == comm->lay.peers[comm->rank].node_hash;
    if (comm->net.forced_tp >= 0) {
        if (comm->net.forced_tp == TP_SHM && !local)
            return base_error(loomInvalidUsage, LOG_NET,
                              "LOOM_TRANSPORT=shm, but rank %d is on another node (%s); shm "
                              "reaches only ranks of this node",
                              peer, comm->lay.peers[peer].host);
        *tp = comm->net.forced_tp;
    } else {
        *tp = local && comm->net.tp[TP_SHM].ctx && comm->lay.peers[peer].handle[TP_SHM][0] ? TP_SHM
                                                                                           : TP_TCP;
        if (!local && comm->net.tp[TP_UCX].ctx && comm->lay.peers[peer].handle[TP_UCX][0])
            *tp = TP_UCX;
    }
    if (comm->net.tp[*tp].ctx == NULL || comm->lay.peers[peer].handle[*tp][0] == 0)
        return base_error(loomInvalidUsage, LOG_NET,
                          "no common transport with rank %d (%s): it did not offer %s", peer,
                          comm->lay.peers[peer].host, tp_names[*tp]);
    return loomSuccess;
}

size_t comm_p2p_piece(loomComm_t comm, int peer)
{
    size_t slice = comm->tune.slice_bytes;
    int tp = TP_TCP;
    const exec_link_t *l = &comm->net.links[peer];
    const transport_ops_t *ops = l->conn ? l->ops : NULL;
    if (ops == NULL && peer != comm->rank && pick_link_transport(comm, peer, &tp) == loomSuccess)
        ops = comm->net.tp[tp].ops; /* (no transport: comm_conn says so when it connects) */
    return ops && ops->p2p_piece > slice ? ops->p2p_piece : slice;
}

loomResult_t comm_conn(loomComm_t comm, int peer, exec_link_t **link)
{
    exec_link_t *l = &comm->net.links[peer];
    if (l->conn == NULL) {
        int tp = TP_TCP;
        LOOM_CHECK(pick_link_transport(comm, peer, &tp));
        const transport_ops_t *ops = comm->net.tp[tp].ops;
        if (ops->connect_addr) {
            transport_peer_t pi = {.handle = comm->lay.peers[peer].handle[tp],
                                   .same_node = comm->lay.peers[peer].node_hash ==
                                                comm->lay.peers[comm->rank].node_hash};
            pi.addr = comm_peer_addr(comm, peer, tp, &pi.addr_len);
            LOOM_CHECK(ops->connect_addr(comm->net.tp[tp].ctx, peer, &pi, &l->conn));
        } else {
            LOOM_CHECK(ops->connect(comm->net.tp[tp].ctx, peer, comm->lay.peers[peer].handle[tp],
                                    &l->conn));
        }
        l->ops = comm->net.tp[tp].ops;
        TRACE(LOG_NET, "rank %d reaches rank %d over %s", comm->rank, peer, l->ops->name);
    }
    *link = l;
    return loomSuccess;
}

static loomComm_t comm_of_exec(exec_host_t *h)
{
    return (loomComm_t)((char *)h - offsetof(struct loomComm, exech));
}

static loomResult_t exec_conn(exec_host_t *h, int peer, exec_link_t **link)
{
    return comm_conn(comm_of_exec(h), peer, link);
}

static void exec_set_error(exec_host_t *h, loomResult_t res, const char *text)
{
    comm_set_error(comm_of_exec(h), res, text);
}

void comm_exec_fill(loomComm_t comm)
{
    exec_host_t *h = &comm->exech;
    h->rank = comm->rank;
    h->nranks = comm->nranks;
    h->nchannels = comm->tune.nchannels;
    h->slices_in_flight = comm->tune.slices_in_flight;
    h->timeout_s = comm->tune.timeout_s;
    h->links = comm->net.links;
    h->tp = comm->net.tp;
    h->ntp = TP_MAX;
    h->wake_fd = comm->st.wake_fd;
    h->aborting = &comm->st.aborting;
    h->stats = &comm->stats;
    h->conn = exec_conn;
    h->set_error = exec_set_error;
    h->async_error = &comm->st.async_error;
    h->async_text = comm->st.async_text;
    exec_host_init(h);
}

static loomResult_t parse_algo(int *algo);
static loomResult_t parse_deterministic(loomComm_t c);

void comm_free(loomComm_t comm)
{
    if (comm == NULL) return;
    if (comm->st.init_thread_live) pthread_join(comm->st.init_thread, NULL);
#ifdef LOOM_HAVE_CUDA
    dev_free(&comm->dev.host);
#endif
    js_client_stop(comm->js); /* a goodbye: a destroyed communicator is not a dead rank */
    comm->js = NULL;
    exec_keepalive_stop(&comm->exech);
    nodeseg_free(comm->net.seg);
    for (int t = 0; t < TP_MAX; t++)
        if (comm->net.tp[t].ctx) comm->net.tp[t].ops->fini(comm->net.tp[t].ctx);
    if (comm->st.wake_fd >= 0) close(comm->st.wake_fd);
    if (comm->net.shrink_fd >= 0) close(comm->net.shrink_fd);
    sched_free(&comm->cache.p2p);
    for (size_t i = 0; i < LOOM_ARRAY_SIZE(comm->cache.slot); i++)
        sched_free(&comm->cache.slot[i].s);
    exec_host_release(&comm->exech);
    free(comm->cache.tmp_buf);
    free(comm->lay.peers);
    free(comm->lay.addrs);
    free(comm->lay.addr_off);
    free(comm->net.my_addr);
    free(comm->net.links);
    free(comm->lay.node_of);
    free(comm->lay.node_start);
    free(comm->lay.node_ranks);
    free(comm->seq.p2p_send);
    free(comm->seq.p2p_recv);
    pthread_mutex_destroy(&comm->st.lock);
    comm->magic = COMM_DEAD_MAGIC;
    live_del(comm);
    free(comm);
}

/* Allocates a communicator with the parameters applied; no communication yet. */
loomResult_t comm_alloc(int nranks, int rank, const loomConfig_t *cfg, loomComm_t *out)
{
    loomComm_t c = calloc(1, sizeof(*c));
    if (c == NULL) return base_error(loomSystemError, LOG_INIT, "out of memory (communicator)");
    c->magic = COMM_MAGIC;
    c->rank = rank;
    c->nranks = nranks;
    c->st.wake_fd = -1;
    c->net.shrink_fd = -1;
    c->dev.cuda_dev = -1;
    pthread_mutex_init(&c->st.lock, NULL);
    atomic_init(&c->st.async_error, loomSuccess);
    atomic_init(&c->st.aborting, 0);
    atomic_init(&c->st.refs, 1);
    atomic_init(&c->st.destroyed, 0);
    c->lay.peers = calloc((size_t)nranks, sizeof(*c->lay.peers));
    c->net.links = calloc((size_t)nranks, sizeof(*c->net.links));
    c->net.forced_tp = -1;
    c->seq.p2p_send = calloc((size_t)nranks, sizeof(uint64_t));
    c->seq.p2p_recv = calloc((size_t)nranks, sizeof(uint64_t));
    c->st.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!c->lay.peers || !c->net.links || !c->seq.p2p_send || !c->seq.p2p_recv ||
        c->st.wake_fd < 0 || !live_add(c)) {
        comm_free(c);
        return base_error(loomSystemError, LOG_INIT, "out of memory or eventfd failed (%s)",
                          strerror(errno));
    }
    /* A device named in the config binds the communicator to it (its context is taken at the
     * first device call); otherwise the first device buffer decides. */
    if (cfg && cfg->cudaDev != LOOM_CONFIG_UNDEF_INT && cfg->cudaDev >= 0)
        c->dev.cuda_dev = cfg->cudaDev;
    c->tune.nchannels = (int)LOOM_MAX(1, LOOM_MIN(param_int(PARAM_NCHANNELS), 16));
    if (cfg && cfg->nChannels != LOOM_CONFIG_UNDEF_INT && cfg->nChannels > 0)
        c->tune.nchannels = LOOM_MIN(cfg->nChannels, 16);
    c->tune.slice_bytes = LOOM_MAX(param_size(PARAM_SLICE_SIZE), 64);
    c->tune.slice_bytes = LOOM_MIN(c->tune.slice_bytes, param_size(PARAM_MAX_MESSAGE));
    c->tune.slices_in_flight = (int)LOOM_MAX(1, LOOM_MIN(param_int(PARAM_SLICES_IN_FLIGHT), 64));
    c->tune.spin_ns = (uint64_t)LOOM_MAX(0, param_int(PARAM_SPIN_US)) * 1000;
    c->tune.hot_ns = PROGRESS_HOT_NS;
    c->tune.timeout_s = param_double(PARAM_TIMEOUT);
    snprintf(c->lay.name, sizeof(c->lay.name), "%s", cfg && cfg->commName ? cfg->commName : "");
    sched_init(&c->cache.p2p, rank, nranks);
    c->tune.last_pick = -1;
    c->tune.last_pick_rooted[0] = c->tune.last_pick_rooted[1] = -1;
    for (int m = 0; m < TUNE_NMEM; m++)
        tune_entry_clear(&c->tune.file[m]); /* until comm_layout reads LOOM_TUNE_FILE */
    loomResult_t ar = parse_algo(&c->tune.algo);
    if (ar == loomSuccess) ar = parse_deterministic(c);
    if (ar != loomSuccess) {
        comm_free(c);
        return ar;
    }
    comm_exec_fill(c);
    *out = c;
    return loomSuccess;
}

/* Which transports to start: the one LOOM_TRANSPORT names, or all that this build has except
 * those started only on request (mpi: it would initialise MPI in every program), UCX only where
 * it offers what tcp and shm lack (an RDMA device). */
static loomResult_t pick_transports(loomComm_t comm, bool want[TP_MAX])
{
    const char *name = param_str(PARAM_TRANSPORT);
    for (int t = 0; t < TP_MAX; t++)
        want[t] = name[0] == '\0' && t != TP_MPI && transport_by_name(tp_names[t]) != NULL;
    /* LOOM_SECURE=1 seals tcp's frames only: nothing may leave the node through another
     * transport (shm and CUDA IPC stay inside it). */
    const char *sv = param_str(PARAM_SECURE);
    if (strcmp(sv, "0") != 0 && strcmp(sv, "1") != 0)
        return base_error(loomInvalidUsage, LOG_INIT,
                          "LOOM_SECURE=%s: expected 0 (frames in clear) or 1 (every tcp frame "
                          "sealed); refused rather than guessed, so that a job that asked for "
                          "encryption never runs in clear",
                          sv);
    bool secure = sv[0] == '1';
    if (secure && (strcmp(name, "mpi") == 0 || strcmp(name, "ucx") == 0))
        return base_error(loomInvalidUsage, LOG_INIT,
                          "LOOM_SECURE=1 seals the tcp transport only, and LOOM_TRANSPORT=%s "
                          "would carry the data in clear: use LOOM_TRANSPORT=tcp or leave it "
                          "unset",
                          name);
    if (secure) want[TP_UCX] = false;
#ifdef LOOM_HAVE_UCX
    const char *rdma = NULL;
    if (want[TP_UCX] && !ucx_has_rdma(&rdma)) want[TP_UCX] = false;
    if (want[TP_UCX])
        INFO(LOG_NET, "ucx: RDMA transports found (%s): ranks on other nodes use ucx", rdma);
#endif
    if (name[0] == '\0') return loomSuccess;
    for (int t = 0; t < TP_MAX; t++)
        if (strcmp(name, tp_names[t]) == 0 && transport_by_name(name) != NULL) {
            want[t] = true;
            comm->net.forced_tp = t;
            return loomSuccess;
        }
    char avail[128] = "";
    size_t n, len = 0;
    const transport_ops_t *const *all = transport_all(&n);
    for (size_t i = 0; i < n && len < sizeof(avail); i++)
        len +=
            (size_t)snprintf(avail + len, sizeof(avail) - len, "%s%s", i ? ", " : "", all[i]->name);
    static const char *const later[] = {"mpi", "ucx", "ibv", "cuda"};
    for (size_t i = 0; i < LOOM_ARRAY_SIZE(later); i++)
        if (strcmp(name, later[i]) == 0)
            return base_error(loomInvalidUsage, LOG_INIT,
                              "LOOM_TRANSPORT=%s: this build of loom has no %s transport "
                              "(available: %s)",
                              name, name, avail);
    return base_error(loomInvalidArgument, LOG_INIT,
                      "LOOM_TRANSPORT=%s: unknown transport (available: %s)", name, avail);
}

loomResult_t comm_set_peer_addrs(loomComm_t comm, uint8_t *buf, size_t len)
{
    if (comm->lay.addrs != buf) free(comm->lay.addrs);
    free(comm->lay.addr_off);
    comm->lay.addrs = buf;
    comm->lay.addr_off = calloc((size_t)comm->nranks, sizeof(size_t));
    if (comm->lay.addr_off == NULL)
        return base_error(loomSystemError, LOG_INIT, "out of memory (transport addresses)");
    size_t off = 0;
    for (int q = 0; q < comm->nranks; q++) {
        comm->lay.addr_off[q] = off;
        off += comm->lay.peers[q].addr_bytes;
    }
    if (off != len)
        return base_error(loomInternalError, LOG_INIT,
                          "transport addresses: %zu bytes where the ranks announced %zu", len, off);
    return loomSuccess;
}

const uint8_t *comm_peer_addr(loomComm_t comm, int peer, int tp, size_t *len)
{
    *len = 0;
    if (comm->lay.addrs == NULL || comm->lay.addr_off == NULL) return NULL;
    const uint8_t *p = comm->lay.addrs + comm->lay.addr_off[peer];
    const uint8_t *end = p + comm->lay.peers[peer].addr_bytes;
    for (int t = 0; t < TP_MAX && end - p >= 4; t++) {
        uint32_t l;
        memcpy(&l, p, 4);
        p += 4;
        if ((size_t)(end - p) < l) return NULL;
        if (t == tp) {
            *len = l;
            return l ? p : NULL;
        }
        p += l;
    }
    return NULL;
}

/* Packs this rank's large addresses (comm_peer_addr's layout) into net.my_addr. */
static loomResult_t pack_addrs(loomComm_t comm)
{
    const void *a[TP_MAX] = {0};
    size_t l[TP_MAX] = {0}, total = 0;
    for (int t = 0; t < TP_MAX; t++) {
        if (comm->net.tp[t].ctx && comm->net.tp[t].ops->address)
            LOOM_CHECK(comm->net.tp[t].ops->address(comm->net.tp[t].ctx, &a[t], &l[t]));
        total += l[t];
    }
    free(comm->net.my_addr);
    comm->net.my_addr = NULL;
    comm->net.my_addr_len = 0;
    if (total == 0) return loomSuccess;
    total += 4 * TP_MAX;
    if (total > UINT32_MAX / 2)
        return base_error(loomInternalError, LOG_INIT, "transport addresses of %zu bytes", total);
    uint8_t *p = comm->net.my_addr = malloc(total);
    if (p == NULL) return base_error(loomSystemError, LOG_INIT, "out of memory (addresses)");
    for (int t = 0; t < TP_MAX; t++) {
        uint32_t n = (uint32_t)l[t];
        memcpy(p, &n, 4);
        if (n) memcpy(p + 4, a[t], n);
        p += 4 + n;
    }
    comm->net.my_addr_len = (uint32_t)total;
    return loomSuccess;
}

/* Starts the transports for `comm`, writing this rank's connection handles. */
loomResult_t comm_start_transport(loomComm_t comm, uint8_t handles[TP_MAX][TRANSPORT_HANDLE_BYTES])
{
    bool want[TP_MAX];
    LOOM_CHECK(pick_transports(comm, want));
    transport_setup_t setup = {
        .rank = comm->rank,
        .nranks = comm->nranks,
        .comm_id = comm->lay.comm_id,
        /* comm_tune_for_cores may raise the slice 4x once the layout is
         * known */
        .max_message = LOOM_MIN(comm->tune.slice_bytes * 4, param_size(PARAM_MAX_MESSAGE)),
        .call_state = &comm->exech.call_state};
    memcpy(setup.secret, comm->lay.secret, 16);
    if (want[TP_TCP]) {
        sock_addr_t a;
        char ifname[64];
        LOOM_CHECK(sock_pick_address(&a, ifname, sizeof(ifname)));
        setup.bind = a.sa;
        setup.bind_len = a.len;
    }
    for (int t = 0; t < TP_MAX; t++) {
        memset(handles[t], 0, TRANSPORT_HANDLE_BYTES);
        if (!want[t]) continue;
        const transport_ops_t *ops = transport_by_name(tp_names[t]);
        if (ops == NULL) continue;
        /* (a transport's point-to-point pieces are messages it gets too) */
        transport_setup_t st = setup;
        st.max_message = LOOM_MAX(st.max_message, ops->p2p_piece);
        loomResult_t r = ops->init(&st, &comm->net.tp[t].ctx, handles[t]);
        if (r != loomSuccess) {
            /* Shared memory is an optimisation: without it, TCP still reaches every peer. */
            if (t == TP_SHM && comm->net.forced_tp != TP_SHM) {
                WARN(LOG_SHM, "shm transport unavailable (%s); same-node peers use tcp",
                     base_last_error());
                memset(handles[t], 0, TRANSPORT_HANDLE_BYTES);
                comm->net.tp[t].ctx = NULL;
                continue;
            }
            /* So is UCX when it was not asked for: TCP still reaches every node. */
            if (t == TP_UCX && comm->net.forced_tp != TP_UCX) {
                WARN(LOG_NET, "ucx transport unavailable (%s); other nodes use tcp",
                     base_last_error());
                memset(handles[t], 0, TRANSPORT_HANDLE_BYTES);
                comm->net.tp[t].ctx = NULL;
                continue;
            }
            return r;
        }
        comm->net.tp[t].ops = ops;
    }
    LOOM_CHECK(pack_addrs(comm));
    /* Heartbeats and the peers' connections are served between calls too. */
    return exec_keepalive_start(&comm->exech);
}

/* LOOM_TUNE_FILE's contents hashed, for the peers' agreement: 0 when unset, a fixed value when
 * unreadable (tunefile_read then says why). */
static uint32_t tune_file_hash(void)
{
    const char *path = param_str(PARAM_TUNE_FILE);
    if (!path[0]) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    uint64_t h = 0x746e7566;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        h = base_hash64(buf, n, h);
    fclose(f);
    return (uint32_t)(h ^ (h >> 32)) | 2u;
}

/* The tuning file's sections for this communicator, per memory type. Every rank must apply the
 * same constants (the model's choice shapes the schedule): ranks whose files differ all fall
 * back to the built-in defaults, and rank 0 says which rank differs. */
static void comm_tune_load(loomComm_t comm)
{
    memset(comm->tune.picks, 0, sizeof(comm->tune.picks)); /* the model may change */
    for (int m = 0; m < TUNE_NMEM; m++)
        tune_entry_clear(&comm->tune.file[m]);
    const char *path = param_str(PARAM_TUNE_FILE);
    for (int q = 1; q < comm->nranks; q++)
        if (comm->lay.peers[q].tune_hash != comm->lay.peers[0].tune_hash) {
            if (comm->rank == 0)
                WARN(LOG_TUNING,
                     "LOOM_TUNE_FILE: rank %d (%s) reads %s than rank 0 (%s): no rank uses a "
                     "tuning file; the built-in defaults apply",
                     q, comm->lay.peers[q].host,
                     comm->lay.peers[q].tune_hash == 0 ? "no file, other" : "a different file",
                     path[0] ? path : "unset");
            return;
        }
    if (!path[0]) return;
    for (int m = 0; m < TUNE_NMEM; m++) {
        tune_key_t k = tune_key_of(comm->nranks, comm->lay.nnodes, comm->lay.node_start, m);
        if (!tunefile_read(path, &k, &comm->tune.file[m], m == 0)) return;
    }
    const tune_entry_t *h = &comm->tune.file[TUNE_MEM_HOST];
    if (h->sections)
        INFO(LOG_TUNING, "tuning file %s: %d section%s for %d ranks on %d nodes (last: %s)", path,
             h->sections, h->sections > 1 ? "s" : "", comm->nranks, comm->lay.nnodes, h->where);
}

static void comm_tune_for_cores(loomComm_t comm);

/* Node layout from the peers' node identities: nodes numbered in order of their first rank;
 * then the tuning that depends on it (the tuning file's sections, the cores per rank). */
loomResult_t comm_layout(loomComm_t comm)
{
    int p = comm->nranks;
    free(comm->lay.node_of);
    free(comm->lay.node_start);
    free(comm->lay.node_ranks);
    comm->lay.node_of = malloc((size_t)p * sizeof(int));
    comm->lay.node_start = calloc((size_t)p + 1, sizeof(int));
    comm->lay.node_ranks = malloc((size_t)p * sizeof(int));
    if (!comm->lay.node_of || !comm->lay.node_start || !comm->lay.node_ranks)
        return base_error(loomSystemError, LOG_INIT, "out of memory (layout)");
    int nnodes = 0;
    for (int r = 0; r < p; r++) {
        int n = -1;
        for (int q = 0; q < r && n < 0; q++)
            if (comm->lay.peers[q].node_hash == comm->lay.peers[r].node_hash)
                n = comm->lay.node_of[q];
        comm->lay.node_of[r] = n >= 0 ? n : nnodes++;
    }
    int *count = comm->lay.node_start + 1;
    for (int r = 0; r < p; r++)
        count[comm->lay.node_of[r]]++;
    for (int n = 0; n < nnodes; n++)
        comm->lay.node_start[n + 1] += comm->lay.node_start[n];
    int *fill = calloc((size_t)nnodes, sizeof(int));
    if (fill == NULL) return base_error(loomSystemError, LOG_INIT, "out of memory (layout)");
    for (int r = 0; r < p; r++) {
        int n = comm->lay.node_of[r];
        comm->lay.node_ranks[comm->lay.node_start[n] + fill[n]++] = r;
    }
    free(fill);
    comm->lay.nnodes = nnodes;
    comm->lay.node = comm->lay.node_of[comm->rank];
    comm->lay.local_size =
        comm->lay.node_start[comm->lay.node + 1] - comm->lay.node_start[comm->lay.node];
    comm->lay.local_rank = 0;
    while (comm->lay.node_ranks[comm->lay.node_start[comm->lay.node] + comm->lay.local_rank] !=
           comm->rank)
        comm->lay.local_rank++;
    comm_tune_load(comm);
    comm_tune_for_cores(comm); /* init's, split's and shrink's communicators alike */
    if (comm->rank == 0 && log_enabled(LOG_INFO, LOG_INIT)) {
        char line[512];
        for (int n = 0; n < nnodes; n++) {
            int o = snprintf(line, sizeof(line), "node %d (%s): ranks", n,
                             comm->lay.peers[comm->lay.node_ranks[comm->lay.node_start[n]]].host);
            for (int i = comm->lay.node_start[n]; i < comm->lay.node_start[n + 1] && o < 480; i++)
                o += snprintf(line + o, sizeof(line) - (size_t)o, " %d", comm->lay.node_ranks[i]);
            INFO(LOG_INIT, "layout: %s", line);
        }
    }
    return loomSuccess;
}

sched_topo_t comm_topo(loomComm_t comm)
{
    sched_topo_t t = {.nnodes = comm->lay.nnodes,
                      .node_of = comm->lay.node_of,
                      .node_start = comm->lay.node_start,
                      .node_ranks = comm->lay.node_ranks};
    return t;
}

static loomResult_t parse_algo(int *algo)
{
    return registry_parse(param_str(PARAM_ALGO), algo);
}

/* LOOM_DETERMINISTIC: 0 or 1, anything else refused (a job that asked for reproducible sums
 * must not quietly get the fastest order instead). Said once per communicator at INFO. */
static loomResult_t parse_deterministic(loomComm_t c)
{
    const char *v = param_str(PARAM_DETERMINISTIC);
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return base_error(loomInvalidUsage, LOG_INIT,
                          "LOOM_DETERMINISTIC=%s: expected 0 (the fastest reduction order) or 1 "
                          "(the left fold in rank order, bitwise reproducible)",
                          v);
    c->tune.deterministic = v[0] == '1';
    if (c->tune.deterministic)
        INFO(LOG_TUNING,
             "LOOM_DETERMINISTIC=1: allreduce, reduce and reduce-scatter fold the inputs in rank "
             "order (algorithm determ) whatever the size, layout%s%s%s; reductions of device "
             "memory are refused",
             c->tune.algo != ALGO_AUTO ? " and LOOM_ALGO=" : "",
             c->tune.algo != ALGO_AUTO ? registry_get(c->tune.algo)->name : "",
             c->tune.algo != ALGO_AUTO ? " (not used for them)" : "");
    return loomSuccess;
}

/*
 * What the registry's model sees of this communicator. Each constant is the tuning file's
 * measured one when the file has it (loom-tune --model), else the built-in default. Inside a node
 * the defaults are measurements: the medians of 5 runs of `loom-tune --model -P 4` on the
 * reference host (the 16 idle cores of the nvidia-h200 machine, 2026-12-03, tree c8f550e,
 * `perf/quiet-host.sh ref`, perf/RESULTS.md): shared memory 1.78 us and 6.89 GB/s, tcp over
 * loopback 6.07 us and 5.92 GB/s, and gamma = 1/(3.78 GB/s), the host's reduction of one output
 * byte. (Those measured with the tree of 2026-12-01, 9.87 us for shared memory, made every small
 * call look 5 times dearer than it now is, and the model took rd where rabenseifner won.) Across
 * nodes no reference network has been measured: the link there is the transport's own hint (tcp 30
 * us and 1 GB/s, a conservative estimate of a 10 Gbit/s class Ethernet path; the other transports'
 * hints alike), which a tuning file measured on the cluster replaces. The node-local link is shm
 * when it is started, else the network transport inside the node (tcp's loopback constants when
 * that transport is tcp).
 */
typedef struct {
    double alpha_s, beta_s_per_byte;
} ref_link_t;
static const ref_link_t ref_shm_local = {1.78e-6, 1.0 / 6.89e9};
static const ref_link_t ref_tcp_local = {6.07e-6, 1.0 / 5.92e9};
static const double ref_gamma = 1.0 / 3.78e9;

static registry_model_t comm_model(loomComm_t comm)
{
    const transport_ops_t *net = comm->net.forced_tp >= 0 && comm->net.tp[comm->net.forced_tp].ops
                                     ? comm->net.tp[comm->net.forced_tp].ops
                                 : comm->net.tp[TP_TCP].ops ? comm->net.tp[TP_TCP].ops
                                                            : &transport_tcp;
    const transport_ops_t *loc = comm->net.tp[TP_SHM].ops ? comm->net.tp[TP_SHM].ops : net;
    bool shm = loc != net;
    const tune_entry_t *f = &comm->tune.file[TUNE_MEM_HOST];
    int lt = shm ? TUNE_SHM : TUNE_TCP;
    ref_link_t hint = {loc->latency_us * 1e-6, 1.0 / (loc->bw_GBps * 1e9)};
    const ref_link_t *ref_loc = shm                     ? &ref_shm_local
                                : loc == &transport_tcp ? &ref_tcp_local
                                                        : &hint;
    bool measured = false;
#define PICK(meas, dflt) ((meas) >= 0 ? (measured = true, (meas)) : (dflt))
    registry_model_t m = {.nranks = comm->nranks,
                          .nnodes = comm->lay.nnodes,
                          .a_net = PICK(f->alpha[TUNE_TCP][TUNE_NET], net->latency_us * 1e-6),
                          .b_net = PICK(f->beta[TUNE_TCP][TUNE_NET], 1.0 / (net->bw_GBps * 1e9)),
                          .a_loc = PICK(f->alpha[lt][TUNE_LOCAL], ref_loc->alpha_s),
                          .b_loc = PICK(f->beta[lt][TUNE_LOCAL], ref_loc->beta_s_per_byte),
                          .gamma = PICK(f->gamma, ref_gamma),
                          .shared_mem = shm,
                          .seg_bytes = nodeseg_max_bytes(comm->net.seg)};
#undef PICK
    m.source = measured ? f->where
                        : "built-in defaults (node-local: measured on the reference host; across "
                          "nodes: the transport's estimate)";
    /* The wake-up of blocked ranks on an oversubscribed node is added to the built-in latencies
     * only: latencies measured there (loom-tune --model's ping-pong) already contain it. */
    m.oversubscribed = comm->tune.oversubscribed && !measured;
    return m;
}

const char *comm_algo_unfit(loomComm_t comm, int algo, uint64_t bytes)
{
    registry_model_t m = comm_model(comm);
    return registry_unfit(&m, algo, bytes);
}

/* The tuning file's measured winner for this size (loom-tune --algos), where the communicator
 * can run it (else -1: the model decides); *from: where the winner's row starts. */
static int table_pick(loomComm_t comm, const registry_model_t *m, uint64_t bytes, uint64_t *from)
{
    const tune_entry_t *f = &comm->tune.file[TUNE_MEM_HOST];
    int id = tune_entry_algo(f, bytes);
    if (id < 0 || registry_unfit(m, id, bytes) != NULL) return -1;
    if (from)
        for (int i = 0; i < f->nalgos && f->algo_from[i] <= bytes; i++)
            *from = f->algo_from[i];
    return id;
}

int comm_pick_allreduce(loomComm_t comm, uint64_t bytes)
{
    if (comm->tune.deterministic) return ALGO_DETERM;
    if (comm->tune.algo != ALGO_AUTO) return comm->tune.algo;
    if (comm->nranks == 1) return ALGO_RING;
    size_t slot = (size_t)((bytes * 0x9e3779b97f4a7c15ull) >> 60);
    int pick;
    if (comm->tune.picks[slot].algo1 > 0 && comm->tune.picks[slot].bytes == bytes) {
        pick = comm->tune.picks[slot].algo1 - 1;
    } else {
        registry_model_t m = comm_model(comm);
        pick = table_pick(comm, &m, bytes, NULL);
        if (pick < 0) pick = registry_pick(&m, bytes);
        comm->tune.picks[slot].bytes = bytes;
        comm->tune.picks[slot].algo1 = pick + 1;
    }
    /* Said at INFO when the choice changes (sizes sweep through it once), else at TRACE. */
    log_level_t lvl = pick != comm->tune.last_pick ? LOG_INFO : LOG_TRACE;
    comm->tune.last_pick = pick;
    if (log_enabled(lvl, LOG_TUNING)) {
        registry_model_t m = comm_model(comm);
        char why[1024], table[384] = "";
        uint64_t from = 0;
        const tune_entry_t *f = &comm->tune.file[TUNE_MEM_HOST];
        int t = table_pick(comm, &m, bytes, &from);
        if (t >= 0)
            snprintf(table, sizeof(table),
                     "taken from the tuning file's measured table (%s: %s from %llu bytes); the "
                     "model's view: ",
                     f->where, registry_get(t)->name, (unsigned long long)from);
        else if (f->nalgos > 0 && tune_entry_algo(f, bytes) >= 0)
            snprintf(table, sizeof(table),
                     "the tuning file's table names %s here, which cannot run it (%s); ",
                     registry_get(tune_entry_algo(f, bytes))->name,
                     registry_unfit(&m, tune_entry_algo(f, bytes), bytes));
        LOG(lvl, LOG_TUNING, "allreduce of %llu bytes on %d ranks / %d nodes: %s%s [constants: %s]",
            (unsigned long long)bytes, comm->nranks, comm->lay.nnodes, table,
            registry_explain(&m, bytes, pick, why, sizeof(why)), m.source);
    }
    return pick;
}

int comm_pick_rooted(loomComm_t comm, int op, uint64_t bytes, int root)
{
    int forced = registry_rooted_forced(comm->tune.algo, op);
    if (forced >= 0) return forced;
    if (comm->nranks == 1) return ALGO_RING;
    registry_model_t m = comm_model(comm);
    int pick = registry_pick_rooted(&m, op, bytes);
    log_level_t lvl = pick != comm->tune.last_pick_rooted[op] ? LOG_INFO : LOG_TRACE;
    comm->tune.last_pick_rooted[op] = pick;
    if (log_enabled(lvl, LOG_TUNING)) {
        char why[1024];
        LOG(lvl, LOG_TUNING,
            "%s of %llu bytes %s root %d on %d ranks / %d nodes: %s [constants: %s]",
            op == ROOTED_REDUCE ? "reduce" : "broadcast", (unsigned long long)bytes,
            op == ROOTED_REDUCE ? "to" : "from", root, comm->nranks, comm->lay.nnodes,
            registry_explain_rooted(&m, op, bytes, pick, why, sizeof(why)), m.source);
    }
    return pick;
}

void comm_fusion_sizes(loomComm_t comm, int mem, uint64_t *bucket, uint64_t *segment)
{
    const tune_entry_t *f = &comm->tune.file[mem >= 0 && mem < TUNE_NMEM ? mem : 0];
    *bucket = !param_is_set(PARAM_FUSION_BUCKET) && f->fusion_threshold
                  ? f->fusion_threshold
                  : param_size(PARAM_FUSION_BUCKET);
    *segment = !param_is_set(PARAM_FUSION_SEGMENT) && f->fusion_segment
                   ? f->fusion_segment
                   : param_size(PARAM_FUSION_SEGMENT);
}

/*
 * Machines with more ranks than cores: a rank that spins without yielding keeps the core from the
 * very peer it waits for, and one that sleeps at once pays a wake-up on every step (8 ranks on
 * 2 cores, 8 B: 292-407 us asleep, 65 us yielding). Such a machine's ranks spin
 * COMM_SPIN_SHARED_NS yielding the core on every pass (LOOM_SPIN_US, when set, sets the length;
 * the yield stays). And when any machine of the job is oversubscribed, every rank uses
 * 4x slices (fewer wake-ups; 4 ranks over 2 cores: ~190 -> ~170 ms for 64 MiB over TCP), unless
 * LOOM_SLICE_SIZE is set: the slice shapes the schedule, so the decision uses every rank's core
 * count from the bootstrap and comes out the same everywhere.
 */
static void comm_tune_for_cores(loomComm_t comm)
{
    /* Counted per machine (host and boot id), not per node: the network namespaces of one host
     * (containers, scripts/testbed.sh) are nodes of their own that share its cores. A machine
     * is whole nodes, each known by its first rank's word; every rank counts from the same
     * bootstrap table, so `any` (which sets the slice) comes out the same everywhere. */
    const comm_layout_t *l = &comm->lay;
    uint32_t me = l->peers[comm->rank].machine;
    int here = 0;
    bool any = false;
    for (int n = 0; n < l->nnodes; n++) {
        const peer_info_t *first = &l->peers[l->node_ranks[l->node_start[n]]];
        int count = 0;
        for (int m = 0; m < l->nnodes; m++)
            if (l->peers[l->node_ranks[l->node_start[m]]].machine == first->machine)
                count += l->node_start[m + 1] - l->node_start[m];
        if (first->cores > 0 && count > first->cores) any = true;
        if (first->machine == me) here = count;
    }
    if (here == 0) here = l->local_size; /* a LOOM_NODE_ID node across machines */
    comm->tune.oversubscribed = any;
    memset(comm->tune.picks, 0, sizeof(comm->tune.picks)); /* the model changed */
    int mine = comm->lay.peers[comm->rank].cores;
    if (mine > 0 && here > mine) {
        comm->tune.hot_ns = 0;
        if (!param_is_set(PARAM_SPIN_US)) comm->tune.spin_ns = COMM_SPIN_SHARED_NS;
    }
    if (any && !param_is_set(PARAM_SLICE_SIZE))
        comm->tune.slice_bytes =
            LOOM_MIN(comm->tune.slice_bytes * 4, param_size(PARAM_MAX_MESSAGE));
    if (any)
        INFO(LOG_TUNING, "a machine has more ranks than cores: %llu-byte slices job-wide%s",
             (unsigned long long)comm->tune.slice_bytes,
             comm->tune.hot_ns == 0 ? ", spinning here with a yield on every pass" : "");
}

/*
 * The node segment (nodeseg.h), for a communicator made by init, split or shrink whose ranks share
 * one node: every rank maps rank 0's, then one allgather says whether all did (each rank's own
 * reason is its INFO line). Uses of it must be the same on every rank, so a rank that cannot map it
 * takes it from all. The allgather is not one of the application's collectives: the operation count
 * and the statistics are put back.
 */
loomResult_t comm_seg_setup(loomComm_t comm, int fd)
{
    const peer_info_t *p0 = &comm->lay.peers[0];
    /* (LOOM_TRANSPORT and the shm transport are the job's configuration, the same on every
     * rank: no exchange when they rule the segment out) */
    if (comm->lay.nnodes != 1 || comm->nranks < 2 || p0->seg.nonce == 0 ||
        comm->net.forced_tp >= 0 || comm->net.tp[TP_SHM].ctx == NULL) {
        if (fd >= 0) close(fd);
        if (p0->seg.nonce && comm->lay.nnodes == 1)
            INFO(LOG_INIT, "no node segment: %s",
                 comm->net.forced_tp >= 0 ? "LOOM_TRANSPORT is set" : "no shared-memory transport");
        return loomSuccess;
    }
    const char *why = NULL;
    nodeseg_t *s = NULL;
    int32_t *pids = malloc((size_t)comm->nranks * sizeof(*pids));
    if (pids == NULL) {
        why = "out of memory";
    } else {
        for (int q = 0; q < comm->nranks; q++)
            pids[q] = comm->lay.peers[q].pid;
        s = nodeseg_attach(&comm->exech, &p0->seg, fd, pids, &why);
        free(pids);
    }
    uint8_t ok = s != NULL, *all = malloc((size_t)comm->nranks);
    if (all == NULL) {
        nodeseg_free(s);
        if (fd >= 0) close(fd);
        return base_error(loomSystemError, LOG_INIT, "out of memory");
    }
    uint64_t seq = comm->seq.coll;
    loomStats_t stats = comm->stats;
    /* the hang report's last operations are the application's */
    exec_host_t *h = &comm->exech;
    exec_host_lock(h);
    exec_report_t rep = h->rep;
    exec_host_unlock(h);
    const void *send = &ok;
    void *recv = all;
    loomResult_t r = coll_allgather_many(&comm, &send, &recv, 1, 1);
    comm->seq.coll = seq;
    comm->stats = stats;
    exec_host_lock(h);
    h->rep = rep;
    exec_host_unlock(h);
    if (fd >= 0) close(fd); /* every rank has opened it (or given up) */
    int lacking = -1;
    for (int q = 0; r == loomSuccess && q < comm->nranks && lacking < 0; q++)
        if (!all[q]) lacking = q;
    free(all);
    if (r != loomSuccess || lacking >= 0) {
        nodeseg_free(s);
        if (r == loomSuccess && !ok)
            INFO(LOG_INIT, "no node segment: %s", why);
        else if (r == loomSuccess)
            INFO(LOG_INIT, "no node segment: rank %d could not map it (its log says why)", lacking);
        return r;
    }
    /* Under the lock that comm_abort_transports takes: the job-state service's verdict may
     * arrive on the progress thread while init is still here (ThreadSanitizer found the race). */
    exec_host_lock(&comm->exech);
    comm->net.seg = s;
    exec_host_unlock(&comm->exech);
    memset(comm->tune.picks, 0, sizeof(comm->tune.picks)); /* the model changed */
    INFO(LOG_INIT, "node segment: allreduce up to %zu bytes through one shared segment of %d ranks",
         nodeseg_max_bytes(s), comm->nranks);
    return loomSuccess;
}

typedef struct {
    loomComm_t comm;
    uid_layout_t uid;
} init_args_t;

static loomResult_t comm_init_body(loomComm_t comm, const uid_layout_t *uid)
{
    log_set_rank(comm->rank);
    memcpy(comm->lay.secret, uid->secret, 16);
    comm->lay.comm_id = base_hash64(&uid->job_id, sizeof(uid->job_id), 0x776f726c64);
    peer_info_t mine;
    memset(&mine, 0, sizeof(mine));
    mine.rank = comm->rank;
    mine.node_hash = boot_node_hash(mine.host, sizeof(mine.host), &mine.machine);
    mine.cores = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    mine.tune_hash = tune_file_hash();
    /* A list in LOOM_NODE_ID ("a,a,b,b") gives rank r the r-th name: one process can then hold
     * the ranks of several pretend nodes (tests of hierarchical algorithms). */
    const char *ids = param_str(PARAM_NODE_ID);
    if (strchr(ids, ',')) {
        const char *p = ids;
        for (int i = 0; i < comm->rank && p; i++) {
            p = strchr(p, ',');
            if (p) p++;
        }
        if (p == NULL)
            return base_error(loomInvalidUsage, LOG_INIT,
                              "LOOM_NODE_ID='%s' lists fewer names than there are ranks", ids);
        size_t len = strcspn(p, ",");
        mine.node_hash = base_hash64(p, len, 0x6e6f6465);
    }
    mine.gpu_dev = -1;
#ifdef LOOM_HAVE_CUDA
    /* A GPU named at init is known to the others at once, so that two ranks on one GPU fail
     * here, as NCCL's "duplicate GPU" does (no context is created for this). */
    const cudrv_t *d = comm->dev.cuda_dev >= 0 ? cudrv_get(NULL) : NULL;
    CUdevice dv;
    CUuuid uu;
    if (d && d->cuDeviceGet(&dv, comm->dev.cuda_dev) == CUDA_SUCCESS &&
        d->cuDeviceGetUuid(&uu, dv) == CUDA_SUCCESS) {
        memcpy(mine.gpu_uuid, uu.bytes, 16);
        mine.gpu_dev = comm->dev.cuda_dev;
    }
#endif
    LOOM_CHECK(comm_start_transport(comm, mine.handle));
    mine.addr_bytes = comm->net.my_addr_len;
    LOOM_CHECK(comm_shrink_listen(comm, mine.shrink_addr));
    mine.pid = (int32_t)getpid();
    int seg_fd = comm->rank == 0 ? nodeseg_create(comm->nranks, &mine.seg) : -1;
    loomResult_t br = boot_rendezvous(comm, uid, &mine);
    if (br == loomSuccess) br = comm_layout(comm);
    if (br != loomSuccess) {
        if (seg_fd >= 0) close(seg_fd);
        return br;
    }
    for (int q = 0; q < comm->nranks; q++) {
        const peer_info_t *p = &comm->lay.peers[q];
        if (q == comm->rank || mine.gpu_dev < 0 || p->gpu_dev < 0 ||
            param_int(PARAM_CUDA_SHARE_GPU) ||
            p->node_hash != comm->lay.peers[comm->rank].node_hash ||
            memcmp(p->gpu_uuid, mine.gpu_uuid, 16) != 0)
            continue;
        return base_error(loomInvalidUsage, LOG_INIT,
                          "rank %d and rank %d of this communicator are both on the same GPU "
                          "(device %d here, device %d there): one rank per GPU",
                          comm->rank, q, mine.gpu_dev, p->gpu_dev);
    }
    LOOM_CHECK(comm_seg_setup(comm, seg_fd));
    INFO(LOG_INIT,
         "loom %d.%d.%d: rank %d of %d ready (node %d of %d, local rank %d of %d), transport %s, "
         "%d channels, slice %llu bytes",
         LOOM_MAJOR, LOOM_MINOR, LOOM_PATCH, comm->rank, comm->nranks, comm->lay.node,
         comm->lay.nnodes, comm->lay.local_rank, comm->lay.local_size,
         comm->net.forced_tp >= 0   ? tp_names[comm->net.forced_tp]
         : comm->net.tp[TP_UCX].ctx ? "shm in node, ucx across"
                                    : "shm in node, tcp across",
         comm->tune.nchannels, (unsigned long long)comm->tune.slice_bytes);
    return loomSuccess;
}

static void *init_thread_main(void *arg)
{
    init_args_t *a = arg;
    loomResult_t r = comm_init_body(a->comm, &a->uid);
    if (r != loomSuccess) {
        snprintf(a->comm->st.async_text, sizeof(a->comm->st.async_text), "%s", base_last_error());
    }
    atomic_store(&a->comm->st.async_error, r);
    free(a);
    return NULL;
}

/* Reads the fields of a caller's config that its size covers (older headers have fewer). */
loomResult_t comm_config_read(const loomConfig_t *in, loomConfig_t *out)
{
    loomConfig_t def = LOOM_CONFIG_INITIALIZER;
    *out = def;
    if (in == NULL) return loomSuccess;
    if (in->magic != LOOM_CONFIG_MAGIC)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "config: bad magic 0x%08x (initialise it with LOOM_CONFIG_INITIALIZER)",
                          in->magic);
    size_t prefix = offsetof(loomConfig_t, blocking);
    if (in->size < prefix)
        return base_error(loomInvalidArgument, LOG_INIT, "config: size %zu is too small", in->size);
    size_t n = LOOM_MIN(in->size, sizeof(loomConfig_t));
    memcpy((char *)out + prefix, (const char *)in + prefix, n - prefix);
    out->size = sizeof(loomConfig_t);
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommInitRankConfig(loomComm_t *out, int nranks, loomUniqueId id,
                                                int rank, loomConfig_t *config)
{
    base_clear_error();
    if (out == NULL)
        return base_error(loomInvalidArgument, LOG_INIT, "loomCommInitRank: comm is NULL");
    if (nranks < 1)
        return base_error(loomInvalidArgument, LOG_INIT, "loomCommInitRank: nranks %d < 1", nranks);
    if (rank < 0 || rank >= nranks)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommInitRank: rank %d is outside [0, %d)", rank, nranks);
    loomConfig_t cfg;
    LOOM_CHECK(comm_config_read(config, &cfg));
    uid_layout_t uid;
    LOOM_CHECK(boot_uid_parse(&id, &uid));
    loomComm_t comm;
    LOOM_CHECK(comm_alloc(nranks, rank, &cfg, &comm));
    if (cfg.blocking == 0) {
        init_args_t *a = malloc(sizeof(*a));
        if (a == NULL) {
            comm_free(comm);
            return base_error(loomSystemError, LOG_INIT, "out of memory");
        }
        a->comm = comm;
        a->uid = uid;
        atomic_store(&comm->st.async_error, loomInProgress);
        int e = pthread_create(&comm->st.init_thread, NULL, init_thread_main, a);
        if (e != 0) {
            free(a);
            comm_free(comm);
            return base_error(loomSystemError, LOG_INIT, "pthread_create: %s", strerror(e));
        }
        comm->st.init_thread_live = true;
        *out = comm;
        return loomInProgress;
    }
    loomResult_t r = comm_init_body(comm, &uid);
    if (r != loomSuccess) {
        comm_free(comm);
        return r;
    }
    *out = comm;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommInitFromEnv(loomComm_t *comm, loomConfig_t *config)
{
    base_clear_error();
    loomUniqueId id;
    int rank, nranks;
    LOOM_CHECK(launch_uid_from_env(&id, &rank, &nranks));
    return loomCommInitRankConfig(comm, nranks, id, rank, config);
}

LOOM_EXPORT loomResult_t loomCommInitRank(loomComm_t *comm, int nranks, loomUniqueId id, int rank)
{
    return loomCommInitRankConfig(comm, nranks, id, rank, NULL);
}

typedef struct {
    loomComm_t *slot;
    int n, rank;
    loomUniqueId id;
    loomResult_t res;
    char err[ERR_TEXT_MAX];
} init_all_arg_t;

static void *init_all_main(void *p)
{
    init_all_arg_t *a = p;
    a->res = loomCommInitRank(a->slot, a->n, a->id, a->rank);
    if (a->res != loomSuccess) snprintf(a->err, sizeof(a->err), "%s", base_last_error());
    return NULL;
}

LOOM_EXPORT loomResult_t loomCommInitAll(loomComm_t *comms, int ndev, const int *devlist)
{
    base_clear_error();
    if (comms == NULL || ndev < 1)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommInitAll: comms is NULL or ndev %d < 1", ndev);
    if (devlist)
        for (int i = 0; i < ndev; i++)
            for (int j = 0; j <= i; j++)
                if (devlist[i] < 0 || (j < i && devlist[i] == devlist[j]))
                    return base_error(loomInvalidArgument, LOG_INIT,
                                      "loomCommInitAll: device %d is listed twice or negative",
                                      devlist[i]);
    loomUniqueId id;
    LOOM_CHECK(loomGetUniqueId(&id));
    init_all_arg_t *a = calloc((size_t)ndev, sizeof(*a));
    pthread_t *t = calloc((size_t)ndev, sizeof(*t));
    if (a == NULL || t == NULL) {
        free(a);
        free(t);
        return base_error(loomSystemError, LOG_INIT, "out of memory");
    }
    /* Each rank's init blocks until all have joined, so each gets a thread. */
    int started = 0;
    loomResult_t res = loomSuccess;
    for (int i = 0; i < ndev; i++) {
        a[i] = (init_all_arg_t){.slot = &comms[i], .n = ndev, .rank = i, .id = id};
        if (pthread_create(&t[i], NULL, init_all_main, &a[i]) != 0) {
            res = base_error(loomSystemError, LOG_INIT, "pthread_create failed");
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < started && res == loomSuccess; i++)
        if (a[i].res != loomSuccess) {
            res = a[i].res;
            base_set_error_text(a[i].err);
        }
    if (res == loomSuccess && started < ndev) res = loomSystemError;
    if (res != loomSuccess)
        for (int i = 0; i < started; i++)
            if (a[i].res == loomSuccess) comm_free(comms[i]);
    if (res == loomSuccess && devlist)
        for (int i = 0; i < ndev; i++)
            comms[i]->dev.cuda_dev = devlist[i]; /* as NCCL binds them */
    free(a);
    free(t);
    return res;
}

LOOM_EXPORT loomResult_t loomGetUniqueId(loomUniqueId *id)
{
    base_clear_error();
    if (id == NULL)
        return base_error(loomInvalidArgument, LOG_INIT, "loomGetUniqueId: uniqueId is NULL");
    core_fork_init();
    return boot_uid_create(id);
}

LOOM_EXPORT loomResult_t loomCommFinalize(loomComm_t comm)
{
    LOOM_CHECK(comm_check(comm, "loomCommFinalize"));
    bool held;
    LOOM_CHECK(comm_enter(comm, "loomCommFinalize", 0, &held));
    /* Host operations complete before their calls return: nothing is outstanding. */
    comm->st.finalized = true;
    comm_leave(comm, held);
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommDestroy(loomComm_t comm)
{
    if (comm == NULL) return loomSuccess;
    if (!comm_live(comm))
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommDestroy: %p is not a live loom communicator", (void *)comm);
    /* A call of another thread inside comm keeps it: refused, and comm stays usable. */
    bool held;
    LOOM_CHECK(comm_enter(comm, "loomCommDestroy", 0, &held));
    comm_ref(comm); /* the claim is let go after the handle's reference */
    if (!comm_retire(comm)) {
        comm_leave(comm, held);
        comm_unref(comm);
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommDestroy: %p is not a live loom communicator", (void *)comm);
    }
    comm_leave(comm, held);
    comm_unref(comm);
    return loomSuccess;
}

bool comm_stop(loomComm_t comm, const char *reason)
{
    if (atomic_exchange(&comm->st.aborting, 1)) return true;
#ifdef LOOM_HAVE_CUDA
    dev_abort(&comm->dev.host); /* kernels in flight stop spinning */
#endif
    uint64_t one = 1;
    ssize_t n = write(comm->st.wake_fd, &one, sizeof(one));
    (void)n;
    /* A call blocked on comm in another thread sees the flag within one poll interval and
     * leaves; wait for it so that nothing is torn down under it. */
    uint64_t dl = base_now_ns() + 10000000000ull;
    while (atomic_load(&comm->st.active_calls) > 0 && base_now_ns() < dl)
        usleep(1000);
    bool idle = atomic_load(&comm->st.active_calls) == 0;
    if (!idle)
        WARN(LOG_INIT, "a call on this communicator did not return within 10 s of its abort");
    comm_abort_transports(comm, reason);
    return idle;
}

LOOM_EXPORT loomResult_t loomCommAbort(loomComm_t comm)
{
    if (comm == NULL) return loomSuccess;
    if (!comm_live(comm))
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommAbort: %p is not a live loom communicator", (void *)comm);
    /* Every rank of the job learns who aborted (the links tell only the peers they reach). */
    if (atomic_load(&comm->st.async_error) == loomSuccess && !atomic_load(&comm->st.aborting)) {
        char why[96];
        snprintf(why, sizeof(why), "rank %d called loomCommAbort", comm->rank);
        js_client_report(comm->js, why);
    }
    if (!comm_stop(comm, "the communicator was aborted")) {
        WARN(LOG_INIT, "loomCommAbort: leaking the communicator instead of freeing it under a "
                       "call that is still inside it");
        return loomSuccess;
    }
    comm_retire(comm);
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t *err)
{
    if (!comm_live(comm) || err == NULL)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommGetAsyncError: invalid communicator or NULL result pointer");
#ifdef LOOM_HAVE_CUDA
    dev_poll(&comm->dev.host);
#endif
    loomResult_t a = (loomResult_t)atomic_load(&comm->st.async_error);
    if (a != loomInProgress && comm->st.init_thread_live) {
        pthread_join(comm->st.init_thread, NULL);
        comm->st.init_thread_live = false;
    }
    *err = a;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommCount(const loomComm_t comm, int *count)
{
    if (!comm_live(comm) || count == NULL)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommCount: invalid communicator or NULL count");
    *count = comm->nranks;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommUserRank(const loomComm_t comm, int *rank)
{
    if (!comm_live(comm) || rank == NULL)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommUserRank: invalid communicator or NULL rank");
    *rank = comm->rank;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommCuDevice(const loomComm_t comm, int *device)
{
    if (!comm_live(comm) || device == NULL)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommCuDevice: invalid communicator or NULL device");
    *device = comm->dev.cuda_dev;
    return loomSuccess;
}

LOOM_EXPORT loomResult_t loomCommGetStats(const loomComm_t comm, loomStats_t *stats)
{
    if (!comm_live(comm) || stats == NULL)
        return base_error(loomInvalidArgument, LOG_INIT,
                          "loomCommGetStats: invalid communicator or NULL stats");
    *stats = comm->stats;
    return loomSuccess;
}

/* ---- pre-multiplied sums ---- */

LOOM_EXPORT loomResult_t loomRedOpCreatePreMulSum(loomRedOp_t *op, void *scalar,
                                                  loomDataType_t type,
                                                  loomScalarResidence_t residence, loomComm_t comm)
{
    LOOM_CHECK(comm_check(comm, "loomRedOpCreatePreMulSum"));
    if (op == NULL || scalar == NULL)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "loomRedOpCreatePreMulSum: op or scalar is NULL");
    if ((int)type < 0 || type >= loomNumTypes)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "loomRedOpCreatePreMulSum: bad datatype %d", (int)type);
    if (residence != loomScalarHostImmediate && residence != loomScalarDevice)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "loomRedOpCreatePreMulSum: bad residence %d", (int)residence);
    /* A device-resident scalar in GPU memory is read by the kernels when the collective runs;
     * any other scalar is read now (a "device" scalar in host memory is host memory). */
    bool on_gpu = residence == loomScalarDevice && mem_type_of(scalar) != MEM_HOST;
    for (int i = 0; i < COMM_MAX_PREMUL; i++) {
        if (comm->premul[i].used) continue;
        comm->premul[i].used = true;
        comm->premul[i].type = type;
        comm->premul[i].dev_ptr = on_gpu ? scalar : NULL;
        if (!on_gpu) memcpy(comm->premul[i].scalar, scalar, red_type_size(type));
        *op = (loomRedOp_t)(loomNumOps + i);
        return loomSuccess;
    }
    return base_error(loomInvalidUsage, LOG_COLL,
                      "loomRedOpCreatePreMulSum: more than %d live operators on this communicator",
                      COMM_MAX_PREMUL);
}

LOOM_EXPORT loomResult_t loomRedOpDestroy(loomRedOp_t op, loomComm_t comm)
{
    LOOM_CHECK(comm_check(comm, "loomRedOpDestroy"));
    int i = base_premul_index(op);
    if (i < 0 || i >= COMM_MAX_PREMUL || !comm->premul[i].used)
        return base_error(loomInvalidArgument, LOG_COLL,
                          "loomRedOpDestroy: op %d was not created on this communicator", (int)op);
    comm->premul[i].used = false;
    return loomSuccess;
}

/* ---- the internal interface of the shim and the tools (loom_internal.h) ---- */

bool loom_comm_live(loomComm_t comm)
{
    return comm_live(comm);
}

bool loom_comm_revoke(loomComm_t comm, const char *reason)
{
    return comm_stop(comm, reason);
}

int loom_comm_rank(loomComm_t comm)
{
    return comm->rank;
}

int loom_comm_size(loomComm_t comm)
{
    return comm->nranks;
}

uint64_t loom_node_identity(char *host, size_t hostlen)
{
    return boot_node_hash(host, hostlen, NULL);
}
