//! [`TView`]: a tensor's storage as the op kernels see it — a base pointer plus ggml strides —
//! with row-level copies in and out as f32. This and `buffer.rs` are the only places the CPU
//! backend dereferences raw memory.
//!
//! Invariant (established by `stream.rs` before a graph runs): every `TView` spans bytes inside
//! a live CPU buffer that stays locked against host access until the graph finishes. Kernels
//! partition their output rows between threads, and copy source rows into thread-local scratch
//! before writing, so in-place ops never hold overlapping references.
#![allow(unsafe_code)]

use half::{bf16, f16};
use tessera_core::{DType, TensorDesc};
use tessera_kernels::cpu as k;

thread_local! {
    /// A packed row gathered back into ggml's layout before decoding (see `read_row`).
    static UNPACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A tensor's storage: base pointer, shape and strides.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TView {
    ptr: *mut u8,
    pub ne: [usize; 4],
    pub nb: [usize; 4],
    pub dtype: DType,
    /// The tensor is stored in a packed layout of the kernels (`repack.rs`): only MUL_MAT's
    /// packed kernels and [`TView::read_row`] read it.
    pub packed: Option<(k::WeightType, k::PackLayout)>,
}

// SAFETY: a TView is an address plus layout; the invariant above makes cross-thread use sound
// because threads touch disjoint output rows and only read shared inputs.
unsafe impl Send for TView {}
// SAFETY: as for Send.
unsafe impl Sync for TView {}

impl TView {
    /// # Safety
    /// `ptr .. ptr + desc.nbytes()` must be valid for reads and writes for as long as the view is used.
    pub(crate) unsafe fn new(ptr: *mut u8, desc: &TensorDesc) -> TView {
        TView {
            ptr,
            ne: desc.ne(),
            nb: desc.nb(),
            dtype: desc.dtype(),
            packed: None,
        }
    }

