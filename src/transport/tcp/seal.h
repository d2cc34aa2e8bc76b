/*
 * Sealed records for LOOM_SECURE=1 (the TCP transport): libsodium's AEAD over each record of a
 * socket's stream, one key per socket and direction, a counter nonce per record.
 *
 * Keys: master = BLAKE2b-256 keyed with the job key over "loom tcp seal v1" and the socket's
 * transcript (the handshake's challenge nonce and hello, and both sides' mode-frame nonces);
 * the key of direction d for records [e * SEAL_EPOCH_RECORDS, (e+1) * SEAL_EPOCH_RECORDS) is
 * crypto_kdf_derive_from_key(master, subkey id 2e + d, context "loomtcp1"). The nonce of
 * record n is n (little endian, 8 bytes) then 4 zero bytes; a key never sees a nonce twice
 * because n only grows, and a key changes every SEAL_EPOCH_RECORDS records (AES-GCM's advice is
 * a new key well before 2^36 bytes). The additional data is one byte naming the record's kind,
 * so that no record can be taken for one of another kind.
 *
 * Cipher: AES-256-GCM where both ends have it in hardware (crypto_aead_aes256gcm_is_available),
 * else ChaCha20-Poly1305 (IETF). Detached tags of SEAL_TAG_BYTES; decryption is in place.
 */
#ifndef LOOM_TCP_SEAL_H
#define LOOM_TCP_SEAL_H

#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#define SEAL_TAG_BYTES 16
#define SEAL_EPOCH_RECORDS (1ull << 20)
#define SEAL_KIND_HEADER 'H'
#define SEAL_KIND_DATA 'D'
#define SEAL_KIND_ABORT 'A'

typedef enum { SEAL_CHACHA20POLY1305 = 1, SEAL_AES256GCM = 2 } seal_alg_t;

typedef struct {
    crypto_aead_aes256gcm_state aes; /* first: libsodium wants it 16-byte aligned */
    seal_alg_t alg;
    int dir;
    uint64_t ctr;   /* the next record's number (sending side: never reused) */
    uint64_t epoch; /* of `key`; UINT64_MAX: none derived yet */
    uint8_t master[32];
    uint8_t key[32];
} seal_dir_t;

/* Whether this machine has AES-256-GCM in hardware (after sodium_init). */
bool seal_aes_available(void);
const char *seal_alg_name(seal_alg_t alg);
/* Derives direction dir (0 or 1) from the job key and the transcript; ctr starts at 0. */
loomResult_t seal_init(seal_dir_t *d, seal_alg_t alg, const uint8_t job_key[16],
                       const void *transcript, size_t tlen, int dir);
/* Seals in[0..len) as record d->ctr into out (may equal in) and tag; advances d->ctr. */
void seal_close(seal_dir_t *d, uint8_t kind, const void *in, size_t len, uint8_t *out,
                uint8_t tag[SEAL_TAG_BYTES]);
/* Opens record `ctr` in place; false (buf then unspecified) when it is not authentic. Does not
 * advance d->ctr: the caller does, once it consumed the record. */
bool seal_open(seal_dir_t *d, uint64_t ctr, uint8_t kind, uint8_t *buf, size_t len,
               const uint8_t tag[SEAL_TAG_BYTES]);
/* Wipes the keys. */
void seal_wipe(seal_dir_t *d);

#endif
