/* common/base64.h - standard base64 (RFC 4648, with padding).
 *
 * Two users: the affinity filter in a worker's heartbeat (common/affinity.h)
 * and embedding vectors, which travel as the little-endian bytes of their
 * float32 values (OpenAI's encoding_format "base64", and the done event's
 * `embedding`: schemas/README.md, "Embeddings"). */
#ifndef RL_BASE64_H
#define RL_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* Characters b64_encode writes for n bytes, without the NUL. */
static inline size_t b64_len(size_t n) { return (n + 2) / 3 * 4; }
/* Writes the base64 of b (n bytes) into out (b64_len(n) + 1 bytes),
 * NUL-ended. Returns out. */
char *b64_encode_to(const uint8_t *b, size_t n, char *out);
/* The same into a malloc'd string (the caller frees it); NULL when out of
 * memory. */
char *b64_encode(const uint8_t *b, size_t n);
/* Decodes s (len chars) into out (cap bytes). Returns the byte count, or
 * -RL_EFORMAT (not base64, or longer than cap). */
long b64_decode(const char *s, size_t len, uint8_t *out, size_t cap);

#endif
