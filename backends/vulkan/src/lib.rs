//! The Tessera Vulkan backend: the fourth vendor of the shared GPU runtime (`tessera-gpu`).
//!
//! - The Vulkan loader (`libvulkan.so.1`) is opened at run time through `ash`, so the crate
//!   builds without a Vulkan SDK and a binary starts without a loader or device: the registry
//!   then has no devices and [`VulkanRegistry::reason`] says why.
//! - Devices: every physical device with Vulkan 1.2 and the features the kernels need
//!   (`bufferDeviceAddress`, `shaderInt64`, `storageBuffer8BitAccess`, `shaderInt8`,
//!   `scalarBlockLayout`, `timelineSemaphore`), named `VK0`, `VK1`, ...; with
//!   `TESSERA_VULKAN_SPLIT=N` each physical device is opened as N logical devices (their memory
//!   copies through the host), so tensor parallelism runs on one device (lavapipe on CI).
//! - Kernels are the CUDA kernels ported to GLSL (`kernels/vulkan/*.comp`, contract in
//!   `kernels/vulkan/ABI.md`), compiled ahead of time to the committed SPIR-V embedded here. A
//!   kernel without SPIR-V yet makes its ops unsupported on Vulkan devices. Pipelines persist in
//!   an on-disk pipeline cache ([`cache_file`]).
//! - Buffers, streams (a queue and a timeline semaphore per stream, work batched into command
//!   buffers) and events (a semaphore and a value) are the shared runtime's over the [`Vulkan`]
//!   driver.
//! - The host buffer type ([`VulkanHostBufferType`], `Device::host_buffer_type`) is pinned host
//!   memory: host-visible, host-coherent Vulkan buffers mapped for their whole life
//!   ([`VkPinned`]), read and written by the host after the device's queued work and copied to
//!   and from device memory by streams in stream order.
//!
//! ```
//! let reg = tessera_vulkan::VulkanRegistry::new();
//! match reg.reason() {
//!     None => println!("Vulkan devices available"),
//!     Some(why) => println!("no Vulkan devices: {why}"),
//! }
//! ```
#![deny(unsafe_code)]

mod gpu;
mod spec;
mod sys;

pub use gpu::{VkFunction, VkGpu, VkMem, VkModule, VkPinned, VkStream, Vulkan};
pub use sys::VkEvent;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use sys::{Dev, Instance};
use tessera_core::{Device, Error, ProcAddress, Registry, Result};
use tessera_gpu::{GpuContext, GpuDevice};

mod table {
    include!(concat!(env!("OUT_DIR"), "/spirv.rs"));
}

/// A Vulkan device.
pub type VulkanDevice = GpuDevice<Vulkan>;
/// The memory of one Vulkan device.
pub type VulkanBufferType = tessera_gpu::GpuBufferType<Vulkan>;
/// A Vulkan buffer.
pub type VulkanBuffer = tessera_gpu::GpuBuffer<Vulkan>;
/// Pinned host memory of a Vulkan device: host-visible, host-coherent, mapped buffers that
/// streams copy to and from in stream order.
pub type VulkanHostBufferType = tessera_gpu::HostBufferType<Vulkan>;
/// A pinned host buffer of a Vulkan device.
pub type VulkanHostBuffer = tessera_gpu::HostBuffer<Vulkan>;
/// A stream of work on a Vulkan device.
pub type VulkanBackend = tessera_gpu::GpuStream<Vulkan>;
/// A Vulkan event.
pub type VulkanEvent = tessera_gpu::GpuEvent<Vulkan>;

/// Environment variable: logical devices per physical device (default 1).
pub const SPLIT_ENV: &str = "TESSERA_VULKAN_SPLIT";
/// Environment variable: `off` turns the pipeline cache off; a folder moves it.
pub const CACHE_ENV: &str = "TESSERA_VULKAN_CACHE";

/// The committed SPIR-V of kernel `name`, if it has been ported.
pub fn spirv(name: &str) -> Option<&'static [u8]> {
    table::SPIRV
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .map(|i| table::SPIRV[i].1)
}

/// The kernels with committed SPIR-V, sorted.
pub fn ported_kernels() -> Vec<&'static str> {
    table::SPIRV.iter().map(|(n, _)| *n).collect()
}

/// The pipeline cache file of the device with UUID `uuid_hex`: `$TESSERA_VULKAN_CACHE` (a
/// folder) or `$XDG_CACHE_HOME/tessera` (`~/.cache/tessera`), file `vulkan-<uuid>.bin`; `None`
/// when turned off (`off` or `0`) or no home is known.
pub fn cache_file(uuid_hex: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os(CACHE_ENV) {
        Some(v) if v == "off" || v == "0" => return None,
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?
            .join("tessera"),
    };
    Some(dir.join(format!("vulkan-{uuid_hex}.bin")))
}

/// The devices of this process.
struct Shared {
    gpus: Vec<Arc<GpuContext<Vulkan>>>,
}

