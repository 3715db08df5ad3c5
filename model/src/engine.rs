//! [`Session`]: a model loaded on devices in any split mode, evaluated step by step through its
//! KV caches.
//!
//! Every mode runs the same way: the [`Scheduler`] places each op on a device and copies what
//! crosses devices. A tensor-parallel group is one [`MetaDevice`] among the scheduler's
//! devices, which splits the ops it receives over its own devices and inserts the
//! all-reduces; so `none`, `layer`, `tensor` and `expert` differ only in the device list the
//! scheduler gets, and a layer split over several tensor-parallel groups
//! ([`crate::Split::Tensor`] with `groups`) needs nothing more.

use crate::ExpertSplit;
use crate::kv_cells::{KvCells, MAX_SEQUENCES};
use crate::llama::Step;
use crate::{Batch, BatchLogits, KvCacheTypes, LlamaModel, Outputs, SeqId, SessionBuilder};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use tessera::comm::DistComm;
use tessera::meta::MetaDevice;
use tessera::sched::{SchedOptions, Scheduler, layer_devices};
use tessera::{Bindings, Device, Error, Result, TensorBuffer, TensorId};

/// How a model is spread over its devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SplitMode {
    /// The whole model on the first device.
    #[default]
    None,
    /// Consecutive layers on consecutive devices (in proportion to the ratios).
    Layer,
    /// Every layer split across the devices: tensor parallelism through the meta device.
    Tensor,
    /// As `Tensor`, with whole experts per device in the mixture-of-experts layers where that
    /// is cheaper (expert parallelism).
    Expert,
}

impl SplitMode {
    /// Every mode, in the order of their names in [`SplitMode::ACCEPTED`].
    pub const ALL: &'static [SplitMode] = &[
        SplitMode::None,
        SplitMode::Layer,
        SplitMode::Tensor,
        SplitMode::Expert,
    ];

    /// The accepted names, for messages.
    pub const ACCEPTED: &str = "none, layer, tensor, expert";

    /// The mode's name (`--split-mode` of the command line, llama.cpp's `-sm`).
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
            SplitMode::Tensor => "tensor",
            SplitMode::Expert => "expert",
        }
    }

    /// Whether the mode splits every layer (through the meta device).
    pub fn is_tensor_parallel(self) -> bool {
        matches!(self, SplitMode::Tensor | SplitMode::Expert)
    }

    /// How the meta device splits expert stacks in this mode.
    pub fn expert_split(self) -> ExpertSplit {
        match self {
            SplitMode::Expert => ExpertSplit::Expert,
            _ => ExpertSplit::Tensor,
        }
    }
}

impl fmt::Display for SplitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SplitMode {
    type Err = Error;

    /// A mode by name, case and surrounding spaces ignored.
    fn from_str(s: &str) -> Result<SplitMode> {
        let name = s.trim().to_ascii_lowercase();
        SplitMode::ALL
            .iter()
            .copied()
            .find(|m| m.name() == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown split mode '{s}'; accepted modes: {}",
                    SplitMode::ACCEPTED
                ))
            })
    }
}

/// How to open a [`Session`] (what [`crate::SessionBuilder`] checked). `SessionOptions::default()`
/// is the whole model on one device with the devices' default thread counts.
#[derive(Clone)]
pub(crate) struct SessionOptions {
    /// The split mode.
    pub(crate) split_mode: SplitMode,
    /// One ratio per device for `layer`, `tensor` and `expert` (empty: even).
    pub(crate) ratios: Vec<f32>,
    /// Threads in all, divided among the CPU devices (`None`: each device's default, one per
    /// core it owns), as llama.cpp's `-t`: two CPU devices with `Some(4)` run two each.
    pub(crate) threads: Option<usize>,
    /// The processes of a distributed job (`tensor` and `expert` only): every rank opens its
    /// session with its own devices and the same model, and the meta device spans all ranks.
    pub(crate) comm: Option<Arc<dyn DistComm>>,
    /// Tensor-parallel groups for `tensor` and `expert` (default 1): the devices are cut into
    /// this many consecutive groups of equal size, each group splits every layer it holds, and
    /// the layers are split between the groups in proportion to their summed ratios.
    pub(crate) groups: usize,
    /// Element types of the KV caches (`None`: the model's own, F16 unless
    /// [`LlamaModel::with_cache_types`] chose others).
    pub(crate) cache_types: Option<KvCacheTypes>,
    /// Sequence ids the session accepts in a [`Batch`]: `0..max_sequences` (default and at
    /// most [`crate::MAX_SEQUENCES`]). The sequences share the KV cache's `n_ctx` cells.
    pub(crate) max_sequences: usize,
}

