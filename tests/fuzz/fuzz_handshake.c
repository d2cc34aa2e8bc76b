/*
 * libFuzzer harness over the connection handshake (src/base/sock.c, hs_*): the real state machine
 * on one end of a socketpair, the fuzzer's bytes on the other. The first input byte picks:
 *   0: the bytes are what a stranger sends to an acceptor (listener side);
 *   1: the bytes are what a stranger answers a connector with;
 *   2: a real connector, whose hello fields come from the input, against a real acceptor with the
 *      same secret: whatever the acceptor accepts must be exactly the hello that was sent.
 * Either side must end DONE or FAILED, never loop: more than HS_FUZZ_STEPS steps is a crash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sock.h"

#define HS_FUZZ_STEPS 10000

static const uint8_t fuzz_secret[16] = "loom-fuzz-secret";

static sock_addr_t fuzz_peer(void)
{
    sock_addr_t a;
    memset(&a, 0, sizeof(a));
    a.sa.ss_family = AF_UNIX;
    a.len = sizeof(sa_family_t);
    return a;
}

static int finished(const hs_t *h)
{
    return h->state == HS_DONE || h->state == HS_FAILED;
}

/* Runs h until it finishes; the fuzzer's end (already written and shut) only absorbs sends. */
static void run_one(hs_t *h, int other)
{
    char sink[512];
    for (int step = 0; !finished(h); step++) {
        if (step > HS_FUZZ_STEPS) abort();
        bool progressed = false;
        hs_progress(h, &progressed);
        while (recv(other, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096) return 0;
    int mode = data[0] % 3;
    data++, size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    sock_addr_t peer = fuzz_peer();
    hs_t h;
    if (mode < 2) {
        /* The stranger's whole stream, then end of file. */
        if (size && send(sv[1], data, size, MSG_NOSIGNAL) != (ssize_t)size) abort();
        shutdown(sv[1], SHUT_WR);
        if (mode == 0) {
            if (hs_accept_init(&h, sv[0], &peer, fuzz_secret) != loomSuccess) abort();
        } else {
            hs_hello_t hello = {.comm_id = 1, .from_rank = 0, .to_rank = 1, .chan = 0, .nchan = 1};
            hs_connect_init(&h, sv[0], &peer, fuzz_secret, &hello);
        }
        run_one(&h, sv[1]);
    } else {
        hs_hello_t hello;
        memset(&hello, 0, sizeof(hello));
        memcpy(&hello, data, size < sizeof(hello) ? size : sizeof(hello));
        hs_t acc;
        hs_connect_init(&h, sv[0], &peer, fuzz_secret, &hello);
        if (hs_accept_init(&acc, sv[1], &peer, fuzz_secret) != loomSuccess) abort();
        for (int step = 0; !finished(&h) || !finished(&acc); step++) {
            if (step > HS_FUZZ_STEPS) abort();
            bool progressed = false;
            if (!finished(&h)) hs_progress(&h, &progressed);
            if (!finished(&acc)) hs_progress(&acc, &progressed);
        }
        if (acc.state == HS_DONE &&
            (acc.hello.comm_id != hello.comm_id || acc.hello.from_rank != hello.from_rank ||
             acc.hello.to_rank != hello.to_rank || acc.hello.chan != hello.chan ||
             acc.hello.nchan != hello.nchan))
            abort(); /* accepted a hello other than the one sent */
    }
    close(sv[0]);
    close(sv[1]);
    return 0;
}
