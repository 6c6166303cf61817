/* engine/cuda/kv_fit.c - the KV pool that fits on a device (kv_fit.h).
 *
 * usable = free - pending - reserve (each subtraction saturating at 0),
 * n_blocks = usable / block_bytes - spare_blocks. Everything is size_t
 * arithmetic on byte counts that are all below 2^50, so nothing wraps.
 * Pure: no allocation, no global state, any thread. */
#include "kv_fit.h"

#define MIB (1024.0 * 1024.0)

static size_t sub_sat(size_t a, size_t b) { return a > b ? a - b : 0; }

int kv_fit_compute(const struct kv_fit_in *in, struct kv_fit_out *out, struct rl_err *err)
{
    out->n_blocks = 0;
    out->bytes = 0;
    out->tokens = 0;
    const char *dev = in->device ? in->device : "the device";
    if (in->block_bytes == 0 || in->block_size < 1 || in->spare_blocks < 0)
        return rl_errf(err, RL_EINVAL, "kv_fit: block of %zu bytes / %d tokens, %d spare", in->block_bytes,
                       in->block_size, in->spare_blocks);
    size_t usable = sub_sat(sub_sat(in->free_bytes, in->pending_bytes), in->reserve_bytes);
    size_t nb = usable / in->block_bytes;
    nb = sub_sat(nb, (size_t)in->spare_blocks);
    if (nb > (1u << 30) - 1)
        nb = (1u << 30) - 1;
    long tokens = (long)nb * in->block_size;
    if (nb < 1 || tokens < in->min_tokens)
        return rl_errf(err, RL_ENOMEM,
                       "%s has %.0f MiB free of %.0f MiB after the weights and activations; less %.0f MiB "
                       "still to allocate and kv_reserve_mb %.0f, that holds %ld KV tokens "
                       "(%.2f MiB per %d-token block), fewer than the %ld one step needs: use a "
                       "smaller model, a smaller max_batch_tokens or a smaller kv_reserve_mb",
                       dev, (double)in->free_bytes / MIB, (double)in->total_bytes / MIB,
                       (double)in->pending_bytes / MIB, (double)in->reserve_bytes / MIB, tokens,
                       (double)in->block_bytes / MIB, in->block_size, in->min_tokens > 1 ? in->min_tokens : 1);
    out->n_blocks = (int)nb;
    out->bytes = nb * in->block_bytes;
    out->tokens = tokens;
    return 0;
}
