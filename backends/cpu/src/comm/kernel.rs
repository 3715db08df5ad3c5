//! The comm's one kernel: sum N f32 ranges element-wise, in a fixed order, and store the result
//! to M ranges in the same pass.
//!
//! Writing every destination from the registers that hold the sum is what fuses the reduce and
//! the gather: a device reads its chunk of every slice once and writes it once per slice, 2·S
//! bytes of traffic per device for an S-byte all-reduce, where reduce-then-copy moves 3·S.
//! Large reductions use streaming (non-temporal) stores, which skip the read-for-ownership of
//! lines that will be overwritten whole and would only evict useful data from the caches.
//!
//! Every path adds the sources in the order given, one IEEE add per source, so the AVX-512 and
//! portable paths give bit-identical results (the tests check it).
#![allow(unsafe_code)]

/// f32 values in one 64-byte cache line. Work is split at multiples of it so that no two threads
/// write the same line.
pub(crate) const LINE: usize = 16;

/// Which implementation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Plain Rust on blocks of one cache line (the compiler vectorises it with the baseline ISA).
    Portable,
    /// AVX-512F loads and adds, with optional streaming stores.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The best kernel for this CPU, honouring `TESSERA_CPU_ISA` (detected once).
    pub(crate) fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
            *BEST.get_or_init(|| {
                let isa = tessera_kernels::cpu::active_isa();
                if isa == tessera_kernels::cpu::Isa::Avx512
                    && std::arch::is_x86_feature_detected!("avx512f")
                {
                    Kernel::Avx512
                } else {
                    Kernel::Portable
                }
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Kernel::Portable
    }
}

