/* common/affinity.c - the block-hash Bloom filter and its base64 form
 * (affinity.h). */
#include <stdlib.h>
#include <string.h>

#include "affinity.h"

size_t aff_size(size_t n)
{
    if (n < AFF_MIN_BYTES)
        return AFF_MIN_BYTES;
    if (n > AFF_MAX_BYTES)
        return AFF_MAX_BYTES;
    size_t p = AFF_MIN_BYTES;
    while (p * 2 <= n)
        p *= 2;
    return p;
}

/* splitmix64's finaliser: the block hashes are already mixed, but a
 * worker-chosen hash function (kv_set_hash_fn in tests) may not be */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* double hashing: bit i = a + i*b (Kirsch-Mitzenmacher) */
static void positions(size_t nbits, uint64_t h, uint64_t pos[AFF_K])
{
    uint64_t x = mix(h), a = x, b = mix(x ^ 0x9e3779b97f4a7c15ull) | 1;
    for (int i = 0; i < AFF_K; i++)
        pos[i] = (a + (uint64_t)i * b) & (nbits - 1);
}

void aff_add(uint8_t *bits, size_t nbytes, uint64_t h)
{
    uint64_t pos[AFF_K];
    positions(nbytes * 8, h, pos);
    for (int i = 0; i < AFF_K; i++)
        bits[pos[i] >> 3] |= (uint8_t)(1u << (pos[i] & 7));
}

int aff_has(const uint8_t *bits, size_t nbytes, uint64_t h)
{
    uint64_t pos[AFF_K];
    positions(nbytes * 8, h, pos);
    for (int i = 0; i < AFF_K; i++)
        if (!(bits[pos[i] >> 3] & (1u << (pos[i] & 7))))
            return 0;
    return 1;
}

int aff_prefix_len(const uint8_t *bits, size_t nbytes, const uint64_t *hashes, int n)
{
    int k = 0;
    while (k < n && aff_has(bits, nbytes, hashes[k]))
        k++;
    return k;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *aff_b64_encode(const uint8_t *b, size_t n)
{
    char *s = malloc((n + 2) / 3 * 4 + 1), *o = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < n ? b[i + 2] : 0);
        *o++ = b64[v >> 18 & 63];
        *o++ = b64[v >> 12 & 63];
        *o++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *o = 0;
    return s;
}

static int val(char c)
{
    const char *p = c ? strchr(b64, c) : NULL;
    return p ? (int)(p - b64) : -1;
}

long aff_b64_decode(const char *s, size_t len, uint8_t *out, size_t cap)
{
    if (len % 4)
        return -RL_EFORMAT;
    size_t n = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == len && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad || (v[k] = val(s[i + k])) < 0) {
                return -RL_EFORMAT;
            }
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        uint8_t t[3] = {(uint8_t)(x >> 16), (uint8_t)(x >> 8), (uint8_t)x};
        if (n + 3 - (size_t)pad > cap)
            return -RL_EFORMAT;
        memcpy(out + n, t, 3 - (size_t)pad);
        n += 3 - (size_t)pad;
    }
    return (long)n;
}
