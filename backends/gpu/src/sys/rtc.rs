//! A run-time compiler with NVRTC's C API (NVRTC; hipRTC, which mirrors it entry for entry) as a
//! `libloading` table: `<prefix>Version`, `CreateProgram`, `CompileProgram`,
//! `GetProgramLogSize`/`GetProgramLog`, one `Get<Output>Size`/`Get<Output>` pair per output
//! kind (NVRTC: `PTX`, `CUBIN`; hipRTC: `Code`), `DestroyProgram` and `GetErrorString`.
//! The vendor crate picks the library, the options and the output; this table does the calls.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use tessera_core::{Error, Result};

type Prog = *mut c_void;
type Status = c_int;
type Size = unsafe extern "C" fn(Prog, *mut usize) -> Status;
type Get = unsafe extern "C" fn(Prog, *mut c_char) -> Status;

struct Fns {
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> Status,
    log: (Size, Get),
    outputs: Vec<(Size, Get)>,
    destroy: unsafe extern "C" fn(*mut Prog) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

/// One successful compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The output (PTX text, a CUBIN, a code object).
    pub image: Vec<u8>,
    /// The compiler log (warnings; empty for a clean compile).
    pub log: String,
}

/// A loaded run-time compiler.
pub struct Rtc {
    fns: Fns,
    backend: &'static str,
    prefix: &'static str,
    path: PathBuf,
    version: (i32, i32),
    // Kept last so the function pointers above never outlive it.
    lib: libloading::Library,
}

impl std::fmt::Debug for Rtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rtc")
            .field("prefix", &self.prefix)
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

/// Frees a program on every path out of [`Rtc::compile`].
struct ProgGuard<'a> {
    rtc: &'a Rtc,
    prog: Prog,
}