    /// The address of the view's first byte (for overlap checks; never dereferenced).
    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }

    fn row_ptr(&self, i1: usize, i2: usize, i3: usize) -> *mut u8 {
        debug_assert!(i1 < self.ne[1] && i2 < self.ne[2] && i3 < self.ne[3]);
        self.ptr
            .wrapping_add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3])
    }

    /// Whether rows are stored densely (`nb[0]` is one block).
    pub(crate) fn row_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.type_size() || self.ne[0] <= 1
    }

    /// Bytes of one dense row.
    pub(crate) fn row_bytes(&self) -> usize {
        self.ne[0] / self.dtype.block_size() * self.dtype.type_size()
    }

    /// The raw bytes of row `(i1, i2, i3)`, which must be row-contiguous.
    pub(crate) fn row_raw(&self, i1: usize, i2: usize, i3: usize) -> &[u8] {
        debug_assert!(self.row_contiguous());
        // SAFETY: the row lies inside the view's span (module invariant) and is only read here.
        unsafe { std::slice::from_raw_parts(self.row_ptr(i1, i2, i3), self.row_bytes()) }
    }

    /// The bytes of `rows` consecutive rows starting at `(i1, i2, i3)` with row stride `nb[1]`:
    /// the span from the first row's start to the last row's end.
    pub(crate) fn rows_raw(&self, i1: usize, rows: usize, i2: usize, i3: usize) -> &[u8] {
        debug_assert!(rows > 0 && i1 + rows <= self.ne[1]);
        let len = (rows - 1) * self.nb[1] + self.row_bytes();
        // SAFETY: rows i1..i1+rows of plane (i2, i3) lie inside the span; read-only use.
        unsafe { std::slice::from_raw_parts(self.row_ptr(i1, i2, i3), len) }
    }

    /// Element `(i0, i1, i2, i3)` of an i32 tensor.
    pub(crate) fn get_i32(&self, i: [usize; 4]) -> i32 {
        let p = self
            .row_ptr(i[1], i[2], i[3])
            .wrapping_add(i[0] * self.nb[0]);
        // SAFETY: the element lies in the span; unaligned read because views may have any offset.
        unsafe { (p as *const i32).read_unaligned() }
    }

    /// Writes element `(i0, i1, i2, i3)` of an i32 tensor.
    pub(crate) fn set_i32(&self, i: [usize; 4], v: i32) {
        let p = self
            .row_ptr(i[1], i[2], i[3])
            .wrapping_add(i[0] * self.nb[0]);
        // SAFETY: the element lies in the span and belongs to the calling thread's output rows.
        unsafe { (p as *mut i32).write_unaligned(v) }
    }

    /// Decodes one dense row's bytes `raw` of this view's dtype into `out`.
    fn decode_raw(&self, raw: &[u8], out: &mut [f32]) {
        match self.dtype {
            DType::F32 => {
                for (o, c) in out.iter_mut().zip(raw.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            DType::F16 => match bytemuck::try_cast_slice::<u8, f16>(raw) {
                Ok(h) => k::f16_to_f32_row(h, out),
                Err(_) => out
                    .iter_mut()
                    .zip(raw.chunks_exact(2))
                    .for_each(|(o, c)| *o = f16::from_le_bytes([c[0], c[1]]).to_f32()),
            },
            DType::BF16 => match bytemuck::try_cast_slice::<u8, bf16>(raw) {
                Ok(h) => k::bf16_to_f32_row(h, out),
                Err(_) => out
                    .iter_mut()
                    .zip(raw.chunks_exact(2))
                    .for_each(|(o, c)| *o = bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            },
            DType::I32 => {
                for (o, c) in out.iter_mut().zip(raw.chunks_exact(4)) {
                    *o = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
                }
            }
            DType::Q8_0 => k::dequantize_row_q8_0(raw, out),
            DType::Q4_0 => k::dequantize_row_q4_0(raw, out),
            DType::Q5_0 => k::dequantize_row_q5_0(raw, out),
            DType::Q4_1 => k::dequantize_row_q4_1(raw, out),
            DType::Q5_1 => k::dequantize_row_q5_1(raw, out),
            DType::Q4_K => k::dequantize_row_q4_k(raw, out),
            DType::Q5_K => k::dequantize_row_q5_k(raw, out),
            DType::Q6_K => k::dequantize_row_q6_k(raw, out),
            DType::Q8_K => k::dequantize_row_q8_k(raw, out),
            DType::Q2_K => k::dequantize_row_q2_k(raw, out),
            DType::Q3_K => k::dequantize_row_q3_k(raw, out),
            DType::IQ4_NL => k::dequantize_row_iq4_nl(raw, out),
            DType::IQ4_XS => k::dequantize_row_iq4_xs(raw, out),
            DType::MXFP4 => k::dequantize_row_mxfp4(raw, out),
            _ => out.fill(f32::NAN),
        }
    }

    /// Decodes row `(i1, i2, i3)` into `out` (`ne[0]` values), whatever the dtype and `nb[0]`.
    pub(crate) fn read_row(&self, i1: usize, i2: usize, i3: usize, out: &mut [f32]) {
        let n = self.ne[0];
        let out = &mut out[..n];
        let p = self.row_ptr(i1, i2, i3);
        if let Some((wt, layout)) = self.packed {
            // Groups of rows never straddle planes (`repack::layout_for`). The row is gathered
            // into a per-thread buffer (GET_ROWS reads one per token).
            let pr = layout.rows();
            let g0 = i1 - i1 % pr;
            let group = self.rows_raw(g0, pr, i2, i3);
            UNPACKED.with_borrow_mut(|row| {
                row.resize(self.row_bytes(), 0);
                k::unpack_row(layout, wt, n, group, i1 % pr, row);
                self.decode_raw(row, out);
            });
            return;
        }
        if self.row_contiguous() {
            let raw = self.row_raw(i1, i2, i3);
            self.decode_raw(raw, out);
            return;
        }
        // Strided elements (permuted/transposed views); quantized tensors are always row-contiguous.
        for (i0, o) in out.iter_mut().enumerate() {
            let e = p.wrapping_add(i0 * self.nb[0]);
            // SAFETY: element i0 of the row lies in the span; unaligned reads of plain data.
            *o = unsafe {
                match self.dtype {
                    DType::F32 => (e as *const f32).read_unaligned(),
                    DType::F16 => (e as *const f16).read_unaligned().to_f32(),
                    DType::BF16 => (e as *const bf16).read_unaligned().to_f32(),
                    DType::I32 => (e as *const i32).read_unaligned() as f32,
                    _ => f32::NAN,
                }
            };
        }
    }

    /// Encodes `src` (`ne[0]` values) into row `(i1, i2, i3)`.
    pub(crate) fn write_row(&self, i1: usize, i2: usize, i3: usize, src: &[f32]) {
        let n = self.ne[0];
        let src = &src[..n];
        let p = self.row_ptr(i1, i2, i3);
        if self.row_contiguous() {
            // SAFETY: the row lies in the span and is one of the calling thread's output rows; no
            // other reference to it exists while this slice lives (sources were copied out first).
            let raw = unsafe { std::slice::from_raw_parts_mut(p, self.row_bytes()) };
            match self.dtype {
                DType::F32 => {
                    for (c, v) in raw.chunks_exact_mut(4).zip(src) {
                        c.copy_from_slice(&v.to_le_bytes());
                    }
                }
                DType::F16 => match bytemuck::try_cast_slice_mut::<u8, f16>(raw) {
                    Ok(h) => k::f32_to_f16_row(src, h),
                    Err(_) => raw
                        .chunks_exact_mut(2)
                        .zip(src)
                        .for_each(|(c, v)| c.copy_from_slice(&f16::from_f32(*v).to_le_bytes())),
                },
                DType::BF16 => match bytemuck::try_cast_slice_mut::<u8, bf16>(raw) {
                    Ok(h) => k::f32_to_bf16_row(src, h),
                    Err(_) => raw
                        .chunks_exact_mut(2)
                        .zip(src)
                        .for_each(|(c, v)| c.copy_from_slice(&bf16::from_f32(*v).to_le_bytes())),
                },
                DType::I32 => {
                    for (c, v) in raw.chunks_exact_mut(4).zip(src) {
                        c.copy_from_slice(&(*v as i32).to_le_bytes());
                    }
                }
                DType::Q8_0 => k::quantize_row_q8_0(src, raw),
                DType::Q4_0 => k::quantize_row_q4_0(src, raw),
                DType::Q5_0 => k::quantize_row_q5_0(src, raw),
                DType::Q4_1 => k::quantize_row_q4_1(src, raw),
                DType::Q5_1 => k::quantize_row_q5_1(src, raw),
                DType::Q4_K => k::quantize_row_q4_k(src, raw),
                DType::Q5_K => k::quantize_row_q5_k(src, raw),
                DType::Q6_K => k::quantize_row_q6_k(src, raw),
                DType::Q8_K => k::quantize_row_q8_k(src, raw),
                DType::Q2_K => k::quantize_row_q2_k(src, raw),
                DType::Q3_K => k::quantize_row_q3_k(src, raw),
                DType::IQ4_NL => k::quantize_row_iq4_nl(src, raw),
                DType::IQ4_XS => k::quantize_row_iq4_xs(src, raw),
                DType::MXFP4 => k::quantize_row_mxfp4(src, raw),
                _ => {}
            }
            return;
        }
        for (i0, v) in src.iter().enumerate() {
            let e = p.wrapping_add(i0 * self.nb[0]);
            // SAFETY: element i0 of an output row owned by this thread; unaligned plain-data writes.
            unsafe {
                match self.dtype {
                    DType::F32 => (e as *mut f32).write_unaligned(*v),
                    DType::F16 => (e as *mut f16).write_unaligned(f16::from_f32(*v)),
                    DType::BF16 => (e as *mut bf16).write_unaligned(bf16::from_f32(*v)),
                    DType::I32 => (e as *mut i32).write_unaligned(*v as i32),
                    _ => {}
                }
            }
        }
    }

    /// Copies raw row bytes (same dtype, both row-contiguous) from `src` row into this row.
    pub(crate) fn copy_row_from(&self, i: [usize; 3], src: &TView, j: [usize; 3]) {
        let n = self.row_bytes();
        let s = src.row_ptr(j[0], j[1], j[2]);
        let d = self.row_ptr(i[0], i[1], i[2]);
        // SAFETY: both rows lie in their spans; `copy` tolerates overlap (in-place copies).
        unsafe { std::ptr::copy(s, d, n) }
    }

    /// Writes f32 `vals` at elements `i0 = 0..` of column-major positions: `out[i0] = vals[i0]` for
    /// the dense f32 row `(i1, i2, i3)` starting at element `i0_start`.
    pub(crate) fn write_f32_at(
        &self,
        i0_start: usize,
        i1: usize,
        i2: usize,
        i3: usize,
        vals: &[f32],
    ) {
        debug_assert!(
            self.dtype == DType::F32 && self.nb[0] == 4 && i0_start + vals.len() <= self.ne[0]
        );
        let p = self.row_ptr(i1, i2, i3).wrapping_add(i0_start * 4);
        // SAFETY: the elements lie in the row, owned by this thread for this node; byte copy avoids
        // alignment requirements.
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr() as *const u8, p, vals.len() * 4) }
    }
}
