//! The FFI layer of the HIP backend, the only place with `unsafe` besides kernel launches and the
//! comm trio: the HIP runtime and hipRTC as one hand-written `libloading` table of stable C entry
//! points (no link-time `amdhip64`, no `hipDeviceProp_t`, whose layout changed between ROCm 5 and
//! 6; properties are read one by one with `hipDeviceGetAttribute`).
//!
//! The runtime is found through `TESSERA_AMDHIP_PATH` (a file or a directory), then
//! `libamdhip64.so.6`, `libamdhip64.so.5`, `libamdhip64.so` on the loader's path and in
//! `/opt/rocm/lib`. hipRTC is part of `libamdhip64.so.5` on ROCm 5; ROCm 6 ships it as
//! `libhiprtc.so.6`, also found through `TESSERA_HIPRTC_PATH`.
//!
//! With no GPU the runtime returns error codes (`hipGetDeviceCount`: 100, `hipErrorNoDevice`);
//! every wrapper turns them into errors and never panics.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tessera_core::error::check_range;
use tessera_core::{Error, Result};
use tessera_gpu::rtc::Rtc;

/// Environment variable naming the HIP runtime library (or its directory).
pub const AMDHIP_PATH_ENV: &str = "TESSERA_AMDHIP_PATH";
/// Environment variable naming the hipRTC library (or its directory), when it is not part of the
/// runtime library (ROCm ≥ 6).
pub const HIPRTC_PATH_ENV: &str = "TESSERA_HIPRTC_PATH";

/// `hipErrorNoDevice`.
pub const HIP_ERROR_NO_DEVICE: i32 = 100;
const HIP_ERROR_NOT_READY: i32 = 600;
/// The first runtime version (`hipRuntimeGetVersion`, 5.5.0) whose hipRTC is allowed gfx11.
const GFX11_MIN_RUNTIME: i32 = 50_500_000;
// hipDeviceAttribute_t values (the same in ROCm 5.x and 6.x headers for these entries).
const ATTR_MULTIPROCESSORS: c_int = 63;
const ATTR_WARP_SIZE: c_int = 87;
// hipMemcpyKind.
const H2D: c_int = 1;
const D2H: c_int = 2;
const D2D: c_int = 3;
const DEFAULT: c_int = 4;

type Status = c_int;
type Raw = *mut c_void;

struct Runtime {
    get_device_count: unsafe extern "C" fn(*mut c_int) -> Status,
    runtime_version: unsafe extern "C" fn(*mut c_int) -> Status,
    error_name: unsafe extern "C" fn(Status) -> *const c_char,
    set_device: unsafe extern "C" fn(c_int) -> Status,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> Status,
    attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> Status,
    total_mem: unsafe extern "C" fn(*mut usize, c_int) -> Status,
    mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> Status,
    device_sync: unsafe extern "C" fn() -> Status,
    malloc: unsafe extern "C" fn(*mut Raw, usize) -> Status,
    free: unsafe extern "C" fn(Raw) -> Status,
    memcpy: unsafe extern "C" fn(Raw, *const c_void, usize, c_int) -> Status,
    memcpy_async: unsafe extern "C" fn(Raw, *const c_void, usize, c_int, Raw) -> Status,
    memcpy_peer_async: unsafe extern "C" fn(Raw, c_int, *const c_void, c_int, usize, Raw) -> Status,
    memset: unsafe extern "C" fn(Raw, c_int, usize) -> Status,
    memset_async: unsafe extern "C" fn(Raw, c_int, usize, Raw) -> Status,
    stream_create: unsafe extern "C" fn(*mut Raw, c_uint) -> Status,
    stream_destroy: unsafe extern "C" fn(Raw) -> Status,
    stream_sync: unsafe extern "C" fn(Raw) -> Status,
    stream_wait_event: unsafe extern "C" fn(Raw, Raw, c_uint) -> Status,
    event_create: unsafe extern "C" fn(*mut Raw, c_uint) -> Status,
    event_record: unsafe extern "C" fn(Raw, Raw) -> Status,
    event_sync: unsafe extern "C" fn(Raw) -> Status,
    event_query: unsafe extern "C" fn(Raw) -> Status,
    event_destroy: unsafe extern "C" fn(Raw) -> Status,
    module_load_data: unsafe extern "C" fn(*mut Raw, *const c_void) -> Status,
    module_get_function: unsafe extern "C" fn(*mut Raw, Raw, *const c_char) -> Status,
    module_unload: unsafe extern "C" fn(Raw) -> Status,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        Raw,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Raw,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Status,
}

