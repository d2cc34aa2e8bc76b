/*
 * The communicator as the device executor sees it (src/cuda/dev.h): core fills in a dev_host_t
 * inside each communicator and serves the executor's requests (the communicator's error, an
 * allgather among its ranks, the host collectives of work crossing nodes), so that the executor,
 * one floor below, never reaches up into core's communicator.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll.h"
#include "comm.h"
#include "dev.h"
#include "memtype.h"
#include "progress.h"

static loomComm_t comm_of(dev_host_t *h)
{
    return (loomComm_t)((char *)h - offsetof(struct loomComm, dev.host));
}

static loomResult_t host_error(dev_host_t *h, const char **text)
{
    loomComm_t comm = comm_of(h);
    loomResult_t r = (loomResult_t)atomic_load(&comm->st.async_error);
    if (text) *text = comm->st.async_text;
    return r;
}

static void host_set_error(dev_host_t *h, loomResult_t res, const char *text)
{
    comm_set_error(comm_of(h), res, text);
}

static loomResult_t host_allgather(dev_host_t *const *hs, const void *const *send,
                                   void *const *recv, size_t bytes, int k)
{
    loomComm_t comms[k];
    for (int i = 0; i < k; i++)
        comms[i] = comm_of(hs[i]);
    return coll_allgather_many(comms, send, recv, bytes, k);
}

/* The staging communicator (every rank, same order) and the cross-node one (the ranks of one
 * local index, by node). */
static loomResult_t host_stage_open(dev_host_t *h, int cross_color)
{
    loomComm_t comm = comm_of(h);
    loomConfig_t cfg;
    LOOM_CHECK(comm_config_read(NULL, &cfg));
    LOOM_CHECK(comm_split(comm, 0, comm->rank, &cfg, &comm->dev.stage));
    return comm_split(comm, cross_color >= 0 ? cross_color : LOOM_SPLIT_NOCOLOR, comm->lay.node,
                      &cfg, &comm->dev.cross);
}

/* The executor's host operations as core's: reduce's receive buffer means nothing on the
 * other ranks unless in place, as the public entry point has it. */
static loomResult_t stage_ops(loomComm_t comm, const host_op_t *ops, int nops, coll_op_t *out)
{
    for (int i = 0; i < nops; i++) {
        const host_op_t *o = &ops[i];
        loomComm_t c = o->cross ? comm->dev.cross : comm->dev.stage;
        if (c == NULL)
            return base_error(loomInternalError, LOG_CUDA,
                              "staging: rank %d has no %s communicator for operation %d",
                              comm->rank, o->cross ? "cross-node" : "staging", i);
        void *recv = o->hrecv;
        if (o->kind == OPK_REDUCE && o->root != c->rank && recv != o->hsend) recv = NULL;
        out[i] = (coll_op_t){.comm = c,
                             .kind = o->kind,
                             .send = o->hsend,
                             .recv = recv,
                             .count = o->count,
                             .type = o->type,
                             .op = o->op,
                             .root = o->root};
    }
    return loomSuccess;
}

