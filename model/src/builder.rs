//! [`SessionBuilder`]: the one way to open a [`Session`], with the split typed so that options
//! a split does not use cannot be given to it.

use crate::engine::SessionOptions;
use crate::kv_cells::MAX_SEQUENCES;
use crate::{KvCacheTypes, LlamaModel, Session, SplitMode};
use std::fmt;
use std::sync::Arc;
use tessera::comm::DistComm;
use tessera::meta::MetaDevice;
use tessera::{Device, Error, Result};

/// How a session spreads the model over its devices. Each variant carries only what it uses.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Split {
    /// The whole model on the first device.
    #[default]
    None,
    /// Consecutive layers on consecutive devices, in proportion to `ratios` (one per device;
    /// empty: even).
    Layer {
        /// One ratio per device, or empty.
        ratios: Vec<f32>,
    },
    /// Every layer split over the devices (tensor parallelism through the meta device). With
    /// `groups` > 1 the devices are cut into that many equal groups, each splitting the layers
    /// it holds, and the layers are split between the groups by their summed ratios.
    Tensor {
        /// One ratio per device, or empty.
        ratios: Vec<f32>,
        /// Tensor-parallel groups (at least 1).
        groups: usize,
    },
    /// As [`Split::Tensor`], with whole experts per device in the mixture-of-experts layers
    /// where that is cheaper (expert parallelism).
    Expert {
        /// One ratio per device, or empty.
        ratios: Vec<f32>,
        /// Tensor-parallel groups (at least 1).
        groups: usize,
    },
    /// Every layer split over the devices of every process of a distributed job: each rank
    /// builds its session with its own devices and the same model.
    Distributed {
        /// The job's communicator.
        comm: Arc<dyn DistComm>,
        /// One ratio per device of every rank, in rank order, or empty.
        ratios: Vec<f32>,
        /// Whole experts per device where cheaper, as [`Split::Expert`].
        experts: bool,
    },
    /// A meta device the caller built ([`LlamaModel::meta_device_with`], a policy of its own):
    /// it brings its devices, so the builder takes none.
    Meta(MetaDevice),
}

impl Split {
    /// A layer split with even ratios.
    pub fn layer() -> Split {
        Split::Layer { ratios: Vec::new() }
    }

    /// A tensor split in one group with even ratios.
    pub fn tensor() -> Split {
        Split::Tensor {
            ratios: Vec::new(),
            groups: 1,
        }
    }

    /// An expert split in one group with even ratios.
    pub fn expert() -> Split {
        Split::Expert {
            ratios: Vec::new(),
            groups: 1,
        }
    }

    /// The split a [`SplitMode`] names (as `--split-mode` does) with `ratios` and, for tensor
    /// and expert, `groups`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for ratios with `none`, or groups other than 1 outside
    /// tensor and expert.
    pub fn from_mode(mode: SplitMode, ratios: &[f32], groups: usize) -> Result<Split> {
        let ratios = ratios.to_vec();
        if groups != 1 && !mode.is_tensor_parallel() {
            return Err(Error::InvalidArgument(format!(
                "{groups} tensor-parallel groups need split mode tensor or expert, not {mode}"
            )));
        }
        Ok(match mode {
            SplitMode::None if !ratios.is_empty() => {
                return Err(Error::InvalidArgument(
                    "split mode none puts the model on one device: it takes no ratios".into(),
                ));
            }
            SplitMode::Layer => Split::Layer { ratios },
            SplitMode::Tensor => Split::Tensor { ratios, groups },
            SplitMode::Expert => Split::Expert { ratios, groups },
            _ => Split::None,
        })
    }

    /// The split's [`SplitMode`] (a distributed split reads `tensor` or `expert`).
    pub fn mode(&self) -> SplitMode {
        match self {
            Split::None => SplitMode::None,
            Split::Layer { .. } => SplitMode::Layer,
            Split::Tensor { .. } | Split::Meta(_) => SplitMode::Tensor,
            Split::Expert { .. } => SplitMode::Expert,
            Split::Distributed { experts, .. } => {
                if *experts {
                    SplitMode::Expert
                } else {
                    SplitMode::Tensor
                }
            }
        }
    }
}

impl fmt::Debug for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Split::None => f.write_str("None"),
            Split::Layer { ratios } => f.debug_struct("Layer").field("ratios", ratios).finish(),
            Split::Tensor { ratios, groups } => f
                .debug_struct("Tensor")
                .field("ratios", ratios)
                .field("groups", groups)
                .finish(),
            Split::Expert { ratios, groups } => f
                .debug_struct("Expert")
                .field("ratios", ratios)
                .field("groups", groups)
                .finish(),
            Split::Distributed {
                comm,
                ratios,
                experts,
            } => f
                .debug_struct("Distributed")
                .field("rank", &comm.rank())
                .field("size", &comm.size())
                .field("ratios", ratios)
                .field("experts", experts)
                .finish(),
            Split::Meta(m) => f.debug_tuple("Meta").field(&m.name()).finish(),
        }
    }
}

