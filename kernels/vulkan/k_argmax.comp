#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// dst[i1, i2, i3] (i32) = index of the maximum of a's row (the first maximum, NaN losing to any
// number). One workgroup per row; the CUDA warp shuffles become a shared-memory butterfly.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; };

shared float am_v[TS_RED_SIZE];
shared int am_i[TS_RED_SIZE];
shared float am_wv[32];
shared int am_wi[32];

// Whether (v, i) beats (bv, bi).
bool argmax_better(float v, int i, float bv, int bi) {
    bool vn = isnan(v), bn = isnan(bv);
    if (vn != bn) {
        return bn;
    }
    if (vn) {
        return i < bi;
    }
    return v > bv || (v == bv && i < bi);
}

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    uint t = gl_LocalInvocationID.x;
    int64_t r[4];
    unravel_row(int64_t(gl_WorkGroupID.x), a.ne, r);
    float bv = uintBitsToFloat(0x7fc00000u);
    int bi = 0x7fffffff;
    for (int64_t k = int64_t(t); k < a.ne[0]; k += int64_t(gl_WorkGroupSize.x)) {
        float v = ld(a, k, r[1], r[2], r[3]);
        if (argmax_better(v, int(k), bv, bi)) {
            bv = v;
            bi = int(k);
        }
    }
    am_v[t] = bv;
    am_i[t] = bi;
    barrier();
    for (uint m = 16u; m > 0u; m >>= 1) {
        float ov = am_v[t ^ m];
        int oi = am_i[t ^ m];
        barrier();
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
        am_v[t] = bv;
        am_i[t] = bi;
        barrier();
    }
    uint lane = t % 32u, warp = t / 32u;
    if (lane == 0u) {
        am_wv[warp] = bv;
        am_wi[warp] = bi;
    }
    barrier();
    if (t == 0u) {
        uint nwarps = (gl_WorkGroupSize.x + 31u) / 32u;
        for (uint w = 1u; w < nwarps; w++) {
            if (argmax_better(am_wv[w], am_wi[w], bv, bi)) {
                bv = am_wv[w];
                bi = am_wi[w];
            }
        }
        st_i32(dst, r[1], r[2], r[3], 0, bi == 0x7fffffff ? 0 : bi);
    }
}
