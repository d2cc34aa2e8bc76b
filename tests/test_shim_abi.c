/*
 * ABI test of loom's NCCL shim against NVIDIA's own header: a program compiled with the real
 * nccl.h (CUDA toolkit) and linked to the shim's libnccl.so.2 instead of NVIDIA's library.
 *
 * - Values: src/shim/nccl_abi.def lists every size, offset, enum value and constant the shim
 *   promises. This file evaluates the list under the real header; src/shim/abi_table.c (linked
 *   in) evaluates it under the shim's header; the numbers must be equal. Two translation units
 *   because the two headers declare the same names and cannot meet in one.
 * - Prototypes: each exported function must have the list's type under the real header (a
 *   compile error here otherwise), as abi_table.c checks under the shim's header.
 * - Linking: every name resolves, in the shim (not in /usr/local/cuda), and calls through
 *   pointers of the real header's types work: a communicator made from the real header's
 *   NCCL_CONFIG_INITIALIZER (non-blocking, and as a 2.17 header's smaller struct), an
 *   allreduce, gather and scatter with the real enums, revoke, the refusals of what loom lacks.
 *
 * Built with -DLOOM_SHIM_REAL_NCCL=1 and the CUDA include directory when the real header
 * exists; without it (or with a header older than 2.28, whose ncclConfig_t lacks fields in the
 * list) the test exits 77, which meson counts as skipped.
 */
#if !defined(LOOM_SHIM_REAL_NCCL)

#include <stdio.h>

int main(void)
{
    printf("SKIP: built without NVIDIA's nccl.h (looked for /usr/local/cuda/include/nccl.h)\n");
    return 77;
}

#else

#include <nccl.h>

#if NCCL_VERSION_CODE < 22800

#include <stdio.h>

int main(void)
{
    printf("SKIP: NVIDIA's nccl.h is NCCL %d.%d.%d; the shim's ABI list needs 2.28 or newer\n",
           NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return 77;
}

#else

/* ncclDevCommCreate/Destroy are declared by the device API's header, not by nccl.h. Compiled as
 * C, that header declares host inline functions whose bodies only its C++ part has, and GCC
 * reports "inline function declared but never defined" unconditionally (no flag or pragma turns
 * it off, and -Werror makes it fatal): so its utility header comes first and the macro that adds
 * `inline` is emptied, leaving ordinary declarations. */
#if defined(__has_include)
#if __has_include(<nccl_device/core.h>) && __has_include(<nccl_device/utility.h>)
#include <nccl_device/utility.h>
#undef NCCL_HOST_DEVICE_INLINE
#define NCCL_HOST_DEVICE_INLINE
#include <nccl_device/core.h>
#define HAVE_NCCL_DEVICE_H 1
#endif
#endif

#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- prototypes, checked at compile time ---- */

/* ncclResetDebugInit is deprecated in NVIDIA's header; naming it, even in __typeof__, warns. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define ABI_VALUE(expr)
#define ABI_PROTO(ret, name, args)                                                                 \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret(*) args),                   \
                   "NVIDIA's " #name " differs from src/shim/nccl_abi.def");                       \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&p##name), ret(*) args),                \
                   "NVIDIA's p" #name " differs from src/shim/nccl_abi.def");
#ifdef HAVE_NCCL_DEVICE_H
#define ABI_PROTO_NOP(ret, name, args)                                                             \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret(*) args),                   \
                   "NVIDIA's " #name " differs from src/shim/nccl_abi.def");
#else
#define ABI_PROTO_NOP(ret, name, args)
#endif
#include "../src/shim/nccl_abi.def"
#undef ABI_VALUE
#undef ABI_PROTO
#undef ABI_PROTO_NOP
#pragma GCC diagnostic pop

/* ---- values ---- */

/* abi_table.c: the same list under the shim's header. */
size_t loom_shim_abi_values(long long *out, size_t max);

static const char *const value_names[] = {
#define ABI_VALUE(expr) #expr,
#define ABI_PROTO(ret, name, args)
#define ABI_PROTO_NOP(ret, name, args)
#include "../src/shim/nccl_abi.def"
#undef ABI_VALUE
#undef ABI_PROTO
#undef ABI_PROTO_NOP
};
#define NVALUES (sizeof(value_names) / sizeof(value_names[0]))

static size_t real_abi_values(long long *out, size_t max)
{
    const ncclConfig_t abi_config = NCCL_CONFIG_INITIALIZER;
    const ncclSimInfo_t abi_siminfo = NCCL_SIM_INFO_INITIALIZER;
    size_t n = 0;
#define ABI_VALUE(expr)                                                                            \
    if (n < max) out[n] = (long long)(expr);                                                       \
    n++;
#define ABI_PROTO(ret, name, args)
#define ABI_PROTO_NOP(ret, name, args)
#include "../src/shim/nccl_abi.def"
#undef ABI_VALUE
#undef ABI_PROTO
#undef ABI_PROTO_NOP
    (void)abi_siminfo;
    return n;
}

/* ---- the names, for the linking checks ---- */

typedef void (*any_fn)(void);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static const struct {
    const char *name;
    any_fn fn;
} functions[] = {
#define ABI_VALUE(expr)
#define ABI_PROTO(ret, name, args) {#name, (any_fn)name},
#ifdef HAVE_NCCL_DEVICE_H
#define ABI_PROTO_NOP(ret, name, args) {#name, (any_fn)name},
#else
#define ABI_PROTO_NOP(ret, name, args) {#name, NULL},
#endif
#include "../src/shim/nccl_abi.def"
#undef ABI_VALUE
#undef ABI_PROTO
#undef ABI_PROTO_NOP
};
#pragma GCC diagnostic pop
#define NFUNCTIONS (sizeof(functions) / sizeof(functions[0]))

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        failures++;                                                                                \
    } while (0)
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) FAIL(__VA_ARGS__);                                                            \
    } while (0)

