//! Opening a plugin: the library, its entry symbol, and checks of every table before use.
#![allow(unsafe_code)]

use crate::abi::{
    ABI_MAGIC, ABI_VERSION, ENTRY_SYMBOL, EntryFn, RawBackendTable, RawBufferTable,
    RawBufferTypeTable, RawDeviceTable, RawError, RawErrorOut, RawEventTable, RawHeader, RawHost,
    RawRegistry, RawStr, RawStrOut,
};
use crate::codec::decode_error;
use crate::log::{host_log, host_max_level};
use parking_lot::Mutex;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tessera_core::comm::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT};
use tessera_core::error::{Error, Result};

/// Why a plugin could not be loaded. Every variant names the file; other plugins still load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The shared library could not be opened (missing file, wrong architecture, unresolved
    /// dependencies).
    #[error("{file}: cannot open the library: {reason}")]
    Open {
        /// The file.
        file: String,
        /// The loader's message.
        reason: String,
    },
    /// The entry symbol is not exported: not a Tessera plugin.
    #[error("{file}: no `{symbol}` symbol (not a Tessera backend plugin): {reason}")]
    MissingSymbol {
        /// The file.
        file: String,
        /// The symbol looked for.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },
    /// The entry returned null (the plugin's constructor failed or panicked; its log says why).
    #[error("{file}: `{symbol}` returned no registry (see the plugin's log above)")]
    InitFailed {
        /// The file.
        file: String,
        /// The entry symbol.
        symbol: &'static str,
    },
    /// A table does not start with the Tessera magic number.
    #[error("{file}: the {table} table has magic {found:#018x}, expected {expected:#018x}")]
    BadMagic {
        /// The file.
        file: String,
        /// Which table.
        table: &'static str,
        /// What the plugin has.
        found: u64,
        /// What this build expects.
        expected: u64,
    },
    /// The plugin speaks another ABI version.
    #[error(
        "{file}: the {table} table has ABI version {found}, this build of Tessera speaks {expected}"
    )]
    AbiVersion {
        /// The file.
        file: String,
        /// Which table.
        table: &'static str,
        /// The plugin's version.
        found: u32,
        /// This build's version.
        expected: u32,
    },
    /// A table is smaller than this build's definition, or missing.
    #[error("{file}: the {table} table is {found} bytes, at least {expected} expected")]
    StructSize {
        /// The file.
        file: String,
        /// Which table.
        table: &'static str,
        /// Its size (0 when the pointer is null).
        found: u32,
        /// This build's size.
        expected: u32,
    },
}

impl LoadError {
    /// The file the error is about.
    pub fn file(&self) -> &str {
        match self {
            LoadError::Open { file, .. }
            | LoadError::MissingSymbol { file, .. }
            | LoadError::InitFailed { file, .. }
            | LoadError::BadMagic { file, .. }
            | LoadError::AbiVersion { file, .. }
            | LoadError::StructSize { file, .. } => file,
        }
    }
}

impl From<LoadError> for Error {
    fn from(e: LoadError) -> Error {
        Error::Plugin {
            file: e.file().to_string(),
            call: "load".into(),
            reason: e.to_string(),
        }
    }
}

/// The comm trio of a plugin, as the plugin exports it (it takes plugin handles).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawComm {
    pub init: tessera_core::comm::CommInitFn,
    pub allreduce: tessera_core::comm::CommAllReduceFn,
    pub free: tessera_core::comm::CommFreeFn,
}

/// One loaded plugin: its validated tables. Every host object of the plugin holds an `Arc` of it,
/// and it holds the library, so no code or table is unmapped while objects live.
#[derive(Debug)]
pub(crate) struct Lib {
    /// The path as given.
    pub file: String,
    /// The file name (`libtessera_cpu.so`), used to qualify names.
    pub file_name: String,
    pub reg: RawRegistry,
    pub dev: RawDeviceTable,
    pub buft: RawBufferTypeTable,
    pub buf: RawBufferTable,
    pub be: RawBackendTable,
    pub ev: RawEventTable,
    pub comm: Option<RawComm>,
    _library: Arc<libloading::Library>,
}

// SAFETY: the tables are immutable function pointers and the plugin's registry object, which is
// Send + Sync (the `Registry` bound the export adapter requires); the library handle is shareable.
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

/// Libraries stay mapped for the life of the process, as in ggml: threads a plugin started (stream
/// workers, pools) may outlive its last object, and unmapping their code would crash them.
static KEPT: Mutex<Vec<Arc<libloading::Library>>> = Mutex::new(Vec::new());

