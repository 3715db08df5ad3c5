//! The multi-device scheduler (ggml's `ggml_backend_sched`): runs one graph over several devices,
//! each op where it can run.
//!
//! [`Scheduler::alloc_graph`] assigns each node a device (see [`Cause`]), cuts the node list into
//! *splits* of consecutive nodes on one device, decides which split inputs must be copied (the
//! device cannot reach the memory, or pipelining needs private copies), plans every device's
//! compute memory with [`crate::alloc::plan`], and binds everything. [`Scheduler::compute`]
//! queues the splits in order; copies run on the source device's stream and events order the
//! streams, so the host never waits.
//!
//! Invariants: a tensor read by another device is never freed by its own device's plan; the
//! copies of split inputs and the graph's unbound inputs live in per-copy *slot* buffers, so with
//! `n_copies > 1` a new micro-batch can be fed while the previous one is still running.

mod assign;
mod layer;
mod split;

pub use assign::{Assignment, Cause};
pub use layer::layer_devices;

use crate::backend::{Backend, BackendOptions, Bindings, Buffer, Device, Event};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{TensorDesc, TensorId};
use split::Planned;
use std::collections::HashMap;
use std::sync::Arc;

/// Environment variable: when set, every planned graph's assignments and splits are logged
/// (target `tessera::sched`, level info).
pub const DEBUG_ENV: &str = "TESSERA_SCHED_DEBUG";

/// Scheduler settings.
#[derive(Clone, Debug)]
pub struct SchedOptions {
    /// Threads in all, divided among the devices' CPU thread pools as
    /// [`crate::backend::divide_threads`] does (`None`: each device's default).
    pub n_threads: Option<usize>,
    /// Copies of split inputs (1..=4): more than one lets consecutive micro-batches overlap.
    pub n_copies: usize,
}

impl Default for SchedOptions {
    fn default() -> SchedOptions {
        SchedOptions {
            n_threads: None,
            n_copies: 1,
        }
    }
}

pub(crate) struct Stream {
    pub device: Arc<dyn Device>,
    pub backend: Box<dyn Backend>,
    pub compute_buf: Option<Arc<dyn Buffer>>,
    pub slot_bufs: Vec<Option<Arc<dyn Buffer>>>,
    /// Per copy: completes when the last round that used that copy's slots has finished on this device.
    pub slot_events: Vec<Option<Event>>,
}

/// Runs graphs over a prioritised list of devices.
pub struct Scheduler {
    streams: Vec<Stream>,
    n_copies: usize,
    cur_copy: usize,
    user: HashMap<TensorId, usize>,
    planned: Option<Planned>,
    /// The copy index of the round `compute` queued last (for reading results).
    last_copy: usize,
    /// Per device: completes when its part of the previous round is done (rounds are ordered
    /// against each other when there is a single copy).
    round_events: Vec<Option<Event>>,
    allocations: usize,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.streams.iter().map(|s| s.device.name()).collect();
        f.debug_struct("Scheduler")
            .field("devices", &names)
            .field("n_copies", &self.n_copies)
            .finish()
    }
}

