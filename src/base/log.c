/* Logging: lines start with host, pid and rank so that the logs of a job can be merged. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

#include "base.h"
#include "param.h"

int log_level_cached = -1;
static uint32_t log_mask = LOG_ALL;
static FILE *log_file;
static char log_host[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int log_rank = -1;

static const struct {
    const char *name;
    log_subsys_t bit;
} subsys_names[] = {
    {"INIT", LOG_INIT}, {"NET", LOG_NET},   {"COLL", LOG_COLL},     {"P2P", LOG_P2P},
    {"BOOT", LOG_BOOT}, {"ENV", LOG_ENV},   {"TUNING", LOG_TUNING}, {"SHM", LOG_SHM},
    {"CUDA", LOG_CUDA}, {"SHIM", LOG_SHIM}, {"ALL", LOG_ALL},
};

static const char *subsys_name(log_subsys_t s)
{
    for (size_t i = 0; i < LOOM_ARRAY_SIZE(subsys_names); i++)
        if (subsys_names[i].bit == s) return subsys_names[i].name;
    return "?";
}

/* Expands %h (host) and %p (pid) in LOOM_DEBUG_FILE. */
static void log_open_file(const char *pattern)
{
    char path[4096];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 64 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%s", log_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof(path) - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    FILE *f = fopen(path, "a");
    if (f == NULL) {
        fprintf(stderr, "%s:%d loom WARN cannot open LOOM_DEBUG_FILE %s: %s; logging to stderr\n",
                log_host, (int)getpid(), path, strerror(errno));
        return;
    }
    setvbuf(f, NULL, _IOLBF, 0);
    log_file = f;
}

int log_level(void)
{
    int lvl = __atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE);
    if (LOOM_LIKELY(lvl >= 0)) return lvl;
    /* Read (and checked) before the lock: a bad value's warning comes back here. */
    const char *d = param_str(PARAM_DEBUG);
    const char *s = param_str(PARAM_DEBUG_SUBSYS);
    const char *f = param_str(PARAM_DEBUG_FILE);
    pthread_mutex_lock(&log_lock);
    if (__atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE) < 0) {
        gethostname(log_host, sizeof(log_host) - 1);
        char *dot = strchr(log_host, '.');
        if (dot) *dot = '\0';
        int l = LOG_WARN; /* warnings are always printed: they explain failures */
        if (!strcasecmp(d, "NONE"))
            l = LOG_NONE;
        else if (!strcasecmp(d, "INFO"))
            l = LOG_INFO;
        else if (!strcasecmp(d, "TRACE"))
            l = LOG_TRACE;
        uint32_t mask = LOG_ALL;
        if (s[0]) {
            bool invert = s[0] == '^';
            char buf[256];
            snprintf(buf, sizeof(buf), "%s", s + (invert ? 1 : 0));
            mask = 0;
            char *save = NULL;
            for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                for (size_t i = 0; i < LOOM_ARRAY_SIZE(subsys_names); i++)
                    if (!strcasecmp(tok, subsys_names[i].name)) mask |= subsys_names[i].bit;
            if (invert) mask = ~mask;
        }
        log_mask = mask;
        if (f[0] && log_file == NULL) log_open_file(f);
        __atomic_store_n(&log_level_cached, l, __ATOMIC_RELEASE);
        lvl = l;
    } else {
        lvl = __atomic_load_n(&log_level_cached, __ATOMIC_ACQUIRE);
    }
    pthread_mutex_unlock(&log_lock);
    return lvl;
}

void log_atfork(base_fork_phase_t phase)
{
    if (phase == BASE_FORK_PREPARE)
        pthread_mutex_lock(&log_lock);
    else if (phase == BASE_FORK_PARENT)
        pthread_mutex_unlock(&log_lock);
    else
        pthread_mutex_unlock(&log_lock);
}

void log_reset(void)
{
    param_forget(PARAM_DEBUG);
    param_forget(PARAM_DEBUG_SUBSYS);
    param_forget(PARAM_DEBUG_FILE);
    __atomic_store_n(&log_level_cached, -1, __ATOMIC_RELEASE);
}

bool log_enabled(log_level_t level, log_subsys_t subsys)
{
    /* Warnings ignore the subsystem mask: a failure must always explain itself. */
    if ((int)level > log_level()) return false;
    return level == LOG_WARN || (log_mask & (uint32_t)subsys) != 0;
}

void log_set_rank(int rank)
{
    log_rank = rank;
}
int log_get_rank(void)
{
    return log_rank;
}

void log_write(log_level_t level, log_subsys_t subsys, const char *file, int line, const char *fmt,
               ...)
{
    static const char *lvl[] = {"NONE", "WARN", "INFO", "TRACE"};
    char msg[2048];
    int o;
    if (log_rank >= 0)
        o = snprintf(msg, sizeof(msg), "%s:%d:%d loom %s %s ", log_host, (int)getpid(), log_rank,
                     lvl[level], subsys_name(subsys));
    else
        o = snprintf(msg, sizeof(msg), "%s:%d loom %s %s ", log_host, (int)getpid(), lvl[level],
                     subsys_name(subsys));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + o, sizeof(msg) - (size_t)o, fmt, ap);
    va_end(ap);
    if (level == LOG_TRACE) {
        size_t n = strlen(msg);
        snprintf(msg + n, sizeof(msg) - n, " [%s:%d]", file, line);
    }
    /* one write(2) per line: ranks sharing a file or a pipe (mpirun's, a test's) never split
     * each other's lines (stderr's stdio wrote a long line in pieces) */
    size_t n = strnlen(msg, sizeof(msg) - 2);
    msg[n++] = '\n';
    FILE *f = log_file ? log_file : stderr;
    pthread_mutex_lock(&log_lock);
    fflush(f);
    int fd = fileno(f);
    for (size_t done = 0; fd >= 0 && done < n;) {
        ssize_t w = write(fd, msg + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    pthread_mutex_unlock(&log_lock);
}
