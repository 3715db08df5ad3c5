#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// SWIGLU_OAI (gpt-oss): dst = g*sigmoid(alpha*g)*(u + 1), g = min(gate a, limit), u = up b clamped
// to +-limit; a, b and dst of one shape.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; Tensor b; float alpha; float limit; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    Tensor b = args.b;
    float alpha = args.alpha, limit = args.limit;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, dst.ne, i);
        float g = fminf_c(ld(a, i[0], i[1], i[2], i[3]), limit);
        float u = fminf_c(fmaxf_c(ld(b, i[0], i[1], i[2], i[3]), -limit), limit);
        st(dst, i[0], i[1], i[2], i[3], g / (1.0 + exp(-alpha * g)) * (u + 1.0));
    }
}
