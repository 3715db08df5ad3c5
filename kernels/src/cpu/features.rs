//! Runtime CPU feature detection.
//!
//! Detection runs once per process. The environment variable `TESSERA_CPU_ISA` (`scalar`, and on
//! x86-64 `avx2` or `avx512`, on aarch64 `neon`, `dotprod` or `i8mm`) can force a lower
//! instruction set than the one detected (it can never raise it), which the tests and benchmarks
//! use to exercise every code path. A level of another architecture is ignored with a warning.

use std::sync::OnceLock;

/// An instruction-set level the kernels have an implementation for.
///
/// The levels of one architecture are ordered: a CPU that supports a level supports every lower
/// level of its architecture ([`Isa::ALL`] lists them, lowest first). Levels of different
/// architectures are not comparable in that sense; compare them through [`Isa::is_supported`]
/// and [`Isa::clamp_to_supported`], which know the architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Portable scalar code.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/VNNI (plus AVX2, FMA and F16C).
    Avx512,
    /// aarch64 Advanced SIMD (NEON), which every aarch64 CPU has: widening multiplies for the
    /// integer dots.
    Neon,
    /// aarch64 NEON with the dot-product extension (`sdot`, Armv8.2 `FEAT_DotProd`).
    Dotprod,
    /// aarch64 NEON with dotprod and the int8 matrix multiply (`smmla`, Armv8.6 `FEAT_I8MM`).
    I8mm,
}

impl Isa {
    /// The name used by the `TESSERA_CPU_ISA` environment variable.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::Dotprod => "dotprod",
            Isa::I8mm => "i8mm",
        }
    }

    /// Parses a `TESSERA_CPU_ISA` value (case-insensitive). Levels of every architecture parse;
    /// [`Isa::ALL`] says which belong to this one.
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "generic" | "none" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx-512" => Some(Isa::Avx512),
            "neon" | "asimd" => Some(Isa::Neon),
            "dotprod" => Some(Isa::Dotprod),
            "i8mm" => Some(Isa::I8mm),
            _ => None,
        }
    }

    /// The levels of the architecture this crate was built for, lowest first.
    #[cfg(target_arch = "x86_64")]
    pub const ALL: &'static [Isa] = &[Isa::Scalar, Isa::Avx2, Isa::Avx512];
    /// The levels of the architecture this crate was built for, lowest first.
    #[cfg(target_arch = "aarch64")]
    pub const ALL: &'static [Isa] = &[Isa::Scalar, Isa::Neon, Isa::Dotprod, Isa::I8mm];
    /// The levels of the architecture this crate was built for, lowest first.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub const ALL: &'static [Isa] = &[Isa::Scalar];

    /// This level's place in [`Isa::ALL`], or `None` for another architecture's level.
    fn rank(self) -> Option<usize> {
        Isa::ALL.iter().position(|&l| l == self)
    }

    /// Whether this level is usable on the running CPU (false for another architecture's).
    pub fn is_supported(self) -> bool {
        match (self.rank(), detected_isa().rank()) {
            (Some(a), Some(b)) => a <= b,
            _ => false,
        }
    }

    /// This level, lowered to the best one the running CPU supports; another architecture's
    /// level becomes [`Isa::Scalar`].
    pub fn clamp_to_supported(self) -> Isa {
        if self.is_supported() {
            self
        } else if self.rank().is_some() {
            detected_isa()
        } else {
            Isa::Scalar
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni");
        if avx512 {
            Isa::Avx512
        } else if avx2 {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let neon = std::arch::is_aarch64_feature_detected!("neon");
        let dotprod = neon && std::arch::is_aarch64_feature_detected!("dotprod");
        let i8mm = dotprod && std::arch::is_aarch64_feature_detected!("i8mm");
        if i8mm {
            Isa::I8mm
        } else if dotprod {
            Isa::Dotprod
        } else if neon {
            Isa::Neon
        } else {
            Isa::Scalar
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Isa::Scalar
    }
}

/// The best level the running CPU supports (ignores `TESSERA_CPU_ISA`).
pub fn detected_isa() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

/// The level `TESSERA_CPU_ISA = value` selects on a CPU whose best level is `detected`.
fn forced_level(value: &str, detected: Isa) -> Isa {
    match Isa::parse(value) {
        Some(forced) if forced.rank().is_some() => {
            if forced.rank() <= detected.rank() {
                forced
            } else {
                detected
            }
        }
        Some(other) => {
            tracing::warn!(
                "TESSERA_CPU_ISA={value}: {other} is not a level of this CPU's architecture \
                 (levels: {}); using {detected}",
                level_names()
            );
            detected
        }
        None => {
            tracing::warn!(
                "TESSERA_CPU_ISA={value}: unknown level (levels: {}); using {detected}",
                level_names()
            );
            detected
        }
    }
}

fn level_names() -> String {
    Isa::ALL
        .iter()
        .map(|l| l.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The level the dispatching kernels use: [`detected_isa`], lowered to
/// `TESSERA_CPU_ISA` when that is set to a valid, lower level.
pub fn active_isa() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let detected = detected_isa();
        match tessera_core::settings::var_once("TESSERA_CPU_ISA") {
            Some(v) => forced_level(&v, detected),
            None => detected,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_and_parse() {
        for pair in Isa::ALL.windows(2) {
            assert!(
                pair[0] < pair[1],
                "{:?} must be below {:?}",
                pair[0],
                pair[1]
            );
        }
        for &isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("AVX512"), Some(Isa::Avx512));
        assert_eq!(Isa::parse("DotProd"), Some(Isa::Dotprod));
        assert_eq!(Isa::parse("bogus"), None);
        assert!(Isa::ALL.contains(&active_isa()));
        assert!(active_isa().is_supported());
        assert!(Isa::Scalar.is_supported());
        println!(
            "detected ISA: {}, active ISA: {}",
            detected_isa(),
            active_isa()
        );
    }

    #[test]
    fn other_architectures_levels_are_never_supported() {
        let foreign: &[Isa] = if cfg!(target_arch = "aarch64") {
            &[Isa::Avx2, Isa::Avx512]
        } else {
            &[Isa::Neon, Isa::Dotprod, Isa::I8mm]
        };
        let detected = detected_isa();
        for &isa in foreign {
            assert!(!isa.is_supported(), "{isa}");
            assert_eq!(isa.clamp_to_supported(), Isa::Scalar, "{isa}");
            assert_eq!(forced_level(isa.name(), detected), detected, "{isa}");
        }
        assert_eq!(forced_level("bogus", detected), detected);
        assert_eq!(forced_level("scalar", detected), Isa::Scalar);
    }
}
