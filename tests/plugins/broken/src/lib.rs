//! A toy backend for the loader's error-path tests, and helpers the broken plugins share.
//!
//! The toy keeps host memory in a `Vec` and runs no ops. With `panicky` set, its stream
//! creation and buffer writes panic, so tests can see panics come back as typed errors.

use std::any::Any;
use std::sync::Arc;
use std::sync::Mutex;
use tessera_core::{
    Backend, BackendOptions, Bindings, Buffer, BufferType, Device, DeviceCaps, DeviceType, Error,
    Graph, MemoryInfo, Registry, Result, Support, TensorDesc, TensorId,
};

/// The toy registry: one device, `TOY`.
#[derive(Debug, Default)]
pub struct ToyRegistry {
    /// Whether stream creation and buffer writes panic.
    pub panicky: bool,
}

impl Registry for ToyRegistry {
    fn name(&self) -> &str {
        "toy"
    }
    fn probe(&self) -> Result<()> {
        Ok(())
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        Ok(vec![Arc::new(ToyDevice {
            panicky: self.panicky,
        })])
    }
}

/// The toy device.
#[derive(Debug)]
pub struct ToyDevice {
    panicky: bool,
}

impl Device for ToyDevice {
    fn name(&self) -> &str {
        "TOY"
    }
    fn description(&self) -> String {
        "a toy device for loader tests".into()
    }
    fn backend_name(&self) -> &str {
        "toy"
    }
    fn kind(&self) -> DeviceType {
        DeviceType::Accel
    }
    fn memory(&self) -> MemoryInfo {
        MemoryInfo::default()
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps::default()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(ToyBufferType {
            panicky: self.panicky,
        })
    }
    fn supports_op(&self, _tensors: &[TensorDesc], _node: TensorId) -> Support {
        Support::No("the toy runs no ops".into())
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any().is::<ToyBufferType>()
    }
    fn init_backend(&self, _opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        if self.panicky {
            panic!("deliberate panic in init_backend");
        }
        Ok(Box::new(ToyBackend))
    }
}

/// The toy's memory.
#[derive(Debug)]
pub struct ToyBufferType {
    panicky: bool,
}

impl BufferType for ToyBufferType {
    fn name(&self) -> &str {
        "TOY"
    }
    fn alignment(&self) -> usize {
        8
    }
    fn is_host(&self) -> bool {
        true
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(ToyBuffer {
            bytes: Mutex::new(vec![0; size]),
            panicky: self.panicky,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A toy buffer.
#[derive(Debug)]
pub struct ToyBuffer {
    bytes: Mutex<Vec<u8>>,
    panicky: bool,
}

impl ToyBuffer {
    fn with<T>(&self, f: impl FnOnce(&mut Vec<u8>) -> T) -> Result<T> {
        let mut g = self
            .bytes
            .lock()
            .map_err(|_| Error::InvalidArgument("toy buffer poisoned".into()))?;
        Ok(f(&mut g))
    }
}

impl Buffer for ToyBuffer {
    fn size(&self) -> usize {
        self.with(|b| b.len()).unwrap_or(0)
    }
    fn name(&self) -> String {
        "TOY buffer".into()
    }
    fn is_host(&self) -> bool {
        true
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        if self.panicky {
            panic!("deliberate panic in write");
        }
        tessera_core::error::check_range(&"TOY buffer", offset, src.len(), self.size())?;
        self.with(|b| b[offset..offset + src.len()].copy_from_slice(src))
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        tessera_core::error::check_range(&"TOY buffer", offset, dst.len(), self.size())?;
        self.with(|b| dst.copy_from_slice(&b[offset..offset + dst.len()]))
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        tessera_core::error::check_range(&"TOY buffer", offset, len, self.size())?;
        self.with(|b| b[offset..offset + len].fill(value))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The toy stream: runs nothing.
#[derive(Debug)]
pub struct ToyBackend;

impl Backend for ToyBackend {
    fn name(&self) -> &str {
        "TOY"
    }
    fn compute(&mut self, _graph: &Graph, _bindings: &Bindings) -> Result<()> {
        Err(Error::InvalidArgument("the toy runs no ops".into()))
    }
    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The toy's registry table with `edit` applied, leaked for the life of the process (how a
/// hand-written plugin with a wrong header would look).
///
/// # Safety
/// `host` is null or points to a host table readable for the call.
pub unsafe fn edited_table(
    host: *const tessera_plugin::abi::RawHost,
    edit: impl FnOnce(&mut tessera_plugin::abi::RawRegistry),
) -> *const tessera_plugin::abi::RawRegistry {
    // SAFETY: forwarded from this function's contract.
    let real = unsafe {
        tessera_plugin::export_entry(host, || -> Arc<dyn Registry> {
            Arc::new(ToyRegistry::default())
        })
    };
    // SAFETY: `export_entry` returns null or a table that lives for the process.
    let Some(real) = (unsafe { real.as_ref() }) else {
        return std::ptr::null();
    };
    let mut copy = *real;
    edit(&mut copy);
    Box::leak(Box::new(copy))
}
