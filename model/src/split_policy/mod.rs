//! The llama-family split policy (meta-device.md §8, §9, §14) for dense and mixture-of-experts
//! llama / qwen / gemma / gpt-oss models: which weights and caches are split along which axis,
//! with what granularity and rotation.
//!
//! Expert stacks (`ffn_{gate,up,gate_up,down}_exps`) split one of two ways per layer
//! ([`ExpertSplit`]): like llama.cpp, every expert along `n_ff_exp` (gate/up A1, their biases
//! A0, down A0), or, with expert parallelism, whole experts per device (every stack A2 along
//! `n_expert`, gate/up biases MIRRORED). Either way the down biases are PARTIAL (the value on
//! one device, zeros on the others) so that the whole block after the down MUL_MAT_ID stays
//! linear and needs one all-reduce of `n_embd·T`, and the router is MIRRORED.
//!
//! Divergence from upstream: with MQA (`n_head_kv == 1`) the K/V projections, their biases and
//! the KV caches stay MIRRORED and Q / `attn_output` are split by whole heads (granularity
//! `lcm(head_dim, blck)`); upstream falls to `head_dim` granularity for K/V and asserts. A fused
//! `attn_qkv` cannot be split that way and is an error under MQA.

use tessera::meta::{Segment, SplitLayout, SplitPolicy, SplitState, slice_desc, split_lengths};
use tessera::{Error, Result, TensorDesc};

#[cfg(test)]
mod tests_experts;
#[cfg(all(test, feature = "cpu"))]
mod tests_moe_block;
#[cfg(test)]
mod tests_propagate;

/// How the expert stacks of mixture-of-experts layers are split (`--split-mode tensor` or
/// `expert`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExpertSplit {
    /// Every expert split along its FFN width `n_ff_exp`, as llama.cpp does.
    #[default]
    Tensor,
    /// Expert parallelism: whole experts per device, by ratio, where that is cheaper for the
    /// layer (see [`LlamaSplitPolicy::experts_by_expert`]); other layers fall back to
    /// [`ExpertSplit::Tensor`].
    Expert,
}

