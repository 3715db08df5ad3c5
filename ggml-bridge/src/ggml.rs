//! The few ggml functions the plugin calls, resolved in the loading process at run time (the
//! process that loads a ggml backend has `libggml-base` loaded already), and the version check.
//!
//! Resolving instead of linking keeps the plugin free of a link-time dependency on a particular
//! ggml build, lets its own tests run without ggml, and turns a host without these symbols into
//! an error at load instead of a failed `dlopen`.

use crate::sys;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// The ggml version whose structures [`crate::sys`] describes.
pub const GGML_VERSION: &str = "0.25.3";

type BufferInit = unsafe extern "C" fn(
    sys::ggml_backend_buffer_type_t,
    sys::ggml_backend_buffer_i,
    *mut c_void,
    usize,
) -> sys::ggml_backend_buffer_t;
type GraphNNodes = unsafe extern "C" fn(*mut sys::ggml_cgraph) -> c_int;
type GraphNode = unsafe extern "C" fn(*mut sys::ggml_cgraph, c_int) -> *mut sys::ggml_tensor;
type Version = unsafe extern "C" fn() -> *const c_char;
type Log = unsafe extern "C" fn(c_uint, *const c_char, ...);
type OpName = unsafe extern "C" fn(c_uint) -> *const c_char;

/// Entry points of the host's ggml.
pub(crate) struct Api {
    buffer_init: BufferInit,
    graph_n_nodes: GraphNNodes,
    graph_node: GraphNode,
    version: String,
    log: Option<Log>,
    op_name: Option<OpName>,
}

/// The loading process's global symbols, or, where the host loaded ggml privately (a Python
/// extension opens its libraries with RTLD_LOCAL), ggml's base library already in the process.
fn ggml_library() -> libloading::os::unix::Library {
    let this = libloading::os::unix::Library::this();
    // SAFETY: a lookup only; nothing is called.
    if unsafe { this.get::<Version>(b"ggml_version\0") }.is_ok() {
        return this;
    }
    for name in ["libggml-base.so", "libggml-base.so.0"] {
        // SAFETY: RTLD_NOLOAD only takes a reference to a library already loaded, so no
        // initialiser runs.
        if let Ok(lib) = unsafe {
            libloading::os::unix::Library::open(
                Some(name),
                libloading::os::unix::RTLD_NOW | libc::RTLD_NOLOAD,
            )
        } {
            return lib;
        }
    }
    this
}

fn resolve() -> Result<Api, String> {
    let this = ggml_library();
    // SAFETY: each symbol is looked up by its C name and read as the type ggml 0.25.3 declares for
    // it (ggml.h, ggml-backend-impl.h, ggml-impl.h); the version check below refuses any other
    // ggml before the pointers are used.
    unsafe {
        fn missing(name: &str, e: libloading::Error) -> String {
            format!(
                "the loading process has no ggml symbol {name} ({e}); load this plugin from a program built on ggml"
            )
        }
        let version: Version = *this
            .get::<Version>(b"ggml_version\0")
            .map_err(|e| missing("ggml_version", e))?;
        let v = version();
        let version = if v.is_null() {
            String::new()
        } else {
            CStr::from_ptr(v).to_string_lossy().into_owned()
        };
        let api = Api {
            buffer_init: *this
                .get::<BufferInit>(b"ggml_backend_buffer_init\0")
                .map_err(|e| missing("ggml_backend_buffer_init", e))?,
            graph_n_nodes: *this
                .get::<GraphNNodes>(b"ggml_graph_n_nodes\0")
                .map_err(|e| missing("ggml_graph_n_nodes", e))?,
            graph_node: *this
                .get::<GraphNode>(b"ggml_graph_node\0")
                .map_err(|e| missing("ggml_graph_node", e))?,
            version,
            log: this.get::<Log>(b"ggml_log_internal\0").ok().map(|s| *s),
            op_name: this.get::<OpName>(b"ggml_op_name\0").ok().map(|s| *s),
        };
        // The process handle stays open for the process's lifetime: the pointers above live in
        // libraries it has loaded, which this handle keeps loaded.
        std::mem::forget(this);
        Ok(api)
    }
}

fn api_result() -> &'static Result<Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(resolve)
}

