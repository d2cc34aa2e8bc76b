/*
 * On a GPU machine: a host-only communicator creates no CUDA context and reports device -1;
 * the same communicator then takes a CUDA device buffer, binds to its GPU and reduces it (one
 * rank: the result is the input). The driver is reached through dlopen, so the program builds
 * without CUDA headers. Exit 77 where no GPU is found.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

typedef int (*fn_i)(unsigned);
typedef int (*fn_dev)(int *, int);
typedef int (*fn_state)(int, unsigned *, int *);
typedef int (*fn_retain)(void **, int);
typedef int (*fn_setcur)(void *);
typedef int (*fn_alloc)(unsigned long long *, size_t);
typedef int (*fn_copy)(void *, unsigned long long, size_t);
typedef int (*fn_copyin)(unsigned long long, const void *, size_t);
typedef int (*fn_sync)(void);

int main(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    fn_i cu_init = h ? (fn_i)dlsym(h, "cuInit") : NULL;
    if (!cu_init || cu_init(0) != 0) {
        printf("no CUDA driver or GPU here: skipped\n");
        return 77;
    }
    fn_dev dev_get = (fn_dev)dlsym(h, "cuDeviceGet");
    fn_state state = (fn_state)dlsym(h, "cuDevicePrimaryCtxGetState");
    fn_retain retain = (fn_retain)dlsym(h, "cuDevicePrimaryCtxRetain");
    fn_setcur setcur = (fn_setcur)dlsym(h, "cuCtxSetCurrent");
    fn_alloc alloc = (fn_alloc)dlsym(h, "cuMemAlloc_v2");
    fn_copy dtoh = (fn_copy)dlsym(h, "cuMemcpyDtoH_v2");
    fn_copyin htod = (fn_copyin)dlsym(h, "cuMemcpyHtoD_v2");
    fn_sync sync = (fn_sync)dlsym(h, "cuCtxSynchronize");
    int dev = 0, fails = 0;
    dev_get(&dev, 0);

    loomUniqueId id;
    loomComm_t comm;
    if (loomGetUniqueId(&id) != loomSuccess || loomCommInitRank(&comm, 1, id, 0) != loomSuccess) {
        printf("FAIL init: %s\n", loomGetLastError(NULL));
        return 1;
    }
    float host[256];
    for (int i = 0; i < 256; i++)
        host[i] = (float)i;
    loomResult_t r = loomAllReduce(host, host, 256, loomFloat32, loomSum, comm, NULL);
    unsigned flags = 0;
    int active = -1;
    state(dev, &flags, &active);
    int cudev = -2;
    loomCommCuDevice(comm, &cudev);
    printf("host allreduce: %s; primary context active afterwards: %d (want 0); "
           "loomCommCuDevice: %d (want -1)\n",
           loomGetErrorString(r), active, cudev);
    if (r != loomSuccess || active != 0 || cudev != -1) fails++;

    void *ctx = NULL;
    unsigned long long dptr = 0;
    if (retain(&ctx, dev) != 0 || setcur(ctx) != 0 || alloc(&dptr, 1024) != 0) {
        printf("FAIL: could not allocate device memory\n");
        return 1;
    }
    for (int i = 0; i < 256; i++)
        host[i] = (float)(3 * i);
    htod(dptr, host, sizeof(host));
    r = loomAllReduce((void *)(uintptr_t)dptr, (void *)(uintptr_t)dptr, 256, loomFloat32, loomSum,
                      comm, NULL);
    int sr = sync();
    float back[256];
    dtoh(back, dptr, sizeof(back));
    int bad = 0;
    for (int i = 0; i < 256; i++)
        bad += back[i] != (float)(3 * i);
    loomCommCuDevice(comm, &cudev);
    printf("device allreduce: %s (%s); sync %d; wrong elements %d; loomCommCuDevice %d (want "
           "%d)\n",
           loomGetErrorString(r), loomGetLastError(NULL), sr, bad, cudev, dev);
    if (r != loomSuccess || sr != 0 || bad || cudev != dev) fails++;
    loomCommDestroy(comm);
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
