/* engine/cuda/attn.cu - paged attention over the KV pool.
 *
 * Pool layout (one layer): (n_blocks, n_kv, block_size, head_dim), so the
 * keys of one KV head inside a block are contiguous, as on the CPU. Token
 * position p of a sequence lives at block table[p / bs], slot p % bs.
 *
 * Decode (one query per item, keys 0..pos): grid (items, kv heads, splits).
 * A block serves all G query heads of its KV head (GQA: every key and value
 * is loaded once for the G heads). The key range is cut into nsplit equal
 * parts (split-K over the sequence, so one long sequence still fills the
 * GPU); inside a block the 4 warps take interleaved 32-key tiles: lane j
 * scores key j against the G queries (queries in shared memory, keys read
 * straight from the pool with 16-byte loads), an online softmax keeps
 * (max, sum, acc) per head, and the value rows are read coalesced, each
 * lane owning head_dim/32 output dims. Warps then merge through shared
 * memory; splits merge in attn_combine_kernel. The split count depends on
 * the batch size only (and the longest context outside graphs), and the
 * per-split range is computed on the device from the token's position, so
 * a captured graph stays valid for any lengths.
 *
 * Prefill (many queries per sequence, causal): grid (tiles, kv heads); a
 * tile is 32 consecutive (token, head-of-group) rows of one sequence's new
 * tokens, 8 per warp. K and V tiles of 32 keys go through shared memory
 * (K rows padded by one float so lane-per-key reads are conflict-free);
 * each row masks keys beyond its own position. SIMT arithmetic; a tensor-
 * core (mma) version is the next step for long prompts.
 *
 * Softmax arithmetic follows the CPU: score = dot(q, k) * 1/sqrt(hd), then
 * exp(score - max), weighted sum of values, divided by the sum; the online
 * form only reorders the same terms. */
#include "ops.cuh"

#define DEC_WARPS 4
#define PF_WARPS 4
#define PF_RPW (CU_ATTN_TILE_ROWS / PF_WARPS) /* rows per warp */
#define PF_KEYS 32

__device__ __forceinline__ void load8(const float *p, float *o)
{
    float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float *o)
{
    uint4 u = *(const uint4 *)p;
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}

/* ND consecutive elements (a lane's share of a row) in one or two loads. */
template <int ND> __device__ __forceinline__ void load_nd(const float *p, float *o)
{
    if constexpr (ND % 4 == 0) {
#pragma unroll
        for (int i = 0; i < ND; i += 4) {
            float4 a = *(const float4 *)(p + i);
            o[i] = a.x, o[i + 1] = a.y, o[i + 2] = a.z, o[i + 3] = a.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < ND; i++)
            o[i] = p[i];
    }
}

template <int ND> __device__ __forceinline__ void load_nd(const __nv_bfloat16 *p, float *o)
{
    if constexpr (ND == 4) {
        uint2 u = *(const uint2 *)p;
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
        float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
        o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
    } else if constexpr (ND == 8) {
        load8(p, o);
    } else {
#pragma unroll
        for (int i = 0; i < ND; i++)
            o[i] = __bfloat162float(p[i]);
    }
}

/* Element offset of (position p, kv head g, dim 0) in one layer's pool. */
__device__ __forceinline__ size_t kv_off(const int32_t *table, int p, int g, int NKV, int bs, int HD)
{
    return (((size_t)table[p / bs] * (size_t)NKV + (size_t)g) * (size_t)bs + (size_t)(p % bs)) * (size_t)HD;
}

/* One lane's key row against the G queries in shared memory: sc[h] +=
 * q[h] . k, 8 dims at a time. PRE (BF16, head_dim <= 128): all of the
 * row's 16-byte loads are issued before the first product, so a tile waits
 * for memory once rather than once per four loads; same sums, same order.
 * (An alternative under measurement, issue 25: cu_attn_decode's variant.) */
/* sc[h] += q[h][d .. d + 7] . kf for the G query heads. */
template <int HD>
__device__ __forceinline__ void dec_dot8(const float (*qs)[HD], int d, const float *kf, int G, float *sc)
{
#pragma unroll
    for (int h = 0; h < CU_ATTN_MAXG; h++) {
        if (h < G) {
            float a = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++)
                a += qs[h][d + j] * kf[j];
            sc[h] += a;
        }
    }
}

