//! Round trips through [`GgufWriter`] and [`GgufFile`], and corrupt files: each problem gives its
//! typed error and nothing panics.

use super::*;
use std::path::PathBuf;
use tessera_core::DType;

/// A path in the temp dir unique to this process and `name`; removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(name: &str) -> TempPath {
        TempPath(
            std::env::temp_dir().join(format!("tessera-gguf-{}-{name}.gguf", std::process::id())),
        )
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::from("héllo ▁ 世界 🦀")),
        ("t.u64", Value::U64(u64::MAX - 1)),
        ("t.i64", Value::I64(i64::MIN + 1)),
        ("t.f64", Value::F64(-2.5e300)),
        ("a.u8", Value::from(vec![1u8, 2, 255])),
        ("a.i8", Value::from(vec![-1i8, 0, 127])),
        ("a.u16", Value::from(vec![1u16, 65535])),
        ("a.i16", Value::from(vec![-32768i16, 7])),
        ("a.u32", Value::from(vec![7u32; 5])),
        ("a.i32", Value::from(vec![-7i32, 1, 2])),
        ("a.f32", Value::from(vec![0.5f32, -0.25, 1e10])),
        ("a.bool", Value::from(vec![true, false, true])),
        ("a.string", Value::from(vec!["a", "", "▁b", "<0x0A>"])),
        ("a.u64", Value::from(vec![u64::MAX])),
        ("a.i64", Value::from(vec![i64::MIN, 0])),
        ("a.f64", Value::from(vec![1.0f64 / 3.0])),
        ("a.empty", Value::Array(Array::empty(ValueType::F32))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::I8(vec![-1]), Array::empty(ValueType::Bool)]),
            ])),
        ),
    ]
}

/// A writer with every value type and tensors of every dtype.
fn sample_writer(alignment: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").unwrap();
    if let Some(a) = alignment {
        w.set_alignment(a).unwrap();
    }
    for (k, v) in every_value() {
        w.set(k, v).unwrap();
    }
    let shapes: [(DType, &[usize]); 6] = [
        (DType::F32, &[3, 5]),
        (DType::F16, &[7]),
        (DType::BF16, &[2, 2, 2]),
        (DType::I32, &[1, 1, 1, 3]),
        (DType::Q8_0, &[64, 3]),
        (DType::Q4_0, &[32, 2]),
    ];
    for (i, (d, ne)) in shapes.into_iter().enumerate() {
        let n = d.row_size(ne[0]).unwrap() * ne[1..].iter().product::<usize>();
        let data: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7) as u8).collect();
        w.add_tensor(&format!("t{i}.{d}"), d, ne, data).unwrap();
    }
    w
}

fn open_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes, "<test>", &ReadOptions::default())
}

fn kind(r: Result<GgufFile, GgufError>) -> GgufErrorKind {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            assert_eq!(e.file(), "<test>");
            e.into_kind()
        }
    }
}

/// Position of the first occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

/// Offset of the `offset` field of tensor `name`'s info in `bytes`.
fn tensor_offset_field(bytes: &[u8], name: &str, n_dims: usize) -> usize {
    find(bytes, name.as_bytes()) + name.len() + 4 + 8 * n_dims + 4
}

#[test]
fn round_trip_through_a_mapped_file() {
    for alignment in [None, Some(1), Some(64)] {
        let w = sample_writer(alignment);
        let path = TempPath::new(&format!("rt{alignment:?}"));
        w.write_file(&path.0).unwrap();
        let f = GgufFile::open(&path.0).unwrap();
        assert!(f.bytes().is_mapped());
        assert_eq!(f.version(), 3);
        let a = alignment.map_or(DEFAULT_ALIGNMENT, |a| a as usize);
        assert_eq!(f.alignment(), a);
        assert_eq!(f.data_offset() % a, 0);
        let (got, want): (Vec<_>, Vec<_>) =
            (f.metadata().iter().collect(), w.metadata().iter().collect());
        assert_eq!(got, want);
        assert_eq!(f.tensors().len(), 6);
        for t in f.tensors() {
            assert_eq!(t.offset() % a, 0, "{}", t.name());
            assert_eq!(t.file_range().start, f.data_offset() + t.offset());
            let d = t.dtype().unwrap();
            assert_eq!(
                t.name(),
                format!("{}.{d}", t.name().split('.').next().unwrap())
            );
            assert_eq!(
                t.nbytes(),
                d.row_size(t.ne()[0]).unwrap() * t.nelements() / t.ne()[0]
            );
            let i: usize = t.name()[1..2].parse().unwrap();
            let want: Vec<u8> = (0..t.nbytes()).map(|j| (j * 31 + i * 7) as u8).collect();
            assert_eq!(f.tensor_bytes(t.name()).unwrap(), want.as_slice());
        }
        let t = f.tensor("t4.q8_0").unwrap();
        assert_eq!(
            (t.n_dims(), t.shape(), t.ne()),
            (2, &[64, 3][..], [64, 3, 1, 1])
        );
        assert_eq!(f.tensor("t3.i32").unwrap().shape(), &[1, 1, 1, 3]);
        let mem = f.host_memory();
        assert_eq!((*mem).as_ref().len(), f.file_size());
        assert_eq!(
            &(*mem).as_ref()[t.file_range()],
            f.tensor_bytes("t4.q8_0").unwrap()
        );
    }
}

