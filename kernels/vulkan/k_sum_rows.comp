#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// dst[0, i1, i2, i3] = sum of a's row. One workgroup per row.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    int64_t r[4];
    unravel_row(int64_t(gl_WorkGroupID.x), a.ne, r);
    float s = 0.0;
    for (int64_t k = int64_t(gl_LocalInvocationID.x); k < a.ne[0]; k += int64_t(gl_WorkGroupSize.x)) {
        s += ld(a, k, r[1], r[2], r[3]);
    }
    s = block_sum(s);
    if (gl_LocalInvocationID.x == 0u) {
        st(dst, 0, r[1], r[2], r[3], s);
    }
}
