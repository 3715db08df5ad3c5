//! Split-state, scatter/gather and split-length tests.

use super::*;
use crate::dtype::DType;
use crate::error::Error;
use crate::graph::Context;
use crate::tensor::{Shape, TensorDesc};

fn desc(dtype: DType, shape: impl Shape) -> TensorDesc {
    let mut ctx = Context::new();
    let id = ctx.new_named("t", dtype, shape).unwrap();
    ctx.tensor(id).unwrap().clone()
}

/// Deterministic bytes (an LCG), distinct enough to catch any misplaced copy.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

fn full_size(d: &TensorDesc) -> usize {
    d.dtype().row_size(d.ne()[0]).unwrap() * d.nrows()
}

/// Scatter then gather gives back the same bytes, and every slice has its slice_desc size.
fn round_trip(d: &TensorDesc, state: &SplitState, n: usize) -> Vec<Vec<u8>> {
    let full = bytes(full_size(d), 7 + n as u64);
    let parts = scatter(d, state, n, &full).unwrap();
    assert_eq!(parts.len(), n);
    for (j, p) in parts.iter().enumerate() {
        let (ne, nb) = slice_desc(d, state, j).unwrap();
        let want = d.dtype().row_size(ne[0]).unwrap() * ne[1] * ne[2] * ne[3];
        assert_eq!(p.len(), want, "device {j} of {state}");
        assert_eq!(nb[0], d.dtype().type_size());
    }
    assert_eq!(gather(d, state, &parts).unwrap(), full, "{state}");
    parts
}

#[test]
fn round_trip_every_axis_and_dtype() {
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32] {
        let d = desc(dtype, [6, 5, 4, 3]);
        for axis in 0..4 {
            let ne = d.ne()[axis];
            for n in 1..=4 {
                for rot in 0..n {
                    let lens = split_lengths(ne, n, &[], 1, rot).unwrap();
                    let s = SplitState::axis_lens(axis, lens).unwrap();
                    round_trip(&d, &s, n);
                }
            }
            let uneven = SplitState::axis_lens(axis, vec![1, ne - 1]).unwrap();
            round_trip(&d, &uneven, 2);
        }
    }
}

#[test]
fn round_trip_segments_with_repeats_on_every_axis() {
    let d = desc(DType::F32, [12, 12, 12, 12]);
    let segs = vec![
        Segment::new(vec![2, 1, 1], 2),
        Segment::new(vec![0, 3, 1], 1),
    ];
    for axis in 0..4 {
        let s = SplitState::axis(axis, segs.clone(), 12).unwrap();
        assert_eq!(s.local_lens(), vec![4, 5, 3]);
        round_trip(&d, &s, 3);
    }
}

#[test]
fn quantized_axis0_needs_whole_blocks() {
    let d = desc(DType::Q8_0, [128, 3]);
    let s = SplitState::axis_lens(0, vec![64, 32, 32]).unwrap();
    let parts = round_trip(&d, &s, 3);
    assert_eq!(parts[0].len(), 2 * 34 * 3);
    let s1 = SplitState::axis_lens(1, vec![1, 2]).unwrap();
    round_trip(&d, &s1, 2);
    let bad = SplitState::axis_lens(0, vec![48, 80]).unwrap();
    let err = slice_desc(&d, &bad, 0).unwrap_err().to_string();
    assert!(err.contains("block"), "{err}");
    assert!(scatter(&d, &bad, 2, &vec![0; full_size(&d)]).is_err());
}

