//! [`Vulkan`]: the `sys` wrappers behind the shared runtime's [`Driver`] trait. A GPU is one
//! logical Vulkan device ([`VkGpu`]); memory is a buffer with a device address ([`VkMem`]); a
//! stream records into command buffers submitted with a timeline semaphore ([`VkStream`]);
//! an event is a (semaphore, value) pair; kernels are compute pipelines of the committed SPIR-V.
//! Pinned host memory is a host-visible, host-coherent buffer mapped for its whole life
//! ([`VkPinned`]), which streams copy to and from like device memory.
#![allow(unsafe_code)]

use crate::spirv;
use crate::sys::{Dev, Kernel, RawBuf, StreamShared, VkEvent, version_string};
use ash::vk;
use std::collections::HashMap;
use std::sync::Arc;
use tessera_core::{DeviceType, Error, Result};
use tessera_gpu::{Driver, PinnedMem, Unit};
use tessera_kernels::gpu::launch::Launch;

/// The Vulkan API, as the shared GPU runtime drives it.
#[derive(Debug, Default)]
pub struct Vulkan;

/// One logical device (`VK0`, ...): a Vulkan device on a physical device (several may share one
/// with `TESSERA_VULKAN_SPLIT`), and the stream blocking host access goes through.
#[derive(Debug)]
pub struct VkGpu {
    pub(crate) name: String,
    pub(crate) ordinal: usize,
    pub(crate) dev: Arc<Dev>,
    /// (index, count) of this logical device among those on its physical device.
    pub(crate) split: (usize, usize),
    io: Arc<StreamShared>,
}

impl VkGpu {
    pub(crate) fn new(
        name: String,
        ordinal: usize,
        dev: Arc<Dev>,
        split: (usize, usize),
    ) -> Result<VkGpu> {
        let io = StreamShared::new(&dev, &name, false)?;
        Ok(VkGpu {
            name,
            ordinal,
            dev,
            split,
            io,
        })
    }

    /// The physical device's name (as the driver reports it).
    pub fn device_name(&self) -> &str {
        &self.dev.info.name
    }

    /// Whether device memory is mapped into the host (CPU and integrated devices).
    pub fn is_mapped(&self) -> bool {
        self.dev.mapped
    }

    /// Whether quantized GEMV (`k_mul_mat_vec_q`) rounds activations to Q8_0 and multiplies with
    /// integer dot products, as llama.cpp's CPU does: the device has shaderIntegerDotProduct and
    /// `TESSERA_VULKAN_INT8` is not `0`.
    pub fn int8_dot(&self) -> bool {
        self.dev.int8
    }

    /// Whether kernels reduce with subgroup arithmetic: the device has it in compute shaders and
    /// `TESSERA_VULKAN_SUBGROUPS` is not `0` (otherwise their `_nosg` variants run).
    pub fn subgroups(&self) -> bool {
        self.dev.subgroups
    }

    /// The file the device's pipeline cache is loaded from and saved to (`None`: off).
    pub fn pipeline_cache(&self) -> Option<&std::path::Path> {
        self.dev.cache_file.as_deref()
    }

    /// Writes the pipeline cache now, if pipelines were made since it was last saved (it is also
    /// saved when a stream closes and when the device is dropped).
    pub fn save_pipeline_cache(&self) {
        self.dev.save_cache();
    }

    /// Loads kernel `name` from SPIR-V `code` (not one of the committed kernels: tests and
    /// experiments).
    ///
    /// # Errors
    /// Invalid SPIR-V, or the driver's status.
    pub fn load_spirv(&self, name: &str, code: &[u8]) -> Result<VkFunction> {
        Ok(VkFunction {
            name: name.to_string(),
            kernel: Some(Arc::new(Kernel::new(&self.dev, name, code)?)),
        })
    }
}

/// A buffer of a logical device.
#[derive(Debug)]
pub struct VkMem {
    gpu: Arc<VkGpu>,
    buf: RawBuf,
}

/// Pinned host memory of a logical device: a host-visible, host-coherent buffer (a transfer source
/// and destination of its Vulkan device) mapped for its whole life. The host reads and writes the
/// mapping after the device's queued work; streams of the same Vulkan device copy to and from it
/// in stream order.
#[derive(Debug)]
pub struct VkPinned {
    gpu: Arc<VkGpu>,
    buf: RawBuf,
}

