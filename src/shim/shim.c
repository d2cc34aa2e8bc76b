/*
 * libnccl.so.2 served by loom: NCCL's host API, each call translated to loom's public API.
 *
 * The library is loom's objects plus this file, with SONAME libnccl.so.2 and a version script
 * (libnccl.map) that exports only the NCCL names, so a program built against NVIDIA's NCCL runs
 * on loom when this library is found (or preloaded, see tools/loom-run) instead of the real one.
 *
 * Translation is mostly a cast: loom's enums are numbered as NCCL's (checked below at compile
 * time), loomUniqueId is 128 bytes as ncclUniqueId, and an ncclComm_t is a loom communicator.
 * The work is in what does not map: ncclConfig_t has another layout and versions, the 8-bit
 * float types have no loom counterpart, and a few NCCL 2.27/2.28 calls have no loom function.
 *
 * Errors raised here go through base_error, as loom's own do, so that ncclGetLastError (which
 * is loomGetLastError) returns them and LOOM_DEBUG shows them.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom_internal.h"
#include "nccl.h"

/* loom is compiled with -fvisibility=hidden; these are the library's only exports (the version
 * script hides the rest, loom's own loomX names included). */
#define SHIM_API __attribute__((visibility("default")))

/* pncclX: NCCL's profiling names. Same code, second symbol; a profiler that defines ncclX ahead
 * of us in the link order forwards to pncclX. */
#define SHIM_PROFILING_ALIAS(name)                                                                 \
    extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")));

/* The casts below are only sound while these hold. */
_Static_assert(sizeof(ncclUniqueId) == sizeof(loomUniqueId), "unique id size");
_Static_assert(ncclSuccess == (int)loomSuccess && ncclInProgress == (int)loomInProgress &&
                   ncclNumResults == (int)loomNumResults &&
                   ncclInvalidUsage == (int)loomInvalidUsage &&
                   ncclRemoteError == (int)loomRemoteError,
               "result codes");
_Static_assert(ncclInt8 == (int)loomInt8 && ncclUint8 == (int)loomUint8 &&
                   ncclInt32 == (int)loomInt32 && ncclUint32 == (int)loomUint32 &&
                   ncclInt64 == (int)loomInt64 && ncclUint64 == (int)loomUint64 &&
                   ncclFloat16 == (int)loomFloat16 && ncclFloat32 == (int)loomFloat32 &&
                   ncclFloat64 == (int)loomFloat64 && ncclBfloat16 == (int)loomBfloat16 &&
                   ncclFloat8e4m3 == (int)loomFloat8e4m3 && ncclFloat8e5m2 == (int)loomFloat8e5m2 &&
                   ncclNumTypes == (int)loomNumTypes,
               "data types");
_Static_assert(ncclSum == (int)loomSum && ncclProd == (int)loomProd && ncclMax == (int)loomMax &&
                   ncclMin == (int)loomMin && ncclAvg == (int)loomAvg &&
                   ncclNumOps == (int)loomNumOps,
               "reduction operators (pre-multiplied sums are numbered from NumOps in both)");
_Static_assert(ncclScalarDevice == (int)loomScalarDevice &&
                   ncclScalarHostImmediate == (int)loomScalarHostImmediate,
               "scalar residence");
_Static_assert(NCCL_SPLIT_NOCOLOR == LOOM_SPLIT_NOCOLOR, "split no-colour");
_Static_assert(sizeof(ncclRedOp_t) == sizeof(loomRedOp_t) &&
                   sizeof(ncclResult_t) == sizeof(loomResult_t),
               "enum sizes");

#define LC(comm) ((loomComm_t)(void *)(comm))
#define NC(comm) ((ncclComm_t)(void *)(comm))

/* ---- the first call ---- */

static pthread_once_t hello_once = PTHREAD_ONCE_INIT;

/* Says once, at INFO, that NCCL calls land in loom: the line a user looks for when checking
 * that a framework really runs on the shim. */
static void hello(void)
{
    int v = 0;
    loomGetVersion(&v);
    Dl_info info;
    const char *path = "libnccl.so.2";
    if (dladdr((const void *)(uintptr_t)&hello, &info) && info.dli_fname) path = info.dli_fname;
    const char *run = getenv("LOOM_SHIM_ACTIVE");
    INFO(LOG_SHIM, "NCCL shim active: NCCL %d.%d.%d API served by loom %d.%d.%d from %s%s",
         NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, v / 10000, v / 100 % 100, v % 100, path,
         run && strcmp(run, "1") == 0 ? " (loom-run)" : "");
}

