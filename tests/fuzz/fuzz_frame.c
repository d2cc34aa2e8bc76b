/*
 * libFuzzer harness over the TCP transport's frame header validation (tcp_frame_check) and its
 * sealed records (LOOM_SECURE=1: tcp_open_header, seal_open; src/transport/tcp/frame.h). The
 * first input byte picks:
 *   0: a header from the input checked against an expected sequence and length from the input;
 *      the verdict must agree with the header's fields (OK only for a data frame of exactly the
 *      expected sequence and length within the limit).
 *   1: the input as a stranger's sealed stream: 64-byte header records and payload records with
 *      their tags, opened with keys the stranger does not have. Nothing may authenticate.
 *   2: a real sender and receiver (same transcript, one direction): a header and a payload from
 *      the input sealed, then bits flipped and records dropped or swapped as the input says, then
 *      opened in order. Undamaged records must open to exactly what was sealed; a damaged,
 *      missing or reordered one must not open.
 * A violated property is abort(), which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tcp/frame.h"

static const uint8_t fuzz_key[16] = "loom-fuzz-frames";
static const uint8_t fuzz_transcript[] = "fuzz transcript: nonces and hello";

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void check_header(const uint8_t *data, size_t size)
{
    tcp_frame_t h;
    uint8_t raw[sizeof(h) + 12];
    memset(raw, 0, sizeof(raw));
    memcpy(raw, data, size < sizeof(raw) ? size : sizeof(raw));
    memcpy(&h, raw, sizeof(h));
    uint32_t seq = get32(raw + sizeof(h));
    uint64_t len = get32(raw + sizeof(h) + 4);
    uint64_t max = 4096 + get32(raw + sizeof(h) + 8) % (1u << 27);
    tcp_frame_verdict_t v = tcp_frame_check(&h, seq, len, max);
    switch (v) {
    case TCP_FRAME_OK:
        if (h.magic != TCP_MAGIC || h.type != TCP_FRAME_DATA || h.seq != seq || h.len != len ||
            h.len > max)
            abort();
        break;
    case TCP_FRAME_IS_ABORT:
        if (h.magic != TCP_MAGIC || h.type != TCP_FRAME_ABORT || h.len > TCP_ABORT_TEXT_MAX)
            abort();
        break;
    case TCP_FRAME_BAD_MAGIC:
        if (h.magic == TCP_MAGIC) abort();
        break;
    case TCP_FRAME_BAD_TYPE:
        if (h.type == TCP_FRAME_DATA || h.type == TCP_FRAME_ABORT) abort();
        break;
    case TCP_FRAME_BAD_SEQ:
        if (h.seq == seq) abort();
        break;
    case TCP_FRAME_TOO_LONG:
        if (h.type == TCP_FRAME_DATA ? h.len <= max : h.len <= TCP_ABORT_TEXT_MAX) abort();
        break;
    case TCP_FRAME_BAD_LEN:
        if (h.len == len || h.len > max || h.seq != seq) abort();
        break;
    default: abort();
    }
}

static void forged_stream(const uint8_t *data, size_t size, seal_alg_t alg)
{
    seal_dir_t rx;
    if (seal_init(&rx, alg, fuzz_key, fuzz_transcript, sizeof(fuzz_transcript), 1) != loomSuccess)
        abort();
    uint8_t buf[4096 + SEAL_TAG_BYTES];
    size_t off = 0;
    /* Records alternate: a header, then a payload record whose length the next byte gives. */
    while (off + TCP_SEALED_HDR <= size) {
        tcp_frame_t h;
        for (uint64_t ctr = 0; ctr < 3; ctr++)
            if (tcp_open_header(&rx, rx.ctr + ctr, data + off, &h)) abort();
        off += TCP_SEALED_HDR;
        rx.ctr++;
        if (off >= size) break;
        size_t n = data[off++] * 8u;
        if (off + n + SEAL_TAG_BYTES > size) break;
        memcpy(buf, data + off, n);
        if (seal_open(&rx, rx.ctr, SEAL_KIND_DATA, buf, n, data + off + n)) abort();
        off += n + SEAL_TAG_BYTES;
        rx.ctr++;
    }
    seal_wipe(&rx);
}

#define RT_MAX_RECORDS 8

