//! [`MetaDevice`]: N devices driven as one, with static tensors split by a [`SplitPolicy`].

use super::buffer::MetaBufferType;
use super::exec::MetaBackend;
use super::inner::{DistPart, MetaInner, SplitLayout, SplitPolicy};
use super::split::SplitState;
use crate::backend::{
    Backend, BackendOptions, Buffer, BufferType, Device, DeviceCaps, DeviceType, MemoryInfo,
    Support,
};
use crate::comm::{DistComm, Wire};
use crate::error::{Error, Result};
use crate::tensor::{TensorDesc, TensorId};
use std::sync::Arc;

/// A device made of N devices (any vendors): static tensors are split across them by a
/// [`SplitPolicy`], compute tensors by propagation, and each graph runs as per-device sub-graphs
/// joined by all-reduces. See `docs/src/meta-device.md`.
///
/// A policy is any [`SplitPolicy`], a closure included; language models bring their own
/// (`tessera_model::LlamaSplitPolicy` splits llama-family weights as llama.cpp does).
///
/// ```no_run
/// # use tessera_core::{DeviceRegistry, Device, TensorDesc};
/// # use tessera_core::meta::{MetaDevice, SplitLayout, SplitState, split_lengths};
/// # fn main() -> tessera_core::Result<()> {
/// let reg = DeviceRegistry::global();
/// let devs = reg.select("cpu:2")?;
/// // Weights named `w_up` split their output rows (axis 1) by the ratios; the rest is mirrored.
/// let policy = |t: &TensorDesc, layout: &SplitLayout| -> tessera_core::Result<SplitState> {
///     if t.name() == "w_up" {
///         let lens = split_lengths(t.ne()[1], layout.n_devices, &layout.ratios, 1, 0)?;
///         SplitState::axis_lens(1, lens)
///     } else {
///         Ok(SplitState::mirrored())
///     }
/// };
/// let meta = MetaDevice::new(&devs, policy)?.with_ratios(&[3.0, 1.0])?;
/// let backend = meta.init_backend(&Default::default())?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MetaDevice {
    inner: Arc<MetaInner>,
}