static void check_values(void)
{
    long long real[NVALUES], shim[NVALUES];
    size_t nr = real_abi_values(real, NVALUES);
    size_t ns = loom_shim_abi_values(shim, NVALUES);
    EXPECT(nr == NVALUES && ns == NVALUES, "list lengths: %zu names, %zu real, %zu shim",
           (size_t)NVALUES, nr, ns);
    int bad = 0;
    for (size_t i = 0; i < NVALUES && i < nr && i < ns; i++)
        if (real[i] != shim[i]) {
            FAIL("%s: NVIDIA's header %lld, loom's src/shim/nccl.h %lld", value_names[i], real[i],
                 shim[i]);
            bad++;
        }
    printf("%-34s %s (%zu values)\n", "sizes, offsets, enums, constants", bad ? "FAILED" : "ok",
           (size_t)NVALUES);
}

/* The library a symbol comes from, resolved. */
static const char *library_of(const void *p, char *buf, size_t len)
{
    Dl_info info;
    if (!dladdr(p, &info) || info.dli_fname == NULL) return NULL;
    if (realpath(info.dli_fname, buf) == NULL) snprintf(buf, len, "%s", info.dli_fname);
    return buf;
}

static void check_symbols(char *shim, size_t len)
{
    int before = failures;
    const char *lib = library_of((const void *)(uintptr_t)&ncclGetVersion, shim, len);
    EXPECT(lib != NULL, "ncclGetVersion is in no library");
    if (lib == NULL) return;
    EXPECT(strstr(lib, "/usr/local/cuda") == NULL, "linked to NVIDIA's library %s", lib);
    for (size_t i = 0; i < NFUNCTIONS; i++) {
        char pname[128], where[PATH_MAX];
        snprintf(pname, sizeof(pname), "p%s", functions[i].name);
        void *a = dlsym(RTLD_DEFAULT, functions[i].name), *b = dlsym(RTLD_DEFAULT, pname);
        EXPECT(a && b && a == b, "%s/%s: %p, %p", functions[i].name, pname, a, b);
        const char *in = a ? library_of(a, where, sizeof(where)) : NULL;
        EXPECT(in && strcmp(in, shim) == 0, "%s resolves to %s, not the shim %s", functions[i].name,
               in ? in : "(nothing)", shim);
        if (functions[i].fn)
            EXPECT((void *)(uintptr_t)functions[i].fn == a,
                   "%s: the linked address is not the shim's", functions[i].name);
    }
    printf("%-34s %s (%zu names + p-names, %s)\n", "symbols resolve to the shim",
           failures == before ? "ok" : "FAILED", (size_t)NFUNCTIONS, shim);
}

