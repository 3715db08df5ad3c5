//! The Vulkan API through `ash`, with the loader opened at run time: the instance and physical
//! devices ([`Instance`], [`PhysInfo`]), a logical device with its queue, pipeline layout and
//! pipeline cache ([`Dev`]), buffers with device addresses ([`RawBuf`]), timeline semaphores
//! ([`Timeline`]) and streams that record work into command buffers and submit it signalling the
//! next timeline value ([`StreamShared`]), and compute pipelines per kernel ([`Kernel`]).
//!
//! All `unsafe` of the crate lives here; every Vulkan handle is destroyed by the owner's `Drop`,
//! and owners keep what they were made from alive (`Arc<Dev>`, `Arc<Instance>`).
#![allow(unsafe_code)]

use crate::spec::{self, Spec};
use ash::vk;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_char;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use tessera_core::{Error, Result};
use tessera_kernels::gpu::launch::{Arg, Launch};

/// Bytes per argument chunk of a stream's argument ring.
const CHUNK: usize = 64 * 1024;
/// Launches recorded into one command buffer before it is submitted anyway.
const MAX_BATCH: usize = 256;

pub(crate) fn vk_err(call: &str, r: vk::Result) -> Error {
    Error::Driver {
        backend: "vulkan".into(),
        call: format!("{call} ({r})"),
        code: i64::from(r.as_raw()),
    }
}

fn cstr(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The loader and an instance (Vulkan 1.2).
pub(crate) struct Instance {
    _entry: ash::Entry,
    pub(crate) raw: ash::Instance,
    pub(crate) version: u32,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("version", &version_string(self.version))
            .finish()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every device made from the instance holds an `Arc<Instance>`, so none is left.
        unsafe { self.raw.destroy_instance(None) };
    }
}

pub(crate) fn version_string(v: u32) -> String {
    format!(
        "{}.{}.{}",
        vk::api_version_major(v),
        vk::api_version_minor(v),
        vk::api_version_patch(v)
    )
}

impl Instance {
    /// Opens the loader (`libvulkan.so.1`) and creates an instance, or says why not.
    pub(crate) fn open() -> std::result::Result<Arc<Instance>, String> {
        // SAFETY: loading the system's Vulkan loader runs its initialisers; that is the loader's
        // documented use.
        let entry = unsafe { ash::Entry::load() }
            .map_err(|e| format!("cannot load the Vulkan loader (libvulkan.so.1): {e}"))?;
        // SAFETY: a global command of a loaded entry.
        let version = unsafe { entry.try_enumerate_instance_version() }
            .ok()
            .flatten()
            .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_2 {
            return Err(format!(
                "the Vulkan loader is version {}; Tessera needs 1.2",
                version_string(version)
            ));
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"tessera")
            .engine_name(c"tessera")
            .api_version(vk::API_VERSION_1_2);
        let ci = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: `ci` and what it points to live across the call.
        let raw = unsafe { entry.create_instance(&ci, None) }
            .map_err(|e| format!("vkCreateInstance failed: {e}"))?;
        Ok(Arc::new(Instance {
            _entry: entry,
            raw,
            version,
        }))
    }

    /// Every physical device: its properties, or why Tessera cannot use it.
    pub(crate) fn physical_devices(&self) -> std::result::Result<Vec<PhysProbe>, String> {
        // SAFETY: a live instance.
        let pds = unsafe { self.raw.enumerate_physical_devices() }
            .map_err(|e| format!("vkEnumeratePhysicalDevices failed: {e}"))?;
        Ok(pds
            .into_iter()
            .enumerate()
            .map(|(i, pd)| self.probe(pd, i))
            .collect())
    }

    fn probe(&self, pd: vk::PhysicalDevice, index: usize) -> PhysProbe {
        let inst = &self.raw;
        let mut p11 = vk::PhysicalDeviceVulkan11Properties::default();
        let mut p12 = vk::PhysicalDeviceVulkan12Properties::default();
        let props = {
            let mut p2 = vk::PhysicalDeviceProperties2::default()
                .push_next(&mut p11)
                .push_next(&mut p12);
            // SAFETY: `pd` comes from this instance; the chain lives across the call.
            unsafe { inst.get_physical_device_properties2(pd, &mut p2) };
            p2.properties
        };
        let name = cstr(&props.device_name);
        if props.api_version < vk::API_VERSION_1_2 {
            return Err((
                name,
                format!(
                    "supports Vulkan {} only (1.2 needed)",
                    version_string(props.api_version)
                ),
            ));
        }
        // The instance asks for Vulkan 1.2, so integer dot products (core only from 1.3) are
        // reached through VK_KHR_shader_integer_dot_product, which 1.3 drivers still list.
        // SAFETY: as above.
        let has_int_dot = unsafe { inst.enumerate_device_extension_properties(pd) }
            .unwrap_or_default()
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(vk::KHR_SHADER_INTEGER_DOT_PRODUCT_NAME));
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut fdot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        let core = {
            let mut f2 = vk::PhysicalDeviceFeatures2::default()
                .push_next(&mut f11)
                .push_next(&mut f12);
            if has_int_dot {
                f2 = f2.push_next(&mut fdot);
            }
            // SAFETY: as above.
            unsafe { inst.get_physical_device_features2(pd, &mut f2) };
            f2.features
        };
        let missing: Vec<&str> = [
            ("bufferDeviceAddress", f12.buffer_device_address),
            ("shaderInt64", core.shader_int64),
            ("storageBuffer8BitAccess", f12.storage_buffer8_bit_access),
            ("shaderInt8", f12.shader_int8),
            ("scalarBlockLayout", f12.scalar_block_layout),
            ("timelineSemaphore", f12.timeline_semaphore),
        ]
        .into_iter()
        .filter(|(_, on)| *on == vk::FALSE)
        .map(|(n, _)| n)
        .collect();
        if !missing.is_empty() {
            return Err((name, format!("lacks {}", missing.join(", "))));
        }
        // SAFETY: as above.
        let families = unsafe { inst.get_physical_device_queue_family_properties(pd) };
        let Some(family) = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        else {
            return Err((name, "has no compute queue".into()));
        };
        // SAFETY: as above.
        let mem = unsafe { inst.get_physical_device_memory_properties(pd) };
        let heaps = &mem.memory_heaps[..mem.memory_heap_count as usize];
        let heap = heaps
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
            .or_else(|| heaps.iter().map(|h| h.size).max())
            .unwrap_or(0);
        let l = &props.limits;
        Ok(PhysInfo {
            pd,
            index,
            name,
            kind: props.device_type,
            api: props.api_version,
            uuid: p11.device_uuid,
            driver: format!("{} {}", cstr(&p12.driver_name), cstr(&p12.driver_info))
                .trim()
                .to_string(),
            heap,
            max_groups: l.max_compute_work_group_count,
            max_alloc: p11.max_memory_allocation_size,
            subgroup: p11.subgroup_size,
            subgroup_arith: p11
                .subgroup_supported_stages
                .contains(vk::ShaderStageFlags::COMPUTE)
                && p11.subgroup_supported_operations.contains(
                    vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC,
                ),
            family: family as u32,
            mem,
            optional: Optional {
                int16: core.shader_int16,
                float64: core.shader_float64,
                float16: f12.shader_float16,
                storage16: f11.storage_buffer16_bit_access,
                memory_model: f12.vulkan_memory_model,
                memory_model_device: f12.vulkan_memory_model_device_scope,
                int_dot: if has_int_dot {
                    fdot.shader_integer_dot_product
                } else {
                    vk::FALSE
                },
            },
        })
    }
}