impl fmt::Debug for SessionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionOptions")
            .field("split_mode", &self.split_mode)
            .field("ratios", &self.ratios)
            .field("threads", &self.threads)
            .field("comm", &self.comm.as_ref().map(|c| (c.rank(), c.size())))
            .field("groups", &self.groups)
            .field("cache_types", &self.cache_types)
            .field("max_sequences", &self.max_sequences)
            .finish()
    }
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            split_mode: SplitMode::None,
            ratios: Vec::new(),
            threads: None,
            comm: None,
            groups: 1,
            cache_types: None,
            max_sequences: MAX_SEQUENCES,
        }
    }
}

impl SessionOptions {
    /// `max_sequences`, checked.
    fn checked_sequences(&self) -> Result<usize> {
        let n = self.max_sequences;
        if n == 0 || n > MAX_SEQUENCES {
            return Err(Error::InvalidArgument(format!(
                "max_sequences {n}: a session holds 1 to {MAX_SEQUENCES} sequences"
            )));
        }
        Ok(n)
    }

    /// `model` with the cache types these options ask for (borrowed when they are its own).
    fn typed_model<'m>(&self, model: &'m LlamaModel) -> Result<std::borrow::Cow<'m, LlamaModel>> {
        Ok(match self.cache_types {
            Some(types) if types != model.cache_types() => {
                std::borrow::Cow::Owned(model.with_cache_types(types)?)
            }
            _ => std::borrow::Cow::Borrowed(model),
        })
    }
}

#[allow(dead_code)] // Some setters serve only the tests.
impl SessionOptions {
    /// Options for `mode` with even ratios and default threads.
    pub(crate) fn new(split_mode: SplitMode) -> SessionOptions {
        SessionOptions {
            split_mode,
            ..SessionOptions::default()
        }
    }

    /// These options with `groups` tensor-parallel groups in a layer split (see
    /// [`SessionOptions::groups`]).
    pub(crate) fn with_groups(mut self, groups: usize) -> SessionOptions {
        self.groups = groups;
        self
    }

    /// These options with `ratios`.
    pub(crate) fn with_ratios(mut self, ratios: &[f32]) -> SessionOptions {
        self.ratios = ratios.to_vec();
        self
    }

    /// These options with `threads` in all (see [`SessionOptions::threads`]).
    pub(crate) fn with_threads(mut self, threads: Option<usize>) -> SessionOptions {
        self.threads = threads;
        self
    }

    /// These options with KV caches of `types` (see [`SessionOptions::cache_types`]).
    pub(crate) fn with_cache_types(mut self, types: KvCacheTypes) -> SessionOptions {
        self.cache_types = Some(types);
        self
    }

    /// These options accepting sequence ids `0..n` (see [`SessionOptions::max_sequences`]).
    pub(crate) fn with_max_sequences(mut self, n: usize) -> SessionOptions {
        self.max_sequences = n;
        self
    }

    /// These options across the ranks of `comm`.
    pub(crate) fn with_comm(mut self, comm: Option<Arc<dyn DistComm>>) -> SessionOptions {
        self.comm = comm;
        self
    }
}

/// A tensor-parallel group of a session: its meta device and its index among the scheduler's
/// devices.
pub(crate) struct Group {
    pub(crate) device: usize,
    pub(crate) meta: MetaDevice,
}

/// A model loaded on devices in one split mode, evaluating tokens of one or many sequences
/// against its KV cache. Open one with [`Session::builder`].
///
/// ```no_run
/// use tessera_model::{LlamaConfig, LlamaModel, Session, Split};
/// # fn main() -> tessera::Result<()> {
/// let model = LlamaModel::new(LlamaConfig::tiny(), 42)?;
/// let mut session = Session::builder(&model)
///     .devices(&tessera::registry().select("cpu:2")?)
///     .split(Split::Tensor { ratios: vec![3.0, 1.0], groups: 1 })
///     .build()?;
/// let logits = session.eval_last(&[1, 2, 3])?; // n_vocab logits of the last token
/// let next = tessera_model::argmax(&logits) as i32;
/// let logits = session.eval_last(&[next])?;
/// # let _ = logits; Ok(()) }
/// ```
pub struct Session {
    /// The model as loaded: where a tensor-parallel group holds the output projection, a tied
    /// output gets its own copy ([`LlamaModel::untie_output`]) so that it splits over the
    /// vocabulary while the embedding stays whole for GET_ROWS.
    model: LlamaModel,
    mode: SplitMode,
    sched: Scheduler,
    groups: Vec<Group>,
    /// Each KV cache and the scheduler device holding it.
    cache_home: Vec<(TensorId, usize)>,
    weights: Bindings,
    buffers: Vec<TensorBuffer>,
    /// Which sequence and position each cache row holds.
    cells: KvCells,
    /// Tokens evaluated since the session opened (a forked prefix is not evaluated again).
    evaluated: u64,
    /// The step graph the scheduler planned last: reused while it fits (decode steps within one
    /// [`crate::KV_PAD`] span), so a token costs no graph build, plan or allocation.
    planned: Option<(Outputs, Step)>,
    /// Logit bytes read back, reused across steps.
    read_buf: Vec<u8>,
    plans: usize,
    /// See [`Session::set_check_finite`].
    check_finite: bool,
}