impl VkPinned {
    /// `bytes` (at least one) of zeroed host-visible memory of `gpu`; `None` where the device
    /// has no host-visible, host-coherent memory type.
    fn alloc(gpu: &Arc<VkGpu>, bytes: usize) -> Result<Option<VkPinned>> {
        if !gpu.dev.has_host_memory() {
            return Ok(None);
        }
        let buf = RawBuf::new(&gpu.dev, bytes, true, &gpu.name)?;
        buf.fill_mapped(0, buf.size(), 0)?;
        Ok(Some(VkPinned {
            gpu: gpu.clone(),
            buf,
        }))
    }

    /// The logical device the memory was allocated for.
    pub fn gpu(&self) -> &Arc<VkGpu> {
        &self.gpu
    }
}

impl PinnedMem for VkPinned {
    fn size(&self) -> usize {
        self.buf.size()
    }
    fn addr(&self) -> usize {
        self.buf.host_addr()
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.buf
            .check(offset, src.len(), "Vulkan host buffer write")?;
        self.gpu.dev.quiesce()?;
        self.buf.write_mapped(offset, src)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.buf
            .check(offset, dst.len(), "Vulkan host buffer read")?;
        self.gpu.dev.quiesce()?;
        self.buf.read_mapped(offset, dst)
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.buf.check(offset, len, "Vulkan host buffer fill")?;
        self.gpu.dev.quiesce()?;
        self.buf.fill_mapped(offset, len, value)
    }
}

/// A stream of a logical device.
#[derive(Debug)]
pub struct VkStream {
    gpu: Arc<VkGpu>,
    s: Arc<StreamShared>,
}

impl Drop for VkStream {
    fn drop(&mut self) {
        // Statics hold the devices for the whole process, so the pipeline cache is saved when
        // a stream (a backend) closes.
        self.gpu.dev.save_cache();
    }
}

/// The kernels of one source file that have SPIR-V.
#[derive(Debug)]
pub struct VkModule {
    kernels: HashMap<&'static str, Arc<Kernel>>,
}

/// A kernel, or the name of one not yet ported (its launch fails with that reason).
#[derive(Debug, Clone)]
pub struct VkFunction {
    name: String,
    kernel: Option<Arc<Kernel>>,
}

fn not_ported(device: &str, name: &str) -> Error {
    Error::Compute {
        device: device.to_string(),
        reason: format!(
            "kernel {name} is not yet ported to Vulkan (no kernels/vulkan/spv/{name}.spv)"
        ),
    }
}

impl VkStream {
    /// Whether `mem` is memory of the stream's Vulkan device.
    fn owns(&self, mem: &VkMem) -> bool {
        Arc::ptr_eq(&mem.gpu.dev, &self.gpu.dev)
    }
    /// Whether `mem` is host memory of the stream's Vulkan device.
    fn owns_pinned(&self, mem: &VkPinned) -> bool {
        Arc::ptr_eq(&mem.gpu.dev, &self.gpu.dev)
    }
}

/// A copy between memory of different Vulkan devices: `len` bytes through the host, after the
/// stream's queued work.
fn through_host(
    s: &VkStream,
    len: usize,
    read: impl FnOnce(&mut [u8]) -> Result<()>,
    write: impl FnOnce(&[u8]) -> Result<()>,
) -> Result<()> {
    s.s.sync()?;
    let mut tmp = vec![0u8; len];
    read(&mut tmp)?;
    write(&tmp)
}

/// The SPIR-V that runs kernel `name` on a device: the shared plan names one GEMV kernel, whose
/// integer-dot-product variant `k_mul_mat_vec_q_int8` the device may take (`int8`); a kernel
/// that reduces with subgroup arithmetic has a `<name>_nosg` variant with shared-memory
/// reductions, loaded where the device lacks it (or `TESSERA_VULKAN_SUBGROUPS=0`).
pub(crate) fn variant(name: &str, int8: bool, subgroups: bool) -> Option<&'static [u8]> {
    let base = match name {
        "k_mul_mat_vec_q" if int8 => "k_mul_mat_vec_q_int8",
        _ => name,
    };
    if !subgroups && let Some(code) = spirv(&format!("{base}_nosg")) {
        return Some(code);
    }
    spirv(base)
}

