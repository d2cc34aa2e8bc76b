/*
 * The rendezvous through a PMI-1 server (MPICH's Hydra, `mpiexec.hydra`, and other launchers that
 * speak the PMI-1 wire protocol): rank 0 puts its unique id in the job's key-value space, every
 * rank enters the barrier, and the others get the id. No MPI library is needed, so a loom built
 * against Open MPI still meets its peers under MPICH's launcher.
 *
 * The wire protocol is lines of `key=value` words, each line ending in a newline:
 *   cmd=init pmi_version=1 pmi_subversion=1     -> cmd=response_to_init ... rc=0
 *   cmd=get_maxes                               -> cmd=maxes kvsname_max= keylen_max= vallen_max=
 *   cmd=get_my_kvsname                          -> cmd=my_kvsname kvsname=K rc=0
 *   cmd=put kvsname=K key=k value=v             -> cmd=put_result rc=0
 *   cmd=barrier_in                              -> cmd=barrier_out
 *   cmd=get kvsname=K key=k                     -> cmd=get_result rc=0 value=v
 * The connection is the descriptor the launcher left open (PMI_FD) or a TCP port it listens on
 * (PMI_PORT=host:port), where the process first introduces itself with PMI_ID (cmd=initack).
 *
 * The connection is the process's, as the launcher's is: it is not finalized after the rendezvous,
 * so that an MPI library started later in the same process (its MPI_Init speaks to the same
 * server over the same descriptor) finds it as the launcher left it; loom says `cmd=finalize` at
 * process exit instead (Hydra takes a process that closes its connection without it for a
 * crashed one and kills the job, racing the process's own exit). The barrier is collective:
 * every rank must call the init from the environment the same number of times, as with PMIx, and
 * each rendezvous uses its own key.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm.h"
#include "launch.h"
#include "param.h"
#include "sock.h"

#define PMI1_LINE 4096

static pthread_mutex_t pmi1_lock = PTHREAD_MUTEX_INITIALIZER;
static int pmi1_fd = -1;
static pid_t pmi1_pid;
static char pmi1_kvs[256];
static size_t pmi1_vallen = 256;
static int pmi1_size = -1, pmi1_rank = -1; /* what a PMI_PORT server said at initack */
static unsigned pmi1_gen;

/* The lock is not taken across a fork (a barrier may wait for other processes); a child cannot
 * use its parent's connection to the server anyway, so it starts with a lock nobody holds. */
void pmi1_atfork_child(void)
{
    pthread_mutex_init(&pmi1_lock, NULL);
}

typedef struct {
    const char *how; /* "PMI_FD=6" or "PMI_PORT=host:1234", for errors */
    uint64_t deadline_ns;
    int rank;
} pmi1_ctx_t;

static loomResult_t pmi1_send(const pmi1_ctx_t *c, const char *line)
{
    return sock_send_all(pmi1_fd, line, strlen(line), c->deadline_ns, "the PMI-1 server");
}

/* One reply line (without its newline), read a byte at a time: the server may send the next
 * line of an unrelated reply right behind it, and the descriptor is shared with whatever uses the
 * server after loom. */
static loomResult_t pmi1_recv(const pmi1_ctx_t *c, const char *cmd, char *line, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char ch;
        ssize_t k = recv(pmi1_fd, &ch, 1, MSG_DONTWAIT);
        if (k == 1) {
            if (ch == '\n') break;
            if (n + 1 >= cap)
                return base_error(loomSystemError, LOG_BOOT,
                                  "rank %d: the PMI-1 server (%s) sent a line longer than %zu "
                                  "bytes in reply to %s",
                                  c->rank, c->how, cap, cmd);
            line[n++] = ch;
            continue;
        }
        if (k == 0)
            return base_error(loomSystemError, LOG_BOOT,
                              "rank %d: the PMI-1 server (%s) closed the connection while loom "
                              "waited for its reply to %s (did the launcher end the job?)",
                              c->rank, c->how, cmd);
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return base_error(loomSystemError, LOG_BOOT,
                              "rank %d: recv from the PMI-1 server (%s), waiting for the reply "
                              "to %s: %s",
                              c->rank, c->how, cmd, strerror(errno));
        uint64_t now = base_now_ns();
        if (now >= c->deadline_ns)
            return base_error(loomSystemError, LOG_BOOT,
                              "rank %d: no reply from the PMI-1 server (%s) to %s within %.0f s "
                              "(every rank must call the init from the environment; is a rank "
                              "missing?)",
                              c->rank, c->how, cmd, param_double(PARAM_TIMEOUT) * 4);
        struct pollfd p = {.fd = pmi1_fd, .events = POLLIN};
        uint64_t left_ms = (c->deadline_ns - now) / 1000000 + 1;
        (void)poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms);
    }
    line[n] = '\0';
    return loomSuccess;
}

