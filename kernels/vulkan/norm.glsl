// Body of k_norm and k_norm_nosg (TS_NO_SUBGROUPS: shared-memory reductions). The including
// .comp declares #version and GL_GOOGLE_include_directive.
//
// mode 0: RMS_NORM, x / sqrt(mean(x^2) + eps); mode 1: NORM, (x - mean) / sqrt(var + eps).
// One workgroup per row (gl_WorkGroupID.x = flat row over axes 1..3 of a), any block size (the
// plan's, or the driver's on CPU devices). Specialized on the mode and the argument types: dense
// tensors address the row without 64-bit division, f32 rows that are contiguous and 16-byte
// aligned are read two values per access, and the sums take subgroup arithmetic.
#ifndef TS_NO_SUBGROUPS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.glsl"
#include "specialize.glsl"
#include "reduce.glsl"

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; float eps; int mode; };

// Element k of the row at `row` of t.
float norm_ld(Tensor t, uint64_t row, int64_t k) {
    return ld_scalar(row + uint64_t(k * t.nb[0]), t.type);
}

void main() {
    Args args = Args(pc.args);
    Tensor dst = ts_spec(args.dst, 0);
    Tensor a = ts_spec(args.a, 1);
    float eps = args.eps;
    int mode = ts_int0(args.mode);
    int64_t n = a.ne[0];
    uint64_t arow, drow;
    if (ts_layout(0, TS_DENSE) && ts_layout(1, TS_DENSE)) {
        int64_t r = int64_t(gl_WorkGroupID.x);
        arow = a.data + uint64_t(r * a.nb[1]);
        drow = dst.data + uint64_t(r * dst.nb[1]);
    } else {
        int64_t r[4];
        unravel_row(int64_t(gl_WorkGroupID.x), a.ne, r);
        arow = row_ptr(a, r[1], r[2], r[3]);
        drow = row_ptr(dst, r[1], r[2], r[3]);
    }
    // Pairs 0..np of f32 rows, then single elements from 2 * np (all of them otherwise). Each
    // invocation reads and writes the same elements in every pass (in-place safe).
    bool pairs = a.type == T_F32 && dst.type == T_F32 && ts_layout(0, TS_ROW | TS_ALIGN16) &&
                 ts_layout(1, TS_ROW | TS_ALIGN16);
    int64_t tid = int64_t(gl_LocalInvocationID.x), bs = int64_t(gl_WorkGroupSize.x);
    int64_t np = pairs ? n / 2 : 0;
    float mean = 0.0;
    if (mode == 1) { // uniform: every invocation reaches ts_block_sum
        float s = 0.0;
        for (int64_t p = tid; p < np; p += bs) {
            vec2 v = ld_f32x2(arow + uint64_t(p * 8));
            s += v.x + v.y;
        }
        for (int64_t k = 2 * np + tid; k < n; k += bs) {
            s += norm_ld(a, arow, k);
        }
        mean = ts_block_sum(s) / float(n);
    }
    float ss = 0.0;
    for (int64_t p = tid; p < np; p += bs) {
        vec2 v = ld_f32x2(arow + uint64_t(p * 8)) - mean;
        ss += v.x * v.x + v.y * v.y;
    }
    for (int64_t k = 2 * np + tid; k < n; k += bs) {
        float v = norm_ld(a, arow, k) - mean;
        ss += v * v;
    }
    ss = ts_block_sum(ss);
    float scale = inversesqrt(ss / float(n) + eps);
    for (int64_t p = tid; p < np; p += bs) {
        st_f32x2(drow + uint64_t(p * 8), (ld_f32x2(arow + uint64_t(p * 8)) - mean) * scale);
    }
    for (int64_t k = 2 * np + tid; k < n; k += bs) {
        st_scalar(drow + uint64_t(k * dst.nb[0]), dst.type, (norm_ld(a, arow, k) - mean) * scale);
    }
}
