// FLASH_ATTN_EXT: one warp per (query, head, batch), a single pass over the keys with an online
// softmax. q [d, n_q, h, b] f32; k [d, n_kv, h_kv, b], v [dv, n_kv, h_kv, b] (f16 or f32);
// optional mask [n_kv, >=n_q]; optional sinks f32 [h] (one more logit per head in the softmax
// denominator, as is, with no value); dst [dv, h, n_q, b] f32. d and dv are at most FA_MAX_D.
#include "common.cuh"
#include "mma.cuh"

#define FA_WARPS 4
#define FA_MAX_D 512

// ALiBi slope of head h (1 without ALiBi), as ggml.
__device__ __forceinline__ float fa_slope(i64 h, int alibi, float m0, float m1, int n_head_log2) {
    if (!alibi) {
        return 1.0f;
    }
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

// Query element x as llama.cpp's CPU backend rounds the query before its dot products with keys
// of type `kt` (ggml's vec_dot_type of the key type), as the CPU backend does: 8-bit blocks of 32
// for block types, bf16 for BF16 keys; exact for F32 and F16 keys (ggml rounds to f16 for F16
// keys, but that moved the CPU backend further from llama.cpp's logits). The 32 lanes of a warp
// hold one block of 32 consecutive elements of a row and all call it: for block types, `d` is
// whole blocks.
__device__ __forceinline__ float fa_q_rounded(float x, int kt) {
    if (act_q8(kt)) {
        return q8_rounded(q8_round_of(warp_max(fabsf(x))), x);
    }
    if (IS_T(kt, T_BF16)) {
        return bf2f(f2bf(x));
    }
    return x;
}

// Task `task` of the one-query kernels (queries fastest, then heads, then batch): its query, head,
// batch and KV head.
struct FaTask {
    i64 iq, h, b, hk;
};
__device__ __forceinline__ FaTask fa_task(i64 task, const Tensor& q, const Tensor& k) {
    i64 n_q = q.ne[1], n_head = q.ne[2];
    FaTask r;
    r.iq = task % n_q;
    r.h = (task / n_q) % n_head;
    r.b = task / (n_q * n_head);
    r.hk = r.h / (n_head / k.ne[2]);
    return r;
}

// `scale` already divided by softcap when softcap != 0 (as ggml).
extern "C" __global__ void k_flash_attn_ext(Tensor dst, Tensor q, Tensor k, Tensor v, Tensor mask, int has_mask,
                                            float scale, float softcap, int alibi, float m0, float m1,
                                            int n_head_log2, Tensor sinks, int has_sinks) {
    TSHARED(float, qs, [FA_WARPS][FA_MAX_D]);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 n_q = q.ne[1], n_head = q.ne[2], n_batch = q.ne[3];
    i64 task = (i64)blockIdx.x * FA_WARPS + warp;
    if (task >= n_q * n_head * n_batch) {
        return;
    }
    FaTask tk = fa_task(task, q, k);
    i64 iq = tk.iq, h = tk.h, b = tk.b, hk = tk.hk;
    i64 d = q.ne[0], dv = v.ne[0], n_kv = k.ne[1];
    float slope = fa_slope(h, alibi, m0, m1, n_head_log2);
    for (i64 c = lane; c < d; c += 32) {
        qs[warp][c] = fa_q_rounded(ld(q, c, iq, h, b), k.type);
    }
    TSYNCWARP();
    float acc[FA_MAX_D / 32];
#pragma unroll
    for (int t = 0; t < FA_MAX_D / 32; t++) {
        acc[t] = 0.0f;
    }
    float mmax = NEG_INF, sum = 0.0f;
    for (i64 j = 0; j < n_kv; j++) {
        float mv = has_mask ? slope * ld(mask, j, iq, 0, 0) : 0.0f;
        if (mv == NEG_INF) {
            continue;
        }
        float s = 0.0f;
        for (i64 c = lane; c < d; c += 32) {
            s += qs[warp][c] * ld(k, c, j, hk, b);
        }
        s = warp_sum(s) * scale;
        if (softcap != 0.0f) {
            s = softcap * tanhf(s);
        }
        s += mv;
        float corr = 1.0f, p = 1.0f;
        if (s > mmax) {
            corr = expf(mmax - s);
            mmax = s;
        } else {
            p = expf(s - mmax);
        }
        sum = sum * corr + p;
#pragma unroll
        for (int t = 0; t < FA_MAX_D / 32; t++) {
            i64 c = lane + 32 * t;
            if (c < dv) {
                acc[t] = acc[t] * corr + p * ld(v, c, j, hk, b);
            }
        }
    }
    if (has_sinks) {
        float sk = ld(sinks, h, 0, 0, 0);
        if (sk > mmax) {
            // The sink becomes the maximum: rescale what was summed (zeros if no key was seen).
            float corr = expf(mmax - sk);
            sum = sum * corr + 1.0f;
#pragma unroll
            for (int t = 0; t < FA_MAX_D / 32; t++) {
                acc[t] *= corr;
            }
        } else if (sk > NEG_INF) {
            sum += expf(sk - mmax);
        }
    }
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int t = 0; t < FA_MAX_D / 32; t++) {
        i64 c = lane + 32 * t;
        if (c < dv) {
            st(dst, c, h, iq, b, acc[t] * inv);
        }
    }
}

