/* engine/cuda/kv_fit.h - how many KV blocks a device holds.
 *
 * The arithmetic behind the CUDA backend's kv_capacity hook, kept in plain
 * C with no CUDA in it so every build compiles it and tests/unit/test_kv_fit
 * checks it against fake device sizes (an H200, a 24 GB card, a card that
 * is too small) without a GPU. The backend measures the free device memory
 * once the weights, the activations, cuBLASLt's workspace and the
 * quantized panels are allocated (cudaMemGetInfo), and hands it here with
 * what is still to come. */
#ifndef RL_KV_FIT_H
#define RL_KV_FIT_H

#include <stddef.h>

#include "err.h"

struct kv_fit_in {
    const char *device;   /* for messages ("NVIDIA H200") */
    size_t total_bytes;   /* the device's memory */
    size_t free_bytes;    /* free now, after weights and activations */
    size_t pending_bytes; /* allocations still to come after the pool:
                             graph executables, the constraint masks'
                             buffers, step metadata growth */
    size_t reserve_bytes; /* kv_reserve_mb: left free on purpose (other
                             processes, the driver's own growth) */
    size_t block_bytes;   /* one KV block, K and V, every layer (> 0) */
    int block_size;       /* tokens per block (> 0) */
    int spare_blocks;     /* blocks the backend allocates beyond n_blocks
                             (CUDA: the graphs' padding block) */
    long min_tokens;      /* fewer tokens than this is an error (one
                             step's token budget: a prefill chunk must fit) */
};

struct kv_fit_out {
    int n_blocks;         /* blocks for the engine's pool */
    size_t bytes;         /* n_blocks * block_bytes: kv_capacity's answer */
    long tokens;          /* n_blocks * block_size */
};

/* Fills *out with the blocks that fit in free - pending - reserve, less the
 * spare blocks; n_blocks is capped at 2^30 - 1 (the engine's int). Returns
 * 0, or -RL_ENOMEM with a message naming the device, its free memory, the
 * reserve and the tokens that would fit when fewer than min_tokens fit;
 * -RL_EINVAL for a zero block size or bytes. */
int kv_fit_compute(const struct kv_fit_in *in, struct kv_fit_out *out, struct rl_err *err);

#endif
