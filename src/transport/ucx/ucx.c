/*
 * UCX transport (LOOM_TRANSPORT=ucx): UCP tagged messages, loom's route onto the fabrics that UCX
 * drives (InfiniBand and RoCE through its rc/dc/ud transports, and shared memory, CMA and TCP).
 *
 * One UCP context and one worker per communicator, one endpoint per peer, created from the
 * peer's worker address. Worker addresses are hundreds of bytes, more than a transport handle:
 * the transport publishes its address through ops->address and core carries it to the peers
 * after their peer_info_t in the bootstrap (comm.h: comm_peer_addr); the 64-byte handle holds
 * only what names the peer (its host and pid) and the address's length.
 *
 * Matching: a message is two tagged sends, its TRANSPORT_META_BYTES of metadata then its payload
 * (contiguous, so that UCX takes its zero-copy and rendezvous protocols for large ones at its own
 * thresholds). Tags are [ctrl:1][meta:1][sender rank:22][per-pair sequence:40] and a receive asks
 * for one exact tag, so the k-th receive from a peer takes the k-th message it sent, whatever
 * order they arrive in. The metadata travels apart from the payload so that it is known even when
 * the payload has another length than the receive (UCX truncates that one): the length mismatch
 * is then reported with both operations named, like tcp and shm do.
 *
 * Control messages (tag ctrl | sender): heartbeats, inside calls and between them (the
 * progress thread's), so that a stalled peer is told from a busy one as on tcp, and the reason
 * of an abort. A peer's heartbeats that arrive before this rank made its endpoint to it (its
 * first call with that peer is still to come) are found by ucx_callers, and core connects it. Each
 * connection keeps one control receive posted. A peer that dies shows up through the endpoint's
 * error handler (UCP_ERR_HANDLING_MODE_PEER), a stalled one through the missing heartbeats
 * (LOOM_TIMEOUT).
 *
 * Progress: ucp_worker_progress in the progress op; the worker's event fd (ucp_worker_arm) is
 * what the progress engine waits on when nothing moves. Everything of UCX's configuration comes
 * from the user's UCX_* variables (ucp_config_read); loom sets none.
 *
 * Memory: host memory. Device buffers reach this transport staged by the executor; the memory
 * types UCX was built for are logged at init (a UCX with CUDA support reports "cuda").
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include "base.h"
#include "param.h"
#include "transport.h"

#define UCX_HANDLE_MAGIC 0x55 /* 'U': a non-zero first byte says "offered" */
#define UCX_TAG_CTRL (1ull << 63)
#define UCX_TAG_META (1ull << 62)
#define UCX_RANK_SHIFT 40
#define UCX_RANK_MAX (1 << 22)
#define UCX_SEQ_MASK ((1ull << UCX_RANK_SHIFT) - 1)
#define UCX_TAG_EXACT (~0ull)
#define UCX_TAG_CTRL_MASK (~UCX_SEQ_MASK)
#define UCX_CTRL_PING 'P'
#define UCX_CTRL_ABORT 'A'
#define UCX_CTRL_MAX (1 + TRANSPORT_ABORT_TEXT_MAX)
/* A peer that aborts tells why, then leaves; its leaving may reach us (the endpoint's error)
 * before its reason does. Errors of an endpoint wait this long for a reason to arrive. */
#define UCX_ERR_GRACE_NS 300000000ull

/* The handle: what names the peer; the worker address itself comes through ops->address. */
typedef struct {
    uint8_t magic;
    uint8_t pad[3];
    uint32_t pid;
    uint32_t addr_len;
    char host[52];
} ucx_handle_t;
_Static_assert(sizeof(ucx_handle_t) == TRANSPORT_HANDLE_BYTES, "ucx handle layout");

enum { PART_META = 0, PART_DATA = 1 };

/* One UCX operation of a request: its callback's user data. */
typedef struct {
    struct transport_req *r;
    int k;
    bool fired;   /* its callback ran (possibly inside the posting call) */
    void *handle; /* UCX's request while it runs */
} ucx_part_t;

struct transport_req {
    struct transport_req *prev, *next; /* the context's list: freed by fini if never finished */
    transport_conn_t *conn;
    bool send;
    bool bad_len; /* the payload had another length: meta valid, data not */
    int parts;    /* UCX operations still running (metadata, payload) */
    /* The wrong length's text, kept until the metadata part (another tag, sent first) has
     * landed too: the connection fails only then, so that the caller reads the metadata and
     * names the operation the peer ran, whichever part UCX completes first */
    char bad_len_text[sizeof(((transport_conn_head_t *)0)->name) + 200];
    ucx_part_t pt[2];
    ucp_tag_recv_info_t info[2];
    ucs_status_t status; /* the first failure of a part */
    size_t len, got;
    uint64_t seq;
    uint8_t meta[TRANSPORT_META_BYTES];
};