template <typename KT, int HD, bool PRE>
__device__ __forceinline__ void dec_key_scores(const KT *__restrict__ kp, const float (*qs)[HD], int G, float *sc)
{
    if constexpr (PRE) {
        static_assert(sizeof(KT) == 2 && HD <= 128, "preloaded keys: bf16, head_dim <= 128");
        constexpr int NP = HD / 8;
        uint4 raw[NP];
#pragma unroll
        for (int i = 0; i < NP; i++)
            raw[i] = ((const uint4 *)kp)[i];
#pragma unroll
        for (int i = 0; i < NP; i++) {
            float kf[8];
            const __nv_bfloat162 *h2 = (const __nv_bfloat162 *)&raw[i];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 f = __bfloat1622float2(h2[j]);
                kf[2 * j] = f.x, kf[2 * j + 1] = f.y;
            }
            dec_dot8<HD>(qs, 8 * i, kf, G, sc);
        }
    } else {
#pragma unroll 4
        for (int d = 0; d < HD; d += 8) {
            float kf[8];
            load8(kp + d, kf);
            dec_dot8<HD>(qs, d, kf, G, sc);
        }
    }
}

template <typename KT, int HD, bool PRE>
__global__ void __launch_bounds__(DEC_WARPS * 32)
attn_decode_kernel(const KT *__restrict__ q, const KT *__restrict__ kc, const KT *__restrict__ vc, int NH,
                   int NKV, int bs, float scale, int nsplit, struct cu_attn_meta m, float *__restrict__ out,
                   float *__restrict__ part_ml, float *__restrict__ part_acc)
{
    constexpr int ND = HD / 32;
    constexpr int MG = CU_ATTN_MAXG;
    __shared__ float qs[MG][HD];
    __shared__ float rm[DEC_WARPS][MG], rl[DEC_WARPS][MG];
    __shared__ float racc[DEC_WARPS][MG][HD];
    const int G = NH / NKV;
    int item = blockIdx.x, g = blockIdx.y, split = blockIdx.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = m.dec_tok[item], s = m.tok_seq[t], n = m.tok_pos[t] + 1;
    const int32_t *table = m.bt + m.seq_bt_off[s];
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        int h = e / HD, d = e % HD;
        qs[h][d] = cu_f(q[((size_t)t * (size_t)NH + (size_t)(g * G + h)) * HD + d]);
    }
    __syncthreads();
    int chunk = (n + nsplit - 1) / nsplit;
    int k0 = split * chunk, k1 = min(n, k0 + chunk);
    float mx[MG], l[MG], acc[MG][ND];
#pragma unroll
    for (int h = 0; h < MG; h++) {
        mx[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int c = 0; c < ND; c++)
            acc[h][c] = 0.0f;
    }
    for (int base = k0 + warp * 32; base < k1; base += DEC_WARPS * 32) {
        int p = base + lane;
        bool valid = p < k1;
        float sc[MG];
#pragma unroll
        for (int h = 0; h < MG; h++)
            sc[h] = 0.0f;
        if (valid)
            dec_key_scores<KT, HD, PRE>(kc + kv_off(table, p, g, NKV, bs, HD), qs, G, sc);
#pragma unroll
        for (int h = 0; h < MG; h++) {
            if (h < G) {
                float sv = valid ? sc[h] * scale : -INFINITY;
                float mn = fmaxf(mx[h], cu_warp_max(sv)); /* finite: lane 0 is valid */
                float pr = valid ? expf(sv - mn) : 0.0f;
                float corr = expf(mx[h] - mn);
                l[h] = l[h] * corr + cu_warp_sum(pr);
#pragma unroll
                for (int c = 0; c < ND; c++)
                    acc[h][c] *= corr;
                mx[h] = mn;
                sc[h] = pr;
            }
        }
        /* values: lane owns dims lane*ND .. lane*ND+ND-1 (one vector load a
         * row); 8 rows' loads go out before their products so that the
         * loop waits for memory once per 8 keys, not once per key */
        int nv = min(32, k1 - base), j = 0;
        for (; j + 8 <= nv; j += 8) {
            float vv[8][ND];
#pragma unroll
            for (int u = 0; u < 8; u++)
                load_nd<ND>(vc + kv_off(table, base + j + u, g, NKV, bs, HD) + lane * ND, vv[u]);
#pragma unroll
            for (int u = 0; u < 8; u++)
#pragma unroll
                for (int h = 0; h < MG; h++) {
                    if (h < G) {
                        float ph = __shfl_sync(0xffffffffu, sc[h], j + u);
#pragma unroll
                        for (int c = 0; c < ND; c++)
                            acc[h][c] += ph * vv[u][c];
                    }
                }
        }
        for (; j < nv; j++) {
            float vv[ND];
            load_nd<ND>(vc + kv_off(table, base + j, g, NKV, bs, HD) + lane * ND, vv);
#pragma unroll
            for (int h = 0; h < MG; h++) {
                if (h < G) {
                    float ph = __shfl_sync(0xffffffffu, sc[h], j);
#pragma unroll
                    for (int c = 0; c < ND; c++)
                        acc[h][c] += ph * vv[c];
                }
            }
        }
    }
