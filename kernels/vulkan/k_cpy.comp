#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// Element-wise copy of src into dst (equal element counts). Same shapes map coordinates
// directly; different shapes map element by element in flat order. i32 never passes through f32.
// Quantized sources are dequantized here; quantized destinations use k_quantize.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor src; int same_shape; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor src = args.src;
    int same_shape = args.same_shape;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t d[4];
        unravel(e, dst.ne, d);
        int64_t s[4] = d;
        if (same_shape == 0) {
            unravel(e, src.ne, s);
        }
        if (dst.type == T_I32) {
            st_i32(dst, d[0], d[1], d[2], d[3], ld_i32(src, s[0], s[1], s[2], s[3]));
        } else {
            st(dst, d[0], d[1], d[2], d[3], ld(src, s[0], s[1], s[2], s[3]));
        }
    }
}
