//! [`Session`]: one way to run a model in any split mode, chosen when it is opened.
//!
//! Each mode still runs on its own engine underneath: `none` and `layer` through the scheduler
//! ([`LlamaSession`]), `tensor` and `expert` through the meta device ([`TpSession`]). This type
//! is the single surface engines and the command line program against, so neither has to carry
//! the choice around.

use crate::{LlamaModel, LlamaSession, Outputs, TpSession};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use tessera::comm::DistComm;
use tessera::meta::ExpertSplit;
use tessera::sched::{SchedOptions, layer_devices};
use tessera::{BackendOptions, Device, Error, Result};

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

/// How to open a [`Session`]. `SessionOptions::default()` is the whole model on one device with
/// the devices' default thread counts.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct SessionOptions {
    /// The split mode.
    pub split_mode: SplitMode,
    /// One ratio per device for `layer`, `tensor` and `expert` (empty: even).
    pub ratios: Vec<f32>,
    /// Worker threads per device stream (`None`: each device's default).
    pub threads: Option<usize>,
    /// The processes of a distributed job (`tensor` and `expert` only): every rank opens its
    /// session with its own devices and the same model, and the meta device spans all ranks.
    pub comm: Option<Arc<dyn DistComm>>,
}

impl fmt::Debug for SessionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionOptions")
            .field("split_mode", &self.split_mode)
            .field("ratios", &self.ratios)
            .field("threads", &self.threads)
            .field("comm", &self.comm.as_ref().map(|c| (c.rank(), c.size())))
            .finish()
    }
}

impl SessionOptions {
    /// Options for `mode` with even ratios and default threads.
    pub fn new(split_mode: SplitMode) -> SessionOptions {
        SessionOptions {
            split_mode,
            ..SessionOptions::default()
        }
    }

    /// These options with `ratios`.
    pub fn with_ratios(mut self, ratios: &[f32]) -> SessionOptions {
        self.ratios = ratios.to_vec();
        self
    }

    /// These options with `threads` per device stream.
    pub fn with_threads(mut self, threads: Option<usize>) -> SessionOptions {
        self.threads = threads;
        self
    }

    /// These options across the ranks of `comm`.
    pub fn with_comm(mut self, comm: Option<Arc<dyn DistComm>>) -> SessionOptions {
        self.comm = comm;
        self
    }
}

enum Engine<'m> {
    Sched(Box<LlamaSession<'m>>),
    Tp(Box<TpSession<'m>>),
}

/// A model loaded on devices in one split mode, evaluating tokens against its KV cache.
///
/// ```no_run
/// use tessera_model::{LlamaConfig, LlamaModel, Session, SessionOptions, SplitMode};
/// # fn main() -> tessera::Result<()> {
/// let model = LlamaModel::new(LlamaConfig::tiny(), 42)?;
/// let devices = tessera::registry().select("cpu:2")?;
/// let opts = SessionOptions::new(SplitMode::Tensor).with_ratios(&[3.0, 1.0]);
/// let mut session = Session::open(&model, &devices, &opts)?;
/// let logits = session.eval_last(&[1, 2, 3])?; // n_vocab logits of the last token
/// let next = tessera_model::argmax(&logits) as i32;
/// let logits = session.eval_last(&[next])?;
/// # let _ = logits; Ok(()) }
/// ```
pub struct Session<'m> {
    engine: Engine<'m>,
    mode: SplitMode,
}

