/*
 * User buffers of the direct path mapped through CUDA IPC (see dev_impl.h): the handles of this
 * rank's allocations (export) and the peers' allocations mapped here (import), each cached by
 * allocation identity in a small LRU, since opening a handle costs milliseconds.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* The least recently used entry of rank j's that nothing holds, or NULL. */
static struct dev_ipc_in *evictable(dev_state_t *s, int j)
{
    struct dev_ipc_in *lru = NULL;
    for (int i = 0; i < DEV_IPC_CACHE; i++) {
        struct dev_ipc_in *e = &s->ipc.in[j][i];
        if (e->pin) continue;
        if (lru == NULL || e->use < lru->use) lru = e;
    }
    return lru;
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
    /* the least recently used entry that no window or graph holds; a graph destroyed just
     * now may still be letting go (CUDA runs the destructor of its user object on a thread
     * of its own, soon after), so a full cache waits for that a little */
    dev_ipc_sweep(s);
    struct dev_ipc_in *lru = evictable(s, j);
    for (int k = 0; lru == NULL && s->ipc.holds && k < 200; k++) {
        usleep(1000);
        dev_ipc_sweep(s);
        lru = evictable(s, j);
    }
    if (lru == NULL)
        return base_error(
            loomInvalidUsage, LOG_CUDA,
            "rank %d: mapping rank %d's buffer (allocation %llu): all %d mappings of "
            "that rank's allocations are held by registered windows or by captured CUDA graphs "
            "still alive (deregister windows, or destroy graphs)",
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

/* The graph's reference, dropped by CUDA once the graph and its instances are gone (after
 * their launches ended); the last reference frees the record. */
static void hold_drop(void *p)
{
    dev_hold_t *k = p;
    if (atomic_fetch_sub(&k->refs, 1) == 1) free(k);
}

loomResult_t dev_ipc_hold(dev_state_t *s, CUgraph g, uint64_t seq, const struct dev_hold_pin *pin,
                          int npin)
{
    const cudrv_t *d = s->drv.d;
    dev_hold_t *k = calloc(1, sizeof(*k));
    CUuserObject obj = NULL;
    CUresult cr = CUDA_SUCCESS;
    const char *what = "calloc";
    if (k) {
        atomic_init(&k->refs, 2);
        k->seq = seq;
        k->npin = npin;
        memcpy(k->pin, pin, (size_t)npin * sizeof(*pin));
        what = "cuUserObjectCreate";
        cr = d->cuUserObjectCreate(&obj, k, hold_drop, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
        if (cr == CUDA_SUCCESS) {
            what = "cuGraphRetainUserObject";
            /* the graph takes over the object's one reference */
            cr = d->cuGraphRetainUserObject(g, obj, 1, CU_GRAPH_USER_OBJECT_MOVE);
            if (cr != CUDA_SUCCESS) {
                atomic_fetch_sub(&k->refs, 1); /* the release below runs hold_drop */
                d->cuUserObjectRelease(obj, 1);
            }
        }
    }
    if (k == NULL || cr != CUDA_SUCCESS) {
        if (k && obj == NULL) free(k);
        for (int i = 0; i < npin; i++)
            dev_ipc_unpin(s, pin[i].j, pin[i].id);
        if (k == NULL) return base_error(loomSystemError, LOG_CUDA, "out of memory");
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "rank %d: device operation %llu, captured in a CUDA graph: tying the "
                          "peers' mapped buffers to the graph's life (%s): %s",
                          s->h->rank, (unsigned long long)seq, what, cudrv_err(cr));
    }
    k->next = s->ipc.holds;
    s->ipc.holds = k;
    return loomSuccess;
}

void dev_ipc_sweep(dev_state_t *s)
{
    for (dev_hold_t **pp = &s->ipc.holds; *pp;) {
        dev_hold_t *k = *pp;
        if (atomic_load(&k->refs) != 1) {
            pp = &k->next;
            continue;
        }
        *pp = k->next;
        for (int i = 0; i < k->npin; i++)
            dev_ipc_unpin(s, k->pin[i].j, k->pin[i].id);
        INFO(LOG_CUDA,
             "rank %d: the graph that captured device operation %llu is gone: %d "
             "mappings of peers' buffers let go",
             s->h->rank, (unsigned long long)k->seq, k->npin);
        free(k);
    }
}

/* Teardown: every peer's allocation mapped here (no kernel reads them any more; a graph still
 * alive must not be replayed after its communicator is destroyed). */
void dev_ipc_close_all(dev_state_t *s)
{
    while (s->ipc.holds) {
        dev_hold_t *k = s->ipc.holds;
        s->ipc.holds = k->next;
        if (atomic_fetch_sub(&k->refs, 1) == 1) free(k);
    }
    for (int j = 0; j < DEV_MAX_LOCAL; j++)
        for (int i = 0; i < DEV_IPC_CACHE; i++)
            if (s->ipc.in[j][i].use) s->drv.d->cuIpcCloseMemHandle(s->ipc.in[j][i].base);
}