/// Stream capture into graphs (hip_runtime_api.h, HIP 4.3 and later), for replaying programs.
struct GraphApi {
    begin_capture: unsafe extern "C" fn(Raw, c_int) -> Status,
    end_capture: unsafe extern "C" fn(Raw, *mut Raw) -> Status,
    instantiate: unsafe extern "C" fn(*mut Raw, Raw, *mut Raw, *mut c_char, usize) -> Status,
    launch: unsafe extern "C" fn(Raw, Raw) -> Status,
    exec_destroy: unsafe extern "C" fn(Raw) -> Status,
    destroy: unsafe extern "C" fn(Raw) -> Status,
}

/// `hipStreamCaptureModeThreadLocal`: another thread's unrelated calls neither join nor break a
/// recording.
const CAPTURE_THREAD_LOCAL: c_int = 1;

/// The loaded HIP runtime (and hipRTC, when found).
pub struct Hip {
    rt: Runtime,
    /// Stream capture and graphs, or why the runtime has none (programs then launch node by node).
    graph: std::result::Result<GraphApi, String>,
    rtc: std::result::Result<Rtc, String>,
    /// hipRTC of ROCm 5.2 crashes when two programs compile at once: one compile at a time.
    rtc_lock: std::sync::Mutex<()>,
    path: PathBuf,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Hip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hip").field("path", &self.path).finish()
    }
}

fn unavailable(reason: String) -> Error {
    Error::Unavailable {
        backend: "hip".into(),
        reason,
    }
}

fn candidates(env: &str, names: &[&str]) -> Vec<PathBuf> {
    let mut out = tessera_gpu::loader::library_candidates(env, names, &[]);
    out.extend(names.iter().map(|n| Path::new("/opt/rocm/lib").join(n)));
    out
}

macro_rules! sym {
    ($lib:expr, $path:expr, $name:literal) => {
        // SAFETY: the symbol is the HIP/hipRTC C entry point of this name, stored in a field of
        // exactly its C signature (hip_runtime_api.h / hiprtc.h; handles as pointers, enums as
        // int, size_t as usize).
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("{}: missing {}: {e}", $path.display(), $name))?
    };
}

fn load_graph_api(lib: &libloading::Library, path: &Path) -> std::result::Result<GraphApi, String> {
    Ok(GraphApi {
        begin_capture: sym!(lib, path, "hipStreamBeginCapture"),
        end_capture: sym!(lib, path, "hipStreamEndCapture"),
        instantiate: sym!(lib, path, "hipGraphInstantiate"),
        launch: sym!(lib, path, "hipGraphLaunch"),
        exec_destroy: sym!(lib, path, "hipGraphExecDestroy"),
        destroy: sym!(lib, path, "hipGraphDestroy"),
    })
}

fn load_runtime(lib: &libloading::Library, path: &Path) -> std::result::Result<Runtime, String> {
    Ok(Runtime {
        get_device_count: sym!(lib, path, "hipGetDeviceCount"),
        runtime_version: sym!(lib, path, "hipRuntimeGetVersion"),
        error_name: sym!(lib, path, "hipGetErrorName"),
        set_device: sym!(lib, path, "hipSetDevice"),
        device_name: sym!(lib, path, "hipDeviceGetName"),
        attribute: sym!(lib, path, "hipDeviceGetAttribute"),
        total_mem: sym!(lib, path, "hipDeviceTotalMem"),
        mem_info: sym!(lib, path, "hipMemGetInfo"),
        device_sync: sym!(lib, path, "hipDeviceSynchronize"),
        malloc: sym!(lib, path, "hipMalloc"),
        free: sym!(lib, path, "hipFree"),
        memcpy: sym!(lib, path, "hipMemcpy"),
        memcpy_async: sym!(lib, path, "hipMemcpyAsync"),
        memcpy_peer_async: sym!(lib, path, "hipMemcpyPeerAsync"),
        memset: sym!(lib, path, "hipMemset"),
        memset_async: sym!(lib, path, "hipMemsetAsync"),
        stream_create: sym!(lib, path, "hipStreamCreateWithFlags"),
        stream_destroy: sym!(lib, path, "hipStreamDestroy"),
        stream_sync: sym!(lib, path, "hipStreamSynchronize"),
        stream_wait_event: sym!(lib, path, "hipStreamWaitEvent"),
        event_create: sym!(lib, path, "hipEventCreateWithFlags"),
        event_record: sym!(lib, path, "hipEventRecord"),
        event_sync: sym!(lib, path, "hipEventSynchronize"),
        event_query: sym!(lib, path, "hipEventQuery"),
        event_destroy: sym!(lib, path, "hipEventDestroy"),
        module_load_data: sym!(lib, path, "hipModuleLoadData"),
        module_get_function: sym!(lib, path, "hipModuleGetFunction"),
        module_unload: sym!(lib, path, "hipModuleUnload"),
        launch: sym!(lib, path, "hipModuleLaunchKernel"),
    })
}