static inline void shim_enter(void)
{
    pthread_once(&hello_once, hello);
}

/* ---- one NCCL per process ---- */

/*
 * Frameworks load NVIDIA's libnccl by its full path as well (PyTorch's wheels preload the
 * nvidia-* packages' libraries with ctypes), which the dynamic linker cannot match with this
 * library's SONAME: a second NCCL would sit in the process, unused but mapped, and a program
 * that looks it up by handle could reach it. While the shim is loaded, dlopen of any other
 * libnccl.so* answers with the shim itself, and says so at INFO.
 */
static bool other_nccl(const char *file, const char **self)
{
    static const char *me;
    if (me == NULL) {
        Dl_info info;
        if (dladdr((const void *)(uintptr_t)&other_nccl, &info) && info.dli_fname)
            me = info.dli_fname;
    }
    *self = me;
    if (file == NULL || me == NULL || strchr(file, '/') == NULL) return false;
    const char *base = strrchr(file, '/') + 1;
    if (strncmp(base, "libnccl.so", 10) != 0) return false;
    char a[4096], b[4096];
    if (realpath(file, a) == NULL || realpath(me, b) == NULL) return false;
    return strcmp(a, b) != 0;
}

SHIM_API void *dlopen(const char *file, int mode)
{
    static void *(*real)(const char *, int);
    if (real == NULL) real = (void *(*)(const char *, int))dlsym(RTLD_NEXT, "dlopen");
    const char *self = NULL;
    if (real && other_nccl(file, &self)) {
        INFO(LOG_SHIM,
             "dlopen(%s): NCCL is served by loom's shim (%s) in this process; "
             "answering with the shim instead of loading a second NCCL",
             file, self);
        return real(self, mode);
    }
    return real ? real(file, mode) : NULL;
}

/* ---- translation helpers ---- */

static ncclResult_t unsupported(const char *fn)
{
    return (ncclResult_t)base_error(loomInvalidUsage, LOG_SHIM, "%s is not supported by loom %d.%d",
                                    fn, LOOM_MAJOR, LOOM_MINOR);
}

/* Does the caller's config (its header's size) reach past field f? */
#define CFG_HAS(cfg, f) ((cfg)->size >= offsetof(ncclConfig_t, f) + sizeof(((ncclConfig_t *)0)->f))

/* Fields loom accepts and does not use, for the INFO line that says so. */
static const struct {
    const char *name;
    size_t offset;
    bool is_ptr;
} ignored_fields[] = {
    {"cgaClusterSize", offsetof(ncclConfig_t, cgaClusterSize), false},
    {"minCTAs", offsetof(ncclConfig_t, minCTAs), false},
    {"maxCTAs", offsetof(ncclConfig_t, maxCTAs), false},
    {"netName", offsetof(ncclConfig_t, netName), true},
    {"splitShare", offsetof(ncclConfig_t, splitShare), false},
    {"trafficClass", offsetof(ncclConfig_t, trafficClass), false},
    {"collnetEnable", offsetof(ncclConfig_t, collnetEnable), false},
    {"CTAPolicy", offsetof(ncclConfig_t, CTAPolicy), false},
    {"shrinkShare", offsetof(ncclConfig_t, shrinkShare), false},
    {"nvlsCTAs", offsetof(ncclConfig_t, nvlsCTAs), false},
    {"nChannelsPerNetPeer", offsetof(ncclConfig_t, nChannelsPerNetPeer), false},
    {"nvlinkCentricSched", offsetof(ncclConfig_t, nvlinkCentricSched), false},
};

/*
 * ncclConfig_t -> loomConfig_t. NCCL only appends fields (2.14: blocking; 2.17: CTA limits and
 * netName; 2.18: splitShare; later: trafficClass, commName, collnetEnable, CTAPolicy,
 * shrinkShare; 2.27: nvlsCTAs; 2.28: nChannelsPerNetPeer, nvlinkCentricSched), so the caller's
 * size tells which fields its header had: a field is read only when size covers it. Sizes beyond
 * ours come from newer headers; their extra fields are ignored.
 */