fn split() -> std::result::Result<usize, String> {
    match tessera_core::settings::var_once(SPLIT_ENV) {
        None => Ok(1),
        Some(v) if v.trim().is_empty() => Ok(1),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=16).contains(&n) => Ok(n),
            _ => Err(format!("{SPLIT_ENV}={v}: expected a count in 1..=16")),
        },
    }
}

fn open() -> std::result::Result<Shared, String> {
    let n = split()?;
    let inst = Instance::open()?;
    let probes = inst.physical_devices()?;
    if probes.is_empty() {
        return Err("the Vulkan loader reports no devices (no driver installed: mesa-vulkan-drivers gives lavapipe)".into());
    }
    let driver = Arc::new(Vulkan);
    let mut gpus = Vec::new();
    let mut unusable = Vec::new();
    for probe in probes {
        let info = match probe {
            Ok(i) => i,
            Err((name, why)) => {
                unusable.push(format!("{name} {why}"));
                continue;
            }
        };
        let cache = cache_file(&info.uuid_hex());
        for j in 0..n {
            let opened = Dev::open(&inst, &info, cache.clone()).and_then(|dev| {
                let ordinal = gpus.len();
                gpu::VkGpu::new(format!("VK{ordinal}"), ordinal, dev, (j, n))
            });
            match opened {
                Ok(g) => gpus.push(Arc::new(GpuContext::new(driver.clone(), Arc::new(g)))),
                Err(e) => unusable.push(format!("{}: {e}", info.name)),
            }
        }
    }
    if gpus.is_empty() {
        return Err(format!("no usable Vulkan device: {}", unusable.join("; ")));
    }
    for why in &unusable {
        tracing::debug!(reason = %why, "Vulkan device skipped");
    }
    tracing::debug!(
        devices = gpus.len(),
        kernels = table::SPIRV.len(),
        "Vulkan available"
    );
    Ok(Shared { gpus })
}

fn shared() -> &'static std::result::Result<Shared, String> {
    static SHARED: OnceLock<std::result::Result<Shared, String>> = OnceLock::new();
    SHARED.get_or_init(open)
}

/// The Vulkan backend's registry.
#[derive(Debug, Default)]
pub struct VulkanRegistry;

impl VulkanRegistry {
    /// The registry (cheap; devices are opened once per process, on first use).
    pub fn new() -> VulkanRegistry {
        VulkanRegistry
    }

    /// Why the backend has no devices here (no loader, no device, a device without the needed
    /// features), or `None` when it has. Never panics.
    pub fn reason(&self) -> Option<String> {
        shared().as_ref().err().cloned()
    }

    /// Every logical device's context (its GPU, for the [`Vulkan`] driver's own calls).
    ///
    /// # Errors
    /// [`Error::Unavailable`] with [`VulkanRegistry::reason`].
    pub fn contexts(&self) -> Result<&'static [Arc<GpuContext<Vulkan>>]> {
        Ok(&self.shared()?.gpus)
    }

    fn shared(&self) -> Result<&'static Shared> {
        shared().as_ref().map_err(|reason| Error::Unavailable {
            backend: "vulkan".into(),
            reason: reason.clone(),
        })
    }
}

fn device(name: &str, ctx: &Arc<GpuContext<Vulkan>>) -> Arc<dyn Device> {
    Arc::new(VulkanDevice::new(
        name,
        ctx.clone(),
        <Vulkan as tessera_gpu::Driver>::PINNED_HOST,
    ))
}

impl Registry for VulkanRegistry {
    fn name(&self) -> &str {
        "vulkan"
    }
    fn probe(&self) -> Result<()> {
        self.shared().map(|_| ())
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        Ok(self
            .shared()?
            .gpus
            .iter()
            .map(|c| device(&Vulkan::gpu_name_of(c), c))
            .collect())
    }
    /// `vulkan:N` are the first N logical devices when there are that many, else N logical
    /// devices sharing `VK0` (`VK0/0`, ...), each with its own streams.
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        let s = self.shared()?;
        if n == 0 || n > 64 {
            return Err(Error::InvalidArgument(format!(
                "vulkan:{n}: device count must be in 1..=64"
            )));
        }
        if n <= s.gpus.len() {
            return Ok(s.gpus[..n]
                .iter()
                .map(|c| device(&Vulkan::gpu_name_of(c), c))
                .collect());
        }
        Ok((0..n)
            .map(|j| device(&format!("VK0/{j}"), &s.gpus[0]))
            .collect())
    }
    /// The host-staged comm trio of the shared runtime (`TESSERA_VULKAN_ALLREDUCE`: `f32` by
    /// default, `bf16` wire, or `none`).
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        tessera_gpu::comm_host::proc_address::<Vulkan>(name)
    }
}

impl Vulkan {
    fn gpu_name_of(ctx: &GpuContext<Vulkan>) -> String {
        <Vulkan as tessera_gpu::Driver>::gpu_name(ctx.gpu()).to_string()
    }
}

/// The Vulkan registry, ready to register.
pub fn registry() -> Arc<dyn Registry> {
    Arc::new(VulkanRegistry::new())
}