impl Scheduler {
    /// Streams on `devices`, in priority order; the last is the fallback (normally the CPU).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no devices or `n_copies` outside 1..=4; stream creation errors.
    pub fn new(devices: &[Arc<dyn Device>], opts: SchedOptions) -> Result<Scheduler> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "the scheduler needs at least one device".into(),
            ));
        }
        if !(1..=4).contains(&opts.n_copies) {
            return Err(Error::InvalidArgument(format!(
                "n_copies {} must be in 1..=4",
                opts.n_copies
            )));
        }
        let bopts = crate::backend::per_device_options(
            devices,
            &BackendOptions {
                n_threads: opts.n_threads,
            },
        );
        let streams = devices
            .iter()
            .zip(&bopts)
            .map(|(d, bopts)| {
                Ok(Stream {
                    device: d.clone(),
                    backend: d.init_backend(bopts)?,
                    compute_buf: None,
                    slot_bufs: vec![None; opts.n_copies],
                    slot_events: vec![None; opts.n_copies],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Scheduler {
            round_events: vec![None; streams.len()],
            streams,
            n_copies: opts.n_copies,
            cur_copy: 0,
            user: HashMap::new(),
            planned: None,
            last_copy: 0,
            allocations: 0,
        })
    }

    /// The scheduled devices, in priority order.
    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.streams.iter().map(|s| s.device.clone()).collect()
    }

    /// The stream of device `device` (for its reports, e.g. a meta stream's all-reduces through
    /// [`Backend::as_any`]), if the index is in range.
    pub fn backend(&self, device: usize) -> Option<&dyn Backend> {
        self.streams.get(device).map(|s| s.backend.as_ref())
    }

    /// Runs node `node` on device `device` in every later plan (it must support the op).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a device index out of range.
    pub fn set_tensor_device(&mut self, node: TensorId, device: usize) -> Result<()> {
        if device >= self.streams.len() {
            return Err(Error::InvalidArgument(format!(
                "device {device} of {}",
                self.streams.len()
            )));
        }
        self.user.insert(node, device);
        Ok(())
    }

    /// Plans `graph` and allocates its compute memory without binding anything else, so later
    /// graphs of the same shape need no allocation.
    ///
    /// # Errors
    /// As [`Scheduler::alloc_graph`].
    pub fn reserve(&mut self, graph: &Graph, weights: &Bindings) -> Result<()> {
        self.alloc_graph(graph, weights)
    }

    /// Assigns, splits, plans and binds `graph`; `weights` places the pre-allocated tensors.
    /// Buffers are reused when large enough.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when no device runs a node; allocation errors.
    pub fn alloc_graph(&mut self, graph: &Graph, weights: &Bindings) -> Result<()> {
        let planned = split::plan(self, graph, weights)?;
        if std::env::var_os(DEBUG_ENV).is_some() {
            tracing::info!(target: "tessera::sched", "\n{}", planned.describe(&self.streams));
        }
        self.planned = Some(planned);
        Ok(())
    }

    /// Buffers the scheduler has allocated so far (a re-run of a planned shape adds none).
    pub fn allocation_count(&self) -> usize {
        self.allocations
    }

    /// The device assignments of the last planned graph, in node order.
    pub fn assignments(&self) -> Vec<Assignment> {
        self.planned
            .as_ref()
            .map(|p| p.assignments.clone())
            .unwrap_or_default()
    }

    /// Splits of the last planned graph: (device index, node count, copied inputs).
    pub fn splits(&self) -> Vec<(usize, usize, usize)> {
        self.planned
            .as_ref()
            .map(|p| {
                p.splits
                    .iter()
                    .map(|s| (s.device, s.nodes, s.copies.len()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A multi-line report of the last plan: each node's device and cause, and the splits.
    pub fn describe(&self) -> String {
        self.planned
            .as_ref()
            .map(|p| p.describe(&self.streams))
            .unwrap_or_default()
    }

    /// Bytes of compute memory per device (the planned peaks).
    pub fn compute_bytes(&self) -> Vec<usize> {
        self.planned
            .as_ref()
            .map(|p| p.peaks.clone())
            .unwrap_or_default()
    }

    fn planned(&self) -> Result<&Planned> {
        self.planned.as_ref().ok_or_else(|| {
            Error::InvalidArgument("no graph allocated: call alloc_graph first".into())
        })
    }

    /// Writes a whole tensor of the allocated graph (typically an input), ordered after the
    /// previous use of its memory.
    ///
    /// # Errors
    /// [`Error::SizeMismatch`], [`Error::NotAllocated`], buffer errors.
    pub fn set_input(&mut self, id: TensorId, data: &[u8]) -> Result<()> {
        let c = self.cur_copy;
        let p = self.planned()?;
        let t = p.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: p.graph_len,
        })?;
        if data.len() != t.nbytes() {
            return Err(Error::SizeMismatch {
                tensor: crate::graph::label_of(&p.tensors, id),
                got: data.len(),
                expected: t.nbytes(),
            });
        }
        // With one copy, other devices may read this input in place: wait for every device's
        // previous round, not only the input's home device.
        let waits: Vec<Event> = if self.n_copies == 1 {
            self.round_events.iter().flatten().cloned().collect()
        } else {
            p.slot_home
                .get(&id)
                .and_then(|&d| self.streams[d].slot_events[c].clone())
                .into_iter()
                .collect()
        };
        for ev in &waits {
            ev.synchronize()?;
        }
        p.bindings[c].write(&p.tensors, id, 0, data)
    }

    /// Queues the allocated graph; returns before it has run.
    ///
    /// # Errors
    /// Planning errors of the streams; run-time errors surface at [`Scheduler::synchronize`].
    pub fn compute(&mut self) -> Result<()> {
        let c = self.cur_copy;
        split::run(self, c)?;
        self.last_copy = c;
        self.cur_copy = (c + 1) % self.n_copies;
        Ok(())
    }

    /// Waits for every device.
    ///
    /// # Errors
    /// The first run-time error of any stream.
    pub fn synchronize(&mut self) -> Result<()> {
        let mut first = None;
        for s in &mut self.streams {
            if let Err(e) = s.backend.synchronize() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Reads a whole tensor of the last computed graph (after [`Scheduler::synchronize`]).
    ///
    /// # Errors
    /// [`Error::SizeMismatch`], [`Error::NotAllocated`], buffer errors.
    pub fn get(&self, id: TensorId, out: &mut [u8]) -> Result<()> {
        let p = self.planned()?;
        let t = p.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: p.graph_len,
        })?;
        if out.len() != t.nbytes() {
            return Err(Error::SizeMismatch {
                tensor: crate::graph::label_of(&p.tensors, id),
                got: out.len(),
                expected: t.nbytes(),
            });
        }
        p.bindings[self.last_copy].read(&p.tensors, id, 0, out)
    }

    /// Reads an f32 tensor of the last computed graph.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another dtype; otherwise as [`Scheduler::get`].
    pub fn get_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        let p = self.planned()?;
        let t: &TensorDesc = p.tensors.get(id.index()).ok_or(Error::UnknownTensor {
            id: id.index(),
            len: p.graph_len,
        })?;
        if t.dtype != crate::DType::F32 {
            return Err(Error::InvalidArgument(format!(
                "tensor {} is {}, not f32",
                crate::graph::label_of(&p.tensors, id),
                t.dtype
            )));
        }
        let mut bytes = vec![0u8; t.nbytes()];
        self.get(id, &mut bytes)?;
        Ok(crate::dtype::f32_from_le_bytes(&bytes))
    }
}
