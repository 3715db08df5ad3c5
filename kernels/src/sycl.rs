//! SYCL kernel sources: the CUDA C kernels of [`crate::cuda`] compiled as SYCL free-function
//! kernels through `kernels/sycl/compat.hpp`, which maps the CUDA built-ins (thread and block
//! indices, barriers, warp shuffles on 32-wide sub-groups, block-shared arrays, math) to SYCL.
//! One kernel source therefore serves CUDA, HIP and SYCL, and the launch plans of
//! [`crate::cuda::plan`] apply unchanged (a CUDA grid of blocks becomes an `nd_range<3>` with x
//! as the fastest dimension).

use crate::cuda::unit::Unit;
use crate::cuda::{KERNELS, SOURCES};

/// The compat header.
pub const COMPAT: &str = include_str!("../sycl/compat.hpp");

/// The complete SYCL translation unit for CUDA source `file` (e.g. `"norm.cu"`): the compat
/// header, then the shared headers and the source with its includes resolved.
pub fn source(file: &str) -> Option<String> {
    crate::cuda::assemble(COMPAT, file)
}

/// The complete SYCL translation unit for compile unit `unit`: as [`source`], narrowed to the
/// unit's kernel and element types ([`Unit::assemble`]).
pub fn unit_source(unit: &Unit) -> Option<String> {
    unit.assemble(COMPAT)
}

/// The source file that defines `kernel`.
pub fn file_of(kernel: &str) -> Option<&'static str> {
    KERNELS.iter().find(|(_, k)| *k == kernel).map(|(f, _)| *f)
}

/// Every source file, in [`SOURCES`] order.
pub fn files() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(f, _)| *f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_inline_the_headers_once() {
        for f in files() {
            let s = source(f).unwrap();
            assert!(s.starts_with(COMPAT));
            assert!(!s.contains("#include \"common.cuh\""), "{f}");
            assert_eq!(s.matches("struct Tensor {").count(), 1, "{f}");
        }
        assert_eq!(file_of("k_norm"), Some("norm.cu"));
        assert!(source("nope.cu").is_none() && file_of("k_nope").is_none());
    }
}
