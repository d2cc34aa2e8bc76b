/*
 * The shared vocabulary of every room: result checks, error texts, logging, time.
 *
 * Who logs: the function that detects an error logs it once, with its cause, and records the text
 * with base_set_error; callers only propagate the code with LOOM_CHECK.
 */
#ifndef LOOM_BASE_H
#define LOOM_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define LOOM_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define LOOM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LOOM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define LOOM_DIV_UP(a, b) (((a) + (b)-1) / (b))
#define LOOM_ALIGN_UP(a, b) (LOOM_DIV_UP(a, b) * (b))

#if defined(__GNUC__)
#define LOOM_LIKELY(x) __builtin_expect(!!(x), 1)
#define LOOM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define LOOM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define LOOM_EXPORT __attribute__((visibility("default")))
#else
#define LOOM_LIKELY(x) (x)
#define LOOM_UNLIKELY(x) (x)
#define LOOM_PRINTF(a, b)
#define LOOM_EXPORT
#endif

/* Propagate a failure: the callee has already logged and recorded the error. */
#define LOOM_CHECK(call)                                                                           \
    do {                                                                                           \
        loomResult_t res_ = (call);                                                                \
        if (LOOM_UNLIKELY(res_ != loomSuccess)) return res_;                                       \
    } while (0)

/* Propagate to a cleanup label, keeping the code in `res`. */
#define LOOM_CHECK_GOTO(call, res, label)                                                          \
    do {                                                                                           \
        (res) = (call);                                                                            \
        if (LOOM_UNLIKELY((res) != loomSuccess)) goto label;                                       \
    } while (0)

/* ---- logging ---- */

typedef enum { LOG_NONE = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_TRACE = 3 } log_level_t;

/* Subsystems, selected with LOOM_DEBUG_SUBSYS=INIT,NET,... (ALL by default; ^NET excludes). */
typedef enum {
    LOG_INIT = 1u << 0,
    LOG_NET = 1u << 1,
    LOG_COLL = 1u << 2,
    LOG_P2P = 1u << 3,
    LOG_BOOT = 1u << 4,
    LOG_ENV = 1u << 5,
    LOG_TUNING = 1u << 6,
    LOG_SHM = 1u << 7,
    LOG_CUDA = 1u << 8,
    LOG_SHIM = 1u << 9,
    LOG_ALL = 0xffffffffu
} log_subsys_t;

extern int log_level_cached; /* -1 until the environment was read */
int log_level(void);
/* Reads LOOM_DEBUG, LOOM_DEBUG_SUBSYS and LOOM_DEBUG_FILE again at the next log line
 * (ncclResetDebugInit). */
void log_reset(void);

/* fork(2) while another thread holds one of loom's process-wide locks would leave it locked
 * forever in the child: core's pthread_atfork handlers take them all in one fixed order
 * (prepare), then release them in the parent and re-initialise them in the child. */
typedef enum { BASE_FORK_PREPARE, BASE_FORK_PARENT, BASE_FORK_CHILD } base_fork_phase_t;
void log_atfork(base_fork_phase_t phase);
void base_error_atfork(base_fork_phase_t phase);
void param_atfork(base_fork_phase_t phase);
bool log_enabled(log_level_t level, log_subsys_t subsys);
void log_write(log_level_t level, log_subsys_t subsys, const char *file, int line, const char *fmt,
               ...) LOOM_PRINTF(5, 6);
/* The rank printed at the start of this thread's log lines (-1: none). */
void log_set_rank(int rank);
int log_get_rank(void);

#define LOG(level, subsys, ...)                                                                    \
    do {                                                                                           \
        if (LOOM_UNLIKELY(log_enabled(level, subsys)))                                             \
            log_write(level, subsys, __FILE__, __LINE__, __VA_ARGS__);                             \
    } while (0)
#define WARN(subsys, ...) LOG(LOG_WARN, subsys, __VA_ARGS__)
#define INFO(subsys, ...) LOG(LOG_INFO, subsys, __VA_ARGS__)
#define TRACE(subsys, ...) LOG(LOG_TRACE, subsys, __VA_ARGS__)

/* ---- errors ---- */

/*
 * Records the text of an error in the calling thread (and as the process's last error), logs it
 * as a warning and returns `res`, so a detection site reads
 *     return base_error(loomInvalidArgument, LOG_COLL, "allreduce: count %zu ...", count);
 */
loomResult_t base_error(loomResult_t res, log_subsys_t subsys, const char *fmt, ...)
    LOOM_PRINTF(3, 4);
/* The same without logging (the text was already logged elsewhere). */
void base_set_error_text(const char *text);
const char *base_last_error(void);
void base_clear_error(void);

/* ---- time ---- */

/* Monotonic nanoseconds. */
/* Pre-multiplied sums (loomRedOpCreatePreMulSum) are numbered from loomNumOps on: the index of
 * op in its communicator's table, or -1 for a built-in op. A schedule's descriptor carries every
 * pre-multiplied sum as the one code BASE_OP_CODE_PREMUL (the scalar is applied before it runs). */
#define BASE_OP_CODE_PREMUL ((int)loomNumOps)
static inline int base_premul_index(loomRedOp_t op)
{
    return (int)op >= (int)loomNumOps ? (int)op - (int)loomNumOps : -1;
}
/* "sum", "prod", "max", "min", "avg", "premulsum" for a descriptor's op code, else "?". */
const char *base_op_code_name(int code);

uint64_t base_now_ns(void);
/* The same clock at the kernel tick's resolution (1-4 ms), read in a few nanoseconds where
 * base_now_ns costs tens: for the stamps that progress loops write on every message and compare
 * against milliseconds or more (liveness, heartbeats, the listener's rationing). Never lower
 * than base_now_ns()'s last value minus a tick; compare its values with its own only. */
uint64_t base_coarse_ns(void);
static inline double base_now_s(void)
{
    return (double)base_now_ns() * 1e-9;
}

/* ---- random and keyed hashing ---- */

/* Cryptography is libsodium's; hand-written primitives are a defect (DESIGN.md, Security). */
#define BASE_KEY_BYTES 16
#define BASE_MAC_BYTES 32
/* sodium_init, as often as wanted; loomSystemError if libsodium cannot start. */
loomResult_t base_crypto_init(void);
/* Fills buf from libsodium's random source (randombytes_buf). */
loomResult_t base_random(void *buf, size_t len);
/* Keyed BLAKE2b over context (a text naming the message and direction), data, then data2. */
loomResult_t base_mac(const uint8_t key[BASE_KEY_BYTES], const char *context, const void *data,
                      size_t len, const void *data2, size_t len2, uint8_t out[BASE_MAC_BYTES]);
/* The job key for a LOOM_JOB_SECRET text: deterministic, different for different texts. */
loomResult_t base_derive_key(const char *text, uint8_t out[BASE_KEY_BYTES]);
/* Constant-time comparison (sodium_memcmp). */
bool base_equal_ct(const void *a, const void *b, size_t len);
/* 64-bit FNV-1a, for identities (not for security). */
uint64_t base_hash64(const void *data, size_t len, uint64_t seed);

/* ---- sizes ---- */

/* Parses "64", "64K", "1M", "2G" (binary multiples). Returns false on garbage. */
bool base_parse_size(const char *text, uint64_t *out);
/* Formats bytes as "64 KiB" into buf. */
const char *base_format_size(uint64_t bytes, char *buf, size_t len);

#endif