/// `TESSERA_VULKAN_INT8=0` keeps quantized GEMV on exact f32 activations even where the device
/// has integer dot products (the int8 path rounds activations to Q8_0, as llama.cpp's CPU does).
pub(crate) const INT8_ENV: &str = "TESSERA_VULKAN_INT8";

fn int8_wanted() -> bool {
    tessera_core::settings::var_once(INT8_ENV).is_none_or(|v| v.trim() != "0")
}

/// `TESSERA_VULKAN_SUBGROUPS=0` loads the kernels' shared-memory reductions (`*_nosg`) even where
/// the device has subgroup arithmetic, as devices without it do.
pub(crate) const SUBGROUPS_ENV: &str = "TESSERA_VULKAN_SUBGROUPS";

fn subgroups_wanted() -> bool {
    tessera_core::settings::var_once(SUBGROUPS_ENV).is_none_or(|v| v.trim() != "0")
}

/// `TESSERA_VULKAN_GEOMETRY=plan` dispatches every launch as the plan gives it, also on CPU
/// implementations, which otherwise take their own grids and blocks (`spec::geometry`): the
/// launches a GPU gets, testable on lavapipe.
pub(crate) const GEOMETRY_ENV: &str = "TESSERA_VULKAN_GEOMETRY";

fn cpu_geometry_wanted() -> bool {
    tessera_core::settings::var_once(GEOMETRY_ENV).is_none_or(|v| v.trim() != "plan")
}

/// A physical device Tessera can use, or (its name, why not).
pub(crate) type PhysProbe = std::result::Result<PhysInfo, (String, String)>;

/// Features enabled when the device has them (shaders may use them; none is required).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Optional {
    int16: vk::Bool32,
    float64: vk::Bool32,
    float16: vk::Bool32,
    storage16: vk::Bool32,
    memory_model: vk::Bool32,
    memory_model_device: vk::Bool32,
    /// shaderIntegerDotProduct (with its extension enabled).
    int_dot: vk::Bool32,
}

/// What Tessera needs to know of a physical device.
#[derive(Debug, Clone)]
pub(crate) struct PhysInfo {
    pub(crate) pd: vk::PhysicalDevice,
    /// Index in the instance's enumeration.
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) kind: vk::PhysicalDeviceType,
    pub(crate) api: u32,
    pub(crate) uuid: [u8; 16],
    pub(crate) driver: String,
    /// Size of the (largest) device-local heap.
    pub(crate) heap: u64,
    pub(crate) max_groups: [u32; 3],
    pub(crate) max_alloc: u64,
    pub(crate) subgroup: u32,
    /// Compute shaders have basic and arithmetic subgroup operations.
    pub(crate) subgroup_arith: bool,
    pub(crate) family: u32,
    mem: vk::PhysicalDeviceMemoryProperties,
    optional: Optional,
}

impl PhysInfo {
    /// The device UUID in hex (pipeline cache file names).
    pub(crate) fn uuid_hex(&self) -> String {
        self.uuid.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first memory type among `bits` with all of `flags`.
    fn memory_type(&self, bits: u32, flags: vk::MemoryPropertyFlags) -> Option<u32> {
        (0..self.mem.memory_type_count).find(|&i| {
            bits & (1 << i) != 0
                && self.mem.memory_types[i as usize]
                    .property_flags
                    .contains(flags)
        })
    }

    /// Whether device memory is also host-visible and the device shares host memory (CPU or
    /// integrated), so buffers are mapped and host access needs no staging copy.
    fn maps_device_memory(&self) -> bool {
        matches!(
            self.kind,
            vk::PhysicalDeviceType::CPU | vk::PhysicalDeviceType::INTEGRATED_GPU
        ) && self
            .memory_type(
                u32::MAX,
                vk::MemoryPropertyFlags::DEVICE_LOCAL
                    | vk::MemoryPropertyFlags::HOST_VISIBLE
                    | vk::MemoryPropertyFlags::HOST_COHERENT,
            )
            .is_some()
    }
}

/// One logical device: the device, its compute queue, the pipeline layout every kernel uses
/// (one 8-byte push constant: the argument block's address) and the pipeline cache.
pub(crate) struct Dev {
    /// Outlives the device.
    _inst: Arc<Instance>,
    pub(crate) info: PhysInfo,
    pub(crate) raw: ash::Device,
    queue: Mutex<vk::Queue>,
    pub(crate) layout: vk::PipelineLayout,
    pub(crate) cache: vk::PipelineCache,
    pub(crate) cache_file: Option<PathBuf>,
    /// Pipelines were made since the cache was last saved.
    dirty: std::sync::atomic::AtomicBool,
    /// Device buffers are host-visible and mapped.
    pub(crate) mapped: bool,
    /// `k_mul_mat_vec_q` runs as `k_mul_mat_vec_q_int8` (integer dot products, not turned off).
    pub(crate) int8: bool,
    /// Kernels reduce with subgroup arithmetic (the device has it, not turned off); otherwise
    /// their `_nosg` variants load.
    pub(crate) subgroups: bool,
    /// Launches take the CPU implementation's geometry (`spec::geometry`).
    pub(crate) cpu_geometry: bool,
    /// Streams of this device, so blocking host access can wait for all of them.
    streams: Mutex<Vec<Weak<StreamShared>>>,
}

impl std::fmt::Debug for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dev")
            .field("device", &self.info.name)
            .field("mapped", &self.mapped)
            .finish()
    }
}

// SAFETY: the raw handles are plain identifiers; the queue is used under its mutex and the
// other objects are thread-safe per the Vulkan spec (pools are per stream, under its mutex).
unsafe impl Send for Dev {}
// SAFETY: as above.
unsafe impl Sync for Dev {}

