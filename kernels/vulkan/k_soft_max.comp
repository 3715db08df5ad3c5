#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// softmax(a * scale + slope * mask) per row; mask row (i1, i2 % m.ne2, i3 % m.ne3). Masked
// (-inf) logits give exactly 0; a fully masked row gives zeros. One workgroup per row.
layout(buffer_reference, scalar) readonly buffer Args {
    Tensor dst; Tensor a; Tensor mask; int has_mask; float scale; int alibi; float m0; float m1; int n_head_log2;
};

// ALiBi slope of head h (m0, m1 and n_head_log2 computed on the host; slope 1 when off).
float alibi_slope(int alibi, float m0, float m1, int n_head_log2, int64_t h) {
    if (alibi == 0) {
        return 1.0;
    }
    return h < int64_t(n_head_log2) ? pow(m0, float(h + 1)) : pow(m1, float(2 * (h - int64_t(n_head_log2)) + 1));
}

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    Tensor mask = args.mask;
    int has_mask = args.has_mask;
    float scale = args.scale;
    int64_t r[4];
    unravel_row(int64_t(gl_WorkGroupID.x), a.ne, r);
    int64_t n = a.ne[0];
    int64_t tid = int64_t(gl_LocalInvocationID.x), bs = int64_t(gl_WorkGroupSize.x);
    float slope = alibi_slope(args.alibi, args.m0, args.m1, args.n_head_log2, r[2]);
    int64_t m2 = has_mask != 0 ? r[2] % mask.ne[2] : 0;
    int64_t m3 = has_mask != 0 ? r[3] % mask.ne[3] : 0;
    float mx = NEG_INF;
    for (int64_t k = tid; k < n; k += bs) {
        float v = ld(a, k, r[1], r[2], r[3]) * scale;
        if (has_mask != 0) {
            v += slope * ld(mask, k, r[1], m2, m3);
        }
        mx = fmaxf_c(mx, v);
    }
    mx = block_max(mx);
    barrier();
    float s = 0.0;
    for (int64_t k = tid; k < n; k += bs) {
        float v = ld(a, k, r[1], r[2], r[3]) * scale;
        if (has_mask != 0) {
            v += slope * ld(mask, k, r[1], m2, m3);
        }
        s += v == NEG_INF ? 0.0 : exp(v - mx);
    }
    s = block_sum(s);
    float inv = s > 0.0 ? 1.0 / s : 0.0;
    barrier();
    for (int64_t k = tid; k < n; k += bs) {
        float v = ld(a, k, r[1], r[2], r[3]) * scale;
        if (has_mask != 0) {
            v += slope * ld(mask, k, r[1], m2, m3);
        }
        st(dst, k, r[1], r[2], r[3], v == NEG_INF ? 0.0 : exp(v - mx) * inv);
    }
}
