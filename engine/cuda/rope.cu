/* engine/cuda/rope.cu - per-head q/k RMSNorm, NEOX rotary and the write of
 * k and v into the paged KV pool, one fused pass per token; plus the block
 * copy behind kv_copy (copy-on-write of a shared, partly filled block).
 *
 * A warp per head (q, k, or v's plain copy), ROPE_WARPS heads a block,
 * grid (tokens, head groups): at decode a single token's 56 heads (Qwen3-
 * 14B) spread over 14 blocks instead of queueing on one SM's four warps
 * (17 us a layer, measured on an H200). The head is normed into shared
 * memory first, so the rotate-half pairs (i, i + head_dim/2) can be read by
 * any lane whatever head_dim is. cos/sin are computed per block from
 * the host's inv_freq table (YaRN already folded in, as rope_init() in the
 * CPU backend builds it) with the accurate cosf/sinf, times the YaRN
 * attention factor - the CPU's exact recipe. q leaves in the KV element
 * type: the CPU rounds q to BF16 before the score products when the cache
 * is BF16, and so do we. */
#include "ops.cuh"

#define ROPE_WARPS 4
#define ROPE_MAX_HD 512

template <typename KT>
__global__ void __launch_bounds__(ROPE_WARPS * 32)
qk_rope_kernel(const float *__restrict__ qkv, int NH, int NKV, int HD, const float *__restrict__ qn,
               const float *__restrict__ kn, float eps, const float *__restrict__ inv_freq, float mscale,
               const int32_t *__restrict__ pos, const int32_t *__restrict__ slot, KT *__restrict__ q_out,
               KT *__restrict__ kc, KT *__restrict__ vc, int bs)
{
    __shared__ float cs[ROPE_MAX_HD / 2], sn[ROPE_MAX_HD / 2];
    __shared__ float buf[ROPE_WARPS][ROPE_MAX_HD];
    int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = HD / 2;
    int h0 = blockIdx.y * ROPE_WARPS, h = h0 + warp; /* q heads, then k heads, then v heads */
    if (h0 < NH + NKV) { /* a block of v copies only needs no table */
        float p = (float)pos[t];
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float a = p * inv_freq[i];
            cs[i] = cosf(a) * mscale;
            sn[i] = sinf(a) * mscale;
        }
        __syncthreads();
    }
    if (h >= NH + 2 * NKV)
        return;
    const float *row = qkv + (size_t)t * (size_t)(NH + 2 * NKV) * (size_t)HD;
    int s = slot[t], blk = s / bs, off = s % bs;
    const float *src = row + (size_t)h * (size_t)HD;
    if (h >= NH + NKV) {
        int hv = h - NH - NKV;
        KT *dst = vc + (((size_t)blk * (size_t)NKV + (size_t)hv) * (size_t)bs + (size_t)off) * (size_t)HD;
        for (int d = lane; d < HD; d += 32)
            dst[d] = cu_from<KT>(src[d]);
        return;
    }
    const float *w = h < NH ? qn : kn;
    float ss = 0.0f;
    for (int d = lane; d < HD; d += 32)
        ss += src[d] * src[d];
    ss = cu_warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)HD + eps);
    for (int d = lane; d < HD; d += 32)
        buf[warp][d] = w[d] * (src[d] * inv);
    __syncwarp();
    KT *dst;
    if (h < NH)
        dst = q_out + ((size_t)t * (size_t)NH + (size_t)h) * (size_t)HD;
    else
        dst = kc + (((size_t)blk * (size_t)NKV + (size_t)(h - NH)) * (size_t)bs + (size_t)off) * (size_t)HD;
    for (int i = lane; i < half; i += 32) {
        float x0 = buf[warp][i], x1 = buf[warp][i + half];
        dst[i] = cu_from<KT>(x0 * cs[i] - x1 * sn[i]);
        dst[i + half] = cu_from<KT>(x1 * cs[i] + x0 * sn[i]);
    }
}

int cu_qk_rope_write(const float *qkv, int T, int n_heads, const float *q_norm, const float *k_norm, float eps,
                     const float *inv_freq, float mscale, const int32_t *pos, const int32_t *slot, void *q_out,
                     const struct cu_kv_layer *kv, cudaStream_t st, struct rl_err *err)
{
    if (T <= 0)
        return 0;
    if (kv->head_dim > ROPE_MAX_HD || kv->head_dim % 2)
        return rl_errf(err, RL_EUNSUPPORTED, "rotary: head_dim %d (even, at most %d)", kv->head_dim, ROPE_MAX_HD);
    dim3 grid((unsigned)T, (unsigned)((n_heads + 2 * kv->n_kv + ROPE_WARPS - 1) / ROPE_WARPS));
    if (kv->bf16)
        qk_rope_kernel<__nv_bfloat16><<<grid, ROPE_WARPS * 32, 0, st>>>(
            qkv, n_heads, kv->n_kv, kv->head_dim, q_norm, k_norm, eps, inv_freq, mscale, pos, slot,
            (__nv_bfloat16 *)q_out, (__nv_bfloat16 *)kv->k, (__nv_bfloat16 *)kv->v, kv->block_size);
    else
        qk_rope_kernel<float><<<grid, ROPE_WARPS * 32, 0, st>>>(qkv, n_heads, kv->n_kv, kv->head_dim, q_norm, k_norm,
                                                             eps, inv_freq, mscale, pos, slot, (float *)q_out,
                                                             (float *)kv->k, (float *)kv->v, kv->block_size);
    LAUNCH_CHECK(err, "qk_rope_kernel");
    return 0;
}