impl Hip {
    /// The process-wide runtime, loaded on first use (see the module docs), or why it is missing.
    pub fn get() -> std::result::Result<&'static Hip, String> {
        static HIP: OnceLock<std::result::Result<Hip, String>> = OnceLock::new();
        HIP.get_or_init(Hip::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> std::result::Result<Hip, String> {
        let names = ["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];
        let (lib, path) = tessera_gpu::loader::open_first(&candidates(AMDHIP_PATH_ENV, &names))
            .map_err(|e| format!("HIP runtime not found (set {AMDHIP_PATH_ENV}): {e}"))?;
        let rt = load_runtime(&lib, &path)?;
        let graph = load_graph_api(&lib, &path);
        // ROCm 5 has hipRTC inside the runtime library (opened again: one more reference);
        // ROCm 6 ships it as its own library.
        let load_rtc = |(lib, path)| {
            Rtc::from_library(lib, path, "hip", "hiprtc", &["Code"]).map_err(|e| e.to_string())
        };
        let bundled = tessera_gpu::loader::open_first(std::slice::from_ref(&path))
            .and_then(load_rtc)
            .ok()
            .filter(|_| std::env::var_os(HIPRTC_PATH_ENV).is_none());
        let rtc = match bundled {
            Some(rtc) => Ok(rtc),
            None => {
                let names = ["libhiprtc.so.6", "libhiprtc.so.5", "libhiprtc.so"];
                tessera_gpu::loader::open_first(&candidates(HIPRTC_PATH_ENV, &names))
                    .map_err(|e| format!("hipRTC not found (set {HIPRTC_PATH_ENV}): {e}"))
                    .and_then(load_rtc)
            }
        };
        tracing::debug!(path = %path.display(), hiprtc = rtc.is_ok(), "HIP runtime loaded");
        Ok(Hip {
            rt,
            graph,
            rtc,
            rtc_lock: std::sync::Mutex::new(()),
            path,
            _lib: lib,
        })
    }

    /// The file the runtime was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether streams can record their work into graphs and replay them (the runtime exports
    /// hipStreamBeginCapture, hipGraphInstantiate and the rest), or the reason they cannot.
    ///
    /// # Errors
    /// The missing entry point.
    pub fn graphs(&self) -> std::result::Result<(), &str> {
        self.graph.as_ref().map(|_| ()).map_err(String::as_str)
    }

    fn check(&self, call: &str, rc: Status) -> Result<()> {
        // SAFETY: hipGetErrorName returns a static C string (or null) for any code.
        unsafe { tessera_gpu::sys::check_status("hip", call, rc, self.rt.error_name) }
    }

    /// GPUs visible to HIP. `hipErrorNoDevice` is reported as an error naming it.
    ///
    /// # Errors
    /// The runtime's status as [`Error::Driver`].
    pub fn device_count(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check("hipGetDeviceCount", unsafe {
            (self.rt.get_device_count)(&mut n)
        })?;
        Ok(n.max(0) as usize)
    }

    /// `hipRuntimeGetVersion` (e.g. 50221153 for ROCm 5.2's HIP 5.2.21153); needs no GPU.
    ///
    /// # Errors
    /// The runtime's status as [`Error::Driver`].
    pub fn runtime_version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        self.check("hipRuntimeGetVersion", unsafe {
            (self.rt.runtime_version)(&mut v)
        })?;
        Ok(v)
    }

    fn rtc(&self) -> Result<&Rtc> {
        self.rtc.as_ref().map_err(|e| unavailable(e.clone()))
    }

    /// hipRTC's version (ROCm 5.2 reports 9.0).
    ///
    /// # Errors
    /// [`Error::Unavailable`] without hipRTC, else its status.
    pub fn rtc_version(&self) -> Result<(i32, i32)> {
        Ok(self.rtc()?.version())
    }

    /// Compiles one self-contained HIP source for `arch` (e.g. `gfx90a`) into a code object.
    /// Returns the code object and the compiler log.
    ///
    /// Refuses gfx11 targets on runtimes before HIP 5.5: ROCm 5.2's hipRTC aborts the whole
    /// process for them (toolchains.md §1).
    ///
    /// # Errors
    /// [`Error::Compute`] with the compiler log when the source does not compile.
    pub fn compile(&self, name: &str, source: &str, arch: &str) -> Result<(Vec<u8>, String)> {
        let rtc = self.rtc()?;
        let version = self.runtime_version().unwrap_or(0);
        if arch.starts_with("gfx11") && version < GFX11_MIN_RUNTIME {
            return Err(unavailable(format!(
                "hipRTC of HIP {version} cannot compile for {arch} (ROCm 5.2's aborts the \
                 process); use ROCm >= 5.5 or code objects built ahead of time"
            )));
        }
        let opts = [
            format!("--offload-arch={arch}"),
            "-O3".to_string(),
            "-std=c++17".to_string(),
        ];
        let _one_at_a_time = self.rtc_lock.lock().unwrap_or_else(|p| p.into_inner());
        let what = format!("{name} for {arch}");
        let compiled = rtc.compile(&what, name, source, &[], &opts, 0)?;
        Ok((compiled.image, compiled.log))
    }
}

/// One GPU: its ordinal and the properties read when it was opened.
#[derive(Debug)]
pub struct Gpu {
    hip: &'static Hip,
    ordinal: usize,
    name: String,
    arch: String,
    warp_size: i32,
    compute_units: i32,
    total_mem: usize,
}

impl Gpu {
    /// Opens GPU `ordinal`; `arch` is its gfx target (see `crate::arch_of`).
    pub(crate) fn open(hip: &'static Hip, ordinal: usize, arch: String) -> Result<Arc<Gpu>> {
        let dev = ordinal as c_int;
        // SAFETY: a plain call with a device ordinal below the device count.
        hip.check("hipSetDevice", unsafe { (hip.rt.set_device)(dev) })?;
        let mut name = [0u8; 256];
        // SAFETY: `name` has room for 256 bytes including the NUL.
        hip.check("hipDeviceGetName", unsafe {
            (hip.rt.device_name)(name.as_mut_ptr() as *mut c_char, 256, dev)
        })?;
        let name = CStr::from_bytes_until_nul(&name)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        let attr = |a: c_int, what: &str| -> Result<i32> {
            let mut v = 0;
            // SAFETY: valid out-pointer, attribute id from the HIP headers, valid ordinal.
            hip.check(what, unsafe { (hip.rt.attribute)(&mut v, a, dev) })?;
            Ok(v)
        };
        let warp_size = attr(ATTR_WARP_SIZE, "hipDeviceGetAttribute(WarpSize)")?;
        let compute_units = attr(ATTR_MULTIPROCESSORS, "hipDeviceGetAttribute(CUs)")?;
        let mut total_mem = 0usize;
        // SAFETY: valid out-pointer and ordinal.
        hip.check("hipDeviceTotalMem", unsafe {
            (hip.rt.total_mem)(&mut total_mem, dev)
        })?;
        Ok(Arc::new(Gpu {
            hip,
            ordinal,
            name,
            arch,
            warp_size,
            compute_units,
            total_mem,
        }))
    }

