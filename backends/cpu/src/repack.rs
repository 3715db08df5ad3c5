//! Weights a CPU buffer keeps in the kernels' packed layout ([`tessera_kernels::cpu::repack`]),
//! and the bookkeeping that lets every other access still see ggml's bytes.
//!
//! Only the weight buffer type packs (`Device::weight_buffer_type`), only whole tensors written
//! with `set_tensor`, and only where the packed kernels are faster: the layout is chosen per
//! weight type for the kernel level the buffer type was created under ([`PackLayout::for_isa`]:
//! 16 rows on x86 with AVX-512 VNNI, 4 on aarch64 with dotprod or i8mm). A packed tensor keeps
//! its size and place; the buffer records `(offset, len, type, k, layout)`, so every later
//! access knows the layout the bytes are in whatever level runs then. Host reads, copies out and
//! stream reads unpack the groups they touch; a write touching a packed tensor first unpacks it
//! in place for good. A graph that reads a packed tensor other than as MUL_MAT's or GET_ROWS'
//! first operand is refused (`stream.rs`), so a packed layout is never misread.

use std::collections::BTreeMap;
use std::ops::Range;
use tessera_core::TensorDesc;
use tessera_kernels::cpu::{self as k, Isa, PackLayout, WeightType};

/// The kernel level weight buffers pack for, if they pack: some weight type has a packed layout
/// whose kernels pay at the active level, and `TESSERA_CPU_REPACK` is not `0` (the opt-out, as
/// ggml's `--no-repack`).
pub(crate) fn enabled() -> Option<Isa> {
    let opted_out =
        tessera_core::settings::var("TESSERA_CPU_REPACK").is_some_and(|v| v.trim() == "0");
    let isa = k::active_isa();
    let pays = WeightType::ALL
        .iter()
        .any(|&wt| PackLayout::for_isa(isa, wt).is_some());
    (!opted_out && pays).then_some(isa)
}

/// One packed tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Packed {
    pub len: usize,
    pub wt: WeightType,
    /// Elements per row.
    pub k: usize,
    pub layout: PackLayout,
}

impl Packed {
    fn group_bytes(&self) -> usize {
        self.layout.rows() * self.wt.row_bytes(self.k)
    }
}

/// The packed layout weights of type `t` get in a buffer packing for level `isa`, if any.
pub(crate) fn layout_of(isa: Isa, t: &TensorDesc) -> Option<PackLayout> {
    PackLayout::for_isa(isa, WeightType::of_dtype(t.dtype())?)
}

/// Tensor `t` in `layout`, if it can be: a type the layout has, contiguous, rows of whole
/// blocks and a row count per plane that is a multiple of the layout's group (so groups never
/// straddle planes).
fn packed_as(t: &TensorDesc, layout: PackLayout) -> Option<Packed> {
    let wt = WeightType::of_dtype(t.dtype()).filter(|&wt| layout.packs(wt))?;
    let ne = t.ne();
    let fits = t.is_contiguous()
        && ne[0] > 0
        && ne[0].is_multiple_of(t.dtype().block_size())
        && ne[1] > 0
        && ne[1].is_multiple_of(layout.rows())
        && t.view_of().is_none();
    fits.then_some(Packed {
        len: t.nbytes(),
        wt,
        k: ne[0],
        layout,
    })
}

/// The packed form tensor `t` would get in a buffer packing for level `isa`, if it has one.
pub(crate) fn layout_for(isa: Isa, t: &TensorDesc) -> Option<Packed> {
    packed_as(t, layout_of(isa, t)?)
}

/// Packs `src` (a whole tensor in ggml's layout) for `p` into `dst` (the same length).
pub(crate) fn pack_into(p: &Packed, src: &[u8], dst: &mut [u8]) {
    let gb = p.group_bytes();
    for (s, d) in src.chunks_exact(gb).zip(dst.chunks_exact_mut(gb)) {
        k::pack_group(p.layout, p.wt, p.k, s, d);
    }
}