#[test]
fn fused_qkv_segments_put_each_devices_heads_together() {
    // n_embd 256, n_embd_gqa 64: rows Q0 Q1 K0 K1 V0 V1 along axis 1.
    let d = desc(DType::F32, [4, 256 + 2 * 64]);
    let s = SplitState::axis(
        1,
        vec![
            Segment::new(vec![128, 128], 1),
            Segment::new(vec![32, 32], 2),
        ],
        384,
    )
    .unwrap();
    assert_eq!(s.pieces(0), vec![(0, 128), (256, 32), (320, 32)]);
    assert_eq!(s.pieces(1), vec![(128, 128), (288, 32), (352, 32)]);
    // Each row holds its index: device 1's slice is rows 128..256, 288..320, 352..384.
    let full: Vec<u8> = (0..384u32)
        .flat_map(|r| std::iter::repeat_n(r as f32, 4))
        .flat_map(f32::to_le_bytes)
        .collect();
    let parts = scatter(&d, &s, 2, &full).unwrap();
    let rows: Vec<u32> = parts[1]
        .chunks_exact(16)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
        .collect();
    let want: Vec<u32> = (128..256).chain(288..320).chain(352..384).collect();
    assert_eq!(rows, want);
    assert_eq!(gather(&d, &s, &parts).unwrap(), full);

    // N = 3, uneven (granularity 32 per KV head group as the policy would give).
    let q = split_lengths(256, 3, &[1.0, 2.0, 1.0], 128, 0).unwrap();
    let kv = split_lengths(64, 3, &[1.0, 2.0, 1.0], 32, 0).unwrap();
    let s3 = SplitState::axis(1, vec![Segment::new(q, 1), Segment::new(kv, 2)], 384).unwrap();
    round_trip(&d, &s3, 3);
}

#[test]
fn zero_length_slices() {
    let d = desc(DType::F16, [3, 4, 2]);
    let s = SplitState::axis_lens(1, vec![0, 4, 0]).unwrap();
    let parts = round_trip(&d, &s, 3);
    assert!(parts[0].is_empty() && parts[2].is_empty());
    assert_eq!(slice_desc(&d, &s, 0).unwrap().0, [3, 0, 2, 1]);
    assert!(s.pieces(0).is_empty());
    // An empty tensor splits into empty slices.
    let e = desc(DType::F32, [0, 4]);
    round_trip(&e, &SplitState::axis_lens(0, vec![0, 0]).unwrap(), 2);
}

#[test]
fn mirrored_copies_and_reads_device_0() {
    let d = desc(DType::Q4_0, [64, 2]);
    let full = bytes(full_size(&d), 1);
    let parts = scatter(&d, &SplitState::mirrored(), 3, &full).unwrap();
    assert!(parts.iter().all(|p| *p == full));
    let mut changed = parts.clone();
    changed[2][0] ^= 1;
    assert_eq!(gather(&d, &SplitState::mirrored(), &changed).unwrap(), full);
}

#[test]
fn partial_gather_sums_and_scatter_is_exact() {
    let d = desc(DType::F32, [3]);
    let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let sum = gather(
        &d,
        &SplitState::partial(),
        &[
            f(&[1.0, 2.0, -0.0]),
            f(&[3.0, 4.0, 0.0]),
            f(&[0.5, 0.0, 0.0]),
        ],
    )
    .unwrap();
    assert_eq!(sum, f(&[4.5, 6.0, 0.0]));
    // Device 0 takes the value, the others -0.0: the sum is bit-exact, signed zeros included.
    let vals = f(&[0.1, -0.0, 3.0e38]);
    for n in 1..=8 {
        let parts = scatter(&d, &SplitState::partial(), n, &vals).unwrap();
        assert_eq!(gather(&d, &SplitState::partial(), &parts).unwrap(), vals);
    }
    let h = desc(DType::F16, [3]);
    assert!(scatter(&h, &SplitState::partial(), 2, &[0; 6]).is_err());
    assert!(gather(&h, &SplitState::partial(), &[vec![0; 6]]).is_err());
}

#[test]
fn size_and_device_count_mismatches_are_errors() {
    let d = desc(DType::F32, [4, 2]);
    let s = SplitState::axis_lens(0, vec![2, 2]).unwrap();
    assert!(matches!(
        scatter(&d, &s, 2, &[0; 5]),
        Err(Error::SizeMismatch { .. })
    ));
    assert!(scatter(&d, &s, 3, &[0; 32]).is_err());
    assert!(gather(&d, &s, &[vec![0; 16]]).is_err());
    assert!(gather(&d, &s, &[vec![0; 16], vec![0; 15]]).is_err());
    let wrong = SplitState::axis_lens(1, vec![2, 2]).unwrap();
    assert!(slice_desc(&d, &wrong, 0).is_err());
    assert!(slice_desc(&d, &s, 2).is_err());
}

