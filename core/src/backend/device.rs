use super::{Backend, Buffer, BufferType, HostMemory};
use crate::error::Result;
use crate::tensor::{TensorDesc, TensorId};
use std::fmt;
use std::sync::Arc;

/// What kind of hardware a device is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceType {
    /// Host CPU.
    Cpu,
    /// Discrete GPU with its own memory.
    Gpu,
    /// Integrated GPU sharing host memory.
    Igpu,
    /// Other accelerator (used with a CPU for unsupported ops).
    Accel,
    /// A device made of other devices (tensor parallelism).
    Meta,
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceType::Cpu => "CPU",
            DeviceType::Gpu => "GPU",
            DeviceType::Igpu => "IGPU",
            DeviceType::Accel => "ACCEL",
            DeviceType::Meta => "META",
        })
    }
}

/// Free and total memory in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free now.
    pub free: usize,
    /// Bytes in all.
    pub total: usize,
}

/// What a device can do beyond the required minimum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// `compute` returns before the graph has run.
    pub is_async: bool,
    /// A pinned host buffer type exists.
    pub host_buffer: bool,
    /// Host memory can be wrapped as a buffer without copying.
    pub buffer_from_host: bool,
    /// Events are supported.
    pub events: bool,
}

/// Whether a device can run an op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    /// It can.
    Yes,
    /// It cannot; the reason is printed by `test-ops` and the scheduler's debug output.
    No(String),
}

impl Support {
    /// Whether this is [`Support::Yes`].
    pub fn is_yes(&self) -> bool {
        matches!(self, Support::Yes)
    }
}

/// Options for a new stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendOptions {
    /// Threads in all for the stream's CPU thread pools ([`Device::thread_pools`]); `None` = the
    /// device's default. A CPU device runs this many; a device of several pools (a meta device
    /// over CPU devices) divides them as [`divide_threads`] does; a GPU ignores it.
    pub n_threads: Option<usize>,
}

/// Divides `total` threads among consumers that run `pools[i]` CPU thread pools each (see
/// [`Device::thread_pools`]): every pool gets `total / Σpools`, the first `total % Σpools`
/// pools one more, and never less than one. Returns each consumer's sum (`None` for a consumer
/// without pools, which takes no threads).
///
/// This is what a thread count means in llama.cpp (`-t N`: N threads in all), applied to a
/// model split over several CPU devices: giving each device all N would run `devices × N`
/// threads on N cores.
///
/// ```
/// use tessera_core::backend::divide_threads;
/// assert_eq!(divide_threads(4, &[1, 1]), vec![Some(2), Some(2)]);
/// assert_eq!(divide_threads(3, &[1, 0, 1]), vec![Some(2), None, Some(1)]);
/// assert_eq!(divide_threads(5, &[2]), vec![Some(5)]);
/// assert_eq!(divide_threads(1, &[1, 1]), vec![Some(1), Some(1)]); // one each at least
/// ```
pub fn divide_threads(total: usize, pools: &[usize]) -> Vec<Option<usize>> {
    let n_pools: usize = pools.iter().sum();
    let per = total.checked_div(n_pools).unwrap_or(0);
    let extra = total.checked_rem(n_pools).unwrap_or(0);
    let mut pool = 0;
    pools
        .iter()
        .map(|&n| {
            if n == 0 {
                return None;
            }
            let sum = (pool..pool + n)
                .map(|p| (per + usize::from(p < extra)).max(1))
                .sum();
            pool += n;
            Some(sum)
        })
        .collect()
}

impl BackendOptions {
    /// Options with an explicit thread count.
    pub fn with_threads(n: usize) -> BackendOptions {
        BackendOptions { n_threads: Some(n) }
    }
}

