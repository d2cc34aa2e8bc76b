/*
 * The device side of a fusion context (fusion_dev.h): the launcher thread and what it orders on
 * the context's stream.
 */
#include "fusion_dev.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "coll.h"
#include "cudrv.h"
#include "progress.h"
#include "reduce.h"

struct fzd_event {
    CUevent ev;
    fzd_event_t *next; /* in the pool */
};

struct fzd {
    loomComm_t comm;
    int rank;
    const cudrv_t *drv;
    CUdevice cudev;
    CUcontext ctx; /* the GPU's primary context (retained) */
    CUstream st;   /* the context's stream */
    CUevent last;  /* recorded after every bucket */
    fzd_event_t *pool;
    pthread_mutex_t pool_lock;

    CUdeviceptr stage;
    size_t stage_cap, stage_max;

    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool quit, job, done; /* a bucket handed over; ordered */
    loomResult_t res;
    char text[1024];
    /* the bucket (the launcher's while `job`) */
    fzd_seg_t *segs;
    size_t nsegs, segcap;
    size_t elems;
    loomDataType_t type;
    loomRedOp_t op;
    bool contiguous;
    coll_copy_t *copies;
    size_t copycap;
};

static CUcontext ctx_enter(fzd_t *d)
{
    return cudrv_ctx_enter(d->drv, d->ctx);
}

static void ctx_leave(fzd_t *d, CUcontext prev)
{
    cudrv_ctx_leave(d->drv, d->ctx, prev);
}

static loomResult_t cu_fail(fzd_t *d, CUresult cr, const char *what)
{
    return base_error(loomUnhandledCudaError, LOG_CUDA, "loomFusion: rank %d: %s: %s", d->rank,
                      what, cudrv_err(cr));
}

/* The bucket's work on the context's stream (the launcher's thread, context current). */
static loomResult_t order_bucket(fzd_t *d)
{
    const cudrv_t *u = d->drv;
    CUresult cr;
    size_t es = red_type_size(d->type), bytes = d->elems * es;
    for (size_t k = 0; k < d->nsegs; k++)
        if (d->segs[k].first && (cr = u->cuStreamWaitEvent(d->st, d->segs[k].ev->ev, 0)))
            return cu_fail(d, cr, "ordering a bucket after its tensors' producers");
    void *buf = d->nsegs ? d->segs[0].ptr : NULL;
    if (!d->contiguous) {
        if (bytes > d->stage_cap) { /* what used the smaller stage is done first */
            if (d->stage) {
                if ((cr = u->cuStreamSynchronize(d->st)))
                    return cu_fail(d, cr, "waiting for the stage before growing it");
                u->cuMemFree(d->stage);
                d->stage = 0;
                d->stage_cap = 0;
            }
            size_t want = LOOM_MAX(bytes, d->stage_max);
            if ((cr = u->cuMemAlloc(&d->stage, want))) {
                d->stage = 0;
                return base_error(loomSystemError, LOG_CUDA,
                                  "loomFusion: rank %d: allocating a device stage of %zu bytes "
                                  "for a bucket: %s",
                                  d->rank, want, cudrv_err(cr));
            }
            d->stage_cap = want;
        }
        if (d->nsegs > d->copycap) {
            size_t n = LOOM_MAX(d->nsegs, 2 * d->copycap);
            coll_copy_t *c = realloc(d->copies, n * sizeof(*c));
            if (c == NULL)
                return base_error(loomSystemError, LOG_COLL, "loomFusion: out of memory");
            d->copies = c;
            d->copycap = n;
        }
        size_t off = 0;
        for (size_t k = 0; k < d->nsegs; k++) {
            d->copies[k] = (coll_copy_t){.src = d->segs[k].ptr,
                                         .dst = (char *)(uintptr_t)d->stage + off,
                                         .bytes = d->segs[k].bytes};
            off += d->segs[k].bytes;
        }
        LOOM_CHECK(coll_dev_copy(d->comm, d->copies, (int)d->nsegs, (cudaStream_t)d->st));
        buf = (void *)(uintptr_t)d->stage;
    }
    LOOM_CHECK(coll_dev_allreduce(d->comm, buf, d->elems, d->type, d->op, (cudaStream_t)d->st));
    if (!d->contiguous) {
        for (size_t k = 0; k < d->nsegs; k++) { /* the same ranges, the other way */
            const void *s = d->copies[k].dst;
            d->copies[k].dst = d->segs[k].ptr;
            d->copies[k].src = s;
        }
        LOOM_CHECK(coll_dev_copy(d->comm, d->copies, (int)d->nsegs, (cudaStream_t)d->st));
    }
    for (size_t k = 0; k < d->nsegs; k++)
        if (d->segs[k].last && (cr = u->cuEventRecord(d->segs[k].ev->ev, d->st)))
            return cu_fail(d, cr, "marking a tensor's end");
    if ((cr = u->cuEventRecord(d->last, d->st))) return cu_fail(d, cr, "marking a bucket's end");
    return loomSuccess;
}

