/*
 * The job-state service: the bootstrap root, kept for the life of the job, that every rank of a
 * communicator made by loomCommInitRank stays connected to (over its bootstrap connection).
 *
 * - A rank that fails reports (rank, host, pid, the operation and its cause); the service asks
 *   every rank for its state line (what it runs or last finished, and which peers it waits on),
 *   prints the job's table, and sends every rank the verdict: the first cause, or a rank whose
 *   connection to the service closed without a goodbye (it died), which is preferred. A rank
 *   that has the verdict fails its current and later calls with it, whether or not it has a link
 *   to the failed rank. A rank that fails waits (bounded: JS_VERDICT_WAIT_NS) for the verdict so
 *   that every rank reports the same original cause.
 * - `loom-status` connects to the same listener, authenticates with the job secret (sock.h's
 *   handshake, from rank JS_RANK_STATUS), and receives the table.
 * - If the service's process dies, ranks see its connection close and carry on with the
 *   link-based detection (LOOM_TIMEOUT, aborts forwarded over the links).
 *
 * Nothing here is on a collective's path: the rank's side is a poll function of the progress
 * thread (woken by the socket), and the executor only keeps a few fields per call.
 */
#ifndef LOOM_CORE_JOBSTATE_H
#define LOOM_CORE_JOBSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "sock.h"

#define JS_RANK_STATUS (-2)              /* the hello's from_rank of a loom-status client */
#define JS_VERDICT_WAIT_NS 5000000000ull /* a failing rank waits this long for the verdict */
#define JS_QUERY_WAIT_NS 2000000000ull   /* the service waits this long for state lines */
#define JS_HOST_LEN 64

/* ---- frames: what the service and the ranks send each other (tests/fuzz/fuzz_jobstate.c) ---- */

#define JS_MAGIC 0x6c6a7331u /* "ljs1" */
#define JS_TEXT_MAX 2048     /* a cause or a state line */
typedef struct {
    uint32_t magic;
    uint16_t type, flags;
    int32_t rank, pid;
    uint64_t arg;
    uint32_t len; /* text bytes that follow */
    uint32_t pad;
    char host[JS_HOST_LEN];
} js_frame_t;
#define JS_RX_BYTES (4 * (sizeof(js_frame_t) + JS_TEXT_MAX + SOCK_AUTH_TAG))
typedef struct {
    uint8_t buf[JS_RX_BYTES];
    size_t got;
} js_rx_t;
/* A frame as it goes on the wire (the frame, len bytes of text, its tag under au's sending
 * key), into out (room for sizeof(js_frame_t) + len + SOCK_AUTH_TAG); returns its length. The
 * ranks' and the service's frames keep their texts under JS_TEXT_MAX (js_rx_next refuses more);
 * the table for loom-status may be longer (its own reader). */
size_t js_frame_encode(sock_auth_t *au, const js_frame_t *f, const char *text, size_t len,
                       uint8_t *out);
/* The next whole frame in rx (its text NUL-terminated into text, of tlen >= 1 bytes): 1, and
 * the frame's bytes leave rx; 0 none yet; -1 malformed; -2 failed authentication. */
int js_rx_next(js_rx_t *rx, sock_auth_t *au, js_frame_t *f, char *text, size_t tlen);

/* ---- the service (the root thread, after the rendezvous) ---- */

typedef struct {
    int listen_fd; /* the bootstrap listener: loom-status connects here */
    uint8_t secret[16];
    uint64_t job_id;
    const char *addr_str;
    int nranks;
    int *fd_of;                 /* each rank's bootstrap connection (taken over) */
    const sock_auth_t *auth_of; /* and its message keys and counts (sock.h), taken over too */
    const char (*host_of)[JS_HOST_LEN];
    /* The root's socket bookkeeping (bootstrap.c: fork safety). */
    int (*accept_fd)(int listen_fd, sock_addr_t *peer);
    void (*close_fd)(int fd);
} js_serve_args_t;

/* Runs the service until every rank said goodbye or left; closes the ranks' sockets. */
void js_serve(const js_serve_args_t *a);

/* ---- a rank's side ---- */

typedef struct js_client js_client_t;
typedef struct {
    int rank, nranks;
    void *arg;
    /* The verdict arrived while this rank had no error of its own (progress thread). */
    void (*fail)(void *arg, const char *text);
    /* This rank's state line (exec_host_status; false: busy) and its current operation (may
     * be ""). */
    bool (*line)(void *arg, char *buf, size_t len);
    void (*current)(void *arg, char *buf, size_t len);
} js_hooks_t;

/* Takes over the rendezvous' connection fd (after the table) and attaches to the progress
 * thread. On failure fd is closed and the rank carries on without the service. */
loomResult_t js_client_start(int fd, const sock_addr_t *root, const sock_auth_t *au,
                             const js_hooks_t *hooks, js_client_t **out);
/* A local error: reports it (once) and waits at most JS_VERDICT_WAIT_NS for the job's verdict;
 * writes into out the text to keep (the verdict, with the local text after it), or the local
 * text if the service is gone or silent. */
void js_client_error(js_client_t *c, const char *local, char *out, size_t len);
/* Reports a cause without waiting for the verdict (loomCommAbort: the job learns who). */
void js_client_report(js_client_t *c, const char *text);
/* Says goodbye (a destroyed communicator is not a dead rank), detaches, closes, frees. */
void js_client_stop(js_client_t *c);

/* ---- loom-status ---- */

/* Connects to the service at root, proves the secret (as rank JS_RANK_STATUS of job_id), and
 * returns the table (malloc'd, NUL-terminated) within timeout_ns. */
loomResult_t js_status_query(const sock_addr_t *root, const uint8_t secret[16], uint64_t job_id,
                             uint64_t timeout_ns, char **table);

#endif
