//! HIP kernel sources: the CUDA C kernels of [`crate::gpu`] compiled for AMD GPUs by hipRTC (or
//! ahead of time by `hipcc --genco`) through `kernels/hip/compat.h`, which defines the warp macros
//! of `common.cuh` (32-lane logical warps, correct on wave32 and wave64 GPUs). The launch plans of
//! `tessera_gpu::plan` apply unchanged.

use crate::gpu::{KERNELS, SOURCES};

/// The compat header.
pub const COMPAT: &str = include_str!("../hip/compat.h");

/// GPU architectures the CI compile test and the ahead-of-time build cover on ROCm 5.2. gfx1100
/// is left out on purpose: ROCm 5.2's hipRTC aborts the process for it (toolchains.md §1).
pub const CI_ARCHS: &[&str] = &["gfx90a", "gfx1030"];

/// The complete HIP translation unit for CUDA source `file` (e.g. `"norm.cu"`).
pub fn source(file: &str) -> Option<String> {
    crate::gpu::assemble(COMPAT, file)
}

/// Every source file, in [`SOURCES`] order.
pub fn files() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(f, _)| *f)
}

/// The kernels defined in source `file`.
pub fn kernels_of(file: &str) -> impl Iterator<Item = &'static str> + '_ {
    KERNELS
        .iter()
        .filter(move |(f, _)| *f == file)
        .map(|(_, k)| *k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_start_with_the_compat_header() {
        for f in files() {
            let s = source(f).unwrap();
            assert!(s.starts_with(COMPAT));
            assert_eq!(s.matches("struct Tensor {").count(), 1, "{f}");
            assert!(kernels_of(f).next().is_some(), "{f}");
        }
        assert!(source("nope.cu").is_none());
    }
}
