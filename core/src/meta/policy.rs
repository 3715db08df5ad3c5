//! The llama-family split policy (meta-backend.md §8, §9, §14) for dense llama / qwen / gemma
//! models: which weights and caches are split along which axis, with what granularity and
//! rotation.
//!
//! Divergence from upstream: with MQA (`n_head_kv == 1`) the K/V projections, their biases and
//! the KV caches stay MIRRORED and Q / `attn_output` are split by whole heads (granularity
//! `lcm(head_dim, blck)`); upstream falls to `head_dim` granularity for K/V and asserts. A fused
//! `attn_qkv` cannot be split that way and is an error under MQA.

use crate::error::{Error, Result};
use crate::meta::ratio::split_lengths;
use crate::meta::split::{Segment, SplitState, slice_desc};
use crate::tensor::TensorDesc;

/// Split policy of a dense llama-family model over `n_devices` devices.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaSplitPolicy {
    /// Devices of the meta device (N ≥ 1).
    pub n_devices: usize,
    /// `-ts` ratios, one per device; empty (or all zero) for an even split.
    pub ratios: Vec<f32>,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (divides `n_head`).
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Residual width.
    pub n_embd: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Layers (rotation of the non-layer tensors is `n_layer mod N`).
    pub n_layer: usize,
    /// Quant block size of each layer's `attn_output.weight` (missing layers: 1); see
    /// [`LlamaSplitPolicy::learn_partner_blocks`].
    pub attn_output_blocks: Vec<usize>,
    /// Quant block size of each layer's `ffn_down.weight` (missing layers: 1).
    pub ffn_down_blocks: Vec<usize>,
}

/// What a tensor name refers to.
struct Parsed<'a> {
    layer: Option<usize>,
    /// The name without `blk.{i}.`; `cache_k` / `cache_v` for caches.
    base: &'a str,
}

fn parse(name: &str) -> Parsed<'_> {
    if let Some(rest) = name.strip_prefix("blk.")
        && let Some((i, base)) = rest.split_once('.')
        && let Ok(layer) = i.parse()
    {
        return Parsed {
            layer: Some(layer),
            base,
        };
    }
    for base in ["cache_k", "cache_v"] {
        if let Some(rest) = name.strip_prefix(base) {
            let digits = rest
                .strip_prefix("_l")
                .or_else(|| rest.strip_prefix('.'))
                .unwrap_or(rest);
            let digits: String = digits.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(layer) = digits.parse() {
                return Parsed {
                    layer: Some(layer),
                    base,
                };
            }
        }
    }
    Parsed {
        layer: None,
        base: name,
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: usize, b: usize) -> usize {
    if a == 0 || b == 0 {
        0
    } else {
        a / gcd(a, b) * b
    }
}

