/* common/sha256.h - a small SHA-256 (FIPS 180-4), for result-cache keys.
 *
 * Streaming: init, update any number of times, final. The context is a plain
 * record on the caller's stack; nothing is allocated. */
#ifndef RL_SHA256_H
#define RL_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_LEN 32
#define SHA256_HEX_LEN 64 /* characters, without the NUL */

struct sha256_ctx {
    uint32_t h[8];     /* chaining state */
    uint64_t n_bytes;  /* total bytes fed so far */
    uint8_t buf[64];   /* the partial block */
    size_t n_buf;      /* bytes used in buf, < 64 */
};

void sha256_init(struct sha256_ctx *c);
void sha256_update(struct sha256_ctx *c, const void *data, size_t len);
/* Writes the digest and leaves *c unusable until the next sha256_init. */
void sha256_final(struct sha256_ctx *c, uint8_t out[SHA256_DIGEST_LEN]);

/* One-shot digest of data as 64 lower-case hex characters plus a NUL. */
void sha256_hex(const void *data, size_t len, char out[SHA256_HEX_LEN + 1]);

/* Lower-case hex of an already computed digest. */
void sha256_to_hex(const uint8_t d[SHA256_DIGEST_LEN], char out[SHA256_HEX_LEN + 1]);

#endif
