/*
 * The TCP transport's frame header and its validation, shared by tcp.c and the frame fuzzer
 * (tests/fuzz/fuzz_frame.c). Internal: nothing here is part of loom's API.
 */
#ifndef LOOM_TCP_FRAME_H
#define LOOM_TCP_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "seal.h"
#include "transport.h"

#define TCP_MAGIC 0x4c4f4f4du /* "LOOM" */
#define TCP_FRAME_DATA 1
#define TCP_FRAME_ABORT 2
#define TCP_FRAME_PING 3 /* a header alone: "I am alive"; flags: its TRANSPORT_CALL_* state */
#define TCP_FRAME_MODE 4 /* each side's first frame on a socket: flags TCP_MODE_*, meta: nonce */
#define TCP_MODE_SECURE 1u
#define TCP_MODE_AES 2u
#define TCP_ABORT_TEXT_MAX 1024
/* Secure mode: payloads travel as records of at most this many bytes, each sealed on its own,
 * so that sealing, sending, receiving and opening of one message overlap. */
#define TCP_SEAL_CHUNK (64u * 1024u)

typedef struct {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint32_t seq;
    uint32_t len;
    uint8_t meta[TRANSPORT_META_BYTES];
} tcp_frame_t;
_Static_assert(sizeof(tcp_frame_t) == 48, "frame header layout");
#define TCP_SEALED_HDR (sizeof(tcp_frame_t) + SEAL_TAG_BYTES)

typedef enum {
    TCP_FRAME_OK = 0,   /* a data frame of the expected sequence and length */
    TCP_FRAME_IS_ABORT, /* the peer's abort: its text follows */
    TCP_FRAME_BAD_MAGIC,
    TCP_FRAME_BAD_TYPE,
    TCP_FRAME_BAD_SEQ,
    TCP_FRAME_TOO_LONG, /* more than LOOM_MAX_MESSAGE (or an abort text longer than allowed) */
    TCP_FRAME_BAD_LEN,  /* a valid frame of another length than the posted receive's */
} tcp_frame_verdict_t;

/* Validates a received data or abort header against the socket's expected sequence number and
 * the posted receive's length. Pure: the fuzzer drives it with arbitrary headers. */
tcp_frame_verdict_t tcp_frame_check(const tcp_frame_t *h, uint32_t expect_seq, uint64_t expect_len,
                                    uint64_t max_len);

/* Opens a sealed header (TCP_SEALED_HDR bytes) as record `ctr` of rx into *out; false when it is
 * not authentic. */
bool tcp_open_header(seal_dir_t *rx, uint64_t ctr, const uint8_t wire[TCP_SEALED_HDR],
                     tcp_frame_t *out);
/* Seals a header as the next record of tx. */
void tcp_seal_header(seal_dir_t *tx, const tcp_frame_t *h, uint8_t wire[TCP_SEALED_HDR]);

/* Test-only fault injection (tests/test_secure.c): when `what` is set, the `nth` sealed record
 * of a data frame this process sends (counted from 1 over all sockets; headers and payload
 * records alike) is damaged on the wire. Never set outside tests. */
typedef enum {
    TCP_TAMPER_NONE = 0,
    TCP_TAMPER_FLIP,   /* one bit of the record's ciphertext flipped */
    TCP_TAMPER_REPLAY, /* a header record: the socket's previous header record sent again */
} tcp_tamper_what_t;
typedef struct {
    tcp_tamper_what_t what;
    uint64_t nth;
    uint64_t seen; /* records counted so far */
} tcp_tamper_t;
extern tcp_tamper_t tcp_tamper;

#endif
