//! [`Cuda`]: the CUDA driver API (`sys`) and the NVRTC compile step (`compile`) behind the shared
//! runtime's [`Driver`] trait; NCCL as its collective library.

use crate::compile;
use crate::sys::driver::{self, DeviceMem, Function, Gpu, Module, PinnedMem, RawEvent, Stream};
use crate::sys::nvrtc::Nvrtc;
use std::sync::Arc;
use tessera_core::Result;
use tessera_gpu::nccl::Nccl;
use tessera_gpu::{Driver, RegistryDriver, Runtime, Unit};

/// Environment variable choosing the all-reduce path: `nccl` (default) or `none` (always the
/// generic fallback).
pub const ALLREDUCE_ENV: &str = "TESSERA_CUDA_ALLREDUCE";

/// The CUDA driver with NVRTC, as the shared GPU runtime drives it.
#[derive(Debug)]
pub struct Cuda {
    nvrtc: Arc<Nvrtc>,
}

/// Probes libcuda, loads NVRTC and opens every GPU, or says why not.
fn open() -> std::result::Result<Runtime<Cuda>, String> {
    let count = driver::probe()?;
    if count == 0 {
        return Err("the CUDA driver reports no devices".into());
    }
    let nvrtc = Arc::new(Nvrtc::load().map_err(|e| e.to_string())?);
    let version = driver::driver_version().unwrap_or(0);
    tracing::debug!(count, driver = version, nvrtc = ?nvrtc.version(), "CUDA available");
    Runtime::open_each(Cuda { nvrtc }, count, Gpu::open)
}

impl tessera_gpu::PinnedMem for PinnedMem {
    fn size(&self) -> usize {
        PinnedMem::size(self)
    }
    fn addr(&self) -> usize {
        PinnedMem::addr(self)
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        PinnedMem::write(self, offset, src)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        PinnedMem::read(self, offset, dst)
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        PinnedMem::memset(self, offset, len, value)
    }
}

impl Driver for Cuda {
    const NAME: &'static str = "cuda";
    const PINNED_HOST: bool = true;

    tessera_gpu::forward_driver_methods!(
        Gpu = Gpu,
        Mem = DeviceMem,
        Pinned = PinnedMem,
        Stream = Stream,
        Event = RawEvent,
        Module = Module,
        Function = Function,
    );

    fn describe(gpu: &Gpu) -> String {
        let (maj, min) = gpu.compute_capability();
        format!("{} (GPU {}, sm_{maj}{min})", gpu.name(), gpu.ordinal())
    }
    fn can_access_peer(gpu: &Gpu, peer: &Gpu) -> bool {
        gpu.can_access_peer(peer)
    }
    fn has_mma_tiles(gpu: &Gpu) -> bool {
        gpu.compute_capability().0 >= 8
    }
    fn enable_peer_access(gpu: &Gpu, peer: &Gpu) -> Result<()> {
        gpu.enable_peer_access(peer)
    }
    fn alloc_pinned(gpu: &Arc<Gpu>, bytes: usize) -> Result<Option<PinnedMem>> {
        PinnedMem::alloc(gpu, bytes).map(Some)
    }
    fn copy_to_device_async(
        s: &Stream,
        dst: &DeviceMem,
        doff: usize,
        src: &PinnedMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        s.copy_htod_pinned(dst, doff, src, soff, len)
    }
    fn copy_to_host_async(
        s: &Stream,
        dst: &PinnedMem,
        doff: usize,
        src: &DeviceMem,
        soff: usize,
        len: usize,
    ) -> Result<()> {
        s.copy_dtoh_pinned(dst, doff, src, soff, len)
    }
    fn record_begin(stream: &Stream) -> Result<bool> {
        stream.begin_capture().map(|()| true)
    }
    fn record_end(stream: &Stream) -> Result<Box<dyn std::any::Any + Send + Sync>> {
        Ok(Box::new(stream.end_capture()?))
    }
    fn replay(stream: &Stream, recorded: &(dyn std::any::Any + Send + Sync)) -> Result<()> {
        match recorded.downcast_ref::<driver::GraphExec>() {
            Some(g) => stream.launch_graph(g),
            None => Err(tessera_core::Error::InvalidArgument(
                "cuda: a recording of another backend".into(),
            )),
        }
    }
    fn event_record_timed(stream: &Stream) -> Result<Option<RawEvent>> {
        RawEvent::record_timed(stream).map(Some)
    }
    fn event_elapsed_ms(start: &RawEvent, end: &RawEvent) -> Result<f32> {
        RawEvent::elapsed_ms(start, end)
    }
    fn load_module(&self, gpu: &Arc<Gpu>, unit: &Unit) -> Result<Module> {
        compile::load_module(gpu, &self.nvrtc, unit.file)
    }
}

impl RegistryDriver for Cuda {
    const DEVICE_PREFIX: &'static str = "CUDA";
    const ALLREDUCE_ENV: &'static str = ALLREDUCE_ENV;

    tessera_gpu::forward_registry_methods!(Cuda, open);

    fn load_collectives() -> Result<Nccl> {
        Nccl::load()
    }
}
