// ROPE, normal (adjacent pairs) and NeoX (halves) modes, with ggml's theta schedule and optional
// per-pair frequency factors (has_freqs: pair i turns by theta_i / freqs[i]).
// One thread per slot of a row: slots below n_dims/2 rotate one pair (read both, then write
// both, so in-place rows are safe); the remaining slots copy two elements of the unrotated tail.
#include "common.cuh"

extern "C" __global__ void k_rope(Tensor dst, Tensor a, Tensor pos, Tensor freqs, int has_freqs,
                                  int n_dims, int neox, double theta_scale, double freq_scale,
                                  i64 slots_per_row, i64 n) {
    GRID_STRIDE(e, n) {
        i64 slot = e % slots_per_row;
        i64 r[4];
        unravel_row(e / slots_per_row, a.ne, r);
        i64 half = n_dims / 2;
        if (slot < half) {
            int p = ld_i32(pos, r[2], 0, 0, 0);
            double theta = (double)p * freq_scale * pow(theta_scale, (double)slot);
            if (has_freqs) theta /= (double)ld(freqs, slot, 0, 0, 0);
            float c = (float)cos(theta), s = (float)sin(theta);
            i64 j0 = neox ? slot : 2 * slot;
            i64 j1 = neox ? slot + half : 2 * slot + 1;
            float x0 = ld(a, j0, r[1], r[2], r[3]);
            float x1 = ld(a, j1, r[1], r[2], r[3]);
            st(dst, j0, r[1], r[2], r[3], x0 * c - x1 * s);
            st(dst, j1, r[1], r[2], r[3], x0 * s + x1 * c);
        } else {
            i64 j = n_dims + 2 * (slot - half);
            for (i64 t = j; t < j + 2 && t < a.ne[0]; t++) {
                st(dst, t, r[1], r[2], r[3], ld(a, t, r[1], r[2], r[3]));
            }
        }
    }
}