// ----- decoding split over the keys: partial softmaxes in scratch, then a merge -----
//
// k_flash_attn_split: block `split` of a (query, head, batch) task takes keys
// [split * chunk, (split + 1) * chunk); its FS_WARPS warps take 32 keys at a time, lane j
// scoring key j against the query in shared memory (f16 keys contiguous along d and 16-byte
// aligned are read 8 at a time), then a warp's online softmax, and lane c accumulating output
// columns c, c + 32, ... of P·V (f16 values: columns 4 c + 128 u .. + 3, read 4 at a time).
// Loads are unrolled so that a lane has several in flight: one at a time, a pass waited on
// memory for every key and column (40 µs per decode step's attention on an H200). The warps' results are merged in shared memory; with one split
// the block writes the output, else its maximum, sum and unnormalised row go to
// part[(task * nsplit + split) * (dv + 2) ..] for k_flash_attn_merge. nsplit blocks per task,
// each on a bounded span: a long cache fills the chip instead of one block walking it.
#define FS_WARPS 4
// Unrolling that keeps several loads in flight on a GPU; the SYCL and HIP compat builds leave the
// loops to their compilers (the OpenCL CPU JIT spends seconds on each unrolled copy).
#if defined(TESSERA_CUDA) && !defined(TESSERA_COMPAT)
#define FS_UNROLL(n) _Pragma(#n)
#else
#define FS_UNROLL(n)
#endif

struct alignas(16) fa_u4 {
    u32 x, y, z, w;
};
struct alignas(8) fa_u2 {
    u32 x, y;
};

// The factor that turns a task's unnormalised row into its output, from its softmax's maximum
// and sum: the sink (a logit with no value), if any, joins the denominator.
__device__ __forceinline__ float fa_out_factor(float mmax, float sum, int has_sinks, const Tensor& sinks, i64 h) {
    if (has_sinks) {
        float sk = ld(sinks, h, 0, 0, 0);
        if (sk > mmax) {
            float corr = mmax == NEG_INF ? 0.0f : expf(mmax - sk);
            return corr / (sum * corr + 1.0f);
        }
        if (sk > NEG_INF) {
            return 1.0f / (sum + expf(sk - mmax));
        }
    }
    return sum > 0.0f ? 1.0f / sum : 0.0f;
}

