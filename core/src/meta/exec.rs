//! [`MetaBackend`]: runs a graph on every device of a meta device as per-device sub-graphs cut
//! after each node that needs an all-reduce, with the reduce in place between them.
//!
//! Per graph: leaves bound to meta buffers take their split state from their placement, other
//! leaves (inputs in host or device buffers) are MIRRORED; [`propagate`] gives every node its
//! state and the reduce points; each device gets its own descriptors ([`local_tensors`]) and its
//! own compute memory, planned on its slice shapes (so a device only reserves its share). Output
//! nodes bound by the caller are gathered into their buffers by [`Backend::synchronize`].

use super::buffer::MetaBuffer;
use super::fallback::HostFallback;
use super::inner::MetaInner;
use super::local::local_tensors;
use super::propagate::{NodeStates, propagate, reduce_points};
use super::split::{SplitState, gather};
use crate::alloc::plan;
use crate::backend::{Backend, BackendOptions, Bindings, Buffer};
use crate::comm::{Algorithm, AllReduce, CommSlice, DEFAULT_RING_THRESHOLD};
use crate::comm::{CommApi, CommOutcome, VendorComm};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, referenced};
use crate::registry::DeviceRegistry;
use crate::tensor::{TensorDesc, TensorId};
use std::any::Any;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

pub use crate::backend::{CommPath, MetaStats};

/// Plans a meta stream keeps for reuse.
const MAX_CACHED_PLANS: usize = 4;

/// A leaf living in a meta buffer: its state and its binding.
type MetaLeaf = (SplitState, Arc<dyn Buffer>, usize);

/// What one compute left for synchronize and reads.
struct LastRun {
    plan: Arc<MetaPlan>,
    /// Output nodes the caller bound: gathered into `(buffer, offset)` at synchronize.
    pending: Vec<(TensorId, Arc<dyn Buffer>, usize)>,
}

/// A leaf whose bytes are copied into a device's staging buffer before each run (it lives where
/// the device cannot read it): (leaf, source buffer, source offset, staging buffer, offset).
type Staged = (TensorId, Arc<dyn Buffer>, usize, Arc<dyn Buffer>, usize);

/// Everything a graph's run needs that depends only on the graph and where its leaves live:
/// split states, per-device descriptors, bindings and compute memory, and the per-device
/// sub-graphs between all-reduces. Decoding computes the same graph again and again with new
/// input values; the plan is kept and reused while graph and leaf bindings stay the same.
struct MetaPlan {
    /// The planned graph (held so that its descriptor allocation, which identifies it, lives
    /// as long as the plan).
    graph: Graph,
    /// Each leaf's binding when planned: (buffer address, offset).
    leaf_slots: Vec<(usize, usize)>,
    /// The leaves' buffers, held so that no other buffer can take one of their addresses while
    /// the plan may be reused.
    _leaf_buffers: Vec<Arc<dyn Buffer>>,
    states: Vec<Option<NodeStates>>,
    locals: Vec<Arc<[TensorDesc]>>,
    bindings: Vec<Bindings>,
    staged: Vec<Vec<Staged>>,
    /// Per segment: each device's sub-graph, and the node reduced after it.
    segments: Vec<(Vec<Graph>, Option<TensorId>)>,
    outputs: Vec<TensorId>,
    compute_bytes: Vec<usize>,
    /// Per device: the nodes whose slice runs on the host CPU (the device cannot run them).
    fallback: Vec<Arc<HashSet<TensorId>>>,
}

impl MetaPlan {
    fn tensors(&self) -> &[TensorDesc] {
        self.graph.tensors()
    }

    /// Whether this plan runs `graph` with `bindings`: the same graph object and every leaf
    /// bound where it was.
    fn serves(&self, graph: &Graph, bindings: &Bindings) -> bool {
        std::ptr::eq(self.graph.tensors(), graph.tensors())
            && self.graph.nodes() == graph.nodes()
            && self.graph.leafs() == graph.leafs()
            && leaf_slots(graph, bindings).is_some_and(|s| s == self.leaf_slots)
    }
}

/// Each leaf's (buffer address, offset), or `None` if one is unbound.
fn leaf_slots(graph: &Graph, bindings: &Bindings) -> Option<Vec<(usize, usize)>> {
    graph
        .leafs()
        .iter()
        .map(|&l| {
            bindings
                .slot(l)
                .map(|s| (Arc::as_ptr(&s.buffer) as *const u8 as usize, s.offset))
        })
        .collect()
}

