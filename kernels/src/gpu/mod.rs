//! The GPU kernel sources every GPU backend shares, written once in the CUDA C dialect and
//! embedded for backends that compile them at run time: NVRTC for CUDA, hipcc/hipRTC through
//! `kernels/hip/compat.h`, and the SYCL compiler through `kernels/sycl/compat.hpp`.
//!
//! The sources live in `kernels/gpu/`: [`HEADERS`] are included by name (`#include
//! "common.cuh"`), each entry of [`SOURCES`] is one translation unit and one module at run time.
//! Kernels are `extern "C" __global__` so their names are unmangled; every kernel is listed in
//! [`KERNELS`] with its source, so a backend can check that a module holds what it launches.

pub mod cache;
pub mod codes;
pub mod host;
pub mod launch;
pub mod unit;

/// Headers the sources include, as `(include name, text)`.
/// `codes.cuh` comes first: `common.cuh` includes it (and `mma.cuh` includes `common.cuh`), and
/// [`assemble`] inlines them in this order.
pub const HEADERS: &[(&str, &str)] = &[
    ("codes.cuh", include_str!("../../gpu/codes.cuh")),
    ("common.cuh", include_str!("../../gpu/common.cuh")),
    ("mma.cuh", include_str!("../../gpu/mma.cuh")),
];

/// Translation units, as `(file name, text)`.
pub const SOURCES: &[(&str, &str)] = &[
    ("attn.cu", include_str!("../../gpu/attn.cu")),
    ("comm.cu", include_str!("../../gpu/comm.cu")),
    ("copy.cu", include_str!("../../gpu/copy.cu")),
    ("elementwise.cu", include_str!("../../gpu/elementwise.cu")),
    ("matmul.cu", include_str!("../../gpu/matmul.cu")),
    ("moe.cu", include_str!("../../gpu/moe.cu")),
    ("norm.cu", include_str!("../../gpu/norm.cu")),
    ("rope.cu", include_str!("../../gpu/rope.cu")),
];

/// Every kernel entry point, as `(source file, kernel name)`.
pub const KERNELS: &[(&str, &str)] = &[
    ("attn.cu", "k_flash_attn_ext"),
    ("attn.cu", "k_flash_attn_tiled"),
    ("attn.cu", "k_flash_attn_mma"),
    ("attn.cu", "k_flash_attn_split"),
    ("attn.cu", "k_flash_attn_split128"),
    ("attn.cu", "k_flash_attn_merge"),
    ("comm.cu", "k_f32_to_bf16"),
    ("comm.cu", "k_bf16_to_f32"),
    ("comm.cu", "k_add_f32"),
    ("comm.cu", "k_add_bf16"),
    ("comm.cu", "k_round_to_bf16"),
    ("copy.cu", "k_cpy"),
    ("copy.cu", "k_copy_rows"),
    ("copy.cu", "k_quantize"),
    ("copy.cu", "k_get_rows"),
    ("copy.cu", "k_set_rows"),
    ("copy.cu", "k_set_rows_q"),
    ("copy.cu", "k_concat"),
    ("elementwise.cu", "k_binary"),
    ("elementwise.cu", "k_map"),
    ("elementwise.cu", "k_glu"),
    ("elementwise.cu", "k_swiglu_oai"),
    ("matmul.cu", "k_mul_mat_vec_f"),
    ("matmul.cu", "k_mul_mat_vec_q"),
    ("matmul.cu", "k_mul_mat_tiled"),
    ("matmul.cu", "k_gemv_f32"),
    ("matmul.cu", "k_gemv_f16"),
    ("matmul.cu", "k_gemv_bf16"),
    ("matmul.cu", "k_gemv_q8_0"),
    ("matmul.cu", "k_gemv_q4_0"),
    ("matmul.cu", "k_gemv_q4_k"),
    ("matmul.cu", "k_gemv_q6_k"),
    ("matmul.cu", "k_quantize_x8"),
    ("matmul.cu", "k_gemv8_q8_0"),
    ("matmul.cu", "k_gemv8_q4_0"),
    ("matmul.cu", "k_gemv8_q4_k"),
    ("matmul.cu", "k_gemv8_q6_k"),
    ("matmul.cu", "k_mmq_q8_0"),
    ("matmul.cu", "k_mmq_q4_0"),
    ("matmul.cu", "k_mmq_q5_0"),
    ("matmul.cu", "k_mmq_q4_k"),
    ("matmul.cu", "k_mmq_q6_k"),
    ("moe.cu", "k_mul_mat_id"),
    ("moe.cu", "k_add_id"),
    ("moe.cu", "k_argsort"),
    ("norm.cu", "k_norm"),
    ("norm.cu", "k_norm_mul"),
    ("norm.cu", "k_sum_rows"),
    ("norm.cu", "k_argmax"),
    ("norm.cu", "k_soft_max"),
    ("rope.cu", "k_rope"),
];

/// One self-contained translation unit for source `file`: `prelude` (a backend's compat header),
/// then the shared [`HEADERS`] (without `#pragma once`) and the source with its includes of them
/// removed. Used by the
/// backends whose compilers take a single text (SYCL, HIP).
pub fn assemble(prelude: &str, file: &str) -> Option<String> {
    let text = source(file)?;
    let mut out = String::with_capacity(prelude.len() + text.len() + 8192);
    out.push_str(prelude);
    out.push('\n');
    for (name, header) in HEADERS {
        out.push_str(&format!("// ----- {name}\n"));
        // `#pragma once` outside a header is a warning, and each header is inlined once anyway.
        for line in header.lines().filter(|l| l.trim() != "#pragma once") {
            if !includes_header(line) {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.push_str(&format!("// ----- {file}\n"));
    for line in text.lines().filter(|l| !includes_header(l)) {
        out.push_str(line);
        out.push('\n');
    }
    Some(out)
}

/// Whether `line` includes one of the [`HEADERS`] (which [`assemble`] inlines instead).
fn includes_header(line: &str) -> bool {
    let include = line.trim_start().strip_prefix("#include \"");
    include.is_some_and(|rest| HEADERS.iter().any(|(h, _)| rest.starts_with(h)))
}

/// The text of header `name` (one of [`HEADERS`]), if it exists.
pub fn source_header(name: &str) -> Option<&'static str> {
    HEADERS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The text of source `name`, if it exists.
pub fn source(name: &str) -> Option<&'static str> {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.cu`/`.cuh` file in `kernels/gpu` is embedded, so compile tests cover all of them.
    #[test]
    fn every_file_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gpu");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cu") || n.ends_with(".cuh"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = SOURCES
            .iter()
            .chain(HEADERS)
            .map(|(n, _)| n.to_string())
            .collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }

    /// Every listed kernel is defined in its source, and every defined kernel is listed.
    #[test]
    fn kernel_list_matches_sources() {
        let mut defined = Vec::new();
        for (file, text) in SOURCES {
            for part in text.split("__global__ void ").skip(1) {
                let name: String = part.chars().take_while(|c| *c != '(').collect();
                defined.push((file.to_string(), name));
            }
        }
        let mut listed: Vec<(String, String)> = KERNELS
            .iter()
            .map(|(f, k)| (f.to_string(), k.to_string()))
            .collect();
        defined.sort();
        listed.sort();
        assert_eq!(defined, listed);
        assert!(source("matmul.cu").is_some() && source("nope.cu").is_none());
    }
}