impl Driver for Vulkan {
    const NAME: &'static str = "vulkan";
    const ALL_KERNELS: bool = false;
    const PINNED_HOST: bool = true;
    type Gpu = VkGpu;
    type Mem = VkMem;
    type Pinned = VkPinned;
    type Stream = VkStream;
    type Event = VkEvent;
    type Module = VkModule;
    type Function = VkFunction;

    fn ordinal(gpu: &VkGpu) -> usize {
        gpu.ordinal
    }
    fn gpu_name(gpu: &VkGpu) -> &str {
        &gpu.name
    }
    fn describe(gpu: &VkGpu) -> String {
        let i = &gpu.dev.info;
        let kind = match i.kind {
            vk::PhysicalDeviceType::CPU => "CPU device",
            vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated GPU",
            vk::PhysicalDeviceType::DISCRETE_GPU => "discrete GPU",
            vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual GPU",
            _ => "device",
        };
        let split = if gpu.split.1 > 1 {
            format!(", logical device {} of {}", gpu.split.0, gpu.split.1)
        } else {
            String::new()
        };
        let int8 = if gpu.dev.int8 { "; int8 GEMV" } else { "" };
        let sg = if gpu.dev.subgroups {
            ""
        } else {
            " (shared-memory reductions)"
        };
        format!(
            "{} (Vulkan {}, {kind} {}{split}; subgroup {}{sg}{int8}; {})",
            i.name,
            version_string(i.api),
            i.index,
            i.subgroup,
            i.driver
        )
    }
    /// Discrete and virtual GPUs are GPUs; integrated GPUs and CPU implementations (lavapipe)
    /// are integrated devices sharing host memory: `Cpu` names the host CPU backend, which the
    /// scheduler and model loader treat as the host fallback.
    fn device_type(gpu: &VkGpu) -> DeviceType {
        match gpu.dev.info.kind {
            vk::PhysicalDeviceType::DISCRETE_GPU | vk::PhysicalDeviceType::VIRTUAL_GPU => {
                DeviceType::Gpu
            }
            vk::PhysicalDeviceType::INTEGRATED_GPU | vk::PhysicalDeviceType::CPU => {
                DeviceType::Igpu
            }
            _ => DeviceType::Accel,
        }
    }
    fn total_mem(gpu: &VkGpu) -> usize {
        gpu.dev.info.heap as usize
    }
    fn mem_info(gpu: &VkGpu) -> Result<(usize, usize)> {
        // Core Vulkan reports no free memory; the whole heap counts as free.
        let total = Vulkan::total_mem(gpu);
        Ok((total, total))
    }
    fn can_copy(gpu: &VkGpu, peer: &VkGpu) -> bool {
        Arc::ptr_eq(&gpu.dev, &peer.dev)
    }

    fn alloc(gpu: &Arc<VkGpu>, bytes: usize) -> Result<VkMem> {
        Ok(VkMem {
            buf: RawBuf::new(&gpu.dev, bytes, false, &gpu.name)?,
            gpu: gpu.clone(),
        })
    }
    fn mem_ptr(mem: &VkMem) -> u64 {
        mem.buf.addr()
    }
    fn mem_size(mem: &VkMem) -> usize {
        mem.buf.size()
    }
    fn mem_gpu(mem: &VkMem) -> &Arc<VkGpu> {
        &mem.gpu
    }
    fn write(mem: &VkMem, offset: usize, src: &[u8]) -> Result<()> {
        mem.buf.check(offset, src.len(), "Vulkan write")?;
        mem.gpu.dev.quiesce()?;
        if mem.buf.is_mapped() {
            return mem.buf.write_mapped(offset, src);
        }
        mem.gpu.io.upload(&mem.buf, offset, src)?;
        mem.gpu.io.sync()
    }
    fn read(mem: &VkMem, offset: usize, dst: &mut [u8]) -> Result<()> {
        mem.buf.check(offset, dst.len(), "Vulkan read")?;
        mem.gpu.dev.quiesce()?;
        if mem.buf.is_mapped() {
            return mem.buf.read_mapped(offset, dst);
        }
        mem.gpu.io.download(&mem.buf, offset, dst)
    }
    fn memset(mem: &VkMem, offset: usize, len: usize, value: u8) -> Result<()> {
        mem.buf.check(offset, len, "Vulkan fill")?;
        mem.gpu.dev.quiesce()?;
        if mem.buf.is_mapped() {
            return mem.buf.fill_mapped(offset, len, value);
        }
        mem.gpu.io.fill(&mem.buf, offset, len, value)?;
        mem.gpu.io.sync()
    }
    fn copy(dst: &VkMem, doff: usize, src: &VkMem, soff: usize, len: usize) -> Result<()> {
        dst.buf.check(doff, len, "Vulkan copy destination")?;
        src.buf.check(soff, len, "Vulkan copy source")?;
        if !Arc::ptr_eq(&dst.gpu.dev, &src.gpu.dev) {
            let mut tmp = vec![0u8; len];
            Vulkan::read(src, soff, &mut tmp)?;
            return Vulkan::write(dst, doff, &tmp);
        }
        dst.gpu.dev.quiesce()?;
        dst.gpu.io.copy(&dst.buf, doff, &src.buf, soff, len)?;
        dst.gpu.io.sync()
    }
    fn alloc_pinned(gpu: &Arc<VkGpu>, bytes: usize) -> Result<Option<VkPinned>> {
        VkPinned::alloc(gpu, bytes)
    }

