//! [`LlamaSession`]: a [`LlamaModel`] loaded on devices with a [`Scheduler`], evaluated step by
//! step through its KV caches.

use super::llama::{LlamaModel, Outputs};
use crate::sched::{SchedOptions, Scheduler};
use crate::{Bindings, Device, Error, Result, TensorBuffer};
use std::sync::Arc;

/// A model's weights on devices plus a scheduler, and how many cache rows are filled.
pub struct LlamaSession<'m> {
    model: &'m LlamaModel,
    sched: Scheduler,
    weights: Bindings,
    buffers: Vec<TensorBuffer>,
    n_past: usize,
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
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to evaluate".into()));
        }
        let step = self.model.build_step(tokens.len(), self.n_past, outputs)?;
        let inputs = self.model.step_inputs(&step, tokens, self.n_past)?;
        self.sched.alloc_graph(&step.graph, &self.weights)?;
        for (id, bytes) in &inputs {
            self.sched.set_input(*id, bytes)?;
        }
        self.sched.compute()?;
        self.sched.synchronize()?;
        let logits = self.sched.get_f32(step.logits)?;
        self.n_past += tokens.len();
        Ok(logits)
    }

    /// Compute-memory figures of an `n_tokens` prompt graph with `outputs` planned into one buffer
    /// of the first device's type: the planned peak, the sum of all intermediate tensors, and the
    /// liveness lower bound (what a perfect allocator would need).
    ///
    /// # Errors
    /// As [`LlamaModel::build_step`] and [`crate::alloc::plan`].
    pub fn plan_stats(&self, n_tokens: usize, outputs: Outputs) -> Result<crate::alloc::PlanStats> {
        let step = self.model.build_step(n_tokens, 0, outputs)?;
        let buft = self.sched.devices()[0].buffer_type();
        Ok(
            crate::alloc::plan(&step.graph, &self.weights, buft.alignment(), &|t| {
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