static bool shim_config(const ncclConfig_t *in, loomConfig_t *out, const char *fn)
{
    const loomConfig_t def = LOOM_CONFIG_INITIALIZER;
    *out = def;
    if (in->magic != NCCL_CONFIG_MAGIC) {
        base_error(loomInvalidArgument, LOG_SHIM,
                   "%s: config magic is 0x%08x, not 0x%08x: initialise ncclConfig_t with "
                   "NCCL_CONFIG_INITIALIZER",
                   fn, in->magic, NCCL_CONFIG_MAGIC);
        return false;
    }
    if (!CFG_HAS(in, blocking)) {
        base_error(loomInvalidArgument, LOG_SHIM,
                   "%s: config size %zu is smaller than any NCCL header's ncclConfig_t", fn,
                   in->size);
        return false;
    }
    out->blocking = in->blocking;
    if (CFG_HAS(in, commName)) out->commName = in->commName;
    if (log_enabled(LOG_INFO, LOG_SHIM)) {
        char ignored[256] = "";
        size_t o = 0;
        for (size_t i = 0; i < LOOM_ARRAY_SIZE(ignored_fields); i++) {
            size_t off = ignored_fields[i].offset;
            size_t len = ignored_fields[i].is_ptr ? sizeof(void *) : sizeof(int);
            if (in->size < off + len) continue;
            bool set;
            if (ignored_fields[i].is_ptr) {
                const char *p;
                memcpy(&p, (const char *)in + off, sizeof(p));
                set = p != NULL;
            } else {
                int v;
                memcpy(&v, (const char *)in + off, sizeof(v));
                set = v != NCCL_CONFIG_UNDEF_INT;
            }
            if (set && o < sizeof(ignored))
                o += (size_t)snprintf(ignored + o, sizeof(ignored) - o, " %s",
                                      ignored_fields[i].name);
        }
        char blocking[16] = "default";
        if (in->blocking != NCCL_CONFIG_UNDEF_INT)
            snprintf(blocking, sizeof(blocking), "%d", in->blocking);
        INFO(LOG_SHIM, "%s: config of NCCL header %u (%zu bytes): blocking %s, commName %s%s%s", fn,
             in->version, in->size, blocking, out->commName ? out->commName : "(none)",
             o ? "; ignored:" : "", ignored);
    }
    return true;
}

static void uid_to_loom(const ncclUniqueId *in, loomUniqueId *out)
{
    memcpy(out->internal, in->internal, sizeof(out->internal));
}

/*
 * The CUDA device current in the calling thread, or -1. NCCL binds a new communicator to the
 * caller's current device (cudaGetDevice), so the shim passes it to loom as cudaDev. With no
 * current context NCCL would take device 0, but making a context there would give host-only
 * jobs one they never asked for: then nothing is passed, and loom binds on the first device
 * buffer. cudrv_get loads the driver and calls cuInit, which makes no context.
 */
static int current_cuda_device(void)
{
#ifdef LOOM_HAVE_CUDA
    const cudrv_t *d = cudrv_get(NULL);
    if (d) {
        CUcontext c = NULL;
        CUdevice dev = -1;
        if (d->cuCtxGetCurrent(&c) == CUDA_SUCCESS && c && d->cuCtxGetDevice(&dev) == CUDA_SUCCESS)
            return (int)dev;
    }
#endif
    return -1;
}

/* The loom config for a new communicator: the caller's NCCL config (may be NULL) and the
 * device to bind to (-1: none; ncclConfig_t has no device field, so nothing there overrides
 * it). */
static bool shim_new_config(const ncclConfig_t *config, int dev, loomConfig_t *out, const char *fn)
{
    if (config) {
        if (!shim_config(config, out, fn)) return false;
    } else {
        const loomConfig_t def = LOOM_CONFIG_INITIALIZER;
        *out = def;
    }
    if (dev >= 0) {
        out->cudaDev = dev;
        INFO(LOG_SHIM, "%s: binding the communicator to CUDA device %d", fn, dev);
    }
    return true;
}

/* ---- versions and errors ---- */