#pragma unroll
    for (int h = 0; h < MG; h++) {
        if (h < G) {
            if (lane == 0) {
                rm[warp][h] = mx[h];
                rl[warp][h] = l[h];
            }
#pragma unroll
            for (int c = 0; c < ND; c++)
                racc[warp][h][lane * ND + c] = acc[h][c];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < G * HD; e += blockDim.x) {
        int h = e / HD, d = e % HD;
        float M = -INFINITY;
        for (int w = 0; w < DEC_WARPS; w++)
            M = fmaxf(M, rm[w][h]);
        float L = 0.0f, A = 0.0f;
        if (M > -INFINITY)
            for (int w = 0; w < DEC_WARPS; w++)
                if (rm[w][h] > -INFINITY) {
                    float f = expf(rm[w][h] - M);
                    L += rl[w][h] * f;
                    A += racc[w][h][d] * f;
                }
        int qh = g * G + h;
        if (nsplit == 1) {
            out[((size_t)t * (size_t)NH + (size_t)qh) * HD + d] = L > 0.0f ? A / L : 0.0f;
        } else {
            size_t idx = ((size_t)item * (size_t)NH + (size_t)qh) * (size_t)nsplit + (size_t)split;
            part_acc[idx * HD + d] = A;
            if (d == 0) {
                part_ml[2 * idx] = M;
                part_ml[2 * idx + 1] = L;
            }
        }
    }
}

__global__ void attn_combine_kernel(const float *__restrict__ part_ml, const float *__restrict__ part_acc, int NH,
                                    int HD, int nsplit, const int32_t *__restrict__ dec_tok, float *__restrict__ out)
{
    int item = blockIdx.x, h = blockIdx.y;
    size_t base = ((size_t)item * (size_t)NH + (size_t)h) * (size_t)nsplit;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++)
        M = fmaxf(M, part_ml[2 * (base + s)]);
    int t = dec_tok[item];
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        if (M > -INFINITY)
            for (int s = 0; s < nsplit; s++) {
                float ms = part_ml[2 * (base + s)];
                if (ms > -INFINITY) {
                    float f = expf(ms - M);
                    L += part_ml[2 * (base + s) + 1] * f;
                    A += part_acc[(base + s) * (size_t)HD + d] * f;
                }
            }
        out[((size_t)t * (size_t)NH + (size_t)h) * (size_t)HD + d] = L > 0.0f ? A / L : 0.0f;
    }
}

template <int HD> static constexpr size_t pf_smem() { return (size_t)(32 * HD + 32 * (HD + 1) + 32 * HD) * 4; }