/// Checks a table's header; `ptr` must point to at least a readable header when non-null.
fn check_table<T: Copy>(file: &str, table: &'static str, ptr: *const T) -> Result<T, LoadError> {
    let expected = std::mem::size_of::<T>() as u32;
    if ptr.is_null() {
        return Err(LoadError::StructSize {
            file: file.into(),
            table,
            found: 0,
            expected,
        });
    }
    // SAFETY: every table starts with a header (ABI); the plugin returned this pointer for it.
    let h = unsafe { std::ptr::read(ptr as *const RawHeader) };
    if h.magic != ABI_MAGIC {
        return Err(LoadError::BadMagic {
            file: file.into(),
            table,
            found: h.magic,
            expected: ABI_MAGIC,
        });
    }
    if h.abi_version != ABI_VERSION {
        return Err(LoadError::AbiVersion {
            file: file.into(),
            table,
            found: h.abi_version,
            expected: ABI_VERSION,
        });
    }
    if h.struct_size < expected {
        return Err(LoadError::StructSize {
            file: file.into(),
            table,
            found: h.struct_size,
            expected,
        });
    }
    // SAFETY: the table is at least as large as this build's definition (checked above); entries
    // beyond it, appended by newer plugins, are not read.
    Ok(unsafe { std::ptr::read(ptr) })
}

/// Opens `path`, calls its entry with the host's services and validates every table.
pub(crate) fn open(path: &Path) -> Result<Arc<Lib>, LoadError> {
    let file = path.display().to_string();
    let file_name = path
        .file_name()
        .map_or_else(|| file.clone(), |n| n.to_string_lossy().into_owned());
    // SAFETY: loading runs the library's initialisers; Tessera plugins are Rust cdylibs whose
    // initialisers are the standard library's. Loading arbitrary code is what the caller asked.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::Open {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    let library = Arc::new(library);
    KEPT.lock().push(library.clone());
    // SAFETY: the symbol, if present, has the entry's documented signature (ABI).
    let entry: EntryFn = unsafe { library.get::<EntryFn>(ENTRY_SYMBOL.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| LoadError::MissingSymbol {
            file: file.clone(),
            symbol: ENTRY_SYMBOL,
            reason: e.to_string(),
        })?;
    // The log context outlives the library, which is never unloaded.
    let log_ctx: &'static String = Box::leak(Box::new(file_name.clone()));
    let host = RawHost {
        header: RawHeader::of::<RawHost>(),
        log_ctx: log_ctx as *const String as *mut c_void,
        log: host_log,
        max_log_level: host_max_level(),
        setting: crate::settings::host_setting,
    };
    // SAFETY: `host` lives for the call; the entry is the plugin's documented init function.
    let reg_ptr = unsafe { entry(&host) };
    if reg_ptr.is_null() {
        return Err(LoadError::InitFailed {
            file,
            symbol: ENTRY_SYMBOL,
        });
    }
    let reg = check_table(&file, "registry", reg_ptr)?;
    let lib = Lib {
        dev: check_table(&file, "device", reg.device)?,
        buft: check_table(&file, "buffer type", reg.buffer_type)?,
        buf: check_table(&file, "buffer", reg.buffer)?,
        be: check_table(&file, "backend", reg.backend)?,
        ev: check_table(&file, "event", reg.event)?,
        comm: None,
        reg,
        file,
        file_name,
        _library: library,
    };
    let comm = lib.find_comm();
    Ok(Arc::new(Lib { comm, ..lib }))
}

/// Where an entry writes its error.
struct ErrorSlot<'a> {
    file: &'a str,
    call: &'static str,
    error: Option<Error>,
}

unsafe extern "C" fn set_error(ctx: *mut c_void, raw: *const RawError) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the `ErrorSlot` of the ongoing `Lib::call`; `raw` is lent for the call.
        let (slot, raw) = unsafe { (&mut *(ctx as *mut ErrorSlot<'_>), raw.as_ref()) };
        if let Some(raw) = raw {
            // SAFETY: the error's strings are lent for the call (ABI contract).
            slot.error = Some(unsafe { decode_error(raw, slot.file, slot.call) });
        }
    }));
}

impl Lib {
    /// Runs a fallible entry with an error sink: a non-negative status is returned, a negative
    /// one becomes the error the plugin reported (or [`Error::Plugin`] if it reported none).
    pub(crate) fn call(
        &self,
        call: &'static str,
        f: impl FnOnce(*const RawErrorOut) -> i32,
    ) -> Result<i32> {
        let mut slot = ErrorSlot {
            file: &self.file,
            call,
            error: None,
        };
        let out = RawErrorOut {
            ctx: &mut slot as *mut ErrorSlot<'_> as *mut c_void,
            set: set_error,
        };
        let status = f(&out);
        if status >= 0 {
            return Ok(status);
        }
        Err(slot.error.take().unwrap_or_else(|| Error::Plugin {
            file: self.file.clone(),
            call: call.into(),
            reason: format!("returned status {status} without an error"),
        }))
    }

