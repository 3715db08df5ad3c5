#version 460
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

// dst[i0, i1, i2, i3] = table[i0, ids[i1, i2, i3], i2, i3]; indices out of range raise ERR_INDEX.
layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor table; Tensor ids; uint64_t status; int64_t n; };

void main() {
    Args args = Args(pc.args);
    Tensor dst = args.dst;
    Tensor table = args.table;
    Tensor ids = args.ids;
    uint64_t status = args.status;
    int64_t n = args.n;
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, dst.ne, i);
        int idx = ld_i32(ids, i[1], i[2], i[3], 0);
        if (idx < 0 || int64_t(idx) >= table.ne[1]) {
            raise_error(status, ERR_INDEX, idx);
            continue;
        }
        if (dst.type == T_I32) {
            st_i32(dst, i[0], i[1], i[2], i[3], ld_i32(table, i[0], idx, i[2], i[3]));
        } else {
            st(dst, i[0], i[1], i[2], i[3], ld(table, i[0], idx, i[2], i[3]));
        }
    }
}