    /// The HIP ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// The marketing name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The gfx target (e.g. `gfx90a`).
    pub fn arch(&self) -> &str {
        &self.arch
    }
    /// Hardware wavefront width (32 or 64).
    pub fn warp_size(&self) -> i32 {
        self.warp_size
    }
    /// Compute units.
    pub fn compute_units(&self) -> i32 {
        self.compute_units
    }
    /// Device memory in bytes.
    pub fn total_mem(&self) -> usize {
        self.total_mem
    }
    /// The runtime.
    pub(crate) fn hip(&self) -> &'static Hip {
        self.hip
    }

    /// Makes this GPU current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: a plain call with this GPU's ordinal.
        self.hip.check("hipSetDevice", unsafe {
            (self.hip.rt.set_device)(self.ordinal as c_int)
        })
    }

    /// (free, total) bytes.
    pub(crate) fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        self.hip.check("hipMemGetInfo", unsafe {
            (self.hip.rt.mem_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    /// Waits for all work queued on this GPU.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments.
        self.hip.check("hipDeviceSynchronize", unsafe {
            (self.hip.rt.device_sync)()
        })
    }
}

/// A device allocation, freed on drop.
#[derive(Debug)]
pub struct DeviceMem {
    gpu: Arc<Gpu>,
    ptr: u64,
    size: usize,
}

// SAFETY: a device address is plain data; every use binds the GPU first.
unsafe impl Send for DeviceMem {}
// SAFETY: as for Send; concurrent host access goes through the runtime, which is thread-safe.
unsafe impl Sync for DeviceMem {}

impl DeviceMem {
    /// Allocates `size` bytes (at least 1) on `gpu`.
    pub(crate) fn alloc(gpu: &Arc<Gpu>, size: usize) -> Result<DeviceMem> {
        gpu.bind()?;
        let mut p: Raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { (gpu.hip.rt.malloc)(&mut p, size.max(1)) };
        if rc == 2 {
            // hipErrorOutOfMemory
            return Err(Error::OutOfMemory {
                device: gpu.name.clone(),
                requested: size,
            });
        }
        gpu.hip.check("hipMalloc", rc)?;
        let mem = DeviceMem {
            gpu: gpu.clone(),
            ptr: p as u64,
            size,
        };
        // Zeroed, as the CUDA backend's allocations.
        // SAFETY: the whole fresh allocation (at least one byte was allocated).
        let rc = unsafe { (gpu.hip.rt.memset)(p, 0, size.max(1)) };
        gpu.hip.check("hipMemset", rc)?;
        Ok(mem)
    }
    /// Device address.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
    /// The GPU holding it.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
    fn at(&self, offset: usize, len: usize) -> Result<Raw> {
        check_range(
            &format_args!("{} memory {:#x}", self.gpu.name, self.ptr),
            offset,
            len,
            self.size,
        )?;
        Ok((self.ptr + offset as u64) as usize as Raw)
    }
    /// Blocking write after all queued work of the GPU.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.at(offset, src.len())?;
        self.gpu.synchronize()?;
        // SAFETY: the range is inside the allocation (checked); the copy is synchronous.
        let rc =
            unsafe { (self.gpu.hip.rt.memcpy)(dst, src.as_ptr() as *const c_void, src.len(), H2D) };
        self.gpu.hip.check("hipMemcpy(HtoD)", rc)
    }
    /// Blocking read after all queued work of the GPU.
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.at(offset, dst.len())?;
        self.gpu.synchronize()?;
        // SAFETY: the range is inside the allocation (checked); the copy is synchronous.
        let rc = unsafe { (self.gpu.hip.rt.memcpy)(dst.as_mut_ptr() as Raw, src, dst.len(), D2H) };
        self.gpu.hip.check("hipMemcpy(DtoH)", rc)
    }
    /// Blocking memset after all queued work of the GPU.
    pub(crate) fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.at(offset, len)?;
        self.gpu.synchronize()?;
        // SAFETY: the range is inside the allocation (checked).
        let rc = unsafe { (self.gpu.hip.rt.memset)(dst, value as c_int, len) };
        self.gpu.hip.check("hipMemset", rc)?;
        self.gpu.synchronize()
    }
    /// Blocking copy from `src` (this GPU or another), after the queued work of both GPUs.
    pub(crate) fn copy_from(
        &self,
        dst_off: usize,
        src: &DeviceMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        let d = self.at(dst_off, len)?;
        let s = src.at(src_off, len)?;
        src.gpu.synchronize()?;
        self.gpu.synchronize()?;
        // Between GPUs, hipMemcpyDefault lets the runtime find both devices from the addresses
        // (unified addressing).
        let kind = if Arc::ptr_eq(&self.gpu, &src.gpu) {
            D2D
        } else {
            DEFAULT
        };
        // SAFETY: both ranges are inside live allocations (checked); the copy is synchronous.
        let rc = unsafe { (self.gpu.hip.rt.memcpy)(d, s, len, kind) };
        self.gpu.hip.check("hipMemcpy(DtoD)", rc)?;
        self.gpu.synchronize()
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: allocated by hipMalloc, freed once; users hold the owner alive while queued.
            let _ = unsafe { (self.gpu.hip.rt.free)(self.ptr as usize as Raw) };
        }
    }
}