static void *launcher(void *arg)
{
    fzd_t *d = arg;
    log_set_rank(d->rank);
    d->drv->cuCtxSetCurrent(d->ctx);
    pthread_mutex_lock(&d->lock);
    for (;;) {
        while (!d->job && !d->quit)
            pthread_cond_wait(&d->cond, &d->lock);
        if (!d->job) break;
        pthread_mutex_unlock(&d->lock);
        base_clear_error();
        loomResult_t r = order_bucket(d);
        pthread_mutex_lock(&d->lock);
        d->res = r;
        if (r != loomSuccess) snprintf(d->text, sizeof(d->text), "%s", base_last_error());
        d->job = false;
        d->done = true;
        progress_wake();
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

loomResult_t fzd_open(loomComm_t comm, const void *p, int ord, size_t stage_bytes, fzd_t **out)
{
    const char *why = NULL;
    const cudrv_t *u = cudrv_get(&why);
    if (u == NULL)
        return base_error(loomInvalidUsage, LOG_CUDA, "loomFusionEnqueue: device tensor but %s",
                          why);
    LOOM_CHECK(coll_dev_prepare(comm, p, ord, "loomFusionEnqueue"));
    fzd_t *d = calloc(1, sizeof(*d));
    if (d == NULL) return base_error(loomSystemError, LOG_COLL, "loomFusionEnqueue: out of memory");
    d->comm = comm;
    d->rank = coll_rank(comm);
    d->drv = u;
    d->stage_max = stage_bytes;
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->pool_lock, NULL);
    pthread_cond_init(&d->cond, NULL);
    CUresult cr = u->cuDeviceGet(&d->cudev, ord);
    if (cr == CUDA_SUCCESS) cr = u->cuDevicePrimaryCtxRetain(&d->ctx, d->cudev);
    if (cr != CUDA_SUCCESS) {
        d->ctx = NULL;
        loomResult_t r = cu_fail(d, cr, "the GPU's context");
        fzd_close(d);
        return r;
    }
    CUcontext prev = ctx_enter(d);
    cr = u->cuStreamCreate(&d->st, CU_STREAM_NON_BLOCKING);
    if (cr == CUDA_SUCCESS) cr = u->cuEventCreate(&d->last, CU_EVENT_DISABLE_TIMING);
    ctx_leave(d, prev);
    if (cr != CUDA_SUCCESS) {
        loomResult_t r = cu_fail(d, cr, "creating the context's stream");
        fzd_close(d);
        return r;
    }
    if (pthread_create(&d->thread, NULL, launcher, d) != 0) {
        fzd_close(d);
        return base_error(loomSystemError, LOG_COLL,
                          "loomFusionEnqueue: rank %d: pthread_create (the bucket launcher)",
                          d->rank);
    }
    d->started = true;
    *out = d;
    return loomSuccess;
}

void fzd_close(fzd_t *d)
{
    if (d == NULL) return;
    if (d->started) {
        pthread_mutex_lock(&d->lock);
        d->quit = true;
        pthread_cond_broadcast(&d->cond);
        pthread_mutex_unlock(&d->lock);
        pthread_join(d->thread, NULL);
    }
    const cudrv_t *u = d->drv;
    if (d->ctx) {
        CUcontext prev = ctx_enter(d);
        if (d->st) u->cuStreamSynchronize(d->st); /* nothing still reads the stage */
        if (d->stage) u->cuMemFree(d->stage);
        for (fzd_event_t *e = d->pool, *n; e; e = n) {
            n = e->next;
            u->cuEventDestroy(e->ev);
            free(e);
        }
        if (d->last) u->cuEventDestroy(d->last);
        if (d->st) u->cuStreamDestroy(d->st);
        ctx_leave(d, prev);
        u->cuDevicePrimaryCtxRelease(d->cudev);
    }
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->pool_lock);
    pthread_cond_destroy(&d->cond);
    free(d->segs);
    free(d->copies);
    free(d);
}