SHIM_API ncclResult_t ncclGetVersion(int *version)
{
    shim_enter();
    if (version == NULL)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

SHIM_API const char *ncclGetErrorString(ncclResult_t result)
{
    shim_enter();
    return loomGetErrorString((loomResult_t)result);
}

SHIM_API const char *ncclGetLastError(ncclComm_t comm)
{
    shim_enter();
    return loomGetLastError(LC(comm));
}

/* ---- communicators ---- */

SHIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    shim_enter();
    loomUniqueId id;
    loomResult_t r = loomGetUniqueId(uniqueId ? &id : NULL);
    if (r == loomSuccess) memcpy(uniqueId->internal, id.internal, sizeof(id.internal));
    return (ncclResult_t)r;
}

/* The common body of the InitRank family. loom writes the handle through a loomComm_t, so it
 * writes a local and the caller's ncclComm_t is set from it. */
static ncclResult_t init_rank(const char *fn, ncclComm_t *comm, int nranks, const ncclUniqueId *id,
                              int rank, ncclConfig_t *config)
{
    loomConfig_t cfg;
    if (!shim_new_config(config, current_cuda_device(), &cfg, fn)) return ncclInvalidArgument;
    loomUniqueId lid;
    uid_to_loom(id, &lid);
    loomComm_t lc = NULL;
    loomResult_t r = loomCommInitRankConfig(comm ? &lc : NULL, nranks, lid, rank, &cfg);
    if (comm && (r == loomSuccess || r == loomInProgress)) *comm = NC(lc);
    return (ncclResult_t)r;
}

SHIM_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    shim_enter();
    return init_rank("ncclCommInitRank", comm, nranks, &commId, rank, NULL);
}

SHIM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                             int rank, ncclConfig_t *config)
{
    shim_enter();
    return init_rank("ncclCommInitRankConfig", comm, nranks, &commId, rank, config);
}

/* NCCL spreads its bootstrap over several roots; loom's bootstrap has one root per id, and every
 * rank holds the same list, so all ranks meet at the first id's root. The other ids' roots see
 * no rank and end after LOOM_TIMEOUT. */
SHIM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId *commIds, ncclConfig_t *config)
{
    shim_enter();
    if (nId < 1 || commIds == NULL)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "ncclCommInitRankScalable: nId %d < 1 or commIds is NULL",
                                        nId);
    if (nId > 1)
        INFO(LOG_SHIM,
             "ncclCommInitRankScalable: %d unique ids; loom bootstraps through the "
             "first only",
             nId);
    return init_rank("ncclCommInitRankScalable", newcomm, nranks, &commIds[0], myrank, config);
}

SHIM_API ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    shim_enter();
    if (comm == NULL || ndev < 1) return (ncclResult_t)loomCommInitAll(NULL, ndev, devlist);
    loomComm_t *lc = calloc((size_t)ndev, sizeof(*lc));
    if (lc == NULL)
        return (ncclResult_t)base_error(loomSystemError, LOG_SHIM,
                                        "ncclCommInitAll: out of memory for %d handles", ndev);
    loomResult_t r = loomCommInitAll(lc, ndev, devlist);
    if (r == loomSuccess)
        for (int i = 0; i < ndev; i++)
            comm[i] = NC(lc[i]);
    free(lc);
    return (ncclResult_t)r;
}

SHIM_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    shim_enter();
    return (ncclResult_t)loomCommFinalize(LC(comm));
}

SHIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    shim_enter();
    return (ncclResult_t)loomCommDestroy(LC(comm));
}

SHIM_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    shim_enter();
    return (ncclResult_t)loomCommAbort(LC(comm));
}

/* config == NULL: loom's defaults (NCCL inherits the parent's config; the only field loom
 * reads that could differ is blocking, and loom's split completes before returning anyway).
 * The child's device is the parent's, as in NCCL (its split job takes comm->cudaDev); a parent
 * not yet bound to one (host memory only so far) gives the caller's current device, which is
 * what NCCL would have bound the parent to. */
SHIM_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                    ncclConfig_t *config)
{
    shim_enter();
    int dev = -1;
    if (comm == NULL || loomCommCuDevice(LC(comm), &dev) != loomSuccess || dev < 0)
        dev = current_cuda_device();
    loomConfig_t cfg;
    if (!shim_new_config(config, dev, &cfg, "ncclCommSplit")) return ncclInvalidArgument;
    loomComm_t child = NULL;
    loomResult_t r = loomCommSplit(LC(comm), color, key, newcomm ? &child : NULL, &cfg);
    if (newcomm && r == loomSuccess) *newcomm = NC(child);
    return (ncclResult_t)r;
}

