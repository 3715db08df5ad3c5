// Body of k_mul_mat_vec_f (GEMV for float weights, port of k_mul_mat_vec_f in
// kernels/gpu/matmul.cu) and k_mul_mat_vec_f_nosg (TS_NO_SUBGROUPS). The including .comp
// declares #version and GL_GOOGLE_include_directive.
//
// Geometry and sums: gemv.glsl. Specialized on the weight type: where the weight rows are
// contiguous and 16-byte aligned each invocation takes sixteen weights per step, one 8-byte word
// of f16 / bf16 or two of f32 per four, and the activations in pairs; the rest (and other
// layouts) one by one.
#ifndef TS_NO_SUBGROUPS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "specialize.glsl"
#define TS_BLOCK_SUM4 1
#include "reduce.glsl"
#include "gemv.glsl"

// Weights 4c .. 4c + 3 of the row at `row` (contiguous, 16-byte aligned).
vec4 gemv_w4(uint64_t row, int wt, int64_t c) {
    if (wt == T_F32) {
        return vec4(ld_f32x2(row + uint64_t(c * 16)), ld_f32x2(row + uint64_t(c * 16 + 8)));
    }
    uvec2 u = unpack32(TsU64(row + uint64_t(c * 8)).v);
    if (wt == T_F16) {
        return vec4(h2f(u.x & 0xffffu), h2f(u.x >> 16), h2f(u.y & 0xffffu), h2f(u.y >> 16));
    }
    return vec4(bf2f(u.x), bf2f(u.x >> 16), bf2f(u.y), bf2f(u.y >> 16));
}

// Activations 4c .. 4c + 3.
vec4 gemv_x4(Gemv g, int64_t c) {
    return vec4(gemv_x2(g, 4 * c), gemv_x2(g, 4 * c + 2));
}

float gemv_dot4(vec4 wv, vec4 xv) {
    float s = wv.x * xv.x;
    s += wv.y * xv.y;
    s += wv.z * xv.z;
    s += wv.w * xv.w;
    return s;
}

void main() {
    Gemv g = gemv_setup();
    int wt = g.w.type;
    int64_t kdim = g.w.ne[0];
    int64_t tid = int64_t(gl_LocalInvocationID.x), bs = int64_t(gl_WorkGroupSize.x);
    GEMV_ACC_ZERO(acc)
    uint64_t stride = uint64_t(g.w.nb[1]);
    // Steps of 16 weights (four words of f16 / bf16, eight of f32) with their activations in
    // registers, on contiguous 16-byte aligned rows; the rest one by one.
    bool wide = (wt == T_F32 || wt == T_F16 || wt == T_BF16) && ts_layout(1, TS_ROW | TS_ALIGN16);
    int64_t n16 = wide ? kdim / 16 : 0;
    for (int64_t c = tid; c < n16; c += bs) {
        vec4 xv[4];
        [[unroll]] for (int i = 0; i < 4; i++) {
            xv[i] = gemv_x4(g, 4 * c + i);
        }
        uint64_t wrow = g.wr0;
        for (int r = 0; r < g.nrows; r++) {
            float part = 0.0;
            [[unroll]] for (int i = 0; i < 4; i++) {
                part += gemv_dot4(gemv_w4(wrow, wt, 4 * c + i), xv[i]);
            }
            acc[r] += part;
            wrow += stride;
        }
    }
    for (int64_t k = 16 * n16 + tid; k < kdim; k += bs) {
        float xv = gemv_x(g, k);
        uint64_t wrow = g.wr0;
        for (int r = 0; r < g.nrows; r++) {
            acc[r] += ld_scalar(wrow + uint64_t(k * g.w.nb[0]), wt) * xv;
            wrow += stride;
        }
    }
    GEMV_STORE_ROWS(g, acc)
}