impl MetaDevice {
    /// A meta device over `devices` (at least one, distinct names) with an even split.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty list or a device listed twice.
    pub fn new(
        devices: &[Arc<dyn Device>],
        policy: impl SplitPolicy + 'static,
    ) -> Result<MetaDevice> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "a meta device needs at least one device".into(),
            ));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|e| e.name() == d.name()) {
                return Err(Error::InvalidArgument(format!(
                    "device {} is listed twice in the meta device",
                    d.name()
                )));
            }
            if d.kind() == DeviceType::Meta {
                return Err(Error::InvalidArgument(format!(
                    "meta device {} cannot be part of another meta device",
                    d.name()
                )));
            }
        }
        let names: Vec<&str> = devices.iter().map(|d| d.name()).collect();
        Ok(MetaDevice {
            inner: Arc::new(MetaInner {
                name: format!("META({})", names.join(",")),
                devices: devices.to_vec(),
                policy: Arc::new(policy),
                layout: SplitLayout {
                    n_devices: devices.len(),
                    ratios: Vec::new(),
                },
                wire: Wire::F32,
                vendor_comm: true,
                dist: None,
            }),
        })
    }

    /// A meta device over the devices of every rank of `comm`, in rank order: `local` are this
    /// process's; the others are learned from their ranks (a collective: every rank calls this
    /// with its own devices). Each rank allocates and computes only its own devices' slices;
    /// all-reduces sum within the rank, then across ranks through `comm`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty `local` list or duplicate names; `comm` errors.
    pub fn distributed(
        local: &[Arc<dyn Device>],
        comm: Arc<dyn DistComm>,
        policy: impl SplitPolicy + 'static,
    ) -> Result<MetaDevice> {
        let me = comm.rank();
        if local.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "rank {me}: a distributed meta device needs at least one local device"
            )));
        }
        let mut list = String::new();
        for d in local {
            if d.kind() == DeviceType::Meta {
                return Err(Error::InvalidArgument(format!(
                    "meta device {} cannot be part of another meta device",
                    d.name()
                )));
            }
            list += &format!("{}\t{}\t{}\n", d.name(), d.backend_name(), d.kind());
        }
        let n_ranks = comm.size();
        let lens = comm.allgather(
            &(list.len() as u64).to_le_bytes(),
            &vec![8; n_ranks],
            "device list sizes",
        )?;
        let counts: Vec<usize> = lens
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
            .collect();
        let all = comm.allgather(list.as_bytes(), &counts, "device lists")?;
        let mut devices: Vec<Arc<dyn Device>> = Vec::new();
        let mut owner = Vec::new();
        let mut names = Vec::new();
        let mut at = 0;
        for (r, &c) in counts.iter().enumerate() {
            let text = String::from_utf8_lossy(&all[at..at + c]).into_owned();
            at += c;
            if r == me {
                for d in local {
                    names.push(format!("r{r}/{}", d.name()));
                    devices.push(d.clone());
                    owner.push(r);
                }
                continue;
            }
            for line in text.lines() {
                let mut f = line.split('\t');
                let (Some(name), Some(backend), Some(kind)) = (f.next(), f.next(), f.next()) else {
                    return Err(Error::Dist {
                        engine: comm.engine().into(),
                        rank: me,
                        reason: format!("rank {r} sent a malformed device list: {line:?}"),
                    });
                };
                let kind = match kind {
                    "GPU" => DeviceType::Gpu,
                    "IGPU" => DeviceType::Igpu,
                    "ACCEL" => DeviceType::Accel,
                    _ => DeviceType::Cpu,
                };
                let global = format!("r{r}/{name}");
                names.push(global.clone());
                devices.push(Arc::new(super::remote::RemoteDevice::new(
                    global,
                    backend.to_string(),
                    kind,
                    r,
                )));
                owner.push(r);
            }
        }
        if owner.iter().filter(|&&r| r != me).count() + local.len() != devices.len()
            || (0..n_ranks).any(|r| !owner.contains(&r))
        {
            return Err(Error::Dist {
                engine: comm.engine().into(),
                rank: me,
                reason: "every rank needs at least one device".into(),
            });
        }
        for (i, d) in local.iter().enumerate() {
            if local[..i].iter().any(|e| e.name() == d.name()) {
                return Err(Error::InvalidArgument(format!(
                    "device {} is listed twice in the meta device",
                    d.name()
                )));
            }
        }
        Ok(MetaDevice {
            inner: Arc::new(MetaInner {
                name: format!("META({})", names.join(",")),
                layout: SplitLayout {
                    n_devices: devices.len(),
                    ratios: Vec::new(),
                },
                devices,
                policy: Arc::new(policy),
                wire: Wire::F32,
                vendor_comm: true,
                dist: Some(DistPart { comm, owner }),
            }),
        })
    }

    /// The same devices split by `ratios` (one non-negative number per device, positive sum).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a wrong count or a negative, non-finite or all-zero list.
    pub fn with_ratios(self, ratios: &[f32]) -> Result<MetaDevice> {
        let n = self.inner.devices.len();
        if ratios.len() != n {
            return Err(Error::InvalidArgument(format!(
                "{} split ratios for {n} devices",
                ratios.len()
            )));
        }
        if let Some(r) = ratios.iter().find(|r| !r.is_finite() || **r < 0.0) {
            return Err(Error::InvalidArgument(format!(
                "split ratio {r} is not a finite non-negative number"
            )));
        }
        if ratios.iter().sum::<f32>() <= 0.0 {
            return Err(Error::InvalidArgument(
                "split ratios sum to zero: give at least one device a share".into(),
            ));
        }
        let mut inner = self.rebuild();
        inner.layout.ratios = ratios.to_vec();
        Ok(MetaDevice {
            inner: Arc::new(inner),
        })
    }

    /// The same devices exchanging all-reduce data of the generic path in `wire` format
    /// (default [`Wire::F32`], exact).
    pub fn with_wire(self, wire: Wire) -> MetaDevice {
        let mut inner = self.rebuild();
        inner.wire = wire;
        MetaDevice {
            inner: Arc::new(inner),
        }
    }

    /// Whether streams may use the devices' backend comm (default `true`); `false` always takes
    /// the generic all-reduce (to compare paths, or to work around a faulty vendor library).
    pub fn with_vendor_comm(self, enabled: bool) -> MetaDevice {
        let mut inner = self.rebuild();
        inner.vendor_comm = enabled;
        MetaDevice {
            inner: Arc::new(inner),
        }
    }

    fn rebuild(&self) -> MetaInner {
        MetaInner {
            name: self.inner.name.clone(),
            devices: self.inner.devices.clone(),
            policy: self.inner.policy.clone(),
            layout: self.inner.layout.clone(),
            wire: self.inner.wire,
            vendor_comm: self.inner.vendor_comm,
            dist: self.inner.dist.clone(),
        }
    }

    /// The devices, in split order (in a distributed meta device, those of every rank; the
    /// others' hold no memory here).
    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.inner.devices
    }

    /// This process's devices (all of them unless [`MetaDevice::distributed`]).
    pub fn local_devices(&self) -> &[Arc<dyn Device>] {
        &self.inner.devices[self.inner.local_range()]
    }

    /// Whether device `j` of [`MetaDevice::devices`] belongs to this process.
    pub fn is_local(&self, j: usize) -> bool {
        j < self.inner.devices.len() && self.inner.is_local(j)
    }

    /// The rank collectives of a [`MetaDevice::distributed`] device.
    pub fn dist(&self) -> Option<&Arc<dyn DistComm>> {
        self.inner.dist.as_ref().map(|d| &d.comm)
    }

    /// Device count and ratios.
    pub fn layout(&self) -> &SplitLayout {
        &self.inner.layout
    }

    /// What the meta device is and how its policy splits: the devices, ratios and the
    /// policy's own line (for a mixture-of-experts model, which layers split whole experts
    /// (EP) and which split every expert along `n_ff_exp` (TP)), e.g.
    /// `META(cpu0,cpu1): tensor-parallel over 2 devices; experts (expert split): EP layers 0-3`.
    pub fn describe(&self) -> String {
        let policy = self.policy_description();
        format!(
            "{}: {}{}{}",
            self.inner.name,
            self.description(),
            if policy.is_empty() { "" } else { "; " },
            policy
        )
    }

    /// The policy's own line of [`MetaDevice::describe`] ([`SplitPolicy::describe`]), e.g.
    /// `experts (expert split): EP layers 0-3`; empty where it has nothing to add.
    pub fn policy_description(&self) -> String {
        self.inner.policy.describe(&self.inner.layout)
    }

    /// The state the policy gives `desc`.
    ///
    /// # Errors
    /// The policy's errors.
    pub fn split_state(&self, desc: &TensorDesc) -> Result<SplitState> {
        self.inner.policy.split_state(desc, &self.inner.layout)
    }

    /// The concrete buffer type (for its per-device figures).
    pub fn meta_buffer_type(&self) -> MetaBufferType {
        MetaBufferType::new(self.inner.clone())
    }

    /// The weight buffer type ([`crate::Device::weight_buffer_type`]) with its concrete type, to
    /// declare copies ([`MetaBufferType::with_copies`]).
    pub fn meta_weight_buffer_type(&self) -> MetaBufferType {
        MetaBufferType::weights(self.inner.clone())
    }

    /// A stream of the meta device with its concrete type.
    ///
    /// # Errors
    /// As [`Device::init_backend`] of the devices.
    pub fn init_meta_backend(&self, opts: &BackendOptions) -> Result<MetaBackend> {
        MetaBackend::new(self.inner.clone(), opts)
    }
}