/* The value of word `key=` in a reply line, copied into out; false if absent. */
static bool pmi1_word(const char *line, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = line; *p;) {
        while (*p == ' ')
            p++;
        const char *end = strchr(p, ' ');
        size_t wl = end ? (size_t)(end - p) : strlen(p);
        if (wl > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
            size_t vl = wl - kl - 1;
            if (vl >= cap) vl = cap - 1;
            memcpy(out, p + kl + 1, vl);
            out[vl] = '\0';
            return true;
        }
        p += wl;
    }
    return false;
}

/* Sends `req`, reads one line, checks that it is `cmd=want` with rc=0 (when the reply has one). */
static loomResult_t pmi1_call(const pmi1_ctx_t *c, const char *req, const char *want, char *line,
                              size_t cap)
{
    LOOM_CHECK(pmi1_send(c, req));
    char what[64];
    snprintf(what, sizeof(what), "%.*s", (int)strcspn(req, " \n"), req);
    LOOM_CHECK(pmi1_recv(c, what, line, cap));
    char cmd[64] = "", rc[16] = "0", msg[256] = "";
    pmi1_word(line, "cmd", cmd, sizeof(cmd));
    pmi1_word(line, "rc", rc, sizeof(rc));
    pmi1_word(line, "msg", msg, sizeof(msg));
    if (strcmp(cmd, want) != 0 || strcmp(rc, "0") != 0)
        return base_error(loomSystemError, LOG_BOOT,
                          "rank %d: the PMI-1 server (%s) answered %s with \"%s\" (expected "
                          "cmd=%s rc=0)%s%s",
                          c->rank, c->how, what, line, want, msg[0] ? ": " : "", msg);
    return loomSuccess;
}

static loomResult_t pmi1_connect_port(const pmi1_ctx_t *c, const char *port_spec)
{
    char host[256];
    const char *colon = strrchr(port_spec, ':');
    if (!colon || colon == port_spec || (size_t)(colon - port_spec) >= sizeof(host) || !colon[1])
        return base_error(loomInvalidUsage, LOG_BOOT,
                          "PMI_PORT=%s: expected host:port (as the PMI-1 launcher sets it)",
                          port_spec);
    memcpy(host, port_spec, (size_t)(colon - port_spec));
    host[colon - port_spec] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, colon + 1, &hints, &res);
    if (g != 0 || res == NULL)
        return base_error(loomInvalidUsage, LOG_BOOT, "PMI_PORT=%s: %s", port_spec,
                          gai_strerror(g));
    sock_addr_t a;
    memset(&a, 0, sizeof(a));
    memcpy(&a.sa, res->ai_addr, res->ai_addrlen);
    a.len = res->ai_addrlen;
    freeaddrinfo(res);
    int fd = -1;
    LOOM_CHECK(sock_connect_start(&a, &fd));
    for (;;) {
        int done = sock_connect_done(fd);
        if (done == 1) break;
        if (done < 0) {
            int e = errno;
            close(fd);
            return base_error(loomSystemError, LOG_BOOT,
                              "rank %d: connect to the PMI-1 server at PMI_PORT=%s: %s", c->rank,
                              port_spec, strerror(e));
        }
        if (base_now_ns() >= c->deadline_ns) {
            close(fd);
            return base_error(loomSystemError, LOG_BOOT,
                              "rank %d: connect to the PMI-1 server at PMI_PORT=%s did not finish "
                              "in time",
                              c->rank, port_spec);
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        (void)poll(&p, 1, 100);
    }
    pmi1_fd = fd;
    return loomSuccess;
}