struct transport_conn {
    transport_conn_head_t head; /* first: the shared ops read it */
    transport_ctx_t *ctx;
    int peer;
    ucp_ep_h ep;
    uint64_t send_seq, recv_seq; /* per pair, in posting order */
    uint64_t last_send_ns;       /* heartbeats go out when nothing else did */
    void *ping;                  /* the heartbeat in flight, if any */
    void *abort_req;             /* the abort's text in flight */
    void *ctrl;                  /* the posted control receive */
    bool ctrl_arrived;
    ucs_status_t ctrl_status;
    ucp_tag_recv_info_t ctrl_info;
    uint8_t ctrl_buf[UCX_CTRL_MAX];
    bool err_waits; /* an endpoint error, recorded once UCX_ERR_GRACE_NS passed */
    uint64_t err_ns;
    char err_text[256];
};
TRANSPORT_CONN_HEAD_FIRST(struct transport_conn, head);

struct transport_ctx {
    transport_setup_t setup;
    ucp_context_h ucp;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;     /* the worker's event fd, -1 without wakeup support */
    int busy_fd; /* an eventfd kept readable: "events are pending, do not sleep" */
    transport_conn_t **conns;
    transport_conn_t **active;
    int nactive;
    transport_req_t *reqs; /* every request not yet handed back finished */
    uint64_t ping_ns;
    bool moved; /* a callback ran */
    transport_abort_t abort;
    uint8_t abort_msg[UCX_CTRL_MAX];
};

static const uint8_t ping_msg[1] = {UCX_CTRL_PING};

#define conn_fail(c, ...) transport_fail(&(c)->head.fail, __VA_ARGS__)

/* ---- RDMA detection (for the automatic choice) -------------------------------------------- */

static const char *rdma_names;
static char rdma_buf[256];
static pthread_once_t rdma_once = PTHREAD_ONCE_INIT;

static void rdma_scan(void)
{
    uct_component_h *comps;
    unsigned ncomp;
    if (uct_query_components(&comps, &ncomp) != UCS_OK) return;
    size_t o = 0;
    for (unsigned i = 0; i < ncomp; i++) {
        uct_component_attr_t ca = {.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT};
        if (uct_component_query(comps[i], &ca) != UCS_OK || ca.md_resource_count == 0) continue;
        uct_md_resource_desc_t *mds = calloc(ca.md_resource_count, sizeof(*mds));
        if (mds == NULL) continue;
        ca.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
        ca.md_resources = mds;
        if (uct_component_query(comps[i], &ca) == UCS_OK) {
            for (unsigned m = 0; m < ca.md_resource_count; m++) {
                uct_md_config_t *cfg;
                uct_md_h md;
                if (uct_md_config_read(comps[i], NULL, NULL, &cfg) != UCS_OK) continue;
                ucs_status_t st = uct_md_open(comps[i], mds[m].md_name, cfg, &md);
                uct_config_release(cfg);
                if (st != UCS_OK) continue;
                uct_tl_resource_desc_t *tls;
                unsigned ntl;
                if (uct_md_query_tl_resources(md, &tls, &ntl) == UCS_OK) {
                    for (unsigned t = 0; t < ntl; t++) {
                        const char *n = tls[t].tl_name;
                        if (strncmp(n, "rc", 2) && strncmp(n, "dc", 2) && strncmp(n, "ud", 2))
                            continue;
                        if (o < sizeof(rdma_buf))
                            o += (size_t)snprintf(rdma_buf + o, sizeof(rdma_buf) - o, "%s%s/%s",
                                                  o ? " " : "", n, tls[t].dev_name);
                    }
                    uct_release_tl_resource_list(tls);
                }
                uct_md_close(md);
            }
        }
        free(mds);
    }
    uct_release_component_list(comps);
    if (o) rdma_names = rdma_buf;
}

bool ucx_has_rdma(const char **what)
{
    pthread_once(&rdma_once, rdma_scan);
    *what = rdma_names;
    return rdma_names != NULL;
}

/* ---- requests ----------------------------------------------------------------------------- */

static void req_link(transport_ctx_t *ctx, transport_req_t *r)
{
    r->next = ctx->reqs;
    if (ctx->reqs) ctx->reqs->prev = r;
    ctx->reqs = r;
}

static void req_free(transport_ctx_t *ctx, transport_req_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        ctx->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    free(r);
}