/* grid (n_layers * n_kv, 2): one (layer, head, k|v) run of n*hd elements. */
template <typename KT>
__global__ void kv_copy_kernel(KT *k, KT *v, size_t layer_elems, int n_kv, int bs, int hd, int dst, int src, int n)
{
    int l = blockIdx.x / n_kv, h = blockIdx.x % n_kv;
    KT *base = (blockIdx.y ? v : k) + (size_t)l * layer_elems;
    size_t run = (size_t)n * (size_t)hd;
    KT *d = base + ((size_t)dst * (size_t)n_kv + (size_t)h) * (size_t)bs * (size_t)hd;
    const KT *s = base + ((size_t)src * (size_t)n_kv + (size_t)h) * (size_t)bs * (size_t)hd;
    for (size_t e = threadIdx.x; e < run; e += blockDim.x)
        d[e] = s[e];
}

int cu_kv_copy(void *k, void *v, int bf16, int n_layers, size_t layer_elems, int n_kv, int bs, int hd, int dst,
               int src, int n_tokens, cudaStream_t st, struct rl_err *err)
{
    if (n_tokens <= 0 || dst == src)
        return 0;
    dim3 grid((unsigned)(n_layers * n_kv), 2);
    if (bf16)
        kv_copy_kernel<__nv_bfloat16><<<grid, 256, 0, st>>>((__nv_bfloat16 *)k, (__nv_bfloat16 *)v, layer_elems,
                                                            n_kv, bs, hd, dst, src, n_tokens);
    else
        kv_copy_kernel<float><<<grid, 256, 0, st>>>((float *)k, (float *)v, layer_elems, n_kv, bs, hd, dst, src,
                                                    n_tokens);
    LAUNCH_CHECK(err, "kv_copy_kernel");
    return 0;
}

/* ---- test entry point ---- */

extern "C" {
#include "cuda_backend.h"
}

extern "C" int cuda_test_rope(int T, int n_heads, int n_kv, int hd, const float *qkv, const float *q_norm,
                              const float *k_norm, float eps, const float *inv_freq, float mscale, const int32_t *pos,
                              const int32_t *slot, int kv_bf16, int n_blocks, int bs, float *q_out, float *k_pool,
                              float *v_pool, struct rl_err *err)
{
    size_t pool = (size_t)n_blocks * (size_t)n_kv * (size_t)bs * (size_t)hd, nq = (size_t)T * n_heads * hd;
    size_t es = kv_bf16 ? 2 : 4;
    void *dqkv = NULL, *dqn = NULL, *dkn = NULL, *dfr = NULL, *dpos = NULL, *dslot = NULL, *dq = NULL;
    void *dk = NULL, *dv = NULL, *dkf = NULL, *dvf = NULL, *dqf = NULL;
    int rc;
    struct cu_kv_layer kv;
    if ((rc = cu_test_up(&dqkv, qkv, (size_t)T * (size_t)(n_heads + 2 * n_kv) * hd * 4, err)) ||
        (rc = cu_test_up(&dqn, q_norm, (size_t)hd * 4, err)) || (rc = cu_test_up(&dkn, k_norm, (size_t)hd * 4, err)) ||
        (rc = cu_test_up(&dfr, inv_freq, (size_t)hd / 2 * 4, err)) || (rc = cu_test_up(&dpos, pos, (size_t)T * 4, err)) ||
        (rc = cu_test_up(&dslot, slot, (size_t)T * 4, err)) || (rc = cu_test_up(&dq, NULL, nq * es, err)) ||
        (rc = cu_test_up(&dkf, k_pool, pool * 4, err)) || (rc = cu_test_up(&dvf, v_pool, pool * 4, err)) ||
        (rc = cu_test_up(&dqf, NULL, nq * 4, err)))
        goto out;
    if (kv_bf16) {
        if ((rc = cu_test_up(&dk, NULL, pool * 2, err)) || (rc = cu_test_up(&dv, NULL, pool * 2, err)) ||
            (rc = cu_cast((const float *)dkf, pool, dk, CU_ACT_BF16, 0, err)) ||
            (rc = cu_cast((const float *)dvf, pool, dv, CU_ACT_BF16, 0, err)))
            goto out;
    } else {
        dk = dkf, dv = dvf;
    }
    kv.k = dk, kv.v = dv, kv.bf16 = kv_bf16, kv.n_kv = n_kv, kv.head_dim = hd, kv.block_size = bs;
    if ((rc = cu_qk_rope_write((const float *)dqkv, T, n_heads, (const float *)dqn, (const float *)dkn, eps,
                               (const float *)dfr, mscale, (const int32_t *)dpos, (const int32_t *)dslot, dq, &kv, 0,
                               err)))
        goto out;
    if (kv_bf16 && ((rc = cu_widen_bf16(dk, pool, (float *)dkf, 0, err)) ||
                    (rc = cu_widen_bf16(dv, pool, (float *)dvf, 0, err)) ||
                    (rc = cu_widen_bf16(dq, nq, (float *)dqf, 0, err))))
        goto out;
    CU_CHECK_GOTO(err, rc, out, cudaMemcpy(q_out, kv_bf16 ? dqf : dq, nq * 4, cudaMemcpyDeviceToHost));
    CU_CHECK_GOTO(err, rc, out, cudaMemcpy(k_pool, dkf, pool * 4, cudaMemcpyDeviceToHost));
    CU_CHECK_GOTO(err, rc, out, cudaMemcpy(v_pool, dvf, pool * 4, cudaMemcpyDeviceToHost));
out:
    if (kv_bf16)
        cudaFree(dk), cudaFree(dv);
    cudaFree(dqkv), cudaFree(dqn), cudaFree(dkn), cudaFree(dfr), cudaFree(dpos), cudaFree(dslot), cudaFree(dq);
    cudaFree(dkf), cudaFree(dvf), cudaFree(dqf);
    return rc;
}
