//! Runtime CPU feature detection.
//!
//! Detection runs once per process. The environment variable
//! `TESSERA_CPU_ISA` (`scalar`, `avx2` or `avx512`) can force a lower
//! instruction set than the one detected (it can never raise it), which the
//! tests and benchmarks use to exercise every code path.

use std::sync::OnceLock;

/// An instruction-set level the kernels have an implementation for.
///
/// The levels are ordered: a CPU that supports a level supports every lower
/// level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Portable scalar code.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/VNNI (plus AVX2, FMA and F16C).
    Avx512,
}

impl Isa {
    /// The name used by the `TESSERA_CPU_ISA` environment variable.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Parses a `TESSERA_CPU_ISA` value (case-insensitive).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "generic" | "none" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" | "avx-512" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// All levels, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Whether this level is usable on the running CPU.
    pub fn is_supported(self) -> bool {
        self <= detected_isa()
    }

    /// This level, lowered to the best one the running CPU supports.
    pub fn clamp_to_supported(self) -> Isa {
        self.min(detected_isa())
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
    #[cfg(not(target_arch = "x86_64"))]
    {
        Isa::Scalar
    }
}

/// The best level the running CPU supports (ignores `TESSERA_CPU_ISA`).
pub fn detected_isa() -> Isa {
    static DETECTED: OnceLock<Isa> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

/// The level the dispatching kernels use: [`detected_isa`], lowered to
/// `TESSERA_CPU_ISA` when that is set to a valid, lower level.
pub fn active_isa() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let detected = detected_isa();
        match std::env::var("TESSERA_CPU_ISA") {
            Ok(v) => match Isa::parse(&v) {
                Some(forced) => forced.min(detected),
                None => detected,
            },
            Err(_) => detected,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_and_parse() {
        assert!(Isa::Scalar < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("AVX512"), Some(Isa::Avx512));
        assert_eq!(Isa::parse("bogus"), None);
        assert!(active_isa() <= detected_isa());
        assert!(Isa::Scalar.is_supported());
        println!(
            "detected ISA: {}, active ISA: {}",
            detected_isa(),
            active_isa()
        );
    }
}
