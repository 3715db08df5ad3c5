#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "elementwise_funcs.glsl"

// dst = act(gate) * up. With has_b, gate is a and up is b (same shape as dst); otherwise gate and
// up are the two halves of a's rows (swapped: the up half comes first).

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; Tensor b; int has_b; int act; int swapped; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    Tensor b = args.b;
    int has_b = args.has_b, act = args.act, swapped = args.swapped;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, dst.ne, i);
        float g, u;
        if (has_b != 0) {
            g = ld(a, i[0], i[1], i[2], i[3]);
            u = ld(b, i[0], i[1], i[2], i[3]);
        } else {
            int64_t nc = dst.ne[0];
            float lo = ld(a, i[0], i[1], i[2], i[3]);
            float hi = ld(a, i[0] + nc, i[1], i[2], i[3]);
            g = swapped != 0 ? hi : lo;
            u = swapped != 0 ? lo : hi;
        }
        float r = (act == GLU_SWIGLU ? silu(g) : gelu(g)) * u;
        st(dst, i[0], i[1], i[2], i[3], r);
    }
}
