//! The on-disk cache of compiled kernel images shared by the GPU backends (CUDA: NVRTC output,
//! HIP: hipRTC code objects): `$XDG_CACHE_HOME/tessera/<backend>` (or `~/.cache/...`), files
//! named by the caller from a [`fnv1a`] hash of everything that affects the image, written
//! through a temporary file and a rename so concurrent processes never read a partial image.

use std::path::{Path, PathBuf};
use tessera_core::Result;

/// The cache directory of `backend`, unless `off_env` is `0` or no home/cache directory is known.
pub fn cache_dir(backend: &str, off_env: &str) -> Option<PathBuf> {
    if std::env::var(off_env).is_ok_and(|v| v == "0") {
        return None;
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tessera").join(backend))
}

/// 64-bit FNV-1a: stable across Rust releases (unlike `DefaultHasher`), enough for cache keys.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Separate parts so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The image at `path` if it is cached there, else `compile()`'s, stored at `path` (a failed
/// write is logged and ignored). `path` `None` means no cache.
///
/// # Errors
/// `compile`'s error.
pub fn cached(path: Option<&Path>, compile: impl FnOnce() -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    if let Some(p) = path
        && let Ok(bytes) = std::fs::read(p)
        && !bytes.is_empty()
    {
        tracing::debug!(file = %p.display(), "kernel cache hit");
        return Ok(bytes);
    }
    let image = compile()?;
    if let Some(p) = path {
        let write = || -> std::io::Result<()> {
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &image)?;
            std::fs::rename(&tmp, p)
        };
        if let Err(e) = write() {
            tracing::debug!(file = %p.display(), error = %e, "cannot write the kernel cache");
        }
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"x"]), fnv1a(&[b"x"]));
    }

    #[test]
    fn cached_compiles_once() {
        let dir = std::env::temp_dir().join(format!("tessera-cache-test-{}", std::process::id()));
        let p = dir.join("k.bin");
        let a = cached(Some(&p), || Ok(vec![1, 2, 3])).unwrap();
        let b = cached(Some(&p), || panic!("must hit the cache")).unwrap();
        assert_eq!(a, b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
