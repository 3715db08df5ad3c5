//! [`TpSession`]: a [`LlamaModel`] split across devices by a [`MetaDevice`] (tensor
//! parallelism, `--split-mode tensor`, and expert parallelism for mixture-of-experts layers,
//! `--split-mode expert`), evaluated step by step through its split KV caches.

use super::llama::{LlamaModel, Outputs};
use std::sync::Arc;
use tessera::meta::{ExpertSplit, LlamaSplitPolicy, MetaBackend, MetaDevice};
use tessera::{Backend, BackendOptions, Bindings, Buffer, Device, Error, Result, TensorBuffer};

/// A model's weights split over the devices of a meta device, and its stream.
pub struct TpSession<'m> {
    /// The model as split: a tied output gets its own split copy ([`LlamaModel::untie_output`]).
    model: LlamaModel,
    _borrow: std::marker::PhantomData<&'m LlamaModel>,
    meta: MetaDevice,
    backend: MetaBackend,
    weights: TensorBuffer,
    caches: TensorBuffer,
    n_past: usize,
    /// The last step graph with its host input/logit buffer: reused while it fits, so decoding
    /// builds and binds one graph per [`crate::KV_PAD`] tokens.
    cached: Option<CachedStep>,
    read_buf: Vec<u8>,
    /// See [`TpSession::set_check_finite`].
    check_finite: bool,
}

/// A step graph of a [`TpSession`] and where its inputs and logits live.
struct CachedStep {
    outputs: Outputs,
    step: super::llama::Step,
    buf: Arc<dyn Buffer>,
    bindings: Bindings,
    /// Byte offsets in `buf` of the inputs, then of the logits (last).
    at: Vec<(tessera::TensorId, usize)>,
}

impl LlamaModel {
    /// The llama-family split policy for this model over `n_devices` devices, with the partner
    /// block sizes learned from the model's weights.
    pub fn split_policy(&self, n_devices: usize) -> LlamaSplitPolicy {
        let c = self.config();
        let mut p = LlamaSplitPolicy::new(
            n_devices,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.n_embd,
            c.n_ff,
            c.n_layer,
        );
        let named: Vec<(String, tessera::TensorDesc)> = self
            .params()
            .map(|(id, _)| {
                let t = &self.context().tensors()[id.index()];
                (t.name().to_string(), t.clone())
            })
            .collect();
        p.learn_partner_blocks(&named);
        p
    }

    /// A meta device over `devices` splitting this model's weights with
    /// [`LlamaModel::split_policy`], by `ratios` (empty for an even split).
    ///
    /// # Errors
    /// As [`MetaDevice::new`] and [`MetaDevice::with_ratios`].
    pub fn meta_device(&self, devices: &[Arc<dyn Device>], ratios: &[f32]) -> Result<MetaDevice> {
        self.meta_device_with(devices, ratios, ExpertSplit::Tensor)
    }

    /// [`LlamaModel::meta_device`] splitting expert stacks as `experts` says
    /// ([`ExpertSplit::Expert`]: whole experts per device where that is cheaper, the
    /// `--split-mode expert` of the CLI). Attention and dense layers split as in tensor mode.
    ///
    /// # Errors
    /// As [`LlamaModel::meta_device`].
    pub fn meta_device_with(
        &self,
        devices: &[Arc<dyn Device>],
        ratios: &[f32],
        experts: ExpertSplit,
    ) -> Result<MetaDevice> {
        let policy = self.split_policy(devices.len()).with_expert_split(experts);
        let meta = MetaDevice::new(devices, policy)?;
        if ratios.is_empty() {
            Ok(meta)
        } else {
            meta.with_ratios(ratios)
        }
    }
}

