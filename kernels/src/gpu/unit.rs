//! Compile units: what one run-time built program of the CUDA C kernels holds.
//!
//! A backend whose compiler copes with every kernel of a source and every element decoder inlined
//! into each load (NVRTC, hipRTC) builds one [`Unit::source`] per source file. One whose compiler
//! is superlinear in function size (the OpenCL CPU device's JIT behind SYCL, which took 32 minutes
//! for `attn.cu` with every decoder in each of its unrolled loads) builds one [`Unit::launch`] per
//! kernel and set of element types instead: the unit keeps only its kernel, and defines
//! `TESSERA_TYPES` so that `common.cuh` compiles in only the decoders of the launch's tensors.
//! Knowing the types at compile time is also what lets a compiler specialise a kernel for speed.

use super::launch::{Arg, Launch};
use super::{KERNELS, assemble};

/// Number of element type codes (`T_COUNT`).
const TYPE_CODES: u32 = super::codes::TYPES.len() as u32;

/// Names of the type codes, in code order (for logs and labels).
const TYPE_NAMES: [&str; TYPE_CODES as usize] = [
    "f32", "f16", "bf16", "i32", "q8_0", "q4_0", "q4_1", "q5_1", "q2_K", "q3_K", "iq4_nl",
    "iq4_xs", "mxfp4", "q5_0", "q4_K", "q5_K", "q6_K",
];

/// A set of element types, one bit per type code of `common.cuh` (`T_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TypeSet(u32);

impl TypeSet {
    /// Every type: `common.cuh`'s default when `TESSERA_TYPES` is not defined.
    pub const ALL: TypeSet = TypeSet((1 << TYPE_CODES) - 1);
    /// No type (kernels that read no tensor through the decoders).
    pub const EMPTY: TypeSet = TypeSet(0);

    /// The set with these type codes (codes outside `0..17` are ignored).
    pub fn from_codes(codes: impl IntoIterator<Item = i32>) -> TypeSet {
        TypeSet(
            codes
                .into_iter()
                .filter(|&c| (0..TYPE_CODES as i32).contains(&c))
                .fold(0, |bits, c| bits | 1 << c),
        )
    }

    /// The types of the tensors `launch` passes: everything its kernel can load or store.
    pub fn of_launch(launch: &Launch) -> TypeSet {
        TypeSet::from_codes(launch.args.iter().filter_map(|a| match a {
            // `struct Tensor`'s `type` field (offset 72, see `launch::tensor_arg`).
            Arg::Tensor(b) => Some(i32::from_ne_bytes([b[72], b[73], b[74], b[75]])),
            _ => None,
        }))
    }

    /// The bits, as `TESSERA_TYPES` takes them.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether type code `code` is in the set.
    pub fn contains_code(self, code: i32) -> bool {
        (0..TYPE_CODES as i32).contains(&code) && self.0 >> code & 1 == 1
    }
}

impl std::fmt::Display for TypeSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == TypeSet::ALL {
            return f.write_str("all types");
        }
        let names: Vec<&str> = (0..TYPE_CODES as i32)
            .filter(|&c| self.contains_code(c))
            .map(|c| TYPE_NAMES[c as usize])
            .collect();
        if names.is_empty() {
            f.write_str("no types")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

/// One program's worth of kernel source: a source file, all of its kernels or one, for a set of
/// element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unit {
    /// The source file (an entry of [`super::SOURCES`]).
    pub file: &'static str,
    /// The one kernel kept, or `None` for every kernel of the file.
    pub kernel: Option<&'static str>,
    /// The element types the loads and stores decode.
    pub types: TypeSet,
}

impl Unit {
    /// Every kernel of `file`, every element type.
    pub fn source(file: &'static str) -> Unit {
        Unit {
            file,
            kernel: None,
            types: TypeSet::ALL,
        }
    }

    /// Kernel `name` alone, for the element types `types`; `None` for an unknown kernel.
    pub fn kernel(name: &str, types: TypeSet) -> Option<Unit> {
        let &(file, kernel) = KERNELS.iter().find(|(_, k)| *k == name)?;
        Some(Unit {
            file,
            kernel: Some(kernel),
            types,
        })
    }

    /// The kernel `launch` runs, for the types of its tensors.
    pub fn launch(launch: &Launch) -> Option<Unit> {
        Unit::kernel(launch.kernel, TypeSet::of_launch(launch))
    }

    /// The kernels the unit defines, as `(file, name)` entries of [`KERNELS`].
    pub fn kernels(&self) -> impl Iterator<Item = &'static str> + '_ {
        KERNELS
            .iter()
            .filter(|(f, k)| *f == self.file && self.kernel.is_none_or(|one| one == *k))
            .map(|(_, k)| *k)
    }

    /// A short name for logs and errors, e.g. `attn.cu:k_flash_attn_ext[f32,f16]`.
    pub fn label(&self) -> String {
        match self.kernel {
            Some(k) => format!("{}:{k}[{}]", self.file, self.types),
            None if self.types == TypeSet::ALL => self.file.to_string(),
            None => format!("{}[{}]", self.file, self.types),
        }
    }

