#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// src's rows written into dst at row ids[i1, i2 % ids.ne1, i3 % ids.ne2]. One invocation per
// (element of a row, plane) walks the rows in order, so duplicate indices end with the last row
// (as on the CPU) without races.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor src; Tensor ids; uint64_t status; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor src = args.src;
    Tensor ids = args.ids;
    uint64_t status = args.status;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t i0 = e % src.ne[0];
        int64_t plane = e / src.ne[0];
        int64_t i2 = plane % src.ne[2];
        int64_t i3 = plane / src.ne[2];
        for (int64_t i1 = 0; i1 < src.ne[1]; i1++) {
            int idx = ld_i32(ids, i1, i2 % ids.ne[1], i3 % ids.ne[2], 0);
            if (idx < 0 || int64_t(idx) >= dst.ne[1]) {
                raise_error(status, ERR_INDEX, idx);
                continue;
            }
            st(dst, i0, idx, i2, i3, ld(src, i0, i1, i2, i3));
        }
    }
}