// `maxd` (a multiple of 128, at most FA_MAX_D) bounds d and dv: the accumulators a lane keeps are
// maxd / 32, so a kernel for heads up to 128 holds 4 where one for 512 holds 16.
__device__ __forceinline__ void fa_split(const int maxd, const Tensor& dst, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& mask, int has_mask, float scale,
                                         float softcap, int alibi, float m0, float m1, int n_head_log2,
                                         const Tensor& sinks, int has_sinks, float* part, int nsplit, i64 chunk) {
    TSHARED(float, qs, [FA_MAX_D]);
    TSHARED(float, ps, [FS_WARPS][32]);
    TSHARED(float, wm, [FS_WARPS]);
    TSHARED(float, wl, [FS_WARPS]);
    TSHARED(float, accs, [FS_WARPS][FA_MAX_D]);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 task = blockIdx.x / nsplit;
    int split = (int)(blockIdx.x % nsplit);
    FaTask tk = fa_task(task, q, k);
    i64 iq = tk.iq, h = tk.h, b = tk.b, hk = tk.hk;
    i64 d = q.ne[0], dv = v.ne[0], n_kv = k.ne[1];
    i64 j0 = (i64)split * chunk, j1 = j0 + chunk < n_kv ? j0 + chunk : n_kv;
    float slope = fa_slope(h, alibi, m0, m1, n_head_log2);
    for (i64 c = threadIdx.x; c < d; c += 32 * FS_WARPS) {
        qs[c] = fa_q_rounded(ld(q, c, iq, h, b), k.type);
    }
    bool kvec = HAS_T(T_F16) && k.type == T_F16 && k.nb[0] == 2 && d % 8 == 0 &&
                (((unsigned long long)TENSOR_BASE(k) | (unsigned long long)(k.nb[1] | k.nb[2] | k.nb[3])) % 16) == 0;
    bool vvec = HAS_T(T_F16) && v.type == T_F16 && v.nb[0] == 2 && dv % 4 == 0 &&
                (((unsigned long long)TENSOR_BASE(v) | (unsigned long long)(v.nb[1] | v.nb[2] | v.nb[3])) % 8) == 0;
    float acc[FA_MAX_D / 32];
#pragma unroll
    for (int t = 0; t < FA_MAX_D / 32; t++) {
        acc[t] = 0.0f;
    }
    float mmax = NEG_INF, sum = 0.0f;
    __syncthreads();
    for (i64 g = j0 + 32 * warp; g < j1; g += 32 * FS_WARPS) {
        i64 j = g + lane;
        float s = NEG_INF;
        if (j < j1) {
            float mv = has_mask ? slope * ld(mask, j, iq, 0, 0) : 0.0f;
            if (mv != NEG_INF) {
                float dot = 0.0f;
#ifdef FS_SKIP_SCORE
                // Timing aid (TESSERA_CUDA_DEFINES=FS_SKIP_SCORE): scores without reading keys.
                dot = qs[j % d];
                if (false) {
#else
                if (kvec) {
#endif
                    const fa_u4* kr = (const fa_u4*)row_ptr(k, j, hk, b);
                    // Unrolled so that several loads are in flight (the row is the lane's own).
FS_UNROLL(unroll 8)
                    for (i64 c8 = 0; c8 < d / 8; c8++) {
                        fa_u4 u = kr[c8];
                        u32 w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            dot += qs[8 * c8 + 2 * e] * h2f((u16)(w4[e] & 0xffffu)) +
                                   qs[8 * c8 + 2 * e + 1] * h2f((u16)(w4[e] >> 16));
                        }
                    }
                } else {
#ifndef FS_SKIP_SCORE
                    TLOOP_ROLLED
                    for (i64 c = 0; c < d; c++) {
                        dot += qs[c] * ld(k, c, j, hk, b);
                    }
#endif
                }
                dot *= scale;
                if (softcap != 0.0f) {
                    dot = softcap * tanhf(dot);
                }
                s = dot + mv;
            }
        }
        // Uniform across the warp: every lane has the same maximum. A group whose keys are all
        // masked (the cache's unused tail while decoding) adds nothing.
        float gmax = warp_max(s);
        if (gmax == NEG_INF) {
            continue;
        }
        float mnew = fmaxf(mmax, gmax);
        float p = s == NEG_INF ? 0.0f : expf(s - mnew);
        float corr = mmax == NEG_INF ? 0.0f : expf(mmax - mnew);
        sum = sum * corr + warp_sum(p);
        mmax = mnew;
        ps[warp][lane] = p;
        TSYNCWARP();
        i64 nj = j1 - g < 32 ? j1 - g : 32;
#pragma unroll
        for (int t = 0; t < maxd / 32; t++) {
            acc[t] *= corr;
        }
#ifdef FS_SKIP_PV
        // Timing aid (TESSERA_CUDA_DEFINES=FS_SKIP_PV): the softmax without reading values.
        if (true) {
        } else if (false) {
#else
        if (vvec) {
#endif
            // Lane c takes columns 4 c + 128 u .. + 3 of each f16 row (8-byte loads), the
            // unrolled key loop keeping several rows' loads in flight.
            const char* vb = row_ptr(v, g, hk, b);
FS_UNROLL(unroll 16)
            for (i64 jj = 0; jj < nj; jj++) {
                float p = ps[warp][jj];
                const char* vr = vb + jj * v.nb[1];
                // A masked key (p = 0) adds nothing, not 0 × a stale cell's NaN.
                bool live = p != 0.0f;
#pragma unroll
                for (int u = 0; u < maxd / 128; u++) {
                    i64 c = 4 * lane + 128 * u;
                    if (c < dv) {
                        fa_u2 h2 = *(const fa_u2*)(vr + 2 * c);
                        float e[4] = {h2f((u16)(h2.x & 0xffffu)), h2f((u16)(h2.x >> 16)), h2f((u16)(h2.y & 0xffffu)),
                                      h2f((u16)(h2.y >> 16))};
#pragma unroll
                        for (int q4 = 0; q4 < 4; q4++) {
                            acc[4 * u + q4] = live ? acc[4 * u + q4] + p * e[q4] : acc[4 * u + q4];
                        }
                    }
                }
            }
        } else {
#pragma unroll
            for (int t = 0; t < maxd / 32; t++) {
                i64 c = lane + 32 * t;
                if (c < dv) {
                    float a = acc[t];
                    for (i64 jj = 0; jj < nj; jj++) {
                        float p = ps[warp][jj];
                        if (p != 0.0f) {
                            a += p * ld(v, c, g + jj, hk, b);
                        }
                    }
                    acc[t] = a;
                }
            }
        }
        TSYNCWARP(); // the next pass overwrites ps
    }
    if (lane == 0) {
        wm[warp] = mmax;
        wl[warp] = sum;
    }
    __syncthreads();
    float bm = NEG_INF;
    for (int w = 0; w < FS_WARPS; w++) {
        bm = fmaxf(bm, wm[w]);
    }
    float f = mmax == NEG_INF ? 0.0f : expf(mmax - bm);
#pragma unroll
    for (int t = 0; t < maxd / 32; t++) {
        i64 c = vvec ? 4 * lane + 128 * (t / 4) + t % 4 : lane + 32 * t;
        if (c < dv) {
            accs[warp][c] = acc[t] * f;
        }
    }
    float bl = 0.0f;
    for (int w = 0; w < FS_WARPS; w++) {
        bl += wm[w] == NEG_INF ? 0.0f : wl[w] * expf(wm[w] - bm);
    }
    __syncthreads();
    float* out = part + ((i64)task * nsplit + split) * (dv + 2);
    float factor = nsplit == 1 ? fa_out_factor(bm, bl, has_sinks, sinks, h) : 1.0f;
    for (i64 c = threadIdx.x; c < dv; c += 32 * FS_WARPS) {
        float o = 0.0f;
        for (int w = 0; w < FS_WARPS; w++) {
            o += accs[w][c];
        }
        if (nsplit == 1) {
            st(dst, c, h, iq, b, o * factor);
        } else {
            out[2 + c] = o;
        }
    }
    if (nsplit > 1 && threadIdx.x == 0) {
        out[0] = bm;
        out[1] = bl;
    }
}

extern "C" __global__ void k_flash_attn_split(Tensor dst, Tensor q, Tensor k, Tensor v, Tensor mask, int has_mask,
                                              float scale, float softcap, int alibi, float m0, float m1,
                                              int n_head_log2, Tensor sinks, int has_sinks, float* part, int nsplit,
                                              i64 chunk) {
    fa_split(FA_MAX_D, dst, q, k, v, mask, has_mask, scale, softcap, alibi, m0, m1, n_head_log2, sinks, has_sinks,
             part, nsplit, chunk);
}
// Heads up to 128 (d and dv): 4 accumulators a lane.
extern "C" __global__ void k_flash_attn_split128(Tensor dst, Tensor q, Tensor k, Tensor v, Tensor mask,
                                                 int has_mask, float scale, float softcap, int alibi, float m0,
                                                 float m1, int n_head_log2, Tensor sinks, int has_sinks, float* part,
                                                 int nsplit, i64 chunk) {
    fa_split(128, dst, q, k, v, mask, has_mask, scale, softcap, alibi, m0, m1, n_head_log2, sinks, has_sinks, part,
             nsplit, chunk);
}

// k_flash_attn_merge: one block per task merges its nsplit partial softmaxes (a split whose
// keys were all masked has maximum -inf and adds nothing) and writes the output; the splits'
// weights go through shared memory FM_MAX_SPLITS at a time. blockDim is FM_THREADS.
#define FM_THREADS 128
#define FM_MAX_SPLITS 128
extern "C" __global__ void k_flash_attn_merge(Tensor dst, Tensor q, Tensor v, Tensor sinks, int has_sinks,
                                              const float* part, int nsplit) {
    TSHARED(float, wts, [FM_MAX_SPLITS]);
    TSHARED(float, red, [32]);
    i64 task = blockIdx.x;
    i64 n_q = q.ne[1], n_head = q.ne[2];
    i64 iq = task % n_q, h = (task / n_q) % n_head, b = task / (n_q * n_head);
    i64 dv = v.ne[0];
    const float* p = part + task * nsplit * (dv + 2);
    // Thread s reads split s's maximum and sum; the block's maximum and the splits' weights
    // follow, so no thread walks the splits one load at a time.
    float mmax = NEG_INF, sum = 0.0f;
    for (int s0 = 0; s0 < nsplit; s0 += FM_MAX_SPLITS) {
        int s = s0 + (int)threadIdx.x;
        float ms = s < nsplit && threadIdx.x < FM_MAX_SPLITS ? p[(i64)s * (dv + 2)] : NEG_INF;
        float m_all = fmaxf(mmax, block_max(ms, red));
        float ls = ms == NEG_INF ? 0.0f : p[(i64)s * (dv + 2) + 1] * expf(ms - m_all);
        float corr = mmax == NEG_INF ? 0.0f : expf(mmax - m_all);
        sum = sum * corr + block_sum(ls, red);
        mmax = m_all;
    }
    float factor = fa_out_factor(mmax, sum, has_sinks, sinks, h);
    // Thread t takes columns t + FM_THREADS u.
    float o[FA_MAX_D / FM_THREADS];
#pragma unroll
    for (int u = 0; u < FA_MAX_D / FM_THREADS; u++) {
        o[u] = 0.0f;
    }
    for (int s0 = 0; s0 < nsplit; s0 += FM_MAX_SPLITS) {
        __syncthreads(); // the previous turn's weights are used
        int s = s0 + (int)threadIdx.x;
        if (s < nsplit && threadIdx.x < FM_MAX_SPLITS) {
            float ms = p[(i64)s * (dv + 2)];
            wts[threadIdx.x] = ms == NEG_INF ? 0.0f : expf(ms - mmax);
        }
        __syncthreads();
        int n = nsplit - s0 < FM_MAX_SPLITS ? nsplit - s0 : FM_MAX_SPLITS;
#pragma unroll
        for (int u = 0; u < FA_MAX_D / FM_THREADS; u++) {
            i64 c = threadIdx.x + (i64)FM_THREADS * u;
            if (c < dv) {
                float a = o[u];
FS_UNROLL(unroll 8)
                for (int i = 0; i < n; i++) {
                    a += wts[i] * p[(i64)(s0 + i) * (dv + 2) + 2 + c];
                }
                o[u] = a;
            }
        }
    }
#pragma unroll
    for (int u = 0; u < FA_MAX_D / FM_THREADS; u++) {
        i64 c = threadIdx.x + (i64)FM_THREADS * u;
        if (c < dv) {
            st(dst, c, h, iq, b, o[u] * factor);
        }
    }
}

// Whether any pair of queries q0 .. q0 + nq - 1 and keys j0 .. j0 + nk - 1 (those below n_q and
// n_kv) survives the mask, through the block-shared flag `live`; every thread of the block calls
// it, and it first waits for the block's readers of the previous tile.
__device__ __forceinline__ bool fa_tile_live(const Tensor& mask, int has_mask, i64 q0, int nq, i64 n_q, i64 j0,
                                             int nk, i64 n_kv, int* live) {
    __syncthreads();
    if (threadIdx.x == 0) {
        live[0] = 0;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nq * nk; e += blockDim.x) {
        i64 iq = q0 + e / nk, j = j0 + e % nk;
        if (iq < n_q && j < n_kv && (!has_mask || ld(mask, j, iq, 0, 0) != NEG_INF)) {
            live[0] = 1;
        }
    }
    __syncthreads();
    return live[0] != 0;
}

// ----- prompts: many queries per block, keys staged through shared memory -----
//
// k_flash_attn_tiled: a block of FT_WARPS warps takes FT_Q queries of one (head, batch), each warp
// FT_QW of them; keys go in tiles of FT_KT through shared memory (as f32, rows padded by one
// float so that lanes reading one column of different rows hit different banks), loaded once
// per block and used by all its queries. Scores: lane j takes key j of the tile for the warp's
// queries (q read as shared broadcasts); softmax over the tile with warp shuffles; then lane c
// accumulates columns c, c + 32, ... of P·V. A key tile that the mask hides from every query of
// the block (a causal mask's upper triangle) is skipped whole. d == dv, a multiple of 32 up to
// FT_MAX_D; the planner sends other shapes and decoding (few queries) to k_flash_attn_ext.
#define FT_WARPS 4
#define FT_QW 4
#define FT_Q (FT_WARPS * FT_QW)
#define FT_KT 32
#define FT_MAX_D 128

extern "C" __global__ void k_flash_attn_tiled(Tensor dst, Tensor q, Tensor k, Tensor v, Tensor mask, int has_mask,
                                              float scale, float softcap, int alibi, float m0, float m1,
                                              int n_head_log2, Tensor sinks, int has_sinks) {
    TSHARED(float, ks, [FT_KT][FT_MAX_D + 1]);
    TSHARED(float, vs, [FT_KT][FT_MAX_D + 1]);
    TSHARED(float, qs, [FT_Q][FT_MAX_D]);
    TSHARED(float, ps, [FT_WARPS][FT_QW][FT_KT]);
    TSHARED(int, live, [1]);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 n_q = q.ne[1], n_head = q.ne[2];
    i64 qblocks = (n_q + FT_Q - 1) / FT_Q;
    i64 q0 = (blockIdx.x % qblocks) * FT_Q;
    i64 h = (blockIdx.x / qblocks) % n_head;
    i64 b = blockIdx.x / (qblocks * n_head);
    i64 hk = h / (n_head / k.ne[2]);
    int d = (int)q.ne[0];
    int nt = d / 32;
    i64 n_kv = k.ne[1];
    float slope = fa_slope(h, alibi, m0, m1, n_head_log2);
    for (int e = threadIdx.x; e < FT_Q * d; e += FT_WARPS * 32) {
        int qi = e / d, c = e % d;
        i64 iq = q0 + qi;
        qs[qi][c] = fa_q_rounded(iq < n_q ? ld(q, c, iq, h, b) : 0.0f, k.type);
    }
    float acc[FT_QW][FT_MAX_D / 32];
    float mmax[FT_QW], sum[FT_QW];
#pragma unroll
    for (int i = 0; i < FT_QW; i++) {
        mmax[i] = NEG_INF;
        sum[i] = 0.0f;
#pragma unroll
        for (int t = 0; t < FT_MAX_D / 32; t++) {
            acc[i][t] = 0.0f;
        }
    }
    for (i64 j0 = 0; j0 < n_kv; j0 += FT_KT) {
        if (!fa_tile_live(mask, has_mask, q0, FT_Q, n_q, j0, FT_KT, n_kv, live)) {
            continue;
        }
        for (int e = threadIdx.x; e < FT_KT * d; e += FT_WARPS * 32) {
            int jj = e / d, c = e % d;
            i64 j = j0 + jj;
            ks[jj][c] = j < n_kv ? ld(k, c, j, hk, b) : 0.0f;
            vs[jj][c] = j < n_kv ? ld(v, c, j, hk, b) : 0.0f;
        }
        __syncthreads();
        // Scores of key j0 + lane for the warp's queries.
        i64 j = j0 + lane;
        float s[FT_QW];
#pragma unroll
        for (int i = 0; i < FT_QW; i++) {
            s[i] = 0.0f;
        }
        for (int c = 0; c < d; c++) {
            float kv = ks[lane][c];
#pragma unroll
            for (int i = 0; i < FT_QW; i++) {
                s[i] += qs[warp * FT_QW + i][c] * kv;
            }
        }
#pragma unroll
        for (int i = 0; i < FT_QW; i++) {
            i64 iq = q0 + warp * FT_QW + i;
            float x = s[i] * scale;
            if (softcap != 0.0f) {
                x = softcap * tanhf(x);
            }
            float mv = 0.0f;
            if (j >= n_kv || iq >= n_q) {
                mv = NEG_INF;
            } else if (has_mask) {
                mv = slope * ld(mask, j, iq, 0, 0);
            }
            x = mv == NEG_INF ? NEG_INF : x + mv;
            // Online softmax over the tile: the new maximum, the rescale of what was summed.
            float tmax = warp_max(x);
            float newmax = fmaxf(mmax[i], tmax);
            float p = newmax == NEG_INF ? 0.0f : expf(x - newmax);
            float corr = mmax[i] == NEG_INF ? 0.0f : expf(mmax[i] - newmax);
            sum[i] = sum[i] * corr + warp_sum(p);
            mmax[i] = newmax;
#pragma unroll
            for (int t = 0; t < FT_MAX_D / 32; t++) {
                acc[i][t] *= corr;
            }
            ps[warp][i][lane] = p;
        }
        TSYNCWARP();
        for (int jj = 0; jj < FT_KT; jj++) {
#pragma unroll
            for (int t = 0; t < FT_MAX_D / 32; t++) {
                if (t < nt) {
                    float vv = vs[jj][lane + 32 * t];
#pragma unroll
                    for (int i = 0; i < FT_QW; i++) {
                        acc[i][t] += ps[warp][i][jj] * vv;
                    }
                }
            }
        }
        TSYNCWARP(); // ps is rewritten by the next tile
    }
#pragma unroll
    for (int i = 0; i < FT_QW; i++) {
        i64 iq = q0 + warp * FT_QW + i;
        if (iq >= n_q) {
            continue;
        }
        float total = sum[i];
        float scale_out = 1.0f;
        if (has_sinks) {
            float sk = ld(sinks, h, 0, 0, 0);
            if (sk > mmax[i]) {
                // The sink becomes the maximum: rescale what was summed (zeros if no key was seen).
                scale_out = mmax[i] == NEG_INF ? 0.0f : expf(mmax[i] - sk);
                total = total * scale_out + 1.0f;
            } else if (sk > NEG_INF) {
                total += expf(sk - mmax[i]);
            }
        }
        float inv = total > 0.0f ? scale_out / total : 0.0f;
#pragma unroll
        for (int t = 0; t < FT_MAX_D / 32; t++) {
            if (t < nt) {
                st(dst, lane + 32 * t, h, iq, b, acc[i][t] * inv);
            }
        }
    }
}

// ----- prompts on tensor cores: f16 tiles of queries, keys and values -----
//
// k_flash_attn_mma: a block of FM_WARPS warps takes FM_Q rows, each a (query, head) pair:
// FM_Q / gq queries of gq query heads that share one KV head (gq a power of two dividing the
// group, at most 16), so every staged key and value serves all of them. Warp w owns rows
// 16 w .. 16 w + 15 (row r: query q0 + r / gq, head h0 + r % gq), its queries held in registers
// as f16 A fragments (mma.cuh). Keys and values go through shared memory as f16 in tiles of
// FM_KT (values transposed, so that a B fragment's two keys of one column are one word); a tile
// the mask hides from every row of the block is skipped whole (a causal mask's upper triangle).
// Scores S = Q · Kᵀ with mma_f16 into f32, then scale, softcap, ALiBi and mask per element and
// an online softmax per row (a row's 32 keys are spread over the 4 lanes of its group); the f32
// scores become, packed to f16, the A fragments of P · V, accumulated in f32. d == dv, a
// multiple of 16 up to FM_MAX_D; K and V of any type the decoders read (the planner sends F16 and
// BF16 caches: f16 products of llama.cpp-rounded queries with 8-bit keys would not be llama.cpp's).
// grid = (ceil(n_q / (FM_Q / gq)), n_head / gq, batch).
#define FM_WARPS 4
// Loops over fragments unrolled on CUDA, so that they stay in registers; hipRTC's clang warns
// that it cannot unroll the ones holding tile products (and warnings fail the toolchain test),
// and the SYCL compiler is left to its own choice.
#if defined(TESSERA_CUDA) && !defined(TESSERA_COMPAT)
#define FM_UNROLL _Pragma("unroll")
#else
#define FM_UNROLL
#endif
#define FM_Q (16 * FM_WARPS)
#define FM_KT 32
#define FM_MAX_D 128
// Words (f16 pairs) per staged key row and per transposed value row: padded so that the eight
// rows and four words of one B fragment fall in 32 different banks.
#define FM_K_WORDS (FM_MAX_D / 2 + 4)
#define FM_V_WORDS (FM_KT / 2 + 4)

// Element (i0, i1, i2, i3) of t as f16 bits (F16 as stored).
__device__ __forceinline__ u16 fm_ld_h(const Tensor& t, i64 i0, i64 i1, i64 i2, i64 i3) {
    if (IS_T(t.type, T_F16)) {
        return *(const u16*)(row_ptr(t, i1, i2, i3) + i0 * t.nb[0]);
    }
    return f2h(ld(t, i0, i1, i2, i3));
}

extern "C" __global__ void k_flash_attn_mma(Tensor dst, Tensor q, Tensor k, Tensor v, Tensor mask, int has_mask,
                                            float scale, float softcap, int alibi, float m0, float m1,
                                            int n_head_log2, Tensor sinks, int has_sinks, int gq) {
    TSHARED(u32, ks, [FM_KT][FM_K_WORDS]);
    TSHARED(u32, vt, [FM_MAX_D][FM_V_WORDS]);
    TSHARED(int, live, [1]);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane / 4, t = lane % 4;
    i64 n_q = q.ne[1], n_kv = k.ne[1];
    int qpb = FM_Q / gq;
    i64 q0 = (i64)blockIdx.x * qpb;
    i64 h0 = (i64)blockIdx.y * gq;
    i64 b = blockIdx.z;
    i64 hk = h0 / (q.ne[2] / k.ne[2]);
    int d = (int)q.ne[0];
    int nks = d / 16;
    // This lane's two rows: 16 warp + g and that + 8.
    i64 iq[2], hr[2];
    float slope[2];
    for (int e = 0; e < 2; e++) {
        int r = 16 * warp + g + 8 * e;
        iq[e] = q0 + r / gq;
        hr[e] = h0 + r % gq;
        slope[e] = fa_slope(hr[e], alibi, m0, m1, n_head_log2);
    }
    // Queries as f16 A fragments (rows past n_q are zero), rounded to bf16 first for BF16 keys
    // as llama.cpp's CPU rounds them.
    mma_a16 qa[FM_MAX_D / 16];
FM_UNROLL
    for (int s = 0; s < FM_MAX_D / 16; s++) {
        for (int w = 0; w < 4; w++) {
            int e = w % 2;
            int c = 16 * s + 2 * t + 8 * (w / 2);
            float x0 = 0.0f, x1 = 0.0f;
            if (s < nks && iq[e] < n_q) {
                x0 = ld(q, c, iq[e], hr[e], b);
                x1 = ld(q, c + 1, iq[e], hr[e], b);
                if (IS_T(k.type, T_BF16)) {
                    x0 = bf2f(f2bf(x0));
                    x1 = bf2f(f2bf(x1));
                }
            }
            qa[s].x[w] = pack_h2(f2h(x0), f2h(x1));
        }
    }
    mma_c32f o[FM_MAX_D / 8];
FM_UNROLL
    for (int n = 0; n < FM_MAX_D / 8; n++) {
        for (int e = 0; e < 4; e++) {
            o[n].x[e] = 0.0f;
        }
    }
    // Per row: the running maximum, and this lane's share of the sum (its columns only; the
    // group's four shares are added at the end).
    float mmax[2] = {NEG_INF, NEG_INF}, lsum[2] = {0.0f, 0.0f};
    for (i64 j0 = 0; j0 < n_kv; j0 += FM_KT) {
        if (!fa_tile_live(mask, has_mask, q0, qpb, n_q, j0, FM_KT, n_kv, live)) {
            continue;
        }
        TLOOP_ROLLED
        for (int e = threadIdx.x; e < FM_KT * (d / 2); e += FM_WARPS * 32) {
            int jj = e / (d / 2), c = 2 * (e % (d / 2));
            i64 j = j0 + jj;
            u16 a = j < n_kv ? fm_ld_h(k, c, j, hk, b) : (u16)0;
            u16 a1 = j < n_kv ? fm_ld_h(k, c + 1, j, hk, b) : (u16)0;
            ks[jj][c / 2] = pack_h2(a, a1);
        }
        TLOOP_ROLLED
        for (int e = threadIdx.x; e < (FM_KT / 2) * d; e += FM_WARPS * 32) {
            int c = e % d, jp = e / d;
            i64 j = j0 + 2 * jp;
            u16 a = j < n_kv ? fm_ld_h(v, c, j, hk, b) : (u16)0;
            u16 a1 = j + 1 < n_kv ? fm_ld_h(v, c, j + 1, hk, b) : (u16)0;
            vt[c][jp] = pack_h2(a, a1);
        }
        __syncthreads();
        // Scores of the warp's 16 rows with the tile's keys, 8 keys per C tile.
        mma_c32f sc[FM_KT / 8];
FM_UNROLL
        for (int n = 0; n < FM_KT / 8; n++) {
            for (int e = 0; e < 4; e++) {
                sc[n].x[e] = 0.0f;
            }
FM_UNROLL
            for (int s = 0; s < FM_MAX_D / 16; s++) {
                if (s < nks) {
                    mma_b16 kb;
                    kb.x[0] = ks[8 * n + g][8 * s + t];
                    kb.x[1] = ks[8 * n + g][8 * s + 4 + t];
                    mma_f16(sc[n], qa[s], kb);
                }
            }
        }
        float tmax[2] = {NEG_INF, NEG_INF};
FM_UNROLL
        for (int n = 0; n < FM_KT / 8; n++) {
            for (int e = 0; e < 4; e++) {
                int r = e / 2;
                i64 j = j0 + 8 * n + 2 * t + (e % 2);
                float x = sc[n].x[e] * scale;
                if (softcap != 0.0f) {
                    x = softcap * tanhf(x);
                }
                float mv = 0.0f;
                if (j >= n_kv || iq[r] >= n_q) {
                    mv = NEG_INF;
                } else if (has_mask) {
                    mv = slope[r] * ld(mask, j, iq[r], 0, 0);
                }
                x = mv == NEG_INF ? NEG_INF : x + mv;
                sc[n].x[e] = x;
                tmax[r] = fmaxf(tmax[r], x);
            }
        }
        float corr[2];
        for (int r = 0; r < 2; r++) {
            // The row's maximum over its group of four lanes.
            tmax[r] = fmaxf(tmax[r], TSHFL_XOR(tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], TSHFL_XOR(tmax[r], 2));
            float newmax = fmaxf(mmax[r], tmax[r]);
            corr[r] = mmax[r] == NEG_INF ? 0.0f : expf(mmax[r] - newmax);
            mmax[r] = newmax;
            lsum[r] *= corr[r];
        }
FM_UNROLL
        for (int n = 0; n < FM_KT / 8; n++) {
            for (int e = 0; e < 4; e++) {
                int r = e / 2;
                float p = mmax[r] == NEG_INF ? 0.0f : expf(sc[n].x[e] - mmax[r]);
                sc[n].x[e] = p;
                lsum[r] += p;
            }
        }
FM_UNROLL
        for (int n = 0; n < FM_MAX_D / 8; n++) {
            o[n].x[0] *= corr[0];
            o[n].x[1] *= corr[0];
            o[n].x[2] *= corr[1];
            o[n].x[3] *= corr[1];
        }
        // P · V: the probabilities of keys 16 s .. 16 s + 15 are the A fragment of step s.
FM_UNROLL
        for (int s = 0; s < FM_KT / 16; s++) {
            mma_a16 pa;
            pa.x[0] = pack_f2h2(sc[2 * s].x[0], sc[2 * s].x[1]);
            pa.x[1] = pack_f2h2(sc[2 * s].x[2], sc[2 * s].x[3]);
            pa.x[2] = pack_f2h2(sc[2 * s + 1].x[0], sc[2 * s + 1].x[1]);
            pa.x[3] = pack_f2h2(sc[2 * s + 1].x[2], sc[2 * s + 1].x[3]);
FM_UNROLL
            for (int n = 0; n < FM_MAX_D / 8; n++) {
                if (n < d / 8) {
                    mma_b16 vb;
                    vb.x[0] = vt[8 * n + g][8 * s + t];
                    vb.x[1] = vt[8 * n + g][8 * s + 4 + t];
                    mma_f16(o[n], pa, vb);
                }
            }
        }
    }
    for (int r = 0; r < 2; r++) {
        float total = lsum[r];
        total += TSHFL_XOR(total, 1);
        total += TSHFL_XOR(total, 2);
        if (iq[r] >= n_q) {
            continue;
        }
        float inv = fa_out_factor(mmax[r], total, has_sinks, sinks, hr[r]);
        for (int n = 0; n < FM_MAX_D / 8; n++) {
            if (n < d / 8) {
                st(dst, 8 * n + 2 * t, hr[r], iq[r], b, o[n].x[2 * r] * inv);
                st(dst, 8 * n + 2 * t + 1, hr[r], iq[r], b, o[n].x[2 * r + 1] * inv);
            }
        }
    }
}