    /// The unit as one translation unit after `prelude` (a backend's compat header): the type
    /// set as `TESSERA_TYPES` (unless it is every type), then [`assemble`]'s text with every
    /// other kernel of the file turned into an unused `static __device__` function, which
    /// compilers generate no code for. `None` for an unknown file.
    pub fn assemble(&self, prelude: &str) -> Option<String> {
        let mut head = prelude.to_string();
        if self.types != TypeSet::ALL {
            head.push_str(&format!(
                "\n// Element types of this unit: {}\n#define TESSERA_TYPES 0x{:x}u\n",
                self.types,
                self.types.bits()
            ));
        }
        let text = assemble(&head, self.file)?;
        let Some(keep) = self.kernel else {
            return Some(text);
        };
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            match line.split_once(KERNEL_DECL) {
                Some((indent, rest)) if !rest.starts_with(&format!("{keep}(")) => {
                    out.push_str(indent);
                    out.push_str(DEMOTED);
                    out.push_str(rest);
                }
                _ => out.push_str(line),
            }
        }
        Some(out)
    }
}

/// How every kernel of `kernels/gpu` is declared (one per line; `kernel_list_matches_sources`
/// in the parent module finds them the same way).
const KERNEL_DECL: &str = "extern \"C\" __global__ void ";

/// What a unit turns the kernels it does not keep into: unused device functions, which no
/// compiler generates code for (`__device__` is empty under the SYCL compat header).
const DEMOTED: &str = "[[maybe_unused]] static __device__ void ";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::SOURCES;

    /// The comm kernels take pointers only: no types. (Planned launches: `tessera_gpu::plan`'s
    /// tests.)
    #[test]
    fn type_sets_of_launches() {
        let t = |code: i32| {
            let mut b = [0u8; 80];
            b[72..76].copy_from_slice(&code.to_ne_bytes());
            Arg::Tensor(b)
        };
        let gemv = Launch {
            kernel: "k_mul_mat_vec_q",
            grid: (1, 1, 1),
            block: 128,
            args: vec![t(0), t(14), t(1), Arg::I64(3)],
        };
        assert_eq!(TypeSet::of_launch(&gemv).to_string(), "f32,f16,q4_K");
        let u = Unit::launch(&gemv).unwrap();
        assert_eq!(u.label(), "matmul.cu:k_mul_mat_vec_q[f32,f16,q4_K]");
        let comm = Launch {
            kernel: "k_add_f32",
            grid: (1, 1, 1),
            block: 256,
            args: vec![Arg::Ptr(1), Arg::Ptr(2), Arg::I64(3)],
        };
        assert_eq!(TypeSet::of_launch(&comm), TypeSet::EMPTY);
        assert_eq!(TypeSet::EMPTY.to_string(), "no types");
        assert_eq!(TypeSet::ALL.to_string(), "all types");
        assert!(Unit::kernel("k_nope", TypeSet::ALL).is_none());
    }

    /// Type names follow the codes the launch plans give each dtype, and every code is used.
    #[test]
    fn type_names_match_the_plan_codes() {
        let mut seen = TypeSet::EMPTY;
        for d in tessera_core::DType::ALL {
            let code = crate::gpu::codes::type_code(d);
            if code < 0 {
                continue;
            }
            let one = TypeSet::from_codes([code]);
            assert_eq!(one.to_string(), d.name(), "{d}");
            seen = TypeSet(seen.bits() | one.bits());
        }
        assert_eq!(seen, TypeSet::ALL);
        assert_eq!(TypeSet::from_codes([-1, 17, 40]), TypeSet::EMPTY);
    }

    /// `common.cuh`'s default type set (every code below `T_COUNT`) is [`TypeSet::ALL`], and
    /// every type code has a name here.
    #[test]
    fn all_matches_common_cuh() {
        let common = crate::gpu::source_header("common.cuh").unwrap();
        assert!(common.contains("#define TESSERA_TYPES ((1u << T_COUNT) - 1u)"));
        let codes = crate::gpu::source_header("codes.cuh").unwrap();
        assert!(codes.contains(&format!("#define T_COUNT {TYPE_CODES}\n")));
        assert_eq!(TypeSet::ALL.bits(), (1 << TYPE_CODES) - 1);
        assert_eq!(TYPE_NAMES.len(), TYPE_CODES as usize);
        for (d, name) in super::super::codes::TYPES.iter().zip(TYPE_NAMES) {
            assert_eq!(d.name(), name);
        }
    }

    /// A one-kernel unit keeps exactly its kernel as a kernel and defines its types; a whole
    /// source is [`assemble`]'s text unchanged.
    #[test]
    fn units_keep_one_kernel() {
        for &(file, kernel) in KERNELS {
            let u = Unit::kernel(kernel, TypeSet::from_codes([0, 1])).unwrap();
            let text = u.assemble("// prelude").unwrap();
            assert_eq!(text.matches(KERNEL_DECL).count(), 1, "{kernel}");
            assert!(
                text.contains(&format!("{KERNEL_DECL}{kernel}(")),
                "{kernel}"
            );
            assert!(text.contains("#define TESSERA_TYPES 0x3u"), "{kernel}");
            let others = KERNELS.iter().filter(|(f, _)| *f == file).count() - 1;
            assert_eq!(text.matches(DEMOTED).count(), others, "{kernel}");
            assert_eq!(u.kernels().collect::<Vec<_>>(), vec![kernel]);
        }
        for (file, _) in SOURCES {
            let u = Unit::source(file);
            assert_eq!(u.assemble("// p"), assemble("// p", file));
            assert_eq!(u.label(), *file);
            assert!(u.kernels().count() >= 1);
        }
        assert!(Unit::source("nope.cu").assemble("").is_none());
    }
}