static loomResult_t host_stage_start(dev_host_t *h, const host_op_t *ops, int nops, void **job)
{
    coll_op_t *q = calloc((size_t)LOOM_MAX(nops, 1), sizeof(*q));
    if (q == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory (staging)");
    coll_group_t *g = NULL;
    loomResult_t r = stage_ops(comm_of(h), ops, nops, q);
    if (r == loomSuccess) r = coll_start(q, nops, &g); /* copies the operations */
    free(q);
    if (r == loomSuccess) *job = g;
    return r;
}

static loomResult_t host_stage_test(dev_host_t *h, void *job, bool *done)
{
    (void)h;
    return coll_test(job, done);
}

static void host_stage_stop(dev_host_t *h, const char *why)
{
    loomComm_t comm = comm_of(h);
    if (comm->dev.stage) comm_stop(comm->dev.stage, why);
    if (comm->dev.cross) comm_stop(comm->dev.cross, why);
}

static void host_stage_close(dev_host_t *h)
{
    loomComm_t comm = comm_of(h);
    comm_free(comm->dev.stage);
    comm_free(comm->dev.cross);
    comm->dev.stage = comm->dev.cross = NULL;
}

static loomResult_t host_progress_attach(dev_host_t *h,
                                         uint64_t (*poll)(void *arg, bool *progressed), void *arg)
{
    return progress_attach(poll, arg, comm_of(h)->tune.spin_ns, comm_of(h)->tune.hot_ns);
}

static void host_progress_detach(dev_host_t *h, void *arg)
{
    (void)h;
    progress_detach(arg);
}

static void host_progress_wake(dev_host_t *h)
{
    (void)h;
    progress_wake();
}

void comm_devhost_fill(loomComm_t comm)
{
    dev_host_t *h = &comm->dev.host;
    h->rank = comm->rank;
    h->nranks = comm->nranks;
    h->node = comm->lay.node;
    h->nnodes = comm->lay.nnodes;
    h->local_rank = comm->lay.local_rank;
    h->local_size = comm->lay.local_size;
    h->node_ranks = comm->lay.node_ranks;
    h->node_start = comm->lay.node_start;
    h->timeout_s = comm->tune.timeout_s;
    h->cuda_dev = comm->dev.cuda_dev;
    h->error = host_error;
    h->set_error = host_set_error;
    h->allgather = host_allgather;
    h->stage_open = host_stage_open;
    h->stage_start = host_stage_start;
    h->stage_test = host_stage_test;
    h->progress_attach = host_progress_attach;
    h->progress_detach = host_progress_detach;
    h->progress_wake = host_progress_wake;
    h->stage_stop = host_stage_stop;
    h->stage_close = host_stage_close;
}

/* ---- device buckets of fusion contexts (coll.h) ---- */

loomResult_t coll_dev_prepare(loomComm_t comm, const void *p, int ord, const char *fn)
{
    if (comm->dev.cuda_dev >= 0 && ord != comm->dev.cuda_dev)
        return base_error(
            loomInvalidUsage, LOG_CUDA,
            "%s: %p is on GPU %d, but rank %d of this communicator is bound to GPU %d", fn, p, ord,
            comm->rank, comm->dev.cuda_dev);
    comm->dev.cuda_dev = ord;
    dev_host_t *h = &comm->dev.host;
    if (dev_ready(h)) return loomSuccess;
    /* the first device use: collective, as a first device call is */
    atomic_fetch_add(&comm->st.active_calls, 1);
    comm_devhost_fill(comm);
    loomResult_t r = dev_setup(&h, 1);
    atomic_fetch_sub(&comm->st.active_calls, 1);
    return r;
}

void comm_dev_op(loomComm_t comm, const coll_op_t *o, dev_op_t *d)
{
    *d = (dev_op_t){.kind = o->kind,
                    .send = o->send,
                    .recv = o->recv,
                    .count = o->count,
                    .type = o->type,
                    .op = o->op,
                    .root = o->root,
                    .stream = o->stream};
    int pm = base_premul_index(o->op);
    if (pm >= 0) { /* the pre-multiplied sum's scalar */
        d->scale_host = comm->premul[pm].scalar;
        d->scale_dev = comm->premul[pm].dev_ptr;
    }
}

loomResult_t comm_dev_run(loomComm_t comm, const dev_op_t *d, int m)
{
    atomic_fetch_add(&comm->st.active_calls, 1);
    log_set_rank(comm->rank);
    loomResult_t r = dev_run(&comm->dev.host, d, m);
    if (r == loomSuccess) comm->stats.collectives += (uint64_t)m;
    atomic_fetch_sub(&comm->st.active_calls, 1);
    return r;
}

loomResult_t coll_dev_allreduce(loomComm_t comm, void *buf, size_t count, loomDataType_t type,
                                loomRedOp_t op, cudaStream_t stream)
{
    LOOM_CHECK(coll_usable(comm, "loomFusion"));
    coll_op_t o = {.comm = comm,
                   .kind = OPK_ALLREDUCE,
                   .send = buf,
                   .recv = buf,
                   .count = count,
                   .type = type,
                   .op = op,
                   .root = -1,
                   .stream = stream,
                   .dev = true};
    dev_op_t d;
    comm_dev_op(comm, &o, &d);
    return comm_dev_run(comm, &d, 1);
}

loomResult_t coll_dev_copy(loomComm_t comm, const coll_copy_t *c, int n, cudaStream_t stream)
{
    _Static_assert(sizeof(coll_copy_t) == sizeof(dev_copy_t), "one copy, two names");
    return dev_copy(&comm->dev.host, (const dev_copy_t *)(const void *)c, n, stream);
}
