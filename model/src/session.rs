//! [`LlamaSession`]: a [`LlamaModel`] loaded on devices with a [`Scheduler`], evaluated step by
//! step through its KV caches.

use super::llama::{LlamaModel, Outputs, Step};
use std::sync::Arc;
use tessera::sched::{SchedOptions, Scheduler};
use tessera::{Bindings, Device, Error, Result, TensorBuffer};

/// A model's weights on devices plus a scheduler, and how many cache rows are filled.
pub struct LlamaSession<'m> {
    model: &'m LlamaModel,
    sched: Scheduler,
    weights: Bindings,
    buffers: Vec<TensorBuffer>,
    n_past: usize,
    /// The step graph the scheduler planned last: reused while it fits (decode steps within one
    /// [`crate::KV_PAD`] span), so a token costs no graph build, plan or allocation.
    planned: Option<(Outputs, Step)>,
    /// Logit bytes read back, reused across steps.
    read_buf: Vec<u8>,
    plans: usize,
    /// Non-finite logits are an error naming the first op producing one
    /// ([`LlamaSession::set_check_finite`]).
    check_finite: bool,
}

impl<'m> LlamaSession<'m> {
    /// Allocates and uploads `model`'s weights over `devices` (block `i` on
    /// `devices[layer_device[i]]`, see [`LlamaModel::param_devices`]) and makes a scheduler over
    /// the same devices.
    ///
    /// # Errors
    /// As [`LlamaModel::alloc_weights`] and [`Scheduler::new`].
    pub fn new(
        model: &'m LlamaModel,
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
        opts: SchedOptions,
    ) -> Result<LlamaSession<'m>> {
        Self::with_progress(model, devices, layer_device, opts, |_, _| {})
    }

    /// [`LlamaSession::new`], calling `progress(done, total)` after each uploaded tensor.
    ///
    /// # Errors
    /// As [`LlamaSession::new`].
    pub fn with_progress(
        model: &'m LlamaModel,
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
        opts: SchedOptions,
        progress: impl FnMut(usize, usize),
    ) -> Result<LlamaSession<'m>> {
        let (buffers, weights) =
            model.alloc_weights_with_progress(devices, layer_device, progress)?;
        let sched = Scheduler::new(devices, opts)?;
        Ok(LlamaSession {
            model,
            sched,
            weights,
            buffers,
            n_past: 0,
            planned: None,
            read_buf: Vec::new(),
            plans: 0,
            check_finite: false,
        })
    }

    /// The model.
    pub fn model(&self) -> &LlamaModel {
        self.model
    }

    /// The weight buffers, one per device that holds parameters.
    pub fn buffers(&self) -> &[TensorBuffer] {
        &self.buffers
    }

    /// Cache rows filled so far.
    pub fn n_past(&self) -> usize {
        self.n_past
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

    /// Starts a new sequence. The caches are not cleared: a step only reads rows it or an earlier
    /// step of the sequence wrote.
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Evaluates `tokens` after the cached ones in one graph and returns their logits,
    /// `n_vocab` per token; the caches then hold `tokens` too.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `tokens` is empty, does not fit the context, or holds a token
    /// outside the vocabulary; scheduler and device errors.
    pub fn eval(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::All)
    }

    /// [`LlamaSession::eval`] returning only the last token's `n_vocab` logits; the output norm
    /// and projection run for that position alone.
    ///
    /// # Errors
    /// As [`LlamaSession::eval`].
    pub fn eval_last(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        self.eval_outputs(tokens, Outputs::Last)
    }

    /// Evaluates `tokens` and returns the logits of the positions `outputs` asks for, `n_vocab`
    /// per position; the caches then hold every token.
    ///
    /// # Errors
    /// As [`LlamaSession::eval`].
    pub fn eval_outputs(&mut self, tokens: &[i32], outputs: Outputs) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.eval_outputs_into(tokens, outputs, &mut logits)?;
        Ok(logits)
    }

    /// [`LlamaSession::eval_outputs`] into `logits` (resized; its allocation is reused, so a
    /// decode loop allocates nothing per token once warm).
    ///
    /// # Errors
    /// As [`LlamaSession::eval`].
    pub fn eval_outputs_into(
        &mut self,
        tokens: &[i32],
        outputs: Outputs,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        let reusable = self.planned.as_ref().is_some_and(|(o, step)| {
            *o == outputs && self.model.step_fits(step, tokens.len(), self.n_past)
        });
        if !reusable {
            let mut step = self.model.build_step(tokens.len(), self.n_past, outputs)?;
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
        let inputs = self.model.step_inputs(step, tokens, self.n_past)?;
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
                    tokens.len(),
                    self.n_past,
                ));
            }
        }
        let n = step.graph.tensors()[step.logits.index()].nbytes();
        self.read_buf.resize(n, 0);
        self.sched.get(step.logits, &mut self.read_buf)?;
        super::f32s_into(&self.read_buf, logits);
        self.n_past += tokens.len();
        Ok(())
    }

    /// Compute buffers the scheduler has allocated so far (a re-run of a planned shape adds
    /// none).
    pub fn scheduler_allocations(&self) -> usize {
        self.sched.allocation_count()
    }

    /// Step graphs built and planned so far: decoding plans once per
    /// [`crate::KV_PAD`] tokens, not once per token.
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

    /// Bytes of compute memory the scheduler planned per device for the last graph.
    pub fn compute_bytes(&self) -> Vec<usize> {
        self.sched.compute_bytes()
    }
}
