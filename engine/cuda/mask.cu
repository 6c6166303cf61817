/* engine/cuda/mask.cu - a constraint's token mask applied to logits rows on
 * the device: the disallowed entries become -inf before the rows leave
 * the device (or reach cu_argmax), the same rule as the host sampler's
 * (engine/sample.h sample_next_masked), so a device-side sampler sees the
 * constraint and the host's second pass changes nothing. */
#include "ops.cuh"

#include <math.h>

/* One block row per masked row; threads stride over the vocabulary. */
__global__ void mask_logits_kernel(float *__restrict__ logits, int vocab, int row0, int n_rows,
                                   const int32_t *__restrict__ rows, const uint32_t *__restrict__ masks,
                                   int words)
{
    int r = rows[blockIdx.y] - row0;
    if (r < 0 || r >= n_rows)
        return; /* a row of another lm_head pass */
    const uint32_t *m = masks + (size_t)blockIdx.y * (size_t)words;
    float *l = logits + (size_t)r * (size_t)vocab;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < vocab; i += gridDim.x * blockDim.x)
        if (!((m[i >> 5] >> (i & 31)) & 1u))
            l[i] = -INFINITY;
}

int cu_mask_logits(float *logits, int vocab, int row0, int n_rows, const int32_t *rows,
                   const uint32_t *masks, int n_masked, cudaStream_t st, struct rl_err *err)
{
    if (n_masked <= 0 || n_rows <= 0)
        return 0;
    int words = (vocab + 31) / 32;
    unsigned gx = (unsigned)((vocab + 255) / 256 < 64 ? (vocab + 255) / 256 : 64);
    mask_logits_kernel<<<dim3(gx, (unsigned)n_masked), 256, 0, st>>>(logits, vocab, row0, n_rows, rows, masks,
                                                                    words);
    LAUNCH_CHECK(err, "mask_logits_kernel");
    return 0;
}