impl Drop for ProgGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` came from `CreateProgram` and is destroyed once, here.
        unsafe { (self.rtc.fns.destroy)(&mut self.prog) };
    }
}

impl Rtc {
    /// The compiler in `lib` (loaded from `path`) whose entry points start with `prefix`
    /// (`"nvrtc"`, `"hiprtc"`), with one output kind per entry of `outputs` (`"PTX"`, `"CUBIN"`;
    /// `"Code"`); errors name `backend`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when an entry point is missing; the compiler's status when it cannot
    /// report its version.
    pub fn from_library(
        lib: libloading::Library,
        path: PathBuf,
        backend: &'static str,
        prefix: &'static str,
        outputs: &[&str],
    ) -> Result<Rtc> {
        fn sym<T: Copy>(
            lib: &libloading::Library,
            path: &Path,
            backend: &'static str,
            name: &str,
        ) -> Result<T> {
            // SAFETY: every name asked for is an entry point of NVRTC's C API (nvrtc.h; hipRTC's
            // hiprtc.h mirrors it), and `T` is the type of the field it is stored in, which has
            // exactly that C signature.
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| Error::Unavailable {
                    backend: backend.into(),
                    reason: format!("{}: missing {name}: {e}", path.display()),
                })
        }
        let name = |s: &str| format!("{prefix}{s}");
        let pair = |what: &str| -> Result<(Size, Get)> {
            Ok((
                sym(&lib, &path, backend, &name(&format!("Get{what}Size")))?,
                sym(&lib, &path, backend, &name(&format!("Get{what}")))?,
            ))
        };
        let version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status =
            sym(&lib, &path, backend, &name("Version"))?;
        let fns = Fns {
            create: sym(&lib, &path, backend, &name("CreateProgram"))?,
            compile: sym(&lib, &path, backend, &name("CompileProgram"))?,
            log: pair("ProgramLog")?,
            outputs: outputs.iter().map(|o| pair(o)).collect::<Result<_>>()?,
            destroy: sym(&lib, &path, backend, &name("DestroyProgram"))?,
            error_string: sym(&lib, &path, backend, &name("GetErrorString"))?,
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: valid out-pointers; needs no GPU.
        let rc = unsafe { version(&mut major, &mut minor) };
        let mut rtc = Rtc {
            fns,
            backend,
            prefix,
            path,
            version: (0, 0),
            lib,
        };
        rtc.check("Version", rc)?;
        rtc.version = (major, minor);
        Ok(rtc)
    }

    /// An extra entry point of the library (e.g. NVRTC's `nvrtcGetSupportedArchs`).
    ///
    /// # Safety
    /// `T` must be a function pointer type with exactly the C signature of `name`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the library lacks it.
    pub unsafe fn symbol<T: Copy>(&self, name: &str) -> Result<T> {
        // SAFETY: the caller's contract.
        unsafe { self.lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| Error::Unavailable {
                backend: self.backend.into(),
                reason: format!("{}: missing {name}: {e}", self.path.display()),
            })
    }

    /// The file the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The compiler's version (major, minor).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The text of status `rc`.
    pub fn error_text(&self, rc: i32) -> String {
        // SAFETY: `GetErrorString` returns a static NUL-terminated string (or null) for any code.
        match unsafe { super::status_text(rc, self.fns.error_string) } {
            t if t.is_empty() => format!("{} error {rc}", self.prefix),
            t => t,
        }
    }

    fn check(&self, call: &str, rc: Status) -> Result<()> {
        let call = format!("{}{call}", self.prefix);
        // SAFETY: as in `error_text`.
        unsafe { super::check_status(self.backend, &call, rc, self.fns.error_string) }
    }

    /// Compiles `source` (named `name`) with `headers` (name, text) available to `#include` and
    /// `options`, and returns output kind `output` (an index into the `outputs` given at load).
    /// `what` names the compile in errors (e.g. `norm.cu for sm_90`).
    ///
    /// # Errors
    /// [`Error::Compute`] with the compiler log when the source does not compile; the compiler's
    /// status otherwise.
    pub fn compile(
        &self,
        what: &str,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        options: &[String],
        output: usize,
    ) -> Result<Compiled> {
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| {
                Error::InvalidArgument(format!("{what}: NUL byte in {} input", self.prefix))
            })
        };
        let (src, cname) = (cstr(source)?, cstr(name)?);
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
        let opts: Vec<CString> = options.iter().map(|o| cstr(o)).collect::<Result<_>>()?;
        let opts_p: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
        let &(size, get) = self.fns.outputs.get(output).ok_or_else(|| {
            Error::InvalidArgument(format!("{}: no output kind {output}", self.prefix))
        })?;
        let (hdr_text_p, hdr_name_p) = match headers.len() {
            0 => (std::ptr::null(), std::ptr::null()),
            _ => (hdr_text_p.as_ptr(), hdr_name_p.as_ptr()),
        };
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: all strings are NUL-terminated and live across the call; the header arrays
        // have `headers.len()` entries each (or are null when there are none).
        let rc = unsafe {
            (self.fns.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                headers.len() as c_int,
                hdr_text_p,
                hdr_name_p,
            )
        };
        self.check("CreateProgram", rc)?;
        let guard = ProgGuard { rtc: self, prog };
        // SAFETY: `prog` is a live program; `opts_p` holds `opts_p.len()` valid C strings.
        let rc = unsafe { (self.fns.compile)(guard.prog, opts_p.len() as c_int, opts_p.as_ptr()) };
        let log = self.read(guard.prog, self.fns.log)?;
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        if rc != 0 {
            return Err(Error::Compute {
                device: format!("{} {}.{}", self.prefix, self.version.0, self.version.1),
                reason: format!("{what}: {}: {log}", self.error_text(rc)),
            });
        }
        let image = self.read(guard.prog, (size, get))?;
        Ok(Compiled { image, log })
    }

    fn read(&self, prog: Prog, (size, get): (Size, Get)) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: `prog` is live; valid out-pointer.
        self.check("Get*Size", unsafe { size(prog, &mut n) })?;
        let mut buf = vec![0u8; n];
        if n > 0 {
            // SAFETY: `buf` has the `n` bytes the compiler asked for.
            self.check("Get*", unsafe {
                get(prog, buf.as_mut_ptr() as *mut c_char)
            })?;
        }
        Ok(buf)
    }
}
