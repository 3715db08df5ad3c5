//! The HIP compile step: a source of `tessera_kernels::hip` as a code object for the GPU's gfx
//! target, loaded (the shared runtime's kernel cache asks once per source and GPU).
//!
//! A code object comes from, in order:
//! 1. the offload bundles built ahead of time by `hipcc --genco` when the crate was built on a
//!    machine with hipcc (see `tessera_toolchain::hip`; [`AOT_ARCHS`] lists their targets);
//! 2. the disk cache, `$XDG_CACHE_HOME/tessera/hip` (or `~/.cache/tessera/hip`), whose file names
//!    carry the source name, a hash of the source and compat header, the target and the HIP
//!    runtime version; `TESSERA_HIP_CACHE=0` turns it off;
//! 3. hipRTC, at run time (then written to the cache).

use crate::sys::{Gpu, Hip, Module};
use std::sync::Arc;
use tessera_core::{Error, Result};
use tessera_kernels::gpu::cache;
use tessera_kernels::hip;

mod aot {
    include!(concat!(env!("OUT_DIR"), "/hip_aot.rs"));
}

/// gfx targets of the code objects embedded at build time (empty when hipcc was not found).
pub const AOT_ARCHS: &[&str] = aot::ARCHS;

/// The embedded offload bundle of source `file` (all of [`AOT_ARCHS`]), if any.
pub fn aot_bundle(file: &str) -> Option<&'static [u8]> {
    aot::BUNDLES
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, b)| *b)
}

/// The cache file name of source `file` compiled for `arch` by runtime version `version`.
pub fn cache_file_name(file: &str, source: &str, arch: &str, version: i32) -> String {
    let stem = file.trim_end_matches(".cu");
    let hash = cache::fnv1a(&[source.as_bytes(), arch.as_bytes()]);
    format!("{stem}-{hash:016x}-{arch}-hip{version}.co")
}

/// The code object of source `file` for `arch`: from the disk cache, else compiled by hipRTC
/// (and cached).
///
/// # Errors
/// An unknown source, or hipRTC's error with its log.
pub fn compile_cached(hip: &Hip, file: &str, arch: &str) -> Result<Vec<u8>> {
    let source = hip::source(file)
        .ok_or_else(|| Error::InvalidArgument(format!("no HIP kernel source {file}")))?;
    let version = hip.runtime_version().unwrap_or(0);
    let path = cache::cache_dir("hip", "TESSERA_HIP_CACHE")
        .map(|d| d.join(cache_file_name(file, &source, arch, version)));
    cache::cached(path.as_deref(), || {
        let (code, log) = hip.compile(file, &source, arch)?;
        if !log.is_empty() {
            tracing::debug!(source = file, arch, log = %log, "hipRTC log");
        }
        Ok(code)
    })
}

/// Loads kernel source `file` for `gpu`: the embedded bundle when it covers the GPU's target,
/// else the cached or freshly compiled code object.
///
/// # Errors
/// An unknown source, hipRTC's error with its log, or the runtime's status.
pub(crate) fn load_module(gpu: &Arc<Gpu>, file: &str) -> Result<Module> {
    let arch = gpu.arch();
    match aot_bundle(file).filter(|_| AOT_ARCHS.contains(&arch)) {
        Some(bundle) => Module::load(gpu, bundle),
        None => Module::load(gpu, &compile_cached(gpu.hip(), file, arch)?),
    }
}
