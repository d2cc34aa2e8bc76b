/* The planner (plan.h). */
#include "plan.h"

#include "reduce.h"
#include "registry.h"

bool plan_inplace(int kind, int rank, uint64_t count, size_t elem_size, const void *send,
                  const void *recv)
{
    size_t mine = (size_t)rank * (size_t)count * elem_size;
    switch (kind) {
    case OPK_ALLREDUCE:
    case OPK_REDUCE:
    case OPK_BROADCAST: return send == recv;
    case OPK_ALLGATHER:
    case OPK_SPLIT: return (const uint8_t *)send == (const uint8_t *)recv + mine;
    case OPK_REDUCESCATTER: return (const uint8_t *)recv == (const uint8_t *)send + mine;
    default: return false;
    }
}

plan_alias_t plan_alias(const plan_ctx_t *ctx, const plan_call_t *call)
{
    const sched_desc_t *d = &call->desc;
    int64_t mine = (int64_t)ctx->rank * (int64_t)d->count;
    plan_alias_t a = {.inplace = call->inplace};
    switch (d->kind) {
    case OPK_ALLREDUCE:
    case OPK_REDUCE:
        if (call->inplace) a.alias_to = SCHED_BUF_RECV;
        break;
    case OPK_BROADCAST:
        /* only the root has an input; everyone else receives into its output alone */
        a.inplace = ctx->rank != d->root || call->inplace;
        if (ctx->rank == d->root && call->inplace) a.alias_to = SCHED_BUF_RECV;
        break;
    case OPK_ALLGATHER:
    case OPK_SPLIT:
        if (call->inplace) a.alias_to = SCHED_BUF_RECV, a.alias_delta = mine;
        break;
    case OPK_REDUCESCATTER:
        if (call->inplace)
            a.alias_from = SCHED_BUF_RECV, a.alias_to = SCHED_BUF_SEND, a.alias_delta = mine;
        break;
    default: a.inplace = false; break;
    }
    if (a.alias_to && !a.alias_from) a.alias_from = SCHED_BUF_SEND;
    return a;
}

ring_params_t plan_ring_params(const plan_ctx_t *ctx, loomDataType_t type)
{
    ring_params_t p = {.nchannels = ctx->nchannels,
                       .slice_elems = LOOM_MAX(ctx->slice_bytes / red_type_size(type), 1)};
    return p;
}

loomResult_t plan_build(const plan_ctx_t *ctx, const plan_call_t *call, sched_t *s)
{
    const sched_desc_t *d = &call->desc;
    ring_params_t prm = plan_ring_params(ctx, (loomDataType_t)d->dtype);
    plan_alias_t a = plan_alias(ctx, call);
    uint64_t n = d->count;
    bool in = a.inplace, avg = call->avg;
    uint16_t di = sched_add_desc(s, d);
    if (a.alias_from != a.alias_to) sched_set_alias(s, a.alias_from, a.alias_to, a.alias_delta);
    switch (d->kind) {
    case OPK_ALLREDUCE: {
        const registry_algo_t *row = registry_get(call->algo);
        if (row == NULL) row = registry_get(ALGO_RING);
        row->gen(s, di, &ctx->topo, n, &prm, in, avg);
        break;
    }
    case OPK_BROADCAST:
    case OPK_REDUCE: {
        if (d->kind == OPK_REDUCE && call->algo == ALGO_DETERM) {
            determ_reduce(s, di, n, d->root, &prm, in, avg);
            break;
        }
        /* the row's rooted form; a row without one (or none chosen) runs the ring's */
        int op = d->kind == OPK_REDUCE ? ROOTED_REDUCE : ROOTED_BROADCAST;
        const registry_algo_t *row = registry_get(registry_rooted_forced(call->algo, op));
        if (row == NULL) row = registry_get(ALGO_RING);
        row->rooted[op].gen(s, di, n, d->root, &prm, in, avg);
        break;
    }
    case OPK_ALLGATHER:
    case OPK_SPLIT: ring_allgather(s, di, n, &prm, in); break;
    case OPK_REDUCESCATTER:
        if (call->algo == ALGO_DETERM)
            determ_reduce_scatter(s, di, n, &prm, in, avg);
        else
            ring_reduce_scatter(s, di, n, &prm, in, avg);
        break;
    case OPK_ALLTOALL: direct_alltoall(s, di, n, &prm); break;
    default: return base_error(loomInternalError, LOG_COLL, "unknown operation kind %d", d->kind);
    }
    return sched_status(s);
}