/* An endpoint's failure, recorded after the grace (unless the peer's reason came first). */
static void err_later(transport_conn_t *c, const char *fmt, const char *what)
{
    if (c->err_waits) return;
    c->err_waits = true;
    c->err_ns = base_coarse_ns();
    snprintf(c->err_text, sizeof(c->err_text), fmt, c->head.name, what);
}

/* A part finished (status: UCX's verdict; info: what arrived, for receives). */
static void part_done(transport_req_t *r, int part, ucs_status_t status,
                      const ucp_tag_recv_info_t *info)
{
    transport_conn_t *c = r->conn;
    c->ctx->moved = true;
    r->parts--;
    if (info) r->info[part] = *info;
    if (status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED)
        c->head.last_activity_ns = base_coarse_ns();
    if (r->parts == 0) c->head.pending--;
    if (r->parts == 0 && r->bad_len_text[0]) {
        conn_fail(c, loomRemoteError, "%s", r->bad_len_text);
        r->bad_len_text[0] = '\0';
    }
    if (status == UCS_OK && r->send) return;
    if (!r->send && part == PART_DATA &&
        (status == UCS_ERR_MESSAGE_TRUNCATED || (status == UCS_OK && info->length != r->len))) {
        bool longer = status != UCS_OK;
        r->got = longer ? 0 : info->length;
        r->bad_len = true;
        char got[48];
        if (longer)
            snprintf(got, sizeof(got), "more than %zu bytes", r->len);
        else
            snprintf(got, sizeof(got), "%zu bytes", r->got);
        snprintf(r->bad_len_text, sizeof(r->bad_len_text),
                 "%s sent a message of %s where %zu were expected (message %llu): the ranks "
                 "disagree on the operation",
                 c->head.name, got, r->len, (unsigned long long)r->seq);
        if (r->parts == 0) {
            conn_fail(c, loomRemoteError, "%s", r->bad_len_text);
            r->bad_len_text[0] = '\0';
        }
        return;
    }
    if (status == UCS_OK) return;
    if (r->status == UCS_OK) r->status = status;
    if (status != UCS_ERR_CANCELED)
        err_later(c,
                  r->send ? "send to %s failed: UCX: %s (the peer died?)"
                          : "receive from %s failed: UCX: %s (the peer died?)",
                  ucs_status_string(status));
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_part_t *pt = user_data;
    pt->fired = true;
    pt->handle = NULL;
    ucp_request_free(request);
    part_done(pt->r, pt->k, status, NULL);
}

static void recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data)
{
    ucx_part_t *pt = user_data;
    pt->fired = true;
    pt->handle = NULL;
    ucp_request_free(request);
    part_done(pt->r, pt->k, status, info);
}

/* What a posting call returned: done at once, running (kept), or failed; nothing when its
 * callback already ran. */
static void part_posted(transport_req_t *r, int k, ucs_status_ptr_t p)
{
    ucx_part_t *pt = &r->pt[k];
    if (pt->fired) return;
    if (p != NULL && !UCS_PTR_IS_ERR(p)) {
        pt->handle = p;
        return;
    }
    pt->fired = true;
    part_done(r, k, UCS_PTR_STATUS(p), r->send ? NULL : &r->info[k]);
}

/* ---- init and connections ----------------------------------------------------------------- */

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    transport_conn_t *c = arg;
    c->ctx->moved = true;
    err_later(c, "connection to %s failed: UCX: %s (the peer exited or died)",
              ucs_status_string(status));
}

static void ctx_free(transport_ctx_t *ctx)
{
    if (ctx->addr) ucp_worker_release_address(ctx->worker, ctx->addr);
    if (ctx->worker) ucp_worker_destroy(ctx->worker);
    if (ctx->ucp) ucp_cleanup(ctx->ucp);
    if (ctx->busy_fd >= 0) close(ctx->busy_fd);
    free(ctx->conns);
    free(ctx->active);
    free(ctx);
}

