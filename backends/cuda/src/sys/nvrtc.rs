//! NVRTC, the run-time CUDA compiler, as a `libloading` table loaded from an explicit path.
//!
//! NVRTC needs no GPU and no driver: it turns CUDA C into PTX (`compute_XX`) or CUBIN (`sm_XX`).
//! The library is found through `TESSERA_NVRTC_PATH` (a file or a directory), the loader's search
//! path (`libnvrtc.so.12`, `libnvrtc.so.13`, `libnvrtc.so`), or the `nvidia-cuda-nvrtc-cu12`
//! wheel of the active or nearest `.venv`.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use tessera_core::{Error, Result};

/// Environment variable naming the NVRTC library (or its directory).
pub const NVRTC_PATH_ENV: &str = "TESSERA_NVRTC_PATH";

type Prog = *mut c_void;
type Status = c_int;

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

/// One successful compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// PTX text or CUBIN bytes.
    pub image: Vec<u8>,
    /// The compiler log (warnings; empty for a clean compile).
    pub log: String,
}

struct Fns {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    num_archs: unsafe extern "C" fn(*mut c_int) -> Status,
    archs: unsafe extern "C" fn(*mut c_int) -> Status,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Prog) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

/// A loaded NVRTC library.
pub struct Nvrtc {
    fns: Fns,
    path: PathBuf,
    version: (i32, i32),
    // Kept last so the function pointers above never outlive it.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

/// Frees a program on every path out of `compile`.
struct ProgGuard<'a> {
    nvrtc: &'a Nvrtc,
    prog: Prog,
}

impl Drop for ProgGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from nvrtcCreateProgram and is destroyed once, here.
        unsafe { (self.nvrtc.fns.destroy)(&mut self.prog) };
    }
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
        let missing = |name: &str, e: libloading::Error| Error::Unavailable {
            backend: "cuda".into(),
            reason: format!("{}: missing {name}: {e}", path.display()),
        };
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is NVRTC's documented C entry point of this name, and the
                // field it is stored in has exactly that C signature (nvrtc.h).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| missing($name, e))?
            };
        }
        let fns = Fns {
            version: sym!("nvrtcVersion"),
            num_archs: sym!("nvrtcGetNumSupportedArchs"),
            archs: sym!("nvrtcGetSupportedArchs"),
            create: sym!("nvrtcCreateProgram"),
            compile: sym!("nvrtcCompileProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            destroy: sym!("nvrtcDestroyProgram"),
            error_string: sym!("nvrtcGetErrorString"),
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers.
        let rc = unsafe { (fns.version)(&mut major, &mut minor) };
        let mut nvrtc = Nvrtc {
            fns,
            path,
            version: (0, 0),
            _lib: lib,
        };
        nvrtc.check("nvrtcVersion", rc)?;
        nvrtc.version = (major, minor);
        Ok(nvrtc)
    }

    /// The file the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// NVRTC's version (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The real architectures this NVRTC can target (`80` for sm_80), ascending.
    pub fn supported_archs(&self) -> Vec<u32> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        if unsafe { (self.fns.num_archs)(&mut n) } != 0 || n <= 0 {
            return Vec::new();
        }
        let mut v = vec![0 as c_int; n as usize];
        // SAFETY: `v` has room for the `n` entries NVRTC reported.
        if unsafe { (self.fns.archs)(v.as_mut_ptr()) } != 0 {
            return Vec::new();
        }
        v.into_iter().filter(|&a| a > 0).map(|a| a as u32).collect()
    }

    fn error_text(&self, rc: Status) -> String {
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any code.
        let p = unsafe { (self.fns.error_string)(rc) };
        if p.is_null() {
            format!("NVRTC error {rc}")
        } else {
            // SAFETY: non-null static C string (see above).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }

    fn check(&self, call: &str, rc: Status) -> Result<()> {
        if rc == 0 {
            Ok(())
        } else {
            Err(Error::Driver {
                backend: "cuda".into(),
                call: format!("{call} ({})", self.error_text(rc)),
                code: rc as i64,
            })
        }
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
        let cstr = |s: &str| {
            CString::new(s)
                .map_err(|_| Error::InvalidArgument(format!("{name}: NUL byte in NVRTC input")))
        };
        let src = cstr(source)?;
        let cname = cstr(name)?;
        let hdr_text: Vec<CString> = headers
            .iter()
            .map(|(_, t)| cstr(t))
            .collect::<Result<_>>()?;
        let hdr_name: Vec<CString> = headers
            .iter()
            .map(|(n, _)| cstr(n))
            .collect::<Result<_>>()?;
        let hdr_text_p: Vec<*const c_char> = hdr_text.iter().map(|c| c.as_ptr()).collect();
        let hdr_name_p: Vec<*const c_char> = hdr_name.iter().map(|c| c.as_ptr()).collect();
        let mut opts: Vec<CString> = vec![
            cstr(&format!("--gpu-architecture={}", target.arch_flag()))?,
            cstr("--std=c++17")?,
            cstr("-DTESSERA_CUDA=1")?,
        ];
        for o in options {
            opts.push(cstr(o)?);
        }
        let opts_p: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();

        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: all strings are NUL-terminated and live across the call; the header arrays
        // have `headers.len()` entries each.
        let rc = unsafe {
            (self.fns.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                headers.len() as c_int,
                hdr_text_p.as_ptr(),
                hdr_name_p.as_ptr(),
            )
        };
        self.check("nvrtcCreateProgram", rc)?;
        let guard = ProgGuard { nvrtc: self, prog };
        // SAFETY: `prog` is a live program; `opts_p` holds `opts_p.len()` valid C strings.
        let rc = unsafe { (self.fns.compile)(guard.prog, opts_p.len() as c_int, opts_p.as_ptr()) };
        let log = self.read(guard.prog, self.fns.log_size, self.fns.log)?;
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        if rc != 0 {
            return Err(Error::Compute {
                device: format!("NVRTC {}.{}", self.version.0, self.version.1),
                reason: format!(
                    "{name} for {}: {}: {log}",
                    target.arch_flag(),
                    self.error_text(rc)
                ),
            });
        }
        let image = match target {
            Target::Ptx(_) => self.read(guard.prog, self.fns.ptx_size, self.fns.ptx)?,
            Target::Cubin(_) => self.read(guard.prog, self.fns.cubin_size, self.fns.cubin)?,
        };
        Ok(Compiled { image, log })
    }

    fn read(
        &self,
        prog: Prog,
        size: unsafe extern "C" fn(Prog, *mut usize) -> Status,
        get: unsafe extern "C" fn(Prog, *mut c_char) -> Status,
    ) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: `prog` is live; valid out-pointer.
        self.check("nvrtcGet*Size", unsafe { size(prog, &mut n) })?;
        let mut buf = vec![0u8; n];
        if n > 0 {
            // SAFETY: `buf` has the `n` bytes NVRTC asked for.
            self.check("nvrtcGet*", unsafe {
                get(prog, buf.as_mut_ptr() as *mut c_char)
            })?;
        }
        Ok(buf)
    }
}
