#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// dst = a and b joined along dim.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; Tensor b; int dim; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor a = args.a;
    Tensor b = args.b;
    int dim = args.dim;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, dst.ne, i);
        int64_t j[4] = i;
        Tensor s;
        if (i[dim] >= a.ne[dim]) {
            j[dim] -= a.ne[dim];
            s = b;
        } else {
            s = a;
        }
        if (dst.type == T_I32) {
            st_i32(dst, i[0], i[1], i[2], i[3], ld_i32(s, j[0], j[1], j[2], j[3]));
        } else {
            st(dst, i[0], i[1], i[2], i[3], ld(s, j[0], j[1], j[2], j[3]));
        }
    }
}
