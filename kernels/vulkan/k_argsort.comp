// ARGSORT (port of k_argsort, kernels/gpu/moe.cu): dst[:, r] (i32) = the indices that sort row r of
// a, ascending or descending; ties keep index order (stable). One workgroup per row (gl_WorkGroupID.x
// = flat row), block a multiple of 32; a.ne[0] <= ARGSORT_MAX. Each element's rank is the number of
// elements ordered before it, so dst[rank] = index needs no further pass.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "matmul_common.glsl"

layout(local_size_x_id = 0) in;

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor a; int descending; };

#define ARGSORT_MAX 4096

shared uint keys[ARGSORT_MAX];

// A float's bits as an unsigned key in IEEE total order (-NaN < -inf < ... < -0 < +0 < ... < +inf <
// +NaN), as Rust's `total_cmp`.
uint order_key(float v) {
    uint b = floatBitsToUint(v);
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}

void main() {
    Args p = Args(pc.args);
    Tensor dst = p.dst, ta = p.a;
    bool descending = p.descending != 0;
    int64_t r[4];
    unravel_row(int64_t(gl_WorkGroupID.x), ta.ne, r);
    int n = int(ta.ne[0]);
    int bs = int(gl_WorkGroupSize.x);
    for (int j = int(gl_LocalInvocationID.x); j < n; j += bs) {
        uint key = order_key(ld(ta, j, r[1], r[2], r[3]));
        // Descending: the complement reverses the order and keeps ties equal.
        keys[j] = descending ? ~key : key;
    }
    barrier();
    for (int j = int(gl_LocalInvocationID.x); j < n; j += bs) {
        uint kj = keys[j];
        int rank = 0;
        // Four keys per iteration: lavapipe ends an invocation's loops after 65,535 iterations
        // in all, which a 4096-long row at 256 invocations (16 passes of 4096) would exceed.
        int l = 0;
        for (; l + 4 <= n; l += 4) {
            rank += (keys[l] < kj || (keys[l] == kj && l < j)) ? 1 : 0;
            rank += (keys[l + 1] < kj || (keys[l + 1] == kj && l + 1 < j)) ? 1 : 0;
            rank += (keys[l + 2] < kj || (keys[l + 2] == kj && l + 2 < j)) ? 1 : 0;
            rank += (keys[l + 3] < kj || (keys[l + 3] == kj && l + 3 < j)) ? 1 : 0;
        }
        for (; l < n; l++) {
            rank += (keys[l] < kj || (keys[l] == kj && l < j)) ? 1 : 0;
        }
        st_i32(dst, rank, r[1], r[2], r[3], j);
    }
}