impl Drop for Dev {
    fn drop(&mut self) {
        // SAFETY: the last owner: no stream, buffer or pipeline of the device is left (each
        // holds an `Arc<Dev>`), so waiting and destroying the remaining objects is sound.
        unsafe {
            let _ = self.raw.device_wait_idle();
        }
        self.save_cache();
        // SAFETY: as above.
        unsafe {
            self.raw.destroy_pipeline_cache(self.cache, None);
            self.raw.destroy_pipeline_layout(self.layout, None);
            self.raw.destroy_device(None);
        }
    }
}

fn save_cache(path: &std::path::Path, data: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let res = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, data))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(file = %path.display(), error = %e, "Vulkan pipeline cache not saved");
    }
}

impl Dev {
    /// Opens a logical device on `info` with the required features (and the optional ones it
    /// has), loading the pipeline cache from `cache_file`.
    pub(crate) fn open(
        inst: &Arc<Instance>,
        info: &PhysInfo,
        cache_file: Option<PathBuf>,
    ) -> Result<Arc<Dev>> {
        let o = info.optional;
        let prio = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(info.family)
            .queue_priorities(&prio)];
        let core = vk::PhysicalDeviceFeatures::default()
            .shader_int64(true)
            .shader_int16(o.int16 == vk::TRUE)
            .shader_float64(o.float64 == vk::TRUE);
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(o.storage16 == vk::TRUE);
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
            .buffer_device_address(true)
            .storage_buffer8_bit_access(true)
            .shader_int8(true)
            .scalar_block_layout(true)
            .timeline_semaphore(true)
            .shader_float16(o.float16 == vk::TRUE)
            .vulkan_memory_model(o.memory_model == vk::TRUE)
            .vulkan_memory_model_device_scope(o.memory_model_device == vk::TRUE);
        let mut fdot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
            .shader_integer_dot_product(true);
        let int_dot_ext = [vk::KHR_SHADER_INTEGER_DOT_PRODUCT_NAME.as_ptr()];
        let mut ci = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_features(&core)
            .push_next(&mut f11)
            .push_next(&mut f12);
        if o.int_dot == vk::TRUE {
            ci = ci
                .enabled_extension_names(&int_dot_ext)
                .push_next(&mut fdot);
        }
        // SAFETY: `info.pd` belongs to `inst`; `ci` and its chain live across the call.
        let raw = unsafe { inst.raw.create_device(info.pd, &ci, None) }
            .map_err(|e| vk_err("vkCreateDevice", e))?;
        // SAFETY: queue 0 of the family the device was created with.
        let queue = unsafe { raw.get_device_queue(info.family, 0) };
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(8)];
        let lci = vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges);
        // SAFETY: a live device; `lci` lives across the call.
        let layout = match unsafe { raw.create_pipeline_layout(&lci, None) } {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: nothing was made from the device yet.
                unsafe { raw.destroy_device(None) };
                return Err(vk_err("vkCreatePipelineLayout", e));
            }
        };
        let initial = cache_file
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .unwrap_or_default();
        let make_cache = |data: &[u8]| {
            let ci = vk::PipelineCacheCreateInfo::default().initial_data(data);
            // SAFETY: a live device; the driver checks the header of `data` and ignores data of
            // another device or driver.
            unsafe { raw.create_pipeline_cache(&ci, None) }
        };
        let cache = match make_cache(&initial).or_else(|_| make_cache(&[])) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: only the layout was made from the device.
                unsafe {
                    raw.destroy_pipeline_layout(layout, None);
                    raw.destroy_device(None);
                }
                return Err(vk_err("vkCreatePipelineCache", e));
            }
        };
        tracing::debug!(
            device = %info.name,
            cache_bytes = initial.len(),
            "Vulkan device opened"
        );
        Ok(Arc::new(Dev {
            _inst: inst.clone(),
            mapped: info.maps_device_memory(),
            int8: o.int_dot == vk::TRUE && int8_wanted(),
            subgroups: info.subgroup_arith && subgroups_wanted(),
            cpu_geometry: info.kind == vk::PhysicalDeviceType::CPU && cpu_geometry_wanted(),
            info: info.clone(),
            raw,
            queue: Mutex::new(queue),
            layout,
            cache,
            cache_file,
            dirty: std::sync::atomic::AtomicBool::new(false),
            streams: Mutex::new(Vec::new()),
        }))
    }

    /// Writes the pipeline cache to its file if pipelines were made since the last save.
    pub(crate) fn save_cache(&self) {
        let Some(path) = &self.cache_file else { return };
        if !self.dirty.swap(false, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        // SAFETY: a live device and cache (the cache is internally synchronised).
        if let Ok(data) = unsafe { self.raw.get_pipeline_cache_data(self.cache) } {
            save_cache(path, &data);
        }
    }

    /// Waits for every stream of the device (flushing what they have recorded).
    pub(crate) fn quiesce(&self) -> Result<()> {
        let live: Vec<Arc<StreamShared>> = {
            let mut s = self.streams.lock();
            s.retain(|w| w.strong_count() > 0);
            s.iter().filter_map(Weak::upgrade).collect()
        };
        for s in live {
            s.sync()?;
        }
        Ok(())
    }

    /// Whether the device has a host-visible, host-coherent memory type (pinned host buffers).
    pub(crate) fn has_host_memory(&self) -> bool {
        self.info
            .memory_type(
                u32::MAX,
                vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
            )
            .is_some()
    }

    fn submit(&self, submit: &vk::SubmitInfo<'_>) -> Result<()> {
        let queue = self.queue.lock();
        // SAFETY: the queue is externally synchronised by its mutex; `submit` and what it points
        // to live across the call, and its command buffers are fully recorded.
        unsafe {
            self.raw
                .queue_submit(*queue, std::slice::from_ref(submit), vk::Fence::null())
        }
        .map_err(|e| vk_err("vkQueueSubmit", e))
    }
}

/// A buffer and its memory, with its device address and (when host-visible) its mapping.
pub(crate) struct RawBuf {
    pub(crate) dev: Arc<Dev>,
    buf: vk::Buffer,
    mem: vk::DeviceMemory,
    size: usize,
    addr: u64,
    map: *mut u8,
}

impl std::fmt::Debug for RawBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBuf")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("mapped", &!self.map.is_null())
            .finish()
    }
}

// SAFETY: the mapping is a plain address into memory owned by this object; accesses through it
// are range-checked copies whose ordering with device work the callers establish.
unsafe impl Send for RawBuf {}
// SAFETY: as above.
unsafe impl Sync for RawBuf {}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: owners keep a buffer alive until the device work using it has completed.
        unsafe {
            self.dev.raw.destroy_buffer(self.buf, None);
            self.dev.raw.free_memory(self.mem, None);
        }
    }
}