#[test]
fn version_2_reads_like_version_3() {
    let mut bytes = sample_writer(None).to_bytes();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = open_bytes(bytes).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(
        f.metadata().get_str("general.architecture").unwrap(),
        "llama"
    );
}

#[test]
fn empty_file_and_header_only_file() {
    assert!(matches!(
        kind(open_bytes(Vec::new())),
        GgufErrorKind::Truncated { .. }
    ));
    let f = open_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(f.metadata().is_empty() && f.tensors().is_empty());
    let path = TempPath::new("empty");
    std::fs::write(&path.0, b"").unwrap();
    let e = GgufFile::open(&path.0).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("tessera-gguf"), "{e}");
    let e = GgufFile::open(path.0.with_extension("missing")).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::Io(_)), "{e}");
}

#[test]
fn typed_getters_name_key_and_types() {
    let f = open_bytes(sample_writer(None).to_bytes()).unwrap();
    let md = f.metadata();
    assert_eq!(md.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(md.get_i8("t.i8").unwrap(), -100);
    assert_eq!(md.get_f64("t.f64").unwrap(), -2.5e300);
    assert!(md.get_bool("t.bool").unwrap());
    assert_eq!(md.get_str_array("a.string").unwrap()[2], "▁b");
    assert_eq!(md.get_f32_array("a.f32").unwrap(), &[0.5, -0.25, 1e10]);
    assert_eq!(md.get_uint("t.u16").unwrap(), 60000);
    assert_eq!(md.get_float("t.f32").unwrap(), 1.5e-5);
    assert_eq!(md.get_array("a.nested").unwrap().len(), 3);
    let e = md.get_u32("t.string").unwrap_err();
    assert_eq!(
        e.to_string(),
        "<test>: key t.string has type string, expected u32"
    );
    let e = md.get_str_array("a.u32").unwrap_err();
    assert_eq!(
        e.to_string(),
        "<test>: key a.u32 has type array of u32, expected array of string"
    );
    assert!(matches!(
        md.get_uint("t.i64").unwrap_err().kind(),
        GgufErrorKind::WrongType { .. }
    ));
    let e = md.get_u32("llama.block_count").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::MissingKey { key } if key == "llama.block_count"));
    let e = f.tensor_bytes("nope").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::NoSuchTensor { .. }));
}

