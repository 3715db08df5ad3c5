//! The numbers the host and the GPU kernels agree on: element type codes and block sizes, the
//! operation codes of the element-wise kernels, and the error codes kernels raise. This table is
//! their one source. The kernels read them as `#define`s from `kernels/gpu/codes.cuh` (CUDA C,
//! HIP, SYCL) and `kernels/vulkan/codes.glsl` (Vulkan), both generated from it:
//!
//! ```text
//! cargo run -p tessera-kernels --example gpu_codes      # rewrites both files
//! ```
//!
//! and a test fails while either file differs from what this table gives. Adding an operation
//! to a kernel family or a type to the decoders is one line here, then the generator.

use tessera_core::{DType, GluOp, UnaryOp};

/// Element types the kernels decode, in code order: `T_<NAME>` is the index.
pub const TYPES: [DType; 17] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_1,
    DType::Q2_K,
    DType::Q3_K,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::MXFP4,
    DType::Q5_0,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

/// The kernels' element type code of `d` (`T_*`), or -1 for a dtype they do not read.
pub fn type_code(d: DType) -> i32 {
    TYPES.iter().position(|&t| t == d).map_or(-1, |i| i as i32)
}

/// `k_binary`'s operation (`BIN_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum BinCode {
    /// a + b
    Add = 0,
    /// a − b
    Sub = 1,
    /// a · b
    Mul = 2,
    /// a / b
    Div = 3,
}

/// `k_map`'s function (`MAP_*`): SCALE, SQR, SQRT, CLAMP and the unary ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum MapCode {
    /// p0 · x + p1
    Scale = 0,
    /// x²
    Sqr = 1,
    /// √x
    Sqrt = 2,
    /// x clamped to p0..p1
    Clamp = 3,
    /// x · σ(x)
    Silu = 4,
    /// GELU, tanh approximation
    Gelu = 5,
    /// x · σ(1.702 x)
    GeluQuick = 6,
    /// max(x, 0)
    Relu = 7,
    /// tanh x
    Tanh = 8,
    /// −x
    Neg = 9,
    /// eˣ
    Exp = 10,
    /// σ(x)
    Sigmoid = 11,
}

impl MapCode {
    /// The code of a unary op.
    pub fn of_unary(u: UnaryOp) -> MapCode {
        match u {
            UnaryOp::Silu => MapCode::Silu,
            UnaryOp::Gelu => MapCode::Gelu,
            UnaryOp::GeluQuick => MapCode::GeluQuick,
            UnaryOp::Relu => MapCode::Relu,
            UnaryOp::Tanh => MapCode::Tanh,
            UnaryOp::Neg => MapCode::Neg,
            UnaryOp::Exp => MapCode::Exp,
            UnaryOp::Sigmoid => MapCode::Sigmoid,
        }
    }
}

/// `k_glu`'s activation (`GLU_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum GluCode {
    /// SiLU(gate) · up
    Swiglu = 0,
    /// GELU(gate) · up
    Geglu = 1,
}

impl GluCode {
    /// The code of a gated-unit op.
    pub fn of(op: GluOp) -> GluCode {
        match op {
            GluOp::Swiglu => GluCode::Swiglu,
            GluOp::Geglu => GluCode::Geglu,
        }
    }
}

/// Errors a kernel raises in its stream's status word (`ERR_*`; see `raise_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ErrCode {
    /// GET_ROWS / SET_ROWS: a row index out of range.
    Index = 1,
    /// MUL_MAT_ID / ADD_ID: an expert id out of range.
    Expert = 2,
}

impl ErrCode {
    /// The error of a status word's code (`None` for 0, no error, or a code no kernel raises).
    pub fn of(code: i32) -> Option<ErrCode> {
        [ErrCode::Index, ErrCode::Expert]
            .into_iter()
            .find(|&e| e as i32 == code)
    }
}