impl LlamaModel {
    /// [`LlamaModel::meta_device_with`] over the devices of every rank of `comm` (a
    /// collective: each rank calls it with its own `local` devices; `ratios` are global, one per
    /// device of every rank, in rank order). Each rank then holds and computes only its own
    /// devices' slices ([`MetaDevice::distributed`]).
    ///
    /// # Errors
    /// As [`MetaDevice::distributed`] and [`MetaDevice::with_ratios`].
    pub fn distributed_meta_device(
        &self,
        local: &[Arc<dyn Device>],
        comm: Arc<dyn tessera::comm::DistComm>,
        ratios: &[f32],
        experts: ExpertSplit,
    ) -> Result<MetaDevice> {
        // The policy adapts to the global layout it is asked about (its device count is only
        // known once the ranks have exchanged their device lists).
        let policy = self.split_policy(local.len()).with_expert_split(experts);
        let meta = MetaDevice::distributed(local, comm, policy)?;
        if ratios.is_empty() {
            Ok(meta)
        } else {
            meta.with_ratios(ratios)
        }
    }
}

impl<'m> TpSession<'m> {
    /// Splits `model`'s weights and caches over `meta`'s devices, uploads them (calling
    /// `progress(done, total)` after each tensor) and opens a stream with `opts`.
    ///
    /// # Errors
    /// Split-policy errors naming the tensor; allocation, write and stream errors.
    pub fn new(
        model: &'m LlamaModel,
        meta: MetaDevice,
        opts: &BackendOptions,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<TpSession<'m>> {
        let model = model.untie_output()?;
        let ids: Vec<_> = model.params().map(|(id, _)| id).collect();
        // Weights only feed MUL_MAT and GET_ROWS, so each device may keep its slices in its
        // faster weight layout (and devices sharing memory one copy of a mirrored weight); the
        // caches, which graphs write, are plain memory of each device.
        let is_cache = |t: &tessera::TensorDesc| {
            ids.iter().any(|&id| {
                model.is_cache(id) && model.context().tensors()[id.index()].name() == t.name()
            })
        };
        // An untied output is a copy of the embedding: where the embedding is kept once for
        // all devices, each device's vocabulary slice of the output is a window into it.
        let names =
            |id: tessera::TensorId| model.context().tensors()[id.index()].name().to_string();
        let copies: Vec<(String, String)> = ids
            .iter()
            .filter_map(|&id| model.copy_of(id).map(|of| (names(id), names(of))))
            .collect();
        let copy_refs: Vec<(&str, &str)> = copies
            .iter()
            .map(|(c, o)| (c.as_str(), o.as_str()))
            .collect();
        let weights = meta.meta_weight_buffer_type().with_copies(&copy_refs);
        let weights = (&weights as &dyn tessera::BufferType)
            .alloc_tensors_where(model.context(), |t| t.flags().param && !is_cache(t))?;
        let placement = |id: tessera::TensorId| {
            let slot = weights.bindings().slot(id)?;
            weights
                .buffer()
                .as_any()
                .downcast_ref::<tessera::meta::MetaBuffer>()?
                .placement_at(slot.offset)
                .map(|p| (p.window_of.is_some(), p.state.is_mirrored()))
        };
        let caches = meta
            .buffer_type()
            .alloc_tensors_where(model.context(), |t| t.flags().param && is_cache(t))?;
        for (i, &id) in ids.iter().enumerate() {
            if model.is_cache(id) {
                let slot = caches
                    .bindings()
                    .slot(id)
                    .ok_or_else(|| Error::NotAllocated {
                        tensor: model.context().label(id),
                    })?;
                let len = model.context().tensors()[id.index()].nbytes();
                caches.buffer().memset(slot.offset, len, 0)?;
            } else {
                match placement(id) {
                    // A window into its original, written with it.
                    Some((true, _)) => {}
                    // The same rows everywhere: in pieces, each released from the file once
                    // copied.
                    Some((false, true)) => model.upload(id, &weights)?,
                    _ => model.with_weight_bytes(id, |bytes| weights.set(id, bytes))?,
                }
            }
            progress(i + 1, ids.len());
        }
        let backend = meta.init_meta_backend(opts)?;
        Ok(TpSession {
            model,
            _borrow: std::marker::PhantomData,
            meta,
            backend,
            weights,
            caches,
            n_past: 0,
            cached: None,
            read_buf: Vec::new(),
            check_finite: false,
        })
    }