template <typename KT, int HD>
__global__ void __launch_bounds__(PF_WARPS * 32)
attn_prefill_kernel(const KT *__restrict__ q, const KT *__restrict__ kc, const KT *__restrict__ vc, int NH, int NKV,
                    int bs, float scale, struct cu_attn_meta m, float *__restrict__ out)
{
    constexpr int ND = HD / 32;
    extern __shared__ float smem[];
    float *Qs = smem;                       /* [32][HD] */
    float *Ks = Qs + 32 * HD;               /* [32][HD + 1] */
    float *Vs = Ks + 32 * (HD + 1);         /* [32][HD] */
    const int G = NH / NKV;
    int tile = blockIdx.x, g = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int s = m.tile_seq[tile], r0 = m.tile_r0[tile];
    int tok0 = m.seq_tok0[s], nnew = m.seq_nnew[s], npast = m.seq_npast[s];
    const int32_t *table = m.bt + m.seq_bt_off[s];
    int rows_total = nnew * G;
    int r_end = min(r0 + CU_ATTN_TILE_ROWS, rows_total);
    int kmax = npast + (r_end - 1) / G + 1; /* keys 0..kmax-1 cover the tile */
    for (int e = threadIdx.x; e < CU_ATTN_TILE_ROWS * HD; e += blockDim.x) {
        int r = e / HD, d = e % HD, R = r0 + r;
        float v = 0.0f;
        if (R < rows_total)
            v = cu_f(q[((size_t)(tok0 + R / G) * (size_t)NH + (size_t)(g * G + R % G)) * HD + d]);
        Qs[r * HD + d] = v;
    }
    int rpos[PF_RPW];
    int wmax = -1;
#pragma unroll
    for (int rr = 0; rr < PF_RPW; rr++) {
        int R = r0 + warp * PF_RPW + rr;
        rpos[rr] = R < rows_total ? npast + R / G : -1;
        wmax = max(wmax, rpos[rr]);
    }
    float mx[PF_RPW], l[PF_RPW], acc[PF_RPW][ND];
#pragma unroll
    for (int rr = 0; rr < PF_RPW; rr++) {
        mx[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int c = 0; c < ND; c++)
            acc[rr][c] = 0.0f;
    }
    for (int kb = 0; kb < kmax; kb += PF_KEYS) {
        __syncthreads(); /* the previous tile has been consumed */
        for (int e = threadIdx.x; e < PF_KEYS * HD; e += blockDim.x) {
            int j = e / HD, d = e % HD, p = kb + j;
            float kv = 0.0f, vv = 0.0f;
            if (p < kmax) {
                size_t a = kv_off(table, p, g, NKV, bs, HD) + (size_t)d;
                kv = cu_f(kc[a]);
                vv = cu_f(vc[a]);
            }
            Ks[j * (HD + 1) + d] = kv;
            Vs[j * HD + d] = vv;
        }
        __syncthreads();
        if (wmax < kb) /* every row of this warp is before the tile (warp-uniform) */
            continue;
        float sc[PF_RPW];
#pragma unroll
        for (int rr = 0; rr < PF_RPW; rr++)
            sc[rr] = 0.0f;
        const float *kr = Ks + lane * (HD + 1);
        const float *qr = Qs + warp * PF_RPW * HD;
#pragma unroll 4
        for (int d = 0; d < HD; d++) {
            float kd = kr[d];
#pragma unroll
            for (int rr = 0; rr < PF_RPW; rr++)
                sc[rr] += qr[rr * HD + d] * kd;
        }
        int p = kb + lane;
#pragma unroll
        for (int rr = 0; rr < PF_RPW; rr++) {
            bool ok = p <= rpos[rr];
            float sv = ok ? sc[rr] * scale : -INFINITY;
            float tmax = cu_warp_max(sv);
            if (tmax == -INFINITY) { /* row sees no key of this tile (uniform) */
                sc[rr] = 0.0f;
                continue;
            }
            float mn = fmaxf(mx[rr], tmax);
            float pr = ok ? expf(sv - mn) : 0.0f;
            float corr = expf(mx[rr] - mn);
            l[rr] = l[rr] * corr + cu_warp_sum(pr);
#pragma unroll
            for (int c = 0; c < ND; c++)
                acc[rr][c] *= corr;
            mx[rr] = mn;
            sc[rr] = pr;
        }
        for (int j = 0; j < PF_KEYS; j++) {
            float vv[ND];
#pragma unroll
            for (int c = 0; c < ND; c++)
                vv[c] = Vs[j * HD + lane + 32 * c];
#pragma unroll
            for (int rr = 0; rr < PF_RPW; rr++) {
                float ph = __shfl_sync(0xffffffffu, sc[rr], j);
#pragma unroll
                for (int c = 0; c < ND; c++)
                    acc[rr][c] += ph * vv[c];
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < PF_RPW; rr++) {
        if (rpos[rr] < 0)
            continue;
        int R = r0 + warp * PF_RPW + rr;
        float *o = out + ((size_t)(tok0 + R / G) * (size_t)NH + (size_t)(g * G + R % G)) * HD;
        float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
#pragma unroll
        for (int c = 0; c < ND; c++)
            o[lane + 32 * c] = acc[rr][c] * inv;
    }
}


/* ---- prefill on the tensor cores (bf16 KV) ----
 *
 * The same tiles as attn_prefill_kernel (32 (token, head-of-group) rows of
 * one sequence and KV head per block), with two warps of 16 rows each, so
 * the products map onto mma.sync m16n8k16: S = Q K^T with Q and K in bf16
 * as they are stored (products exact, f32 sums), then O += P V with P and V
 * in f16: V's bf16 values convert to f16 exactly in any range a model's
 * values live in, and P in [0, 1] keeps 11 bits there against bf16's 8 -
 * the rounding FlashAttention-style kernels accept, a tenth of it. Keys
 * arrive 32 at a time through shared memory (rows padded by 8 halves so the
 * fragment loads are free of bank conflicts); the online softmax is the
 * SIMT kernel's, row statistics reduced over the 4 lanes sharing a row. */
#define TC_KEYS 32
#define TC_PAD 8

__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

template <int HD>
__global__ void __launch_bounds__(64)
attn_prefill_tc_kernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ kc,
                       const __nv_bfloat16 *__restrict__ vc, int NH, int NKV, int bs, float scale,
                       struct cu_attn_meta m, float *__restrict__ out)
{
    constexpr int KS = HD / 16;  /* k-steps over the head dim */
    constexpr int NT = HD / 8;   /* 8-wide output column tiles */
    constexpr int LD = HD + TC_PAD;
    __shared__ __align__(16) __nv_bfloat16 Ks[TC_KEYS][LD];
    __shared__ __align__(16) __half Vs[TC_KEYS][LD];
    const int G = NH / NKV;
    int tile = blockIdx.x, g = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int quad = lane >> 2, qi = lane & 3;
    int s = m.tile_seq[tile], r0 = m.tile_r0[tile];
    int tok0 = m.seq_tok0[s], nnew = m.seq_nnew[s], npast = m.seq_npast[s];
    const int32_t *table = m.bt + m.seq_bt_off[s];
    int rows_total = nnew * G;
    int r_end = min(r0 + CU_ATTN_TILE_ROWS, rows_total);
    int kmax = npast + (r_end - 1) / G + 1;

    /* this thread's two rows: quad and quad + 8 of the warp's 16 */
    int R[2], pos[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        R[h] = r0 + warp * 16 + quad + 8 * h;
        pos[h] = R[h] < rows_total ? npast + R[h] / G : -1;
    }
    int wlast = r0 + warp * 16 + 15 < rows_total - 1 ? r0 + warp * 16 + 15 : rows_total - 1;
    int wmax = wlast >= r0 + warp * 16 ? npast + wlast / G : -1; /* the warp's last position */

    /* Q fragments (A operand, row-major 16 x HD), straight from global */
    uint32_t qa[KS][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const __nv_bfloat16 *qr = pos[h] >= 0 ? q + ((size_t)(tok0 + R[h] / G) * (size_t)NH + (size_t)(g * G + R[h] % G)) * HD : NULL;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            int d = ks * 16 + qi * 2;
            qa[ks][h] = qr ? *(const uint32_t *)(qr + d) : 0u;
            qa[ks][2 + h] = qr ? *(const uint32_t *)(qr + d + 8) : 0u;
        }
    }
    float o[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
        o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int kb = 0; kb < kmax; kb += TC_KEYS) {
        __syncthreads(); /* the previous keys have been consumed */
        /* 32 keys x HD: 16-byte pieces, K as bf16, V converted to f16 */
        constexpr int PIECES = TC_KEYS * HD / 8;
        for (int e = threadIdx.x; e < PIECES; e += 64) {
            int j = e / (HD / 8), d = (e % (HD / 8)) * 8, p = kb + j;
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
            if (p < kmax) {
                size_t a = kv_off(table, p, g, NKV, bs, HD) + (size_t)d;
                kv4 = *(const uint4 *)(kc + a);
                vv4 = *(const uint4 *)(vc + a);
            }
            *(uint4 *)&Ks[j][d] = kv4;
            const __nv_bfloat162 *vb = (const __nv_bfloat162 *)&vv4;
            uint4 vh;
            uint32_t *vhp = (uint32_t *)&vh;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float2 f = __bfloat1622float2(vb[i]);
                vhp[i] = pack_f16(f.x, f.y);
            }
            *(uint4 *)&Vs[j][d] = vh;
        }
        __syncthreads();
        if (wmax < kb) /* every row of this warp is before these keys (warp-uniform) */
            continue;
        /* S = Q K^T: 16 rows x 32 keys, 4 tiles of 8 keys */
        float sc[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                const __nv_bfloat16 *kr = &Ks[n * 8 + quad][ks * 16 + qi * 2];
                mma_bf16(sc[n], qa[ks], *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
            }
        }
        /* mask, scale, online softmax per row (4 lanes share a row) */
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float tmax = -INFINITY;
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    int p = kb + n * 8 + qi * 2 + c;
                    float v = p <= pos[h] ? sc[n][2 * h + c] * scale : -INFINITY;
                    sc[n][2 * h + c] = v;
                    tmax = fmaxf(tmax, v);
                }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
            float mn = fmaxf(mx[h], tmax);
            float base = mn == -INFINITY ? 0.0f : mn; /* a row that saw no key yet */
            corr[h] = expf(mx[h] - base);
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float pr = expf(sc[n][2 * h + c] - base);
                    sc[n][2 * h + c] = pr;
                    sum += pr;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[h] = l[h] * corr[h] + sum;
            mx[h] = mn;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            o[t][0] *= corr[0], o[t][1] *= corr[0];
            o[t][2] *= corr[1], o[t][3] *= corr[1];
        }
        /* O += P V: P's C fragments are the A fragments of two k-steps */
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t pa[4];
            pa[0] = pack_f16(sc[2 * kk][0], sc[2 * kk][1]);
            pa[1] = pack_f16(sc[2 * kk][2], sc[2 * kk][3]);
            pa[2] = pack_f16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[3] = pack_f16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            int k0 = kk * 16 + qi * 2;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int d = t * 8 + quad;
                __half2 b0 = __halves2half2(Vs[k0][d], Vs[k0 + 1][d]);
                __half2 b1 = __halves2half2(Vs[k0 + 8][d], Vs[k0 + 9][d]);
                mma_f16(o[t], pa, *(uint32_t *)&b0, *(uint32_t *)&b1);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (pos[h] < 0)
            continue;
        float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        float *orow = out + ((size_t)(tok0 + R[h] / G) * (size_t)NH + (size_t)(g * G + R[h] % G)) * HD;