static void round_trip(const uint8_t *data, size_t size, seal_alg_t alg)
{
    if (size < 8) return;
    /* Control bytes: which record to damage and how, then the header's fields, then payload. */
    uint8_t what = data[0] % 4; /* 0 none, 1 flip a bit, 2 drop a record, 3 swap two records */
    uint8_t which = data[1], bit = data[2];
    uint16_t chunk = (uint16_t)(16 + data[3] % 200);
    data += 4, size -= 4;
    seal_dir_t tx, rx;
    if (seal_init(&tx, alg, fuzz_key, fuzz_transcript, sizeof(fuzz_transcript), 0) != loomSuccess ||
        seal_init(&rx, alg, fuzz_key, fuzz_transcript, sizeof(fuzz_transcript), 0) != loomSuccess)
        abort();
    tcp_frame_t h;
    memset(&h, 0, sizeof(h));
    h.magic = TCP_MAGIC;
    h.type = TCP_FRAME_DATA;
    size_t plen =
        size > (RT_MAX_RECORDS - 1) * (size_t)chunk ? (RT_MAX_RECORDS - 1) * (size_t)chunk : size;
    h.len = (uint32_t)plen;
    memcpy(h.meta, data, size < sizeof(h.meta) ? size : sizeof(h.meta));
    /* records[0]: the header; then the payload in chunks */
    static uint8_t rec[RT_MAX_RECORDS][TCP_SEALED_HDR + 256];
    size_t rlen[RT_MAX_RECORDS];
    int nrec = 0;
    tcp_seal_header(&tx, &h, rec[0]);
    rlen[nrec++] = TCP_SEALED_HDR;
    for (size_t off = 0; off < plen; off += chunk) {
        size_t n = plen - off < chunk ? plen - off : chunk;
        seal_close(&tx, SEAL_KIND_DATA, data + off, n, rec[nrec], rec[nrec] + n);
        rlen[nrec++] = n + SEAL_TAG_BYTES;
    }
    int order[RT_MAX_RECORDS], n_order = nrec;
    for (int i = 0; i < nrec; i++)
        order[i] = i;
    int victim = which % nrec;
    bool damaged = false;
    if (what == 1) {
        rec[victim][(bit / 8) % rlen[victim]] ^= (uint8_t)(1u << (bit % 8));
        damaged = true;
    } else if (what == 2 && nrec > 1) {
        for (int i = victim; i + 1 < nrec; i++)
            order[i] = order[i + 1];
        n_order--;
        damaged = true; /* a later record takes its place, or the last one never comes */
    } else if (what == 3 && nrec > 1) {
        int other = (victim + 1 + bit % (nrec - 1)) % nrec;
        if (rlen[victim] == rlen[other]) {
            order[victim] = other;
            order[other] = victim;
            damaged = true;
        }
    }
    /* The receiver opens the stream in order; the first record that fails ends it. */
    bool all_ok = true;
    size_t poff = 0;
    for (int i = 0; i < n_order && all_ok; i++) {
        int k = order[i];
        uint8_t buf[TCP_SEALED_HDR + 256];
        memcpy(buf, rec[k], rlen[k]);
        if (i == 0) {
            tcp_frame_t got;
            if (!tcp_open_header(&rx, rx.ctr, buf, &got)) {
                all_ok = false;
                break;
            }
            if (memcmp(&got, &h, sizeof(h)) != 0) abort(); /* opened, yet not what was sent */
            if (tcp_frame_check(&got, 0, plen, 1u << 20) != TCP_FRAME_OK) abort();
        } else {
            size_t n = rlen[k] - SEAL_TAG_BYTES;
            size_t want = plen - poff < chunk ? plen - poff : chunk;
            if (n != want) { /* the receiver reads the length it expects */
                all_ok = false;
                break;
            }
            if (!seal_open(&rx, rx.ctr, SEAL_KIND_DATA, buf, n, buf + n)) {
                all_ok = false;
                break;
            }
            if (memcmp(buf, data + poff, n) != 0) abort();
            poff += n;
        }
        rx.ctr++;
    }
    if (all_ok && n_order < nrec) all_ok = false; /* a record never came */
    if (damaged == all_ok) abort();
    seal_wipe(&tx);
    seal_wipe(&rx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 4096) return 0;
    int mode = data[0] % 3;
    seal_alg_t alg =
        (data[0] / 3) % 2 && seal_aes_available() ? SEAL_AES256GCM : SEAL_CHACHA20POLY1305;
    data++, size--;
    if (mode == 0)
        check_header(data, size);
    else if (mode == 1)
        forged_stream(data, size, alg);
    else
        round_trip(data, size, alg);
    return 0;
}
