//! MUL_MAT: activations are converted into the form the weight type wants (f32, Q8_0 blocks,
//! Q8_1 blocks for Q4_1 / Q5_1, or Q8_K super-blocks for the K-quants) in shared scratch, once
//! per node or, where the product before it left the same ones there, not at all (`schedule`);
//! then threads take (plane × row-block × column-block) chunks from the step's counter and run
//! the kernels crate's tile function on each.

use super::{Exec, ThreadScratch, row_index, split_range};
use crate::tview::TView;
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera_core::{TensorDesc, TensorId};
use tessera_kernels::cpu::{self as k, ActType, WeightType};

/// Weight rows per chunk when there is one column (GEMV): small, so all threads stay busy (and a
/// multiple of every packed layout's group of rows, so chunks of packed weights, always a
/// multiple of it, hold whole groups).
pub(crate) const GEMV_ROWS: usize = 16;
const _: () = {
    let mut i = 0;
    while i < k::PackLayout::ALL.len() {
        let rows = k::PackLayout::ALL[i].rows();
        assert!(GEMV_ROWS.is_multiple_of(rows) && GEMM_ROWS.is_multiple_of(rows));
        i += 1;
    }
};
/// Most weight rows per GEMV chunk of packed weights.
pub(crate) const PACKED_GEMV_MAX_ROWS: usize = 256;
/// Weight rows per chunk for GEMM.
pub(crate) const GEMM_ROWS: usize = 64;
/// Activation columns per chunk for GEMM.
pub(crate) const GEMM_COLS: usize = 64;

/// Shared scratch bytes for the prepared activations of MUL_MAT node `t`.
pub(crate) fn act_bytes(tensors: &[TensorDesc], t: &TensorDesc) -> usize {
    let (Some(a), Some(b)) = (t.src(0), t.src(1)) else {
        return 0;
    };
    let (a, b) = (&tensors[a.index()], &tensors[b.index()]);
    let Some(wt) = WeightType::of_dtype(a.dtype()) else {
        return 0;
    };
    k::act_row_bytes(k::act_type(wt), b.ne()[0]) * b.nrows()
}

