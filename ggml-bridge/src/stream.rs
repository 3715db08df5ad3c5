//! ggml backends (streams): a Tessera stream of the device, and the translation cache of the
//! graphs it computes.

use crate::ggml::{self, Level};
use crate::objects::{BufferCtx, DeviceCtx};
use crate::sys;
use crate::translate::{Cache, Translated};
use parking_lot::Mutex;
use std::ffi::{CString, c_char, c_void};
use tessera::{Backend, BackendOptions};

/// What a ggml backend of this plugin points at.
struct StreamCtx {
    name: CString,
    device: &'static DeviceCtx,
    /// ggml drives a backend from one thread at a time; the lock makes that a checked fact.
    inner: Mutex<Inner>,
}

struct Inner {
    stream: Box<dyn Backend>,
    cache: Cache,
    /// The thread count the stream was opened with (`None`: the device's default).
    threads: Option<usize>,
}

static GUID: sys::ggml_guid = *b"tessera-ggml-v01";

/// A new ggml backend on `device` (ggml device `dev`), or null with the reason logged.
pub(crate) fn init(
    dev: sys::ggml_backend_dev_t,
    device: &'static DeviceCtx,
) -> sys::ggml_backend_t {
    // A meta device's CPU devices divide the threads among them; unless ggml says how many
    // (`ggml_backend_set_n_threads`), as many as the process may run on.
    let threads = device
        .meta
        .map(|_| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let opts = threads.map_or_else(BackendOptions::default, BackendOptions::with_threads);
    let stream = match device.device.init_backend(&opts) {
        Ok(s) => s,
        Err(e) => {
            ggml::log(
                Level::Error,
                &format!("opening a stream on {}: {e}", device.name.to_string_lossy()),
            );
            return std::ptr::null_mut();
        }
    };
    let ctx = Box::into_raw(Box::new(StreamCtx {
        name: device.name.clone(),
        device,
        inner: Mutex::new(Inner {
            stream,
            cache: Cache::default(),
            threads,
        }),
    }));
    Box::into_raw(Box::new(sys::ggml_backend {
        guid: (&GUID as *const sys::ggml_guid).cast_mut(),
        iface: STREAM_IFACE,
        device: dev,
        context: ctx.cast(),
    }))
}

const STREAM_IFACE: sys::ggml_backend_i = sys::ggml_backend_i {
    get_name: Some(get_name),
    free: Some(free),
    set_tensor_async: Some(set_tensor_async),
    get_tensor_async: Some(get_tensor_async),
    set_tensor_2d_async: None,
    get_tensor_2d_async: None,
    cpy_tensor_async: None,
    synchronize: Some(synchronize),
    graph_plan_create: None,
    graph_plan_free: None,
    graph_plan_update: None,
    graph_plan_compute: None,
    graph_compute: Some(graph_compute),
    event_record: None,
    event_wait: None,
    graph_optimize: None,
};

/// The context of one of our backends.
///
/// # Safety
/// `backend` is a backend this plugin made and has not freed.
unsafe fn ctx<'a>(backend: sys::ggml_backend_t) -> &'a StreamCtx {
    // SAFETY: the caller's contract.
    unsafe { &*(*backend).context.cast::<StreamCtx>() }
}

unsafe extern "C" fn get_name(backend: sys::ggml_backend_t) -> *const c_char {
    crate::ggml::guard("get_name", std::ptr::null(), || {
        // SAFETY: ggml calls it on our backend.
        unsafe { ctx(backend) }.name.as_ptr()
    })
}

unsafe extern "C" fn free(backend: sys::ggml_backend_t) {
    crate::ggml::guard("free", (), || {
        // SAFETY: ggml frees each backend once; both boxes were made by `init`. Dropping the
        // Tessera stream waits for its queued work.
        unsafe {
            drop(Box::from_raw((*backend).context.cast::<StreamCtx>()));
            drop(Box::from_raw(backend));
        }
    })
}

fn report(what: &str, device: &StreamCtx, r: Result<(), String>) -> bool {
    match r {
        Ok(()) => true,
        Err(e) => {
            ggml::log(
                Level::Error,
                &format!("{what} on {}: {e}", device.name.to_string_lossy()),
            );
            false
        }
    }
}

unsafe extern "C" fn set_tensor_async(
    backend: sys::ggml_backend_t,
    tensor: *mut sys::ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    crate::ggml::guard("set_tensor_async", (), || {
        if size == 0 {
            // ggml may pass a null pointer with nothing to copy.
            return;
        }
        // SAFETY: ggml calls it on our backend with a tensor in one of its buffers and `size`
        // readable bytes at `data` (consumed before return: `write_async` copies them).
        unsafe {
            let s = ctx(backend);
            let r = match BufferCtx::of((*tensor).buffer) {
                Some(b) => b.offset_of(tensor, offset, size).and_then(|at| {
                    let src = std::slice::from_raw_parts(data.cast::<u8>(), size);
                    s.inner
                        .lock()
                        .stream
                        .write_async(b.buffer().as_ref(), at, src)
                        .map_err(|e| e.to_string())?;
                    crate::buffer::rewritten(b, at, size);
                    Ok(())
                }),
                None => Err("the tensor is not in a Tessera buffer".into()),
            };
            report("set_tensor_async", s, r);
        }
    })
}

unsafe extern "C" fn get_tensor_async(
    backend: sys::ggml_backend_t,
    tensor: *const sys::ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    crate::ggml::guard("get_tensor_async", (), || {
        if size == 0 {
            // ggml may pass a null pointer with nothing to copy.
            return;
        }
        // SAFETY: as above, with `size` writable bytes at `data`, filled by the time this returns
        // or the stream is synchronized (`read_async`'s contract, stronger than ggml's).
        unsafe {
            let s = ctx(backend);
            let r = match BufferCtx::of((*tensor).buffer) {
                Some(b) => b.offset_of(tensor, offset, size).and_then(|at| {
                    let dst = std::slice::from_raw_parts_mut(data.cast::<u8>(), size);
                    if let Err(e) = crate::buffer::check_read(b, at, size) {
                        // As `buf_get_tensor`: NaNs, not stale bytes.
                        dst.fill(0xff);
                        return Err(e);
                    }
                    s.inner
                        .lock()
                        .stream
                        .read_async(b.buffer().as_ref(), at, dst)
                        .map_err(|e| e.to_string())
                }),
                None => Err("the tensor is not in a Tessera buffer".into()),
            };
            report("get_tensor_async", s, r);
        }
    })
}

unsafe extern "C" fn synchronize(backend: sys::ggml_backend_t) {
    crate::ggml::guard("synchronize", (), || {
        // SAFETY: ggml calls it on our backend.
        let s = unsafe { ctx(backend) };
        let r = s
            .inner
            .lock()
            .stream
            .synchronize()
            .map_err(|e| e.to_string());
        report("synchronize", s, r);
    })
}

unsafe extern "C" fn graph_compute(
    backend: sys::ggml_backend_t,
    graph: *mut sys::ggml_cgraph,
) -> sys::ggml_status {
    crate::ggml::guard("graph_compute", sys::ggml_status_GGML_STATUS_FAILED, || {
        // SAFETY: ggml calls it on our backend.
        let s = unsafe { ctx(backend) };
        let Some(api) = ggml::api() else {
            return sys::ggml_status_GGML_STATUS_FAILED;
        };
        // SAFETY: `graph` is live for the call; its tensors stay live while it runs.
        let nodes = unsafe { api.graph_nodes(graph) };
        let mut inner = s.inner.lock();
        let meta = s.device.meta;
        if let Some(meta) = meta {
            // SAFETY: as above.
            match unsafe { crate::meta_device::seal(meta, &nodes) } {
                // Translations bound to the staging memory are stale.
                Ok(true) => crate::objects::note_freed(),
                Ok(false) => {}
                Err(e) => {
                    report("graph_compute", s, Err(e));
                    return sys::ggml_status_GGML_STATUS_FAILED;
                }
            }
        }
        let Inner { stream, cache, .. } = &mut *inner;
        // SAFETY: as above.
        let r = unsafe {
            cache.get(
                s.device.device.as_ref(),
                &nodes,
                meta.is_some_and(|m| m.keep_all()),
            )
        }
        .and_then(|t: &Translated| {
            if let Some(meta) = meta {
                for &(buf, start, end) in &t.reads {
                    meta.check_read(buf, start, end)?;
                }
            }
            if let Some(g) = &t.graph {
                stream.compute(g, &t.bindings).map_err(|e| e.to_string())?;
            }
            if let Some(meta) = meta {
                meta.set_lost(t.id, &t.lost, &t.written);
            }
            Ok(())
        });
        if report("graph_compute", s, r) {
            sys::ggml_status_GGML_STATUS_SUCCESS
        } else {
            sys::ggml_status_GGML_STATUS_FAILED
        }
    })
}

/// ggml's `ggml_backend_set_n_threads` for this plugin's backends (found by name through the
/// registry): the stream is reopened with `n` threads in all when that changes; a meta device
/// over CPU devices divides them among the devices.
pub(crate) unsafe extern "C" fn set_n_threads(backend: sys::ggml_backend_t, n: std::ffi::c_int) {
    crate::ggml::guard("set_n_threads", (), || {
        let Ok(n) = usize::try_from(n) else {
            return;
        };
        if n == 0 || backend.is_null() {
            return;
        }
        // SAFETY: ggml calls it with a backend of this plugin's registry.
        let s = unsafe { ctx(backend) };
        if s.device.device.thread_pools() == 0 {
            // A GPU runs no CPU threads of its own: nothing to reopen.
            return;
        }
        let mut inner = s.inner.lock();
        if inner.threads == Some(n) {
            return;
        }
        let r = inner.stream.synchronize().and_then(|()| {
            s.device
                .device
                .init_backend(&BackendOptions::with_threads(n))
        });
        match r {
            Ok(stream) => {
                tracing::debug!(device = %s.device.device.name(), threads = n, "stream reopened");
                inner.stream = stream;
                inner.threads = Some(n);
            }
            Err(e) => {
                report("set_n_threads", s, Err(e.to_string()));
            }
        }
    })
}