/// Every generated definition, in file order: a comment line (`None` value) opens each group.
fn definitions() -> Vec<(String, Option<i64>)> {
    let mut out = Vec::new();
    let mut group = |title: &str, items: Vec<(String, i64)>| {
        out.push((title.to_string(), None));
        out.extend(items.into_iter().map(|(n, v)| (n, Some(v))));
    };
    let macro_name = |d: DType| d.name().to_ascii_uppercase();
    group(
        "Element types (`TYPES` in codes.rs, `type_code`).",
        TYPES
            .iter()
            .enumerate()
            .map(|(i, &d)| (format!("T_{}", macro_name(d)), i as i64))
            .chain([("T_COUNT".to_string(), TYPES.len() as i64)])
            .collect(),
    );
    group(
        "Elements per block: 32-element formats and K-quant super-blocks.",
        vec![
            ("QK".to_string(), DType::Q8_0.block_size() as i64),
            ("QK_K".to_string(), DType::Q4_K.block_size() as i64),
        ],
    );
    group(
        "Bytes per block of each quantized type.",
        TYPES
            .iter()
            .filter(|d| d.is_quantized())
            .map(|&d| (format!("{}_BYTES", macro_name(d)), d.type_size() as i64))
            .collect(),
    );
    group(
        "k_binary's operations (`BinCode`).",
        [BinCode::Add, BinCode::Sub, BinCode::Mul, BinCode::Div]
            .into_iter()
            .map(|c| (format!("BIN_{}", upper(&format!("{c:?}"))), c as i64))
            .collect(),
    );
    group(
        "k_map's functions (`MapCode`).",
        [
            MapCode::Scale,
            MapCode::Sqr,
            MapCode::Sqrt,
            MapCode::Clamp,
            MapCode::Silu,
            MapCode::Gelu,
            MapCode::GeluQuick,
            MapCode::Relu,
            MapCode::Tanh,
            MapCode::Neg,
            MapCode::Exp,
            MapCode::Sigmoid,
        ]
        .into_iter()
        .map(|c| (format!("MAP_{}", upper(&format!("{c:?}"))), c as i64))
        .collect(),
    );
    group(
        "k_glu's activations (`GluCode`).",
        [GluCode::Swiglu, GluCode::Geglu]
            .into_iter()
            .map(|c| (format!("GLU_{}", upper(&format!("{c:?}"))), c as i64))
            .collect(),
    );
    group(
        "Errors a kernel raises in the stream's status word (`ErrCode`).",
        [ErrCode::Index, ErrCode::Expert]
            .into_iter()
            .map(|c| (format!("ERR_{}", upper(&format!("{c:?}"))), c as i64))
            .collect(),
    );
    out
}

/// `GeluQuick` -> `GELU_QUICK`.
fn upper(camel: &str) -> String {
    let mut s = String::new();
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            s.push('_');
        }
        s.push(ch.to_ascii_uppercase());
    }
    s
}

/// The language of a generated file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `kernels/gpu/codes.cuh`, for CUDA C and the HIP and SYCL builds of the same sources.
    CudaC,
    /// `kernels/vulkan/codes.glsl`.
    Glsl,
}

impl Dialect {
    /// The file's path relative to the `tessera-kernels` package.
    pub fn path(self) -> &'static str {
        match self {
            Dialect::CudaC => "gpu/codes.cuh",
            Dialect::Glsl => "vulkan/codes.glsl",
        }
    }
}

/// The text of the generated file for `dialect`.
pub fn header(dialect: Dialect) -> String {
    let mut s = String::from(
        "// Generated from kernels/src/gpu/codes.rs by\n\
         // `cargo run -p tessera-kernels --example gpu_codes`: edit the table there, not this file.\n",
    );
    match dialect {
        Dialect::CudaC => s.push_str("#pragma once\n"),
        Dialect::Glsl => s.push_str("#ifndef TESSERA_CODES_GLSL\n#define TESSERA_CODES_GLSL\n"),
    }
    for (name, value) in definitions() {
        match value {
            None => s.push_str(&format!("\n// {name}\n")),
            Some(v) => s.push_str(&format!("#define {name} {v}\n")),
        }
    }
    if dialect == Dialect::Glsl {
        s.push_str("\n#endif\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed files are what the table generates.
    #[test]
    fn generated_files_are_current() {
        for dialect in [Dialect::CudaC, Dialect::Glsl] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dialect.path());
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                on_disk == header(dialect),
                "{} is not what kernels/src/gpu/codes.rs generates: run \
                 `cargo run -p tessera-kernels --example gpu_codes`",
                path.display()
            );
        }
    }

    #[test]
    fn codes_are_distinct_and_round_trip() {
        for (i, &d) in TYPES.iter().enumerate() {
            assert_eq!(type_code(d), i as i32, "{d}");
        }
        assert_eq!(type_code(DType::Q8_K), -1);
        let defs = definitions();
        let mut names: Vec<&str> = defs
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(n, _)| n.as_str())
            .collect();
        let all = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all, "a name is defined twice");
        assert_eq!(upper("GeluQuick"), "GELU_QUICK");
        assert_eq!(ErrCode::of(2), Some(ErrCode::Expert));
        assert_eq!(ErrCode::of(0), None);
        let text = header(Dialect::CudaC);
        for line in [
            "#define T_Q6_K 16",
            "#define T_IQ4_NL 10",
            "#define Q4_K_BYTES 144",
            "#define MXFP4_BYTES 17",
            "#define MAP_GELU_QUICK 6",
            "#define ERR_EXPERT 2",
        ] {
            assert!(text.contains(line), "{line}");
        }
    }
}
