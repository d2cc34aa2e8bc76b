/* Errors, time, randomness, keyed hashing and size parsing. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

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
        pthread_mutex_init(&error_lock, NULL);
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

loomResult_t base_random(void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return base_error(loomSystemError, LOG_INIT, "getrandom(%zu bytes) failed: %s", len,
                              strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return loomSuccess;
}

/* SipHash-2-4 (Aumasson and Bernstein), 128-bit output variant. */
#define SIP_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIP_ROUND                                                                                  \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = SIP_ROTL(v1, 13);                                                                     \
        v1 ^= v0;                                                                                  \
        v0 = SIP_ROTL(v0, 32);                                                                     \
        v2 += v3;                                                                                  \
        v3 = SIP_ROTL(v3, 16);                                                                     \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = SIP_ROTL(v3, 21);                                                                     \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = SIP_ROTL(v1, 17);                                                                     \
        v1 ^= v2;                                                                                  \
        v2 = SIP_ROTL(v2, 32);                                                                     \
    } while (0)

static uint64_t sip_load64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void sip_store64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

void base_siphash128(const uint8_t key[16], const void *data, size_t len, uint8_t out[16])
{
    const uint8_t *in = data;
    uint64_t k0 = sip_load64(key), k1 = sip_load64(key + 8);
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    v1 ^= 0xee;
    const uint8_t *end = in + len - (len % 8);
    for (; in != end; in += 8) {
        uint64_t m = sip_load64(in);
        v3 ^= m;
        SIP_ROUND;
        SIP_ROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < len % 8; i++)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIP_ROUND;
    SIP_ROUND;
    v0 ^= b;
    v2 ^= 0xee;
    for (int i = 0; i < 4; i++)
        SIP_ROUND;
    sip_store64(out, v0 ^ v1 ^ v2 ^ v3);
    v1 ^= 0xdd;
    for (int i = 0; i < 4; i++)
        SIP_ROUND;
    sip_store64(out + 8, v0 ^ v1 ^ v2 ^ v3);
}

bool base_equal_ct(const void *a, const void *b, size_t len)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < len; i++)
        d |= (uint8_t)(x[i] ^ y[i]);
    return d == 0;
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