    /// The meta device.
    pub fn meta(&self) -> &MetaDevice {
        &self.meta
    }

    /// What the session runs on and how: the meta device's [`MetaDevice::describe`] (devices,
    /// ratios, the expert split of every mixture-of-experts layer), the all-reduce path, and
    /// the all-reduces of the last step (count, and per reduced node name its F32 values),
    /// e.g. `...; all-reduce: cpu comm; last step: 4 all-reduces: ..., ffn_moe_out.0 ×64, ...`.
    pub fn describe(&self) -> String {
        let reduces = self.backend.reduces();
        let list: Vec<String> = reduces
            .iter()
            .map(|(name, n)| format!("{name} ×{n}"))
            .collect();
        let across = self.meta.dist().map_or(String::new(), |d| {
            format!(", then {} across {} ranks", d.engine(), d.size())
        });
        let fallbacks: Vec<String> = self
            .backend
            .fallbacks()
            .iter()
            .map(|(dev, ops)| {
                let ops: Vec<String> = ops.iter().map(|(op, n)| format!("{op} ×{n}")).collect();
                format!("{dev}: {}", ops.join(", "))
            })
            .collect();
        format!(
            "{}; all-reduce: {}{across}; last step: {} all-reduces{}{}{}",
            self.meta.describe(),
            self.backend.comm_path(),
            reduces.len(),
            if list.is_empty() { "" } else { ": " },
            list.join(", "),
            if fallbacks.is_empty() {
                String::new()
            } else {
                format!("; on the host CPU instead: {}", fallbacks.join("; "))
            }
        )
    }

    /// How the mixture-of-experts layers split their experts, e.g. `EP layers 0-3` or
    /// `EP layers 0,2, TP layers 1` (EP: whole experts per device; TP: every expert along
    /// `n_ff_exp`); empty for a dense model.
    pub fn expert_split_summary(&self) -> String {
        let line = self.meta.policy_description();
        line.split_once("): ")
            .map_or(String::new(), |(_, l)| l.to_string())
    }

    /// The stream (all-reduce path, counters, per-device compute memory).
    pub fn backend(&self) -> &MetaBackend {
        &self.backend
    }

    /// Bytes of weights and caches each device holds.
    pub fn weight_bytes_per_device(&self) -> Vec<usize> {
        let per = |b: &TensorBuffer| {
            b.buffer()
                .as_any()
                .downcast_ref::<tessera::meta::MetaBuffer>()
                .map(|b| b.device_bytes())
                .unwrap_or_default()
        };
        let (w, c) = (per(&self.weights), per(&self.caches));
        (0..w.len().max(c.len()))
            .map(|j| w.get(j).copied().unwrap_or(0) + c.get(j).copied().unwrap_or(0))
            .collect()
    }

