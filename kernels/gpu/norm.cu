// Row-wise reductions: RMS_NORM, NORM, SUM_ROWS, ARGMAX, SOFT_MAX.
// One block per row (blockIdx.x = flat row over axes 1..3 of the source), blockDim.x a multiple
// of 32. Sources are read in full before a row is written, so in-place rows are safe.
#include "common.cuh"

// mode 0: RMS_NORM, x / sqrt(mean(x^2) + eps); mode 1: NORM, (x - mean) / sqrt(var + eps). With
// has_w, each output is also multiplied by w (broadcast over dst as ggml broadcasts: index modulo
// each of w's sizes): the norm and the MUL that scales it, in one launch.
__device__ __forceinline__ void norm_rows(const Tensor& dst, const Tensor& nrm, const Tensor& a, const Tensor& w,
                                          bool has_w, float eps, int mode) {
    TSHARED(float, scratch, [32]);
    i64 r[4];
    unravel_row(blockIdx.x, a.ne, r);
    i64 n = a.ne[0];
    float mean = 0.0f;
    if (mode == 1) {
        float s = 0.0f;
        for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
            s += ld(a, k, r[1], r[2], r[3]);
        }
        mean = block_sum(s, scratch) / (float)n;
    }
    float ss = 0.0f;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float v = ld(a, k, r[1], r[2], r[3]) - mean;
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float scale = rsqrtf(ss / (float)n + eps);
    __syncthreads();
    i64 w1 = has_w ? r[1] % w.ne[1] : 0, w2 = has_w ? r[2] % w.ne[2] : 0, w3 = has_w ? r[3] % w.ne[3] : 0;
    // A 64-bit remainder per element costs more than the norm: none where w spans the row.
    bool whole = has_w && w.ne[0] == n;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float y = (ld(a, k, r[1], r[2], r[3]) - mean) * scale;
        if (has_w) {
            // The norm too: another graph (a split on another device, the host) may read it. When
            // dst shares its memory, the product written last is what stays.
            st(nrm, k, r[1], r[2], r[3], y);
            y *= ld(w, whole ? k : k % w.ne[0], w1, w2, w3);
        }
        st(dst, k, r[1], r[2], r[3], y);
    }
}

extern "C" __global__ void k_norm(Tensor dst, Tensor a, float eps, int mode) {
    norm_rows(dst, dst, a, a, false, eps, mode);
}

// k_norm (into nrm) followed by MUL with w (into dst): a decode step's norms are each scaled by a
// row of weights, and the pair cost two launches.
extern "C" __global__ void k_norm_mul(Tensor dst, Tensor nrm, Tensor a, Tensor w, float eps, int mode) {
    norm_rows(dst, nrm, a, w, true, eps, mode);
}

extern "C" __global__ void k_sum_rows(Tensor dst, Tensor a) {
    TSHARED(float, scratch, [32]);
    i64 r[4];
    unravel_row(blockIdx.x, a.ne, r);
    float s = 0.0f;
    for (i64 k = threadIdx.x; k < a.ne[0]; k += blockDim.x) {
        s += ld(a, k, r[1], r[2], r[3]);
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        st(dst, 0, r[1], r[2], r[3], s);
    }
}

// Whether (v, i) beats (bv, bi): the first maximum, NaN losing to any number.
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) {
    bool vn = v != v, bn = bv != bv;
    if (vn != bn) {
        return bn;
    }
    if (vn) {
        return i < bi;
    }
    return v > bv || (v == bv && i < bi);
}

// dst[i1, i2, i3] (i32) = index of the maximum of a's row.
extern "C" __global__ void k_argmax(Tensor dst, Tensor a) {
    TSHARED(float, sv, [32]);
    TSHARED(int, si, [32]);
    i64 r[4];
    unravel_row(blockIdx.x, a.ne, r);
    float bv = __int_as_float(0x7fc00000);
    int bi = 0x7fffffff;
    for (i64 k = threadIdx.x; k < a.ne[0]; k += blockDim.x) {
        float v = ld(a, k, r[1], r[2], r[3]);
        if (argmax_better(v, (int)k, bv, bi)) {
            bv = v;
            bi = (int)k;
        }
    }
    for (int m = 16; m > 0; m >>= 1) {
        float ov = TSHFL_XOR(bv, m);
        int oi = TSHFL_XOR(bi, m);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int nwarps = (blockDim.x + 31) / 32;
        for (int w = 1; w < nwarps; w++) {
            if (argmax_better(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
        }
        st_i32(dst, r[1], r[2], r[3], 0, bi == 0x7fffffff ? 0 : bi);
    }
}

// ALiBi slope of head h (m0, m1 and n_head_log2 computed on the host; slope 1 when off).
__device__ __forceinline__ float alibi_slope(int alibi, float m0, float m1, int n_head_log2, i64 h) {
    if (!alibi) {
        return 1.0f;
    }
    return h < n_head_log2 ? powf(m0, (float)(h + 1)) : powf(m1, (float)(2 * (h - n_head_log2) + 1));
}

// softmax(a * scale + slope * mask) per row; mask row (i1, i2 % m.ne2, i3 % m.ne3). Masked
// (-inf) logits give exactly 0; a fully masked row gives zeros.
extern "C" __global__ void k_soft_max(Tensor dst, Tensor a, Tensor mask, int has_mask, float scale,
                                      int alibi, float m0, float m1, int n_head_log2) {
    TSHARED(float, scratch, [32]);
    i64 r[4];
    unravel_row(blockIdx.x, a.ne, r);
    i64 n = a.ne[0];
    float slope = alibi_slope(alibi, m0, m1, n_head_log2, r[2]);
    i64 m2 = has_mask ? r[2] % mask.ne[2] : 0;
    i64 m3 = has_mask ? r[3] % mask.ne[3] : 0;
    float mx = NEG_INF;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float v = ld(a, k, r[1], r[2], r[3]) * scale;
        if (has_mask) {
            v += slope * ld(mask, k, r[1], m2, m3);
        }
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, scratch);
    __syncthreads();
    float s = 0.0f;
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float v = ld(a, k, r[1], r[2], r[3]) * scale;
        if (has_mask) {
            v += slope * ld(mask, k, r[1], m2, m3);
        }
        s += v == NEG_INF ? 0.0f : expf(v - mx);
    }
    s = block_sum(s, scratch);
    float inv = s > 0.0f ? 1.0f / s : 0.0f;
    __syncthreads();
    for (i64 k = threadIdx.x; k < n; k += blockDim.x) {
        float v = ld(a, k, r[1], r[2], r[3]) * scale;
        if (has_mask) {
            v += slope * ld(mask, k, r[1], m2, m3);
        }
        st(dst, k, r[1], r[2], r[3], v == NEG_INF ? 0.0f : expf(v - mx) * inv);
    }
}