static void check_maps(const char *shim)
{
    int before = failures;
    FILE *f = fopen("/proc/self/maps", "r");
    char line[PATH_MAX + 256];
    while (f && fgets(line, sizeof(line), f)) {
        char *path = strchr(line, '/');
        if (path == NULL) continue;
        path[strcspn(path, "\n")] = '\0';
        char real[PATH_MAX];
        if (strncmp(strrchr(path, '/') + 1, "libnccl", 7) != 0) continue;
        if (realpath(path, real) == NULL) snprintf(real, sizeof(real), "%s", path);
        EXPECT(strcmp(real, shim) == 0, "another libnccl is mapped: %s", real);
    }
    if (f) fclose(f);
    printf("%-34s %s\n", "no other libnccl mapped", failures == before ? "ok" : "FAILED");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A 1-rank communicator from a config written by the real header (size as given). */
static ncclComm_t make_comm(size_t size, const char *what)
{
    ncclResult_t (*get_id)(ncclUniqueId *) = ncclGetUniqueId;
    ncclResult_t (*init)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *) =
        ncclCommInitRankConfig;
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *) = ncclCommGetAsyncError;
    ncclUniqueId id;
    if (get_id(&id) != ncclSuccess) {
        FAIL("%s: ncclGetUniqueId: %s", what, ncclGetLastError(NULL));
        return NULL;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "abi";
    cfg.size = size;
    ncclComm_t comm = NULL;
    ncclResult_t r = init(&comm, 1, id, 0, &cfg);
    if ((r != ncclInProgress && r != ncclSuccess) || comm == NULL) {
        FAIL("%s: ncclCommInitRankConfig -> %d: %s", what, (int)r, ncclGetLastError(NULL));
        return NULL;
    }
    ncclResult_t a = ncclInProgress;
    for (double dl = now_s() + 30; now_s() < dl; usleep(1000))
        if (async_error(comm, &a) != ncclSuccess || a != ncclInProgress) break;
    if (a != ncclSuccess) {
        FAIL("%s: init ended with %d: %s", what, (int)a, ncclGetLastError(comm));
        ncclCommDestroy(comm);
        return NULL;
    }
    return comm;
}