impl<'m> Session<'m> {
    /// Loads `model` on `devices` as `opts` says: `none` uses the first device, `layer` assigns
    /// consecutive layers by the ratios, `tensor` and `expert` split every layer over all the
    /// devices (and over the ranks of `opts.comm`). `none` ignores the ratios and the devices
    /// after the first, so one set of options serves every mode.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no devices, bad ratios or a distributed job outside
    /// `tensor` and `expert`; split-policy errors naming the tensor; allocation and upload
    /// errors naming the device.
    pub fn open(
        model: &'m LlamaModel,
        devices: &[Arc<dyn Device>],
        opts: &SessionOptions,
    ) -> Result<Session<'m>> {
        Self::open_with_progress(model, devices, opts, |_, _| {})
    }

    /// [`Session::open`], calling `progress(done, total)` after each uploaded tensor.
    ///
    /// # Errors
    /// As [`Session::open`].
    pub fn open_with_progress(
        model: &'m LlamaModel,
        devices: &[Arc<dyn Device>],
        opts: &SessionOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<Session<'m>> {
        let mode = opts.split_mode;
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
        let engine = if mode.is_tensor_parallel() {
            let meta = match &opts.comm {
                Some(comm) => model.distributed_meta_device(
                    devices,
                    comm.clone(),
                    &opts.ratios,
                    mode.expert_split(),
                )?,
                None => model.meta_device_with(devices, &opts.ratios, mode.expert_split())?,
            };
            let backend_opts = match opts.threads {
                Some(t) => BackendOptions::with_threads(t),
                None => BackendOptions::default(),
            };
            Engine::Tp(Box::new(TpSession::new(
                model,
                meta,
                &backend_opts,
                progress,
            )?))
        } else {
            let n_layer = model.config().n_layer;
            let (devices, layer_device) = match mode {
                SplitMode::Layer => (
                    devices,
                    layer_devices(n_layer, &opts.ratios, devices.len())?,
                ),
                _ => (&devices[..1], vec![0; n_layer]),
            };
            let sched_opts = SchedOptions {
                n_threads: opts.threads,
                ..SchedOptions::default()
            };
            Engine::Sched(Box::new(LlamaSession::with_progress(
                model,
                devices,
                &layer_device,
                sched_opts,
                progress,
            )?))
        };
        Ok(Session { engine, mode })
    }

    /// The split mode it was opened with.
    pub fn split_mode(&self) -> SplitMode {
        self.mode
    }

    /// Cache rows filled so far.
    pub fn n_past(&self) -> usize {
        match &self.engine {
            Engine::Sched(s) => s.n_past(),
            Engine::Tp(s) => s.n_past(),
        }
    }

    /// Forgets every evaluated token (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        match &mut self.engine {
            Engine::Sched(s) => s.reset(),
            Engine::Tp(s) => s.reset(),
        }
    }

    /// With `on`, every step runs with every op checked for NaN and infinity, and an error
    /// names the first op that produced one (see [`LlamaSession::set_check_finite`]).
    pub fn set_check_finite(&mut self, on: bool) {
        match &mut self.engine {
            Engine::Sched(s) => s.set_check_finite(on),
            Engine::Tp(s) => s.set_check_finite(on),
        }
    }

    /// Every position's logits, `n_vocab` per token.
    ///
    /// # Errors
    /// Tokens out of the vocabulary, a full cache, compute errors naming the device.
    pub fn eval(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::All)
    }

    /// The last token's `n_vocab` logits, computed for that position only.
    ///
    /// # Errors
    /// As [`Session::eval`].
    pub fn eval_last(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::Last)
    }

    /// The logits of the positions `outputs` names.
    ///
    /// # Errors
    /// As [`Session::eval`].
    pub fn eval_outputs(&mut self, tokens: &[i32], outputs: Outputs) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.eval_outputs_into(tokens, outputs, &mut logits)?;
        Ok(logits)
    }

    /// [`Session::eval_outputs`] into a reused vector: a warm decode loop allocates nothing.
    ///
    /// # Errors
    /// As [`Session::eval`].
    pub fn eval_outputs_into(
        &mut self,
        tokens: &[i32],
        outputs: Outputs,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        match &mut self.engine {
            Engine::Sched(s) => s.eval_outputs_into(tokens, outputs, logits),
            Engine::Tp(s) => s.eval_outputs_into(tokens, outputs, logits),
        }
    }

    /// The scheduler's session, for `none` and `layer` (plans and per-device memory).
    pub fn layered(&self) -> Option<&LlamaSession<'m>> {
        match &self.engine {
            Engine::Sched(s) => Some(s),
            Engine::Tp(_) => None,
        }
    }

    /// The meta device's session, for `tensor` and `expert` (the split, all-reduces, memory per
    /// device).
    pub fn tensor_parallel(&self) -> Option<&TpSession<'m>> {
        match &self.engine {
            Engine::Tp(s) => Some(s),
            Engine::Sched(_) => None,
        }
    }
}

impl fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("split_mode", &self.mode)
            .field("n_past", &self.n_past())
            .finish()
    }
}