/*
 * NCCL's revoke stops the communicator's work and keeps the handle, so that it can be shrunk or
 * split afterwards. loom has no such call: loomCommAbort stops the work and then frees the
 * communicator. This is loomCommAbort without the free (src/core/comm.c; keep the two alike):
 * calls blocked on comm in other threads return promptly, its kernels in flight stop, peers see
 * the connections close, and from then on every call on the handle fails with loomInvalidUsage
 * ("being aborted") except the queries, ncclCommGetAsyncError, ncclCommDestroy and
 * ncclCommAbort. It returns once no call is inside the communicator (NCCL's non-blocking revoke
 * returns ncclInProgress until then). A revoked communicator can be shrunk (ncclCommShrink: the
 * survivors meet over the parent's own listeners, not its stopped links), not split.
 */
SHIM_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    shim_enter();
    loomComm_t c = LC(comm);
    if (c == NULL)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "ncclCommRevoke: comm is NULL");
    if (!loom_comm_live(c))
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "ncclCommRevoke: %p is not a live loom communicator",
                                        (void *)c);
    if (revokeFlags != NCCL_REVOKE_DEFAULT)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "ncclCommRevoke: revokeFlags is %d; NCCL 2.28 allows only "
                                        "NCCL_REVOKE_DEFAULT (0)",
                                        revokeFlags);
    loom_comm_revoke(c, "the communicator was revoked (ncclCommRevoke)");
    INFO(LOG_SHIM, "ncclCommRevoke: rank %d of %d revoked; only destroy or abort remain",
         loom_comm_rank(c), loom_comm_size(c));
    return ncclSuccess;
}

SHIM_API ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                     ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    shim_enter();
    if (newcomm) *newcomm = NULL; /* no stale handle for a caller that ignores the result */
    int dev = -1;
    if (comm == NULL || loomCommCuDevice(LC(comm), &dev) != loomSuccess || dev < 0)
        dev = current_cuda_device();
    loomConfig_t cfg;
    if (!shim_new_config(config, dev, &cfg, "ncclCommShrink")) return ncclInvalidArgument;
    _Static_assert(NCCL_SHRINK_DEFAULT == LOOM_SHRINK_DEFAULT &&
                       NCCL_SHRINK_ABORT == LOOM_SHRINK_ABORT,
                   "shrink flags");
    loomComm_t child = NULL;
    loomResult_t r = loomCommShrink(LC(comm), excludeRanksList, excludeRanksCount,
                                    newcomm ? &child : NULL, &cfg, shrinkFlags);
    if (newcomm && r == loomSuccess) *newcomm = NC(child);
    return (ncclResult_t)r;
}

SHIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    shim_enter();
    loomResult_t a = loomSuccess;
    loomResult_t r = loomCommGetAsyncError(LC(comm), asyncError ? &a : NULL);
    if (r == loomSuccess) *asyncError = (ncclResult_t)a;
    return (ncclResult_t)r;
}

SHIM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    shim_enter();
    return (ncclResult_t)loomCommCount(LC(comm), count);
}

SHIM_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    shim_enter();
    return (ncclResult_t)loomCommCuDevice(LC(comm), device);
}

SHIM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    shim_enter();
    return (ncclResult_t)loomCommUserRank(LC(comm), rank);
}

/* ---- memory and registration ---- */

SHIM_API ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    shim_enter();
    return (ncclResult_t)loomMemAlloc(ptr, size);
}

SHIM_API ncclResult_t ncclMemFree(void *ptr)
{
    shim_enter();
    return (ncclResult_t)loomMemFree(ptr);
}

SHIM_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                       void **handle)
{
    shim_enter();
    return (ncclResult_t)loomCommRegister(LC(comm), buff, size, handle);
}

SHIM_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    shim_enter();
    return (ncclResult_t)loomCommDeregister(LC(comm), handle);
}

/* Windows (NCCL 2.27): loom's own, with NCCL's flags (NCCL_WIN_COLL_SYMMETRIC is
 * LOOM_WIN_COLL_SYMMETRIC); collective, as NCCL's. ncclWindow_t is loom's window handle. */