/// A stream of a [`super::MetaDevice`]: one stream per device plus the all-reduce machinery.
pub struct MetaBackend {
    inner: Arc<MetaInner>,
    streams: Vec<Box<dyn Backend>>,
    vendor: Option<VendorComm>,
    /// The vendor comm spans every rank's devices (NCCL across processes): no second step.
    vendor_across_ranks: bool,
    path: CommPath,
    declined_logged: bool,
    generic: AllReduce,
    compute: Vec<Option<Arc<dyn Buffer>>>,
    staging: Vec<Option<Arc<dyn Buffer>>>,
    compute_bytes: Vec<usize>,
    last: Option<LastRun>,
    /// The latest plans, oldest first, each reused for the next compute of its graph and
    /// bindings (a scheduler may hand the device several parts of one graph, with other
    /// devices' parts between them).
    cached: Vec<Arc<MetaPlan>>,
    stats: MetaStats,
    /// Per device: the host CPU stream running the ops it cannot (made when first needed).
    host: Vec<Option<HostFallback>>,
    opts: BackendOptions,
}

impl fmt::Debug for MetaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetaBackend")
            .field("device", &self.inner.name)
            .field("path", &self.path)
            .finish()
    }
}

fn tensor_label(tensors: &[TensorDesc], id: TensorId) -> String {
    crate::graph::label_of(tensors, id)
}

impl MetaBackend {
    pub(crate) fn new(inner: Arc<MetaInner>, opts: &BackendOptions) -> Result<MetaBackend> {
        let mut streams = inner
            .devices
            .iter()
            .zip(crate::backend::per_device_options(&inner.devices, opts))
            .map(|(d, o)| d.init_backend(&o))
            .collect::<Result<Vec<_>>>()?;
        let n = inner.devices.len();
        // Within this process: its own devices (all of them unless distributed).
        let local = inner.local_range();
        let (vendor, path) = if local.len() == 1 {
            (None, CommPath::Single)
        } else if !inner.vendor_comm {
            (None, CommPath::Generic)
        } else {
            Self::vendor_comm(&inner.devices[local.clone()], &mut streams[local.clone()])
        };
        match &inner.dist {
            None => {
                tracing::info!(target: "tessera::meta", device = %inner.name, path = %path, "all-reduce path")
            }
            Some(d) => tracing::info!(
                target: "tessera::meta",
                device = %inner.name,
                path = %path,
                engine = d.comm.engine(),
                rank = d.comm.rank(),
                ranks = d.comm.size(),
                "all-reduce path within the rank, then across ranks"
            ),
        }
        let (vendor, path, vendor_across_ranks) =
            match Self::vendor_across_ranks(&inner, &mut streams)? {
                Some((v, p)) => (Some(v), p, true),
                None => (vendor, path, false),
            };
        let generic = AllReduce::new(
            &inner.devices[local],
            inner.wire,
            Algorithm::Auto {
                threshold_bytes: DEFAULT_RING_THRESHOLD,
            },
        )?;
        Ok(MetaBackend {
            streams,
            vendor,
            vendor_across_ranks,
            path,
            declined_logged: false,
            generic,
            compute: vec![None; n],
            staging: vec![None; n],
            compute_bytes: vec![0; n],
            last: None,
            cached: Vec::new(),
            stats: MetaStats::default(),
            host: (0..n).map(|_| None).collect(),
            opts: opts.clone(),
            inner,
        })
    }

    /// The vendor comm when every device belongs to one registry that exports the trio and
    /// accepts these streams; the generic path otherwise.
    fn vendor_comm(
        devices: &[Arc<dyn crate::backend::Device>],
        streams: &mut [Box<dyn Backend>],
    ) -> (Option<VendorComm>, CommPath) {
        let backend = devices[0].backend_name();
        if devices
            .iter()
            .any(|d| !d.backend_name().eq_ignore_ascii_case(backend))
        {
            tracing::info!(target: "tessera::meta", "devices of several backends: no vendor comm covers them all");
            return (None, CommPath::Generic);
        }
        let Some(registry) = DeviceRegistry::global().registry(backend) else {
            return (None, CommPath::Generic);
        };
        let Some(api) = CommApi::from_registry(registry.as_ref()) else {
            tracing::info!(target: "tessera::meta", backend, "backend exports no comm functions");
            return (None, CommPath::Generic);
        };
        match api.init(streams) {
            Some(c) => (Some(c), CommPath::Vendor(backend.to_string())),
            None => {
                tracing::info!(target: "tessera::meta", backend, "comm init declined these streams");
                (None, CommPath::Generic)
            }
        }
    }

