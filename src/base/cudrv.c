#include "cudrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudrv_t table;
static const cudrv_t *loaded;
static char why_not[256] = "not looked for";

static void load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(why_not, sizeof(why_not), "no CUDA driver (dlopen libcuda.so.1: %s)", dlerror());
        return;
    }
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        (CUresult(*)(const char *, void **, int, cuuint64_t,
                     CUdriverProcAddressQueryResult *))dlsym(h, "cuGetProcAddress_v2");
    if (gpa == NULL) {
        snprintf(why_not, sizeof(why_not),
                 "the CUDA driver is older than CUDA 12 (no cuGetProcAddress_v2)");
        return;
    }
#define CUDRV_LOAD(n)                                                                              \
    {                                                                                              \
        CUdriverProcAddressQueryResult st;                                                         \
        if (gpa(#n, (void **)&table.n, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || \
            table.n == NULL) {                                                                     \
            snprintf(why_not, sizeof(why_not), "the CUDA driver lacks %s", #n);                    \
            return;                                                                                \
        }                                                                                          \
    }
    CUDRV_FUNCS(CUDRV_LOAD)
#undef CUDRV_LOAD
    {
        CUdriverProcAddressQueryResult st;
        if (gpa("cuStreamGetCaptureInfo", (void **)&table.cuStreamGetCaptureInfo3, 12030,
                CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||
            table.cuStreamGetCaptureInfo3 == NULL) {
            snprintf(why_not, sizeof(why_not),
                     "the CUDA driver lacks cuStreamGetCaptureInfo (CUDA 12.3's)");
            return;
        }
    }
    CUresult r = table.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *s = NULL;
        table.cuGetErrorString(r, &s);
        snprintf(why_not, sizeof(why_not), "cuInit failed: %s (no usable GPU)", s ? s : "?");
        return;
    }
    table.cuDriverGetVersion(&table.driver_version);
    if (table.cuDeviceGetCount(&table.ndev) != CUDA_SUCCESS || table.ndev <= 0) {
        snprintf(why_not, sizeof(why_not), "the CUDA driver sees no GPU");
        return;
    }
    loaded = &table;
}

const cudrv_t *cudrv_get(const char **why)
{
    pthread_once(&once, load);
    if (loaded == NULL && why) *why = why_not;
    return loaded;
}

static pthread_once_t peek_once = PTHREAD_ONCE_INIT;
static cudrv_attrs_fn peek_attrs;

static void peek_load(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) peek_attrs = (cudrv_attrs_fn)dlsym(h, "cuPointerGetAttributes");
}

cudrv_attrs_fn cudrv_peek_attrs(void)
{
    pthread_once(&peek_once, peek_load);
    return peek_attrs;
}

const char *cudrv_err(CUresult r)
{
    static _Thread_local char buf[160];
    const char *name = NULL, *text = NULL;
    if (loaded) {
        loaded->cuGetErrorName(r, &name);
        loaded->cuGetErrorString(r, &text);
    }
    snprintf(buf, sizeof(buf), "%s (%s)", name ? name : "CUDA error", text ? text : "?");
    return buf;
}

CUcontext cudrv_ctx_enter(const cudrv_t *d, CUcontext ctx)
{
    CUcontext prev = NULL;
    d->cuCtxGetCurrent(&prev);
    if (prev != ctx) d->cuCtxSetCurrent(ctx);
    return prev;
}

void cudrv_ctx_leave(const cudrv_t *d, CUcontext ctx, CUcontext prev)
{
    if (prev != ctx) d->cuCtxSetCurrent(prev);
}
