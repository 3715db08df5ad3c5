//! The shim's C API, loaded at run time with libloading, and safe owners of its handles.
//!
//! Every shim call returns 0 or -1 with a message from `tsy_last_error` (per thread); [`Shim`]
//! turns that into `Error::Backend`-style errors naming the call.
#![allow(unsafe_code)]

use libloading::Library;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::Arc;
use tessera_core::{Error, Result};

type Raw = *mut c_void;

/// The shim's function table.
pub struct Shim {
    last_error: unsafe extern "C" fn() -> *const c_char,
    open: unsafe extern "C" fn(c_int, *const c_char, *const c_char, *mut Raw) -> c_int,
    close: unsafe extern "C" fn(Raw),
    device_count: unsafe extern "C" fn(Raw) -> c_int,
    device_info: unsafe extern "C" fn(
        Raw,
        c_int,
        *mut c_char,
        usize,
        *mut c_int,
        *mut c_int,
        *mut u64,
        *mut u32,
        *mut u64,
    ) -> c_int,
    runtime_version: unsafe extern "C" fn(Raw, c_int, *mut c_char, usize) -> c_int,
    queue_new: unsafe extern "C" fn(Raw, c_int, *mut Raw) -> c_int,
    queue_free: unsafe extern "C" fn(Raw),
    queue_wait: unsafe extern "C" fn(Raw) -> c_int,
    malloc: unsafe extern "C" fn(Raw, c_int, usize, *mut Raw) -> c_int,
    free: unsafe extern "C" fn(Raw, c_int, Raw) -> c_int,
    memcpy: unsafe extern "C" fn(Raw, Raw, *const c_void, usize, c_int) -> c_int,
    memset: unsafe extern "C" fn(Raw, Raw, c_int, usize, c_int) -> c_int,
    event_record: unsafe extern "C" fn(Raw, *mut Raw) -> c_int,
    queue_wait_event: unsafe extern "C" fn(Raw, Raw) -> c_int,
    event_wait: unsafe extern "C" fn(Raw) -> c_int,
    event_done: unsafe extern "C" fn(Raw, *mut c_int) -> c_int,
    event_free: unsafe extern "C" fn(Raw),
    program_build: unsafe extern "C" fn(Raw, c_int, *const c_char, *mut Raw) -> c_int,
    program_free: unsafe extern "C" fn(Raw),
    kernel_get: unsafe extern "C" fn(Raw, *const c_char, *mut Raw) -> c_int,
    kernel_free: unsafe extern "C" fn(Raw),
    launch: unsafe extern "C" fn(
        Raw,
        Raw,
        *const u32,
        u32,
        c_int,
        *const c_int,
        *const usize,
        *const *const c_void,
    ) -> c_int,
    _lib: Library,
}

impl std::fmt::Debug for Shim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shim")
    }
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is an `extern "C"` function of the shim with exactly the field's
        // signature (see shim/tessera_sycl_shim.cpp); the library outlives the table (`_lib`).
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("{}: {e}", $name))?;
        *s
    }};
}

impl Shim {
    /// Loads the shim library at `path`.
    pub(crate) fn load(path: &Path) -> std::result::Result<Shim, String> {
        // SAFETY: loading runs the shim's and libsycl's initializers, which have no
        // preconditions; the path names the shim this crate's build script produced (or the
        // user's `TESSERA_SYCL_SHIM`).
        let lib = unsafe { Library::new(path) }.map_err(|e| e.to_string())?;
        Ok(Shim {
            last_error: sym!(lib, "tsy_last_error"),
            open: sym!(lib, "tsy_open"),
            close: sym!(lib, "tsy_close"),
            device_count: sym!(lib, "tsy_device_count"),
            device_info: sym!(lib, "tsy_device_info"),
            runtime_version: sym!(lib, "tsy_runtime_version"),
            queue_new: sym!(lib, "tsy_queue_new"),
            queue_free: sym!(lib, "tsy_queue_free"),
            queue_wait: sym!(lib, "tsy_queue_wait"),
            malloc: sym!(lib, "tsy_malloc"),
            free: sym!(lib, "tsy_free"),
            memcpy: sym!(lib, "tsy_memcpy"),
            memset: sym!(lib, "tsy_memset"),
            event_record: sym!(lib, "tsy_event_record"),
            queue_wait_event: sym!(lib, "tsy_queue_wait_event"),
            event_wait: sym!(lib, "tsy_event_wait"),
            event_done: sym!(lib, "tsy_event_done"),
            event_free: sym!(lib, "tsy_event_free"),
            program_build: sym!(lib, "tsy_program_build"),
            program_free: sym!(lib, "tsy_program_free"),
            kernel_get: sym!(lib, "tsy_kernel_get"),
            kernel_free: sym!(lib, "tsy_kernel_free"),
            launch: sym!(lib, "tsy_launch"),
            _lib: lib,
        })
    }

    fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: tsy_last_error returns a NUL-terminated thread-local string valid until the
        // next shim call on this thread; it is copied at once.
        let msg = unsafe { CStr::from_ptr((self.last_error)()) }
            .to_string_lossy()
            .into_owned();
        Err(Error::Compute {
            device: "SYCL".into(),
            reason: format!("{what}: {msg}"),
        })
    }
}

/// Description of one device as the runtime reports it.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    /// 0 CPU, 1 GPU, 2 other.
    pub kind: i32,
    /// Index of the root device for a sub-device.
    pub root: Option<usize>,
    pub global_mem: u64,
    pub compute_units: u32,
}

/// The runtime's devices (roots followed by their sub-devices), opened once per process.
#[derive(Debug)]
pub struct Platform {
    pub(crate) shim: Shim,
    raw: Raw,
    pub(crate) devices: Vec<DeviceInfo>,
    pub(crate) version: String,
}

// SAFETY: the shim's platform is immutable after tsy_open; the SYCL runtime objects it holds
// (devices, contexts) are thread-safe per the SYCL specification.
unsafe impl Send for Platform {}
// SAFETY: as above: only reads of the platform after construction.
unsafe impl Sync for Platform {}

impl Platform {
    /// Opens the devices through `shim`.
    pub(crate) fn open(
        shim: Shim,
        split: bool,
        cache_dir: Option<&Path>,
        icd: Option<&Path>,
    ) -> Result<Platform> {
        let c =
            |p: Option<&Path>| p.and_then(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok());
        let (cache, icd) = (c(cache_dir), c(icd));
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: the strings are NUL-terminated and live for the call; `raw` receives a handle.
        let code = unsafe {
            (shim.open)(
                split as c_int,
                cache.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                icd.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                &mut raw,
            )
        };
        shim.check(code, "opening the SYCL devices")?;
        // SAFETY: `raw` is the live platform handle just returned.
        let n = unsafe { (shim.device_count)(raw) }.max(0) as usize;
        let mut devices = Vec::with_capacity(n);
        let mut version = String::new();
        for i in 0..n {
            let mut name = [0 as c_char; 256];
            let (mut kind, mut root, mut mem, mut cu, mut wg) = (0, 0, 0u64, 0u32, 0u64);
            // SAFETY: `i` < device count; every out-pointer is valid for one write and the name
            // buffer for 256 bytes.
            let code = unsafe {
                (shim.device_info)(
                    raw,
                    i as c_int,
                    name.as_mut_ptr(),
                    name.len(),
                    &mut kind,
                    &mut root,
                    &mut mem,
                    &mut cu,
                    &mut wg,
                )
            };
            shim.check(code, "querying a SYCL device")?;
            // SAFETY: the shim wrote a NUL-terminated string into `name` (snprintf).
            let name = unsafe { CStr::from_ptr(name.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            if i == 0 {
                let mut v = [0 as c_char; 256];
                // SAFETY: as for the name above.
                if unsafe { (shim.runtime_version)(raw, 0, v.as_mut_ptr(), v.len()) } == 0 {
                    // SAFETY: NUL-terminated by snprintf.
                    version = unsafe { CStr::from_ptr(v.as_ptr()) }
                        .to_string_lossy()
                        .into_owned();
                }
            }
            devices.push(DeviceInfo {
                name,
                kind,
                root: usize::try_from(root).ok(),
                global_mem: mem,
                compute_units: cu,
            });
        }
        Ok(Platform {
            shim,
            raw,
            devices,
            version,
        })
    }

    fn index(&self, device: usize) -> c_int {
        device as c_int
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        // SAFETY: the handle came from tsy_open and is closed once, after every object that
        // refers to it (they hold an Arc<Platform>).
        unsafe { (self.shim.close)(self.raw) }
    }
}

/// An in-order queue on one device.
#[derive(Debug)]
pub struct Queue {
    pub(crate) platform: Arc<Platform>,
    raw: Raw,
}

// SAFETY: SYCL queues are thread-safe; the handle is only freed in Drop.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

impl Queue {
    pub(crate) fn new(platform: &Arc<Platform>, device: usize) -> Result<Queue> {
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: live platform handle, valid device index (checked by the callers' registry),
        // valid out-pointer.
        let code =
            unsafe { (platform.shim.queue_new)(platform.raw, platform.index(device), &mut raw) };
        platform.shim.check(code, "creating a SYCL queue")?;
        Ok(Queue {
            platform: platform.clone(),
            raw,
        })
    }

    fn shim(&self) -> &Shim {
        &self.platform.shim
    }

    /// Waits for everything queued.
    pub(crate) fn wait(&self) -> Result<()> {
        // SAFETY: live queue handle.
        let code = unsafe { (self.shim().queue_wait)(self.raw) };
        self.shim().check(code, "waiting for a SYCL queue")
    }

    /// Copies `n` bytes; blocking copies return when done.
    ///
    /// # Safety
    /// `dst` and `src` must be valid for `n` bytes (USM of this queue's context or host memory)
    /// until the copy completes.
    pub(crate) unsafe fn memcpy(
        &self,
        dst: *mut u8,
        src: *const u8,
        n: usize,
        blocking: bool,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let code = unsafe {
            (self.shim().memcpy)(
                self.raw,
                dst as Raw,
                src as *const c_void,
                n,
                blocking as c_int,
            )
        };
        self.shim().check(code, "SYCL memcpy")
    }

    /// Fills `n` bytes with `value`.
    ///
    /// # Safety
    /// `dst` must be valid device memory for `n` bytes until the fill completes.
    pub(crate) unsafe fn memset(
        &self,
        dst: *mut u8,
        value: u8,
        n: usize,
        blocking: bool,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let code = unsafe {
            (self.shim().memset)(self.raw, dst as Raw, value as c_int, n, blocking as c_int)
        };
        self.shim().check(code, "SYCL memset")
    }

    /// An event completing when the work queued so far has.
    pub(crate) fn record(&self) -> Result<RawEvent> {
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: live queue handle, valid out-pointer.
        let code = unsafe { (self.shim().event_record)(self.raw, &mut raw) };
        self.shim().check(code, "recording a SYCL event")?;
        Ok(RawEvent {
            platform: self.platform.clone(),
            raw,
        })
    }

    /// Makes later work of this queue wait for `e`.
    pub(crate) fn wait_event(&self, e: &RawEvent) -> Result<()> {
        // SAFETY: live queue and event handles.
        let code = unsafe { (self.shim().queue_wait_event)(self.raw, e.raw) };
        self.shim().check(code, "waiting for a SYCL event")
    }

    /// Queues `kernel` over `grid` blocks of `block` work-items.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in count, kind and size, and every pointer in
    /// them must stay valid until the kernel has run.
    pub(crate) unsafe fn launch(
        &self,
        kernel: &Kernel,
        grid: (u32, u32, u32),
        block: u32,
        args: &[LaunchArg],
    ) -> Result<()> {
        let kinds: Vec<c_int> = args.iter().map(|a| a.is_ptr as c_int).collect();
        let sizes: Vec<usize> = args.iter().map(|a| a.bytes.len()).collect();
        let values: Vec<*const c_void> = args
            .iter()
            .map(|a| a.bytes.as_ptr() as *const c_void)
            .collect();
        let grid = [grid.0, grid.1, grid.2];
        // The runtime sets arguments on the kernel object the program holds, shared by every
        // device of the context, and the 2026.2 runtime does not serialise two threads launching
        // one kernel at once: a root device and its sub-device then mixed their arguments (NaN
        // outputs in about one run in four of the RMS_NORM conformance cases). So launches of a
        // program's kernels take turns while they set arguments and enqueue (not while they run).
        let _turn = kernel.program.launching.lock();
        // SAFETY: the arrays hold `args.len()` entries and live for the call (the runtime
        // copies argument values at submission); the rest is the caller's contract.
        let code = unsafe {
            (self.shim().launch)(
                self.raw,
                kernel.raw,
                grid.as_ptr(),
                block,
                args.len() as c_int,
                kinds.as_ptr(),
                sizes.as_ptr(),
                values.as_ptr(),
            )
        };
        self.shim().check(code, "SYCL kernel launch")
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the handle came from tsy_queue_new and is freed once (the shim waits first).
        unsafe { (self.shim().queue_free)(self.raw) }
    }
}

/// One kernel argument: raw bytes, or a device pointer's bytes.
#[derive(Debug, Clone)]
pub(crate) struct LaunchArg {
    pub is_ptr: bool,
    pub bytes: Vec<u8>,
}

/// A SYCL event.
#[derive(Debug)]
pub struct RawEvent {
    platform: Arc<Platform>,
    raw: Raw,
}

// SAFETY: SYCL events are thread-safe; the handle is only freed in Drop.
unsafe impl Send for RawEvent {}
// SAFETY: as above.
unsafe impl Sync for RawEvent {}

impl RawEvent {
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: live event handle.
        let code = unsafe { (self.platform.shim.event_wait)(self.raw) };
        self.platform.shim.check(code, "waiting for a SYCL event")
    }

    pub(crate) fn is_complete(&self) -> bool {
        let mut done = 0;
        // SAFETY: live event handle, valid out-pointer.
        let code = unsafe { (self.platform.shim.event_done)(self.raw, &mut done) };
        code == 0 && done != 0
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        // SAFETY: the handle came from tsy_event_record and is freed once.
        unsafe { (self.platform.shim.event_free)(self.raw) }
    }
}

/// Device memory (USM `malloc_device`) of one device.
#[derive(Debug)]
pub struct DeviceMem {
    platform: Arc<Platform>,
    device: usize,
    ptr: *mut u8,
    size: usize,
}

// SAFETY: the allocation is plain memory owned by this value; access is through queue
// operations with their own synchronisation.
unsafe impl Send for DeviceMem {}
// SAFETY: as above.
unsafe impl Sync for DeviceMem {}

impl DeviceMem {
    pub(crate) fn alloc(platform: &Arc<Platform>, device: usize, size: usize) -> Result<DeviceMem> {
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: live platform, valid device index and out-pointer.
        let code =
            unsafe { (platform.shim.malloc)(platform.raw, platform.index(device), size, &mut raw) };
        platform.shim.check(code, "SYCL allocation").map_err(|e| {
            if e.to_string().contains("out of device memory") {
                Error::OutOfMemory {
                    device: platform.devices[device].name.clone(),
                    requested: size,
                }
            } else {
                e
            }
        })?;
        Ok(DeviceMem {
            platform: platform.clone(),
            device,
            ptr: raw as *mut u8,
            size,
        })
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr as u64
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The address of `offset`, checking that `offset + len` fits.
    pub(crate) fn at(&self, offset: usize, len: usize) -> Result<*mut u8> {
        tessera_core::error::check_range(&"SYCL buffer", offset, len, self.size)?;
        Ok(self.ptr.wrapping_add(offset))
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: the pointer came from tsy_malloc on this device's context and is freed once;
        // owners keep it alive until the work using it has completed.
        let code = unsafe {
            (self.platform.shim.free)(
                self.platform.raw,
                self.platform.index(self.device),
                self.ptr as Raw,
            )
        };
        if code != 0 {
            tracing::warn!("freeing SYCL memory failed");
        }
    }
}

/// Kernels built from one source for every device of a context.
#[derive(Debug)]
pub struct Program {
    platform: Arc<Platform>,
    raw: Raw,
    /// Held by launches of the program's kernels while they set arguments and enqueue (see
    /// `Queue::launch`).
    launching: parking_lot::Mutex<()>,
}

// SAFETY: kernel bundles are immutable and thread-safe once built.
unsafe impl Send for Program {}
// SAFETY: as above.
unsafe impl Sync for Program {}

impl Program {
    pub(crate) fn build(platform: &Arc<Platform>, device: usize, source: &str) -> Result<Program> {
        let src = CString::new(source)
            .map_err(|_| Error::InvalidArgument("kernel source holds a NUL byte".into()))?;
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: live platform, valid device index, NUL-terminated source, valid out-pointer.
        let code = unsafe {
            (platform.shim.program_build)(
                platform.raw,
                platform.index(device),
                src.as_ptr(),
                &mut raw,
            )
        };
        platform.shim.check(code, "building SYCL kernels")?;
        Ok(Program {
            platform: platform.clone(),
            raw,
            launching: parking_lot::Mutex::new(()),
        })
    }

    pub(crate) fn kernel(self: &Arc<Self>, name: &str) -> Result<Kernel> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name {name:?}")))?;
        let mut raw: Raw = std::ptr::null_mut();
        // SAFETY: live program handle, NUL-terminated name, valid out-pointer.
        let code = unsafe { (self.platform.shim.kernel_get)(self.raw, c.as_ptr(), &mut raw) };
        self.platform.shim.check(code, &format!("kernel {name}"))?;
        Ok(Kernel {
            program: self.clone(),
            raw,
        })
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: freed once; kernels hold an Arc to their program.
        unsafe { (self.platform.shim.program_free)(self.raw) }
    }
}

/// One kernel of a program.
#[derive(Debug)]
pub struct Kernel {
    program: Arc<Program>,
    raw: Raw,
}

// SAFETY: sycl::kernel objects are handles that may move between threads; concurrent launches
// are serialised by the program's lock (`Queue::launch`).
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: freed once.
        unsafe { (self.program.platform.shim.kernel_free)(self.raw) }
    }
}