    /// For a distributed meta device: one vendor comm over the devices of every rank (NCCL
    /// across processes), when every rank's devices are of one backend exporting
    /// [`crate::comm::COMM_INIT_RANKS`] and every rank's init succeeds. A collective: every
    /// rank takes the same decision (the reasons for declining are logged).
    fn vendor_across_ranks(
        inner: &MetaInner,
        streams: &mut [Box<dyn Backend>],
    ) -> Result<Option<(VendorComm, CommPath)>> {
        let Some(dist) = &inner.dist else {
            return Ok(None);
        };
        let comm = dist.comm.as_ref();
        let n_ranks = comm.size();
        let local = inner.local_range();
        let devices = &inner.devices[local.clone()];
        let backend = devices[0].backend_name().to_string();
        let api = (inner.vendor_comm
            && devices
                .iter()
                .all(|d| d.backend_name().eq_ignore_ascii_case(&backend)))
        .then(|| DeviceRegistry::global().registry(&backend))
        .flatten()
        .and_then(|r| crate::comm::RanksCommApi::from_registry(r.as_ref()));
        let flags = comm.allgather(
            &[u8::from(api.is_some())],
            &vec![1; n_ranks],
            "comm support",
        )?;
        let Some(api) = api.filter(|_| flags.iter().all(|&f| f == 1)) else {
            tracing::info!(target: "tessera::meta", backend, "no vendor comm across ranks (a rank's devices export none); reducing within each rank, then across ranks");
            return Ok(None);
        };
        let mut id = vec![0u8; 1 + crate::comm::COMM_ID_BYTES];
        if comm.rank() == 0 {
            match api.unique_id() {
                Ok(made) => {
                    id[0] = 1;
                    id[1..].copy_from_slice(&made);
                }
                Err(e) => {
                    tracing::info!(target: "tessera::meta", backend, error = %e, "no job id for a vendor comm across ranks")
                }
            }
        }
        comm.broadcast(0, &mut id, "comm job id")?;
        if id[0] == 0 {
            return Ok(None);
        }
        let ctx = api.init(
            &mut streams[local.clone()],
            &id[1..],
            inner.devices.len(),
            local.start,
        );
        let flags = comm.allgather(&[u8::from(ctx.is_some())], &vec![1; n_ranks], "comm init")?;
        match ctx {
            Some(ctx) if flags.iter().all(|&f| f == 1) => Ok(Some((
                ctx,
                CommPath::Vendor(format!("{backend} across {n_ranks} ranks")),
            ))),
            _ => {
                tracing::info!(target: "tessera::meta", backend, "a rank's vendor comm init across ranks declined");
                Ok(None)
            }
        }
    }

    /// The stream on device `j` of the meta device (`None` past the last).
    pub fn device_stream(&self, j: usize) -> Option<&dyn Backend> {
        self.streams.get(j).map(|s| s.as_ref())
    }

    /// The all-reduce path chosen at creation.
    pub fn comm_path(&self) -> &CommPath {
        &self.path
    }

    /// Counters since creation.
    pub fn stats(&self) -> MetaStats {
        self.stats
    }

    /// The all-reduces of the last graph, in order: each reduced node's name (its label if unnamed) and its F32
    /// element count (e.g. one `ffn_moe_out.{il}` of `n_embd·T` per mixture-of-experts block).
    pub fn reduces(&self) -> Vec<(String, usize)> {
        let Some(last) = self.last.as_ref() else {
            return Vec::new();
        };
        let tensors = last.plan.tensors();
        last.plan
            .segments
            .iter()
            .filter_map(|(_, r)| *r)
            .map(|r| {
                let t = &tensors[r.index()];
                let name = if t.name().is_empty() {
                    tensor_label(tensors, r)
                } else {
                    t.name().to_string()
                };
                (name, t.nelements())
            })
            .collect()
    }

