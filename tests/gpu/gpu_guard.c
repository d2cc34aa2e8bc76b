/*
 * On a GPU machine: a host-only communicator creates no CUDA context, reports device -1, and a
 * CUDA device buffer is refused with loomInvalidUsage and a text saying why (this version has no
 * device executor yet) instead of being read as host memory. The driver is reached through
 * dlopen, so the program builds without CUDA headers. Exit 77 where no GPU is found.
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
    int dev = 0, fails = 0;
    dev_get(&dev, 0);

    loomUniqueId id;
    loomComm_t comm;
    if (loomGetUniqueId(&id) != loomSuccess || loomCommInitRank(&comm, 1, id, 0) != loomSuccess) {
        printf("FAIL init: %s\n", loomGetLastError(NULL));
        return 1;
    }
    float host[256];
    for (int i = 0; i < 256; i++) host[i] = (float)i;
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
    r = loomAllReduce((void *)(uintptr_t)dptr, (void *)(uintptr_t)dptr, 256, loomFloat32,
                      loomSum, comm, NULL);
    const char *text = loomGetLastError(NULL);
    printf("device allreduce: %s: %s\n", loomGetErrorString(r), text);
    if (r != loomInvalidUsage || strstr(text, "device") == NULL) fails++;
    loomCommDestroy(comm);
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails ? 1 : 0;
}