    fn stream_create(gpu: &Arc<VkGpu>) -> Result<VkStream> {
        Ok(VkStream {
            s: StreamShared::new(&gpu.dev, &gpu.name, true)?,
            gpu: gpu.clone(),
        })
    }
    fn stream_gpu(stream: &VkStream) -> &Arc<VkGpu> {
        &stream.gpu
    }
    fn stream_sync(stream: &VkStream) -> Result<()> {
        stream.s.sync()
    }
    fn stream_wait(stream: &VkStream, event: &VkEvent) -> Result<()> {
        stream.s.wait_event(event)
    }
    /// Memory of another Vulkan device (a logical device of `TESSERA_VULKAN_SPLIT`) takes the
    /// blocking path after the stream's work: correct, not overlapped.
    fn copy_async(
        s: &VkStream,
        dst: &VkMem,
        doff: usize,
        src: &VkMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        if s.owns(dst) && s.owns(src) {
            return s.s.copy(&dst.buf, doff, &src.buf, soff, len);
        }
        s.s.sync()?;
        Vulkan::copy(dst, doff, src, soff, len)
    }
    fn copy_peer_async(
        s: &VkStream,
        dst: &VkMem,
        doff: usize,
        src: &VkMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        // Logical devices sharing one Vulkan device copy directly; others go through the host.
        Vulkan::copy_async(s, dst, doff, src, soff, len)
    }
    /// A host buffer and device memory of the stream's Vulkan device: a buffer copy recorded on
    /// the stream. Otherwise (another logical device of `TESSERA_VULKAN_SPLIT`) the blocking path
    /// through the host after the stream's work.
    fn copy_to_device_async(
        s: &VkStream,
        dst: &VkMem,
        doff: usize,
        src: &VkPinned,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        if s.owns(dst) && s.owns_pinned(src) {
            return s.s.copy(&dst.buf, doff, &src.buf, soff, len);
        }
        dst.buf.check(doff, len, "Vulkan copy destination")?;
        src.buf.check(soff, len, "Vulkan copy source")?;
        through_host(
            s,
            len,
            |t| src.read(soff, t),
            |t| Vulkan::write(dst, doff, t),
        )
    }
    /// As [`Driver::copy_to_device_async`], the other way.
    fn copy_to_host_async(
        s: &VkStream,
        dst: &VkPinned,
        doff: usize,
        src: &VkMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        if s.owns(src) && s.owns_pinned(dst) {
            return s.s.copy(&dst.buf, doff, &src.buf, soff, len);
        }
        dst.buf.check(doff, len, "Vulkan copy destination")?;
        src.buf.check(soff, len, "Vulkan copy source")?;
        through_host(
            s,
            len,
            |t| Vulkan::read(src, soff, t),
            |t| dst.write(doff, t),
        )
    }
    fn write_staged(s: &VkStream, dst: &VkMem, offset: usize, src: &[u8]) -> Result<()> {
        if s.owns(dst) {
            return s.s.upload(&dst.buf, offset, src);
        }
        s.s.sync()?;
        Vulkan::write(dst, offset, src)
    }
    fn read_staged(s: &VkStream, src: &VkMem, offset: usize, dst: &mut [u8]) -> Result<()> {
        if s.owns(src) {
            return s.s.download(&src.buf, offset, dst);
        }
        s.s.sync()?;
        Vulkan::read(src, offset, dst)
    }
    fn memset_async(s: &VkStream, mem: &VkMem, off: usize, len: usize, value: u8) -> Result<()> {
        if s.owns(mem) {
            return s.s.fill(&mem.buf, off, len, value);
        }
        s.s.sync()?;
        Vulkan::memset(mem, off, len, value)
    }