#[test]
fn state_invariants_and_helpers() {
    assert!(SplitState::axis(4, vec![Segment::new(vec![1], 1)], 1).is_err());
    assert!(SplitState::axis(0, vec![], 0).is_err());
    assert!(SplitState::axis(0, vec![Segment::new(vec![1, 1], 0)], 0).is_err());
    assert!(SplitState::axis(0, vec![Segment::new(vec![], 1)], 0).is_err());
    let mixed = vec![Segment::new(vec![1, 1], 1), Segment::new(vec![1], 1)];
    assert!(SplitState::axis(0, mixed, 3).is_err());
    assert!(SplitState::axis(0, vec![Segment::new(vec![1, 2], 2)], 5).is_err());
    let s = SplitState::axis(1, vec![Segment::new(vec![1, 2], 2)], 6).unwrap();
    assert_eq!(s.n_devices(), Some(2));
    assert_eq!((s.local_len(0), s.local_len(1), s.local_len(9)), (2, 4, 0));
    assert_eq!(s.pieces(1), vec![(1, 2), (4, 2)]);
    assert_eq!(s.to_string(), "A1(1,2 x2)");
    let flat = SplitState::axis_lens(1, vec![2, 4]).unwrap();
    assert!(s.equivalent(&flat) && s != flat);
    assert!(!s.equivalent(&flat.with_axis(0)));
    assert!(!s.equivalent(&SplitState::mirrored()));
    assert_eq!(SplitState::mirrored().n_devices(), None);
    assert_eq!(SplitState::partial().to_string(), "P");
}

#[test]
fn split_lengths_follow_the_doc() {
    // 8 KV heads on N = 3: 2/3/3; the rotation moves the remainder device.
    assert_eq!(split_lengths(8, 3, &[], 1, 0).unwrap(), vec![2, 3, 3]);
    assert_eq!(split_lengths(8, 3, &[], 1, 1).unwrap(), vec![3, 2, 3]);
    assert_eq!(split_lengths(8, 3, &[], 1, 2).unwrap(), vec![3, 3, 2]);
    assert_eq!(split_lengths(8, 3, &[], 1, 5).unwrap(), vec![3, 3, 2]);
    // The same in elements of head_dim 128 with granularity 128.
    assert_eq!(
        split_lengths(1024, 3, &[], 128, 0).unwrap(),
        vec![256, 384, 384]
    );
    assert_eq!(split_lengths(8, 3, &[0.0; 3], 1, 0).unwrap(), vec![2, 3, 3]);
    // Ratios: device d gets r[d]'s share, rounded down to the granularity, whatever the rotation.
    assert_eq!(
        split_lengths(8, 3, &[1.0, 1.0, 2.0], 1, 0).unwrap(),
        vec![2, 2, 4]
    );
    assert_eq!(
        split_lengths(8, 3, &[1.0, 1.0, 2.0], 1, 1).unwrap(),
        vec![2, 2, 4]
    );
    assert_eq!(
        split_lengths(512, 2, &[3.0, 1.0], 128, 0).unwrap(),
        vec![384, 128]
    );
    // Zero-length slices are possible.
    assert_eq!(split_lengths(2, 3, &[], 1, 0).unwrap(), vec![0, 1, 1]);
    assert_eq!(
        split_lengths(256, 3, &[], 128, 0).unwrap(),
        vec![0, 128, 128]
    );
    assert_eq!(split_lengths(256, 1, &[], 128, 7).unwrap(), vec![256]);
    for (ne, n, r, g) in [
        (100usize, 2usize, vec![], 32usize),
        (8, 0, vec![], 1),
        (8, 2, vec![], 0),
        (8, 3, vec![1.0, 1.0], 1),
        (8, 2, vec![1.0, -1.0], 1),
        (8, 2, vec![1.0, f32::NAN], 1),
    ] {
        assert!(
            split_lengths(ne, n, &r, g, 0).is_err(),
            "{ne} {n} {r:?} {g}"
        );
    }
}
