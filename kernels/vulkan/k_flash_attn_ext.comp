// FLASH_ATTN_EXT (port of k_flash_attn_ext, kernels/gpu/attn.cu): one 32-invocation "warp" per
// (query, head, batch), a single pass over the keys with an online softmax; block 128.
// q [d, n_q, h, b] f32; k [d, n_kv, h_kv, b], v [dv, n_kv, h_kv, b] (f16 or f32); optional mask
// [n_kv, >=n_q] (ALiBi slope per head); optional sinks f32 [h]; dst [dv, h, n_q, b] f32.
// `scale` is already divided by softcap when softcap != 0 (as ggml). d, dv <= FA_MAX_D.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define MM_WARP_SUM 1024
#include "matmul_common.glsl"

layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) readonly buffer Args {
    Tensor dst; Tensor q; Tensor k; Tensor v; Tensor mask; int has_mask;
    float scale; float softcap; int alibi; float m0; float m1; int n_head_log2;
    Tensor sinks; int has_sinks;
};

#define FA_WARPS 4
#define FA_MAX_D 512
#define FA_ACC (FA_MAX_D / 32)

shared float qs[FA_WARPS][FA_MAX_D];

void main() {
    Args a = Args(pc.args);
    Tensor dst = a.dst, q = a.q, k = a.k, v = a.v, mask = a.mask, sinks = a.sinks;
    int has_mask = a.has_mask, has_sinks = a.has_sinks;
    float scale = a.scale, softcap = a.softcap;
    int warp = int(gl_LocalInvocationID.x) / 32, lane = int(gl_LocalInvocationID.x) % 32;
    int64_t n_q = q.ne[1], n_head = q.ne[2], n_batch = q.ne[3];
    int64_t task = int64_t(gl_WorkGroupID.x) * FA_WARPS + warp;
    // No early return (barriers below): an idle warp runs the key loop on task 0's indices and
    // reads nothing.
    bool busy = task < n_q * n_head * n_batch;
    int64_t tk = busy ? task : 0;
    int64_t iq = tk % n_q;
    int64_t h = (tk / n_q) % n_head;
    int64_t b = tk / (n_q * n_head);
    int64_t hk = h / (n_head / k.ne[2]);
    int64_t d = q.ne[0], dv = v.ne[0], n_kv = k.ne[1];
    float slope = 1.0;
    if (a.alibi != 0) {
        int nl2 = a.n_head_log2;
        slope = h < nl2 ? pow(a.m0, float(h + 1)) : pow(a.m1, float(2 * (h - nl2) + 1));
    }
    // The query as the CPU backend rounds it for keys of k's type (fa_q_rounded in attn.cu):
    // bf16 for BF16 keys, here; 8-bit blocks of 32 for block types, below.
    if (busy) {
        for (int64_t c = lane; c < d; c += 32) {
            float x = ld(q, c, iq, h, b);
            if (k.type == T_BF16) {
                x = bf2f(f2bf(x));
            }
            qs[warp][int(c)] = x;
        }
    }
    barrier();
    if (act_q8(k.type)) {
        // Each lane rounds its element of every block (d is whole blocks for block types): the
        // block's largest magnitude read from the row, the values written after every read.
        float r[FA_ACC];
        for (int t = 0; t < FA_ACC; t++) {
            int c = lane + 32 * t;
            r[t] = 0.0;
            if (busy && c < d) {
                float amax = 0.0;
                for (int i = 0; i < 32; i++) {
                    amax = max(amax, abs(qs[warp][32 * t + i]));
                }
                r[t] = q8_rounded(q8_round_of(amax), qs[warp][c]);
            }
        }
        barrier();
        for (int t = 0; t < FA_ACC; t++) {
            int c = lane + 32 * t;
            if (busy && c < d) {
                qs[warp][c] = r[t];
            }
        }
        barrier();
    }
    float acc[FA_ACC];
    for (int t = 0; t < FA_ACC; t++) {
        acc[t] = 0.0;
    }
    float mmax = NEG_INF, sum = 0.0;
    for (int64_t j = 0; j < n_kv; j++) {
        float mv = (busy && has_mask != 0) ? slope * ld(mask, j, iq, 0, 0) : 0.0;
        bool live = busy && mv != NEG_INF;
        float s = 0.0;
        if (live) {
            for (int64_t c = lane; c < d; c += 32) {
                s += qs[warp][int(c)] * ld(k, c, j, hk, b);
            }
        }
        s = mm_warp_sum(s) * scale;
        if (live) {
            if (softcap != 0.0) {
                s = softcap * tanh(s);
            }
            s += mv;
            float corr = 1.0, p = 1.0;
            if (s > mmax) {
                corr = exp(mmax - s);
                mmax = s;
            } else {
                p = exp(s - mmax);
            }
            sum = sum * corr + p;
            for (int t = 0; t < FA_ACC; t++) {
                int64_t c = lane + 32 * t;
                if (c < dv) {
                    acc[t] = acc[t] * corr + p * ld(v, c, j, hk, b);
                }
            }
        }
    }
    if (busy) {
        if (has_sinks != 0) {
            float sk = ld(sinks, h, 0, 0, 0);
            if (sk > mmax) {
                // The sink becomes the maximum: rescale what was summed (zeros if no key was seen).
                float corr = exp(mmax - sk);
                sum = sum * corr + 1.0;
                for (int t = 0; t < FA_ACC; t++) {
                    acc[t] *= corr;
                }
            } else if (sk > NEG_INF) {
                sum += exp(sk - mmax);
            }
        }
        float inv = sum > 0.0 ? 1.0 / sum : 0.0;
        for (int t = 0; t < FA_ACC; t++) {
            int64_t c = lane + 32 * t;
            if (c < dv) {
                st(dst, c, h, iq, b, acc[t] * inv);
            }
        }
    }
}