/// `opts` for a stream on each of `devices`: a thread count is the total for all of them,
/// divided among their thread pools as [`divide_threads`] does (a device without pools keeps
/// `opts` as given). Schedulers and meta devices start their streams with these.
pub fn per_device_options(
    devices: &[std::sync::Arc<dyn Device>],
    opts: &BackendOptions,
) -> Vec<BackendOptions> {
    // Zero stays zero, for each device to refuse by name.
    let Some(total) = opts.n_threads.filter(|&t| t > 0) else {
        return vec![opts.clone(); devices.len()];
    };
    let pools: Vec<usize> = devices.iter().map(|d| d.thread_pools()).collect();
    let n_pools: usize = pools.iter().sum();
    if total < n_pools {
        tracing::info!(
            threads = total,
            pools = n_pools,
            "fewer threads than CPU devices: each device runs one"
        );
    }
    divide_threads(total, &pools)
        .into_iter()
        .map(|n| BackendOptions {
            n_threads: n.or(opts.n_threads),
        })
        .collect()
}

/// A device that owns memory and runs graphs.
pub trait Device: Send + Sync + fmt::Debug {
    /// Unique name, e.g. `CPU`, `CPU1`, `CUDA0`.
    fn name(&self) -> &str;
    /// Human description (CPU model, GPU name).
    fn description(&self) -> String;
    /// Name of the registry (vendor backend) the device belongs to, e.g. `cpu`.
    fn backend_name(&self) -> &str;
    /// The kind of hardware.
    fn kind(&self) -> DeviceType;
    /// Free and total memory.
    fn memory(&self) -> MemoryInfo;
    /// Capabilities.
    fn caps(&self) -> DeviceCaps;
    /// The device's own memory.
    fn buffer_type(&self) -> Arc<dyn BufferType>;
    /// Optional. Memory for model weights, which graphs only read (as MUL_MAT's and GET_ROWS'
    /// first operand): it may keep them in a faster layout ([`Buffer::set_tensor`]). Default:
    /// [`Device::buffer_type`].
    fn weight_buffer_type(&self) -> Arc<dyn BufferType> {
        self.buffer_type()
    }
    /// Optional. Pinned host memory for fast transfers. Default: none.
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        None
    }
    /// Optional. For a device whose streams plan their own compute memory (a meta device
    /// splits every intermediate over its devices, so no single buffer of one type can hold
    /// them): plain memory its streams read graph inputs from and deliver graph outputs into. A
    /// scheduler then binds only what crosses into or out of the device's part of a graph, in
    /// buffers of this type, and leaves every other tensor of that part unbound for the stream
    /// to place. Default `None`: the scheduler plans the device's compute memory in buffers of
    /// [`Device::buffer_type`].
    fn io_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        None
    }
    /// Whether the device can run node `node` of `tensors` (a graph's or context's descriptors).
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support;
    /// Whether the device's streams can read and write buffers of `buft`.
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool;
    /// Optional. Whether `buf` is this device's own memory (schedulers run ops on weights where the
    /// weights live). Default: no.
    fn owns_buffer(&self, _buf: &dyn Buffer) -> bool {
        false
    }
    /// Optional. Whether the device's streams can read and write `buf` directly, without a copy.
    /// Default: only its own buffers.
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        self.owns_buffer(buf)
    }
    /// Optional. Whether an op whose weights live on the host is worth moving here. Default: no.
    fn offload_op(&self, _tensors: &[TensorDesc], _node: TensorId) -> bool {
        false
    }
    /// Optional. Wraps host memory as a read-only buffer without copying. Default `Ok(None)`:
    /// not supported, the caller copies into a normal buffer.
    ///
    /// # Errors
    /// Vendor errors while registering the memory.
    fn buffer_from_host(&self, _mem: HostMemory) -> Result<Option<Arc<dyn Buffer>>> {
        Ok(None)
    }
    /// A new stream on this device.
    ///
    /// # Errors
    /// Vendor errors, [`crate::Error::InvalidArgument`] for options the device cannot honour.
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>>;
    /// Optional. How many CPU thread pools a stream of this device runs: what a thread budget
    /// ([`BackendOptions::n_threads`]) is divided by. Default: one for a [`DeviceType::Cpu`],
    /// none for any other kind (a GPU's stream computes elsewhere).
    fn thread_pools(&self) -> usize {
        usize::from(self.kind() == DeviceType::Cpu)
    }
}