static loomResult_t pmi1_open(pmi1_ctx_t *c, char *line)
{
    const char *fds = getenv("PMI_FD"), *port = getenv("PMI_PORT");
    if (fds) {
        char *end = NULL;
        errno = 0;
        long v = strtol(fds, &end, 10);
        if (errno || end == fds || *end || v < 0 || v > 1 << 20)
            return base_error(loomInvalidUsage, LOG_BOOT, "PMI_FD=%s: not a file descriptor number",
                              fds);
        /* its flags stay the launcher's (an MPI library may use it after loom): the reads
         * poll and never block */
        pmi1_fd = (int)v;
    } else {
        LOOM_CHECK(pmi1_connect_port(c, port));
        const char *id = getenv("PMI_ID");
        char req[128];
        snprintf(req, sizeof(req), "cmd=initack pmiid=%s\n", id ? id : "");
        LOOM_CHECK(pmi1_call(c, req, "initack", line, PMI1_LINE));
        /* then the server states size, rank and debug, one line each */
        for (int i = 0; i < 3; i++) {
            LOOM_CHECK(pmi1_recv(c, "initack", line, PMI1_LINE));
            char v[32];
            if (pmi1_word(line, "size", v, sizeof(v))) pmi1_size = atoi(v);
            if (pmi1_word(line, "rank", v, sizeof(v))) pmi1_rank = atoi(v);
        }
    }
    pmi1_pid = getpid();
    LOOM_CHECK(pmi1_call(c, "cmd=init pmi_version=1 pmi_subversion=1\n", "response_to_init", line,
                         PMI1_LINE));
    LOOM_CHECK(pmi1_call(c, "cmd=get_maxes\n", "maxes", line, PMI1_LINE));
    char v[32];
    if (pmi1_word(line, "vallen_max", v, sizeof(v))) pmi1_vallen = (size_t)strtoul(v, NULL, 10);
    LOOM_CHECK(pmi1_call(c, "cmd=get_my_kvsname\n", "my_kvsname", line, PMI1_LINE));
    if (!pmi1_word(line, "kvsname", pmi1_kvs, sizeof(pmi1_kvs)))
        return base_error(loomSystemError, LOG_BOOT,
                          "rank %d: the PMI-1 server (%s) named no key-value space: \"%s\"",
                          c->rank, c->how, line);
    return loomSuccess;
}

/* Forgets the connection and everything its server said, so that the next attempt starts from
 * the beginning (and the exit handler says nothing on it) after an open that failed half way: a
 * connection loom made (PMI_PORT) is closed; the launcher's descriptor (PMI_FD) stays open, as
 * the launcher left it, for whatever speaks to the server after loom. */
static void pmi1_forget(bool ours)
{
    if (ours && pmi1_fd >= 0) close(pmi1_fd);
    pmi1_fd = -1;
    pmi1_pid = 0;
    pmi1_kvs[0] = '\0';
    pmi1_vallen = 256;
    pmi1_size = pmi1_rank = -1;
}

