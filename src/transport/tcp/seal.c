#include "seal.h"

#include <string.h>

#include "base.h"

_Static_assert(crypto_aead_aes256gcm_ABYTES == SEAL_TAG_BYTES, "AES-GCM tag");
_Static_assert(crypto_aead_chacha20poly1305_ietf_ABYTES == SEAL_TAG_BYTES, "ChaCha20 tag");
_Static_assert(crypto_aead_aes256gcm_NPUBBYTES == 12, "AES-GCM nonce");
_Static_assert(crypto_aead_chacha20poly1305_ietf_NPUBBYTES == 12, "ChaCha20 nonce");
_Static_assert(crypto_kdf_KEYBYTES == BASE_MAC_BYTES, "KDF master key from a MAC");

bool seal_aes_available(void)
{
    return base_crypto_init() == loomSuccess && crypto_aead_aes256gcm_is_available();
}

const char *seal_alg_name(seal_alg_t alg)
{
    return alg == SEAL_AES256GCM ? "AES-256-GCM" : "ChaCha20-Poly1305";
}

loomResult_t seal_init(seal_dir_t *d, seal_alg_t alg, const uint8_t job_key[16],
                       const void *transcript, size_t tlen, int dir)
{
    memset(d, 0, sizeof(*d));
    d->alg = alg;
    d->dir = dir;
    d->epoch = UINT64_MAX;
    return base_mac(job_key, "loom tcp seal v1", transcript, tlen, NULL, 0, d->master);
}

/* The key of the epoch holding record ctr. */
static void seal_key(seal_dir_t *d, uint64_t ctr)
{
    uint64_t e = ctr / SEAL_EPOCH_RECORDS;
    if (e == d->epoch) return;
    crypto_kdf_derive_from_key(d->key, sizeof(d->key), 2 * e + (uint64_t)d->dir, "loomtcp1",
                               d->master);
    if (d->alg == SEAL_AES256GCM) crypto_aead_aes256gcm_beforenm(&d->aes, d->key);
    d->epoch = e;
}

static void seal_nonce(uint64_t ctr, uint8_t n[12])
{
    for (int i = 0; i < 8; i++)
        n[i] = (uint8_t)(ctr >> (8 * i));
    memset(n + 8, 0, 4);
}

void seal_close(seal_dir_t *d, uint8_t kind, const void *in, size_t len, uint8_t *out,
                uint8_t tag[SEAL_TAG_BYTES])
{
    uint64_t ctr = d->ctr++;
    uint8_t n[12];
    seal_key(d, ctr);
    seal_nonce(ctr, n);
    if (d->alg == SEAL_AES256GCM)
        crypto_aead_aes256gcm_encrypt_detached_afternm(out, tag, NULL, in, len, &kind, 1, NULL, n,
                                                       &d->aes);
    else
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(out, tag, NULL, in, len, &kind, 1, NULL,
                                                           n, d->key);
}

bool seal_open(seal_dir_t *d, uint64_t ctr, uint8_t kind, uint8_t *buf, size_t len,
               const uint8_t tag[SEAL_TAG_BYTES])
{
    uint8_t n[12];
    seal_key(d, ctr);
    seal_nonce(ctr, n);
    if (d->alg == SEAL_AES256GCM)
        return crypto_aead_aes256gcm_decrypt_detached_afternm(buf, NULL, buf, len, tag, &kind, 1, n,
                                                              &d->aes) == 0;
    return crypto_aead_chacha20poly1305_ietf_decrypt_detached(buf, NULL, buf, len, tag, &kind, 1, n,
                                                              d->key) == 0;
}

void seal_wipe(seal_dir_t *d)
{
    sodium_memzero(d, sizeof(*d));
}