impl RawBuf {
    /// A buffer of `size` bytes (at least 1): device memory (mapped where the device shares host
    /// memory) or, with `host`, host-visible coherent memory, always mapped.
    pub(crate) fn new(dev: &Arc<Dev>, size: usize, host: bool, device: &str) -> Result<RawBuf> {
        let size = size.max(1);
        let oom = || Error::OutOfMemory {
            device: device.to_string(),
            requested: size,
        };
        if size as u64 > dev.info.max_alloc {
            return Err(oom());
        }
        let raw = &dev.raw;
        let ci = vk::BufferCreateInfo::default()
            .size(size as u64)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a live device; `ci` lives across the call.
        let buf = unsafe { raw.create_buffer(&ci, None) }.map_err(|e| match e {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => oom(),
            e => vk_err("vkCreateBuffer", e),
        })?;
        // SAFETY: `buf` was just created on this device.
        let req = unsafe { raw.get_buffer_memory_requirements(buf) };
        let map = host || dev.mapped;
        let ty = if host {
            dev.info.memory_type(
                req.memory_type_bits,
                vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
            )
        } else if dev.mapped {
            dev.info.memory_type(
                req.memory_type_bits,
                vk::MemoryPropertyFlags::DEVICE_LOCAL
                    | vk::MemoryPropertyFlags::HOST_VISIBLE
                    | vk::MemoryPropertyFlags::HOST_COHERENT,
            )
        } else {
            dev.info
                .memory_type(req.memory_type_bits, vk::MemoryPropertyFlags::DEVICE_LOCAL)
                .or_else(|| {
                    dev.info
                        .memory_type(req.memory_type_bits, vk::MemoryPropertyFlags::empty())
                })
        };
        let destroy_buf = || {
            // SAFETY: `buf` is unused and unbound.
            unsafe { raw.destroy_buffer(buf, None) }
        };
        let Some(ty) = ty else {
            destroy_buf();
            return Err(Error::Unavailable {
                backend: "vulkan".into(),
                reason: format!("{device}: no suitable memory type for a buffer"),
            });
        };
        let mut flags =
            vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
        let ai = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(ty)
            .push_next(&mut flags);
        // SAFETY: a live device; `ai` and its chain live across the call.
        let mem = match unsafe { raw.allocate_memory(&ai, None) } {
            Ok(m) => m,
            Err(e) => {
                destroy_buf();
                return Err(match e {
                    vk::Result::ERROR_OUT_OF_DEVICE_MEMORY
                    | vk::Result::ERROR_OUT_OF_HOST_MEMORY => oom(),
                    e => vk_err("vkAllocateMemory", e),
                });
            }
        };
        let out = RawBuf {
            dev: dev.clone(),
            buf,
            mem,
            size,
            addr: 0,
            map: std::ptr::null_mut(),
        };
        // From here `out`'s drop frees both.
        let mut out = out;
        // SAFETY: `mem` is a fresh allocation of a type the buffer accepts, big enough.
        unsafe { raw.bind_buffer_memory(buf, mem, 0) }
            .map_err(|e| vk_err("vkBindBufferMemory", e))?;
        let ai = vk::BufferDeviceAddressInfo::default().buffer(buf);
        // SAFETY: the buffer has SHADER_DEVICE_ADDRESS usage and bound memory allocated with the
        // DEVICE_ADDRESS flag; the feature is enabled.
        out.addr = unsafe { raw.get_buffer_device_address(&ai) };
        if map {
            // SAFETY: host-visible memory, mapped once for its whole life (unmapped by freeing).
            let p = unsafe { raw.map_memory(mem, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) }
                .map_err(|e| vk_err("vkMapMemory", e))?;
            out.map = p.cast();
        }
        Ok(out)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }
    pub(crate) fn size(&self) -> usize {
        self.size
    }
    pub(crate) fn is_mapped(&self) -> bool {
        !self.map.is_null()
    }
    /// The host address of the mapping (0 when unmapped): a name, never dereferenced.
    pub(crate) fn host_addr(&self) -> usize {
        self.map as usize
    }

    /// Checks that `offset..offset + len` lies in the buffer.
    pub(crate) fn check(&self, offset: usize, len: usize, what: &str) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            end => Err(Error::OutOfBounds {
                what: what.to_string(),
                offset,
                end: end.unwrap_or(usize::MAX),
                size: self.size,
            }),
        }
    }

    /// Copies `src` into the mapping at `offset` (range-checked; the buffer must be mapped and
    /// no device work may use the range concurrently — callers wait first).
    pub(crate) fn write_mapped(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len(), "Vulkan buffer")?;
        assert!(self.is_mapped(), "write_mapped on unmapped memory");
        // SAFETY: the range lies in the live mapping (checked) and `src` does not overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.add(offset), src.len());
        }
        Ok(())
    }

    /// Copies from the mapping at `offset` into `dst` (as [`RawBuf::write_mapped`]).
    pub(crate) fn read_mapped(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len(), "Vulkan buffer")?;
        assert!(self.is_mapped(), "read_mapped on unmapped memory");
        // SAFETY: as in `write_mapped`.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.add(offset), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    /// Fills the mapping (as [`RawBuf::write_mapped`]).
    pub(crate) fn fill_mapped(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.check(offset, len, "Vulkan buffer")?;
        assert!(self.is_mapped(), "fill_mapped on unmapped memory");
        // SAFETY: as in `write_mapped`.
        unsafe { std::ptr::write_bytes(self.map.add(offset), value, len) };
        Ok(())
    }
}

/// A timeline semaphore of a device.
pub(crate) struct Timeline {
    pub(crate) dev: Arc<Dev>,
    sem: vk::Semaphore,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Timeline({:?})", self.sem)
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        // SAFETY: pending submits signalling it hold the stream, whose drop waits for them; a
        // semaphore no queue operation still uses may be destroyed.
        unsafe { self.dev.raw.destroy_semaphore(self.sem, None) };
    }
}

impl Timeline {
    fn new(dev: &Arc<Dev>) -> Result<Timeline> {
        let mut ty = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let ci = vk::SemaphoreCreateInfo::default().push_next(&mut ty);
        // SAFETY: a live device with the timelineSemaphore feature.
        let sem = unsafe { dev.raw.create_semaphore(&ci, None) }
            .map_err(|e| vk_err("vkCreateSemaphore", e))?;
        Ok(Timeline {
            dev: dev.clone(),
            sem,
        })
    }

    /// The value reached so far.
    pub(crate) fn value(&self) -> Result<u64> {
        // SAFETY: a live timeline semaphore.
        unsafe { self.dev.raw.get_semaphore_counter_value(self.sem) }
            .map_err(|e| vk_err("vkGetSemaphoreCounterValue", e))
    }