    /// The ops of the last graph that fell back to the host CPU, per device that has any:
    /// (device name, [(op name, nodes)]), e.g. `("VK0", [("SOFT_MAX", 2)])`.
    pub fn fallbacks(&self) -> Vec<(String, Vec<(String, usize)>)> {
        let Some(last) = self.last.as_ref() else {
            return Vec::new();
        };
        let tensors = last.plan.tensors();
        let mut out = Vec::new();
        for (j, set) in last.plan.fallback.iter().enumerate() {
            if set.is_empty() {
                continue;
            }
            let mut ops: Vec<(String, usize)> = Vec::new();
            let mut ids: Vec<&TensorId> = set.iter().collect();
            ids.sort_by_key(|id| id.index());
            for id in ids {
                let op = tensors[id.index()].op().name().to_string();
                match ops.iter_mut().find(|(o, _)| *o == op) {
                    Some((_, c)) => *c += 1,
                    None => ops.push((op, 1)),
                }
            }
            out.push((self.inner.devices[j].name().to_string(), ops));
        }
        out
    }

    /// Compute-memory bytes each device reserved for the last graph (its share only).
    pub fn compute_bytes(&self) -> &[usize] {
        &self.compute_bytes
    }

    /// The split state of `id` in the last graph: what the node produces (PARTIAL before its
    /// reduce) and what its consumers read.
    pub fn state_of(&self, id: TensorId) -> Option<(SplitState, SplitState)> {
        let st = self.last.as_ref()?.plan.states.get(id.index())?.as_ref()?;
        Some((st.own.clone(), st.seen.clone()))
    }

