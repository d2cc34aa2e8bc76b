/* Errors, time, randomness, keyed hashing and size parsing. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "base.h"

#define ERROR_TEXT_MAX 1024

static _Thread_local char thread_error[ERROR_TEXT_MAX];
static char process_error[ERROR_TEXT_MAX];
static pthread_mutex_t error_lock = PTHREAD_MUTEX_INITIALIZER;

void base_set_error_text(const char *text)
{
    snprintf(thread_error, sizeof(thread_error), "%s", text);
    pthread_mutex_lock(&error_lock);
    snprintf(process_error, sizeof(process_error), "%s", text);
    pthread_mutex_unlock(&error_lock);
}

void base_error_atfork(base_fork_phase_t phase)
{
    if (phase == BASE_FORK_PREPARE)
        pthread_mutex_lock(&error_lock);
    else if (phase == BASE_FORK_PARENT)
        pthread_mutex_unlock(&error_lock);
    else
        pthread_mutex_unlock(&error_lock);
}

loomResult_t base_error(loomResult_t res, log_subsys_t subsys, const char *fmt, ...)
{
    char text[ERROR_TEXT_MAX];
    int o = 0;
    if (log_get_rank() >= 0) o = snprintf(text, sizeof(text), "rank %d: ", log_get_rank());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + o, sizeof(text) - (size_t)o, fmt, ap);
    va_end(ap);
    base_set_error_text(text);
    LOG(LOG_WARN, subsys, "%s", text + o);
    return res;
}

const char *base_last_error(void)
{
    if (thread_error[0]) return thread_error;
    /* The process-wide text is only replaced whole under the lock; a racing reader may see a
     * newer error, never a torn one, because callers copy it before the next error. */
    return process_error;
}

void base_clear_error(void)
{
    thread_error[0] = '\0';
}

uint64_t base_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t base_coarse_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

loomResult_t base_crypto_init(void)
{
    /* sodium_init is thread-safe and returns 1 once done, so every user may call it. */
    if (sodium_init() < 0)
        return base_error(loomSystemError, LOG_INIT,
                          "libsodium failed to initialize (sodium_init): no usable random source "
                          "or CPU feature detection failed");
    return loomSuccess;
}

loomResult_t base_random(void *buf, size_t len)
{
    LOOM_CHECK(base_crypto_init());
    randombytes_buf(buf, len);
    return loomSuccess;
}

/* Keyed BLAKE2b rather than HMAC-SHA-512/256: BLAKE2b is a MAC by construction when keyed (no
 * nested hashing), takes the unique id's 16-byte secret as its key as it is, and costs one pass
 * over the input. The context and its terminating NUL come first, so no two purposes can share
 * an input. */
loomResult_t base_mac(const uint8_t key[BASE_KEY_BYTES], const char *context, const void *data,
                      size_t len, const void *data2, size_t len2, uint8_t out[BASE_MAC_BYTES])
{
    _Static_assert(BASE_KEY_BYTES >= crypto_generichash_KEYBYTES_MIN, "BLAKE2b key size");
    _Static_assert(BASE_MAC_BYTES >= crypto_generichash_BYTES_MIN, "BLAKE2b output size");
    LOOM_CHECK(base_crypto_init());
    crypto_generichash_state st;
    crypto_generichash_init(&st, key, BASE_KEY_BYTES, BASE_MAC_BYTES);
    crypto_generichash_update(&st, (const unsigned char *)context, strlen(context) + 1);
    if (len) crypto_generichash_update(&st, data, len);
    if (len2) crypto_generichash_update(&st, data2, len2);
    crypto_generichash_final(&st, out, BASE_MAC_BYTES);
    sodium_memzero(&st, sizeof(st));
    return loomSuccess;
}

/* The text is not a uniform key, so libsodium's crypto_kdf (which wants one) cannot take it
 * directly; this is the same BLAKE2b construction crypto_kdf uses (a personalization naming the
 * purpose), applied to the text. A password hash (Argon2) would only slow guessing of a weak text,
 * and every rank of a large job would pay its time and memory at start-up; launchers are expected
 * to export a random value. */
loomResult_t base_derive_key(const char *text, uint8_t out[BASE_KEY_BYTES])
{
    static const unsigned char personal[crypto_generichash_blake2b_PERSONALBYTES] =
        "loom-job-secret";
    LOOM_CHECK(base_crypto_init());
    if (crypto_generichash_blake2b_salt_personal(out, BASE_KEY_BYTES, (const unsigned char *)text,
                                                 strlen(text), NULL, 0, NULL, personal) != 0)
        return base_error(loomSystemError, LOG_INIT,
                          "deriving the job key from LOOM_JOB_SECRET "
                          "failed");
    return loomSuccess;
}

bool base_equal_ct(const void *a, const void *b, size_t len)
{
    return sodium_memcmp(a, b, len) == 0;
}

uint64_t base_hash64(const void *data, size_t len, uint64_t seed)
{
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

bool base_parse_size(const char *text, uint64_t *out)
{
    if (text == NULL) return false;
    while (isspace((unsigned char)*text))
        text++;
    if (!isdigit((unsigned char)*text)) return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno) return false;
    /* Each unit is 1024 times the one before it. */
    static const char units[] = "KMGT";
    uint64_t mult = 1;
    if (*end != '\0') {
        const char *u = strchr(units, toupper((unsigned char)*end));
        if (u == NULL) return false;
        mult = 1ull << (10 * (u - units + 1));
        end++;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0') return false;
    if (mult > 1 && v > UINT64_MAX / mult) return false;
    *out = (uint64_t)v * mult;
    return true;
}

const char *base_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = (double)bytes;
    while (v >= 1024 && u < 4 && bytes % 1024 == 0) {
        v /= 1024;
        bytes /= 1024;
        u++;
    }
    snprintf(buf, len, "%.0f %s", v, units[u]);
    return buf;
}

const char *base_op_code_name(int code)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
    _Static_assert(LOOM_ARRAY_SIZE(names) == BASE_OP_CODE_PREMUL + 1, "one name per op code");
    return code >= 0 && code < (int)LOOM_ARRAY_SIZE(names) ? names[code] : "?";
}
