//! The CUDA compile step: a source of `tessera_kernels::gpu` compiled by NVRTC for the GPU's
//! architecture, cached on disk, and loaded (the shared runtime's kernel cache calls
//! `load_module` once per source and GPU).
//!
//! The cache lives in `$XDG_CACHE_HOME/tessera/cuda` (or `~/.cache/tessera/cuda`); a file's name
//! carries the source name, a hash of the source, headers and options, the target and the NVRTC
//! version, so a changed kernel or compiler never loads a stale image. `TESSERA_CUDA_CACHE=0`
//! turns the cache off. Writes go through a temporary file and a rename, so concurrent processes
//! never read a partial image.
//!
//! `TESSERA_CUDA_DEFINES` (e.g. `GV_ROWS=2`, space- or comma-separated) adds preprocessor
//! definitions to every compile, for sweeping a kernel's tuning constants without a rebuild
//! (`scripts/gpu-perf.sh` does); they are part of the cache key.

use crate::sys::driver::{Gpu, Module};
use crate::sys::nvrtc::{Nvrtc, Target};
use std::path::PathBuf;
use std::sync::Arc;
use tessera_core::{Error, Result};
use tessera_kernels::gpu::{HEADERS, SOURCES, cache};

/// The NVRTC target for compute capability `cc`: a CUBIN when NVRTC knows the architecture,
/// else PTX for the newest architecture it knows that the GPU can run (JIT by the driver).
pub fn target_for(nvrtc: &Nvrtc, cc: (i32, i32)) -> Target {
    let arch = (cc.0.max(0) * 10 + cc.1.max(0)) as u32;
    let archs = nvrtc.supported_archs();
    if archs.contains(&arch) {
        return Target::Cubin(arch);
    }
    let best = archs.iter().copied().filter(|&a| a <= arch).max();
    Target::Ptx(best.unwrap_or(arch))
}

/// The on-disk cache directory, if caching is on and a home or cache directory is known.
pub fn cache_dir() -> Option<PathBuf> {
    cache::cache_dir("cuda", "TESSERA_CUDA_CACHE")
}

/// The `-D` options `TESSERA_CUDA_DEFINES` asks for: each `NAME` or `NAME=VALUE` of letters,
/// digits and underscores. Anything else is left out with a warning (the variable is read at
/// every compile, and a typo must not become a compiler flag).
pub fn defines() -> Vec<String> {
    std::env::var("TESSERA_CUDA_DEFINES")
        .map(|v| parse_defines(&v))
        .unwrap_or_default()
}

fn parse_defines(v: &str) -> Vec<String> {
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    v.split([' ', ','])
        .filter(|d| !d.is_empty())
        .filter_map(|d| {
            let (name, value) = d.split_once('=').unwrap_or((d, "1"));
            if ok(name) && ok(value) {
                Some(format!("-D{name}={value}"))
            } else {
                tracing::warn!(
                    define = d,
                    "TESSERA_CUDA_DEFINES: not NAME or NAME=VALUE; ignored"
                );
                None
            }
        })
        .collect()
}

/// The cache file name of source `name` compiled for `target` by `nvrtc`.
pub fn cache_file_name(nvrtc: &Nvrtc, name: &str, source: &str, target: Target) -> String {
    let defines = defines();
    let mut parts: Vec<&[u8]> = vec![source.as_bytes()];
    for d in &defines {
        parts.push(d.as_bytes());
    }
    for (n, t) in HEADERS {
        parts.push(n.as_bytes());
        parts.push(t.as_bytes());
    }
    let (maj, min) = nvrtc.version();
    let stem = name.trim_end_matches(".cu");
    format!(
        "{stem}-{:016x}-{}-nvrtc{maj}.{min}.{}",
        cache::fnv1a(&parts),
        target.arch_flag(),
        target.extension()
    )
}

/// Compiles `source`, or reads the cached image.
///
/// # Errors
/// The NVRTC error with its log.
pub fn compile_cached(nvrtc: &Nvrtc, name: &str, source: &str, target: Target) -> Result<Vec<u8>> {
    let path = cache_dir().map(|d| d.join(cache_file_name(nvrtc, name, source, target)));
    cache::cached(path.as_deref(), || {
        let defines = defines();
        let options: Vec<&str> = defines.iter().map(String::as_str).collect();
        let compiled = nvrtc.compile(name, source, HEADERS, target, &options)?;
        if !compiled.log.is_empty() {
            tracing::debug!(source = name, log = %compiled.log, "NVRTC log");
        }
        Ok(compiled.image)
    })
}

/// Compiles (or reads from the cache) kernel source `file` for `gpu` and loads it.
///
/// # Errors
/// An unknown source, the NVRTC error with its log, or the driver's status.
pub(crate) fn load_module(gpu: &Arc<Gpu>, nvrtc: &Nvrtc, file: &str) -> Result<Module> {
    let source = SOURCES
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, s)| *s)
        .ok_or_else(|| Error::InvalidArgument(format!("no CUDA kernel source {file}")))?;
    let target = target_for(nvrtc, gpu.compute_capability());
    let image = compile_cached(nvrtc, file, source, target)?;
    Module::load(gpu, &image, matches!(target, Target::Ptx(_)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn defines_are_names_and_values_only() {
        assert_eq!(
            super::parse_defines("GV_ROWS=2, FAST ,X=-1 Y;rm"),
            vec!["-DGV_ROWS=2".to_string(), "-DFAST=1".to_string()]
        );
        assert!(super::parse_defines("").is_empty());
    }
}