/// Options of a [`Session`], checked together by [`SessionBuilder::build`].
///
/// ```no_run
/// use tessera_model::{KvCacheTypes, LlamaConfig, LlamaModel, Session, Split};
/// # fn main() -> tessera::Result<()> {
/// let model = LlamaModel::new(LlamaConfig::tiny(), 42)?;
/// let session = Session::builder(&model)
///     .devices(&tessera::registry().select("cpu:2")?)
///     .split(Split::Tensor { ratios: vec![3.0, 1.0], groups: 1 })
///     .threads(2)
///     .cache_types(KvCacheTypes::parse("q8_0", "q8_0")?)
///     .max_sequences(8)
///     .progress(|done, total| eprint!("\rloading {done}/{total}"))
///     .build()?;
/// # let _ = session; Ok(()) }
/// ```
pub struct SessionBuilder<'a> {
    model: &'a LlamaModel,
    devices: Option<Vec<Arc<dyn Device>>>,
    split: Split,
    threads: Option<usize>,
    n_ctx: Option<usize>,
    cache_types: Option<KvCacheTypes>,
    max_sequences: usize,
    progress: Option<Box<dyn FnMut(usize, usize) + 'a>>,
}

impl fmt::Debug for SessionBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionBuilder")
            .field(
                "devices",
                &self
                    .devices
                    .as_ref()
                    .map(|d| d.iter().map(|d| d.name().to_string()).collect::<Vec<_>>()),
            )
            .field("split", &self.split)
            .field("threads", &self.threads)
            .field("n_ctx", &self.n_ctx)
            .field("cache_types", &self.cache_types)
            .field("max_sequences", &self.max_sequences)
            .finish_non_exhaustive()
    }
}

impl<'a> SessionBuilder<'a> {
    pub(crate) fn new(model: &'a LlamaModel) -> SessionBuilder<'a> {
        SessionBuilder {
            model,
            devices: None,
            split: Split::None,
            threads: None,
            n_ctx: None,
            cache_types: None,
            max_sequences: MAX_SEQUENCES,
            progress: None,
        }
    }

    /// The devices to load on (default: the registry's `CPU`). `Split::None` uses the first.
    pub fn devices(mut self, devices: &[Arc<dyn Device>]) -> Self {
        self.devices = Some(devices.to_vec());
        self
    }

    /// How to spread the model over the devices (default: [`Split::None`]).
    pub fn split(mut self, split: Split) -> Self {
        self.split = split;
        self
    }

    /// Threads in all, divided among the CPU devices as llama.cpp's `-t` (default: each
    /// device's own, one per core it owns).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// KV cache cells shared by all sequences (default: the model's `n_ctx`).
    pub fn context(mut self, n_ctx: usize) -> Self {
        self.n_ctx = Some(n_ctx);
        self
    }

    /// Element types of the KV caches (default: the model's, F16 unless chosen there).
    pub fn cache_types(mut self, types: KvCacheTypes) -> Self {
        self.cache_types = Some(types);
        self
    }

    /// Sequence ids accepted in a [`crate::Batch`]: `0..n` (default and at most
    /// [`MAX_SEQUENCES`]; they share the cache, so the number costs no memory).
    pub fn max_sequences(mut self, n: usize) -> Self {
        self.max_sequences = n;
        self
    }

    /// Calls `progress(done, total)` after each tensor is uploaded.
    pub fn progress(mut self, progress: impl FnMut(usize, usize) + 'a) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    /// Loads the model.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 threads, a context of 0 cells, a sequence count outside
    /// `1..=MAX_SEQUENCES`, devices given with [`Split::Meta`], no devices, ratios that do not
    /// match the devices, devices that do not form the groups; split-policy errors naming the
    /// tensor; allocation and upload errors naming the device.
    pub fn build(self) -> Result<Session> {
        if self.threads == Some(0) {
            return Err(Error::InvalidArgument(
                "0 threads: a session needs at least one".into(),
            ));
        }
        let mut model = std::borrow::Cow::Borrowed(self.model);
        if let Some(n) = self.n_ctx {
            model = std::borrow::Cow::Owned(model.with_context_size(n)?);
        }
        let mut opts = SessionOptions {
            split_mode: self.split.mode(),
            threads: self.threads,
            cache_types: self.cache_types,
            max_sequences: self.max_sequences,
            ..SessionOptions::default()
        };
        let mut progress = self.progress.unwrap_or_else(|| Box::new(|_, _| {}));
        let default_devices = || -> Result<Vec<Arc<dyn Device>>> {
            let reg = tessera::registry();
            Ok(match reg.device("CPU") {
                Ok(d) => vec![d],
                Err(_) => reg.devices().into_iter().take(1).collect(),
            })
        };
        let devices = match (&self.split, self.devices) {
            (Split::Meta(_), Some(_)) => {
                return Err(Error::InvalidArgument(
                    "Split::Meta brings its own devices: do not also give .devices()".into(),
                ));
            }
            (Split::Meta(_), None) => Vec::new(),
            (_, Some(d)) => d,
            (_, None) => default_devices()?,
        };
        match self.split {
            Split::None => {}
            Split::Layer { ratios } => opts.ratios = ratios,
            Split::Tensor { ratios, groups } | Split::Expert { ratios, groups } => {
                opts.ratios = ratios;
                opts.groups = groups;
            }
            Split::Distributed { comm, ratios, .. } => {
                opts.ratios = ratios;
                opts.comm = Some(comm);
            }
            Split::Meta(meta) => {
                return Session::from_meta(&model, meta, &opts, &mut progress);
            }
        }
        Session::open_with_progress(&model, &devices, &opts, &mut progress)
    }
}
