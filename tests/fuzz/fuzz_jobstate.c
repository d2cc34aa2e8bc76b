/*
 * libFuzzer harness over the job-state service's frames (src/core/jobstate.c: js_frame_encode
 * and js_rx_next, the reader of both the service and the ranks). The first input byte picks:
 *   0: the rest is a stranger's bytes, fed in pieces the input cuts to a reader keyed with a
 *      secret the stranger does not have: no frame may be accepted, and the reader must stop
 *      (malformed or failed authentication) or wait for more, never read past what it holds.
 *   1: a real sender and reader sharing a key: up to 8 frames whose fields and texts come from
 *      the input are encoded into one stream, one bit of it flipped or not (as the input says),
 *      fed in pieces. Undamaged, every frame must come back exactly as sent; damaged in frame k,
 *      frames before k must come back exactly and none from k on may be accepted.
 * A violated property is abort(), which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jobstate.h"

#define MAX_FRAMES 8

static const uint8_t fuzz_key[BASE_KEY_BYTES] = "loom-fuzz-js-key";
static const uint8_t other_key[BASE_KEY_BYTES] = "stranger-own-key";

typedef struct {
    const uint8_t *p;
    size_t n;
} in_t;

static uint32_t take(in_t *in, int bytes)
{
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v = v << 8 | (in->n ? *in->p : 0);
        if (in->n) in->p++, in->n--;
    }
    return v;
}

/* Feeds stream[0, len) to rx in pieces of 1 + (cut % 4096) bytes, calling js_rx_next after each
 * piece until it has nothing whole; returns the frames accepted (into got/texts, at most
 * MAX_FRAMES; more is a crash) and stops at the first refusal. */
static int feed(const uint8_t *stream, size_t len, uint32_t cut, sock_auth_t *au,
                js_frame_t got[MAX_FRAMES], char texts[MAX_FRAMES][JS_TEXT_MAX])
{
    static js_rx_t rx;
    rx.got = 0;
    int n = 0;
    size_t off = 0;
    while (off < len) {
        size_t piece = 1 + (cut % 4096);
        cut = cut * 1103515245u + 12345u;
        size_t room = sizeof(rx.buf) - rx.got;
        if (piece > room) piece = room;
        if (piece > len - off) piece = len - off;
        if (piece == 0) abort(); /* a full buffer without a whole frame: the reader would stall */
        memcpy(rx.buf + rx.got, stream + off, piece);
        rx.got += piece;
        off += piece;
        for (;;) {
            js_frame_t f;
            char text[JS_TEXT_MAX];
            int r = js_rx_next(&rx, au, &f, text, sizeof(text));
            if (r == 0) break;
            if (r < 0) return n;
            if (n == MAX_FRAMES) abort();
            got[n] = f;
            memcpy(texts[n], text, sizeof(text));
            n++;
        }
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    in_t in = {data + 1, size - 1};
    static js_frame_t got[MAX_FRAMES];
    static char texts[MAX_FRAMES][JS_TEXT_MAX];
    if (data[0] % 2 == 0) {
        sock_auth_t au;
        memset(&au, 0, sizeof(au));
        memcpy(au.rx, other_key, sizeof(au.rx));
        uint32_t cut = take(&in, 4);
        if (feed(in.p, in.n, cut, &au, got, texts) != 0) abort(); /* a stranger's frame passed */
        return 0;
    }
    /* a real sender and reader */
    sock_auth_t snd, rcv;
    memset(&snd, 0, sizeof(snd));
    memset(&rcv, 0, sizeof(rcv));
    memcpy(snd.tx, fuzz_key, sizeof(snd.tx));
    memcpy(rcv.rx, fuzz_key, sizeof(rcv.rx));
    int nf = 1 + (int)(take(&in, 1) % MAX_FRAMES);
    uint32_t cut = take(&in, 4);
    uint32_t flip = take(&in, 4);
    bool damage = take(&in, 1) & 1;
    static js_frame_t sent[MAX_FRAMES];
    static char stexts[MAX_FRAMES][JS_TEXT_MAX];
    static uint8_t stream[MAX_FRAMES * (sizeof(js_frame_t) + JS_TEXT_MAX + SOCK_AUTH_TAG)];
    size_t len = 0, start[MAX_FRAMES + 1];
    for (int k = 0; k < nf; k++) {
        js_frame_t *f = &sent[k];
        memset(f, 0, sizeof(*f));
        f->type = (uint16_t)take(&in, 2);
        f->flags = (uint16_t)take(&in, 2);
        f->rank = (int32_t)take(&in, 4);
        f->pid = (int32_t)take(&in, 4);
        f->arg = (uint64_t)take(&in, 4) << 32 | take(&in, 4);
        size_t hl = take(&in, 1) % JS_HOST_LEN;
        for (size_t i = 0; i < hl; i++)
            f->host[i] = (char)(1 + take(&in, 1) % 255);
        size_t tl = take(&in, 2) % JS_TEXT_MAX;
        if (tl > in.n) tl = in.n;
        for (size_t i = 0; i < tl; i++)
            stexts[k][i] = (char)(1 + take(&in, 1) % 255); /* texts hold no NUL, as the senders' */
        stexts[k][tl] = '\0';
        start[k] = len;
        len += js_frame_encode(&snd, f, stexts[k], tl, stream + len);
        f->magic = JS_MAGIC;
        f->len = (uint32_t)tl;
    }
    start[nf] = len;
    int bad = nf; /* the first frame not to be accepted */
    if (damage) {
        size_t at = flip % len;
        stream[at] ^= (uint8_t)(1u << (flip >> 29));
        for (bad = 0; start[bad + 1] <= at; bad++) {
        }
    }
    int n = feed(stream, len, cut, &rcv, got, texts);
    if (n != bad) abort();
    for (int k = 0; k < n; k++) {
        const js_frame_t *a = &sent[k], *b = &got[k];
        if (a->magic != b->magic || a->type != b->type || a->flags != b->flags ||
            a->rank != b->rank || a->pid != b->pid || a->arg != b->arg || a->len != b->len ||
            memcmp(a->host, b->host, JS_HOST_LEN) != 0 || strcmp(stexts[k], texts[k]) != 0)
            abort();
    }
    return 0;
}