/// The host's ggml, once its version has been checked.
pub(crate) fn api() -> Option<&'static Api> {
    check_version().ok()?;
    api_result().as_ref().ok()
}

/// Whether the loading process's ggml is the version the plugin was built against.
///
/// # Errors
/// A message naming what is missing or which version was found.
pub fn check_version() -> Result<&'static str, String> {
    let api = api_result().as_ref().map_err(Clone::clone)?;
    if api.version != GGML_VERSION {
        return Err(format!(
            "the host's ggml is version {:?}, but this Tessera plugin speaks ggml {GGML_VERSION} \
             (backend API version {}): rebuild the plugin against the host's ggml headers \
             (ggml-bridge/tools/bindgen.sh) or use llama.cpp from llama-cpp-python 0.3.36",
            api.version,
            sys::GGML_BACKEND_API_VERSION
        ));
    }
    Ok(GGML_VERSION)
}

impl Api {
    /// `ggml_backend_buffer_init`: ggml owns the returned buffer object (it frees it with its
    /// own allocator after calling `iface.free_buffer`).
    ///
    /// # Safety
    /// `buft` is a live buffer type; `iface`'s functions accept `context`.
    pub(crate) unsafe fn buffer_init(
        &self,
        buft: sys::ggml_backend_buffer_type_t,
        iface: sys::ggml_backend_buffer_i,
        context: *mut c_void,
        size: usize,
    ) -> sys::ggml_backend_buffer_t {
        // SAFETY: the caller's contract.
        unsafe { (self.buffer_init)(buft, iface, context, size) }
    }

    /// The nodes of `graph`, in order.
    ///
    /// # Safety
    /// `graph` is a live ggml graph.
    pub(crate) unsafe fn graph_nodes(
        &self,
        graph: *mut sys::ggml_cgraph,
    ) -> Vec<*mut sys::ggml_tensor> {
        // SAFETY: the caller's contract; indices stay below the node count.
        unsafe {
            let n = (self.graph_n_nodes)(graph).max(0);
            (0..n).map(|i| (self.graph_node)(graph, i)).collect()
        }
    }
}

/// How loud a message is, as ggml numbers its log levels.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Level {
    Debug = 1,
    Info = 2,
    Warning = 3,
    Error = 4,
}

/// Logs `msg` through ggml's log (so a llama.cpp user sees it where llama.cpp's own messages
/// go), or on stderr where the host has no ggml; also as a `tracing` event.
pub(crate) fn log(level: Level, msg: &str) {
    match level {
        Level::Debug => tracing::debug!(target: "tessera::ggml", "{msg}"),
        Level::Info => tracing::info!(target: "tessera::ggml", "{msg}"),
        Level::Warning => tracing::warn!(target: "tessera::ggml", "{msg}"),
        Level::Error => tracing::error!(target: "tessera::ggml", "{msg}"),
    }
    let line =
        CString::new(format!("tessera-ggml: {msg}\n").replace('\0', " ")).unwrap_or_default();
    match api_result().as_ref().ok().and_then(|a| a.log) {
        // SAFETY: a printf-style call with one `%s` and a NUL-terminated argument.
        Some(f) => unsafe { f(level as c_uint, c"%s".as_ptr(), line.as_ptr()) },
        None => eprint!("{}", line.to_string_lossy()),
    }
}

/// ggml's name of op `op` (`ADD`, `MUL_MAT`, ...), from the host's ggml; `op <n>` without one.
pub(crate) fn op_name(op: c_uint) -> String {
    let name = api_result()
        .as_ref()
        .ok()
        .filter(|a| a.version == GGML_VERSION && op < sys::ggml_op_GGML_OP_COUNT)
        .and_then(|a| a.op_name)
        // SAFETY: `ggml_op_name` returns a static string for every op below GGML_OP_COUNT.
        .map(|f| unsafe { f(op) })
        .filter(|p| !p.is_null())
        // SAFETY: as above.
        .map(|p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    name.unwrap_or_else(|| format!("op {op}"))
}

/// Runs the body of a C entry point: a panic (a bug, since Tessera reports failures as errors)
/// is logged and turned into `fail`, ggml's failure value, instead of unwinding into C (which
/// would abort the host).
pub(crate) fn guard<T>(what: &str, fail: T, body: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            log(Level::Error, &format!("{what} panicked: {why}"));
            fail
        }
    }
}