#pragma unroll
        for (int t = 0; t < NT; t++)
            *(float2 *)(orow + t * 8 + qi * 2) = make_float2(o[t][2 * h] * inv, o[t][2 * h + 1] * inv);
    }
}

/* ---- launchers ---- */

template <typename KT, int HD> static int pf_attr(struct rl_err *err)
{
    CU_CHECK(err, cudaFuncSetAttribute(attn_prefill_kernel<KT, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)pf_smem<HD>()));
    return 0;
}

int cu_attn_init(struct rl_err *err)
{
    int rc;
    if ((rc = pf_attr<float, 32>(err)) || (rc = pf_attr<float, 64>(err)) || (rc = pf_attr<float, 128>(err)) ||
        (rc = pf_attr<float, 256>(err)) || (rc = pf_attr<__nv_bfloat16, 32>(err)) ||
        (rc = pf_attr<__nv_bfloat16, 64>(err)) || (rc = pf_attr<__nv_bfloat16, 128>(err)) ||
        (rc = pf_attr<__nv_bfloat16, 256>(err)))
        return rc;
    return 0;
}

int cu_attn_tc(int kv_bf16, int head_dim) { return kv_bf16 && (head_dim == 64 || head_dim == 128); }

int cu_attn_supports(int head_dim, int group)
{
    return (head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 &&
           group <= CU_ATTN_MAXG;
}

int cu_attn_splits(int n_items, int n_kv, int sm_count, int max_len, int cap)
{
    if (n_items <= 0)
        return 1;
    long blocks = (long)n_items * n_kv;
    int want = (int)((2L * sm_count + blocks - 1) / blocks);
    int by_len = max_len > 0 ? (max_len + 63) / 64 : want;
    int s = want < by_len ? want : by_len;
    if (s > 32)
        s = 32;
    if (s < 1)
        s = 1;
    while (s > 1 && (long)n_items * s > cap)
        s--;
    return s;
}

template <typename KT, int HD, bool PRE = false>
static void dec_launch(dim3 grid, cudaStream_t st, const void *q, const struct cu_kv_layer *kv, int NH, float scale,
                       int nsplit, const struct cu_attn_meta *m, float *out, float *pml, float *pacc)
{
    attn_decode_kernel<KT, HD, PRE><<<grid, DEC_WARPS * 32, 0, st>>>((const KT *)q, (const KT *)kv->k, (const KT *)kv->v,
                                                                NH, kv->n_kv, kv->block_size, scale, nsplit, *m,
                                                                out, pml, pacc);
}

int cu_attn_decode(const void *q, const struct cu_kv_layer *kv, const struct cu_attn_meta *m, int n_dec, int n_heads,
                   int nsplit, int variant, float *part_ml, float *part_acc, float *out, cudaStream_t st,
                   struct rl_err *err)
{
    if (n_dec <= 0)
        return 0;
    int HD = kv->head_dim;
    if (!cu_attn_supports(HD, n_heads / kv->n_kv))
        return rl_errf(err, RL_EUNSUPPORTED, "attention: head_dim %d, group %d not built", HD, n_heads / kv->n_kv);
    float scale = 1.0f / sqrtf((float)HD);
    dim3 grid((unsigned)n_dec, (unsigned)kv->n_kv, (unsigned)nsplit);
#define DEC(KT, D) dec_launch<KT, D>(grid, st, q, kv, n_heads, scale, nsplit, m, out, part_ml, part_acc)
#define DECP(D) dec_launch<__nv_bfloat16, D, true>(grid, st, q, kv, n_heads, scale, nsplit, m, out, part_ml, part_acc)
    if (kv->bf16 && variant == CU_ATTN_DEC_PRELOAD && HD <= 128) {
        if (HD == 32) DECP(32);
        else if (HD == 64) DECP(64);
        else DECP(128);
    } else if (kv->bf16) {
        if (HD == 32) DEC(__nv_bfloat16, 32);
        else if (HD == 64) DEC(__nv_bfloat16, 64);
        else if (HD == 128) DEC(__nv_bfloat16, 128);
        else DEC(__nv_bfloat16, 256);
    } else {
        if (HD == 32) DEC(float, 32);
        else if (HD == 64) DEC(float, 64);
        else if (HD == 128) DEC(float, 128);
        else DEC(float, 256);
    }
#undef DEC
#undef DECP
    LAUNCH_CHECK(err, "attn_decode_kernel");
    if (nsplit > 1) {
        attn_combine_kernel<<<dim3((unsigned)n_dec, (unsigned)n_heads), HD < 128 ? HD : 128, 0, st>>>(
            part_ml, part_acc, n_heads, HD, nsplit, m->dec_tok, out);
        LAUNCH_CHECK(err, "attn_combine_kernel");
    }
    return 0;
}

template <typename KT, int HD>
static void pf_launch(dim3 grid, cudaStream_t st, const void *q, const struct cu_kv_layer *kv, int NH, float scale,
                      const struct cu_attn_meta *m, float *out)
{
    attn_prefill_kernel<KT, HD><<<grid, PF_WARPS * 32, pf_smem<HD>(), st>>>(
        (const KT *)q, (const KT *)kv->k, (const KT *)kv->v, NH, kv->n_kv, kv->block_size, scale, *m, out);
}

int cu_attn_prefill(const void *q, const struct cu_kv_layer *kv, const struct cu_attn_meta *m, int n_tiles,
                    int n_heads, float *out, cudaStream_t st, struct rl_err *err)
{
    return cu_attn_prefill_path(q, kv, m, n_tiles, n_heads, out, 0, st, err);
}

int cu_attn_prefill_path(const void *q, const struct cu_kv_layer *kv, const struct cu_attn_meta *m, int n_tiles,
                         int n_heads, float *out, int simt, cudaStream_t st, struct rl_err *err)
{
    if (n_tiles <= 0)
        return 0;
    int HD = kv->head_dim;
    if (!cu_attn_supports(HD, n_heads / kv->n_kv))
        return rl_errf(err, RL_EUNSUPPORTED, "attention: head_dim %d, group %d not built", HD, n_heads / kv->n_kv);
    float scale = 1.0f / sqrtf((float)HD);
    dim3 grid((unsigned)n_tiles, (unsigned)kv->n_kv);
    if (cu_attn_tc(kv->bf16, HD) && !simt) {
        if (HD == 64)
            attn_prefill_tc_kernel<64><<<grid, 64, 0, st>>>((const __nv_bfloat16 *)q, (const __nv_bfloat16 *)kv->k,
                                                            (const __nv_bfloat16 *)kv->v, n_heads, kv->n_kv,
                                                            kv->block_size, scale, *m, out);
        else
            attn_prefill_tc_kernel<128><<<grid, 64, 0, st>>>((const __nv_bfloat16 *)q, (const __nv_bfloat16 *)kv->k,
                                                             (const __nv_bfloat16 *)kv->v, n_heads, kv->n_kv,
                                                             kv->block_size, scale, *m, out);
        LAUNCH_CHECK(err, "attn_prefill_tc_kernel");
        return 0;
    }
#define PF(KT, D) pf_launch<KT, D>(grid, st, q, kv, n_heads, scale, m, out)
    if (kv->bf16) {
        if (HD == 32) PF(__nv_bfloat16, 32);
        else if (HD == 64) PF(__nv_bfloat16, 64);
        else if (HD == 128) PF(__nv_bfloat16, 128);
        else PF(__nv_bfloat16, 256);
    } else {
        if (HD == 32) PF(float, 32);
        else if (HD == 64) PF(float, 64);
        else if (HD == 128) PF(float, 128);
        else PF(float, 256);
    }
#undef PF
    LAUNCH_CHECK(err, "attn_prefill_kernel");
    return 0;
}

/* ---- test entry point ---- */

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cuda_backend.h"
}