pub(crate) fn mul_mat(
    exec: &Exec<'_>,
    node: TensorId,
    reuse_act: bool,
    counter: &AtomicUsize,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, w, x) = (exec.view(node), exec.src(node, 0), exec.src(node, 1));
    let kdim = w.ne[0];
    let Some(wt) = WeightType::of_dtype(w.dtype) else {
        // `supports` refuses such nodes before a run; report rather than compute garbage.
        if ith == 0 {
            exec.fail(format!(
                "MUL_MAT {}: no kernel for {} weights",
                exec.graph.label(node),
                w.dtype
            ));
        }
        exec.barrier.wait();
        return;
    };
    let act = k::act_type(wt);
    let arb = k::act_row_bytes(act, kdim);
    let ncols = x.ne[1] * x.ne[2] * x.ne[3];

    // Phase 1: each thread prepares a share of the activation columns, unless the product
    // before this one left the same activations in scratch (`schedule`).
    if !reuse_act {
        for c in split_range(ncols, ith, nth) {
            let (i1, i2, i3) = row_index(c, x.ne);
            let (row, _, _) = ts.rows(kdim);
            x.read_row(i1, i2, i3, row);
            // SAFETY: column `c`'s range is written by this thread alone before the barrier below.
            #[allow(unsafe_code)]
            let out = unsafe { exec.shared.slice_mut(c * arb..(c + 1) * arb) };
            prepare_column(act, row, out);
        }
        exec.barrier.wait();
    }

    // Phase 2: dynamically scheduled chunks. Weights shared by every plane (a small matrix
    // applied to each head and token: the KV caches' rotations) make one GEMM over all the
    // planes' columns, which the prepared activations already hold in plane order.
    let (m, n_plane) = (dst.ne[0], dst.ne[1]);
    let shared_w = w.ne[2] == 1 && w.ne[3] == 1;
    let planes_all = dst.ne[2] * dst.ne[3];
    let n = if shared_w {
        n_plane * planes_all
    } else {
        n_plane
    };
    let (rows_per, cols_per) = if n == 1 && w.packed.is_some() {
        // The x86 packed kernel sums each activation block once per call: larger chunks
        // amortise that (and every packed kernel's per-call setup) while leaving several chunks
        // per thread.
        let per = (m / (nth * 8)).clamp(GEMV_ROWS, PACKED_GEMV_MAX_ROWS);
        (per - per % GEMV_ROWS, 1)
    } else if n == 1 {
        (GEMV_ROWS, 1)
    } else {
        (GEMM_ROWS, GEMM_COLS)
    };
    let row_blocks = m.div_ceil(rows_per);
    let col_blocks = n.div_ceil(cols_per);
    let planes = if shared_w { 1 } else { planes_all };
    let total = planes * row_blocks * col_blocks;
    let (r2, r3) = (dst.ne[2] / w.ne[2], dst.ne[3] / w.ne[3]);
    let tile = &mut ts.tile;
    loop {
        let chunk = counter.fetch_add(1, Ordering::Relaxed);
        if chunk >= total {
            break;
        }
        let plane = chunk / (row_blocks * col_blocks);
        let rb = (chunk / col_blocks) % row_blocks;
        let cb = chunk % col_blocks;
        let (i2, i3) = (plane % dst.ne[2], plane / dst.ne[2]);
        let r0 = rb * rows_per;
        let rows = rows_per.min(m - r0);
        let c0 = cb * cols_per;
        let cols = cols_per.min(n - c0);
        let wbytes = w.rows_raw(r0, rows, i2 / r2, i3 / r3);
        let first_col = (i3 * dst.ne[2] + i2) * n + c0;
        let xbytes = exec.shared.slice(first_col * arb..(first_col + cols) * arb);
        tile_product(wt, &w, wbytes, rows, xbytes, arb, cols, tile, &mut ts.bytes);
        for c in 0..cols {
            let out = &tile[c * rows..(c + 1) * rows];
            if shared_w {
                // Column c0 + c of all the planes' columns: column `col` of plane `pl`.
                let (col, pl) = ((c0 + c) % n_plane, (c0 + c) / n_plane);
                dst.write_f32_at(r0, col, pl % dst.ne[2], pl / dst.ne[2], out);
            } else {
                dst.write_f32_at(r0, c0 + c, i2, i3, out);
            }
        }
    }
}

/// One activation column `row` in the form the weights' kernels take (`act`), into `out`.
pub(crate) fn prepare_column(act: ActType, row: &[f32], out: &mut [u8]) {
    match act {
        ActType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(row.iter()) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActType::Q8_0 | ActType::Q8_1 | ActType::Q8_K => k::prepare_act(act, row, out),
    }
}

/// `tile` (cleared, then `rows × cols`, column-major) = weight rows `wbytes` of `w` times the
/// `cols` prepared activation columns of `xbytes` (`arb` bytes each), through the packed kernel
/// when `w` is stored packed: its chunks start a group of the layout's rows and cover whole
/// groups (callers size them in multiples of [`GEMV_ROWS`]), as packed planes hold whole groups.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile_product(
    wt: WeightType,
    w: &TView,
    wbytes: &[u8],
    rows: usize,
    xbytes: &[u8],
    arb: usize,
    cols: usize,
    tile: &mut Vec<f32>,
    scratch: &mut Vec<u8>,
) {
    let kdim = w.ne[0];
    tile.clear();
    tile.resize(rows * cols, 0.0);
    if let Some((_, layout)) = w.packed {
        k::mul_mat_tile_packed(
            k::active_isa(),
            layout,
            wt,
            wbytes,
            rows,
            xbytes,
            arb,
            cols,
            kdim,
            tile,
            rows,
            scratch,
        );
    } else {
        k::mul_mat_tile(
            wt, wbytes, w.nb[1], rows, xbytes, arb, cols, kdim, tile, rows, scratch,
        );
    }
}