    fn event_record(stream: &VkStream) -> Result<VkEvent> {
        Ok(VkEvent {
            value: stream.s.record()?,
            tl: stream.s.tl.clone(),
        })
    }
    fn event_sync(event: &VkEvent) -> Result<()> {
        event.synchronize()
    }
    fn event_query(event: &VkEvent) -> bool {
        event.is_complete()
    }

    fn load_module(&self, gpu: &Arc<VkGpu>, unit: &Unit) -> Result<VkModule> {
        let mut kernels = HashMap::new();
        for name in unit.kernels() {
            if let Some(code) = variant(name, gpu.dev.int8, gpu.dev.subgroups) {
                kernels.insert(name, Arc::new(Kernel::new(&gpu.dev, name, code)?));
            }
        }
        Ok(VkModule { kernels })
    }
    fn function(module: &VkModule, name: &str) -> Result<VkFunction> {
        Ok(VkFunction {
            name: name.to_string(),
            kernel: module.kernels.get(name).cloned(),
        })
    }
    fn has_kernel(_gpu: &VkGpu, name: &str) -> bool {
        spirv(name).is_some()
    }
    unsafe fn launch(s: &VkStream, f: &VkFunction, launch: &Launch) -> Result<()> {
        let k = f
            .kernel
            .as_ref()
            .ok_or_else(|| not_ported(&s.gpu.name, &f.name))?;
        // SAFETY: the caller's contract (`Driver::launch`) is `StreamShared::launch`'s.
        unsafe { s.s.launch(k, launch) }
    }
    // A program's launches recorded once into a command buffer of their own, resubmitted by
    // every replay: no argument packing, pipeline lookup or command recording per run.
    fn record_begin(s: &VkStream) -> Result<bool> {
        s.s.record_begin().map(|()| true)
    }
    fn record_end(s: &VkStream) -> Result<Box<dyn std::any::Any + Send + Sync>> {
        Ok(Box::new(s.s.record_end()?))
    }
    fn replay(s: &VkStream, recorded: &(dyn std::any::Any + Send + Sync)) -> Result<()> {
        match recorded.downcast_ref::<crate::sys::Recorded>() {
            Some(r) => s.s.replay(r),
            None => Err(tessera_core::Error::InvalidArgument(
                "vulkan: a recording of another backend".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Capabilities a SPIR-V module declares (`OpCapability`).
    fn capabilities(code: &[u8]) -> Vec<u32> {
        let words = ash::util::read_spv(&mut std::io::Cursor::new(code)).unwrap();
        let mut caps = Vec::new();
        let mut at = 5;
        while at < words.len() && words[at] >> 16 != 0 {
            if words[at] & 0xffff == 17 {
                caps.push(words[at + 1]);
            }
            at += (words[at] >> 16) as usize;
        }
        caps
    }

    /// Every kernel that needs subgroup arithmetic (GroupNonUniformArithmetic, 63) has a `_nosg`
    /// variant without it, which `variant` picks where subgroups are off.
    #[test]
    fn subgroup_kernels_have_fallbacks() {
        const ARITHMETIC: u32 = 63;
        let mut found = 0;
        for name in crate::ported_kernels() {
            let Some(code) = spirv(name) else { continue };
            if name.ends_with("_nosg") {
                assert!(!capabilities(code).contains(&ARITHMETIC), "{name}");
                continue;
            }
            if !capabilities(code).contains(&ARITHMETIC) {
                continue;
            }
            found += 1;
            let fallback = spirv(&format!("{name}_nosg"));
            assert!(fallback.is_some(), "{name} has no _nosg variant");
            if !name.ends_with("_int8") {
                assert_eq!(variant(name, false, false), fallback, "{name}");
                assert_eq!(variant(name, false, true), Some(code), "{name}");
            }
        }
        assert!(found > 0, "no kernel uses subgroup arithmetic");
        assert_eq!(
            variant("k_mul_mat_vec_q", true, true),
            spirv("k_mul_mat_vec_q_int8")
        );
    }
}