/// A non-blocking stream, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    gpu: Arc<Gpu>,
    raw: Raw,
}

// SAFETY: HIP streams may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as for Send; the runtime serialises queueing.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream on `gpu` (`hipStreamNonBlocking`).
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<Stream> {
        gpu.bind()?;
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flag 1 is hipStreamNonBlocking.
        gpu.hip.check("hipStreamCreateWithFlags", unsafe {
            (gpu.hip.rt.stream_create)(&mut raw, 1)
        })?;
        Ok(Stream {
            gpu: gpu.clone(),
            raw,
        })
    }
    /// The GPU.
    pub(crate) fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
    /// The raw `hipStream_t` (for RCCL).
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }
    fn rt(&self) -> &'static Runtime {
        &self.gpu.hip.rt
    }
    /// Waits for the stream.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: live stream.
        self.gpu.hip.check("hipStreamSynchronize", unsafe {
            (self.rt().stream_sync)(self.raw)
        })
    }
    /// Makes later work wait for `event`.
    pub(crate) fn wait(&self, event: &RawEvent) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: live stream and event.
        self.gpu.hip.check("hipStreamWaitEvent", unsafe {
            (self.rt().stream_wait_event)(self.raw, event.raw, 0)
        })
    }
    /// Queues a copy of `len` bytes between two allocations of this stream's GPU.
    pub(crate) fn copy_dtod(
        &self,
        dst: &DeviceMem,
        dst_off: usize,
        src: &DeviceMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        let d = dst.at(dst_off, len)?;
        let s = src.at(src_off, len)?;
        self.gpu.bind()?;
        // SAFETY: both ranges are inside live allocations (checked), which the caller keeps
        // alive until the stream passes this point.
        let rc = unsafe { (self.rt().memcpy_async)(d, s, len, D2D, self.raw) };
        self.gpu.hip.check("hipMemcpyAsync(DtoD)", rc)
    }
    /// Queues a copy of `len` bytes from memory of another GPU.
    pub(crate) fn copy_peer(
        &self,
        dst: &DeviceMem,
        dst_off: usize,
        src: &DeviceMem,
        src_off: usize,
        len: usize,
    ) -> Result<()> {
        let d = dst.at(dst_off, len)?;
        let s = src.at(src_off, len)?;
        self.gpu.bind()?;
        let (dd, sd) = (dst.gpu.ordinal as c_int, src.gpu.ordinal as c_int);
        // SAFETY: both ranges are inside live allocations (checked), which the caller keeps
        // alive until the stream passes this point.
        let rc = unsafe { (self.rt().memcpy_peer_async)(d, dd, s, sd, len, self.raw) };
        self.gpu.hip.check("hipMemcpyPeerAsync", rc)
    }
    /// Writes host bytes into device memory in stream order (returns when the data is copied).
    pub(crate) fn write(&self, dst: &DeviceMem, offset: usize, src: &[u8]) -> Result<()> {
        let d = dst.at(offset, src.len())?;
        self.gpu.bind()?;
        // SAFETY: the range is inside the allocation (checked); pageable source memory, so
        // the copy is staged and `src` is read before the stream is synchronized below.
        let rc = unsafe {
            (self.rt().memcpy_async)(d, src.as_ptr() as *const c_void, src.len(), H2D, self.raw)
        };
        self.gpu.hip.check("hipMemcpyAsync(HtoD)", rc)?;
        self.synchronize()
    }
    /// Reads device memory into host bytes in stream order (returns when the data arrived).
    pub(crate) fn read(&self, src: &DeviceMem, offset: usize, dst: &mut [u8]) -> Result<()> {
        let s = src.at(offset, dst.len())?;
        self.gpu.bind()?;
        // SAFETY: the range is inside the allocation (checked); the stream is synchronized
        // before `dst` is released.
        let rc = unsafe {
            (self.rt().memcpy_async)(dst.as_mut_ptr() as Raw, s, dst.len(), D2H, self.raw)
        };
        self.gpu.hip.check("hipMemcpyAsync(DtoH)", rc)?;
        self.synchronize()
    }
    /// Queues a memset.
    pub(crate) fn memset(
        &self,
        dst: &DeviceMem,
        offset: usize,
        len: usize,
        value: u8,
    ) -> Result<()> {
        let d = dst.at(offset, len)?;
        self.gpu.bind()?;
        // SAFETY: the range is inside the allocation (checked), kept alive by the caller.
        let rc = unsafe { (self.rt().memset_async)(d, value as c_int, len, self.raw) };
        self.gpu.hip.check("hipMemsetAsync", rc)
    }
}

