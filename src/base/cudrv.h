/*
 * The CUDA driver API, found at run time.
 *
 * Nothing in loom links against libcuda: this table is filled by dlopen("libcuda.so.1") and
 * cuGetProcAddress the first time it is asked for, so the same binaries load and run their host
 * paths on machines with no GPU or driver. Types and constants come from the toolkit's cuda.h
 * (built only where the toolkit is). The file is self-contained (no loom logging) so that tests
 * and loom-perf compile it in as well.
 */
#ifndef LOOM_BASE_CUDRV_H
#define LOOM_BASE_CUDRV_H

#include <cuda.h>
#include <stdbool.h>

/* X(name): every driver entry point loom uses. */
/* clang-format off: one driver function a line */
#define CUDRV_FUNCS(X)                                                                             \
    X(cuInit)                                                                                      \
    X(cuDriverGetVersion)                                                                          \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetCount)                                                                            \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceGetUuid)                                                                             \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuDevicePrimaryCtxRelease)                                                                   \
    X(cuCtxGetCurrent)                                                                             \
    X(cuCtxSetCurrent)                                                                             \
    X(cuCtxGetDevice)                                                                              \
    X(cuCtxSynchronize)                                                                            \
    X(cuPointerGetAttribute)                                                                       \
    X(cuPointerGetAttributes)                                                                      \
    X(cuMemGetAddressRange)                                                                        \
    X(cuMemAlloc)                                                                                  \
    X(cuMemFree)                                                                                   \
    X(cuMemcpyHtoD)                                                                                \
    X(cuMemcpyDtoH)                                                                                \
    X(cuMemcpy)                                                                                    \
    X(cuMemcpyAsync)                                                                               \
    X(cuMemcpyDtoHAsync)                                                                           \
    X(cuMemcpyHtoDAsync)                                                                           \
    X(cuMemsetD8)                                                                                  \
    X(cuMemsetD8Async)                                                                             \
    X(cuMemsetD32)                                                                                 \
    X(cuMemHostAlloc)                                                                              \
    X(cuMemFreeHost)                                                                               \
    X(cuMemHostRegister)                                                                           \
    X(cuMemHostUnregister)                                                                         \
    X(cuMemHostGetDevicePointer)                                                                   \
    X(cuMemCreate)                                                                                 \
    X(cuMemRelease)                                                                                \
    X(cuMemExportToShareableHandle)                                                                \
    X(cuMemImportFromShareableHandle)                                                              \
    X(cuMemAddressReserve)                                                                         \
    X(cuMemAddressFree)                                                                            \
    X(cuMemMap)                                                                                    \
    X(cuMemUnmap)                                                                                  \
    X(cuMemSetAccess)                                                                              \
    X(cuMemGetAllocationGranularity)                                                               \
    X(cuModuleLoadData)                                                                            \
    X(cuModuleUnload)                                                                              \
    X(cuModuleGetFunction)                                                                         \
    X(cuLaunchKernel)                                                                              \
    X(cuLaunchKernelEx)                                                                            \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                                                 \
    X(cuStreamCreate)                                                                              \
    X(cuStreamDestroy)                                                                             \
    X(cuStreamSynchronize)                                                                         \
    X(cuStreamQuery)                                                                               \
    X(cuStreamIsCapturing)                                                                         \
    X(cuStreamWaitEvent)                                                                           \
    X(cuStreamWaitValue32)                                                                         \
    X(cuStreamWaitValue64)                                                                         \
    X(cuStreamWriteValue32)                                                                        \
    X(cuStreamBeginCapture)                                                                        \
    X(cuStreamEndCapture)                                                                          \
    X(cuGraphInstantiateWithFlags)                                                                 \
    X(cuGraphLaunch)                                                                               \
    X(cuGraphExecDestroy)                                                                          \
    X(cuGraphDestroy)                                                                              \
    X(cuGraphNodeGetType)                                                                          \
    X(cuGraphRetainUserObject)                                                                     \
    X(cuUserObjectCreate)                                                                          \
    X(cuUserObjectRelease)                                                                         \
    X(cuThreadExchangeStreamCaptureMode)                                                           \
    X(cuEventCreate)                                                                               \
    X(cuEventRecord)                                                                               \
    X(cuEventQuery)                                                                                \
    X(cuEventSynchronize)                                                                          \
    X(cuEventElapsedTime)                                                                          \
    X(cuEventDestroy)                                                                              \
    X(cuGetErrorString)                                                                            \
    X(cuGetErrorName)                                                                              \
    X(cuStreamGetCtx)                                                                              \
    X(cuIpcGetMemHandle)                                                                           \
    X(cuIpcOpenMemHandle)                                                                          \
    X(cuIpcCloseMemHandle)
/* clang-format on */

typedef struct {
#define CUDRV_MEMBER(n) __typeof__(n) *n;
    CUDRV_FUNCS(CUDRV_MEMBER)
#undef CUDRV_MEMBER
    /* cuStreamGetCaptureInfo in its CUDA 12.3 form (with the edge data; cuda.h names it _v3):
     * resolved as that version, not as 12.0's, whose arguments differ */
    CUresult (*cuStreamGetCaptureInfo3)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                        const CUgraphNode **, const CUgraphEdgeData **, size_t *);
    int driver_version;
    int ndev;
} cudrv_t;

/* The driver table, or NULL when no usable driver or GPU is present; *why (may be NULL) then
 * says what was missing. Thread-safe; loads once. cuInit(0) is called, which creates no
 * context. */
const cudrv_t *cudrv_get(const char **why);
/* The driver's cuPointerGetAttributes, found without initialising CUDA (NULL: no driver): before
 * anyone's cuInit it answers CUDA_ERROR_NOT_INITIALIZED at once (base/memtype.c). */
typedef CUresult (*cudrv_attrs_fn)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
cudrv_attrs_fn cudrv_peek_attrs(void);
/* "CUDA_ERROR_X (text)" for a result, into a static per-thread buffer. */
const char *cudrv_err(CUresult r);
/* Makes ctx current on the calling thread and returns the context that was (restore it with
 * cudrv_ctx_leave; neither call changes anything when ctx already was current). */
CUcontext cudrv_ctx_enter(const cudrv_t *d, CUcontext ctx);
void cudrv_ctx_leave(const cudrv_t *d, CUcontext ctx, CUcontext prev);

#endif
