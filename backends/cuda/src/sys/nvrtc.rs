//! NVRTC, the run-time CUDA compiler, as a `libloading` table loaded from an explicit path.
//!
//! NVRTC needs no GPU and no driver: it turns CUDA C into PTX (`compute_XX`) or CUBIN (`sm_XX`).
//! The library is found through `TESSERA_NVRTC_PATH` (a file or a directory), the loader's search
//! path (`libnvrtc.so.12`, `libnvrtc.so.13`, `libnvrtc.so`), or the `nvidia-cuda-nvrtc-cu12`
//! wheel of the active or nearest `.venv`.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use tessera_core::{Error, Result};
use tessera_gpu::rtc::Rtc;

pub use tessera_gpu::rtc::Compiled;

/// Environment variable naming the NVRTC library (or its directory).
pub const NVRTC_PATH_ENV: &str = "TESSERA_NVRTC_PATH";

/// What NVRTC produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// PTX for virtual architecture `compute_XX` (XX = major·10 + minor), JIT-compiled by the driver.
    Ptx(u32),
    /// A CUBIN for real architecture `sm_XX`, loaded as is.
    Cubin(u32),
}

impl Target {
    /// The `--gpu-architecture` value.
    pub fn arch_flag(self) -> String {
        match self {
            Target::Ptx(a) => format!("compute_{a}"),
            Target::Cubin(a) => format!("sm_{a}"),
        }
    }
    /// File extension of the output (`ptx` or `cubin`).
    pub fn extension(self) -> &'static str {
        match self {
            Target::Ptx(_) => "ptx",
            Target::Cubin(_) => "cubin",
        }
    }
}

/// A loaded NVRTC library: the shared run-time compiler table, plus the architectures it knows.
#[derive(Debug)]
pub struct Nvrtc {
    rtc: Rtc,
    archs: Vec<u32>,
}

impl Nvrtc {
    /// Loads NVRTC from the first candidate that works (see the module docs).
    ///
    /// # Errors
    /// [`Error::Unavailable`] naming the variable to set when no candidate loads.
    pub fn load() -> Result<Nvrtc> {
        let candidates = tessera_gpu::loader::library_candidates(
            NVRTC_PATH_ENV,
            &["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"],
            &["cuda_nvrtc/lib", "cu13/lib"],
        );
        let (lib, path) =
            tessera_gpu::loader::open_first(&candidates).map_err(|e| Error::Unavailable {
                backend: "cuda".into(),
                reason: format!("NVRTC not found (set {NVRTC_PATH_ENV}): {e}"),
            })?;
        Nvrtc::from_library(lib, path)
    }

    /// Loads NVRTC from `path`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the file does not load or lacks an entry point.
    pub fn load_from(path: &Path) -> Result<Nvrtc> {
        let (lib, path) = tessera_gpu::loader::open_first(&[path.to_path_buf()]).map_err(|e| {
            Error::Unavailable {
                backend: "cuda".into(),
                reason: format!("NVRTC: {e}"),
            }
        })?;
        Nvrtc::from_library(lib, path)
    }

    fn from_library(lib: libloading::Library, path: PathBuf) -> Result<Nvrtc> {
        let rtc = Rtc::from_library(lib, path, "cuda", "nvrtc", &["PTX", "CUBIN"])?;
        type Count = unsafe extern "C" fn(*mut c_int) -> c_int;
        // SAFETY: both are NVRTC entry points taking one `int *` (nvrtc.h).
        let num: Count = unsafe { rtc.symbol("nvrtcGetNumSupportedArchs")? };
        // SAFETY: as above.
        let list: Count = unsafe { rtc.symbol("nvrtcGetSupportedArchs")? };
        let mut n = 0;
        // SAFETY: valid out-pointer; needs no GPU.
        let archs = if unsafe { num(&mut n) } != 0 || n <= 0 {
            Vec::new()
        } else {
            let mut v = vec![0 as c_int; n as usize];
            // SAFETY: `v` has room for the `n` entries NVRTC reported.
            match unsafe { list(v.as_mut_ptr()) } {
                0 => v.into_iter().filter(|&a| a > 0).map(|a| a as u32).collect(),
                _ => Vec::new(),
            }
        };
        Ok(Nvrtc { rtc, archs })
    }

    /// The file the library was loaded from.
    pub fn path(&self) -> &Path {
        self.rtc.path()
    }

    /// NVRTC's version (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.rtc.version()
    }

    /// The real architectures this NVRTC can target (`80` for sm_80), ascending.
    pub fn supported_archs(&self) -> Vec<u32> {
        self.archs.clone()
    }

    /// Compiles `source` (named `name` in messages) with `headers` available to `#include`, for
    /// `target`, with `options` added to Tessera's (`--std=c++17`, `-DTESSERA_CUDA=1`).
    ///
    /// # Errors
    /// [`Error::Compute`] with the compiler log when the source does not compile; NVRTC status
    /// errors as [`Error::Driver`].
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        target: Target,
        options: &[&str],
    ) -> Result<Compiled> {
        let mut opts = vec![
            format!("--gpu-architecture={}", target.arch_flag()),
            "--std=c++17".to_string(),
            "-DTESSERA_CUDA=1".to_string(),
        ];
        opts.extend(options.iter().map(|o| o.to_string()));
        let output = match target {
            Target::Ptx(_) => 0,
            Target::Cubin(_) => 1,
        };
        let what = format!("{name} for {}", target.arch_flag());
        self.rtc
            .compile(&what, name, source, headers, &opts, output)
    }
}
