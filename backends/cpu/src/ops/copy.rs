//! Data movement: CONT/CPY (with dtype conversion), GET_ROWS, SET_ROWS, CONCAT.

use super::{Exec, ThreadScratch, my_rows, split_range};
use tessera_core::{DType, TensorId};

/// Element `e` (flat, natural order) of a tensor of shape `ne`, as coordinates.
fn unflatten(mut e: usize, ne: [usize; 4]) -> [usize; 4] {
    let mut i = [0; 4];
    for d in 0..4 {
        i[d] = e % ne[d];
        e /= ne[d];
    }
    i
}

pub(crate) fn cpy(exec: &Exec<'_>, node: TensorId, ith: usize, nth: usize, ts: &mut ThreadScratch) {
    let (dst, src) = (exec.view(node), exec.src(node, 0));
    let same_shape = src.ne == dst.ne;
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        if same_shape && src.dtype == dst.dtype && src.row_contiguous() && dst.row_contiguous() {
            dst.copy_row_from([i1, i2, i3], &src, [i1, i2, i3]);
        } else if src.dtype == DType::I32 {
            // i32 never round-trips through f32 (values above 2^24 would change).
            for i0 in 0..dst.ne[0] {
                let s = if same_shape {
                    [i0, i1, i2, i3]
                } else {
                    unflatten(flat(i0, i1, i2, i3, dst.ne), src.ne)
                };
                dst.set_i32([i0, i1, i2, i3], src.get_i32(s));
            }
        } else if same_shape {
            let (x, _, _) = ts.rows(dst.ne[0]);
            src.read_row(i1, i2, i3, x);
            dst.write_row(i1, i2, i3, x);
        } else {
            // Different shapes with equal element counts: map element by element in flat order.
            let (x, row, _) = ts.rows(dst.ne[0].max(src.ne[0]));
            let mut cached: Option<[usize; 3]> = None;
            for (i0, xv) in x[..dst.ne[0]].iter_mut().enumerate() {
                let s = unflatten(flat(i0, i1, i2, i3, dst.ne), src.ne);
                if cached != Some([s[1], s[2], s[3]]) {
                    src.read_row(s[1], s[2], s[3], row);
                    cached = Some([s[1], s[2], s[3]]);
                }
                *xv = row[s[0]];
            }
            dst.write_row(i1, i2, i3, x);
        }
    }
}

fn flat(i0: usize, i1: usize, i2: usize, i3: usize, ne: [usize; 4]) -> usize {
    ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0
}

pub(crate) fn get_rows(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, table, ids) = (exec.view(node), exec.src(node, 0), exec.src(node, 1));
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        let idx = ids.get_i32([i1, i2, i3, 0]);
        if idx < 0 || idx as usize >= table.ne[1] {
            exec.fail(format!(
                "GET_ROWS {}: index {idx} at [{i1}, {i2}, {i3}] is outside 0..{}",
                exec.graph.label(node),
                table.ne[1]
            ));
            continue;
        }
        let row = idx as usize;
        if table.dtype == DType::I32 {
            for i0 in 0..dst.ne[0] {
                dst.set_i32([i0, i1, i2, i3], table.get_i32([i0, row, i2, i3]));
            }
        } else {
            let (x, _, _) = ts.rows(dst.ne[0]);
            table.read_row(row, i2, i3, x);
            dst.write_row(i1, i2, i3, x);
        }
    }
}

pub(crate) fn set_rows(
    exec: &Exec<'_>,
    node: TensorId,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, src, ids) = (exec.view(node), exec.src(node, 0), exec.src(node, 1));
    // Whole planes per thread: duplicate indices within a plane are then written in order by one
    // thread (last wins), never raced.
    for plane in split_range(src.ne[2] * src.ne[3], ith, nth) {
        let (i2, i3) = (plane % src.ne[2], plane / src.ne[2]);
        for i1 in 0..src.ne[1] {
            let idx = ids.get_i32([i1, i2 % ids.ne[1], i3 % ids.ne[2], 0]);
            if idx < 0 || idx as usize >= dst.ne[1] {
                exec.fail(format!(
                    "SET_ROWS {}: index {idx} at row {i1} is outside 0..{}",
                    exec.graph.label(node),
                    dst.ne[1]
                ));
                continue;
            }
            let (x, _, _) = ts.rows(src.ne[0]);
            src.read_row(i1, i2, i3, x);
            dst.write_row(idx as usize, i2, i3, x);
        }
    }
}

pub(crate) fn concat(
    exec: &Exec<'_>,
    node: TensorId,
    dim: usize,
    ith: usize,
    nth: usize,
    ts: &mut ThreadScratch,
) {
    let (dst, a, b) = (exec.view(node), exec.src(node, 0), exec.src(node, 1));
    for (i1, i2, i3) in my_rows(dst.ne, ith, nth) {
        if dst.dtype == DType::I32 {
            // Element copies: i32 must not pass through f32.
            for i0 in 0..dst.ne[0] {
                let mut i = [i0, i1, i2, i3];
                let v = if i[dim] < a.ne[dim] {
                    a.get_i32(i)
                } else {
                    i[dim] -= a.ne[dim];
                    b.get_i32(i)
                };
                dst.set_i32([i0, i1, i2, i3], v);
            }
            continue;
        }
        let (x, y, _) = ts.rows(dst.ne[0]);
        if dim == 0 {
            a.read_row(i1, i2, i3, x);
            b.read_row(i1, i2, i3, y);
            let na = a.ne[0];
            x[na..dst.ne[0]].copy_from_slice(&y[..dst.ne[0] - na]);
        } else {
            let mut i = [0, i1, i2, i3];
            if i[dim] < a.ne[dim] {
                a.read_row(i[1], i[2], i[3], x);
            } else {
                i[dim] -= a.ne[dim];
                b.read_row(i[1], i[2], i[3], x);
            }
        }
        dst.write_row(i1, i2, i3, x);
    }
}