static loomResult_t ucx_init(const transport_setup_t *setup, transport_ctx_t **out,
                             uint8_t handle[TRANSPORT_HANDLE_BYTES])
{
    if (setup->nranks > UCX_RANK_MAX)
        return base_error(loomInvalidUsage, LOG_NET, "ucx: %d ranks, more than the %d it tags",
                          setup->nranks, UCX_RANK_MAX);
    transport_ctx_t *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (ucx context)");
    ctx->setup = *setup;
    ctx->efd = -1;
    ctx->busy_fd = -1;
    ctx->ping_ns = transport_ping_ns();
    ctx->conns = calloc((size_t)setup->nranks, sizeof(*ctx->conns));
    ctx->active = calloc((size_t)setup->nranks, sizeof(*ctx->active));
    ctx->busy_fd = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->conns == NULL || ctx->active == NULL || ctx->busy_fd < 0) {
        ctx_free(ctx);
        return base_error(loomSystemError, LOG_NET, "ucx: out of memory or eventfd failed (%s)",
                          strerror(errno));
    }
    /* The user's UCX_* variables, untouched. */
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        ctx_free(ctx);
        return base_error(loomInvalidUsage, LOG_NET,
                          "ucx: ucp_config_read failed: %s (check the UCX_* variables)",
                          ucs_status_string(st));
    }
    /* One default differs, and only where the user did not choose: UCX 1.13's registration
     * cache installs memory hooks at ucp_init, which here hung now and then in ucm's event
     * lock (ucm_event_enter_exclusive, ranks forked from one process: about 1 init in 20 on a
     * loaded machine). Shared memory, CMA and TCP register nothing, so the cache is off unless
     * an RDMA device is there (registration is what it caches) or UCX_RCACHE_ENABLE says. */
    const char *rdma;
    if (getenv("UCX_RCACHE_ENABLE") == NULL && !ucx_has_rdma(&rdma))
        (void)ucp_config_modify(cfg, "RCACHE_ENABLE", "n");
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                                     UCP_PARAM_FIELD_ESTIMATED_NUM_EPS,
                       .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
                       .mt_workers_shared = 0,
                       .estimated_num_eps = (size_t)setup->nranks};
    st = ucp_init(&pp, cfg, &ctx->ucp);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        ctx->ucp = NULL;
        ctx_free(ctx);
        return base_error(loomSystemError, LOG_NET, "ucx: rank %d: ucp_init failed: %s",
                          setup->rank, ucs_status_string(st));
    }
    /* One thread at a time uses a communicator, not always the same one (the progress thread
     * serves device work): serialized. */
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
        .events = UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX};
    st = ucp_worker_create(ctx->ucp, &wp, &ctx->worker);
    if (st != UCS_OK) {
        ctx->worker = NULL;
        ctx_free(ctx);
        return base_error(loomSystemError, LOG_NET, "ucx: rank %d: ucp_worker_create failed: %s",
                          setup->rank, ucs_status_string(st));
    }
    st = ucp_worker_get_address(ctx->worker, &ctx->addr, &ctx->addr_len);
    if (st != UCS_OK) {
        ctx->addr = NULL;
        ctx_free(ctx);
        return base_error(loomSystemError, LOG_NET,
                          "ucx: rank %d: ucp_worker_get_address failed: %s", setup->rank,
                          ucs_status_string(st));
    }
    if (ucp_worker_get_efd(ctx->worker, &ctx->efd) != UCS_OK) ctx->efd = -1;
    ucx_handle_t h = {
        .magic = UCX_HANDLE_MAGIC, .pid = (uint32_t)getpid(), .addr_len = (uint32_t)ctx->addr_len};
    gethostname(h.host, sizeof(h.host) - 1);
    memset(handle, 0, TRANSPORT_HANDLE_BYTES);
    memcpy(handle, &h, sizeof(h));
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    bool cuda = ucp_context_query(ctx->ucp, &ca) == UCS_OK &&
                (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
    unsigned maj, min, rel;
    ucp_get_version(&maj, &min, &rel);
    INFO(LOG_NET,
         "ucx %u.%u.%u: rank %d's worker address is %zu bytes; memory types: host%s (device "
         "buffers are staged by loom)%s",
         maj, min, rel, setup->rank, ctx->addr_len, cuda ? ", cuda" : "",
         ctx->efd < 0 ? "; no event fd: waits poll" : "");
    *out = ctx;
    return loomSuccess;
}

static loomResult_t ucx_address(transport_ctx_t *ctx, const void **addr, size_t *len)
{
    *addr = ctx->addr;
    *len = ctx->addr_len;
    return loomSuccess;
}

static void ctrl_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                    void *user_data)
{
    transport_conn_t *c = user_data;
    c->ctrl = NULL;
    ucp_request_free(request);
    c->ctrl_arrived = true;
    c->ctrl_status = status;
    if (info) c->ctrl_info = *info;
    c->ctx->moved = true;
}