    /// Blocks until the semaphore reaches `value`.
    pub(crate) fn wait(&self, value: u64) -> Result<()> {
        if value == 0 {
            return Ok(());
        }
        let sems = [self.sem];
        let values = [value];
        let wi = vk::SemaphoreWaitInfo::default()
            .semaphores(&sems)
            .values(&values);
        // SAFETY: a live timeline semaphore; a value already submitted to be signalled.
        unsafe { self.dev.raw.wait_semaphores(&wi, u64::MAX) }
            .map_err(|e| vk_err("vkWaitSemaphores", e))
    }
}

/// A point on a stream's timeline: the event type.
#[derive(Debug, Clone)]
pub struct VkEvent {
    pub(crate) tl: Arc<Timeline>,
    pub(crate) value: u64,
}

impl VkEvent {
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.tl.wait(self.value)
    }
    pub(crate) fn is_complete(&self) -> bool {
        self.tl.value().map_or(true, |v| v >= self.value)
    }
}

/// Something a recorded command uses, kept until the command has run (held for its drop).
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) enum Keep {
    Buf(RawBuf),
    Kernel(Arc<Kernel>),
    /// A recording being replayed: its command buffer, argument blocks and kernels.
    Recorded(Arc<RecordedInner>),
}

/// A program's launches recorded once into a command buffer of their own (between
/// `record_begin` and `record_end`) and submitted again by each replay. It owns the argument
/// blocks and kernels its commands use; each submit holds it until the submit completes.
#[derive(Debug)]
pub struct Recorded(Arc<RecordedInner>);

#[derive(Debug)]
pub(crate) struct RecordedInner {
    cb: vk::CommandBuffer,
    _keep: Vec<Keep>,
    _chunks: Vec<RawBuf>,
    /// The recording stream's command buffers to recycle: this one goes back there on drop.
    orphans: Arc<Mutex<Vec<vk::CommandBuffer>>>,
}

// SAFETY: the command buffer is only submitted (under the recording stream's lock) and handed
// back to that stream on drop; the pool it belongs to is only touched under that lock.
unsafe impl Send for RecordedInner {}
// SAFETY: as for Send.
unsafe impl Sync for RecordedInner {}

impl Drop for RecordedInner {
    fn drop(&mut self) {
        // No submit of it is pending (each holds an Arc until it completes). The stream resets
        // and reuses it under its own lock (this may run while that lock is held).
        self.orphans.lock().push(self.cb);
    }
}

/// A command buffer being recorded or in flight, and what its commands use.
#[derive(Debug)]
struct Batch {
    cb: vk::CommandBuffer,
    keep: Vec<Keep>,
    /// Argument chunks used, the last one being filled at `chunk_used`.
    chunks: Vec<RawBuf>,
    chunk_used: usize,
    commands: usize,
}

#[derive(Debug)]
struct StreamState {
    pool: vk::CommandPool,
    /// Last timeline value submitted.
    last: u64,
    open: Option<Batch>,
    waits: Vec<(Arc<Timeline>, u64)>,
    running: VecDeque<(u64, Batch)>,
    free_cbs: Vec<vk::CommandBuffer>,
    free_chunks: Vec<RawBuf>,
    /// The launches being recorded (`record_begin`), apart from the open batch.
    recording: Option<Batch>,
}

/// A stream: work recorded into command buffers, submitted to the device's queue in order, each
/// submit signalling the next value of the stream's timeline semaphore.
#[derive(Debug)]
pub(crate) struct StreamShared {
    pub(crate) dev: Arc<Dev>,
    pub(crate) device: String,
    pub(crate) tl: Arc<Timeline>,
    st: Mutex<StreamState>,
    /// Command buffers of dropped recordings, to reset and reuse.
    orphans: Arc<Mutex<Vec<vk::CommandBuffer>>>,
}

// SAFETY: the command pool and its buffers are only touched under `st`'s mutex.
unsafe impl Send for StreamState {}

impl Drop for StreamShared {
    fn drop(&mut self) {
        // What is recorded still runs (a dropped stream's queued work is not discarded).
        let last = {
            let mut st = self.st.lock();
            let _ = self.flush(&mut st);
            st.last
        };
        let _ = self.tl.wait(last);
        let st = self.st.get_mut();
        st.running.clear();
        st.open = None;
        st.recording = None;
        // SAFETY: every submit of the pool's command buffers has completed (waited above, or the
        // device is lost and nothing runs); destroying the pool frees them.
        unsafe { self.dev.raw.destroy_command_pool(st.pool, None) };
    }
}

fn barrier(dev: &ash::Device, cb: vk::CommandBuffer, dst_stage: vk::PipelineStageFlags) {
    let dst_access = if dst_stage == vk::PipelineStageFlags::HOST {
        vk::AccessFlags::HOST_READ
    } else {
        vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE
    };
    let mb = vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
        .dst_access_mask(dst_access);
    // SAFETY: `cb` is in the recording state (callers hold the stream's lock).
    unsafe {
        dev.cmd_pipeline_barrier(
            cb,
            vk::PipelineStageFlags::ALL_COMMANDS,
            dst_stage,
            vk::DependencyFlags::empty(),
            &[mb],
            &[],
            &[],
        );
    }
}