impl LlamaSplitPolicy {
    /// A policy with even ratios and unit partner block sizes.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n_devices: usize,
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        n_embd: usize,
        n_ff: usize,
        n_layer: usize,
    ) -> LlamaSplitPolicy {
        LlamaSplitPolicy {
            n_devices,
            ratios: Vec::new(),
            n_head,
            n_head_kv,
            head_dim,
            n_embd,
            n_ff,
            n_layer,
            attn_output_blocks: Vec::new(),
            ffn_down_blocks: Vec::new(),
        }
    }

    /// Records the quant block size of every layer's `attn_output.weight` and `ffn_down.weight`
    /// (the row-split partners whose blocks set the granularity of Q/K/V and of the FFN).
    pub fn learn_partner_blocks(&mut self, tensors: &[(String, TensorDesc)]) {
        for (name, desc) in tensors {
            let p = parse(name);
            let (Some(layer), blocks) = (
                p.layer,
                match p.base {
                    "attn_output.weight" => &mut self.attn_output_blocks,
                    "ffn_down.weight" => &mut self.ffn_down_blocks,
                    _ => continue,
                },
            ) else {
                continue;
            };
            if blocks.len() <= layer {
                blocks.resize(layer + 1, 1);
            }
            blocks[layer] = desc.dtype().block_size();
        }
    }

    fn err(&self, name: &str, why: impl std::fmt::Display) -> Error {
        Error::InvalidArgument(format!("split policy, tensor '{name}': {why}"))
    }

    fn block(blocks: &[usize], layer: Option<usize>) -> usize {
        layer
            .and_then(|l| blocks.get(l))
            .copied()
            .unwrap_or(1)
            .max(1)
    }

    fn lengths(&self, name: &str, ne: usize, g: usize, rot: usize) -> Result<Vec<usize>> {
        split_lengths(ne, self.n_devices, &self.ratios, g, rot)
            .map_err(|e| self.err(name, format!("{ne} elements: {e}")))
    }

    fn split(
        &self,
        name: &str,
        axis: usize,
        ne: usize,
        g: usize,
        rot: usize,
    ) -> Result<SplitState> {
        SplitState::axis_lens(axis, self.lengths(name, ne, g, rot)?)
    }

    /// The state of the tensor `name` (GGUF naming: `blk.{i}.attn_q.weight`, `output.weight`,
    /// `cache_k.{i}` / `cache_k_l{i}`) with descriptor `desc`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for inconsistent hyper-parameters, a tensor whose split length
    /// does not divide by its granularity, a row-split partner whose block size differs from the
    /// learned one, or a fused QKV under MQA.
    pub fn state_for(&self, name: &str, desc: &TensorDesc) -> Result<SplitState> {
        let n = self.n_devices;
        if n == 0
            || self.n_head_kv == 0
            || self.head_dim == 0
            || !self.n_head.is_multiple_of(self.n_head_kv)
        {
            return Err(self.err(
                name,
                format!(
                    "bad hyper-parameters: {n} devices, {} heads, {} KV heads, head_dim {}",
                    self.n_head, self.n_head_kv, self.head_dim
                ),
            ));
        }
        if n == 1 {
            return Ok(SplitState::mirrored());
        }
        let p = parse(name);
        let rot = p.layer.unwrap_or(self.n_layer) % n;
        let ne = desc.ne();
        let hd = self.head_dim;
        let mqa = self.n_head_kv == 1;
        let n_gqa = self.n_head / self.n_head_kv;
        let blck_attn = Self::block(&self.attn_output_blocks, p.layer);
        let blck_ffn = Self::block(&self.ffn_down_blocks, p.layer);
        // Granularity comes from the dtypes and the heads only (meta-backend.md §8 pads the FFN
        // to 128 and Q to 128-element blocks for kernel speed; that made widths like 704
        // unsplittable). Axis-0 pieces of a row-split partner keep its quant blocks whole: its
        // block is also the activations' quantization block (Q8_0 / Q8_K), so the split changes
        // no quantization boundary.
        let (g_q, g_kv) = if mqa {
            (lcm(hd, blck_attn), 0)
        } else {
            let g_q = lcm(n_gqa * hd, blck_attn);
            (g_q, g_q / n_gqa)
        };
        let g_f = blck_ffn;
        let check_partner = |blck: usize| {
            let own = desc.dtype().block_size();
            if own == blck {
                Ok(())
            } else {
                Err(self.err(
                    name,
                    format!(
                        "block size {own} differs from the learned {blck} \
                         (call learn_partner_blocks first)"
                    ),
                ))
            }
        };
        let m = Ok(SplitState::mirrored());
        match (p.layer.is_some(), p.base) {
            (true, "attn_q.weight") => self.split(name, 1, ne[1], g_q, rot),
            (true, "attn_q.bias") => self.split(name, 0, ne[0], g_q, rot),
            (true, "attn_k.weight" | "attn_v.weight") if !mqa => {
                self.split(name, 1, ne[1], g_kv, rot)
            }
            (true, "attn_k.bias" | "attn_v.bias") if !mqa => self.split(name, 0, ne[0], g_kv, rot),
            (true, "attn_k.weight" | "attn_v.weight" | "attn_k.bias" | "attn_v.bias") => m,
            (true, base @ ("attn_qkv.weight" | "attn_qkv.bias")) => {
                if mqa {
                    return Err(self.err(name, "a fused QKV cannot be split under MQA"));
                }
                let axis = if base == "attn_qkv.weight" { 1 } else { 0 };
                let q = self.lengths(name, self.n_head * hd, g_q, rot)?;
                let kv = self.lengths(name, self.n_head_kv * hd, g_kv, rot)?;
                let segs = vec![Segment::new(q, 1), Segment::new(kv, 2)];
                SplitState::axis(axis, segs, ne[axis]).map_err(|e| self.err(name, e))
            }
            (true, "attn_q_norm.weight" | "attn_k_norm.weight") if ne[1] == 1 => m,
            (true, "attn_q_norm.weight") => self.split(name, 1, ne[1], g_q / hd, rot),
            (true, "attn_k_norm.weight") if !mqa => self.split(name, 1, ne[1], g_kv / hd, rot),
            (true, "attn_k_norm.weight") => m,
            (true, "attn_sinks" | "attn_sinks.weight") => self.split(name, 0, ne[0], g_q / hd, rot),
            (true, "attn_output.weight") => {
                check_partner(blck_attn)?;
                self.split(name, 0, ne[0], g_q, rot)
            }
            (true, "ffn_up.weight" | "ffn_gate.weight") => self.split(name, 1, ne[1], g_f, rot),
            (true, "ffn_up.bias" | "ffn_gate.bias") => self.split(name, 0, ne[0], g_f, rot),
            (true, base @ ("ffn_gate_up.weight" | "ffn_gate_up.bias")) => {
                let axis = if base == "ffn_gate_up.weight" { 1 } else { 0 };
                let ff = self.lengths(name, self.n_ff, g_f, rot)?;
                SplitState::axis(axis, vec![Segment::new(ff, 2)], ne[axis])
                    .map_err(|e| self.err(name, e))
            }
            (true, "ffn_down.weight") => {
                check_partner(blck_ffn)?;
                self.split(name, 0, ne[0], g_f, rot)
            }
            (true, "cache_k" | "cache_v") if !mqa => self.split(name, 0, ne[0], g_kv, rot),
            (false, "output.weight") => self.split(name, 1, ne[1], 1, rot),
            (false, "output.bias") => self.split(name, 0, ne[0], 1, rot),
            // attn_output.bias, ffn_down.bias (added after the reduce), norms, token_embd,
            // MQA caches: replicated.
            _ => m,
        }
    }

    /// Bytes each device stores for `tensors` (weights and caches, all contiguous): split tensors
    /// contribute their slices, mirrored and partial ones their full size on every device.
    ///
    /// # Errors
    /// As [`LlamaSplitPolicy::state_for`] and [`slice_desc`].
    pub fn per_device_bytes(&self, tensors: &[(String, TensorDesc)]) -> Result<Vec<usize>> {
        let mut out = vec![0; self.n_devices];
        for (name, desc) in tensors {
            let state = self.state_for(name, desc)?;
            for (j, bytes) in out.iter_mut().enumerate() {
                let (ne, _) = slice_desc(desc, &state, j)?;
                *bytes += desc.dtype().row_size(ne[0]).unwrap_or(0) * ne[1] * ne[2] * ne[3];
            }
        }
        Ok(out)
    }
}