impl Device for MetaDevice {
    fn name(&self) -> &str {
        &self.inner.name
    }
    fn description(&self) -> String {
        let ranks = self.inner.dist.as_ref().map_or(String::new(), |d| {
            format!(" of {} ranks ({})", d.comm.size(), d.comm.engine())
        });
        format!(
            "tensor-parallel over {} devices{ranks}{}",
            self.inner.devices.len(),
            if self.inner.layout.ratios.is_empty() {
                String::new()
            } else {
                format!(" (ratios {:?})", self.inner.layout.ratios)
            }
        )
    }
    fn backend_name(&self) -> &str {
        "meta"
    }
    fn kind(&self) -> DeviceType {
        DeviceType::Meta
    }
    fn memory(&self) -> MemoryInfo {
        self.inner
            .devices
            .iter()
            .map(|d| d.memory())
            .fold(MemoryInfo::default(), |a, m| MemoryInfo {
                free: a.free.saturating_add(m.free),
                total: a.total.saturating_add(m.total),
            })
    }
    fn caps(&self) -> DeviceCaps {
        // Events and host buffers would let a scheduler mix the meta device with pipeline
        // parallelism, which it does not support.
        DeviceCaps {
            is_async: self.inner.devices.iter().all(|d| d.caps().is_async),
            host_buffer: false,
            buffer_from_host: false,
            events: false,
        }
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(self.meta_buffer_type())
    }
    fn weight_buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(MetaBufferType::weights(self.inner.clone()))
    }
    fn io_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        // Graph inputs in plain memory are mirrored to every device (copied in where a device
        // cannot read them) and bound outputs are gathered into it (meta-device.md §7); the
        // first local device's memory is what a single-process caller reads fastest.
        self.local_devices().first().map(|d| d.buffer_type())
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        // A device lacking the op has its slice run on the host CPU instead (meta-device.md
        // §16), so the op is refused only when the CPU cannot run it either.
        let mut host_cpu_ok = None;
        for d in &self.inner.devices {
            if let Support::No(why) = d.supports_op(tensors, node) {
                let cpu = *host_cpu_ok.get_or_insert_with(|| {
                    super::exec::host_cpu().is_some_and(|c| c.supports_op(tensors, node).is_yes())
                });
                if !cpu {
                    return Support::No(format!(
                        "{}: {why}; the host CPU cannot run it either",
                        d.name()
                    ));
                }
            }
        }
        Support::Yes
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        buft.as_any()
            .downcast_ref::<MetaBufferType>()
            .is_some_and(|b| Arc::ptr_eq(b.inner(), &self.inner))
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        buf.as_any()
            .downcast_ref::<super::buffer::MetaBuffer>()
            .is_some_and(|b| Arc::ptr_eq(b.inner(), &self.inner))
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        Ok(Box::new(self.init_meta_backend(opts)?))
    }
    fn thread_pools(&self) -> usize {
        self.inner.devices.iter().map(|d| d.thread_pools()).sum()
    }
}
