/* common/affinity.c - the block-hash Bloom filter (affinity.h). */
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
