// Mixture-of-experts ops: MUL_MAT_ID (expert-indexed matmul), ADD_ID (per-expert biases) and
// ARGSORT (a stable sort of each row: the router's top-k).
// Expert ids outside 0..n_expert raise ERR_EXPERT in the stream's status word, with the id.
#include "common.cuh"

#define MMID_WARPS 4

// MUL_MAT_ID: dst[m, n_used, T] (f32); column (i, t) = w[:, :, ids[i, t]]^T · x[:, i % n_b, t]
// with w [k, m, n_expert] (any type `ld` reads, through the shared dequantisation of
// common.cuh; activations rounded to 8-bit blocks for the types of act_q8), x [k, n_b, T] float,
// ids i32 [n_used, T].
// One warp per (weight row, slot, token), blockDim 128. Work blocks are numbered row-block
// fastest, then slot, then token, and the grid strides over them, so any size fits one launch.
// With `local` set (expert parallelism), w holds experts first..first + ne2 only: a pair routed
// elsewhere gets a zero column and only a negative id is an error.
extern "C" __global__ void k_mul_mat_id(Tensor dst, Tensor w, Tensor x, Tensor ids, int* status,
                                        int local, i64 first) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    i64 m = w.ne[1], kdim = w.ne[0], n_expert = w.ne[2], n_used = dst.ne[1];
    i64 rblocks = (m + MMID_WARPS - 1) / MMID_WARPS;
    i64 total = rblocks * n_used * dst.ne[2];
    for (i64 blk = blockIdx.x; blk < total; blk += gridDim.x) {
        i64 row = (blk % rblocks) * MMID_WARPS + warp;
        i64 rest = blk / rblocks;
        i64 slot = rest % n_used;
        i64 tok = rest / n_used;
        // Every lane of a warp shares row, slot and token, so warps skip work whole.
        if (row >= m) {
            continue;
        }
        int id = ld_i32(ids, slot, tok, 0, 0);
        i64 e = local ? (i64)id - first : (i64)id;
        if (id < 0 || (!local && e >= n_expert)) {
            if (lane == 0) {
                raise_error(status, ERR_EXPERT, id);
            }
            continue;
        }
        if (e < 0 || e >= n_expert) {
            // A foreign expert (local form): its column is zero on this device.
            if (lane == 0) {
                st(dst, row, slot, tok, 0, 0.0f);
            }
            continue;
        }
        i64 col = slot % x.ne[1];
        float s = 0.0f;
        bool round = act_q8(w.type);
        for (i64 k = lane; k < kdim; k += 32) {
            float xv = ld(x, k, col, tok, 0);
            if (round) {
                // A step's 32 activations are one block (k is a multiple of 32 for these types),
                // rounded as llama.cpp rounds them for this weight type.
                xv = q8_rounded(q8_round_of(warp_max(fabsf(xv))), xv);
            }
            s += ld(w, k, row, e, 0) * xv;
        }
        s = warp_sum(s);
        if (lane == 0) {
            st(dst, row, slot, tok, 0, s);
        }
    }
}

// ADD_ID: dst[n, n_used, T] = a[n, n_used, T] + b[:, ids[i, t]] (b [n, n_expert]). One thread per
// destination element (grid-stride); in-place use (dst aliasing a) is safe.
extern "C" __global__ void k_add_id(Tensor dst, Tensor a, Tensor b, Tensor ids, int* status, i64 n) {
    GRID_STRIDE(e, n) {
        i64 i[4];
        unravel(e, dst.ne, i);
        int id = ld_i32(ids, i[1], i[2], 0, 0);
        if (id < 0 || (i64)id >= b.ne[1]) {
            raise_error(status, ERR_EXPERT, id);
            continue;
        }
        st(dst, i[0], i[1], i[2], i[3], ld(a, i[0], i[1], i[2], i[3]) + ld(b, i[0], id, 0, 0));
    }
}

// Longest row ARGSORT takes: the row's keys are staged in shared memory (16 KiB).
#define ARGSORT_MAX 4096

// A float's bits as an unsigned key in IEEE total order (-NaN < -inf < ... < -0 < +0 < ... <
// +inf < +NaN), as Rust's `total_cmp`.
__device__ __forceinline__ u32 order_key(float v) {
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// ARGSORT: dst[:, r] (i32) = the indices that sort row r of a, ascending or descending; ties keep
// index order (stable). One block per row (blockIdx.x = flat row), blockDim.x a multiple of 32;
// a.ne[0] <= ARGSORT_MAX. Each element's rank is the number of elements ordered before it, so the
// ranks form a permutation and dst[rank] = index needs no further pass.
extern "C" __global__ void k_argsort(Tensor dst, Tensor a, int descending) {
    TSHARED(u32, keys, [ARGSORT_MAX]);
    i64 r[4];
    unravel_row(blockIdx.x, a.ne, r);
    int n = (int)a.ne[0];
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        u32 key = order_key(ld(a, j, r[1], r[2], r[3]));
        // Descending: the complement reverses the order and keeps ties equal.
        keys[j] = descending ? ~key : key;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        u32 kj = keys[j];
        int rank = 0;
        for (int l = 0; l < n; l++) {
            u32 kl = keys[l];
            rank += (kl < kj || (kl == kj && l < j)) ? 1 : 0;
        }
        st_i32(dst, rank, r[1], r[2], r[3], j);
    }
}