static void ctrl_post(transport_conn_t *c)
{
    transport_ctx_t *ctx = c->ctx;
    ucp_request_param_t p = {.op_attr_mask =
                                 UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                 UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                             .cb.recv = ctrl_cb,
                             .user_data = c,
                             .recv_info.tag_info = &c->ctrl_info};
    uint64_t tag = UCX_TAG_CTRL | ((uint64_t)c->peer << UCX_RANK_SHIFT);
    ucs_status_ptr_t s =
        ucp_tag_recv_nbx(ctx->worker, c->ctrl_buf, sizeof(c->ctrl_buf), tag, UCX_TAG_CTRL_MASK, &p);
    if (UCS_PTR_IS_ERR(s)) {
        conn_fail(c, loomRemoteError, "ucx: posting the control receive from %s failed: %s",
                  c->head.name, ucs_status_string(UCS_PTR_STATUS(s)));
    } else if (s == NULL || UCS_PTR_STATUS(s) == UCS_OK) {
        c->ctrl_arrived = true;
        c->ctrl_status = UCS_OK;
    } else {
        c->ctrl = s;
    }
}

static loomResult_t ucx_connect_addr(transport_ctx_t *ctx, int peer, const transport_peer_t *pi,
                                     transport_conn_t **out)
{
    const void *addr = pi->addr;
    size_t len = pi->addr_len;
    if (ctx->conns[peer]) {
        *out = ctx->conns[peer];
        return loomSuccess;
    }
    ucx_handle_t h;
    memcpy(&h, pi->handle, sizeof(h));
    if (h.magic != UCX_HANDLE_MAGIC || addr == NULL || len != h.addr_len)
        return base_error(loomInternalError, LOG_NET,
                          "ucx: rank %d's worker address is missing or %zu bytes where its handle "
                          "says %u",
                          peer, len, h.addr_len);
    transport_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (ucx connection)");
    c->ctx = ctx;
    c->peer = peer;
    c->head.last_activity_ns = c->last_send_ns = base_coarse_ns();
    h.host[sizeof(h.host) - 1] = '\0';
    char where[80];
    snprintf(where, sizeof(where), "%s:%u", h.host, h.pid);
    transport_conn_name(&c->head, peer, where);
    /* Peer error handling, for peers on other nodes: a dead peer becomes this connection's
     * error (the handler below) instead of a hang. Not for peers on this node: UCX 1.13's
     * posix and sysv shared memory have no peer-failure support, and asking for it would make
     * UCX carry same-node messages over its tcp instead (half of ucx_perftest's bandwidth
     * here). A same-node peer that dies is found by the heartbeats (LOOM_TIMEOUT), and still
     * by the handler where UCX reports it anyway (its tcp does). */
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr,
        .err_mode = pi->same_node ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_error_cb, .arg = c}};
    ucs_status_t st = ucp_ep_create(ctx->worker, &ep, &c->ep);
    if (st != UCS_OK) {
        c->ep = NULL;
        err_later(c, "cannot reach %s: ucp_ep_create: %s", ucs_status_string(st));
    }
    ctx->conns[peer] = c;
    ctx->active[ctx->nactive++] = c;
    if (c->ep) ctrl_post(c);
    TRACE(LOG_NET, "ucx: endpoint to %s", c->head.name);
    *out = c;
    return loomSuccess;
}

static loomResult_t ucx_connect(transport_ctx_t *ctx, int peer,
                                const uint8_t handle[TRANSPORT_HANDLE_BYTES],
                                transport_conn_t **out)
{
    (void)handle;
    if (ctx->conns[peer]) {
        *out = ctx->conns[peer];
        return loomSuccess;
    }
    return base_error(loomInternalError, LOG_NET,
                      "ucx: connect to rank %d without its worker address", peer);
}

static loomResult_t conn_check(transport_conn_t *c)
{
    return transport_conn_check(&c->head, &c->ctx->abort);
}

/* ---- messages ----------------------------------------------------------------------------- */

static transport_req_t *req_new(transport_conn_t *c, bool send, size_t len, uint64_t seq)
{
    transport_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL) return NULL;
    r->conn = c;
    r->send = send;
    r->len = len;
    r->seq = seq;
    r->parts = 2;
    for (int k = 0; k < 2; k++)
        r->pt[k] = (ucx_part_t){.r = r, .k = k};
    req_link(c->ctx, r);
    c->head.pending++;
    return r;
}