impl Stream {
    /// Queues `f` on this stream with `args` (8-byte aligned slots, one per parameter).
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in count, size and meaning; every device address
    /// in them must stay allocated until the stream has run the kernel, and the ranges the kernel
    /// touches must lie inside those allocations.
    pub(crate) unsafe fn launch(
        &self,
        f: Function,
        grid: (u32, u32, u32),
        block: u32,
        args: &mut tessera_kernels::gpu::launch::ArgSlots,
    ) -> Result<()> {
        self.gpu.bind()?;
        let mut ptrs = args.pointers();
        // SAFETY: the argument contract is the caller's (see # Safety); `ptrs` point into `args`,
        // which outlives the call (the runtime copies arguments at launch).
        let rc = unsafe {
            (self.rt().launch)(
                f.raw,
                grid.0,
                grid.1,
                grid.2,
                block,
                1,
                1,
                0,
                self.raw,
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.gpu.hip.check("hipModuleLaunchKernel", rc)
    }
}

impl Stream {
    fn graph_api(&self) -> Result<&'static GraphApi> {
        self.gpu
            .hip
            .graph
            .as_ref()
            .map_err(|e| unavailable(e.clone()))
    }

    /// Whether this stream's runtime records graphs.
    pub(crate) fn can_record(&self) -> bool {
        self.gpu.hip.graph.is_ok()
    }

    /// Starts recording this stream's work into a graph (nothing queued while recording runs
    /// until the graph is launched).
    pub(crate) fn begin_capture(&self) -> Result<()> {
        let api = self.graph_api()?;
        self.gpu.bind()?;
        // SAFETY: live stream; the mode is a hipStreamCaptureMode value.
        self.gpu.hip.check("hipStreamBeginCapture", unsafe {
            (api.begin_capture)(self.raw, CAPTURE_THREAD_LOCAL)
        })
    }

    /// Ends the recording and instantiates it.
    pub(crate) fn end_capture(&self) -> Result<GraphExec> {
        let api = self.graph_api()?;
        // End the capture even if binding fails: a stream left capturing would record, not run,
        // what comes next.
        let bound = self.gpu.bind();
        let mut graph: Raw = std::ptr::null_mut();
        // SAFETY: live stream, recording (begin_capture succeeded); valid out-pointer.
        self.gpu.hip.check("hipStreamEndCapture", unsafe {
            (api.end_capture)(self.raw, &mut graph)
        })?;
        bound?;
        let mut exec: Raw = std::ptr::null_mut();
        // SAFETY: `graph` was just made by the runtime; valid out-pointer; no error node or log.
        let rc = unsafe {
            (api.instantiate)(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if let Err(e) = self.gpu.hip.check("hipGraphInstantiate", rc) {
            // SAFETY: made above, destroyed once.
            let _ = unsafe { (api.destroy)(graph) };
            return Err(e);
        }
        Ok(GraphExec {
            gpu: self.gpu.clone(),
            graph,
            exec,
        })
    }

    /// Queues a recorded graph.
    pub(crate) fn launch_graph(&self, g: &GraphExec) -> Result<()> {
        let api = self.graph_api()?;
        self.gpu.bind()?;
        // SAFETY: stream and graph are alive; the graph's kernels were checked when recorded.
        self.gpu
            .hip
            .check("hipGraphLaunch", unsafe { (api.launch)(g.exec, self.raw) })
    }
}

/// A recorded and instantiated HIP graph, destroyed on drop.
#[derive(Debug)]
pub struct GraphExec {
    gpu: Arc<Gpu>,
    graph: Raw,
    exec: Raw,
}

// SAFETY: an executable graph may be launched from any thread; launches are serialized by the
// streams they go to.
unsafe impl Send for GraphExec {}
// SAFETY: as for Send.
unsafe impl Sync for GraphExec {}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if let (Ok(api), Ok(())) = (self.gpu.hip.graph.as_ref(), self.gpu.bind()) {
            // SAFETY: made by end_capture, destroyed once; launched work still completes.
            unsafe {
                let _ = (api.exec_destroy)(self.exec);
                let _ = (api.destroy)(self.graph);
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: created in `new`, destroyed once.
            let _ = unsafe { (self.rt().stream_destroy)(self.raw) };
        }
    }
}

/// An event, destroyed on drop.
#[derive(Debug)]
pub struct RawEvent {
    gpu: Arc<Gpu>,
    raw: Raw,
}

// SAFETY: HIP events may be queried and waited on from any thread.
unsafe impl Send for RawEvent {}
// SAFETY: as for Send.
unsafe impl Sync for RawEvent {}

impl RawEvent {
    /// A new event recorded on `stream` now.
    pub(crate) fn record(stream: &Stream) -> Result<RawEvent> {
        let hip = stream.gpu.hip;
        stream.gpu.bind()?;
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flag 2 is hipEventDisableTiming.
        hip.check("hipEventCreateWithFlags", unsafe {
            (hip.rt.event_create)(&mut raw, 2)
        })?;
        let ev = RawEvent {
            gpu: stream.gpu.clone(),
            raw,
        };
        // SAFETY: live event and stream.
        hip.check("hipEventRecord", unsafe {
            (hip.rt.event_record)(ev.raw, stream.raw)
        })?;
        Ok(ev)
    }
    /// Blocks until the event completes.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.gpu.bind()?;
        // SAFETY: live event.
        self.gpu.hip.check("hipEventSynchronize", unsafe {
            (self.gpu.hip.rt.event_sync)(self.raw)
        })
    }
    /// Whether it completed (an error counts as completed: synchronize reports it).
    pub(crate) fn is_complete(&self) -> bool {
        if self.gpu.bind().is_err() {
            return true;
        }
        // SAFETY: live event.
        unsafe { (self.gpu.hip.rt.event_query)(self.raw) != HIP_ERROR_NOT_READY }
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: created in `record`, destroyed once.
            let _ = unsafe { (self.gpu.hip.rt.event_destroy)(self.raw) };
        }
    }
}