#[test]
fn bad_magic_version_and_endianness() {
    let good = sample_writer(None).to_bytes();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(kind(open_bytes(b)), GgufErrorKind::BadMagic { found } if found == b"XGUF"));
    for (v, big) in [(1u32, false), (4, false), (3u32.swap_bytes(), true)] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        match kind(open_bytes(b)) {
            GgufErrorKind::UnsupportedVersion { version } => assert!(!big && version == v),
            GgufErrorKind::BigEndian { .. } => assert!(big),
            k => panic!("{k}"),
        }
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    let bytes = sample_writer(None).to_bytes();
    let f = open_bytes(bytes.clone()).unwrap();
    // Cutting only the padding after the last tensor leaves a valid file.
    let data_end = f
        .tensors()
        .iter()
        .map(|t| t.file_range().end)
        .max()
        .unwrap();
    for cut in 0..bytes.len() {
        match open_bytes(bytes[..cut].to_vec()) {
            Ok(_) => assert!(cut >= data_end, "cut at {cut} opened"),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    GgufErrorKind::Truncated { .. }
                        | GgufErrorKind::LengthBeyondFile { .. }
                        | GgufErrorKind::TensorBeyondEnd { .. }
                ),
                "cut at {cut}: {e}"
            ),
        }
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    // A property-style sweep: overwrite each header byte with values that break lengths, types
    // and counts; every outcome is Ok or a typed error.
    let bytes = sample_writer(None).to_bytes();
    let header_end = open_bytes(bytes.clone()).unwrap().data_offset();
    for pos in 0..header_end {
        for v in [0x00, 0x01, 0x7f, 0xff] {
            let mut b = bytes.clone();
            b[pos] = v;
            if let Err(e) = open_bytes(b) {
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

#[test]
fn huge_lengths_and_counts_are_refused_before_allocating() {
    let good = sample_writer(None).to_bytes();
    // The key length of the first entry, right after the header.
    let mut b = good.clone();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        kind(open_bytes(b)),
        GgufErrorKind::LengthBeyondFile { len: u64::MAX, .. }
    ));
    // The tensor and key counts.
    for at in [8, 16] {
        let mut b = good.clone();
        b[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(
            kind(open_bytes(b)),
            GgufErrorKind::LengthBeyondFile { .. }
        ));
    }
    // An array count: element type u32, then the count.
    let mut w = GgufWriter::new();
    w.set("big", vec![1u32, 2, 3]).unwrap();
    let mut b = w.to_bytes();
    let count_at = find(&b, b"big") + 3 + 4 + 4;
    b[count_at..count_at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    match kind(open_bytes(b)) {
        GgufErrorKind::LengthBeyondFile { what, .. } => assert!(what.contains("big"), "{what}"),
        k => panic!("{k}"),
    }
}

#[test]
fn unknown_value_types_and_deep_nesting() {
    let mut w = GgufWriter::new();
    w.set("k.one", 1u32).unwrap();
    let mut b = w.to_bytes();
    let type_at = find(&b, b"k.one") + 5;
    b[type_at..type_at + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(matches!(
        kind(open_bytes(b)),
        GgufErrorKind::UnknownValueType { key, type_id: 13 } if key == "k.one"
    ));
    let mut deep = Array::U8(vec![1]);
    for _ in 0..MAX_ARRAY_NESTING {
        deep = Array::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", deep).unwrap();
    assert!(matches!(
        kind(open_bytes(w.to_bytes())),
        GgufErrorKind::NestingTooDeep { .. }
    ));
}

#[test]
fn duplicate_keys_and_tensor_names() {
    let mut w = GgufWriter::new();
    w.set("dup.a", 1u8).unwrap();
    w.set("dup.b", 2u8).unwrap();
    let mut b = w.to_bytes();
    let at = find(&b, b"dup.b");
    b[at + 4] = b'a';
    assert!(matches!(kind(open_bytes(b)), GgufErrorKind::DuplicateKey { key } if key == "dup.a"));

    let mut w = GgufWriter::new();
    w.add_tensor("w.a", DType::F32, &[1], vec![0; 4]).unwrap();
    w.add_tensor("w.b", DType::F32, &[1], vec![0; 4]).unwrap();
    assert!(w.add_tensor("w.b", DType::F32, &[1], vec![0; 4]).is_err());
    let mut b = w.to_bytes();
    let at = find(&b, b"w.b");
    b[at + 2] = b'a';
    assert!(
        matches!(kind(open_bytes(b)), GgufErrorKind::DuplicateTensor { tensor } if tensor == "w.a")
    );
}

#[test]
fn tensor_types_name_the_ggml_type() {
    let mut w = GgufWriter::new();
    w.add_raw_tensor("blk.0.ffn_down.weight", 16, &[256, 2], vec![0u8; 132])
        .unwrap();
    let e = open_bytes(w.to_bytes()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "<test>: tensor blk.0.ffn_down.weight: unsupported tensor type IQ2_XXS (id 16)"
    );
    let f = GgufFile::from_bytes(
        w.to_bytes(),
        "<test>",
        &ReadOptions::allow_unsupported_types(),
    )
    .unwrap();
    let t = f.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((t.ggml_type().name(), t.nbytes()), ("IQ2_XXS", 132));
    assert!(matches!(
        t.dtype().unwrap_err().kind(),
        GgufErrorKind::UnsupportedTensorType { .. }
    ));
    for id in [4, 99, u32::MAX] {
        let mut w = GgufWriter::new();
        w.add_raw_tensor("x", id, &[1], vec![0u8; 4]).unwrap();
        let r = GgufFile::from_bytes(
            w.to_bytes(),
            "<test>",
            &ReadOptions::allow_unsupported_types(),
        );
        assert!(
            matches!(kind(r), GgufErrorKind::UnknownTensorType { type_id, .. } if type_id == id)
        );
    }
}

#[test]
fn bad_shapes_and_dims() {
    let mut w = GgufWriter::new();
    w.add_raw_tensor("five", 0, &[1, 1, 1, 1, 1], vec![0u8; 4])
        .unwrap();
    assert!(matches!(
        kind(open_bytes(w.to_bytes())),
        GgufErrorKind::TooManyDims { n_dims: 5, .. }
    ));
    let mut w = GgufWriter::new();
    w.add_raw_tensor("q", 8, &[33], vec![0u8; 34]).unwrap();
    assert!(matches!(
        kind(open_bytes(w.to_bytes())),
        GgufErrorKind::BadShape { .. }
    ));
    let mut w = GgufWriter::new();
    w.add_raw_tensor("big", 0, &[1 << 40, 1 << 40], vec![0u8; 4])
        .unwrap();
    assert!(matches!(
        kind(open_bytes(w.to_bytes())),
        GgufErrorKind::BadShape { .. }
    ));
    assert!(
        GgufWriter::new()
            .add_tensor("q", DType::Q8_0, &[33], vec![0u8; 34])
            .is_err()
    );
    assert!(
        GgufWriter::new()
            .add_tensor("f", DType::F32, &[2], vec![0u8; 4])
            .is_err()
    );
}

#[test]
fn tensor_data_beyond_the_end_and_misaligned_offsets() {
    let mut w = GgufWriter::new();
    w.add_tensor("a", DType::F32, &[4], vec![1u8; 16]).unwrap();
    // Declares 64 floats but carries 4: the data would run past the end of the file.
    w.add_raw_tensor("b", 0, &[64], vec![2u8; 16]).unwrap();
    match kind(open_bytes(w.to_bytes())) {
        GgufErrorKind::TensorBeyondEnd { tensor, .. } => assert_eq!(tensor, "b"),
        k => panic!("{k}"),
    }
    let mut w = GgufWriter::new();
    w.add_tensor("a", DType::F32, &[4], vec![1u8; 16]).unwrap();
    w.add_tensor("b", DType::F32, &[4], vec![2u8; 16]).unwrap();
    let mut b = w.to_bytes();
    let at = tensor_offset_field(&b, "b", 1);
    assert_eq!(b[at..at + 8], 32u64.to_le_bytes());
    b[at..at + 8].copy_from_slice(&33u64.to_le_bytes());
    assert!(matches!(
        kind(open_bytes(b.clone())),
        GgufErrorKind::MisalignedOffset {
            offset: 33,
            alignment: 32,
            ..
        }
    ));
    b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    assert!(matches!(
        kind(open_bytes(b)),
        GgufErrorKind::TensorBeyondEnd { .. }
    ));
}

#[test]
fn alignment_must_be_a_u32_power_of_two() {
    assert!(GgufWriter::new().set_alignment(48).is_err());
    assert!(GgufWriter::new().set(ALIGNMENT_KEY, 64u64).is_err());
    let mut w = GgufWriter::new();
    w.set_alignment(16).unwrap();
    let mut b = w.to_bytes();
    let at = find(&b, ALIGNMENT_KEY.as_bytes()) + ALIGNMENT_KEY.len() + 4;
    b[at..at + 4].copy_from_slice(&48u32.to_le_bytes());
    assert!(
        matches!(kind(open_bytes(b)), GgufErrorKind::InvalidValue { key, .. } if key == ALIGNMENT_KEY)
    );
}

#[test]
fn a_gguf_error_converts_into_the_core_error_and_back() {
    let e: tessera_core::Error =
        GgufFile::from_bytes(b"GGUF".to_vec(), "short.gguf", &ReadOptions::default())
            .unwrap_err()
            .into();
    assert!(matches!(e, tessera_core::Error::File(_)));
    let back = e.file_error::<GgufError>().expect("the GGUF error inside");
    assert!(back.to_string().contains("short.gguf"), "{back}");
    assert!(e.file_error::<std::io::Error>().is_none());
    assert!(
        tessera_core::Error::ReadOnly("b".into())
            .file_error::<GgufError>()
            .is_none()
    );
}