SHIM_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                             ncclWindow_t *win, int winFlags)
{
    shim_enter();
    loomWindow_t w = NULL;
    loomResult_t r = loomCommWindowRegister(LC(comm), buff, size, win ? &w : NULL, winFlags);
    if (win) *win = (ncclWindow_t)(void *)w;
    return (ncclResult_t)r;
}

SHIM_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    shim_enter();
    return (ncclResult_t)loomCommWindowDeregister(LC(comm), (loomWindow_t)(void *)win);
}

SHIM_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, const ncclDevCommRequirements_t *reqs,
                                        ncclDevComm_t *outDevComm)
{
    shim_enter();
    (void)comm;
    (void)reqs;
    (void)outDevComm; /* opaque here: its size is NVIDIA's, so it is not written */
    return unsupported("ncclDevCommCreate");
}

SHIM_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const ncclDevComm_t *devComm)
{
    shim_enter();
    (void)comm;
    (void)devComm;
    return unsupported("ncclDevCommDestroy");
}

/* ---- reduction operators ---- */

SHIM_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                               ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t comm)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    loomRedOp_t lop = loomSum;
    loomResult_t r = loomRedOpCreatePreMulSum(op ? &lop : NULL, scalar, t,
                                              (loomScalarResidence_t)residence, LC(comm));
    if (r == loomSuccess) *op = (ncclRedOp_t)lop;
    return (ncclResult_t)r;
}

SHIM_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    shim_enter();
    return (ncclResult_t)loomRedOpDestroy((loomRedOp_t)op, LC(comm));
}

/* ---- collectives ---- */

SHIM_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                 cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomReduce(sendbuff, recvbuff, count, t, (loomRedOp_t)op, root, LC(comm),
                                    stream);
}

SHIM_API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomBroadcast(buff, buff, count, t, root, LC(comm), stream);
}

SHIM_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomBroadcast(sendbuff, recvbuff, count, t, root, LC(comm), stream);
}

SHIM_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomAllReduce(sendbuff, recvbuff, count, t, (loomRedOp_t)op, LC(comm),
                                       stream);
}

SHIM_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomReduceScatter(sendbuff, recvbuff, recvcount, t, (loomRedOp_t)op,
                                           LC(comm), stream);
}

SHIM_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomAllGather(sendbuff, recvbuff, sendcount, t, LC(comm), stream);
}

SHIM_API ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomAlltoAll(sendbuff, recvbuff, count, t, LC(comm), stream);
}

/* ---- gather and scatter ---- */

/*
 * loom has no gather or scatter: they are point-to-point groups, as NCCL builds them too. The
 * root receives from (or sends to) every rank, itself included: its own part is a send to
 * itself matched with a receive from itself in the same group, which loom turns into a local
 * copy (skipped when in place). Everything else is checked first, because a call that fails
 * half-way through the group would leave the calls before it queued: the root's first call is
 * the receive from itself (a failure leaves nothing), its second the send to itself (a receive
 * from self with no send is dropped by loom), and the rest touch only buffers already checked.
 */
typedef struct {
    loomDataType_t type;
    int rank, nranks;
    size_t bytes; /* one rank's part */
} rooted_t;

static ncclResult_t rooted_args(const char *fn, ncclComm_t comm, ncclDataType_t datatype,
                                size_t count, int root, rooted_t *a)
{
    if (comm == NULL)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM, "%s: comm is NULL", fn);
    a->type = (loomDataType_t)datatype;
    if ((int)a->type < 0 || a->type >= loomNumTypes)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "%s: invalid datatype %d (expected 0..%d)", fn,
                                        (int)datatype, (int)ncclNumTypes - 1);
    loomResult_t r = loomCommCount(LC(comm), &a->nranks);
    if (r == loomSuccess) r = loomCommUserRank(LC(comm), &a->rank);
    if (r != loomSuccess) return (ncclResult_t)r;
    if (root < 0 || root >= a->nranks)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "%s: root %d is outside [0, %d)", fn, root, a->nranks);
    size_t total;
    if (__builtin_mul_overflow(count, red_type_size(a->type), &a->bytes) ||
        __builtin_mul_overflow(a->bytes, (size_t)a->nranks, &total) || total > (size_t)INT64_MAX)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "%s: count %zu of %s times %d ranks overflows the "
                                        "address space",
                                        fn, count, red_type_name(a->type), a->nranks);
    return ncclSuccess;
}

