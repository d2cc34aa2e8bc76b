/*
 * libFuzzer harness over the bootstrap root's messages (src/core/bootstrap.c, root_main): a real
 * root started by boot_uid_create on loopback, and one rank, played by the harness, that passes
 * the real handshake with the id's secret and then says what the input says. Input:
 *   byte 0: bit 0 set: a wrong job id in the hello; bit 1 set: close right after the hello;
 *           bit 2 set: the record's authentication tag damaged
 *   byte 1: the hello's rank (signed); byte 2: its rank count (0-4)
 *   the rest: the bytes sent as the rank's address record (peer_info_t and the addresses it
 *   announces), short, exact or long; a whole record is followed by its tag (sock.h's
 *   authenticated messages), made with the connection's keys unless bit 2 says otherwise.
 * The root must refuse a wrong job, a bad rank or rank count, a record naming another rank and a
 * record that fails authentication (an error reply with its text, or a closed connection), and
 * answer a one-rank job with exactly the record it was sent; its replies must authenticate.
 * LOOM_TIMEOUT is short, so roots left waiting for absent ranks end.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm.h"
#include "sock.h"

typedef struct {
    int32_t status, nranks;
} fuzz_reply_t; /* boot_reply_t */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("LOOM_SOCKET_IFNAME", "lo", 1);
    setenv("LOOM_TIMEOUT", "0.5", 1);
    setenv("LOOM_DEBUG", "NONE", 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3 || size > 3 + 2 * sizeof(peer_info_t)) return 0;
    loomUniqueId id;
    if (boot_uid_create(&id) != loomSuccess) return 0; /* out of descriptors: skip */
    uid_layout_t uid;
    if (boot_uid_parse(&id, &uid) != loomSuccess) abort();
    sock_addr_t root;
    if (!sock_addr_unpack(uid.root_addr, &root)) abort();
    int fd;
    if (sock_connect_start(&root, &fd) != loomSuccess) return 0;
    int wrong_job = data[0] & 1, close_early = data[0] & 2, bad_tag = data[0] & 4;
    hs_hello_t hello = {.comm_id = uid.job_id ^ (uint64_t)wrong_job,
                        .from_rank = (int8_t)data[1],
                        .to_rank = -1,
                        .chan = 0,
                        .nchan = data[2] % 5u};
    hs_t hs;
    hs_connect_init(&hs, fd, &root, uid.secret, &hello);
    if (hs_run_blocking(&hs) != loomSuccess) abort(); /* the right secret: never refused here */
    sock_auth_t au;
    if (sock_auth_start(&au, &hs, base_now_ns() + 1000000000ull) != loomSuccess) abort();
    const uint8_t *rec = data + 3;
    size_t nrec = size - 3;
    uint64_t dl = base_now_ns() + 3000000000ull;
    /* The root reads a peer_info_t, the addresses it announces, then the tag. */
    size_t whole = 0;
    peer_info_t head;
    if (nrec >= sizeof(head)) {
        memcpy(&head, rec, sizeof(head));
        if (head.addr_bytes <= nrec - sizeof(head)) whole = sizeof(head) + head.addr_bytes;
    }
    if (!close_early && whole) {
        uint8_t tag[SOCK_AUTH_TAG];
        sock_auth_tag(&au, rec, sizeof(head), rec + sizeof(head), head.addr_bytes, tag);
        if (bad_tag) tag[SOCK_AUTH_TAG - 1] ^= 0x80;
        sock_send_all(fd, rec, whole, dl, "fuzz: address record");
        sock_send_all(fd, tag, sizeof(tag), dl, "fuzz: address record's tag");
        if (nrec > whole) sock_send_all(fd, rec + whole, nrec - whole, dl, "fuzz: more bytes");
    } else if (!close_early && nrec) {
        sock_send_all(fd, rec, nrec, dl, "fuzz: address record");
    }
    shutdown(fd, SHUT_WR); /* a short record ends at once ("left before sending its address") */
    bool bad_hello = wrong_job || hello.nchan == 0 || hello.from_rank < 0 ||
                     (uint32_t)hello.from_rank >= hello.nchan;
    /* Only a one-rank job with a whole record is answered after a wait-free join; every refusal
     * is immediate; otherwise the root waits for ranks that never come: do not wait with it. */
    if (bad_hello || hello.nchan != 1 || !whole || bad_tag) dl = base_now_ns() + 100000000ull;
    fuzz_reply_t rep;
    uint8_t rtag[SOCK_AUTH_TAG];
    if (!close_early && sock_recv_all(fd, &rep, sizeof(rep), dl, "fuzz: reply") == loomSuccess &&
        sock_recv_all(fd, rtag, sizeof(rtag), dl, "fuzz: reply's tag") == loomSuccess) {
        if (!sock_auth_check(&au, &rep, sizeof(rep), NULL, 0, rtag))
            abort(); /* the root's own reply must authenticate */
        if (rep.status != 0) {
            char text[512];
            if (sock_recv_auth(fd, &au, text, sizeof(text), dl, "fuzz: error text") ==
                    loomSuccess &&
                memchr(text, '\0', sizeof(text)) == NULL)
                abort(); /* an unterminated reason */
            if (!bad_hello && whole && bad_tag && strstr(text, "failed authentication") == NULL)
                abort(); /* a damaged record must be refused as such */
        } else {
            /* Accepted: only a good hello, one rank, and a whole authentic record that names its
             * rank. */
            peer_info_t mine, table;
            memset(&mine, 0, sizeof(mine));
            memcpy(&mine, rec, nrec < sizeof(mine) ? nrec : sizeof(mine));
            if (bad_hello || hello.nchan != 1 || rep.nranks != 1 || !whole || bad_tag ||
                mine.rank != hello.from_rank)
                abort();
            if (sock_recv_auth(fd, &au, &table, sizeof(table), dl, "fuzz: table") != loomSuccess ||
                memcmp(&table, &mine, sizeof(mine)) != 0)
                abort(); /* the table must hold exactly what the rank sent */
        }
    }
    close(fd);
    return 0;
}
