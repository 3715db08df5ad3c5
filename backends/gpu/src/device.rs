//! [`GpuDevice`]: one logical device on a GPU. Several logical devices may share a GPU (the
//! `KIND:N` selector with N above the GPU count): they share its context, memory and compiled
//! kernels, and each stream is its own driver stream.

use crate::buffer::{GpuBuffer, GpuBufferType, HostBufferType};
use crate::driver::Driver;
use crate::runtime::GpuContext;
use crate::stream::GpuStream;
use std::sync::Arc;
use tessera_core::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, Error, MemoryInfo,
    Result, Support, TensorDesc, TensorId,
};

/// A GPU device.
#[derive(Debug)]
pub struct GpuDevice<D: Driver> {
    name: String,
    ctx: Arc<GpuContext<D>>,
    buft: Arc<GpuBufferType<D>>,
    /// The pinned host buffer type, where the driver has pinned memory.
    host_buft: Option<Arc<HostBufferType<D>>>,
}

impl<D: Driver> GpuDevice<D> {
    /// The logical device `name` on `ctx`'s GPU, with a pinned host buffer type if `pinned`.
    pub fn new(name: &str, ctx: Arc<GpuContext<D>>, pinned: bool) -> GpuDevice<D> {
        let gpu = ctx.gpu().clone();
        GpuDevice {
            name: name.to_string(),
            buft: Arc::new(GpuBufferType::new(name, gpu.clone())),
            host_buft: pinned.then(|| Arc::new(HostBufferType::new(name, gpu))),
            ctx,
        }
    }

    /// The driver ordinal of the GPU.
    pub fn gpu_ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The GPU, for its vendor attributes.
    pub fn gpu(&self) -> &D::Gpu {
        self.ctx.gpu()
    }
}

impl<D: Driver> Device for GpuDevice<D> {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> String {
        D::describe(self.gpu())
    }
    fn backend_name(&self) -> &str {
        D::NAME
    }
    fn kind(&self) -> DeviceType {
        D::device_type(self.gpu())
    }
    fn memory(&self) -> MemoryInfo {
        let (free, total) = D::mem_info(self.gpu()).unwrap_or((0, D::total_mem(self.gpu())));
        MemoryInfo { free, total }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            is_async: true,
            host_buffer: self.host_buft.is_some(),
            buffer_from_host: false,
            events: true,
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.buft.clone()
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        self.host_buft.clone().map(|b| b as Arc<dyn BufferType>)
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        crate::stream::supports::<D>(self.gpu(), tensors, node)
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any()
            .downcast_ref::<GpuBufferType<D>>()
            .is_some_and(|b| b.gpu_ordinal() == self.gpu_ordinal())
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<GpuBuffer<D>>()
            .is_some_and(|b| b.device_name() == self.name)
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<GpuBuffer<D>>()
            .is_some_and(|b| b.gpu_ordinal() == self.gpu_ordinal())
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        if opts.n_threads.is_some_and(|n| n == 0) {
            return Err(Error::InvalidArgument(format!(
                "{}: thread count 0",
                self.name
            )));
        }
        Ok(Box::new(GpuStream::new(&self.name, self.ctx.clone())?))
    }
}
