// ADD_ID (port of k_add_id, kernels/gpu/moe.cu): dst[n, n_used, T] = a[n, n_used, T] +
// b[:, ids[i, t]] (b [n, n_expert]). One invocation per destination element (grid-stride); in-place
// use (dst aliasing a) is safe. Ids outside 0..n_expert raise ERR_EXPERT with the id.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "matmul_common.glsl"

layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; Tensor b; Tensor ids; uint64_t status; int64_t n; };

void main() {
    Args p = Args(pc.args);
    Tensor dst = p.dst, ta = p.a, tb = p.b, ids = p.ids;
    uint64_t status = p.status;
    int64_t n = p.n;
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, dst.ne, i);
        int id = ld_i32(ids, i[1], i[2], 0, 0);
        if (id < 0 || int64_t(id) >= tb.ne[1]) {
            raise_error(status, ERR_EXPERT, id);
            continue;
        }
        st(dst, i[0], i[1], i[2], i[3], ld(ta, i[0], i[1], i[2], i[3]) + ld(tb, i[0], id, 0, 0));
    }
}