/* The root's checks: the whole buffer present, and the own part either in place or apart. */
static ncclResult_t rooted_root_bufs(const char *fn, const char *whole_name, const void *whole,
                                     const char *part_name, const void *part, const rooted_t *a)
{
    size_t total = a->bytes * (size_t)a->nranks;
    if (whole == NULL)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "%s: %s is NULL on the root with %zu bytes to move", fn,
                                        whole_name, total);
    const char *own = (const char *)whole + (size_t)a->rank * a->bytes;
    uintptr_t w = (uintptr_t)whole, p = (uintptr_t)part;
    if (part != own && part != NULL && p < w + total && w < p + a->bytes)
        return (ncclResult_t)base_error(loomInvalidArgument, LOG_SHIM,
                                        "%s: %s overlaps %s without being in place (%s + root * "
                                        "count)",
                                        fn, part_name, whole_name, whole_name);
    return ncclSuccess;
}

SHIM_API ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream)
{
    shim_enter();
    const char *fn = "ncclGather";
    rooted_t a;
    ncclResult_t nr = rooted_args(fn, comm, datatype, count, root, &a);
    if (nr != ncclSuccess || count == 0) return nr; /* count 0: nothing moves, as in NCCL */
    loomComm_t lc = LC(comm);
    if (a.rank != root) return (ncclResult_t)loomSend(sendbuff, count, a.type, root, lc, stream);
    nr = rooted_root_bufs(fn, "recvbuff", recvbuff, "sendbuff", sendbuff, &a);
    if (nr != ncclSuccess) return nr;
    char *out = recvbuff;
    char *own = out + (size_t)root * a.bytes;
    loomResult_t r = loomGroupStart();
    if (r == loomSuccess && (const void *)own != sendbuff) {
        r = loomRecv(own, count, a.type, root, lc, stream);
        if (r == loomSuccess) r = loomSend(sendbuff, count, a.type, root, lc, stream);
    }
    for (int p = 0; p < a.nranks && r == loomSuccess; p++)
        if (p != root) r = loomRecv(out + (size_t)p * a.bytes, count, a.type, p, lc, stream);
    loomResult_t e = loomGroupEnd();
    return (ncclResult_t)(r != loomSuccess ? r : e);
}

SHIM_API ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream)
{
    shim_enter();
    const char *fn = "ncclScatter";
    rooted_t a;
    ncclResult_t nr = rooted_args(fn, comm, datatype, count, root, &a);
    if (nr != ncclSuccess || count == 0) return nr; /* count 0: nothing moves, as in NCCL */
    loomComm_t lc = LC(comm);
    if (a.rank != root) return (ncclResult_t)loomRecv(recvbuff, count, a.type, root, lc, stream);
    nr = rooted_root_bufs(fn, "sendbuff", sendbuff, "recvbuff", recvbuff, &a);
    if (nr != ncclSuccess) return nr;
    const char *in = sendbuff;
    const char *own = in + (size_t)root * a.bytes;
    loomResult_t r = loomGroupStart();
    if (r == loomSuccess && (void *)(uintptr_t)own != recvbuff) {
        r = loomRecv(recvbuff, count, a.type, root, lc, stream);
        if (r == loomSuccess) r = loomSend(own, count, a.type, root, lc, stream);
    }
    for (int p = 0; p < a.nranks && r == loomSuccess; p++)
        if (p != root) r = loomSend(in + (size_t)p * a.bytes, count, a.type, p, lc, stream);
    loomResult_t e = loomGroupEnd();
    return (ncclResult_t)(r != loomSuccess ? r : e);
}

/* ---- point to point ---- */

SHIM_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                               int peer, ncclComm_t comm, cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomSend(sendbuff, count, t, peer, LC(comm), stream);
}

SHIM_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream)
{
    shim_enter();
    loomDataType_t t = (loomDataType_t)datatype; /* numbered alike (checked above) */
    return (ncclResult_t)loomRecv(recvbuff, count, t, peer, LC(comm), stream);
}

