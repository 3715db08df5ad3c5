//! Element types of the KV cache, as llama.cpp's `--cache-type-k` / `--cache-type-v` choose them.

use crate::LlamaConfig;
use std::fmt;
use tessera::{DType, Error, Result};

/// The element types a KV cache may have: llama.cpp's `-ctk` / `-ctv` choices.
pub const CACHE_TYPES: [DType; 9] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4_NL,
];

/// The element types of the K and of the V caches (default F16 for both).
///
/// A quantized cache stores each head's row of a token as whole blocks of 32: the head size must
/// be a multiple of 32 ([`KvCacheTypes::check`]). Writing a row quantizes it as ggml's quantizers
/// do; attention reads the blocks directly.
///
/// ```
/// use tessera_model::KvCacheTypes;
/// let kv = KvCacheTypes::parse("q8_0", "q4_0")?;
/// assert_eq!(kv.to_string(), "K q8_0, V q4_0");
/// # Ok::<(), tessera::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheTypes {
    /// Element type of `cache_k.{i}`.
    pub k: DType,
    /// Element type of `cache_v.{i}`.
    pub v: DType,
}

impl Default for KvCacheTypes {
    fn default() -> KvCacheTypes {
        KvCacheTypes {
            k: DType::F16,
            v: DType::F16,
        }
    }
}

impl fmt::Display for KvCacheTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "K {}, V {}", self.k, self.v)
    }
}

impl KvCacheTypes {
    /// K and V of types `k` and `v`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a type outside [`CACHE_TYPES`].
    pub fn new(k: DType, v: DType) -> Result<KvCacheTypes> {
        for (which, t) in [("K", k), ("V", v)] {
            if !CACHE_TYPES.contains(&t) {
                return Err(Error::InvalidArgument(format!(
                    "{t} cannot be the {which} cache's type; choose one of {}",
                    type_names()
                )));
            }
        }
        Ok(KvCacheTypes { k, v })
    }

    /// Both types by llama.cpp's names (`f16`, `q8_0`, `q4_0`, `iq4_nl`, ...; any case).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming an unknown or unsupported name and listing the choices.
    pub fn parse(k: &str, v: &str) -> Result<KvCacheTypes> {
        KvCacheTypes::new(parse_type(k, "K")?, parse_type(v, "V")?)
    }

    /// One cache type by llama.cpp's name (any case).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming an unknown or unsupported name and listing the choices.
    pub fn parse_type(name: &str) -> Result<DType> {
        parse_type(name, "KV")
    }

    /// Whether both caches are F16 (the default).
    pub fn is_default(&self) -> bool {
        *self == KvCacheTypes::default()
    }

    /// The sizes of the Walsh–Hadamard rotations of K (with Q) and of V for heads of
    /// `head_dim`, as llama.cpp applies them: a block-type cache holds K and V rotated, which
    /// spreads a head's outliers over its blocks so that their scales fit all values better
    /// (llama.cpp's `attn_rot_k` / `attn_rot_v`). Q·K is unchanged by rotating both, and the
    /// attention output is rotated back, so only the rounding changes. K takes the largest
    /// power of two dividing the head size, V blocks of 64; both need heads of a multiple of 64.
    pub fn rotations(&self, head_dim: usize) -> (Option<usize>, Option<usize>) {
        if !head_dim.is_multiple_of(64) {
            return (None, None);
        }
        let k = self
            .k
            .is_quantized()
            .then(|| 1usize << head_dim.trailing_zeros());
        let v = self.v.is_quantized().then_some(64);
        (k, v)
    }

    /// Checks that both types can hold `config`'s caches: each head's row must be whole blocks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the cache tensor, the head size and the block size.
    pub fn check(&self, config: &LlamaConfig) -> Result<()> {
        let kv = KvCacheTypes::new(self.k, self.v)?;
        for (name, t) in [("cache_k", kv.k), ("cache_v", kv.v)] {
            let block = t.block_size();
            if !config.head_dim.is_multiple_of(block) {
                return Err(Error::InvalidArgument(format!(
                    "{name}.0: a {t} cache needs heads of whole {block}-element blocks, and this \
                     model's heads have {} elements; use f16, bf16 or f32",
                    config.head_dim
                )));
            }
        }
        Ok(())
    }
}

/// One cache type by name; `which` (`K` or `V`) names the cache in the error.
fn parse_type(name: &str, which: &str) -> Result<DType> {
    DType::parse(name)
        .filter(|t| CACHE_TYPES.contains(t))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown {which} cache type '{name}'; choose one of {}",
                type_names()
            ))
        })
}

fn type_names() -> String {
    CACHE_TYPES
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_llama_cpps() {
        let kv = KvCacheTypes::parse("Q8_0", "iq4_nl").unwrap();
        assert_eq!((kv.k, kv.v), (DType::Q8_0, DType::IQ4_NL));
        for bad in ["q4_k", "q8", "i32", ""] {
            let e = KvCacheTypes::parse(bad, "f16").unwrap_err().to_string();
            assert!(e.contains(&format!("'{bad}'")) && e.contains("q5_1"), "{e}");
        }
        assert!(KvCacheTypes::new(DType::F16, DType::Q6_K).is_err());
    }

    #[test]
    fn rotations_follow_llama_cpp() {
        let kv = KvCacheTypes::parse("q8_0", "q4_0").unwrap();
        assert_eq!(kv.rotations(64), (Some(64), Some(64)));
        assert_eq!(kv.rotations(256), (Some(256), Some(64)));
        assert_eq!(kv.rotations(192), (Some(64), Some(64)));
        assert_eq!(kv.rotations(96), (None, None));
        let kv = KvCacheTypes::parse("bf16", "iq4_nl").unwrap();
        assert_eq!(kv.rotations(128), (None, Some(64)));
    }

    #[test]
    fn heads_must_be_whole_blocks() {
        let mut c = LlamaConfig::tiny();
        c.head_dim = 48;
        let e = KvCacheTypes::parse("f16", "q4_0")
            .unwrap()
            .check(&c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cache_v.0") && e.contains("32") && e.contains("48"),
            "{e}"
        );
        assert!(
            KvCacheTypes::parse("bf16", "f32")
                .unwrap()
                .check(&c)
                .is_ok()
        );
    }
}