    /// Collects what an entry writes to a string sink.
    pub(crate) fn string(&self, f: impl FnOnce(*const RawStrOut)) -> String {
        let mut bytes: Vec<u8> = Vec::new();
        let out = RawStrOut::into_vec(&mut bytes);
        f(&out);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether `other` is the same loaded plugin (the same registry object).
    pub(crate) fn same(&self, other: &Lib) -> bool {
        std::ptr::eq(self.reg.ctx, other.reg.ctx)
    }

    /// The plugin's raw address for `name`, or null.
    pub(crate) fn raw_proc_address(&self, name: &str) -> *const c_void {
        // SAFETY: the registry table was validated at load; the name is lent for the call.
        unsafe { (self.reg.proc_address)(self.reg.ctx, RawStr::new(name)) }
    }

    fn find_comm(&self) -> Option<RawComm> {
        let (i, a, f) = (
            self.raw_proc_address(COMM_INIT),
            self.raw_proc_address(COMM_ALLREDUCE),
            self.raw_proc_address(COMM_FREE),
        );
        if i.is_null() || a.is_null() || f.is_null() {
            return None;
        }
        // SAFETY: these names carry exactly these signatures (the comm trio's documented ABI).
        unsafe {
            Some(RawComm {
                init: std::mem::transmute::<*const c_void, tessera_core::comm::CommInitFn>(i),
                allreduce: std::mem::transmute::<*const c_void, tessera_core::comm::CommAllReduceFn>(
                    a,
                ),
                free: std::mem::transmute::<*const c_void, tessera_core::comm::CommFreeFn>(f),
            })
        }
    }
}

/// Environment variable: colon-separated directories searched for plugins.
pub const BACKEND_PATH_ENV: &str = "TESSERA_BACKEND_PATH";

/// Whether `name` looks like a backend plugin: `libtessera-*.so` or `libtessera_*.so` (with the
/// platform's prefix and suffix).
pub fn is_plugin_file_name(name: &str) -> bool {
    let (prefix, suffix) = (std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    ["tessera-", "tessera_"].iter().any(|stem| {
        name.strip_prefix(prefix)
            .and_then(|n| n.strip_prefix(stem))
            .and_then(|n| n.strip_suffix(suffix))
            .is_some_and(|rest| !rest.is_empty())
    })
}

/// The directories of `TESSERA_BACKEND_PATH`, in order (empty entries skipped).
pub fn env_dirs() -> Vec<PathBuf> {
    std::env::var_os(BACKEND_PATH_ENV)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The directories plugins are searched in: each of `TESSERA_BACKEND_PATH` in order, then the
/// running executable's directory.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = env_dirs();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(dir);
    }
    dirs
}

/// The plugin files in `dirs`, sorted by name within a directory; a file name found in an
/// earlier directory hides later ones (as `PATH` does). Unreadable directories are skipped.
pub fn find_plugins(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut seen_names = std::collections::HashSet::new();
    let mut seen_paths = std::collections::HashSet::new();
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            tracing::debug!(dir = %dir.display(), "plugin directory not readable; skipped");
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(is_plugin_file_name)
            })
            .collect();
        files.sort();
        for f in files {
            let canonical = f.canonicalize().unwrap_or_else(|_| f.clone());
            let name = f.file_name().map(|n| n.to_os_string());
            if seen_paths.insert(canonical) && seen_names.insert(name) {
                out.push(f);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_file_names() {
        let so = |s: &str| {
            format!(
                "{}{s}{}",
                std::env::consts::DLL_PREFIX,
                std::env::consts::DLL_SUFFIX
            )
        };
        assert!(is_plugin_file_name(&so("tessera_cpu")));
        assert!(is_plugin_file_name(&so("tessera-cuda")));
        assert!(!is_plugin_file_name(&so("tessera_")));
        assert!(!is_plugin_file_name(&so("tesseract")));
        assert!(!is_plugin_file_name("libtessera_cpu.rlib"));
    }

    #[test]
    fn earlier_directories_hide_later_files_of_the_same_name() {
        let root = std::env::temp_dir().join(format!("tessera-find-{}", std::process::id()));
        let (a, b) = (root.join("a"), root.join("b"));
        for d in [&a, &b] {
            std::fs::create_dir_all(d).unwrap();
        }
        let name = |s: &str| {
            format!(
                "{}{s}{}",
                std::env::consts::DLL_PREFIX,
                std::env::consts::DLL_SUFFIX
            )
        };
        for (dir, f) in [
            (&a, "tessera_x"),
            (&b, "tessera_x"),
            (&b, "tessera_y"),
            (&b, "other"),
        ] {
            std::fs::write(dir.join(name(f)), b"").unwrap();
        }
        let found = find_plugins(&[a.clone(), b.clone(), a.clone(), root.join("missing")]);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            found,
            vec![a.join(name("tessera_x")), b.join(name("tessera_y"))]
        );
    }

    #[test]
    fn a_missing_file_is_a_typed_error_naming_it() {
        let e = open(Path::new("/nonexistent/libtessera_none.so")).unwrap_err();
        assert!(matches!(e, LoadError::Open { .. }));
        assert_eq!(e.file(), "/nonexistent/libtessera_none.so");
        let as_error: Error = e.into();
        assert!(as_error.to_string().contains("libtessera_none.so"));
    }
}
