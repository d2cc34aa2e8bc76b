/*
 * User buffers of the direct path mapped through CUDA IPC (see dev_impl.h): the handles of this
 * rank's allocations (export) and the peers' allocations mapped here (import), each cached by
 * allocation identity in a small LRU, since opening a handle costs milliseconds.
 */
#include "dev_impl.h"

/* The IPC handle of the allocation holding p, and p's offset in it. */
bool dev_ipc_export(dev_state_t *s, const void *p, uint64_t *id, uint64_t *off, CUipcMemHandle *h)
{
    const cudrv_t *d = s->drv.d;
    CUdeviceptr base = 0, dp = (CUdeviceptr)(uintptr_t)p;
    size_t size = 0;
    unsigned long long bid = 0;
    if (d->cuPointerGetAttribute(&bid, CU_POINTER_ATTRIBUTE_BUFFER_ID, dp) != CUDA_SUCCESS ||
        d->cuMemGetAddressRange(&base, &size, dp) != CUDA_SUCCESS)
        return false;
    *id = bid;
    *off = dp - base;
    for (int i = 0; i < DEV_IPC_CACHE; i++) {
        struct dev_ipc_out *e = &s->ipc.out[i];
        if (e->use && e->id == bid) {
            e->use = lru_tick(&s->ipc.clock);
            *h = e->h;
            return true;
        }
    }
    /* memory from the VMM API (expandable segments) has no legacy handle: the slot path */
    if (d->cuIpcGetMemHandle(h, base) != CUDA_SUCCESS) return false;
    struct dev_ipc_out *lru = &s->ipc.out[LRU_PICK(s->ipc.out, DEV_IPC_CACHE, use)];
    *lru = (struct dev_ipc_out){.id = bid, .use = lru_tick(&s->ipc.clock), .h = *h};
    return true;
}

/* Rank j's allocation `id`, mapped here (opened once, then from the cache). */
loomResult_t dev_ipc_import(dev_state_t *s, int j, uint64_t id, const CUipcMemHandle *h,
                            CUdeviceptr *base, bool pin)
{
    for (int i = 0; i < DEV_IPC_CACHE; i++) {
        struct dev_ipc_in *e = &s->ipc.in[j][i];
        if (e->use && e->id == id) {
            e->use = lru_tick(&s->ipc.clock);
            e->pin += pin;
            *base = e->base;
            return loomSuccess;
        }
    }
    /* the least recently used entry that no window holds */
    struct dev_ipc_in *lru = NULL;
    for (int i = 0; i < DEV_IPC_CACHE; i++) {
        struct dev_ipc_in *e = &s->ipc.in[j][i];
        if (e->pin) continue;
        if (lru == NULL || e->use < lru->use) lru = e;
    }
    if (lru == NULL)
        return base_error(
            loomInvalidUsage, LOG_CUDA,
            "rank %d: mapping rank %d's buffer (allocation %llu): all %d mappings of "
            "that rank's allocations are held by registered windows (deregister some)",
            s->h->rank, s->lay.lrank[j], (unsigned long long)id, DEV_IPC_CACHE);
    if (lru->use) { /* evict: kernels already queued may still read through it */
        if (s->run.ev_valid)
            s->drv.d->cuEventSynchronize(s->run.ev); /* only direct kernels read there */
        s->drv.d->cuIpcCloseMemHandle(lru->base);
        lru->use = 0;
    }
    CUresult cr = s->drv.d->cuIpcOpenMemHandle(base, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (cr != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: mapping rank %d's buffer (allocation %llu): "
                          "cuIpcOpenMemHandle: %s",
                          s->h->rank, s->lay.lrank[j], (unsigned long long)id, cudrv_err(cr));
    *lru = (struct dev_ipc_in){
        .id = id, .use = lru_tick(&s->ipc.clock), .base = *base, .pin = pin ? 1 : 0};
    return loomSuccess;
}

/* A window let go of rank j's allocation `id`: the mapping stays cached (and evictable). */
void dev_ipc_unpin(dev_state_t *s, int j, uint64_t id)
{
    for (int i = 0; i < DEV_IPC_CACHE; i++) {
        struct dev_ipc_in *e = &s->ipc.in[j][i];
        if (e->use && e->id == id && e->pin > 0) {
            e->pin--;
            return;
        }
    }
}

/* Teardown: every peer's allocation mapped here (no kernel reads them any more). */
void dev_ipc_close_all(dev_state_t *s)
{
    for (int j = 0; j < DEV_MAX_LOCAL; j++)
        for (int i = 0; i < DEV_IPC_CACHE; i++)
            if (s->ipc.in[j][i].use) s->drv.d->cuIpcCloseMemHandle(s->ipc.in[j][i].base);
}
