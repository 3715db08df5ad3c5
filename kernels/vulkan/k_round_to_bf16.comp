#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// wire = bf16(x) and x = f32(wire): the sender keeps exactly what the receivers get.
layout(buffer_reference, scalar) readonly buffer Args { uint64_t wire; uint64_t x; int64_t n; };

void main() {
    Args a = Args(pc.args);
    uint64_t wire = a.wire, x = a.x;
    int64_t n = a.n;
    GRID_STRIDE(e, n) {
        uint64_t p = x + uint64_t(e) * 4ul;
        uint b = f2bf(ld_f32(p));
        st_u16(wire + uint64_t(e) * 2ul, b);
        st_f32(p, bf2f(b));
    }
}
