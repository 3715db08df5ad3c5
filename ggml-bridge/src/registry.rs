//! The ggml registry and devices: one ggml device per device of Tessera's registry, made once
//! and kept for the process's lifetime (ggml holds raw pointers to them).

use crate::ggml::{self, Level};
use crate::objects::{BufferTypeCtx, DeviceCtx, REGISTRY, Registry, device_ctx};
use crate::{buffer, stream, sys, translate};
use std::ffi::{CString, c_char, c_void};
use std::sync::Arc;
use tessera::{Device, DeviceType};

/// The registry ggml asks for (made once), or null when the host's ggml is another version.
pub(crate) fn init() -> sys::ggml_backend_reg_t {
    if let Err(e) = ggml::check_version() {
        ggml::log(Level::Error, &e);
        return std::ptr::null_mut();
    }
    pin_library();
    REGISTRY.get_or_init(build).reg
}

/// Keeps this library mapped until the process exits, whatever its loader does at exit:
/// Tessera's device threads and ggml's pointers into the registry may outlive the loader's
/// `dlclose`.
fn pin_library() {
    // SAFETY: `dladdr` fills `info` for an address inside this library; `dlopen` of that same
    // file with RTLD_NOLOAD only takes a reference (marking it NODELETE) and never loads anything.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let here = init as *const () as *const c_void;
        if libc::dladdr(here, &mut info) != 0 && !info.dli_fname.is_null() {
            libc::dlopen(
                info.dli_fname,
                libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
            );
        }
    }
}

/// ggml's name for a Tessera device: `Tessera` and the device's own name (ggml's own devices are
/// called `CPU`, `Vulkan0`, ...; the prefix keeps the names apart).
pub fn ggml_name(device: &dyn Device) -> String {
    format!("Tessera{}", device.name())
}

/// ggml's device type for a Tessera device. Tessera's CPU device is offered as an integrated GPU
/// (memory of the host, a device of its own): as `CPU` it would stand in for ggml's CPU backend,
/// which the host picks by type, and llama.cpp would not offload layers to it.
pub fn ggml_type(device: &dyn Device) -> sys::ggml_backend_dev_type {
    match device.kind() {
        DeviceType::Gpu | DeviceType::Meta => {
            sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_GPU
        }
        DeviceType::Accel => sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_ACCEL,
        _ => sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_IGPU,
    }
}

fn cstring(s: String) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

fn build() -> Registry {
    let reg = Box::into_raw(Box::new(sys::ggml_backend_reg {
        api_version: sys::GGML_BACKEND_API_VERSION as i32,
        iface: sys::ggml_backend_reg_i {
            get_name: Some(reg_get_name),
            get_device_count: Some(reg_get_device_count),
            get_device: Some(reg_get_device),
            get_proc_address: Some(reg_get_proc_address),
        },
        context: std::ptr::null_mut(),
    }));
    let mut devices = Vec::new();
    for device in tessera::registry().devices() {
        let ctx = DeviceCtx {
            name: cstring(ggml_name(device.as_ref())),
            description: cstring(format!(
                "Tessera {}: {}",
                device.name(),
                device.description()
            )),
            buffer_type: std::ptr::null_mut(),
            device: device.clone(),
            meta: None,
        };
        devices.push(leak_device(reg, ctx, |dev| {
            buffer::new_buffer_type(dev, device)
        }));
    }
    match crate::meta_device::from_env() {
        Ok(Some(meta)) => {
            let meta: &'static crate::objects::MetaCtx = Box::leak(Box::new(meta));
            let names: Vec<&str> = meta.device.devices().iter().map(|d| d.name()).collect();
            let ctx = DeviceCtx {
                name: cstring(format!("Tessera{}", crate::meta_device::NAME)),
                description: cstring(format!("Tessera tensor split over {}", names.join(", "))),
                buffer_type: std::ptr::null_mut(),
                device: Arc::new(meta.device.clone()),
                meta: Some(meta),
            };
            devices.push(leak_device(reg, ctx, |dev| {
                buffer::new_meta_buffer_type(dev, meta)
            }));
        }
        Ok(None) => {}
        Err(e) => ggml::log(Level::Error, &format!("no Tessera meta device: {e}")),
    }
    let names: Vec<String> = devices
        .iter()
        // SAFETY: devices made above.
        .map(|&d| unsafe { device_ctx(d) }.name.to_string_lossy().into_owned())
        .collect();
    ggml::log(
        Level::Info,
        &format!("Tessera devices: {}", names.join(", ")),
    );
    Registry { reg, devices }
}

