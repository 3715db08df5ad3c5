// FLASH_ATTN_EXT: one warp per (query, head, batch), a single pass over the keys with an online
// softmax. q [d, n_q, h, b] f32; k [d, n_kv, h_kv, b], v [dv, n_kv, h_kv, b] (f16 or f32);
// optional mask [n_kv, >=n_q]; optional sinks f32 [h] (one more logit per head in the softmax
// denominator, as is, with no value); dst [dv, h, n_q, b] f32. d and dv are at most FA_MAX_D.
#include "common.cuh"

#define FA_WARPS 4
#define FA_MAX_D 512

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
    i64 iq = task % n_q;
    i64 h = (task / n_q) % n_head;
    i64 b = task / (n_q * n_head);
    i64 hk = h / (n_head / k.ne[2]);
    i64 d = q.ne[0], dv = v.ne[0], n_kv = k.ne[1];
    float slope = 1.0f;
    if (alibi) {
        slope = h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
    }
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
