#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base.h"
#include "param.h"
#include "transport.h"

static const transport_ops_t *const transports[] = {
    &transport_tcp,
    &transport_shm,
#ifdef LOOM_HAVE_MPI
    &transport_mpi,
#endif
#ifdef LOOM_HAVE_UCX
    &transport_ucx,
#endif
};

const transport_ops_t *const *transport_all(size_t *n)
{
    *n = sizeof(transports) / sizeof(transports[0]);
    return transports;
}

const transport_ops_t *transport_by_name(const char *name)
{
    size_t n;
    const transport_ops_t *const *all = transport_all(&n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}

void transport_fail(transport_fail_t *f, loomResult_t code, const char *fmt, ...)
{
    if (f->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->text, sizeof(f->text), fmt, ap);
    va_end(ap);
    f->failed = true;
    f->code = code;
}

loomResult_t transport_conn_check(transport_conn_head_t *h, const transport_abort_t *a)
{
    if (h->fail.failed) return h->fail.code;
    if (a->aborted) {
        transport_fail(&h->fail, loomRemoteError, "communicator aborted: %s", a->reason);
        return loomRemoteError;
    }
    return loomSuccess;
}

void transport_conn_name(transport_conn_head_t *h, int peer, const char *where)
{
    snprintf(h->name, sizeof(h->name), "rank %d (%s)", peer, where);
}

loomResult_t transport_req_finish(const transport_conn_head_t *h, bool bad_len,
                                  const uint8_t got[TRANSPORT_META_BYTES], int *done,
                                  uint8_t meta[TRANSPORT_META_BYTES])
{
    if (meta) memcpy(meta, got, TRANSPORT_META_BYTES);
    *done = 1;
    return bad_len ? h->fail.code : loomSuccess;
}

void transport_conn_recv_failed(transport_conn_head_t *h, ssize_t n, int err)
{
    if (n == 0)
        transport_fail(&h->fail, loomRemoteError,
                       "connection closed by %s (the peer exited or died)", h->name);
    else
        transport_fail(&h->fail, loomRemoteError, "recv from %s failed: %s (the peer died?)",
                       h->name, strerror(err));
}

void transport_conn_send_failed(transport_conn_head_t *h, int err)
{
    transport_fail(&h->fail, loomRemoteError, "send to %s failed: %s (the peer died?)", h->name,
                   strerror(err));
}

int transport_conn_handshake(transport_conn_head_t *h, hs_t *hs, bool *progressed)
{
    if (hs_progress(hs, progressed) != loomSuccess) {
        transport_fail(&h->fail, loomRemoteError, "connection to %s failed: %s", h->name, hs->err);
        return -1;
    }
    return hs->state == HS_DONE;
}

uint64_t transport_conn_idle_ns(const transport_conn_head_t *h, bool connecting, bool *pending)
{
    *pending = h->pending > 0 || connecting;
    uint64_t now = base_coarse_ns(); /* the stamps are the coarse clock's */
    return now > h->last_activity_ns ? now - h->last_activity_ns : 0;
}

/* Both transports' connections start with their head (TRANSPORT_CONN_HEAD_FIRST). */
const char *transport_peer_name(transport_conn_t *conn)
{
    return ((const transport_conn_head_t *)(void *)conn)->name;
}

const char *transport_conn_error(transport_conn_t *conn)
{
    return ((const transport_conn_head_t *)(void *)conn)->fail.text;
}

int transport_peer_call(transport_conn_t *conn)
{
    return ((const transport_conn_head_t *)(void *)conn)->peer_call;
}

int transport_my_call(const transport_setup_t *setup)
{
    return setup->call_state ? atomic_load(setup->call_state) : TRANSPORT_CALL_NONE;
}

bool transport_peer_call_known(transport_conn_t *conn)
{
    return ((const transport_conn_head_t *)(void *)conn)->peer_call_known;
}

void transport_peer_call_set(transport_conn_head_t *h, uint32_t v)
{
    h->peer_call_known = true;
    h->peer_call = v <= TRANSPORT_CALL_WAITS_IDLE ? (int)v : TRANSPORT_CALL_NONE;
}

const char *transport_hello_refusal(const transport_setup_t *setup, const hs_hello_t *hello,
                                    bool *reverse)
{
    if (hello->comm_id != setup->comm_id) return "it belongs to another communicator";
    if (hello->to_rank != setup->rank) return "it was meant for another rank";
    if (hello->from_rank < 0 || hello->from_rank >= setup->nranks ||
        hello->from_rank == setup->rank)
        return "bad source rank";
    /* The lower rank of a pair dials; the higher one too when the lower is late (reverse). */
    *reverse = hello->from_rank > setup->rank;
    return NULL;
}

uint64_t transport_ping_ns(void)
{
    return (uint64_t)(LOOM_MAX(0.05, LOOM_MIN(1.0, param_double(PARAM_TIMEOUT) / 4)) * 1e9);
}

bool transport_accept_due(uint64_t *next_accept_ns, bool wanted)
{
    uint64_t now = base_coarse_ns();
    if (!wanted && now < *next_accept_ns) return false;
    *next_accept_ns = now + TRANSPORT_ACCEPT_EVERY_NS;
    return true;
}

void transport_abort_grace(bool (*step)(void *arg, bool *progressed), void *arg)
{
    uint64_t end = base_now_ns() + TRANSPORT_ABORT_GRACE_NS;
    while (base_now_ns() < end) {
        bool progressed = false;
        if (!step(arg, &progressed)) break;
        if (!progressed) usleep(2000);
    }
}

void transport_abort_set(transport_abort_t *a, const char *reason)
{
    a->aborted = true;
    snprintf(a->reason, sizeof(a->reason), "%s", reason);
}