impl StreamShared {
    /// A new stream on `dev`, registered so blocking host access waits for it.
    pub(crate) fn new(dev: &Arc<Dev>, device: &str, register: bool) -> Result<Arc<StreamShared>> {
        let ci = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(dev.info.family);
        // SAFETY: a live device.
        let pool = unsafe { dev.raw.create_command_pool(&ci, None) }
            .map_err(|e| vk_err("vkCreateCommandPool", e))?;
        let tl = match Timeline::new(dev) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                // SAFETY: the pool is unused.
                unsafe { dev.raw.destroy_command_pool(pool, None) };
                return Err(e);
            }
        };
        let s = Arc::new(StreamShared {
            dev: dev.clone(),
            device: device.to_string(),
            tl,
            st: Mutex::new(StreamState {
                pool,
                last: 0,
                open: None,
                waits: Vec::new(),
                running: VecDeque::new(),
                free_cbs: Vec::new(),
                free_chunks: Vec::new(),
                recording: None,
            }),
            orphans: Arc::new(Mutex::new(Vec::new())),
        });
        if register {
            let mut all = dev.streams.lock();
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&s));
        }
        Ok(s)
    }

    /// Recycles the command buffers and argument chunks of completed submits.
    fn recycle(&self, st: &mut StreamState) -> Result<()> {
        if st.running.is_empty() {
            return Ok(());
        }
        let done = self.tl.value()?;
        while st.running.front().is_some_and(|(v, _)| *v <= done) {
            let Some((_, b)) = st.running.pop_front() else {
                break;
            };
            // A replay's entry has no command buffer of its own (its recording keeps one).
            if b.cb != vk::CommandBuffer::null() {
                // SAFETY: the submit that used `b.cb` has completed; the pool allows resets.
                unsafe {
                    self.dev
                        .raw
                        .reset_command_buffer(b.cb, vk::CommandBufferResetFlags::empty())
                }
                .map_err(|e| vk_err("vkResetCommandBuffer", e))?;
                st.free_cbs.push(b.cb);
            }
            st.free_chunks.extend(b.chunks);
        }
        Ok(())
    }

    /// A command buffer in the initial state, begun with `flags`: a free one, a dropped
    /// recording's (reset here), or a new one.
    fn begin_cb(
        &self,
        st: &mut StreamState,
        flags: vk::CommandBufferUsageFlags,
    ) -> Result<vk::CommandBuffer> {
        let orphan = self.orphans.lock().pop();
        let cb = match (orphan, st.free_cbs.pop()) {
            (Some(cb), free) => {
                st.free_cbs.extend(free);
                // SAFETY: a dropped recording's buffer, of this stream's pool (under its lock),
                // with no pending submit; the pool allows resets.
                unsafe {
                    self.dev
                        .raw
                        .reset_command_buffer(cb, vk::CommandBufferResetFlags::empty())
                }
                .map_err(|e| vk_err("vkResetCommandBuffer", e))?;
                cb
            }
            (None, Some(cb)) => cb,
            (None, None) => {
                let ai = vk::CommandBufferAllocateInfo::default()
                    .command_pool(st.pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(1);
                // SAFETY: the pool is ours, under the stream lock.
                unsafe { self.dev.raw.allocate_command_buffers(&ai) }
                    .map_err(|e| vk_err("vkAllocateCommandBuffers", e))?[0]
            }
        };
        let bi = vk::CommandBufferBeginInfo::default().flags(flags);
        // SAFETY: `cb` is in the initial state (fresh or reset).
        if let Err(e) = unsafe { self.dev.raw.begin_command_buffer(cb, &bi) } {
            // Still in the initial state: free for the next batch.
            st.free_cbs.push(cb);
            return Err(vk_err("vkBeginCommandBuffer", e));
        }
        Ok(cb)
    }

    /// The open batch, beginning one if none is, with a barrier after the previous command.
    fn batch<'a>(&self, st: &'a mut StreamState) -> Result<&'a mut Batch> {
        if st.open.is_none() {
            self.recycle(st)?;
            let cb = self.begin_cb(st, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT)?;
            st.open = Some(Batch {
                cb,
                keep: Vec::new(),
                chunks: Vec::new(),
                chunk_used: CHUNK,
                commands: 0,
            });
        }
        let b = st.open.as_mut().expect("opened above");
        // Orders this command after everything before it on the queue (earlier batches too:
        // barriers reach back across submits of one queue).
        barrier(&self.dev.raw, b.cb, vk::PipelineStageFlags::ALL_COMMANDS);
        b.commands += 1;
        Ok(b)
    }

    /// Submits the open batch (and pending waits), signalling the next timeline value; returns
    /// the value that marks everything recorded so far.
    fn flush(&self, st: &mut StreamState) -> Result<u64> {
        if st.open.is_none() && st.waits.is_empty() {
            return Ok(st.last);
        }
        if st.open.is_none() {
            self.batch(st)?;
        }
        let b = st.open.take().expect("opened above");
        barrier(&self.dev.raw, b.cb, vk::PipelineStageFlags::HOST);
        // SAFETY: `b.cb` is recording.
        if let Err(e) = unsafe { self.dev.raw.end_command_buffer(b.cb) } {
            st.free_chunks.extend(b.chunks);
            return Err(vk_err("vkEndCommandBuffer", e));
        }
        let cb = b.cb;
        self.submit(st, cb, b)
    }

    /// Submits `cb` after the pending waits, signalling the next timeline value; `b` (what the
    /// submit uses) is kept until that value is reached. Returns the value.
    fn submit(&self, st: &mut StreamState, cb: vk::CommandBuffer, b: Batch) -> Result<u64> {
        let value = st.last + 1;
        let waits = std::mem::take(&mut st.waits);
        let wait_sems: Vec<vk::Semaphore> = waits.iter().map(|(t, _)| t.sem).collect();
        let wait_vals: Vec<u64> = waits.iter().map(|(_, v)| *v).collect();
        let stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; waits.len()];
        let signal = [self.tl.sem];
        let signal_vals = [value];
        let cbs = [cb];
        let mut tsi = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_vals)
            .signal_semaphore_values(&signal_vals);
        let si = vk::SubmitInfo::default()
            .wait_semaphores(&wait_sems)
            .wait_dst_stage_mask(&stages)
            .command_buffers(&cbs)
            .signal_semaphores(&signal)
            .push_next(&mut tsi);
        if let Err(e) = self.dev.submit(&si) {
            // Not submitted: the waits still apply to what comes next.
            st.waits = waits;
            st.free_chunks.extend(b.chunks);
            return Err(e);
        }
        st.last = value;
        st.running.push_back((value, b));
        Ok(value)
    }

    /// Starts recording this stream's launches into a command buffer of their own (until
    /// [`StreamShared::record_end`]); copies and fills still go to the stream's open batch.
    pub(crate) fn record_begin(&self) -> Result<()> {
        let mut st = self.st.lock();
        if st.recording.is_some() {
            return Err(Error::InvalidArgument(format!(
                "{}: a recording is already under way on this stream",
                self.device
            )));
        }
        self.recycle(&mut st)?;
        // Replays may be queued again before the last one ran.
        let cb = self.begin_cb(&mut st, vk::CommandBufferUsageFlags::SIMULTANEOUS_USE)?;
        st.recording = Some(Batch {
            cb,
            keep: Vec::new(),
            chunks: Vec::new(),
            chunk_used: CHUNK,
            commands: 0,
        });
        Ok(())
    }

    /// Ends the recording [`StreamShared::record_begin`] started, ready to replay.
    pub(crate) fn record_end(&self) -> Result<Recorded> {
        let mut st = self.st.lock();
        let b = st.recording.take().ok_or_else(|| {
            Error::InvalidArgument(format!("{}: no recording under way", self.device))
        })?;
        barrier(&self.dev.raw, b.cb, vk::PipelineStageFlags::HOST);
        // SAFETY: `b.cb` is recording.
        let ended = unsafe { self.dev.raw.end_command_buffer(b.cb) };
        // From here the recording owns the buffer: it comes back through `orphans` on drop.
        let rec = Recorded(Arc::new(RecordedInner {
            cb: b.cb,
            _keep: b.keep,
            _chunks: b.chunks,
            orphans: self.orphans.clone(),
        }));
        ended.map_err(|e| vk_err("vkEndCommandBuffer", e))?;
        Ok(rec)
    }

    /// Submits a recording of this stream after what the stream queued before it.
    pub(crate) fn replay(&self, rec: &Recorded) -> Result<()> {
        if !Arc::ptr_eq(&rec.0.orphans, &self.orphans) {
            return Err(Error::InvalidArgument(format!(
                "{}: a recording of another stream",
                self.device
            )));
        }
        let mut st = self.st.lock();
        self.flush(&mut st)?;
        let hold = Batch {
            cb: vk::CommandBuffer::null(),
            keep: vec![Keep::Recorded(rec.0.clone())],
            chunks: Vec::new(),
            chunk_used: CHUNK,
            commands: 0,
        };
        self.submit(&mut st, rec.0.cb, hold).map(|_| ())
    }

    /// Submits what is recorded; the value that marks it.
    pub(crate) fn record(&self) -> Result<u64> {
        let mut st = self.st.lock();
        self.flush(&mut st)
    }

    /// Submits what is recorded and waits for all of it.
    pub(crate) fn sync(&self) -> Result<()> {
        let mut st = self.st.lock();
        let v = self.flush(&mut st)?;
        self.tl.wait(v)?;
        self.recycle(&mut st)
    }

    /// Makes later work wait for `ev` (on this device through the queue; on another device by
    /// waiting on the host, the event's work being submitted already).
    pub(crate) fn wait_event(&self, ev: &VkEvent) -> Result<()> {
        if ev.value == 0 || ev.is_complete() {
            return Ok(());
        }
        if !Arc::ptr_eq(&ev.tl.dev, &self.dev) {
            return ev.synchronize();
        }
        self.st.lock().waits.push((ev.tl.clone(), ev.value));
        Ok(())
    }

    /// Records a copy between buffers of this device.
    pub(crate) fn copy(
        &self,
        dst: &RawBuf,
        doff: usize,
        src: &RawBuf,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        dst.check(doff, len, "Vulkan copy destination")?;
        src.check(soff, len, "Vulkan copy source")?;
        if len == 0 {
            return Ok(());
        }
        let mut st = self.st.lock();
        let b = self.batch(&mut st)?;
        let region = vk::BufferCopy {
            src_offset: soff as u64,
            dst_offset: doff as u64,
            size: len as u64,
        };
        // SAFETY: `b.cb` records; both ranges lie in live buffers of this device (checked), held
        // by the caller (or by the batch) until the copy has run.
        unsafe {
            self.dev
                .raw
                .cmd_copy_buffer(b.cb, src.buf, dst.buf, &[region])
        };
        self.after_command(&mut st)
    }

    /// Records a fill of `len` bytes with `value`: 4-byte aligned words by `vkCmdFillBuffer`,
    /// the unaligned edges copied from a small host buffer.
    pub(crate) fn fill(&self, dst: &RawBuf, off: usize, len: usize, value: u8) -> Result<()> {
        dst.check(off, len, "Vulkan fill")?;
        if len == 0 {
            return Ok(());
        }
        let start = off.next_multiple_of(4).min(off + len);
        let end = ((off + len) / 4 * 4).max(start);
        let mut st = self.st.lock();
        if end > start {
            let b = self.batch(&mut st)?;
            let word = u32::from_ne_bytes([value; 4]);
            // SAFETY: `b.cb` records; `start..end` is 4-aligned and inside `dst` (checked).
            unsafe {
                self.dev.raw.cmd_fill_buffer(
                    b.cb,
                    dst.buf,
                    start as u64,
                    (end - start) as u64,
                    word,
                )
            };
        }
        let edges = [(off, start - off), (end, off + len - end)];
        if edges.iter().any(|&(_, n)| n > 0) {
            let host = RawBuf::new(&self.dev, 8, true, &self.device)?;
            host.fill_mapped(0, 8, value)?;
            let b = self.batch(&mut st)?;
            for (at, n) in edges.into_iter().filter(|&(_, n)| n > 0) {
                let region = vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: at as u64,
                    size: n as u64,
                };
                // SAFETY: as above; `host` is kept by the batch until the copy has run.
                unsafe {
                    self.dev
                        .raw
                        .cmd_copy_buffer(b.cb, host.buf, dst.buf, &[region])
                };
            }
            b.keep.push(Keep::Buf(host));
        }
        self.after_command(&mut st)
    }

    /// Records a copy of `src` into `dst` at `off` through a host staging buffer the batch keeps.
    pub(crate) fn upload(&self, dst: &RawBuf, off: usize, src: &[u8]) -> Result<()> {
        dst.check(off, src.len(), "Vulkan write")?;
        if src.is_empty() {
            return Ok(());
        }
        let host = RawBuf::new(&self.dev, src.len(), true, &self.device)?;
        host.write_mapped(0, src)?;
        let mut st = self.st.lock();
        let b = self.batch(&mut st)?;
        let region = vk::BufferCopy {
            src_offset: 0,
            dst_offset: off as u64,
            size: src.len() as u64,
        };
        // SAFETY: `b.cb` records; both ranges are in live buffers (checked); the batch keeps
        // `host`, the caller `dst`.
        unsafe {
            self.dev
                .raw
                .cmd_copy_buffer(b.cb, host.buf, dst.buf, &[region])
        };
        b.keep.push(Keep::Buf(host));
        self.after_command(&mut st)
    }

    /// Copies `src` at `off` into `dst` in stream order and waits: mapped memory (CPU and
    /// integrated devices) is read once the stream's work is done, other memory through a
    /// staging buffer copied on the stream (a second submit and wait).
    pub(crate) fn download(&self, src: &RawBuf, off: usize, dst: &mut [u8]) -> Result<()> {
        src.check(off, dst.len(), "Vulkan read")?;
        if dst.is_empty() {
            return Ok(());
        }
        if src.is_mapped() {
            self.sync()?;
            return src.read_mapped(off, dst);
        }
        let host = RawBuf::new(&self.dev, dst.len(), true, &self.device)?;
        {
            let mut st = self.st.lock();
            let b = self.batch(&mut st)?;
            let region = vk::BufferCopy {
                src_offset: off as u64,
                dst_offset: 0,
                size: dst.len() as u64,
            };
            // SAFETY: as in `upload`; `host` lives until after the wait below.
            unsafe {
                self.dev
                    .raw
                    .cmd_copy_buffer(b.cb, src.buf, host.buf, &[region])
            };
        }
        self.sync()?;
        host.read_mapped(0, dst)
    }

    fn after_command(&self, st: &mut StreamState) -> Result<()> {
        if st.open.as_ref().is_some_and(|b| b.commands >= MAX_BATCH) {
            self.flush(st)?;
        }
        Ok(())
    }

    /// Records kernel `k` as `launch` plans it: the arguments packed per `kernels/vulkan/ABI.md`
    /// into the argument ring, their address pushed, the grid dispatched (split above the
    /// device's work-group count limits with base offsets).
    ///
    /// # Safety
    /// [`tessera_gpu::Driver::launch`]'s contract.
    pub(crate) unsafe fn launch(&self, k: &Arc<Kernel>, launch: &Launch) -> Result<()> {
        let geo = spec::geometry(self.dev.cpu_geometry, launch);
        let pipeline = k.pipeline(Spec::of(launch, &geo, k.declared))?;
        let args = pack_args(&launch.args);
        let mut st = self.st.lock();
        let st = &mut *st;
        let recording = st.recording.is_some();
        let b = match st.recording.as_mut() {
            Some(b) => {
                // As `batch` does: after everything before it, in this buffer and earlier submits.
                barrier(&self.dev.raw, b.cb, vk::PipelineStageFlags::ALL_COMMANDS);
                b.commands += 1;
                b
            }
            None => {
                self.batch(st)?;
                st.open.as_mut().expect("opened by batch")
            }
        };
        // Argument block: 16-byte aligned in the current chunk, or a new chunk.
        let at = b.chunk_used.next_multiple_of(16);
        let need = args.len().max(16);
        let addr = if need > CHUNK {
            let big = RawBuf::new(&self.dev, need, true, &self.device)?;
            big.write_mapped(0, &args)?;
            let addr = big.addr();
            b.keep.push(Keep::Buf(big));
            addr
        } else {
            let at = if b.chunks.is_empty() || at + need > CHUNK {
                let c = match st.free_chunks.pop() {
                    Some(c) => c,
                    None => RawBuf::new(&self.dev, CHUNK, true, &self.device)?,
                };
                b.chunks.push(c);
                0
            } else {
                at
            };
            let c = b.chunks.last().expect("pushed above");
            c.write_mapped(at, &args)?;
            b.chunk_used = at + need;
            c.addr() + at as u64
        };
        let raw = &self.dev.raw;
        // SAFETY: `b.cb` records; the pipeline and layout are live (the batch keeps the kernel);
        // the push constant range is the layout's 8 bytes; the argument block stays in the ring
        // until the batch's submit completes; the caller vouches for the arguments.
        unsafe {
            raw.cmd_bind_pipeline(b.cb, vk::PipelineBindPoint::COMPUTE, pipeline);
            raw.cmd_push_constants(
                b.cb,
                self.dev.layout,
                vk::ShaderStageFlags::COMPUTE,
                0,
                &addr.to_ne_bytes(),
            );
            let max = self.dev.info.max_groups.map(|m| m.max(1));
            let (gx, gy, gz) = geo.grid;
            if gx > 0 && gy > 0 && gz > 0 {
                for bz in (0..gz).step_by(max[2] as usize) {
                    for by in (0..gy).step_by(max[1] as usize) {
                        for bx in (0..gx).step_by(max[0] as usize) {
                            let (cx, cy, cz) = (
                                (gx - bx).min(max[0]),
                                (gy - by).min(max[1]),
                                (gz - bz).min(max[2]),
                            );
                            raw.cmd_dispatch_base(b.cb, bx, by, bz, cx, cy, cz);
                        }
                    }
                }
            }
        }
        b.keep.push(Keep::Kernel(k.clone()));
        if recording {
            return Ok(());
        }
        self.after_command(st)
    }
}