static loomResult_t pmi1_meet_locked(const launch_env_t *e, loomUniqueId *id, int *nranks)
{
    char how[300], *line = malloc(PMI1_LINE);
    if (!line) return base_error(loomSystemError, LOG_BOOT, "out of memory");
    const char *fds = getenv("PMI_FD");
    snprintf(how, sizeof(how), "%s=%s", fds ? "PMI_FD" : "PMI_PORT",
             fds                  ? fds
             : getenv("PMI_PORT") ? getenv("PMI_PORT")
                                  : "");
    double t = param_double(PARAM_TIMEOUT);
    pmi1_ctx_t c = {.how = how,
                    .rank = e->rank,
                    .deadline_ns = t > 0 ? base_now_ns() + (uint64_t)(t * 4e9) : UINT64_MAX / 2};
    loomResult_t r = loomSuccess;
    if (pmi1_fd < 0 || pmi1_pid != getpid()) {
        /* (a forked child's inherited descriptor is its parent's: not closed here) */
        pmi1_forget(false);
        r = pmi1_open(&c, line);
        if (r != loomSuccess) pmi1_forget(fds == NULL);
    }
    int size = e->nranks;
    if (r == loomSuccess && pmi1_size > 0) {
        if ((size > 0 && size != pmi1_size) || (pmi1_rank >= 0 && pmi1_rank != e->rank))
            r = base_error(loomInvalidUsage, LOG_BOOT,
                           "launchers disagree: %s says rank %d of %d (%s) but the PMI-1 server "
                           "(%s) says rank %d of %d",
                           e->name, e->rank, size, e->vars, how, pmi1_rank, pmi1_size);
        size = pmi1_size;
    }
    if (r == loomSuccess && (size < 1 || e->rank >= size))
        r = base_error(loomInvalidUsage, LOG_BOOT,
                       "rank %d: the job size is unknown or too small (%d) after meeting the "
                       "PMI-1 server (%s)",
                       e->rank, size, how);
    /* the id as hex: PMI-1 values are words without spaces or '=' */
    char key[64];
    snprintf(key, sizeof(key), "loom.uid.%u", pmi1_gen++);
    size_t hexlen = 2 * sizeof(*id);
    if (r == loomSuccess && hexlen >= pmi1_vallen)
        r = base_error(loomSystemError, LOG_BOOT,
                       "rank %d: the PMI-1 server (%s) takes values of at most %zu bytes; a "
                       "unique id needs %zu",
                       e->rank, how, pmi1_vallen, hexlen + 1);
    char *req = r == loomSuccess ? malloc(PMI1_LINE) : NULL;
    if (r == loomSuccess && !req) r = base_error(loomSystemError, LOG_BOOT, "out of memory");
    if (r == loomSuccess && e->rank == 0) {
        r = boot_uid_create(id);
        if (r == loomSuccess) {
            int o = snprintf(req, PMI1_LINE, "cmd=put kvsname=%s key=%s value=", pmi1_kvs, key);
            for (size_t i = 0; i < sizeof(*id); i++)
                o += snprintf(req + o, PMI1_LINE - (size_t)o, "%02x",
                              (unsigned char)id->internal[i]);
            snprintf(req + o, PMI1_LINE - (size_t)o, "\n");
            r = pmi1_call(&c, req, "put_result", line, PMI1_LINE);
        }
    }
    if (r == loomSuccess) r = pmi1_call(&c, "cmd=barrier_in\n", "barrier_out", line, PMI1_LINE);
    if (r == loomSuccess && e->rank != 0) {
        snprintf(req, PMI1_LINE, "cmd=get kvsname=%s key=%s\n", pmi1_kvs, key);
        r = pmi1_call(&c, req, "get_result", line, PMI1_LINE);
        char *val = r == loomSuccess ? malloc(PMI1_LINE) : NULL;
        if (r == loomSuccess &&
            (!val || !pmi1_word(line, "value", val, PMI1_LINE) || strlen(val) != hexlen))
            r = base_error(loomSystemError, LOG_BOOT,
                           "rank %d: the PMI-1 server (%s) gave no unique id under %s in %s: "
                           "\"%s\"",
                           e->rank, how, key, pmi1_kvs, line);
        for (size_t i = 0; r == loomSuccess && i < sizeof(*id); i++) {
            unsigned b;
            if (sscanf(val + 2 * i, "%2x", &b) != 1)
                r = base_error(loomSystemError, LOG_BOOT,
                               "rank %d: the unique id under %s is not hex", e->rank, key);
            id->internal[i] = (char)b;
        }
        free(val);
    }
    if (r == loomSuccess) {
        INFO(LOG_BOOT, "rank %d of %d met through the PMI-1 server (%s, space %s, key %s)", e->rank,
             size, how, pmi1_kvs, key);
        *nranks = size;
    }
    free(req);
    free(line);
    return r;
}

/* At exit of the process that spoke to the server: finalize, and wait (briefly) for the answer,
 * so the launcher sees a clean end before the descriptor closes. */
__attribute__((destructor)) static void pmi1_fini(void)
{
    if (pmi1_fd < 0 || pmi1_pid != getpid()) return;
    /* quietly: nothing is left to report to at exit */
    static const char req[] = "cmd=finalize\n";
    if (send(pmi1_fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof(req) - 1)) {
        uint64_t end = base_now_ns() + 1000000000ull;
        char ch = 0;
        while (ch != '\n' && base_now_ns() < end) {
            struct pollfd p = {.fd = pmi1_fd, .events = POLLIN};
            if (poll(&p, 1, 100) > 0 && recv(pmi1_fd, &ch, 1, MSG_DONTWAIT) == 0) break;
        }
    }
    pmi1_fd = -1;
}

loomResult_t launch_pmi1_meet(const launch_env_t *e, loomUniqueId *id, int *nranks)
{
    pthread_mutex_lock(&pmi1_lock);
    loomResult_t r = pmi1_meet_locked(e, id, nranks);
    pthread_mutex_unlock(&pmi1_lock);
    return r;
}
