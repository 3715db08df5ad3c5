#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// dst += src (f32 dst, bf16 wire values).
layout(buffer_reference, scalar) readonly buffer Args { uint64_t dst; uint64_t src; int64_t n; };

void main() {
    Args a = Args(pc.args);
    uint64_t dst = a.dst, src = a.src;
    int64_t n = a.n;
    GRID_STRIDE(e, n) {
        uint64_t d = dst + uint64_t(e) * 4ul;
        st_f32(d, ld_f32(d) + bf2f(ld_u16(src + uint64_t(e) * 2ul)));
    }
}