static loomResult_t ucx_isend(transport_conn_t *c, const void *buf, size_t len,
                              const uint8_t meta[TRANSPORT_META_BYTES], transport_req_t **out)
{
    LOOM_CHECK(conn_check(c));
    uint64_t seq = c->send_seq++;
    transport_req_t *r = req_new(c, true, len, seq);
    if (r == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (send request)");
    memcpy(r->meta, meta, TRANSPORT_META_BYTES);
    *out = r;
    if (c->ep == NULL) return loomSuccess; /* never sent: the connection fails after its grace */
    uint64_t tag = ((uint64_t)c->ctx->setup.rank << UCX_RANK_SHIFT) | (seq & UCX_SEQ_MASK);
    ucp_request_param_t p = {.op_attr_mask =
                                 UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = send_cb,
                             .user_data = &r->pt[PART_META]};
    part_posted(r, PART_META,
                ucp_tag_send_nbx(c->ep, r->meta, TRANSPORT_META_BYTES, tag | UCX_TAG_META, &p));
    p.user_data = &r->pt[PART_DATA];
    part_posted(r, PART_DATA, ucp_tag_send_nbx(c->ep, buf, len, tag, &p));
    c->last_send_ns = base_coarse_ns();
    *out = r;
    return loomSuccess;
}

static loomResult_t ucx_irecv(transport_conn_t *c, void *buf, size_t len, transport_req_t **out)
{
    LOOM_CHECK(conn_check(c));
    uint64_t seq = c->recv_seq++;
    transport_req_t *r = req_new(c, false, len, seq);
    if (r == NULL) return base_error(loomSystemError, LOG_NET, "out of memory (recv request)");
    uint64_t tag = ((uint64_t)c->peer << UCX_RANK_SHIFT) | (seq & UCX_SEQ_MASK);
    ucp_worker_h w = c->ctx->worker;
    /* No immediate completion: UCX 1.13 leaves recv_info unset when a receive finds its
     * message already there, and the length is what the mismatch check needs. */
    ucp_request_param_t p = {.op_attr_mask =
                                 UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                 UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                             .cb.recv = recv_cb,
                             .user_data = &r->pt[PART_META],
                             .recv_info.tag_info = &r->info[PART_META]};
    part_posted(
        r, PART_META,
        ucp_tag_recv_nbx(w, r->meta, TRANSPORT_META_BYTES, tag | UCX_TAG_META, UCX_TAG_EXACT, &p));
    p.user_data = &r->pt[PART_DATA];
    p.recv_info.tag_info = &r->info[PART_DATA];
    part_posted(r, PART_DATA, ucp_tag_recv_nbx(w, buf, len, tag, UCX_TAG_EXACT, &p));
    *out = r;
    return loomSuccess;
}

static loomResult_t ucx_test(transport_req_t *r, int *done, uint8_t meta[TRANSPORT_META_BYTES])
{
    transport_conn_t *c = r->conn;
    if (r->parts > 0 || (r->status != UCS_OK && !r->bad_len)) {
        *done = 0;
        return conn_check(c);
    }
    loomResult_t res = transport_req_finish(&c->head, r->bad_len, r->meta, done, meta);
    req_free(c->ctx, r);
    return res;
}

/* ---- progress ----------------------------------------------------------------------------- */

static void ctrl_handle(transport_conn_t *c)
{
    c->ctrl_arrived = false;
    if (c->ctrl_status != UCS_OK && c->ctrl_status != UCS_ERR_MESSAGE_TRUNCATED) {
        if (c->ctrl_status != UCS_ERR_CANCELED)
            err_later(c, "receive from %s failed: UCX: %s (the peer died?)",
                      ucs_status_string(c->ctrl_status));
        return;
    }
    c->head.last_activity_ns = base_coarse_ns();
    size_t n = LOOM_MIN(c->ctrl_info.length, sizeof(c->ctrl_buf));
    if (n >= 1 && c->ctrl_buf[0] == UCX_CTRL_ABORT) {
        char text[UCX_CTRL_MAX];
        memcpy(text, c->ctrl_buf + 1, n - 1);
        text[n - 1] = '\0';
        conn_fail(c, loomRemoteError, "%s aborted: %s", c->head.name, text);
        return;
    }
    ctrl_post(c);
}

static void ctrl_send_cb(void *request, ucs_status_t status, void *user_data)
{
    transport_conn_t *c = user_data;
    if (c->ping == request)
        c->ping = NULL;
    else if (c->abort_req == request)
        c->abort_req = NULL;
    ucp_request_free(request);
    c->ctx->moved = true;
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        err_later(c, "send to %s failed: UCX: %s (the peer died?)", ucs_status_string(status));
}

/* Sends a control message; returns the running request (NULL: done or failed). */
static void *ctrl_send(transport_conn_t *c, const void *msg, size_t len)
{
    ucp_request_param_t p = {.op_attr_mask =
                                 UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = ctrl_send_cb,
                             .user_data = c};
    uint64_t tag = UCX_TAG_CTRL | ((uint64_t)c->ctx->setup.rank << UCX_RANK_SHIFT);
    ucs_status_ptr_t s = ucp_tag_send_nbx(c->ep, msg, len, tag, &p);
    if (UCS_PTR_IS_ERR(s)) {
        err_later(c, "send to %s failed: UCX: %s (the peer died?)",
                  ucs_status_string(UCS_PTR_STATUS(s)));
        return NULL;
    }
    return s;
}

static void conn_progress(transport_conn_t *c, uint64_t now)
{
    if (c->ctrl_arrived) ctrl_handle(c);
    if (c->err_waits && now - c->err_ns > UCX_ERR_GRACE_NS && !c->head.fail.failed)
        conn_fail(c, loomRemoteError, "%s", c->err_text);
    if (c->ep == NULL || c->err_waits) return;
    if (c->head.fail.failed || c->ping || now - c->last_send_ns < c->ctx->ping_ns) return;
    c->last_send_ns = now;
    c->ping = ctrl_send(c, ping_msg, sizeof(ping_msg));
}

static loomResult_t ucx_progress(transport_ctx_t *ctx, bool *progressed)
{
    if (ctx->abort.aborted) return loomSuccess;
    ctx->moved = false;
    for (int i = 0; i < 64 && ucp_worker_progress(ctx->worker); i++)
        *progressed = true;
    uint64_t now = base_coarse_ns();
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (!c->head.fail.failed) conn_progress(c, now);
    }
    if (ctx->moved) *progressed = true;
    return loomSuccess;
}