    /// The full value of `id` after the last graph (call [`Backend::synchronize`] first):
    /// gathered from the devices for split tensors, summed for PARTIAL ones. Valid for output
    /// nodes, leaves and any node whose memory was not reused.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no graph ran or `id` is not part of it; read errors.
    pub fn get(&self, id: TensorId) -> Result<Vec<u8>> {
        let last = self.last.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!("{}: no graph has run", self.inner.name))
        })?;
        Self::gather_from(&self.inner, last, id)
    }

    fn gather_from(inner: &MetaInner, last: &LastRun, id: TensorId) -> Result<Vec<u8>> {
        let last = &*last.plan;
        let st = last
            .states
            .get(id.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{}: tensor {} is not part of the last graph",
                    inner.name,
                    tensor_label(last.tensors(), id)
                ))
            })?;
        // A reduced node holds the sum on every device.
        let state = if st.reduce { &st.seen } else { &st.own };
        let n = inner.devices.len();
        for j in 0..n {
            if !last.locals[j][id.index()].is_contiguous() {
                return Err(Error::InvalidArgument(format!(
                    "{}: tensor {} is a strided view; read its source",
                    inner.name,
                    tensor_label(last.tensors(), id)
                )));
            }
        }
        let read = |j: usize| -> Result<Vec<u8>> {
            let mut bytes = vec![0u8; last.locals[j][id.index()].nbytes()];
            if !bytes.is_empty() {
                let (buf, off) = last.bindings[j].resolve(&last.locals[j], id)?;
                buf.read(off, &mut bytes)?;
            }
            Ok(bytes)
        };
        let local = inner.local_range();
        if state.is_mirrored() {
            // Every device holds the whole value: this process's first reads it.
            return gather(&last.tensors()[id.index()], state, &[read(local.start)?]);
        }
        let Some(dist) = &inner.dist else {
            let parts = (0..n).map(read).collect::<Result<Vec<_>>>()?;
            return gather(&last.tensors()[id.index()], state, &parts);
        };
        // The other ranks' slices come through the rank collectives; every rank reads the same
        // outputs in the same order, so every rank calls this gather.
        let sizes: Vec<usize> = (0..n)
            .map(|j| last.locals[j][id.index()].nbytes())
            .collect();
        let mut mine = Vec::with_capacity(local.clone().map(|j| sizes[j]).sum());
        for j in local {
            mine.extend_from_slice(&read(j)?);
        }
        let counts: Vec<usize> = (0..dist.comm.size())
            .map(|r| {
                (0..n)
                    .filter(|&j| dist.owner[j] == r)
                    .map(|j| sizes[j])
                    .sum()
            })
            .collect();
        let all = dist.comm.allgather(
            &mine,
            &counts,
            &format!("gather of {}", tensor_label(last.tensors(), id)),
        )?;
        let mut parts = Vec::with_capacity(n);
        let mut at = 0;
        for &len in &sizes {
            parts.push(all[at..at + len].to_vec());
            at += len;
        }
        gather(&last.tensors()[id.index()], state, &parts)
    }

    /// Static states of the leaves from their meta-buffer placements; other leaves are inputs.
    fn leaf_states(&self, graph: &Graph, bindings: &Bindings) -> Result<Vec<Option<MetaLeaf>>> {
        let tensors = graph.tensors();
        let mut out = vec![None; tensors.len()];
        for &leaf in graph.leafs() {
            let t = &tensors[leaf.index()];
            if t.is_view() {
                return Err(Error::InvalidOp {
                    op: t.op().name().into(),
                    tensor: tensor_label(tensors, leaf),
                    reason: "a leaf view cannot be split: make the view a node of the graph".into(),
                });
            }
            let (buf, off) = bindings.resolve(tensors, leaf)?;
            if let Some(mb) = buf.as_any().downcast_ref::<MetaBuffer>() {
                if !Arc::ptr_eq(mb.inner(), &self.inner) {
                    return Err(Error::Foreign {
                        backend: self.inner.name.clone(),
                        what: format!(
                            "tensor {} lives in another meta device's buffer",
                            tensor_label(tensors, leaf)
                        ),
                    });
                }
                let p = mb.placement_at(off).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "tensor {} is not a tensor of {} (offset {off})",
                        tensor_label(tensors, leaf),
                        mb.name()
                    ))
                })?;
                if p.desc.ne() != t.ne() || p.desc.dtype() != t.dtype() {
                    return Err(Error::InvalidArgument(format!(
                        "tensor {} ({} {:?}) is bound to a meta placement of {} {:?}",
                        tensor_label(tensors, leaf),
                        t.dtype(),
                        t.ne(),
                        p.desc.dtype(),
                        p.desc.ne()
                    )));
                }
                out[leaf.index()] = Some((p.state.clone(), buf.clone(), off));
            }
        }
        Ok(out)
    }

    /// Plans `graph` with `bindings` (see [`MetaPlan`]).
    fn plan(&mut self, graph: &Graph, bindings: &Bindings) -> Result<MetaPlan> {
        let mut compute_bytes = vec![0usize; self.inner.devices.len()];
        let t_plan = std::time::Instant::now();
        let tensors = graph.tensors();
        let n = self.inner.devices.len();
        let leaves = self.leaf_states(graph, bindings)?;
        let states = propagate(graph, &|id| {
            leaves[id.index()].as_ref().map(|(s, _, _)| s.clone())
        })?;
        let reduces = reduce_points(graph, &states);
        for &r in &reduces {
            let t = &tensors[r.index()];
            if t.dtype() != DType::F32 || t.is_view() {
                return Err(Error::InvalidOp {
                    op: t.op().name().into(),
                    tensor: tensor_label(tensors, r),
                    reason: format!(
                        "its PARTIAL sums need an all-reduce, which takes contiguous F32 nodes, \
                         not {}{}",
                        t.dtype(),
                        if t.is_view() { " views" } else { "" }
                    ),
                });
            }
        }
        let mut outputs: Vec<TensorId> = graph.outputs().to_vec();
        for &id in graph.nodes() {
            if tensors[id.index()].flags().output && !outputs.contains(&id) {
                outputs.push(id);
            }
        }

        // Per device: descriptors, bindings of leaves, compute memory.
        let mut locals = Vec::with_capacity(n);
        let mut dev_bindings = Vec::with_capacity(n);
        let mut all_staged = Vec::with_capacity(n);
        let mut fallback = Vec::with_capacity(n);
        #[allow(clippy::needless_range_loop)] // `j` indexes devices, streams and buffers alike
        for j in 0..n {
            let dev = self.inner.devices[j].clone();
            let local: Arc<[TensorDesc]> = local_tensors(graph, &states, j)?.into();
            // Each device is asked about its own slice of every node, before anything runs; what
            // it cannot run falls back to the host CPU (its slice only), if the CPU can.
            let mut on_host = HashSet::new();
            if self.inner.is_local(j) {
                for &id in graph.nodes() {
                    if let crate::backend::Support::No(reason) = dev.supports_op(&local, id) {
                        let t = &local[id.index()];
                        let unsupported = |why: String| Error::Unsupported {
                            op: t.op().name().into(),
                            dtype: t.src(0).map_or(t.dtype(), |s| local[s.index()].dtype()),
                            device: dev.name().into(),
                            reason: format!("{why} (slice of {})", tensor_label(tensors, id)),
                        };
                        let cpu = host_cpu().ok_or_else(|| {
                            unsupported(format!("{reason}; no host CPU device to fall back to"))
                        })?;
                        if let crate::backend::Support::No(cpu_reason) = cpu.supports_op(&local, id)
                        {
                            return Err(unsupported(format!(
                                "{reason}; the host CPU cannot run it either: {cpu_reason}"
                            )));
                        }
                        on_host.insert(id);
                    }
                }
            }
            if !on_host.is_empty() {
                tracing::info!(
                    target: "tessera::meta",
                    device = dev.name(),
                    nodes = on_host.len(),
                    "ops the device cannot run fall back to the host CPU"
                );
            }
            fallback.push(Arc::new(on_host));
            let mut pre = Bindings::new();
            let mut staged: Vec<(TensorId, Arc<dyn Buffer>, usize, usize)> = Vec::new();
            let mut staging_bytes = 0usize;
            let align = dev.buffer_type().alignment().max(1);
            for &leaf in graph.leafs() {
                match &leaves[leaf.index()] {
                    Some((_, buf, off)) => {
                        let mb = buf
                            .as_any()
                            .downcast_ref::<MetaBuffer>()
                            .expect("leaf_states only keeps meta buffers");
                        let p = mb.placement_at(*off).expect("checked by leaf_states");
                        pre.bind(leaf, mb.parts()[p.home[j]].clone(), p.local_offset[j]);
                    }
                    None => {
                        let (buf, off) = bindings.resolve(tensors, leaf)?;
                        if dev.can_access(buf.as_ref()) {
                            pre.bind(leaf, buf, off);
                        } else {
                            let at = staging_bytes.div_ceil(align) * align;
                            staging_bytes = at + tensors[leaf.index()].nbytes();
                            staged.push((leaf, buf, off, at));
                        }
                    }
                }
            }
            let mut dev_staged = Vec::with_capacity(staged.len());
            if !staged.is_empty() {
                let sbuf = Self::ensure(&mut self.staging[j], dev.as_ref(), staging_bytes)?;
                for (leaf, src, off, at) in staged {
                    pre.bind(leaf, sbuf.clone(), at);
                    dev_staged.push((leaf, src, off, sbuf.clone(), at));
                }
            }
            all_staged.push(dev_staged);
            let g = Graph::from_parts(
                local.clone(),
                graph.nodes().to_vec(),
                graph.leafs().to_vec(),
                outputs.clone(),
            );
            let buft = dev.buffer_type();
            let p = plan(&g, &pre, buft.alignment(), &|t| buft.alloc_size(t))?;
            compute_bytes[j] = p.stats.peak;
            if !p.offsets.is_empty() {
                let cbuf = Self::ensure(&mut self.compute[j], dev.as_ref(), p.stats.peak.max(1))?;
                for (id, off) in p.offsets {
                    pre.bind(id, cbuf.clone(), off);
                }
            }
            locals.push(local);
            dev_bindings.push(pre);
        }

        tracing::debug!(
            target: "tessera::meta",
            nodes = graph.nodes().len(),
            reduces = reduces.len(),
            plan_us = t_plan.elapsed().as_micros() as u64,
            compute_bytes = ?compute_bytes,
            "planned"
        );
        // Sub-graphs between reduces; the reduce follows its node.
        let nodes = graph.nodes();
        let mut start = 0;
        let mut cuts: Vec<(usize, usize, Option<TensorId>)> = Vec::new();
        for (i, id) in nodes.iter().enumerate() {
            if reduces.contains(id) {
                cuts.push((start, i + 1, Some(*id)));
                start = i + 1;
            }
        }
        if start < nodes.len() {
            cuts.push((start, nodes.len(), None));
        }
        let mut segments = Vec::with_capacity(cuts.len());
        for (s, e, red) in cuts {
            let seg = &nodes[s..e];
            let subs = (0..n)
                .map(|j| {
                    Graph::from_parts(
                        locals[j].clone(),
                        seg.to_vec(),
                        referenced(&locals[j], seg),
                        Vec::new(),
                    )
                })
                .collect();
            segments.push((subs, red));
        }
        let leaf_slots = leaf_slots(graph, bindings).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: a leaf of the graph is unbound",
                self.inner.name
            ))
        })?;
        Ok(MetaPlan {
            graph: graph.clone(),
            leaf_slots,
            _leaf_buffers: graph
                .leafs()
                .iter()
                .filter_map(|&l| bindings.slot(l).map(|s| s.buffer.clone()))
                .collect(),
            states,
            locals,
            bindings: dev_bindings,
            staged: all_staged,
            segments,
            outputs,
            compute_bytes,
            fallback,
        })
    }

    fn ensure(
        slot: &mut Option<Arc<dyn Buffer>>,
        dev: &dyn crate::backend::Device,
        bytes: usize,
    ) -> Result<Arc<dyn Buffer>> {
        match slot {
            Some(b) if b.size() >= bytes => Ok(b.clone()),
            _ => {
                let b = dev.buffer_type().alloc(bytes)?;
                *slot = Some(b.clone());
                Ok(b)
            }
        }
    }

    fn finish_pending(&mut self) -> Result<()> {
        let Some(last) = self.last.as_mut() else {
            return Ok(());
        };
        if last.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut last.pending);
        let last = self.last.as_ref().expect("checked above");
        for (id, buf, off) in pending {
            let full = Self::gather_from(&self.inner, last, id)?;
            buf.write(off, &full)?;
        }
        Ok(())
    }

    fn sync_streams(&mut self) -> Result<()> {
        let mut first = None;
        for s in &mut self.streams {
            if let Err(e) = s.synchronize() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn reduce(&mut self, slices: &[CommSlice]) -> Result<()> {
        if let Some(v) = self.vendor.as_mut() {
            match v.allreduce(slices)? {
                CommOutcome::Done => {
                    self.stats.vendor_reduces += 1;
                    return Ok(());
                }
                CommOutcome::Declined if self.vendor_across_ranks => {
                    // The other ranks' devices are in this sum: no local fallback can finish it.
                    return Err(Error::Compute {
                        device: self.inner.name.clone(),
                        reason: "the vendor comm across ranks declined an all-reduce".into(),
                    });
                }
                CommOutcome::Declined => {
                    if !self.declined_logged {
                        self.declined_logged = true;
                        tracing::info!(
                            target: "tessera::meta",
                            device = %self.inner.name,
                            "vendor all-reduce declined; using the generic path for such calls"
                        );
                    }
                }
            }
        }
        self.generic.run(&mut self.streams, slices)?;
        self.stats.generic_reduces += 1;
        Ok(())
    }
}

impl MetaBackend {
    /// The second half of a distributed all-reduce: this process's slices hold its sum (or,
    /// with one local device, its addend); the sum over ranks goes through the rank
    /// collectives in the meta device's wire format and back into every local slice.
    fn reduce_across_ranks(&mut self, slices: &[CommSlice], what: &str) -> Result<()> {
        let Some(dist) = self.inner.dist.clone() else {
            return Ok(());
        };
        for j in self.inner.local_range() {
            self.streams[j].synchronize()?;
        }
        let s0 = &slices[0];
        let mut sum = if slices.len() > 1 || s0.contributes {
            let mut bytes = vec![0u8; s0.len * 4];
            s0.buffer.read(s0.offset, &mut bytes)?;
            crate::dtype::f32_from_le_bytes(&bytes)
        } else {
            // A zero-length slice of the reduction axis: its memory holds no addend.
            vec![0f32; s0.len]
        };
        let what = format!("all-reduce of {what}");
        match self.inner.wire {
            crate::comm::Wire::F32 => dist.comm.allreduce_f32(&mut sum, &what)?,
            crate::comm::Wire::Bf16 => {
                crate::comm::allreduce_bf16(dist.comm.as_ref(), &mut sum, &what)?
            }
        }
        let bytes: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
        for s in slices {
            s.buffer.write(s.offset, &bytes)?;
        }
        self.stats.dist_reduces += 1;
        Ok(())
    }
}

/// The host CPU device fallbacks run on.
pub(super) fn host_cpu() -> Option<Arc<dyn crate::backend::Device>> {
    DeviceRegistry::global()
        .select("cpu:1")
        .ok()
        .and_then(|d| d.into_iter().next())
}

/// Whether device-local node `r` holds an addend: a row-parallel matmul over a zero-length slice
/// of the reduction axis adds nothing, so the comm may skip its memory whatever it holds.
fn contributes(local: &[TensorDesc], r: TensorId) -> bool {
    let t = &local[r.index()];
    match (t.op().kind(), t.src(0)) {
        (crate::ops::OpKind::MulMat, Some(w)) => local[w.index()].ne()[0] > 0,
        _ => true,
    }
}

impl Backend for MetaBackend {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        let queued = self.queue_graph(graph, bindings);
        if queued.is_err() {
            // End the failed graph on every device before returning: wait for what the other
            // streams had queued (sub-graphs, all-reduces) and clear the errors it left on them,
            // so none surfaces in the next graph; none of its outputs is delivered, now or later.
            if let Err(also) = self.sync_streams() {
                tracing::warn!(target: "tessera::meta", device = %self.inner.name, error = %also, "another stream failed in the same graph");
            }
            self.last = None;
        }
        queued
    }

    fn synchronize(&mut self) -> Result<()> {
        if let Err(e) = self.sync_streams() {
            // Every stream is drained and clean again; the failed graph's outputs are garbage
            // and must not be written into the caller's buffers by a later call.
            self.last = None;
            return Err(e);
        }
        self.finish_pending()
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn split_report(&self) -> Option<crate::backend::SplitReport> {
        Some(crate::backend::SplitReport {
            comm_path: self.path.clone(),
            stats: self.stats,
            reduces: self.reduces(),
            fallbacks: self.fallbacks(),
            compute_bytes: self.compute_bytes.clone(),
        })
    }
    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }
}