/// `args` packed per the ABI: C struct layout, each at its alignment, little-endian.
pub(crate) fn pack_args(args: &[Arg]) -> Vec<u8> {
    let mut out = Vec::with_capacity(args.len() * 16);
    for a in args {
        let align = match a {
            Arg::Tensor(_) | Arg::I64(_) | Arg::F64(_) | Arg::Ptr(_) => 8,
            Arg::I32(_) | Arg::F32(_) => 4,
        };
        out.resize(out.len().next_multiple_of(align), 0);
        out.extend_from_slice(&a.bytes());
    }
    out
}

/// A kernel: its shader module and a compute pipeline per [`Spec`] (specialization constant 0 is
/// `local_size_x`; the argument types and layouts where the module declares constants for them),
/// made on first use through the device's pipeline cache.
pub(crate) struct Kernel {
    pub(crate) name: String,
    dev: Arc<Dev>,
    module: vk::ShaderModule,
    /// Specialization constant ids the module declares (bit i: id i).
    declared: u32,
    pipelines: Mutex<HashMap<Spec, vk::Pipeline>>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({})", self.name)
    }
}

// SAFETY: handles are plain identifiers; the pipeline map is under its mutex.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: batches keep their kernels until their submits complete, so no pipeline is in
        // use any more.
        unsafe {
            for (_, p) in self.pipelines.get_mut().drain() {
                self.dev.raw.destroy_pipeline(p, None);
            }
            self.dev.raw.destroy_shader_module(self.module, None);
        }
    }
}

