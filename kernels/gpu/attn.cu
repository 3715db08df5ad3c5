// FLASH_ATTN_EXT: one warp per (query, head, batch), a single pass over the keys with an online
// softmax. q [d, n_q, h, b] f32; k [d, n_kv, h_kv, b], v [dv, n_kv, h_kv, b] (f16 or f32);
// optional mask [n_kv, >=n_q]; optional sinks f32 [h] (one more logit per head in the softmax
// denominator, as is, with no value); dst [dv, h, n_q, b] f32. d and dv are at most FA_MAX_D.
#include "common.cuh"

#define FA_WARPS 4
#define FA_MAX_D 512

// ALiBi slope of head h (1 without ALiBi), as ggml.
__device__ __forceinline__ float fa_slope(i64 h, int alibi, float m0, float m1, int n_head_log2) {
    if (!alibi) {
        return 1.0f;
    }
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
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
        qs[warp][c] = ld(q, c, iq, h, b);
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

// ----- decoding: one block per (query, head, batch) -----
//
// k_flash_attn_dec: the block's FD_THREADS threads take the keys FD_THREADS at a time, one key
// each (a full-row dot product with the query, which sits in shared memory), then the block's
// maximum and sum give the online softmax's step, and thread t accumulates output columns
// t, t + FD_THREADS, ... of P·V over the pass's keys (reading V rows coalesced). Where
// k_flash_attn_ext gives a query's whole key loop to one warp (32 warps on the chip for 32
// heads, each scoring one key at a time), this keeps 4 warps per head busy on 128 keys at once.
// Same arguments and results as k_flash_attn_ext; any d, dv up to FA_MAX_D.
#define FD_THREADS 128

extern "C" __global__ void k_flash_attn_dec(Tensor dst, Tensor q, Tensor k, Tensor v, Tensor mask, int has_mask,
                                            float scale, float softcap, int alibi, float m0, float m1,
                                            int n_head_log2, Tensor sinks, int has_sinks) {
    TSHARED(float, qs, [FA_MAX_D]);
    TSHARED(float, ps, [FD_THREADS]);
    TSHARED(float, red, [32]);
    int t = threadIdx.x;
    FaTask tk = fa_task(blockIdx.x, q, k);
    i64 iq = tk.iq, h = tk.h, b = tk.b, hk = tk.hk;
    i64 d = q.ne[0], dv = v.ne[0], n_kv = k.ne[1];
    float slope = fa_slope(h, alibi, m0, m1, n_head_log2);
    for (i64 c = t; c < d; c += FD_THREADS) {
        qs[c] = ld(q, c, iq, h, b);
    }
    float acc[FA_MAX_D / FD_THREADS];
#pragma unroll
    for (int i = 0; i < FA_MAX_D / FD_THREADS; i++) {
        acc[i] = 0.0f;
    }
    float mmax = NEG_INF, sum = 0.0f;
    __syncthreads();
    for (i64 j0 = 0; j0 < n_kv; j0 += FD_THREADS) {
        i64 j = j0 + t;
        float s = NEG_INF;
        if (j < n_kv) {
            float mv = has_mask ? slope * ld(mask, j, iq, 0, 0) : 0.0f;
            if (mv != NEG_INF) {
                float dot = 0.0f;
                TLOOP_ROLLED
                for (i64 c = 0; c < d; c++) {
                    dot += qs[c] * ld(k, c, j, hk, b);
                }
                dot *= scale;
                if (softcap != 0.0f) {
                    dot = softcap * tanhf(dot);
                }
                s = dot + mv;
            }
        }
        // Every thread gets the same maximum, so the skip below is uniform across the block.
        float mnew = fmaxf(mmax, block_max(s, red));
        if (mnew == NEG_INF) {
            continue; // every key so far is masked
        }
        float p = s == NEG_INF ? 0.0f : expf(s - mnew);
        float corr = mmax == NEG_INF ? 0.0f : expf(mmax - mnew);
        ps[t] = p;
        sum = sum * corr + block_sum(p, red);
        mmax = mnew;
        __syncthreads(); // ps is complete
        i64 nj = n_kv - j0 < FD_THREADS ? n_kv - j0 : FD_THREADS;
#pragma unroll
        for (int i = 0; i < FA_MAX_D / FD_THREADS; i++) {
            i64 c = t + (i64)FD_THREADS * i;
            if (c < dv) {
                float a = acc[i] * corr;
                TLOOP_ROLLED
                for (i64 jj = 0; jj < nj; jj++) {
                    a += ps[jj] * ld(v, c, j0 + jj, hk, b);
                }
                acc[i] = a;
            }
        }
        __syncthreads(); // the next pass overwrites ps
    }
    if (has_sinks) {
        float sk = ld(sinks, h, 0, 0, 0);
        if (sk > mmax) {
            float corr = mmax == NEG_INF ? 0.0f : expf(mmax - sk);
            sum = sum * corr + 1.0f;
#pragma unroll
            for (int i = 0; i < FA_MAX_D / FD_THREADS; i++) {
                acc[i] *= corr;
            }
        } else if (sk > NEG_INF) {
            sum += expf(sk - mmax);
        }
    }
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int i = 0; i < FA_MAX_D / FD_THREADS; i++) {
        i64 c = t + (i64)FD_THREADS * i;
        if (c < dv) {
            st(dst, c, h, iq, b, acc[i] * inv);
        }
    }
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
        qs[qi][c] = iq < n_q ? ld(q, c, iq, h, b) : 0.0f;
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
        __syncthreads(); // the previous tile's readers are done
        if (threadIdx.x == 0) {
            live[0] = 0;
        }
        __syncthreads();
        // Does any (query, key) pair of the tile survive the mask?
        for (int e = threadIdx.x; e < FT_Q * FT_KT; e += FT_WARPS * 32) {
            i64 iq = q0 + e / FT_KT, j = j0 + e % FT_KT;
            if (iq < n_q && j < n_kv && (!has_mask || ld(mask, j, iq, 0, 0) != NEG_INF)) {
                live[0] = 1;
            }
        }
        __syncthreads();
        if (live[0] == 0) {
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
