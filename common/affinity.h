/* common/affinity.h - the block-hash filter of prefix-affine pulling
 * (issue 27): what a worker's prefix cache holds, in a fixed number of
 * bytes, as the dispatcher reads it.
 *
 * A worker sets, for the chained hash of every block its KV cache has
 * registered (engine/kv_cache.h: parent hash + block_size token ids, from
 * the tenant's salt), AFF_K bits of a Bloom filter of a power-of-two size,
 * and publishes it base64-encoded in its heartbeat. The dispatcher renders
 * and tokenizes a job as the worker will (engine/prompt.h), chains the same
 * hashes over its full blocks and counts how many leading blocks a
 * worker's filter holds: the prompt tokens that worker would serve from
 * its cache (up to false positives, which aff_prefix_len keeps rare by
 * asking for every block of the run).
 *
 * Pure functions over caller-owned memory; no allocation except
 * aff_b64_encode's result. */
#ifndef RL_AFFINITY_H
#define RL_AFFINITY_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define AFF_K 3                  /* bits per block hash */
#define AFF_MIN_BYTES 64
#define AFF_MAX_BYTES 65536

/* n rounded down to a power of two within [AFF_MIN_BYTES, AFF_MAX_BYTES]. */
size_t aff_size(size_t n);
/* Sets h's AFF_K bits in bits (nbytes, a power of two). */
void aff_add(uint8_t *bits, size_t nbytes, uint64_t h);
/* True when all of h's bits are set (h may be in the set). */
int aff_has(const uint8_t *bits, size_t nbytes, uint64_t h);
/* How many of hashes[0..n) lead the run of hashes all in the filter. */
int aff_prefix_len(const uint8_t *bits, size_t nbytes, const uint64_t *hashes, int n);

#endif