impl Kernel {
    /// The kernel `name` from SPIR-V `code` (entry point `main`).
    pub(crate) fn new(dev: &Arc<Dev>, name: &str, code: &[u8]) -> Result<Kernel> {
        let words = ash::util::read_spv(&mut std::io::Cursor::new(code))
            .map_err(|e| Error::InvalidArgument(format!("SPIR-V of Vulkan kernel {name}: {e}")))?;
        let ci = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: a live device; `words` is SPIR-V (its magic number checked by `read_spv`).
        let module = unsafe { dev.raw.create_shader_module(&ci, None) }
            .map_err(|e| vk_err(&format!("vkCreateShaderModule({name})"), e))?;
        Ok(Kernel {
            name: name.to_string(),
            dev: dev.clone(),
            module,
            declared: spec::declared(&words),
            pipelines: Mutex::new(HashMap::new()),
        })
    }

    /// The pipeline specialized as `spec` (from [`Spec::of`] with this kernel's declared ids).
    pub(crate) fn pipeline(&self, spec: Spec) -> Result<vk::Pipeline> {
        let mut map = self.pipelines.lock();
        if let Some(p) = map.get(&spec) {
            return Ok(*p);
        }
        let (ids, data) = spec.data();
        let entries = ids.map(|id| vk::SpecializationMapEntry {
            constant_id: id,
            offset: 4 * id,
            size: 4,
        });
        let info = vk::SpecializationInfo::default()
            .map_entries(&entries)
            .data(&data);
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(self.module)
            .name(c"main")
            .specialization_info(&info);
        let ci = vk::ComputePipelineCreateInfo::default()
            .flags(vk::PipelineCreateFlags::DISPATCH_BASE)
            .stage(stage)
            .layout(self.dev.layout);
        // SAFETY: a live device, module, layout and cache; `ci` and what it points to live
        // across the call.
        let p = unsafe {
            self.dev
                .raw
                .create_compute_pipelines(self.dev.cache, &[ci], None)
        }
        .map_err(|(_, e)| vk_err(&format!("vkCreateComputePipelines({})", self.name), e))?[0];
        map.insert(spec, p);
        self.dev
            .dirty
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(p)
    }
}