impl MetaBackend {
    /// Queues `graph` on every device: [`Backend::compute`] without the clean-up on failure.
    fn queue_graph(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        // Outputs of the previous graph still owed to their buffers are read before this graph
        // may reuse the memory.
        if self.last.as_ref().is_some_and(|l| !l.pending.is_empty()) {
            self.sync_streams()?;
            self.finish_pending()?;
        }
        let plan = match self.cached.iter().position(|p| p.serves(graph, bindings)) {
            Some(i) => self.cached[i].clone(),
            None => {
                let p = Arc::new(self.plan(graph, bindings)?);
                if self.cached.len() == MAX_CACHED_PLANS {
                    self.cached.remove(0);
                }
                self.cached.push(p.clone());
                p
            }
        };
        self.compute_bytes.clone_from(&plan.compute_bytes);
        // Leaves the devices cannot read (inputs in host memory) are copied in every run: their
        // values change between runs, their places do not.
        for (j, staged) in plan.staged.iter().enumerate() {
            for (leaf, src, off, sbuf, at) in staged {
                let len = plan.tensors()[leaf.index()].nbytes();
                let mut bytes = vec![0u8; len];
                src.read(*off, &mut bytes)?;
                self.streams[j].write_async(sbuf.as_ref(), *at, &bytes)?;
            }
        }
        let tensors = plan.tensors();
        let n = self.inner.devices.len();
        let local = self.inner.local_range();
        for (subs, red) in &plan.segments {
            for (j, sub) in subs.iter().enumerate() {
                if !local.contains(&j) {
                    continue;
                }
                if plan.fallback[j].is_empty() {
                    self.streams[j].compute(sub, &plan.bindings[j])?;
                } else {
                    let host = match &mut self.host[j] {
                        Some(h) => h,
                        slot => {
                            let cpu = host_cpu().ok_or_else(|| Error::Unavailable {
                                backend: "cpu".into(),
                                reason: "no host CPU device for the fallback".into(),
                            })?;
                            slot.insert(HostFallback::new(cpu, &self.opts)?)
                        }
                    };
                    host.run(
                        self.streams[j].as_mut(),
                        sub,
                        &plan.bindings[j],
                        &plan.fallback[j],
                    )?;
                }
                self.stats.subgraphs += 1;
            }
            if let Some(r) = *red
                && n > 1
            {
                let len = tensors[r.index()].nelements();
                let slices = local
                    .clone()
                    .map(|j| {
                        let (buffer, offset) = plan.bindings[j].resolve(&plan.locals[j], r)?;
                        Ok(CommSlice {
                            buffer,
                            offset,
                            len,
                            contributes: contributes(&plan.locals[j], r),
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                if slices.len() > 1 || self.vendor_across_ranks {
                    self.reduce(&slices)?;
                }
                if self.inner.dist.is_some() && !self.vendor_across_ranks {
                    self.reduce_across_ranks(&slices, &tensor_label(tensors, r))?;
                }
                self.stats.reduced_values += len;
            }
        }
        self.stats.graphs += 1;

        let mut pending = Vec::new();
        for &o in &plan.outputs {
            if let Some(slot) = bindings.slot(o) {
                pending.push((o, slot.buffer.clone(), slot.offset));
            }
        }
        self.last = Some(LastRun { plan, pending });
        Ok(())
    }
}
