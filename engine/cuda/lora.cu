/* engine/cuda/lora.cu - LoRA deltas on the device (engine/lora.h): after a
 * base product over the whole step, each row whose sequence runs with an
 * adapter gets y += B (A x). Every row finds its adapter through the step's
 * per-token slot (0 = none) and a device table of the slots' matrices, so
 * a batch mixes adapters freely and a captured decode graph stays valid as
 * adapters and rows change: only device memory changes between steps.
 *
 * Two kernels per group of products that read the same input (q/k/v,
 * gate/up, o, down): shrink, t = A x, a warp per rank entry walking the
 * input; expand, y += t . B^T, a thread per output column walking the
 * rank (B^T's rows are contiguous in the column, so a warp's loads
 * coalesce). Rows without an adapter leave at once. Both in f32 from the
 * activation type the base product read. */
#include "ops.cuh"

template <typename AT>
__global__ void lora_shrink_kernel(const AT *__restrict__ x, int ldx, const int32_t *__restrict__ slot,
                                   const struct cu_lora_ent *__restrict__ tab, int n_layers, int layer, int p0,
                                   float *__restrict__ tmp)
{
    int t = blockIdx.x, j = blockIdx.y;
    int s = slot[t];
    if (!s)
        return;
    const struct cu_lora_ent e = tab[((size_t)s * (size_t)n_layers + (size_t)layer) * CU_LORA_PROJ + p0 + j];
    if (!e.rank)
        return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const AT *xr = x + (size_t)t * (size_t)ldx;
    float *out = tmp + ((size_t)t * 3 + (size_t)j) * CU_LORA_MAX_RANK;
    for (int k = warp; k < e.rank; k += nw) {
        const float *a = e.a + (size_t)k * (size_t)e.in;
        float acc = 0.0f;
        for (int i = lane; i < e.in; i += 32)
            acc += a[i] * cu_f(xr[i]);
        for (int o = 16; o > 0; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0)
            out[k] = acc;
    }
}

__global__ void lora_expand_kernel(const float *__restrict__ tmp, const int32_t *__restrict__ slot,
                                   const struct cu_lora_ent *__restrict__ tab, int n_layers, int layer, int p0,
                                   float *__restrict__ y, int ldy, int c0, int c1, int c2)
{
    int t = blockIdx.x, j = blockIdx.z, o = blockIdx.y * blockDim.x + threadIdx.x;
    int s = slot[t];
    if (!s)
        return;
    const struct cu_lora_ent e = tab[((size_t)s * (size_t)n_layers + (size_t)layer) * CU_LORA_PROJ + p0 + j];
    if (!e.rank || o >= e.out)
        return;
    const float *tt = tmp + ((size_t)t * 3 + (size_t)j) * CU_LORA_MAX_RANK;
    float acc = 0.0f;
    for (int k = 0; k < e.rank; k++)
        acc += tt[k] * e.bt[(size_t)k * (size_t)e.out + (size_t)o];
    int col = j == 0 ? c0 : j == 1 ? c1 : c2;
    y[(size_t)t * (size_t)ldy + (size_t)col + (size_t)o] += acc;
}

int cu_lora_apply(const struct cu_lora_call *a, cudaStream_t st, struct rl_err *err)
{
    if (a->T <= 0)
        return 0;
    dim3 gs((unsigned)a->T, (unsigned)a->n_proj);
    switch (a->xt) {
    case CU_ACT_F32:
        lora_shrink_kernel<float><<<gs, 256, 0, st>>>((const float *)a->x, a->ldx, a->slot, a->tab, a->n_layers,
                                                      a->layer, a->p0, a->tmp);
        break;
    case CU_ACT_BF16:
        lora_shrink_kernel<__nv_bfloat16><<<gs, 256, 0, st>>>((const __nv_bfloat16 *)a->x, a->ldx, a->slot, a->tab,
                                                              a->n_layers, a->layer, a->p0, a->tmp);
        break;
    default:
        lora_shrink_kernel<__half><<<gs, 256, 0, st>>>((const __half *)a->x, a->ldx, a->slot, a->tab, a->n_layers,
                                                       a->layer, a->p0, a->tmp);
        break;
    }
    LAUNCH_CHECK(err, "lora_shrink_kernel");
    dim3 ge((unsigned)a->T, (unsigned)((a->max_out + 255) / 256), (unsigned)a->n_proj);
    lora_expand_kernel<<<ge, 256, 0, st>>>(a->tmp, a->slot, a->tab, a->n_layers, a->layer, a->p0, a->y, a->ldy,
                                           a->col[0], a->col[1], a->col[2]);
    LAUNCH_CHECK(err, "lora_expand_kernel");
    return 0;
}