loomResult_t fzd_tensor(fzd_t *d, cudaStream_t stream, fzd_event_t **out)
{
    pthread_mutex_lock(&d->pool_lock);
    fzd_event_t *e = d->pool;
    if (e) d->pool = e->next;
    pthread_mutex_unlock(&d->pool_lock);
    CUresult cr = CUDA_SUCCESS;
    CUcontext prev = ctx_enter(d);
    if (e == NULL) {
        e = calloc(1, sizeof(*e));
        if (e == NULL) {
            ctx_leave(d, prev);
            return base_error(loomSystemError, LOG_COLL, "loomFusionEnqueue: out of memory");
        }
        cr = d->drv->cuEventCreate(&e->ev, CU_EVENT_DISABLE_TIMING);
        if (cr != CUDA_SUCCESS) {
            free(e);
            ctx_leave(d, prev);
            return cu_fail(d, cr, "creating a tensor's event");
        }
    }
    cr = d->drv->cuEventRecord(e->ev, (CUstream)stream);
    ctx_leave(d, prev);
    if (cr != CUDA_SUCCESS) {
        fzd_tensor_free(d, e);
        return cu_fail(d, cr, "recording a tensor's event on its stream");
    }
    *out = e;
    return loomSuccess;
}

loomResult_t fzd_wait_tensor(fzd_t *d, fzd_event_t *ev, cudaStream_t stream)
{
    CUcontext prev = ctx_enter(d);
    CUresult cr = d->drv->cuStreamWaitEvent((CUstream)stream, ev->ev, 0);
    ctx_leave(d, prev);
    return cr == CUDA_SUCCESS ? loomSuccess : cu_fail(d, cr, "ordering a stream after a tensor");
}

loomResult_t fzd_wait_all(fzd_t *d, cudaStream_t stream)
{
    CUcontext prev = ctx_enter(d);
    CUresult cr = d->drv->cuStreamWaitEvent((CUstream)stream, d->last, 0);
    ctx_leave(d, prev);
    return cr == CUDA_SUCCESS ? loomSuccess : cu_fail(d, cr, "ordering a stream after the step");
}

void fzd_tensor_free(fzd_t *d, fzd_event_t *ev)
{
    if (ev == NULL) return;
    pthread_mutex_lock(&d->pool_lock);
    ev->next = d->pool;
    d->pool = ev;
    pthread_mutex_unlock(&d->pool_lock);
}

fzd_seg_t *fzd_segs(fzd_t *d, size_t n)
{
    if (n > d->segcap) {
        size_t c = LOOM_MAX(n, 2 * d->segcap);
        fzd_seg_t *s = realloc(d->segs, c * sizeof(*s));
        if (s == NULL) return NULL;
        d->segs = s;
        d->segcap = c;
    }
    return d->segs;
}

void fzd_submit(fzd_t *d, size_t n, size_t elems, loomDataType_t type, loomRedOp_t op,
                bool contiguous)
{
    pthread_mutex_lock(&d->lock);
    d->nsegs = n;
    d->elems = elems;
    d->type = type;
    d->op = op;
    d->contiguous = contiguous;
    d->done = false;
    d->job = true;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

bool fzd_done(fzd_t *d, loomResult_t *res, char *buf, size_t len)
{
    pthread_mutex_lock(&d->lock);
    bool done = d->done;
    if (done) {
        d->done = false;
        *res = d->res;
        if (d->res != loomSuccess) snprintf(buf, len, "%s", d->text);
    }
    pthread_mutex_unlock(&d->lock);
    return done;
}