static int ucx_pollfds(transport_ctx_t *ctx, struct pollfd *fds, int max)
{
    if (ctx->abort.aborted || max < 1) return 0;
    if (ctx->efd < 0) return 0; /* the progress engine's bounded sleep */
    ucs_status_t st = ucp_worker_arm(ctx->worker);
    int fd = st == UCS_OK ? ctx->efd : ctx->busy_fd; /* UCS_ERR_BUSY: events wait already */
    fds[0] = (struct pollfd){.fd = fd, .events = POLLIN};
    return 1;
}

static uint64_t ucx_idle_ns(transport_conn_t *c, bool *pending)
{
    return transport_conn_idle_ns(&c->head, false, pending);
}

/* ---- abort and teardown ------------------------------------------------------------------- */

static bool abort_grace_step(void *arg, bool *prog)
{
    transport_ctx_t *ctx = arg;
    while (ucp_worker_progress(ctx->worker))
        *prog = true;
    for (int i = 0; i < ctx->nactive; i++)
        if (ctx->active[i]->abort_req && !ctx->active[i]->head.fail.failed) return true;
    return false;
}

static void ucx_abort(transport_ctx_t *ctx, const char *reason)
{
    if (ctx->abort.aborted) return;
    size_t rl = LOOM_MIN(strlen(reason), (size_t)TRANSPORT_ABORT_TEXT_MAX);
    ctx->abort_msg[0] = UCX_CTRL_ABORT;
    memcpy(ctx->abort_msg + 1, reason, rl);
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->ep && !c->head.fail.failed) c->abort_req = ctrl_send(c, ctx->abort_msg, rl + 1);
    }
    transport_abort_grace(abort_grace_step, ctx);
    transport_abort_set(&ctx->abort, reason);
}

static void drain_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                     void *user_data)
{
    (void)request, (void)status, (void)info;
    *(bool *)user_data = true;
}

/* Peers whose heartbeats (or abort) reached this rank before it made its endpoint to them: a
 * rank computing before its first call with a peer answers it this way (core connects them from
 * the progress thread, and the new connection's control receive takes the message). The probe
 * leaves the message where it is; it sees the first waiting control message only, so one peer
 * is found per pass (a connected peer's message there is taken by its receive soon). */
static int ucx_callers(transport_ctx_t *ctx, int *peers, int max)
{
    if (ctx->abort.aborted || max < 1) return 0;
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg = ucp_tag_probe_nb(ctx->worker, UCX_TAG_CTRL, UCX_TAG_CTRL, 0, &info);
    if (msg == NULL) return 0;
    int from = (int)((info.sender_tag & ~(UCX_TAG_CTRL | UCX_TAG_META)) >> UCX_RANK_SHIFT);
    if (from < 0 || from >= ctx->setup.nranks || from == ctx->setup.rank || ctx->conns[from])
        return 0;
    peers[0] = from;
    return 1;
}

/* Messages nobody will receive (a peer's last heartbeats, an abandoned communicator's traffic)
 * are taken off the worker before it goes, instead of UCX warning about each. */