/// A loaded code object, unloaded on drop.
#[derive(Debug)]
pub struct Module {
    gpu: Arc<Gpu>,
    raw: Raw,
}

// SAFETY: module handles are immutable runtime data usable from any thread.
unsafe impl Send for Module {}
// SAFETY: as for Send.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a code object or an offload bundle holding one for this GPU's arch.
    pub(crate) fn load(gpu: &Arc<Gpu>, image: &[u8]) -> Result<Module> {
        gpu.bind()?;
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object or bundle that outlives the call.
        gpu.hip.check("hipModuleLoadData", unsafe {
            (gpu.hip.rt.module_load_data)(&mut raw, image.as_ptr() as *const c_void)
        })?;
        Ok(Module {
            gpu: gpu.clone(),
            raw,
        })
    }
    /// The kernel `name`.
    pub(crate) fn function(&self, name: &str) -> Result<Function> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?}")))?;
        self.gpu.bind()?;
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: live module; the function lives as long as the module (owners keep both).
        self.gpu.hip.check("hipModuleGetFunction", unsafe {
            (self.gpu.hip.rt.module_get_function)(&mut raw, self.raw, c.as_ptr())
        })?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: loaded once, unloaded once after every Function user.
            let _ = unsafe { (self.gpu.hip.rt.module_unload)(self.raw) };
        }
    }
}

/// A kernel handle, valid while its [`Module`] is loaded.
#[derive(Debug, Clone, Copy)]
pub struct Function {
    raw: Raw,
}

// SAFETY: immutable data of a loaded module.
unsafe impl Send for Function {}
// SAFETY: as for Send.
unsafe impl Sync for Function {}
