//! SYCL kernel sources: the CUDA C kernels of [`crate::gpu`] compiled as SYCL free-function
//! kernels through `kernels/sycl/compat.hpp`, which maps the CUDA built-ins (thread and block
//! indices, barriers, warp shuffles on 32-wide sub-groups, block-shared arrays, math) to SYCL.
//! One kernel source therefore serves CUDA, HIP and SYCL, and the launch plans of
//! `tessera_gpu::plan` apply unchanged (a CUDA grid of blocks becomes an `nd_range<3>` with x
//! as the fastest dimension).

use crate::gpu::unit::Unit;

/// The compat header.
pub const COMPAT: &str = include_str!("../sycl/compat.hpp");

/// The complete SYCL translation unit for CUDA source `file` (e.g. `"norm.cu"`): the compat
/// header, then the shared headers and the source with its includes resolved.
pub fn source(file: &str) -> Option<String> {
    crate::gpu::assemble(COMPAT, file)
}

/// The complete SYCL translation unit for compile unit `unit`: as [`source`], narrowed to the
/// unit's kernel and element types ([`Unit::assemble`]).
pub fn unit_source(unit: &Unit) -> Option<String> {
    unit.assemble(COMPAT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{KERNELS, SOURCES};

    #[test]
    fn sources_inline_the_headers_once() {
        for (f, _) in SOURCES {
            let s = source(f).unwrap();
            assert!(s.starts_with(COMPAT));
            assert!(!s.contains("#include \"common.cuh\""), "{f}");
            assert_eq!(s.matches("struct Tensor {").count(), 1, "{f}");
        }
        assert!(source("nope.cu").is_none());
    }

    #[test]
    fn unit_sources_follow_the_compat_header() {
        for (_, k) in KERNELS {
            let unit = Unit::kernel(k, crate::gpu::unit::TypeSet::from_codes([0])).unwrap();
            let s = unit_source(&unit).unwrap();
            assert!(s.starts_with(COMPAT), "{k}");
            assert!(s.contains("#define TESSERA_TYPES 0x1u"), "{k}");
        }
    }
}
