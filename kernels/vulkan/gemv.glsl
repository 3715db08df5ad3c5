// Shared part of the GEMV bodies (mul_mat_vec_q.glsl, mul_mat_vec_f.glsl): dst[m, n, b2, b3] (f32)
// = w[k, m, w2, w3]^T · x[k, n, b2, b3], plane (i2, i3) of dst using weight plane (i2 / r2,
// i3 / r3). One workgroup per TS_ROWS weight rows, column and plane (row block fastest, then
// column, then plane): the plan's grid has GEMV_ROWS (4); on CPU devices the driver takes 64
// (specialization constant 7) and dispatches the grid for it. Every invocation of the workgroup
// takes its own share of k for all the rows: the activations of a step stay in registers while a
// loop runs over the rows, so each is read once per workgroup, and the row sums are reduced over
// the workgroup (reduce.glsl) at the end. Any
// workgroup size (the plan's 128, or 32 on CPU devices). Included after common.glsl,
// specialize.glsl and reduce.glsl (with TS_BLOCK_SUM4).
#ifndef TESSERA_GEMV_GLSL
#define TESSERA_GEMV_GLSL

layout(buffer_reference, scalar) readonly buffer Args { Tensor dst; Tensor w; Tensor x; int64_t r2; int64_t r3; };

#define GEMV_ROWS 4
// Rows per workgroup (the driver sets it with the grid).
layout(constant_id = 7) const int TS_ROWS = GEMV_ROWS;

// A GEMV workgroup's coordinates: its first row, the activation column and the planes.
struct Gemv {
    Tensor dst, w, x;
    int64_t row0, col, i2, i3;
    // Rows of this workgroup that exist (at most TS_ROWS).
    int nrows;
    // Address of the first weight row (row row0 + r at wr0 + r * w.nb[1]).
    uint64_t wr0;
    // The activation column.
    uint64_t xr;
    // The activation column is f32, contiguous and 16-byte aligned: read in pairs.
    bool xpairs;
};

Gemv gemv_setup() {
    Args a = Args(pc.args);
    Gemv g;
    g.dst = ts_spec(a.dst, 0);
    g.w = ts_spec(a.w, 1);
    g.x = ts_spec(a.x, 2);
    int64_t m = g.w.ne[1];
    uint rblocks = ts_u32_divisor((m + TS_ROWS - 1) / TS_ROWS);
    uint bid = gl_WorkGroupID.x;
    g.row0 = int64_t(bid % rblocks) * TS_ROWS;
    g.nrows = int(min(m - g.row0, int64_t(TS_ROWS)));
    uint rest = bid / rblocks, ncols = ts_u32_divisor(g.x.ne[1]);
    g.col = int64_t(rest % ncols);
    uint plane = rest / ncols, ne2 = ts_u32_divisor(g.dst.ne[2]);
    g.i2 = int64_t(plane % ne2);
    g.i3 = int64_t(plane / ne2);
    int64_t w2 = int64_t(uint(g.i2) / ts_u32_divisor(a.r2));
    int64_t w3 = int64_t(uint(g.i3) / ts_u32_divisor(a.r3));
    g.wr0 = row_ptr(g.w, g.row0, w2, w3);
    g.xr = row_ptr(g.x, g.col, g.i2, g.i3);
    g.xpairs = g.x.type == T_F32 && ts_layout(2, TS_ROW | TS_ALIGN16);
    return g;
}

// Activation k of the column.
float gemv_x(Gemv g, int64_t k) {
    return ld_scalar(g.xr + uint64_t(k * g.x.nb[0]), g.x.type);
}

// Activations k0 .. k0 + 1 (k0 even), in pairs where the column allows.
vec2 gemv_x2(Gemv g, int64_t k0) {
    if (g.xpairs) {
        return ld_f32x2(g.xr + uint64_t(k0 * 4));
    }
    return vec2(gemv_x(g, k0), gemv_x(g, k0 + 1));
}

// Sums the partials of rows r0 .. r0 + 3 over the workgroup (every invocation calls it) and
// stores those that exist.
void gemv_store(Gemv g, int r0, vec4 acc) {
    acc = ts_block_sum4(acc);
    int t = int(gl_LocalInvocationID.x);
    if (t < 4 && r0 + t < g.nrows) {
        st(g.dst, g.row0 + int64_t(r0 + t), g.col, g.i2, g.i3, acc[t]);
    }
}

// The per-row partials of the TS_ROWS path: zeroed, and summed and stored at the end.
#define GEMV_ACC_ZERO(acc)                                                                         \
    float acc[TS_ROWS];                                                                            \
    for (int r = 0; r < TS_ROWS; r++) {                                                            \
        acc[r] = 0.0;                                                                              \
    }
#define GEMV_STORE_ROWS(g, acc)                                                                    \
    for (int r0 = 0; r0 < TS_ROWS; r0 += 4) {                                                      \
        gemv_store(g, r0, vec4(acc[r0], acc[r0 + 1], acc[r0 + 2], acc[r0 + 3]));                   \
    }

#endif // TESSERA_GEMV_GLSL