/// A ggml device of `reg` for `ctx`, leaked with its context (ggml keeps them for the process's
/// lifetime), its buffer type made by `buffer_type`.
fn leak_device(
    reg: sys::ggml_backend_reg_t,
    ctx: DeviceCtx,
    buffer_type: impl FnOnce(sys::ggml_backend_dev_t) -> *mut sys::ggml_backend_buffer_type,
) -> sys::ggml_backend_dev_t {
    let ctx = Box::into_raw(Box::new(ctx));
    let dev = Box::into_raw(Box::new(sys::ggml_backend_device {
        iface: DEVICE_IFACE,
        reg,
        context: ctx.cast(),
    }));
    // SAFETY: `ctx` was just leaked and is not shared yet.
    unsafe { (*ctx).buffer_type = buffer_type(dev) };
    dev
}

unsafe extern "C" fn reg_get_name(_: sys::ggml_backend_reg_t) -> *const c_char {
    crate::ggml::guard("reg_get_name", std::ptr::null(), || c"Tessera".as_ptr())
}

unsafe extern "C" fn reg_get_device_count(_: sys::ggml_backend_reg_t) -> usize {
    crate::ggml::guard("reg_get_device_count", 0, || {
        REGISTRY.get().map_or(0, |r| r.devices.len())
    })
}

unsafe extern "C" fn reg_get_device(
    _: sys::ggml_backend_reg_t,
    i: usize,
) -> sys::ggml_backend_dev_t {
    crate::ggml::guard("reg_get_device", std::ptr::null_mut(), || {
        REGISTRY
            .get()
            .and_then(|r| r.devices.get(i).copied())
            .unwrap_or(std::ptr::null_mut())
    })
}

pub(crate) unsafe extern "C" fn reg_get_proc_address(
    _: sys::ggml_backend_reg_t,
    name: *const c_char,
) -> *mut c_void {
    crate::ggml::guard("reg_get_proc_address", std::ptr::null_mut(), || {
        if name.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: ggml passes a NUL-terminated name.
        let name = unsafe { std::ffi::CStr::from_ptr(name) };
        // llama.cpp sets every backend's thread count through this before each graph (`-t`).
        // ggml's other optional functions (the comm trio, extra buffer types) are declined, so
        // callers take their defaults.
        if name == c"ggml_backend_set_n_threads" {
            let f: unsafe extern "C" fn(sys::ggml_backend_t, std::ffi::c_int) =
                stream::set_n_threads;
            return f as *mut c_void;
        }
        std::ptr::null_mut()
    })
}

const DEVICE_IFACE: sys::ggml_backend_device_i = sys::ggml_backend_device_i {
    get_name: Some(dev_get_name),
    get_description: Some(dev_get_description),
    get_memory: Some(dev_get_memory),
    get_type: Some(dev_get_type),
    get_props: Some(dev_get_props),
    init_backend: Some(dev_init_backend),
    get_buffer_type: Some(dev_get_buffer_type),
    get_host_buffer_type: None,
    buffer_from_host_ptr: None,
    supports_op: Some(dev_supports_op),
    supports_buft: Some(dev_supports_buft),
    offload_op: None,
    event_new: None,
    event_free: None,
    event_synchronize: None,
};

unsafe extern "C" fn dev_get_name(dev: sys::ggml_backend_dev_t) -> *const c_char {
    crate::ggml::guard("dev_get_name", std::ptr::null(), || {
        // SAFETY: ggml passes one of our devices.
        unsafe { device_ctx(dev) }.name.as_ptr()
    })
}

unsafe extern "C" fn dev_get_description(dev: sys::ggml_backend_dev_t) -> *const c_char {
    crate::ggml::guard("dev_get_description", std::ptr::null(), || {
        // SAFETY: as above.
        unsafe { device_ctx(dev) }.description.as_ptr()
    })
}

unsafe extern "C" fn dev_get_memory(
    dev: sys::ggml_backend_dev_t,
    free: *mut usize,
    total: *mut usize,
) {
    crate::ggml::guard("dev_get_memory", (), || {
        // SAFETY: as above.
        let m = unsafe { device_ctx(dev) }.device.memory();
        // SAFETY: ggml passes writable pointers (null ones are skipped).
        unsafe {
            if !free.is_null() {
                *free = m.free;
            }
            if !total.is_null() {
                *total = m.total;
            }
        }
    })
}