static void check_calls(void)
{
    int before = failures;
    ncclResult_t (*get_version)(int *) = ncclGetVersion;
    int v = 0;
    EXPECT(get_version(&v) == ncclSuccess, "ncclGetVersion failed");
    EXPECT(v / 10000 == NCCL_MAJOR && v / 100 % 100 == NCCL_MINOR,
           "the shim claims NCCL %d, the real header is %d", v, NCCL_VERSION_CODE);
    if (v != NCCL_VERSION_CODE)
        printf("note: the shim claims %d, NVIDIA's header is %d (patch levels differ)\n", v,
               NCCL_VERSION_CODE);

    /* A 2.28 config and one as NCCL 2.17's header wrote it (no splitShare or later fields). */
    const size_t sizes[] = {sizeof(ncclConfig_t), offsetof(ncclConfig_t, splitShare)};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        char what[64];
        snprintf(what, sizeof(what), "config of %zu bytes", sizes[k]);
        ncclComm_t comm = make_comm(sizes[k], what);
        if (comm == NULL) continue;
        ncclResult_t (*allreduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                  ncclComm_t, cudaStream_t) = ncclAllReduce;
        double x[3] = {1.5, -2, 4}, y[3] = {0};
        EXPECT(allreduce(x, y, 3, ncclFloat64, ncclMax, comm, NULL) == ncclSuccess && y[0] == 1.5 &&
                   y[1] == -2 && y[2] == 4,
               "%s: allreduce on 1 rank: %s", what, ncclGetLastError(NULL));
        uint8_t x8[3] = {0x38, 0xc0, 0x7e}, y8[3] = {0}; /* 1.0, -2.0, 448 */
        EXPECT(allreduce(x8, y8, 3, ncclFloat8e4m3, ncclSum, comm, NULL) == ncclSuccess &&
                   memcmp(x8, y8, 3) == 0,
               "%s: ncclFloat8e4m3 allreduce on 1 rank: %s", what, ncclGetLastError(NULL));
        EXPECT(allreduce(x, y, 3, (ncclDataType_t)ncclNumTypes, ncclSum, comm, NULL) ==
                   ncclInvalidArgument,
               "%s: datatype ncclNumTypes was not refused", what);
        /* Gather and scatter on one rank: the root's own part only (a send to itself). */
        ncclResult_t (*gather)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                               cudaStream_t) = ncclGather;
        ncclResult_t (*scatter)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                                cudaStream_t) = ncclScatter;
        int32_t g[3] = {7, -8, 9}, h[3] = {0};
        EXPECT(gather(g, h, 3, ncclInt32, 0, comm, NULL) == ncclSuccess && h[0] == 7 &&
                   h[1] == -8 && h[2] == 9,
               "%s: gather on 1 rank: %s", what, ncclGetLastError(NULL));
        memset(h, 0, sizeof(h));
        EXPECT(scatter(g, h, 3, ncclInt32, 0, comm, NULL) == ncclSuccess && h[0] == 7 &&
                   h[1] == -8 && h[2] == 9,
               "%s: scatter on 1 rank: %s", what, ncclGetLastError(NULL));
        EXPECT(gather(g, h, 3, ncclInt32, 1, comm, NULL) == ncclInvalidArgument,
               "%s: gather to root 1 of 1 rank was not refused", what);
        int n = 0;
        EXPECT(ncclCommCount(comm, &n) == ncclSuccess && n == 1, "%s: count %d", what, n);
        /* Shrinking by nobody: a communicator of the same one rank, without a new id. */
        ncclComm_t nc = NULL;
        EXPECT(ncclCommShrink(comm, NULL, 0, &nc, NULL, NCCL_SHRINK_DEFAULT) == ncclSuccess &&
                   ncclCommCount(nc, &n) == ncclSuccess && n == 1,
               "%s: shrink: %s", what, ncclGetLastError(NULL));
        EXPECT(ncclCommDestroy(nc) == ncclSuccess, "%s: destroy the shrunk one", what);
        EXPECT(ncclCommDestroy(comm) == ncclSuccess, "%s: destroy", what);
    }

    /* The refusals, through the real header's types. */
    ncclComm_t none = NULL;
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ncclWindow_t win = NULL;
    EXPECT(ncclCommShrink(NULL, NULL, 0, &none, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument,
           "ncclCommShrink");
    EXPECT(ncclCommWindowRegister(NULL, NULL, 0, &win, NCCL_WIN_DEFAULT) == ncclInvalidArgument,
           "ncclCommWindowRegister on a NULL communicator");
    EXPECT(ncclCommWindowDeregister(NULL, win) == ncclInvalidArgument, "ncclCommWindowDeregister");
    EXPECT(ncclGroupSimulateEnd(&sim) == ncclInvalidUsage, "ncclGroupSimulateEnd");
#ifdef HAVE_NCCL_DEVICE_H
    EXPECT(ncclDevCommCreate(NULL, NULL, NULL) == ncclInvalidUsage, "ncclDevCommCreate");
    EXPECT(ncclDevCommDestroy(NULL, NULL) == ncclInvalidUsage, "ncclDevCommDestroy");
#endif
    const char *e = ncclGetLastError(NULL);
    EXPECT(e && strstr(e, "not supported by loom"), "last error \"%s\"", e ? e : "(null)");

    /* Revoke: flags checked, the handle kept (destroy still needed); the debug reset. */
    ncclComm_t rc = make_comm(sizeof(ncclConfig_t), "revoke");
    if (rc) {
        ncclResult_t (*revoke)(ncclComm_t, int) = ncclCommRevoke;
        EXPECT(revoke(rc, 1) == ncclInvalidArgument, "ncclCommRevoke with flags 1");
        EXPECT(revoke(rc, NCCL_REVOKE_DEFAULT) == ncclSuccess, "ncclCommRevoke: %s",
               ncclGetLastError(NULL));
        float x = 1, y = 0;
        EXPECT(ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, rc, NULL) == ncclInvalidUsage,
               "allreduce on a revoked communicator");
        EXPECT(ncclCommDestroy(rc) == ncclSuccess, "destroy after revoke");
    }
    EXPECT(ncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT) == ncclInvalidArgument,
           "ncclCommRevoke(NULL)");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    void (*reset_debug)(void) = ncclResetDebugInit;
#pragma GCC diagnostic pop
    reset_debug();
    printf("%-34s %s\n", "calls through the real prototypes", failures == before ? "ok" : "FAILED");
}

int main(void)
{
    setenv("LOOM_SOCKET_IFNAME", "lo", 0);
    setenv("LOOM_TIMEOUT", "20", 0);
    printf("NVIDIA's header: NCCL %d.%d.%d (%d)%s\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
           NCCL_VERSION_CODE,
#ifdef HAVE_NCCL_DEVICE_H
           ", with nccl_device/core.h"
#else
           ", without nccl_device/core.h (ncclDevComm prototypes unchecked)"
#endif
    );
    char shim[PATH_MAX] = "";
    check_values();
    check_symbols(shim, sizeof(shim));
    check_calls();
    if (shim[0]) check_maps(shim);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}

#endif /* NCCL_VERSION_CODE */
#endif /* LOOM_SHIM_REAL_NCCL */