/// Split policy of a llama-family model over `n_devices` devices.
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
    /// Quant block size of each layer's `ffn_down.weight` or `ffn_down_exps.weight` (missing
    /// layers: 1).
    pub ffn_down_blocks: Vec<usize>,
    /// How expert stacks are split.
    pub experts: ExpertSplit,
    /// `(n_expert, n_ff_exp)` of each mixture-of-experts layer (`None`: dense), learned from
    /// `ffn_down_exps.weight` by [`LlamaSplitPolicy::learn_partner_blocks`].
    pub moe_layers: Vec<Option<(usize, usize)>>,
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
            experts: ExpertSplit::Tensor,
            moe_layers: Vec::new(),
        }
    }

    /// The same policy splitting expert stacks as `experts` says.
    pub fn with_expert_split(mut self, experts: ExpertSplit) -> LlamaSplitPolicy {
        self.experts = experts;
        self
    }

    /// Records the quant block size of every layer's `attn_output.weight` and `ffn_down.weight`
    /// (the row-split partners whose blocks set the granularity of Q/K/V and of the FFN; for
    /// mixture-of-experts layers `ffn_down_exps.weight`, whose shape also gives the layer's
    /// `(n_expert, n_ff_exp)`).
    pub fn learn_partner_blocks(&mut self, tensors: &[(String, TensorDesc)]) {
        for (name, desc) in tensors {
            let p = parse(name);
            if let (Some(layer), "ffn_down_exps.weight") = (p.layer, p.base) {
                if self.moe_layers.len() <= layer {
                    self.moe_layers.resize(layer + 1, None);
                }
                self.moe_layers[layer] = Some((desc.ne()[2], desc.ne()[0]));
            }
            let (Some(layer), blocks) = (
                p.layer,
                match p.base {
                    "attn_output.weight" => &mut self.attn_output_blocks,
                    "ffn_down.weight" | "ffn_down_exps.weight" => &mut self.ffn_down_blocks,
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

    /// Whether layer `layer` (with `n_expert` experts of FFN width `n_ff_exp`, row-split
    /// partner block `blck`) splits its experts whole (expert parallelism) rather than along
    /// `n_ff_exp`. Only under [`ExpertSplit::Expert`], and only where that is no costlier: with
    /// tokens routed evenly the busiest device does the share of the expert work its split gives
    /// it, so whole experts are chosen when the busiest device's share of the experts is at most
    /// its share of `n_ff_exp` under the tensor split (ties go to experts: no row-split matmul
    /// of partial sums inside the block and whole-expert reads). With fewer experts than devices
    /// of a positive ratio (or ratios that leave a device none while the tensor split would not)
    /// the tensor split wins; a width that cannot be split by `blck` leaves experts only.
    pub fn experts_by_expert(
        &self,
        layer: Option<usize>,
        n_expert: usize,
        n_ff_exp: usize,
        blck: usize,
    ) -> bool {
        if self.experts != ExpertSplit::Expert || self.n_devices < 2 {
            return false;
        }
        let rot = layer.unwrap_or(self.n_layer) % self.n_devices;
        let busiest = |ne: usize, g: usize| -> Option<f64> {
            let lens = split_lengths(ne, self.n_devices, &self.ratios, g, rot).ok()?;
            let max = lens.iter().copied().max()?;
            Some(max as f64 / ne.max(1) as f64)
        };
        match (busiest(n_expert, 1), busiest(n_ff_exp, blck.max(1))) {
            (Some(e), Some(t)) => e <= t,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// Per mixture-of-experts layer: whether its experts are split whole
    /// ([`LlamaSplitPolicy::experts_by_expert`]), as `(layer, by_expert)`.
    pub fn expert_layers(&self) -> Vec<(usize, bool)> {
        self.moe_layers
            .iter()
            .enumerate()
            .filter_map(|(l, m)| {
                let (n_expert, n_ff_exp) = (*m)?;
                let blck = Self::block(&self.ffn_down_blocks, Some(l));
                Some((l, self.experts_by_expert(Some(l), n_expert, n_ff_exp, blck)))
            })
            .collect()
    }

    /// One line on how the expert stacks split, for `describe()` outputs: e.g.
    /// `experts: whole experts (EP) on layers 0-3` or `... along n_ff_exp (TP) on layers 0,2`;
    /// empty for a dense model.
    pub fn describe_experts(&self) -> String {
        let layers = self.expert_layers();
        if layers.is_empty() {
            return String::new();
        }
        let list = |want: bool| -> Option<String> {
            let ls: Vec<usize> = layers
                .iter()
                .filter(|(_, e)| *e == want)
                .map(|(l, _)| *l)
                .collect();
            (!ls.is_empty()).then(|| format!("{} {}", if want { "EP" } else { "TP" }, ranges(&ls)))
        };
        let parts: Vec<String> = [list(true), list(false)].into_iter().flatten().collect();
        format!(
            "experts ({} split): {}",
            match self.experts {
                ExpertSplit::Tensor => "tensor",
                ExpertSplit::Expert => "expert",
            },
            parts.join(", ")
        )
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
        // Granularity comes from the dtypes and the heads only (meta-device.md §8; upstream pads
        // the FFN to 128 and Q to 128-element blocks for kernel speed, which made widths like 704
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
            (
                true,
                base @ ("ffn_gate_exps.weight"
                | "ffn_up_exps.weight"
                | "ffn_gate_up_exps.weight"
                | "ffn_down_exps.weight"),
            ) => {
                let down = base == "ffn_down_exps.weight";
                // gate/up [n_embd, n_ff_exp (×2 fused), n_expert], down [n_ff_exp, n_embd, n_expert].
                let fused = if base == "ffn_gate_up_exps.weight" {
                    2
                } else {
                    1
                };
                let n_ff_exp = if down { ne[0] } else { ne[1] / fused };
                if self.experts_by_expert(p.layer, ne[2], n_ff_exp, g_f) {
                    return self.split(name, 2, ne[2], 1, rot);
                }
                if down {
                    check_partner(blck_ffn)?;
                    return self.split(name, 0, ne[0], g_f, rot);
                }
                let ff = self.lengths(name, n_ff_exp, g_f, rot)?;
                SplitState::axis(1, vec![Segment::new(ff, fused)], ne[1])
                    .map_err(|e| self.err(name, e))
            }
            (
                true,
                base @ ("ffn_gate_exps.bias" | "ffn_up_exps.bias" | "ffn_gate_up_exps.bias"),
            ) => {
                // [n_ff_exp (×2 fused), n_expert]: with whole experts per device the biases are
                // small and stay MIRRORED (ADD_ID of a ROUTED value reads them whole).
                let fused = if base == "ffn_gate_up_exps.bias" {
                    2
                } else {
                    1
                };
                let n_ff_exp = ne[0] / fused;
                if self.experts_by_expert(p.layer, ne[1], n_ff_exp, g_f) {
                    return m;
                }
                let ff = self.lengths(name, n_ff_exp, g_f, rot)?;
                SplitState::axis(0, vec![Segment::new(ff, fused)], ne[0])
                    .map_err(|e| self.err(name, e))
            }
            // Added to every device's partial expert outputs: the value on one device, zeros
            // on the others, so the block stays linear up to its one all-reduce.
            (true, "ffn_down_exps.bias") if desc.dtype() == tessera::DType::F32 => {
                Ok(SplitState::partial())
            }
            (true, "cache_k" | "cache_v") if !mqa => self.split(name, 0, ne[0], g_kv, rot),
            (false, "output.weight") => self.split(name, 1, ne[1], 1, rot),
            (false, "output.bias") => self.split(name, 0, ne[0], 1, rot),
            // attn_output.bias, ffn_down.bias (added after the reduce), norms, token_embd,
            // the router ffn_gate_inp (weight and bias), attention sinks of unsplit heads, MQA
            // caches: replicated.
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

/// `0-3,5,7-8`.
fn ranges(ls: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ls.len() {
        let mut j = i;
        while j + 1 < ls.len() && ls[j + 1] == ls[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", ls[i], ls[j])
        } else {
            ls[i].to_string()
        });
        i = j + 1;
    }
    format!("layers {}", out.join(","))
}

impl SplitPolicy for LlamaSplitPolicy {
    fn split_state(&self, desc: &TensorDesc, layout: &SplitLayout) -> Result<SplitState> {
        if self.n_devices == layout.n_devices && self.ratios == layout.ratios {
            return self.state_for(desc.name(), desc);
        }
        self.for_layout(layout).state_for(desc.name(), desc)
    }

    fn describe(&self, layout: &SplitLayout) -> String {
        self.for_layout(layout).describe_experts()
    }
}

impl LlamaSplitPolicy {
    /// This policy for a meta device's actual layout (a distributed one learns its device
    /// count from the ranks; ratios come with the device).
    fn for_layout(&self, layout: &SplitLayout) -> LlamaSplitPolicy {
        let mut p = self.clone();
        p.n_devices = layout.n_devices;
        p.ratios = layout.ratios.clone();
        p
    }
}