impl Session {
    /// A [`SessionBuilder`] for `model`: devices, split, threads, context, cache types,
    /// sequences and a progress callback, checked together when it builds.
    ///
    /// ```
    /// use tessera_model::{LlamaConfig, LlamaModel, Session, Split};
    /// # fn main() -> tessera::Result<()> {
    /// let model = LlamaModel::new(LlamaConfig::tiny(), 42)?;
    /// let mut session = Session::builder(&model)
    ///     .devices(&tessera::registry().select("cpu:2")?)
    ///     .split(Split::layer())
    ///     .build()?;
    /// let logits = session.eval_last(&[1, 2, 3])?; // n_vocab logits of the last token
    /// # let _ = logits; Ok(()) }
    /// ```
    pub fn builder(model: &LlamaModel) -> SessionBuilder<'_> {
        SessionBuilder::new(model)
    }

    /// The model split by the caller's `meta` device, with the rest of `opts`.
    pub(crate) fn from_meta(
        model: &LlamaModel,
        meta: MetaDevice,
        opts: &SessionOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<Session> {
        let n = opts.checked_sequences()?;
        let model = &opts.typed_model(model)?;
        let sched = SchedOptions {
            n_threads: opts.threads,
            ..SchedOptions::default()
        };
        let layer_device = vec![0; model.config().n_layer];
        let mut s = Self::build(
            model,
            vec![meta],
            &layer_device,
            sched,
            SplitMode::Tensor,
            progress,
        )?;
        s.cells = KvCells::new(s.model.config().n_ctx, n);
        Ok(s)
    }

    #[cfg(test)]
    /// Loads `model` on `devices` as `opts` says: `none` uses the first device, `layer` assigns
    /// consecutive layers by the ratios, `tensor` and `expert` split every layer over all the
    /// devices (and over the ranks of `opts.comm`), or over each of `opts.groups` groups of
    /// them with the layers split between the groups. `none` ignores the ratios and the devices
    /// after the first, so one set of options serves every mode.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no devices, bad ratios, devices that do not form the
    /// groups, or a distributed job outside `tensor` and `expert`; split-policy errors naming
    /// the tensor; allocation and upload errors naming the device.
    pub(crate) fn open(
        model: &LlamaModel,
        devices: &[Arc<dyn Device>],
        opts: &SessionOptions,
    ) -> Result<Session> {
        Self::open_with_progress(model, devices, opts, |_, _| {})
    }

    /// [`Session::open`], calling `progress(done, total)` after each uploaded tensor.
    ///
    /// # Errors
    /// As [`Session::open`].
    pub(crate) fn open_with_progress(
        model: &LlamaModel,
        devices: &[Arc<dyn Device>],
        opts: &SessionOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<Session> {
        let n = opts.checked_sequences()?;
        let mut s = Self::open_split(model, devices, opts, progress)?;
        s.cells = KvCells::new(s.model.config().n_ctx, n);
        Ok(s)
    }

    fn open_split(
        model: &LlamaModel,
        devices: &[Arc<dyn Device>],
        opts: &SessionOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<Session> {
        let mode = opts.split_mode;
        let model = &opts.typed_model(model)?;
        if devices.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "split mode {mode}: no devices to load the model on"
            )));
        }
        if opts.comm.is_some() && !mode.is_tensor_parallel() {
            return Err(Error::InvalidArgument(format!(
                "a distributed job splits each layer over the ranks: use split mode tensor or \
                 expert, not {mode}"
            )));
        }
        let sched_opts = SchedOptions {
            n_threads: opts.threads,
            ..SchedOptions::default()
        };
        let n_layer = model.config().n_layer;
        if !mode.is_tensor_parallel() {
            if opts.groups != 1 {
                return Err(Error::InvalidArgument(format!(
                    "{} tensor-parallel groups need split mode tensor or expert, not {mode}",
                    opts.groups
                )));
            }
            let (devices, layer_device) = match mode {
                SplitMode::Layer => (
                    devices,
                    layer_devices(n_layer, &opts.ratios, devices.len())?,
                ),
                _ => (&devices[..1], vec![0; n_layer]),
            };
            let mut s = Self::on_devices_with_progress(
                model,
                devices,
                &layer_device,
                sched_opts,
                progress,
            )?;
            s.mode = mode;
            return Ok(s);
        }
        let metas = group_metas(model, devices, opts)?;
        let group_ratios: Vec<f32> = if opts.ratios.is_empty() || opts.comm.is_some() {
            Vec::new()
        } else {
            let per = devices.len() / metas.len();
            opts.ratios.chunks(per).map(|c| c.iter().sum()).collect()
        };
        let layer_device = layer_devices(n_layer, &group_ratios, metas.len())?;
        Self::build(model, metas, &layer_device, sched_opts, mode, progress)
    }

    #[cfg(test)]
    /// The model on plain devices: block `i` on `devices[layer_device[i]]` (see
    /// [`LlamaModel::param_devices`]), with a scheduler over the same devices; the split mode
    /// reads `layer` when more than one device holds layers, else `none`.
    ///
    /// # Errors
    /// As [`LlamaModel::alloc_weights`] and [`Scheduler::new`].
    pub(crate) fn on_devices(
        model: &LlamaModel,
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
        opts: SchedOptions,
    ) -> Result<Session> {
        Self::on_devices_with_progress(model, devices, layer_device, opts, |_, _| {})
    }

    /// [`Session::on_devices`], calling `progress(done, total)` after each uploaded tensor.
    ///
    /// # Errors
    /// As [`Session::on_devices`].
    pub(crate) fn on_devices_with_progress(
        model: &LlamaModel,
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
        opts: SchedOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<Session> {
        let layered = layer_device
            .iter()
            .any(|&d| Some(&d) != layer_device.first());
        let mode = if layered {
            SplitMode::Layer
        } else {
            SplitMode::None
        };
        let devices: Vec<Arc<dyn Device>> = devices.to_vec();
        let mut s = Self::load(model, devices, Vec::new(), layer_device, opts, progress)?;
        s.mode = mode;
        Ok(s)
    }

    #[cfg(test)]
    /// The whole model split tensor-parallel by `meta` (whose policy is the model's,
    /// [`LlamaModel::meta_device_with`]), with `threads` in all, divided among its CPU devices
    /// (`None`: each device's default). Reports split mode `tensor`.
    ///
    /// # Errors
    /// As [`Session::open`].
    pub(crate) fn on_meta(
        model: &LlamaModel,
        meta: MetaDevice,
        threads: Option<usize>,
    ) -> Result<Session> {
        let opts = SchedOptions {
            n_threads: threads,
            ..SchedOptions::default()
        };
        let layer_device = vec![0; model.config().n_layer];
        Self::build(
            model,
            vec![meta],
            &layer_device,
            opts,
            SplitMode::Tensor,
            |_, _| {},
        )
    }

    /// The model over tensor-parallel groups: block `i` on `metas[layer_device[i]]`.
    fn build(
        model: &LlamaModel,
        metas: Vec<MetaDevice>,
        layer_device: &[usize],
        opts: SchedOptions,
        mode: SplitMode,
        progress: impl FnMut(usize, usize),
    ) -> Result<Session> {
        let devices: Vec<Arc<dyn Device>> = metas
            .iter()
            .map(|m| Arc::new(m.clone()) as Arc<dyn Device>)
            .collect();
        let groups = metas
            .into_iter()
            .enumerate()
            .map(|(device, meta)| Group { device, meta })
            .collect();
        let mut s = Self::load(model, devices, groups, layer_device, opts, progress)?;
        s.mode = mode;
        Ok(s)
    }

    fn load(
        model: &LlamaModel,
        devices: Vec<Arc<dyn Device>>,
        groups: Vec<Group>,
        layer_device: &[usize],
        opts: SchedOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<Session> {
        let output_on_group = layer_device
            .last()
            .is_some_and(|d| groups.iter().any(|g| g.device == *d));
        let model = if output_on_group {
            model.untie_output()?
        } else {
            model.clone()
        };
        let (buffers, weights) =
            model.alloc_weights_with_progress(&devices, layer_device, progress)?;
        let sched = Scheduler::new(&devices, opts)?;
        let cache_home = model
            .param_devices(&devices, layer_device)?
            .into_iter()
            .filter(|&(id, _)| model.is_cache(id))
            .collect();
        let n_ctx = model.config().n_ctx;
        Ok(Session {
            model,
            mode: SplitMode::None,
            sched,
            groups,
            cache_home,
            weights,
            buffers,
            cells: KvCells::new(n_ctx, MAX_SEQUENCES),
            evaluated: 0,
            planned: None,
            read_buf: Vec::new(),
            plans: 0,
            check_finite: false,
        })
    }

    /// The split mode it was opened with.
    pub fn split_mode(&self) -> SplitMode {
        self.mode
    }

    /// The model as loaded (with an untied output where a tensor-parallel group holds it).
    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// The scheduler's devices: the plain devices, or one meta device per tensor-parallel
    /// group.
    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.sched.devices()
    }

    /// The weight and cache buffers: per device that holds parameters, its weights, then its
    /// caches.
    pub fn buffers(&self) -> &[TensorBuffer] {
        &self.buffers
    }

    /// Positions sequence 0 holds (the next token of a single-sequence session goes there).
    pub fn n_past(&self) -> usize {
        self.cells.next_pos(0)
    }

    /// Forgets every evaluated token of every sequence. The caches are not cleared: a step only
    /// reads rows its sequence wrote.
    pub fn reset(&mut self) {
        self.cells.clear();
    }

    /// Forgets every position of sequence 0 from `n_past` on, keeping the first `n_past`: the
    /// next token is evaluated at position `n_past`, seeing only those before it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `n_past` exceeds [`Session::n_past`] (nothing is changed).
    pub fn truncate(&mut self, n_past: usize) -> Result<()> {
        let held = self.n_past();
        if n_past > held {
            return Err(Error::InvalidArgument(format!(
                "truncate to {n_past} positions: the cache holds only {held}"
            )));
        }
        self.cells.remove(Some(0), n_past, usize::MAX);
        Ok(())
    }

    /// Removes positions `p0..p1` of sequence `seq` (every sequence for `None`; `usize::MAX`
    /// for "to the end"), as llama.cpp's `llama_memory_seq_rm`: the cells no sequence holds any
    /// more serve later tokens. A sequence continues after the last position it still holds.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown sequence id (nothing is changed).
    pub fn seq_remove(&mut self, seq: Option<SeqId>, p0: usize, p1: usize) -> Result<()> {
        if let Some(q) = seq {
            self.cells.check_seq(q)?;
        }
        self.cells.remove(seq, p0, p1);
        Ok(())
    }

    /// Makes sequence `dst` share positions `p0..p1` of `src` (`llama_memory_seq_cp`): a forked
    /// prefix that is read, never evaluated or copied again. `dst` must hold no position in the
    /// range yet.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown sequence id, or `dst` already holding positions
    /// that would overlap (nothing is changed).
    pub fn seq_copy(&mut self, src: SeqId, dst: SeqId, p0: usize, p1: usize) -> Result<()> {
        self.cells.check_seq(src)?;
        self.cells.check_seq(dst)?;
        if src == dst {
            return Ok(());
        }
        if self
            .cells
            .positions(dst)
            .iter()
            .any(|p| (p0..p1).contains(p))
        {
            return Err(Error::InvalidArgument(format!(
                "copy sequence {src} to {dst}: {dst} already holds positions in {p0}..{p1} \
                 (remove them first)"
            )));
        }
        self.cells.copy(src, dst, p0, p1);
        Ok(())
    }

    /// Removes every sequence but `seq` (`llama_memory_seq_keep`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown sequence id (nothing is changed).
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<()> {
        self.cells.check_seq(seq)?;
        self.cells.keep(seq);
        Ok(())
    }

    /// The position after the last one sequence `seq` holds: where its next token goes (0 for
    /// a sequence holding nothing).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown sequence id.
    pub fn seq_next_pos(&self, seq: SeqId) -> Result<usize> {
        self.cells.check_seq(seq)?;
        Ok(self.cells.next_pos(seq))
    }

    /// Sequences holding at least one position, lowest id first.
    pub fn sequences(&self) -> Vec<SeqId> {
        self.cells.sequences()
    }

    /// Sequence ids the session accepts: `0..max_sequences`.
    pub fn max_sequences(&self) -> usize {
        self.cells.max_sequences()
    }

    /// Cache cells in use by any sequence, of `n_ctx`.
    pub fn cells_used(&self) -> usize {
        self.cells.used()
    }

    /// Tokens evaluated since the session opened, over every sequence (a prefix shared with
    /// [`Session::seq_copy`] counts once).
    pub fn tokens_evaluated(&self) -> u64 {
        self.evaluated
    }

    /// Bytes of the KV caches on each device, by device name in the order the devices hold
    /// them (a tensor-parallel group's devices each hold their shard; a mirrored cache counts
    /// on every device that keeps a copy).
    pub fn cache_bytes_per_device(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = Vec::new();
        let mut add = |name: String, n: usize| match out.iter_mut().find(|e| e.0 == name) {
            Some(e) => e.1 += n,
            None => out.push((name, n)),
        };
        let devices = self.sched.devices();
        for &(id, dev) in &self.cache_home {
            let nbytes = self.model.context().tensors()[id.index()].nbytes();
            let Some(g) = self.groups.iter().find(|g| g.device == dev) else {
                add(devices[dev].name().to_string(), nbytes);
                continue;
            };
            let spread = self.buffers.iter().find_map(|b| {
                let slot = b.bindings().slot(id)?;
                g.meta
                    .owns_buffer(b.buffer().as_ref())
                    .then(|| b.buffer().spread_at(slot.offset))
                    .flatten()
            });
            match spread {
                Some(s) => {
                    for (d, &n) in g.meta.devices().iter().zip(&s.held) {
                        add(d.name().to_string(), n);
                    }
                }
                None => add(devices[dev].name().to_string(), nbytes),
            }
        }
        out
    }

    /// With `on`, every step runs with every node kept ([`tessera::Graph::with_all_outputs`])
    /// and checked in execution order, and fails with [`Error::Compute`] naming the first op
    /// whose value holds a NaN or infinity, before any logits are returned. This also catches
    /// a NaN that never reaches the logits (quantizing activations to Q8_0 turns NaN into 0).
    /// It costs the memory of every intermediate and a read of each; off by default.
    pub fn set_check_finite(&mut self, on: bool) {
        if on != self.check_finite {
            self.planned = None;
        }
        self.check_finite = on;
    }

    /// Every position's logits, `n_vocab` per token; the caches then hold `tokens` too.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `tokens` is empty, does not fit the context, or holds a token
    /// outside the vocabulary; scheduler and device errors naming the device.
    pub fn eval(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::All)
    }

    /// The last token's `n_vocab` logits; the output norm and projection run for that position
    /// alone.
    ///
    /// # Errors
    /// As [`Session::eval`].
    pub fn eval_last(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::Last)
    }

    /// The logits of the positions `outputs` names, `n_vocab` per position; the caches then hold
    /// every token.
    ///
    /// # Errors
    /// As [`Session::eval`].
    pub fn eval_outputs(&mut self, tokens: &[i32], outputs: Outputs) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.eval_outputs_into(tokens, outputs, &mut logits)?;
        Ok(logits)
    }

    /// [`Session::eval_outputs`] into `logits` (resized; its allocation is reused, so a warm
    /// decode loop reuses the logits' memory).
    ///
    /// # Errors
    /// As [`Session::eval`].
    pub fn eval_outputs_into(
        &mut self,
        tokens: &[i32],
        outputs: Outputs,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        let t = tokens.len();
        let first_out = match outputs {
            Outputs::All => 0,
            Outputs::Last => t - 1,
            Outputs::Selected(n) if (1..=t).contains(&n) => t - n,
            Outputs::Selected(n) => {
                return Err(Error::InvalidArgument(format!(
                    "{n} output rows of a step of {t} tokens"
                )));
            }
        };
        let mut batch = Batch::new();
        let p0 = self.n_past();
        for (i, &tok) in tokens.iter().enumerate() {
            batch.add(tok, p0 + i, 0, i >= first_out);
        }
        let mut out = BatchLogits {
            data: std::mem::take(logits),
            ..BatchLogits::default()
        };
        let r = self.decode_into(&batch, &mut out);
        *logits = out.data;
        r
    }

    /// Evaluates a batch of tokens of any sequences in one step (llama.cpp's `llama_decode`) and
    /// returns the logits of the tokens that asked for them. Each sequence's tokens must
    /// continue it ([`Session::seq_next_pos`]) in batch order; new sequences start at 0.
    ///
    /// ```
    /// use tessera_model::{Batch, LlamaConfig, LlamaModel, Session};
    /// # fn main() -> tessera::Result<()> {
    /// let model = LlamaModel::new(LlamaConfig::tiny(), 42)?;
    /// let mut session = Session::builder(&model).max_sequences(2).build()?;
    /// let mut batch = Batch::new();
    /// batch.add_sequence(0, 0, &[1, 2, 3]).add_sequence(1, 0, &[4, 5]);
    /// let logits = session.decode(&batch)?;
    /// let (next0, next1) = (logits.get(2).unwrap(), logits.get(4).unwrap());
    /// # let _ = (next0, next1); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty batch, an unknown sequence id, a position that
    /// does not continue its sequence, more tokens than free cache cells, or a token outside the
    /// vocabulary; scheduler and device errors naming the device. On any error the cache
    /// holds what it held before.
    pub fn decode(&mut self, batch: &Batch) -> Result<BatchLogits> {
        let mut out = BatchLogits::default();
        self.decode_into(batch, &mut out)?;
        Ok(out)
    }

    /// [`Session::decode`] into `out` (its allocation is reused).
    ///
    /// # Errors
    /// As [`Session::decode`].
    pub fn decode_into(&mut self, batch: &Batch, out: &mut BatchLogits) -> Result<()> {
        self.cells.check(batch)?;
        let placed = self.cells.place(batch);
        let r = self.run_placed(batch, &placed.cells, out);
        if r.is_err() {
            self.cells.undo(&placed);
        } else {
            self.evaluated += batch.len() as u64;
        }
        r
    }

    fn run_placed(&mut self, batch: &Batch, rows: &[usize], out: &mut BatchLogits) -> Result<()> {
        let t = batch.len();
        let toks = batch.tokens();
        let wanted: Vec<usize> = (0..t).filter(|&i| toks[i].logits).collect();
        // The output projection runs for the rows asked for; a batch asking for none still
        // computes the last (and drops it).
        let outputs = if wanted.len() == t {
            Outputs::All
        } else if wanted.is_empty() || wanted == [t - 1] {
            Outputs::Last
        } else {
            Outputs::Selected(wanted.len())
        };
        let n_kv = self.model.kv_span(self.cells.extent());
        let reusable = self
            .planned
            .as_ref()
            .is_some_and(|(o, step)| *o == outputs && step.n_tokens == t && step.n_kv == n_kv);
        if !reusable {
            let mut ctx = self.model.context().clone();
            let mut step = self.model.build_span(&mut ctx, t, n_kv, outputs)?;
            if self.check_finite {
                step.graph = step.graph.with_all_outputs();
            }
            // A failed plan must not leave a stale step marked as planned.
            self.planned = None;
            self.sched.alloc_graph(&step.graph, &self.weights)?;
            self.planned = Some((outputs, step));
            self.plans += 1;
        }
        let Some((_, step)) = self.planned.as_ref() else {
            return Err(Error::InvalidArgument("no step graph planned".into()));
        };
        let tokens: Vec<i32> = toks.iter().map(|b| b.token).collect();
        let positions: Vec<usize> = toks.iter().map(|b| b.pos).collect();
        let cells = &self.cells;
        let inputs =
            self.model
                .batch_inputs(step, &tokens, &positions, rows, &wanted, |i, j, w| {
                    cells.visible(j, toks[i].seq, toks[i].pos, w)
                })?;
        for (id, bytes) in &inputs {
            self.sched.set_input(*id, bytes)?;
        }
        self.sched.compute()?;
        self.sched.synchronize()?;
        if self.check_finite {
            let sched = &self.sched;
            let found = super::finite::first_non_finite_node(&step.graph, |id, t| {
                let mut buf = vec![0u8; t.nbytes()];
                sched.get(id, &mut buf)?;
                Ok(buf)
            })?;
            if let Some(found) = found {
                let devices: Vec<String> = sched
                    .devices()
                    .iter()
                    .map(|d| d.name().to_string())
                    .collect();
                return Err(super::finite::non_finite_error(
                    devices.join(","),
                    &step.graph,
                    &found,
                    t,
                    positions[0],
                ));
            }
        }
        let n = step.graph.tensors()[step.logits.index()].nbytes();
        // Logits are little-endian f32: read straight into the vector where the host agrees
        // (a batch of 8 over a 262144-token vocabulary is 8 MiB a step).
        if cfg!(target_endian = "little") {
            out.data.resize(n / 4, 0.0);
            self.sched
                .get(step.logits, bytemuck::cast_slice_mut(&mut out.data))?;
        } else {
            self.read_buf.resize(n, 0);
            self.sched.get(step.logits, &mut self.read_buf)?;
            super::f32s_into(&self.read_buf, &mut out.data);
        }
        let n_vocab = self.model.config().n_vocab;
        out.n_vocab = n_vocab;
        out.rows.clear();
        out.rows.resize(t, None);
        if wanted.is_empty() {
            out.data.clear();
        }
        for (r, &i) in wanted.iter().enumerate() {
            out.rows[i] = Some(r);
        }
        Ok(())
    }

    /// The stream of the scheduler's device `device` (in [`Session::devices`] order), for its
    /// reports through [`tessera::Backend::as_any`] (a GPU stream's programs, a meta stream's
    /// all-reduces).
    pub fn backend(&self, device: usize) -> Option<&dyn tessera::Backend> {
        self.sched.backend(device)
    }

    /// Compute buffers the scheduler has allocated so far (a re-run of a planned shape adds
    /// none).
    pub fn scheduler_allocations(&self) -> usize {
        self.sched.allocation_count()
    }

    /// Step graphs built and planned so far: decoding plans once per [`crate::KV_PAD`] tokens,
    /// not once per token.
    pub fn plans(&self) -> usize {
        self.plans
    }

    /// Compute-memory figures of an `n_tokens` prompt graph with `outputs` planned into one buffer
    /// of the first device's type: the planned peak, the sum of all intermediate tensors, and the
    /// liveness lower bound (what a perfect allocator would need).
    ///
    /// # Errors
    /// As [`LlamaModel::build_step`] and [`tessera::alloc::plan`].
    pub fn plan_stats(
        &self,
        n_tokens: usize,
        outputs: Outputs,
    ) -> Result<tessera::alloc::PlanStats> {
        let step = self.model.build_step(n_tokens, 0, outputs)?;
        let buft = self.sched.devices()[0].buffer_type();
        Ok(
            tessera::alloc::plan(&step.graph, &self.weights, buft.alignment(), &|t| {
                buft.alloc_size(t)
            })?
            .stats,
        )
    }

    /// Bytes of compute memory the scheduler planned per device for the last graph (for a meta
    /// device: what its parts deliver to other devices; its own devices' compute memory is in
    /// [`crate::TensorParallel::compute_bytes`]).
    pub fn compute_bytes(&self) -> Vec<usize> {
        self.sched.compute_bytes()
    }

    /// The first tensor-parallel group (the only one unless opened with
    /// `groups` of [`crate::Split::Tensor`]), for `tensor` and `expert`: its meta device, stream,
    /// all-reduces and memory per device.
    pub fn tensor_parallel(&self) -> Option<crate::TensorParallel<'_>> {
        self.tensor_parallel_groups().into_iter().next()
    }

    /// Every tensor-parallel group, in layer order.
    pub fn tensor_parallel_groups(&self) -> Vec<crate::TensorParallel<'_>> {
        self.groups
            .iter()
            .filter_map(|g| {
                let report = self.sched.backend(g.device)?.split_report()?;
                Some(crate::TensorParallel::new(g, report, &self.buffers))
            })
            .collect()
    }
}

