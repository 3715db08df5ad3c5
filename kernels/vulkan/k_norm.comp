#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// mode 0: RMS_NORM, x / sqrt(mean(x^2) + eps); mode 1: NORM, (x - mean) / sqrt(var + eps).
// One workgroup per row (gl_WorkGroupID.x = flat row over axes 1..3 of a).
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; float eps; int mode; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    float eps = args.eps;
    int mode = args.mode;
    int64_t r[4];
    unravel_row(int64_t(gl_WorkGroupID.x), a.ne, r);
    int64_t n = a.ne[0];
    int64_t tid = int64_t(gl_LocalInvocationID.x), bs = int64_t(gl_WorkGroupSize.x);
    float mean = 0.0;
    if (mode == 1) { // uniform: every invocation reaches block_sum
        float s = 0.0;
        for (int64_t k = tid; k < n; k += bs) {
            s += ld(a, k, r[1], r[2], r[3]);
        }
        mean = block_sum(s) / float(n);
    }
    float ss = 0.0;
    for (int64_t k = tid; k < n; k += bs) {
        float v = ld(a, k, r[1], r[2], r[3]) - mean;
        ss += v * v;
    }
    ss = block_sum(ss);
    float scale = inversesqrt(ss / float(n) + eps);
    barrier();
    for (int64_t k = tid; k < n; k += bs) {
        st(dst, k, r[1], r[2], r[3], (ld(a, k, r[1], r[2], r[3]) - mean) * scale);
    }
}