/// Packed tensors of a buffer by offset.
#[derive(Debug, Default)]
pub(crate) struct Regions {
    map: BTreeMap<usize, Packed>,
}

impl Regions {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Records a packed range, merged with packed neighbours of the same layout that it
    /// continues (a weight uploaded in pieces of whole groups is one packed tensor).
    pub(crate) fn insert(&mut self, offset: usize, p: Packed) {
        let (mut offset, mut p) = (offset, p);
        let same = |a: &Packed, b: &Packed| a.wt == b.wt && a.k == b.k && a.layout == b.layout;
        if let Some((&o, prev)) = self.map.range(..offset).next_back()
            && o + prev.len == offset
            && same(prev, &p)
        {
            p.len += prev.len;
            offset = o;
        }
        if let Some(next) = self.map.get(&(offset + p.len)).copied()
            && same(&next, &p)
        {
            self.map.remove(&(offset + p.len));
            p.len += next.len;
        }
        self.map.insert(offset, p);
    }

    /// Whether tensor `t` at `offset` is stored packed: it lies inside one packed range of the
    /// same type and row length, on group boundaries of that range's layout (groups are packed
    /// independently, so any run of whole groups is a packed tensor; merged neighbours and
    /// pieces uploaded separately are told apart by nothing else).
    pub(crate) fn holds(&self, offset: usize, t: &TensorDesc) -> Option<Packed> {
        let (&start, region) = self.map.range(..=offset).next_back()?;
        let want = packed_as(t, region.layout)?;
        let gb = want.group_bytes();
        let inside = offset + want.len <= start + region.len;
        let aligned = (offset - start).is_multiple_of(gb);
        (region.wt == want.wt && region.k == want.k && inside && aligned).then_some(want)
    }

    /// Packed tensors overlapping `range`, as (offset, layout).
    pub(crate) fn overlapping(&self, range: Range<usize>) -> Vec<(usize, Packed)> {
        if range.is_empty() {
            return Vec::new();
        }
        // Tensors do not overlap, so at most one starts before the range and reaches into it.
        let before = self
            .map
            .range(..range.start)
            .next_back()
            .filter(|(o, p)| **o + p.len > range.start);
        before
            .into_iter()
            .chain(self.map.range(range.start..range.end))
            .map(|(o, p)| (*o, *p))
            .collect()
    }

    pub(crate) fn remove(&mut self, offset: usize) {
        self.map.remove(&offset);
    }
}

/// Rewrites `dst`, a copy of the buffer bytes `at..at + dst.len()`, so that the parts inside the
/// packed tensor `p` at `offset` read as ggml's layout. `mem` is the packed tensor's bytes.
pub(crate) fn unpack_into(offset: usize, p: &Packed, mem: &[u8], at: usize, dst: &mut [u8]) {
    let gb = p.group_bytes();
    let lo = at.max(offset);
    let hi = (at + dst.len()).min(offset + p.len);
    if lo >= hi {
        return;
    }
    let mut group = vec![0u8; gb];
    for g in (lo - offset) / gb..(hi - offset).div_ceil(gb) {
        let gs = offset + g * gb;
        k::unpack_group(p.layout, p.wt, p.k, &mem[g * gb..(g + 1) * gb], &mut group);
        let (a, b) = (gs.max(lo), (gs + gb).min(hi));
        dst[a - at..b - at].copy_from_slice(&group[a - gs..b - gs]);
    }
}

/// Unpacks a whole packed tensor in place (`mem` is its bytes).
pub(crate) fn unpack_in_place(p: &Packed, mem: &mut [u8]) {
    let gb = p.group_bytes();
    let mut group = vec![0u8; gb];
    for chunk in mem.chunks_exact_mut(gb) {
        k::unpack_group(p.layout, p.wt, p.k, chunk, &mut group);
        chunk.copy_from_slice(&group);
    }
}