/* ---- groups ---- */

SHIM_API ncclResult_t ncclGroupStart(void)
{
    shim_enter();
    return (ncclResult_t)loomGroupStart();
}

SHIM_API ncclResult_t ncclGroupEnd(void)
{
    shim_enter();
    return (ncclResult_t)loomGroupEnd();
}

/* NCCL ends the group without running it and estimates its time. loom has no cost model and no
 * way to drop a group's queued calls, so it refuses and leaves the group open: the caller's
 * calls are neither lost nor run behind its back, and ncclGroupEnd still runs them. */
SHIM_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    shim_enter();
    (void)simInfo;
    return unsupported("ncclGroupSimulateEnd");
}

/* ---- debugging ---- */

/* NCCL re-reads NCCL_DEBUG and its companions; here loom's LOOM_DEBUG and LOOM_DEBUG_SUBSYS are
 * read again at the next log line (the cached level is reset; base.h exports it for this). A
 * LOOM_DEBUG_FILE already open stays open: lines in flight on other threads may still use it. */
SHIM_API void ncclResetDebugInit(void)
{
    shim_enter();
    log_reset();
}

/* ---- profiling names ---- */

SHIM_PROFILING_ALIAS(ncclGetVersion)
SHIM_PROFILING_ALIAS(ncclGetErrorString)
SHIM_PROFILING_ALIAS(ncclGetLastError)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* as NVIDIA's header declares it */
SHIM_PROFILING_ALIAS(ncclResetDebugInit)
#pragma GCC diagnostic pop
SHIM_PROFILING_ALIAS(ncclGetUniqueId)
SHIM_PROFILING_ALIAS(ncclCommInitRank)
SHIM_PROFILING_ALIAS(ncclCommInitRankConfig)
SHIM_PROFILING_ALIAS(ncclCommInitRankScalable)
SHIM_PROFILING_ALIAS(ncclCommInitAll)
SHIM_PROFILING_ALIAS(ncclCommFinalize)
SHIM_PROFILING_ALIAS(ncclCommDestroy)
SHIM_PROFILING_ALIAS(ncclCommAbort)
SHIM_PROFILING_ALIAS(ncclCommRevoke)
SHIM_PROFILING_ALIAS(ncclCommSplit)
SHIM_PROFILING_ALIAS(ncclCommShrink)
SHIM_PROFILING_ALIAS(ncclCommGetAsyncError)
SHIM_PROFILING_ALIAS(ncclCommCount)
SHIM_PROFILING_ALIAS(ncclCommCuDevice)
SHIM_PROFILING_ALIAS(ncclCommUserRank)
SHIM_PROFILING_ALIAS(ncclMemAlloc)
SHIM_PROFILING_ALIAS(ncclMemFree)
SHIM_PROFILING_ALIAS(ncclCommRegister)
SHIM_PROFILING_ALIAS(ncclCommDeregister)
SHIM_PROFILING_ALIAS(ncclCommWindowRegister)
SHIM_PROFILING_ALIAS(ncclCommWindowDeregister)
SHIM_PROFILING_ALIAS(ncclDevCommCreate)
SHIM_PROFILING_ALIAS(ncclDevCommDestroy)
SHIM_PROFILING_ALIAS(ncclRedOpCreatePreMulSum)
SHIM_PROFILING_ALIAS(ncclRedOpDestroy)
SHIM_PROFILING_ALIAS(ncclReduce)
SHIM_PROFILING_ALIAS(ncclBcast)
SHIM_PROFILING_ALIAS(ncclBroadcast)
SHIM_PROFILING_ALIAS(ncclAllReduce)
SHIM_PROFILING_ALIAS(ncclReduceScatter)
SHIM_PROFILING_ALIAS(ncclAllGather)
SHIM_PROFILING_ALIAS(ncclAlltoAll)
SHIM_PROFILING_ALIAS(ncclGather)
SHIM_PROFILING_ALIAS(ncclScatter)
SHIM_PROFILING_ALIAS(ncclSend)
SHIM_PROFILING_ALIAS(ncclRecv)
SHIM_PROFILING_ALIAS(ncclGroupStart)
SHIM_PROFILING_ALIAS(ncclGroupEnd)
SHIM_PROFILING_ALIAS(ncclGroupSimulateEnd)