extern "C" int cuda_test_attention(int kv_bf16, int n_heads, int n_kv, int hd, int bs, int n_blocks,
                                   const float *k_pool, const float *v_pool, int n_seqs, const struct be_seq *seqs,
                                   const float *q, float *out, int mode, int nsplit, struct rl_err *err)
{
    int G = n_heads / n_kv, T = 0, n_bt = 0, max_len = 0;
    for (int s = 0; s < n_seqs; s++) {
        T += seqs[s].n_new;
        n_bt += (seqs[s].n_past + seqs[s].n_new + bs - 1) / bs;
    }
    int max_tiles = 0;
    for (int s = 0; s < n_seqs; s++)
        max_tiles += (seqs[s].n_new * G + CU_ATTN_TILE_ROWS - 1) / CU_ATTN_TILE_ROWS;
    /* one host block: tok_seq, tok_pos, dec (T each), tiles (2 x max_tiles),
     * seq_tok0/nnew/npast/bt_off (4 x n_seqs), bt (n_bt) */
    size_t n_int = 3 * (size_t)T + 2 * (size_t)max_tiles + 4 * (size_t)n_seqs + (size_t)n_bt;
    int32_t *h = (int32_t *)calloc(n_int, 4);
    if (!h)
        return rl_errf(err, RL_ENOMEM, "out of memory");
    int32_t *tseq = h, *tpos = tseq + T, *dec = tpos + T, *tile_seq = dec + T, *tile_r0 = tile_seq + max_tiles;
    int32_t *s_tok0 = tile_r0 + max_tiles, *s_nnew = s_tok0 + n_seqs, *s_npast = s_nnew + n_seqs;
    int32_t *s_bt = s_npast + n_seqs, *bt = s_bt + n_seqs;
    int n_dec = 0, n_tiles = 0;
    for (int s = 0, t = 0, at = 0; s < n_seqs; s++) {
        const struct be_seq *sq = &seqs[s];
        int nb = (sq->n_past + sq->n_new + bs - 1) / bs;
        memcpy(bt + at, sq->block_table, (size_t)nb * 4);
        s_tok0[s] = t, s_nnew[s] = sq->n_new, s_npast[s] = sq->n_past, s_bt[s] = at;
        at += nb;
        /* 1, 4: decode kernel (4: its preloading variant); 2, 3: prefill (tensor cores, SIMT) */
        int use_dec = mode == 1 || mode == 4 || (mode == 0 && sq->n_new == 1);
        if (!use_dec)
            for (int r0 = 0; r0 < sq->n_new * G; r0 += CU_ATTN_TILE_ROWS)
                tile_seq[n_tiles] = s, tile_r0[n_tiles++] = r0;
        for (int j = 0; j < sq->n_new; j++, t++) {
            tseq[t] = s;
            tpos[t] = sq->n_past + j;
            if (use_dec) {
                dec[n_dec++] = t;
                if (tpos[t] + 1 > max_len)
                    max_len = tpos[t] + 1;
            }
        }
    }
    struct cudaDeviceProp p;
    size_t pool = (size_t)n_blocks * (size_t)n_kv * (size_t)bs * (size_t)hd, nq = (size_t)T * n_heads * hd;
    void *dh = NULL, *dkf = NULL, *dvf = NULL, *dqf = NULL, *dk = NULL, *dv = NULL, *dq = NULL, *dout = NULL;
    void *dml = NULL, *dacc = NULL;
    int cap = n_dec * 32 + 1, rc;
    struct cu_kv_layer kv;
    struct cu_attn_meta m;
    CU_CHECK_GOTO(err, rc, out, cudaGetDeviceProperties(&p, 0));
    if (nsplit <= 0)
        nsplit = cu_attn_splits(n_dec, n_kv, p.multiProcessorCount, max_len, cap);
    if (nsplit > 32)
        nsplit = 32;
    if ((rc = cu_attn_init(err)) || (rc = cu_test_up(&dh, h, n_int * 4, err)) ||
        (rc = cu_test_up(&dkf, k_pool, pool * 4, err)) || (rc = cu_test_up(&dvf, v_pool, pool * 4, err)) ||
        (rc = cu_test_up(&dqf, q, nq * 4, err)) || (rc = cu_test_up(&dout, NULL, nq * 4, err)) ||
        (rc = cu_test_up(&dml, NULL, (size_t)cap * n_heads * 2 * 4, err)) ||
        (rc = cu_test_up(&dacc, NULL, (size_t)cap * n_heads * hd * 4, err)))
        goto out;
    if (kv_bf16) {
        if ((rc = cu_test_up(&dk, NULL, pool * 2, err)) || (rc = cu_test_up(&dv, NULL, pool * 2, err)) ||
            (rc = cu_test_up(&dq, NULL, nq * 2, err)) ||
            (rc = cu_cast((const float *)dkf, pool, dk, CU_ACT_BF16, 0, err)) ||
            (rc = cu_cast((const float *)dvf, pool, dv, CU_ACT_BF16, 0, err)) ||
            (rc = cu_cast((const float *)dqf, nq, dq, CU_ACT_BF16, 0, err)))
            goto out;
    } else {
        dk = dkf, dv = dvf, dq = dqf;
    }
    {
        const int32_t *b = (const int32_t *)dh;
        size_t o_tseq = 0, o_tpos = (size_t)T, o_dec = 2 * (size_t)T, o_ts = 3 * (size_t)T,
               o_tr = o_ts + (size_t)max_tiles, o_s0 = o_tr + (size_t)max_tiles;
        m.tok_seq = b + o_tseq, m.tok_pos = b + o_tpos, m.dec_tok = b + o_dec;
        m.tile_seq = b + o_ts, m.tile_r0 = b + o_tr;
        m.seq_tok0 = b + o_s0, m.seq_nnew = m.seq_tok0 + n_seqs, m.seq_npast = m.seq_nnew + n_seqs;
        m.seq_bt_off = m.seq_npast + n_seqs, m.bt = m.seq_bt_off + n_seqs;
    }
    kv.k = dk, kv.v = dv, kv.bf16 = kv_bf16, kv.n_kv = n_kv, kv.head_dim = hd, kv.block_size = bs;
    if ((rc = cu_attn_decode(dq, &kv, &m, n_dec, n_heads, nsplit, mode == 4 ? CU_ATTN_DEC_PRELOAD : CU_ATTN_DEC_PLAIN,
                             (float *)dml, (float *)dacc, (float *)dout, 0, err)) ||
        (rc = cu_attn_prefill_path(dq, &kv, &m, n_tiles, n_heads, (float *)dout, mode == 3, 0, err)))
        goto out;
    CU_CHECK_GOTO(err, rc, out, cudaMemcpy(out, dout, nq * 4, cudaMemcpyDeviceToHost));
out:
    if (kv_bf16)
        cudaFree(dk), cudaFree(dv), cudaFree(dq);
    cudaFree(dh), cudaFree(dkf), cudaFree(dvf), cudaFree(dqf), cudaFree(dout), cudaFree(dml), cudaFree(dacc);
    free(h);
    return rc;
}