/// The meta devices of `opts.groups` consecutive groups of `devices` (one spanning every rank of
/// `opts.comm` in a distributed job), each splitting the model's weights by its ratios.
fn group_metas(
    model: &LlamaModel,
    devices: &[Arc<dyn Device>],
    opts: &SessionOptions,
) -> Result<Vec<MetaDevice>> {
    let mode = opts.split_mode;
    let g = opts.groups;
    if let Some(comm) = &opts.comm {
        if g != 1 {
            return Err(Error::InvalidArgument(format!(
                "a distributed job is one tensor-parallel group over every rank, not {g}"
            )));
        }
        return Ok(vec![model.distributed_meta_device(
            devices,
            comm.clone(),
            &opts.ratios,
            mode.expert_split(),
        )?]);
    }
    if g == 0 || !devices.len().is_multiple_of(g) {
        return Err(Error::InvalidArgument(format!(
            "{} devices do not form {g} tensor-parallel groups of equal size",
            devices.len()
        )));
    }
    if !opts.ratios.is_empty() && opts.ratios.len() != devices.len() {
        return Err(Error::InvalidArgument(format!(
            "{} split ratios for {} devices",
            opts.ratios.len(),
            devices.len()
        )));
    }
    let per = devices.len() / g;
    (0..g)
        .map(|k| {
            let ratios = opts.ratios.get(k * per..(k + 1) * per).unwrap_or(&[]);
            model.meta_device_with(
                &devices[k * per..(k + 1) * per],
                ratios,
                mode.expert_split(),
            )
        })
        .collect()
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("split_mode", &self.mode)
            .field("devices", &self.sched)
            .field("cells_used", &self.cells.used())
            .finish()
    }
}

#[cfg(test)]
impl Session {
    /// The tensor-parallel report of a session the test opened on a meta device.
    pub(crate) fn tp(&self) -> crate::TensorParallel<'_> {
        self.tensor_parallel()
            .expect("the test opened this session on a meta device")
    }
}
