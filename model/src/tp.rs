//! Tensor parallelism for llama-family models: the split policy and meta devices built from a
//! model ([`LlamaModel::split_policy`], [`LlamaModel::meta_device_with`]), and
//! [`TensorParallel`], the report of a [`crate::Session`]'s tensor-parallel group
//! (`--split-mode tensor`, and expert parallelism for mixture-of-experts layers,
//! `--split-mode expert`).

use super::llama::LlamaModel;
use crate::engine::Group;
use crate::{ExpertSplit, LlamaSplitPolicy};
use std::sync::Arc;
use tessera::meta::{CommPath, MetaDevice, MetaStats};
use tessera::{Buffer, Device, Result, SplitReport, TensorBuffer};

/// A tensor-parallel group of an open [`crate::Session`] ([`crate::Session::tensor_parallel`]):
/// its meta device, what its stream did (all-reduces, host fallbacks, compute memory per device)
/// and the weights and caches each of its devices holds.
#[derive(Clone)]
pub struct TensorParallel<'s> {
    meta: &'s MetaDevice,
    report: SplitReport,
    buffers: &'s [TensorBuffer],
}

impl std::fmt::Debug for TensorParallel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorParallel")
            .field("meta", &self.meta.name())
            .finish()
    }
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

impl<'s> TensorParallel<'s> {
    pub(crate) fn new(
        group: &'s Group,
        report: SplitReport,
        buffers: &'s [TensorBuffer],
    ) -> TensorParallel<'s> {
        TensorParallel {
            meta: &group.meta,
            report,
            buffers,
        }
    }

    /// The meta device.
    pub fn meta(&self) -> &'s MetaDevice {
        self.meta
    }

    /// The all-reduce path the group's stream chose when it was made.
    pub fn comm_path(&self) -> &CommPath {
        &self.report.comm_path
    }

    /// The stream's counters since it was made.
    pub fn stats(&self) -> MetaStats {
        self.report.stats
    }

    /// The last step's all-reduces, in order: each reduced node's name and its F32 element count.
    pub fn reduces(&self) -> &[(String, usize)] {
        &self.report.reduces
    }

    /// The last step's ops that ran on the host CPU instead, per device that has any:
    /// (device name, [(op name, nodes)]), e.g. `("VK0", [("SOFT_MAX", 2)])`.
    pub fn fallbacks(&self) -> &[(String, Vec<(String, usize)>)] {
        &self.report.fallbacks
    }

    /// Compute-memory bytes each device reserved for the last step (its share only).
    pub fn compute_bytes(&self) -> &[usize] {
        &self.report.compute_bytes
    }

    /// The group's buffers: its weights, then its caches.
    fn group_buffers(&self) -> impl Iterator<Item = &'s dyn Buffer> + 's {
        let meta = self.meta;
        self.buffers
            .iter()
            .map(|b| b.buffer().as_ref())
            .filter(move |b| meta.owns_buffer(*b))
    }

    /// What the group runs on and how: the meta device's [`MetaDevice::describe`] (devices,
    /// ratios, the expert split of every mixture-of-experts layer), the all-reduce path, and
    /// the all-reduces of the last step (count, and per reduced node name its F32 values),
    /// e.g. `...; all-reduce: cpu comm; last step: 4 all-reduces: ..., ffn_moe_out.0 ×64, ...`.
    pub fn describe(&self) -> String {
        let reduces = self.reduces();
        let list: Vec<String> = reduces
            .iter()
            .map(|(name, n)| format!("{name} ×{n}"))
            .collect();
        let across = self.meta.dist().map_or(String::new(), |d| {
            format!(", then {} across {} ranks", d.engine(), d.size())
        });
        let fallbacks: Vec<String> = self
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
            self.comm_path(),
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

    /// Bytes of weights and caches each device of the group holds.
    pub fn weight_bytes_per_device(&self) -> Vec<usize> {
        let mut total = vec![0usize; self.meta.devices().len()];
        for b in self.group_buffers() {
            for (t, b) in total.iter_mut().zip(b.device_bytes()) {
                *t += b;
            }
        }
        total
    }

    /// Weights stored as windows into another weight's single copy (an untied output into the
    /// embedding, see [`tessera::BufferType::with_copies`]), as (copy, original).
    pub fn shared_copies(&self) -> Vec<(String, String)> {
        self.group_buffers()
            .flat_map(|b| b.spreads())
            .filter_map(|s| Some((s.tensor, s.window_of?)))
            .collect()
    }
}
