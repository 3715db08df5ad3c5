//! The shared crate's FFI: finding and opening vendor libraries ([`library_candidates`],
//! [`open_first`]), the NCCL C API table ([`nccl`]), which RCCL exports too, and the run-time
//! compiler table ([`rtc`]) of NVRTC and hipRTC. With kernel
//! launches and the comm trio's C entry points, the only places of `tessera-gpu` with `unsafe`.
#![allow(unsafe_code)]

pub mod nccl;
pub mod rtc;

use std::ffi::{CStr, c_char, c_int};
use std::path::PathBuf;
use tessera_core::{Error, Result};

/// A C library's function naming a status code (`ncclGetErrorString`, `hipGetErrorName`, ...).
pub type ErrorText = unsafe extern "C" fn(c_int) -> *const c_char;

/// `Ok` for status 0, else [`Error::Driver`] of `backend` naming `call` and the library's text for
/// `rc` (from `text`, e.g. `ncclAllReduce (unhandled cuda error)`).
///
/// # Safety
/// `text` must return null or a NUL-terminated string that lives for the process, for any code.
///
/// # Errors
/// The status as above.
pub unsafe fn check_status(backend: &str, call: &str, rc: c_int, text: ErrorText) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    let text = unsafe { status_text(rc, text) };
    Err(Error::Driver {
        backend: backend.into(),
        call: format!("{call} ({text})"),
        code: rc as i64,
    })
}

/// The library's text for status `rc` (empty when it has none).
///
/// # Safety
/// As for [`check_status`].
pub unsafe fn status_text(rc: c_int, text: ErrorText) -> String {
    // SAFETY: the caller's contract: null or a static C string.
    let p = unsafe { text(rc) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, so a NUL-terminated string that lives for the process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Candidate files for a library: the path in `env` (a file, or a directory holding one of
/// `names`), then the bare `names` (the loader's search path), then `names` inside the Python
/// wheel directories `wheel_dirs` (relative to `site-packages/nvidia`) of the active venv
/// (`VIRTUAL_ENV`) and of a `.venv` next to the current directory or its ancestors.
pub fn library_candidates(env: &str, names: &[&str], wheel_dirs: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_dir() {
            out.extend(names.iter().map(|n| p.join(n)));
        } else {
            out.push(p);
        }
    }
    out.extend(names.iter().map(PathBuf::from));
    let mut venvs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        venvs.push(PathBuf::from(v));
    }
    if let Ok(cwd) = std::env::current_dir() {
        venvs.extend(cwd.ancestors().map(|a| a.join(".venv")));
    }
    for venv in venvs {
        let Ok(libdir) = std::fs::read_dir(venv.join("lib")) else {
            continue;
        };
        for py in libdir.flatten() {
            let nv = py.path().join("site-packages").join("nvidia");
            for dir in wheel_dirs {
                out.extend(names.iter().map(|n| nv.join(dir).join(n)));
            }
        }
    }
    out
}

/// Opens the first loadable candidate; the error lists what was tried.
///
/// # Errors
/// A line naming how many paths were tried and why the first failed.
pub fn open_first(candidates: &[PathBuf]) -> Result<(libloading::Library, PathBuf), String> {
    let mut tried = Vec::new();
    for c in candidates {
        // SAFETY: loading a vendor library runs its initialisers; NVRTC, NCCL/RCCL and the HIP
        // runtime have no initialisers with preconditions on the host process.
        match unsafe { libloading::Library::new(c) } {
            Ok(lib) => return Ok((lib, c.clone())),
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    Err(match tried.first() {
        None => "no candidates".into(),
        Some(first) => format!("tried {} path(s); first: {first}", tried.len()),
    })
}