unsafe extern "C" fn dev_get_type(dev: sys::ggml_backend_dev_t) -> sys::ggml_backend_dev_type {
    crate::ggml::guard(
        "dev_get_type",
        sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_IGPU,
        || {
            // SAFETY: as above.
            ggml_type(unsafe { device_ctx(dev) }.device.as_ref())
        },
    )
}

unsafe extern "C" fn dev_get_props(
    dev: sys::ggml_backend_dev_t,
    props: *mut sys::ggml_backend_dev_props,
) {
    crate::ggml::guard("dev_get_props", (), || {
        if props.is_null() {
            return;
        }
        // SAFETY: ggml passes one of our devices.
        let ctx = unsafe { device_ctx(dev) };
        let m = ctx.device.memory();
        // SAFETY: `props` is writable; the strings live as long as the device.
        unsafe {
            *props = sys::ggml_backend_dev_props {
                name: ctx.name.as_ptr(),
                description: ctx.description.as_ptr(),
                memory_free: m.free,
                memory_total: m.total,
                type_: ggml_type(ctx.device.as_ref()),
                device_id: std::ptr::null(),
                caps: sys::ggml_backend_dev_caps {
                    async_: true,
                    host_buffer: false,
                    buffer_from_host_ptr: false,
                    events: false,
                    mmap_support: false,
                },
            };
        }
    })
}

unsafe extern "C" fn dev_init_backend(
    dev: sys::ggml_backend_dev_t,
    _params: *const c_char,
) -> sys::ggml_backend_t {
    crate::ggml::guard("dev_init_backend", std::ptr::null_mut(), || {
        // SAFETY: ggml passes one of our devices.
        stream::init(dev, unsafe { device_ctx(dev) })
    })
}

unsafe extern "C" fn dev_get_buffer_type(
    dev: sys::ggml_backend_dev_t,
) -> sys::ggml_backend_buffer_type_t {
    crate::ggml::guard("dev_get_buffer_type", std::ptr::null_mut(), || {
        // SAFETY: as above.
        unsafe { device_ctx(dev) }.buffer_type
    })
}

unsafe extern "C" fn dev_supports_op(
    dev: sys::ggml_backend_dev_t,
    op: *const sys::ggml_tensor,
) -> bool {
    crate::ggml::guard("dev_supports_op", false, || {
        // SAFETY: as above; `op` is a live tensor whose sources are live.
        let ctx = unsafe { device_ctx(dev) };
        if op.is_null() {
            return false;
        }
        // SAFETY: as above.
        if unsafe { translate::is_empty(op) } {
            // Nothing to compute (llama.cpp reserves graphs with no output rows): every device
            // runs it, as ggml's own backends do, and the translation leaves it out.
            return true;
        }
        // SAFETY: as above.
        if let Some(why) = unsafe { crate::weights::misread_weight(op) } {
            tracing::debug!(device = %ctx.device.name(), why, "op declined");
            return false;
        }
        // SAFETY: as above.
        match unsafe { translate::supports(ctx.device.as_ref(), op) } {
            Ok(()) => true,
            Err(d) => {
                // llama.cpp shows debug lines with -v: why an op runs on another backend.
                ggml::log(
                    Level::Debug,
                    &format!("{} declines {d}", ctx.name.to_string_lossy()),
                );
                if let Some(meta) = ctx.meta {
                    meta.declined(&d.node);
                }
                false
            }
        }
    })
}

unsafe extern "C" fn dev_supports_buft(
    dev: sys::ggml_backend_dev_t,
    buft: sys::ggml_backend_buffer_type_t,
) -> bool {
    crate::ggml::guard("dev_supports_buft", false, || {
        // SAFETY: as above; `buft` is a live buffer type.
        let ctx = unsafe { device_ctx(dev) };
        // SAFETY: as above.
        match unsafe { BufferTypeCtx::of(buft) } {
            // The meta device's own buffer type (its staging memory is not the meta device's).
            Some(_) if ctx.meta.is_some() => buft == ctx.buffer_type,
            Some(b) => b.meta.is_none() && ctx.device.supports_buffer_type(b.tessera.as_ref()),
            None => false,
        }
    })
}
