#include "cuda_tp.h"

#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CU_TRY(call, what)                                                                         \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            res = base_error(loomUnhandledCudaError, LOG_CUDA, "%s: %s failed: %s", what, #call,   \
                             cudrv_err(r_));                                                       \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static loomResult_t map_handle(const cudrv_t *d, int dev, CUmemGenericAllocationHandle h,
                               size_t size, cuda_mem_t *out, const char *what)
{
    loomResult_t res = loomSuccess;
    CUdeviceptr va = 0;
    int mapped = 0;
    CU_TRY(d->cuMemAddressReserve(&va, size, 0, 0, 0), what);
    CU_TRY(d->cuMemMap(va, size, 0, h, 0), what);
    mapped = 1;
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU_TRY(d->cuMemSetAccess(va, size, &acc, 1), what);
    out->ptr = va;
    out->size = size;
    out->handle = h;
    out->mapped = 1;
    return loomSuccess;
fail:
    if (mapped) d->cuMemUnmap(va, size);
    if (va) d->cuMemAddressFree(va, size);
    return res;
}

loomResult_t cuda_tp_alloc(const cudrv_t *d, int dev, size_t size, cuda_mem_t *out,
                           cuda_export_t *exp)
{
    loomResult_t res = loomSuccess;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CUmemGenericAllocationHandle h = 0;
    int have_h = 0, fd = -1;
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    CU_TRY(d->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
           "exchange memory");
    size = (size + gran - 1) / gran * gran;
    CU_TRY(d->cuMemCreate(&h, size, &prop, 0), "exchange memory");
    have_h = 1;
    CU_TRY(d->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
           "exchange memory");
    LOOM_CHECK_GOTO(map_handle(d, dev, h, size, out, "exchange memory"), res, fail);
    out->fd = fd;
    *exp = (cuda_export_t){.pid = (int32_t)getpid(), .fd = fd, .dev = dev, .size = size};
    return loomSuccess;
fail:
    if (fd >= 0) close(fd);
    if (have_h) d->cuMemRelease(h);
    return res;
}

loomResult_t cuda_tp_import(const cudrv_t *d, int dev, const cuda_export_t *exp, int peer_rank,
                            cuda_mem_t *out)
{
    loomResult_t res = loomSuccess;
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    int fd;
    if (exp->pid == (int32_t)getpid()) {
        fd = dup(exp->fd); /* a rank of this process (loomCommInitAll) */
        if (fd < 0)
            return base_error(loomSystemError, LOG_CUDA, "dup of rank %d's handle: %s", peer_rank,
                              strerror(errno));
    } else {
        int pfd = (int)syscall(SYS_pidfd_open, (pid_t)exp->pid, 0);
        if (pfd < 0)
            return base_error(loomSystemError, LOG_CUDA,
                              "pidfd_open(%d) for rank %d's GPU memory: %s (is the peer alive "
                              "and in this PID namespace?)",
                              exp->pid, peer_rank, strerror(errno));
        fd = (int)syscall(SYS_pidfd_getfd, pfd, exp->fd, 0);
        int e = errno;
        close(pfd);
        if (fd < 0)
            return base_error(loomSystemError, LOG_CUDA,
                              "pidfd_getfd(pid %d, fd %d) for rank %d's GPU memory: %s (needs "
                              "the permission to ptrace the peer, as process_vm_readv does)",
                              exp->pid, exp->fd, peer_rank, strerror(e));
    }
    CUmemGenericAllocationHandle h = 0;
    CUresult r = d->cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (r != CUDA_SUCCESS)
        return base_error(loomUnhandledCudaError, LOG_CUDA,
                          "importing rank %d's GPU memory (pid %d, device %d): "
                          "cuMemImportFromShareableHandle: %s",
                          peer_rank, exp->pid, exp->dev, cudrv_err(r));
    res = map_handle(d, dev, h, exp->size, out, "mapping a peer's GPU memory");
    if (res != loomSuccess) {
        d->cuMemRelease(h);
        return base_error(res, LOG_CUDA,
                          "rank %d's GPU memory (device %d) is not reachable from "
                          "device %d: %s",
                          peer_rank, exp->dev, dev, base_last_error());
    }
    return loomSuccess;
}

void cuda_tp_release(const cudrv_t *d, cuda_mem_t *m)
{
    if (m->mapped) {
        d->cuMemUnmap(m->ptr, m->size);
        d->cuMemAddressFree(m->ptr, m->size);
        d->cuMemRelease(m->handle);
    }
    if (m->fd >= 0) close(m->fd);
    memset(m, 0, sizeof(*m));
    m->fd = -1;
}