    /// Weights stored as windows into another weight's single copy (an untied output into the
    /// embedding, see [`tessera::meta::MetaBufferType::with_copies`]), as (copy, original).
    pub fn shared_copies(&self) -> Vec<(String, String)> {
        self.weights
            .buffer()
            .as_any()
            .downcast_ref::<tessera::meta::MetaBuffer>()
            .map(|b| {
                b.placements()
                    .iter()
                    .filter_map(|p| Some((p.desc.name().to_string(), p.window_of.clone()?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Cache rows filled so far.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Starts a new sequence (the caches are overwritten row by row).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Evaluates `tokens` after the cached ones and returns their logits, `n_vocab` per token.
    ///
    /// # Errors
    /// As [`super::LlamaSession::eval`]; split errors of the graph naming the node.
    pub fn eval(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::All)
    }

    /// [`TpSession::eval`] returning only the last token's `n_vocab` logits; the output norm and
    /// projection run for that position alone.
    ///
    /// # Errors
    /// As [`TpSession::eval`].
    pub fn eval_last(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::Last)
    }

    /// Evaluates `tokens` and returns the logits of the positions `outputs` asks for, `n_vocab`
    /// per position; the caches then hold every token.
    ///
    /// # Errors
    /// As [`TpSession::eval`].
    pub fn eval_outputs(&mut self, tokens: &[i32], outputs: Outputs) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.eval_outputs_into(tokens, outputs, &mut logits)?;
        Ok(logits)
    }

    /// [`TpSession::eval_outputs`] into `logits` (resized; its allocation is reused).
    ///
    /// # Errors
    /// As [`TpSession::eval`].
    pub fn eval_outputs_into(
        &mut self,
        tokens: &[i32],
        outputs: Outputs,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        let reusable = self.cached.as_ref().is_some_and(|c| {
            c.outputs == outputs && self.model.step_fits(&c.step, tokens.len(), self.n_past)
        });
        if !reusable {
            self.cached = None;
            self.cached = Some(self.prepare_step(tokens.len(), outputs)?);
        }
        let Some(c) = self.cached.as_ref() else {
            return Err(Error::InvalidArgument("no step graph prepared".into()));
        };
        let inputs = self.model.step_inputs(&c.step, tokens, self.n_past)?;
        for (id, bytes) in &inputs {
            let Some(&(_, off)) = c.at.iter().find(|(a, _)| a == id) else {
                return Err(Error::InvalidArgument(format!(
                    "step input {} has no place in the host buffer",
                    c.step.graph.label(*id)
                )));
            };
            c.buf.write(off, bytes)?;
        }
        self.backend.compute(&c.step.graph, &c.bindings)?;
        self.backend.synchronize()?;
        if self.check_finite {
            let backend = &self.backend;
            let found =
                super::finite::first_non_finite_node(&c.step.graph, |id, _| backend.get(id))?;
            if let Some(found) = found {
                return Err(super::finite::non_finite_error(
                    self.meta.name().to_string(),
                    &c.step.graph,
                    &found,
                    tokens.len(),
                    self.n_past,
                ));
            }
        }
        let Some(&(logits_id, logits_off)) = c.at.last() else {
            return Err(Error::InvalidArgument("the step has no logits".into()));
        };
        let n = c.step.graph.tensors()[logits_id.index()].nbytes();
        self.read_buf.resize(n, 0);
        c.buf.read(logits_off, &mut self.read_buf)?;
        super::f32s_into(&self.read_buf, logits);
        self.n_past += tokens.len();
        Ok(())
    }

    /// As [`crate::LlamaSession::set_check_finite`]: with `on`, every step runs with
    /// every node kept and gathered from the devices, and the first op producing a NaN or
    /// infinity is an error.
    pub fn set_check_finite(&mut self, on: bool) {
        if on != self.check_finite {
            self.cached = None;
        }
        self.check_finite = on;
    }

    /// Builds the step graph for `n_tokens` after the cached rows and binds its inputs and
    /// logits in one host buffer of the first device; the meta stream copies inputs to devices
    /// that cannot read it and gathers the logits into it.
    fn prepare_step(&self, n_tokens: usize, outputs: Outputs) -> Result<CachedStep> {
        let mut step = self.model.build_step(n_tokens, self.n_past, outputs)?;
        if self.check_finite {
            step.graph = step.graph.with_all_outputs();
        }
        let host = self.meta.local_devices()[0].buffer_type();
        let tensors = step.graph.tensors();
        let align = host.alignment().max(1);
        let mut ids = vec![step.tokens, step.positions, step.kv_rows, step.mask];
        ids.extend(step.mask_swa);
        ids.push(step.logits);
        let mut at = Vec::new();
        let mut size = 0usize;
        for id in ids {
            let off = size.div_ceil(align) * align;
            size = off + tensors[id.index()].nbytes();
            at.push((id, off));
        }
        let buf: Arc<dyn Buffer> = host.alloc(size)?;
        let mut bindings = Bindings::new();
        bindings.extend(self.weights.bindings());
        bindings.extend(self.caches.bindings());
        for &(id, off) in &at {
            bindings.bind(id, buf.clone(), off);
        }
        Ok(CachedStep {
            outputs,
            step,
            buf,
            bindings,
            at,
        })
    }
}
