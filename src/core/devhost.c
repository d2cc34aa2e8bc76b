/*
 * The communicator as the device executor sees it (src/cuda/dev.h): core fills in a dev_host_t
 * inside each communicator and serves the executor's requests (the communicator's error, an
 * allgather among its ranks, the host collectives of work crossing nodes), so that the executor,
 * one floor below, never reaches up into core's communicator.
 */
#include <stddef.h>
#include <stdio.h>

#include "comm.h"
#include "dev.h"

loomResult_t coll_internal_allgather_many(loomComm_t *comms, const void *const *send,
                                          void *const *recv, size_t bytes, int k);

static loomComm_t comm_of(dev_host_t *h)
{
    return (loomComm_t)((char *)h - offsetof(struct loomComm, devh));
}

static loomResult_t host_error(dev_host_t *h, const char **text)
{
    loomComm_t comm = comm_of(h);
    loomResult_t r = (loomResult_t)atomic_load(&comm->async_error);
    if (text) *text = comm->async_text;
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
    return coll_internal_allgather_many(comms, send, recv, bytes, k);
}

/* The staging communicator (every rank, same order) and the cross-node one (the ranks of one
 * local index, by node). */
static loomResult_t host_stage_open(dev_host_t *h, int cross_color)
{
    loomComm_t comm = comm_of(h);
    LOOM_CHECK(loomCommSplit(comm, 0, comm->rank, &comm->dev_stage, NULL));
    return loomCommSplit(comm, cross_color >= 0 ? cross_color : LOOM_SPLIT_NOCOLOR, comm->node,
                         &comm->dev_cross, NULL);
}

static loomResult_t host_stage_run(dev_host_t *h, const host_op_t *ops, int nops)
{
    loomComm_t comm = comm_of(h);
    LOOM_CHECK(loomGroupStart());
    loomResult_t res = loomSuccess;
    for (int i = 0; i < nops && res == loomSuccess; i++) {
        const host_op_t *o = &ops[i];
        loomComm_t c = o->cross ? comm->dev_cross : comm->dev_stage;
        switch (o->kind) {
        case OPK_ALLREDUCE:
            res = loomAllReduce(o->hsend, o->hrecv, o->count, o->type, o->op, c, NULL);
            break;
        case OPK_BROADCAST:
            res = loomBroadcast(o->hsend, o->hrecv, o->count, o->type, o->root, c, NULL);
            break;
        case OPK_REDUCE:
            res = loomReduce(o->hsend, o->hrecv, o->count, o->type, o->op, o->root, c, NULL);
            break;
        case OPK_ALLGATHER:
            res = loomAllGather(o->hsend, o->hrecv, o->count, o->type, c, NULL);
            break;
        case OPK_REDUCESCATTER:
            res = loomReduceScatter(o->hsend, o->hrecv, o->count, o->type, o->op, c, NULL);
            break;
        case OPK_ALLTOALL:
            res = loomAlltoAll(o->hsend, o->hrecv, o->count, o->type, c, NULL);
            break;
        case OPK_SEND: res = loomSend(o->hsend, o->count, o->type, o->root, c, NULL); break;
        case OPK_RECV: res = loomRecv(o->hrecv, o->count, o->type, o->root, c, NULL); break;
        default:
            res = base_error(loomInternalError, LOG_CUDA, "staging: operation kind %d", o->kind);
            break;
        }
    }
    loomResult_t g = loomGroupEnd();
    return res != loomSuccess ? res : g;
}

static void host_stage_stop(dev_host_t *h, const char *why)
{
    loomComm_t comm = comm_of(h);
    if (comm->dev_stage) comm_stop(comm->dev_stage, why);
    if (comm->dev_cross) comm_stop(comm->dev_cross, why);
}

static void host_stage_close(dev_host_t *h)
{
    loomComm_t comm = comm_of(h);
    if (comm->dev_stage) loomCommDestroy(comm->dev_stage);
    if (comm->dev_cross) loomCommDestroy(comm->dev_cross);
    comm->dev_stage = comm->dev_cross = NULL;
}

void comm_devhost_fill(loomComm_t comm)
{
    dev_host_t *h = &comm->devh;
    h->rank = comm->rank;
    h->nranks = comm->nranks;
    h->node = comm->node;
    h->nnodes = comm->nnodes;
    h->local_rank = comm->local_rank;
    h->local_size = comm->local_size;
    h->node_ranks = comm->node_ranks;
    h->node_start = comm->node_start;
    h->timeout_s = comm->timeout_s;
    h->cuda_dev = comm->cuda_dev;
    h->error = host_error;
    h->set_error = host_set_error;
    h->allgather = host_allgather;
    h->stage_open = host_stage_open;
    h->stage_run = host_stage_run;
    h->stage_stop = host_stage_stop;
    h->stage_close = host_stage_close;
}