/// Stores `srcs[0][i] + srcs[1][i] + …` (added left to right) into `dsts[k][i]` for every `k` and
/// every `i < len`; zeros when `srcs` is empty. `streaming` asks for non-temporal stores (only
/// the AVX-512 kernel has them, and only where every destination has the same offset within a
/// cache line; otherwise regular stores are used); a store fence ends the call, so a later
/// release store publishes the values to other threads.
///
/// # Safety
/// - Each `srcs[s]` is valid for reads, and each `dsts[k]` for writes, of `len` f32 values.
/// - A destination range is either identical to one or more source ranges or overlaps none;
///   destination ranges are pairwise identical or disjoint. (Each block of values is loaded
///   from every source before it is stored anywhere, so in-place sums are exact.)
/// - No other thread accesses any of these ranges during the call.
pub(crate) unsafe fn reduce(
    kernel: Kernel,
    srcs: &[*const f32],
    dsts: &[*mut f32],
    len: usize,
    streaming: bool,
) {
    match kernel {
        // SAFETY: the caller's contract is this function's.
        Kernel::Portable => unsafe { reduce_portable(srcs, dsts, 0, len) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel::Avx512` is only produced after detecting AVX-512F (`Kernel::best`, or a
        // test that checks detection first); the pointer contract is the caller's.
        Kernel::Avx512 => unsafe { reduce_avx512(srcs, dsts, len, streaming) },
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = streaming;
}

/// Values `from..len` of every range.
///
/// # Safety
/// As [`reduce`].
unsafe fn reduce_portable(srcs: &[*const f32], dsts: &[*mut f32], from: usize, len: usize) {
    let mut i = from;
    while i < len {
        let n = LINE.min(len - i);
        let mut acc = [0f32; LINE];
        if let Some((first, rest)) = srcs.split_first() {
            for (k, a) in acc[..n].iter_mut().enumerate() {
                // SAFETY: i + k < len, inside the source range.
                *a = unsafe { first.add(i + k).read() };
            }
            for s in rest {
                for (k, a) in acc[..n].iter_mut().enumerate() {
                    // SAFETY: as above.
                    *a += unsafe { s.add(i + k).read() };
                }
            }
        }
        for d in dsts {
            for (k, a) in acc[..n].iter().enumerate() {
                // SAFETY: i + k < len, inside the destination range; every source value of this
                // block has been read above.
                unsafe { d.add(i + k).write(*a) };
            }
        }
        i += n;
    }
}

/// # Safety
/// As [`reduce`], and the CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn reduce_avx512(srcs: &[*const f32], dsts: &[*mut f32], len: usize, streaming: bool) {
    use std::arch::x86_64::*;
    let Some(&d0) = dsts.first() else { return };
    let misalign = d0 as usize % 64;
    let streaming = streaming && dsts.iter().all(|&d| d as usize % 64 == misalign);
    // Streaming stores need 64-byte aligned addresses: the values before the first line boundary
    // go through the portable path (f32 pointers are 4-byte aligned, so this is whole values).
    let head = if streaming {
        ((64 - misalign) % 64 / 4).min(len)
    } else {
        0
    };
    // SAFETY: the first `head` values of every range (head <= len).
    unsafe { reduce_portable(srcs, dsts, 0, head) };
    let mut i = head;
    // One block is four registers (four cache lines): enough loads in flight to stream.
    const BLOCK: usize = 4 * LINE;
    while i + BLOCK <= len {
        let mut acc = [_mm512_setzero_ps(); 4];
        if let Some((first, rest)) = srcs.split_first() {
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + BLOCK <= len; unaligned load.
                *a = unsafe { _mm512_loadu_ps(first.add(i + k * LINE)) };
            }
            for s in rest {
                for (k, a) in acc.iter_mut().enumerate() {
                    // SAFETY: as above.
                    *a = _mm512_add_ps(*a, unsafe { _mm512_loadu_ps(s.add(i + k * LINE)) });
                }
            }
        }
        for &d in dsts {
            for (k, a) in acc.iter().enumerate() {
                // SAFETY: in range as above; when streaming, d + i is 64-byte aligned (same
                // misalignment for every destination, and `head` reached the line boundary).
                unsafe {
                    if streaming {
                        _mm512_stream_ps(d.add(i + k * LINE), *a)
                    } else {
                        _mm512_storeu_ps(d.add(i + k * LINE), *a)
                    }
                }
            }
        }
        i += BLOCK;
    }
    // SAFETY: the remaining values `i..len` of every range.
    unsafe { reduce_portable(srcs, dsts, i, len) };
    if streaming {
        // Streaming stores are weakly ordered: fence them before the caller's release store.
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels() -> Vec<Kernel> {
        #[allow(unused_mut)]
        let mut k = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            k.push(Kernel::Avx512);
        }
        k
    }

    /// Runs the kernel in place over `bufs` (every buffer is a source unless silent, and every
    /// buffer is a destination) starting at value `start` of each.
    fn run(kernel: Kernel, bufs: &mut [Vec<f32>], silent: &[usize], start: usize, streaming: bool) {
        let len = bufs[0].len() - start;
        let dsts: Vec<*mut f32> = bufs.iter_mut().map(|b| b[start..].as_mut_ptr()).collect();
        let srcs: Vec<*const f32> = (0..dsts.len())
            .filter(|d| !silent.contains(d))
            .map(|d| dsts[d] as *const f32)
            .collect();
        // SAFETY: every range is `len` values of a live Vec; sources and destinations are the same
        // buffers (identical ranges); no other thread runs.
        unsafe { reduce(kernel, &srcs, &dsts, len, streaming) };
    }

    #[test]
    fn every_kernel_and_store_kind_is_bit_identical_to_the_scalar_sum() {
        // Values with many significant bits, so any change of operand order shows.
        let val = |d: usize, i: usize| {
            let x = ((i as u64 * 2654435761 + d as u64 * 40503) % 1_000_003) as f32;
            (x / 997.0 - 500.0) * (1.0 + d as f32 / 3.0)
        };
        for n in 1..=5usize {
            for len in [0usize, 1, 15, 16, 17, 63, 64, 65, 1000, 4099] {
                for start in [0usize, 1, 3] {
                    for silent in [vec![], vec![0], (0..n).collect()] {
                        let total = len + start;
                        let fresh = || -> Vec<Vec<f32>> {
                            (0..n)
                                .map(|d| {
                                    (0..total)
                                        .map(|i| {
                                            if silent.contains(&d) {
                                                f32::NAN
                                            } else {
                                                val(d, i)
                                            }
                                        })
                                        .collect()
                                })
                                .collect()
                        };
                        let want: Vec<f32> = (start..total)
                            .map(|i| {
                                let mut it = (0..n).filter(|d| !silent.contains(d));
                                match it.next() {
                                    Some(first) => it.fold(val(first, i), |a, d| a + val(d, i)),
                                    None => 0.0,
                                }
                            })
                            .collect();
                        for kernel in kernels() {
                            for streaming in [false, true] {
                                let mut bufs = fresh();
                                run(kernel, &mut bufs, &silent, start, streaming);
                                for (d, b) in bufs.iter().enumerate() {
                                    let got: Vec<u32> =
                                        b[start..].iter().map(|v| v.to_bits()).collect();
                                    let exp: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                                    assert!(
                                        got == exp,
                                        "{kernel:?} streaming={streaming} n={n} len={len} start={start} silent={silent:?} buffer {d}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn values_outside_the_range_are_untouched() {
        for kernel in kernels() {
            for streaming in [false, true] {
                let mut a = vec![1.0f32; 200];
                let mut b = vec![2.0f32; 200];
                let dsts = [a[5..].as_mut_ptr(), b[5..].as_mut_ptr()];
                let srcs = dsts.map(|d| d as *const f32);
                // SAFETY: 190 values from index 5 lie inside both 200-value Vecs.
                unsafe { reduce(kernel, &srcs, &dsts, 190, streaming) };
                for v in [&a, &b] {
                    assert!(v[5..195].iter().all(|&x| x == 3.0), "{kernel:?}");
                }
                assert!(a[..5].iter().chain(&a[195..]).all(|&x| x == 1.0));
                assert!(b[..5].iter().chain(&b[195..]).all(|&x| x == 2.0));
            }
        }
    }
}