static void drain_unexpected(transport_ctx_t *ctx)
{
    for (int n = 0; n < 4096; n++) {
        ucp_tag_recv_info_t info;
        ucp_tag_message_h msg = ucp_tag_probe_nb(ctx->worker, 0, 0, 1, &info);
        if (msg == NULL) {
            if (ucp_worker_progress(ctx->worker) == 0) return;
            continue;
        }
        void *buf = malloc(info.length ? info.length : 1);
        if (buf == NULL) return;
        bool done = false;
        ucp_request_param_t p = {.op_attr_mask =
                                     UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                 .cb.recv = drain_cb,
                                 .user_data = &done};
        ucs_status_ptr_t s = ucp_tag_msg_recv_nbx(ctx->worker, buf, info.length, msg, &p);
        if (s != NULL && !UCS_PTR_IS_ERR(s)) {
            uint64_t end = base_now_ns() + 100000000ull;
            while (!done && base_now_ns() < end)
                ucp_worker_progress(ctx->worker);
            if (!done) {
                ucp_request_cancel(ctx->worker, s);
                ucp_request_free(s);
                return; /* buf may still be written: leaked rather than freed under UCX */
            }
            ucp_request_free(s);
        }
        free(buf);
    }
}

static void ucx_fini(transport_ctx_t *ctx)
{
    if (ctx == NULL) return;
    /* Receives posted and never matched (the communicator was abandoned) are cancelled; their
     * callbacks run in the progress below, while our requests still exist. */
    for (transport_req_t *r = ctx->reqs; r; r = r->next)
        for (int k = 0; k < 2; k++)
            if (r->pt[k].handle && !r->send) ucp_request_cancel(ctx->worker, r->pt[k].handle);
    for (int i = 0; i < ctx->nactive; i++)
        if (ctx->active[i]->ctrl) ucp_request_cancel(ctx->worker, ctx->active[i]->ctrl);
    /* Endpoints: flushed where the peer is there (its last messages may still be in flight),
     * force-closed after a bound. */
    void **close = calloc((size_t)ctx->nactive + 1, sizeof(*close));
    uint64_t end = base_now_ns() + 1000000000ull;
    for (int i = 0; i < ctx->nactive; i++) {
        transport_conn_t *c = ctx->active[i];
        if (c->ep == NULL) continue;
        ucp_request_param_t p = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
            .flags = c->head.fail.failed || ctx->abort.aborted ? UCP_EP_CLOSE_FLAG_FORCE : 0};
        ucs_status_ptr_t s = ucp_ep_close_nbx(c->ep, &p);
        if (close && s && !UCS_PTR_IS_ERR(s)) close[i] = s;
    }
    for (bool busy = true; busy && base_now_ns() < end;) {
        ucp_worker_progress(ctx->worker);
        busy = false;
        for (int i = 0; close && i < ctx->nactive; i++) {
            if (close[i] == NULL) continue;
            if (ucp_request_check_status(close[i]) != UCS_INPROGRESS) {
                ucp_request_free(close[i]);
                close[i] = NULL;
            } else {
                busy = true;
            }
        }
    }
    for (int i = 0; close && i < ctx->nactive; i++)
        if (close[i]) ucp_request_free(close[i]);
    free(close);
    drain_unexpected(ctx);
    ucp_worker_release_address(ctx->worker, ctx->addr);
    ctx->addr = NULL;
    ucp_worker_destroy(ctx->worker); /* no callback runs after this */
    ctx->worker = NULL;
    for (int i = 0; i < ctx->nactive; i++)
        free(ctx->active[i]);
    for (transport_req_t *r = ctx->reqs, *n; r; r = n) {
        n = r->next;
        free(r);
    }
    ctx->reqs = NULL;
    ctx_free(ctx);
}

const transport_ops_t transport_ucx = {
    .name = "ucx",
    .callers = ucx_callers,
    .caps = TRANSPORT_CAP_MSG,
    .reach = TRANSPORT_REACH_NODE | TRANSPORT_REACH_NET,
    .mem_types = TRANSPORT_MEM_HOST,
    .bw_GBps = 5.0,
    .latency_us = 5.0,
    /* each message is a rendezvous (a request to send and its answer) before the bytes move:
     * 4 MiB one way on the dev machine moved 9.3 GB/s in 256 KiB pieces and 10.6 in 2 MiB ones
     * (medians of 4; UCX_TLS=tcp 2.6 against 4.9), ucx_perftest 9.7 (4.0) in one
     * (perf/RESULTS.md) */
    .p2p_piece = 2u << 20,
    .init = ucx_init,
    .connect = ucx_connect,
    .isend = ucx_isend,
    .irecv = ucx_irecv,
    .test = ucx_test,
    .progress = ucx_progress,
    .pollfds = ucx_pollfds,
    .abort = ucx_abort,
    .idle_ns = ucx_idle_ns,
    .peer_name = transport_peer_name,
    .conn_error = transport_conn_error,
    .address = ucx_address,
    .connect_addr = ucx_connect_addr,
    .reg_mr = NULL,
    .fini = ucx_fini,
};
