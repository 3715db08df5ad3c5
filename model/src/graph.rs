//! The graph of one evaluation step of a [`LlamaModel`] and the bytes of its inputs.

use super::llama::{LlamaModel, Outputs, Step};
use tessera::{Context, DType, Error, Result, RopeParams, TensorId};

impl LlamaModel {
    /// Builds the step graph for `n_tokens` new tokens after `n_past` cached ones, on a context
    /// derived from the model's (a clone of [`LlamaModel::context`], possibly grown since).
    ///
    /// Per block: RMS norm, Q/K/V projections, RoPE on Q and K (the architecture's pairing), K and V rows written into the
    /// caches at rows `n_past..n_past+T` (SET_ROWS, converting to the caches' types), flash attention of Q over
    /// cache rows `0..n_past+T` (views of the SET_ROWS results, so attention runs after the write)
    /// with a causal mask, output projection and residual; then RMS norm and a SwiGLU feed-forward
    /// with residual. Finally RMS norm and the output projection to logits (then soft-capping,
    /// for models that have it) of the positions `outputs` asks for.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `n_tokens` is 0, `n_past + n_tokens` exceeds `n_ctx`, or `ctx`
    /// does not derive from the model's context.
    pub fn build(
        &self,
        ctx: &mut Context,
        n_tokens: usize,
        n_past: usize,
        outputs: Outputs,
    ) -> Result<Step> {
        let c = self.config();
        let filled = n_past
            .checked_add(n_tokens)
            .filter(|&n| n_tokens > 0 && n <= c.n_ctx)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a step of {n_tokens} tokens after {n_past} does not fit n_ctx {} (T must be ≥ 1)",
                    c.n_ctx
                ))
            })?;
        let mut step = self.build_span(ctx, n_tokens, self.kv_span(filled), outputs)?;
        step.n_past = n_past;
        Ok(step)
    }

    /// [`LlamaModel::build`] for `n_tokens` tokens in any cache rows, attending over cache rows
    /// `0..n_kv`: positions, rows written and mask are all inputs, so one graph serves any
    /// batch of sequences of that size and span ([`Step::n_past`] reads 0).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `n_tokens` is 0, `n_kv` is below `n_tokens` or above
    /// `n_ctx`, `outputs` selects no row or more rows than tokens, or `ctx` does not derive from
    /// the model's context.
    pub fn build_span(
        &self,
        ctx: &mut Context,
        n_tokens: usize,
        n_kv: usize,
        outputs: Outputs,
    ) -> Result<Step> {
        let c = self.config();
        if n_tokens == 0 || n_kv < n_tokens || n_kv > c.n_ctx {
            return Err(Error::InvalidArgument(format!(
                "a step of {n_tokens} tokens attending over {n_kv} cache rows does not fit n_ctx {} \
                 (T must be ≥ 1)",
                c.n_ctx
            )));
        }
        let n_outputs = match outputs {
            Outputs::All => n_tokens,
            Outputs::Last => 1,
            Outputs::Selected(n) => n,
        };
        if n_outputs == 0 || n_outputs > n_tokens {
            return Err(Error::InvalidArgument(format!(
                "{n_outputs} output rows of a step of {n_tokens} tokens"
            )));
        }
        let ours = self.context().tensors();
        let derived = ctx.len() >= ours.len()
            && ours
                .iter()
                .zip(ctx.tensors())
                .all(|(a, b)| a.name() == b.name() && a.ne() == b.ne() && a.dtype() == b.dtype());
        if !derived {
            return Err(Error::InvalidArgument(
                "build needs a clone of the model's context".into(),
            ));
        }
        let t = n_tokens;
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_head_kv);
        let eps = c.norm_eps;
        let rope = RopeParams {
            n_dims: c.n_rot,
            mode: c.arch.rope_mode(),
            freq_base: c.rope_base,
            freq_scale: c.rope_freq_scale,
        };
        let input = |ctx: &mut Context, name: &str, dtype: DType, shape: [usize; 2]| {
            let id = ctx.new_named(name, dtype, shape)?;
            ctx.set_input(id)?;
            Ok::<TensorId, Error>(id)
        };
        let tokens = input(ctx, "inp_tokens", DType::I32, [t, 1])?;
        let positions = input(ctx, "inp_pos", DType::I32, [t, 1])?;
        let kv_rows = input(ctx, "inp_kv_rows", DType::I32, [t, 1])?;
        // Only masks some layer reads are inputs; with every layer local, `mask` is windowed.
        let any_swa = (0..c.n_layer).any(|il| c.is_swa(il));
        let all_swa = (0..c.n_layer).all(|il| c.is_swa(il));
        let mask_name = if all_swa { "kq_mask_swa" } else { "kq_mask" };
        let mask = input(ctx, mask_name, DType::F16, [n_kv, t])?;
        let mask_swa = if any_swa && !all_swa {
            Some(input(ctx, "kq_mask_swa", DType::F16, [n_kv, t])?)
        } else {
            None
        };

        let kv_types = self.cache_types();
        // Bytes of a token's row and of one head in it (whole blocks: `KvCacheTypes::check`).
        let row_of = |t: DType, n: usize| {
            t.row_size(n).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a {t} cache row of {n} elements is not whole blocks"
                ))
            })
        };
        let (k_row, k_head) = (row_of(kv_types.k, c.n_embd_kv())?, row_of(kv_types.k, hd)?);
        let (v_row, v_head) = (row_of(kv_types.v, c.n_embd_kv())?, row_of(kv_types.v, hd)?);
        let [rot_k, rot_v] = self.cache_rotations();
        // `x` times the n×n rotation `r` in consecutive pieces of n values (n divides each
        // head, so every piece lies in one head), in x's shape.
        let rotate = |ctx: &mut Context, x: TensorId, r: TensorId| -> Result<TensorId> {
            let n = ctx.tensor(r)?.ne()[0];
            let ne = ctx.tensor(x)?.ne();
            let x = if ctx.tensor(x)?.is_contiguous() {
                x
            } else {
                ctx.cont(x)?
            };
            // Dims above 0 stay apart, so a split by heads (dim 1 or 2) stays on its own dim.
            let pieces = ctx.reshape(x, [n, ne[0] / n, ne[1], ne[2] * ne[3]])?;
            let y = ctx.mul_mat(r, pieces)?;
            ctx.reshape(y, ne)
        };
        let kq_scale = c.kq_scale();
        let mut h = ctx.get_rows(self.tok_embd(), tokens)?;
        if c.arch.scales_embeddings() {
            h = ctx.scale(h, (c.n_embd as f32).sqrt())?;
        }
        // The rotation divisors of the global layers under YaRN (times any file factors), built
        // once for every layer that uses them.
        let yarn_factors = match (self.yarn_factors(), self.rope_freqs()) {
            (Some(y), Some(file)) => Some(ctx.mul(file, y)?),
            (y, _) => y,
        };
        for (il, l) in self.layers().iter().enumerate() {
            let swa = c.is_swa(il);
            // llama.cpp never scales the positions of sliding-window layers. YaRN scales the
            // global ones through per-pair divisors (times any file factors) and a magnitude
            // scale on Q and K, folded into the attention scale.
            // gpt-oss scales its local layers like the global ones (with their own base).
            let base = if swa { c.rope_base_swa } else { c.rope_base };
            let (rope, factors, layer_kq_scale) = if swa && !c.arch.scales_swa_rope() {
                let rope = RopeParams {
                    freq_base: base,
                    freq_scale: 1.0,
                    ..rope
                };
                (rope, self.rope_freqs(), kq_scale)
            } else if let Some(f) = yarn_factors {
                let m = c.yarn_mscale();
                let rope = RopeParams {
                    freq_base: base,
                    freq_scale: 1.0,
                    ..rope
                };
                (rope, Some(f), kq_scale * m * m)
            } else {
                let rope = RopeParams {
                    freq_base: base,
                    ..rope
                };
                (rope, self.rope_freqs(), kq_scale)
            };
            let x = ctx.rms_norm(h, eps)?;
            let x = ctx.mul(x, l.attn_norm)?;

            let proj = |ctx: &mut Context, w: TensorId, bias: Option<TensorId>| {
                let y = ctx.mul_mat(w, x)?;
                match bias {
                    Some(b) => ctx.add(y, b),
                    None => Ok(y),
                }
            };
            let [bq, bk, bv] = l.bias_qkv.map_or([None; 3], |b| b.map(Some));
            let head_norm = |ctx: &mut Context, y: TensorId, which: usize| match l.qk_norm {
                Some(w) => {
                    let y = ctx.rms_norm(y, eps)?;
                    ctx.mul(y, w[which])
                }
                None => Ok(y),
            };
            let q = proj(ctx, l.wq, bq)?;
            let q = ctx.reshape(q, [hd, nh, t])?;
            let q = head_norm(ctx, q, 0)?;
            let q = ctx.rope_ext(q, positions, factors, rope)?;
            let k = proj(ctx, l.wk, bk)?;
            let k = ctx.reshape(k, [hd, nkv, t])?;
            let k = head_norm(ctx, k, 1)?;
            let k = ctx.rope_ext(k, positions, factors, rope)?;
            // Block-type caches hold K and V rotated, as llama.cpp's (`KvCacheTypes::rotations`).
            let (q, k) = match rot_k {
                Some(r) => (rotate(ctx, q, r)?, rotate(ctx, k, r)?),
                None => (q, k),
            };
            let k = ctx.reshape(k, [hd * nkv, t])?;
            let v = proj(ctx, l.wv, bv)?;
            let v = match rot_v {
                Some(r) => rotate(ctx, v, r)?,
                None => v,
            };

            let k_all = ctx.set_rows(l.cache_k, k, kv_rows)?;
            let v_all = ctx.set_rows(l.cache_v, v, kv_rows)?;
            let k_view = ctx.view(k_all, [hd, n_kv, nkv], [k_row, k_head, k_row * n_kv], 0)?;
            let v_view = ctx.view(v_all, [hd, n_kv, nkv], [v_row, v_head, v_row * n_kv], 0)?;

            let q = ctx.permute(q, [0, 2, 1, 3])?; // [hd, T, n_head]
            let layer_mask = if swa { mask_swa.unwrap_or(mask) } else { mask };
            let attn = ctx.flash_attn_ext(
                q,
                k_view,
                v_view,
                Some(layer_mask),
                layer_kq_scale,
                0.0,
                0.0,
            )?;
            if let Some(sinks) = l.sinks {
                ctx.flash_attn_ext_add_sinks(attn, sinks)?;
            }
            // The rotation is its own inverse: the heads' outputs rotate back.
            let attn = match rot_v {
                Some(r) => rotate(ctx, attn, r)?,
                None => attn,
            };
            let attn = ctx.reshape(attn, [hd * nh, t])?;
            let mut o = ctx.mul_mat(l.wo, attn)?;
            if let Some(b) = l.bias_o {
                o = ctx.add(o, b)?;
            }
            ctx.set_name(o, format!("attn_out.{il}"))?;
            if let Some([post_attn, _]) = l.post_norms {
                o = ctx.rms_norm(o, eps)?;
                o = ctx.mul(o, post_attn)?;
            }
            h = ctx.add(h, o)?;

            let x = ctx.rms_norm(h, eps)?;
            let x = ctx.mul(x, l.ffn_norm)?;
            let mut down = if l.moe.is_some() {
                super::moe::moe_ffn(ctx, c, l, x, il)?
            } else {
                let gate = ctx.mul_mat(l.ffn_gate, x)?;
                let up = ctx.mul_mat(l.ffn_up, x)?;
                let act = ctx.glu_split(gate, up, c.arch.glu())?;
                ctx.mul_mat(l.ffn_down, act)?
            };
            if let Some([_, post_ffn]) = l.post_norms {
                down = ctx.rms_norm(down, eps)?;
                down = ctx.mul(down, post_ffn)?;
            }
            h = ctx.add(h, down)?;
            ctx.set_name(h, format!("l_out.{il}"))?;
        }
        let mut out_rows = None;
        match outputs {
            Outputs::All => {}
            Outputs::Last if t > 1 => {
                // A view rather than GET_ROWS: it needs no index input, and on the meta device a
                // view of `h` (mirrored after the last all-reduce) stays mirrored.
                let row = ctx.tensor(h)?.nb()[1];
                h = ctx.view(h, [c.n_embd, 1], [row, row, row], (t - 1) * row)?;
            }
            Outputs::Last => {}
            Outputs::Selected(n) => {
                let ids = input(ctx, "inp_out_ids", DType::I32, [n, 1])?;
                h = ctx.get_rows(h, ids)?;
                out_rows = Some(ids);
            }
        }
        let (output_norm, output) = self.output_tensors();
        let x = ctx.rms_norm(h, eps)?;
        let x = ctx.mul(x, output_norm)?;
        let mut logits = ctx.mul_mat(output, x)?;
        if c.logit_softcap > 0.0 {
            logits = ctx.scale(logits, 1.0 / c.logit_softcap)?;
            logits = ctx.unary(logits, tessera::UnaryOp::Tanh)?;
            logits = ctx.scale(logits, c.logit_softcap)?;
        }
        ctx.set_name(logits, "result_output")?;
        ctx.set_output(logits)?;
        let graph = ctx.build_forward(logits)?;
        Ok(Step {
            tokens,
            positions,
            kv_rows,
            mask,
            mask_swa,
            out_rows,
            logits,
            n_tokens,
            n_outputs,
            n_past: 0,
            n_kv,
            graph,
        })
    }

    /// Cache rows a step graph attends over when `filled` rows are valid after it: `filled`
    /// rounded up to [`crate::KV_PAD`], at most `n_ctx` (and at least `filled`).
    pub fn kv_span(&self, filled: usize) -> usize {
        filled
            .div_ceil(super::llama::KV_PAD)
            .saturating_mul(super::llama::KV_PAD)
            .min(self.config().n_ctx)
            .max(filled)
    }

    /// Whether `step` can evaluate `n_tokens` tokens after `n_past` cached ones: same token
    /// count and the same attention span.
    pub fn step_fits(&self, step: &Step, n_tokens: usize, n_past: usize) -> bool {
        step.n_tokens == n_tokens
            && n_past
                .checked_add(n_tokens)
                .is_some_and(|f| f <= self.config().n_ctx && self.kv_span(f) == step.n_kv)
    }

    /// [`LlamaModel::build`] on a fresh clone of the model's context.
    ///
    /// # Errors
    /// As [`LlamaModel::build`].
    pub fn build_step(&self, n_tokens: usize, n_past: usize, outputs: Outputs) -> Result<Step> {
        let mut ctx = self.context().clone();
        self.build(&mut ctx, n_tokens, n_past, outputs)
    }

    /// The bytes of the inputs of `step` for `tokens` after `n_past` cached tokens: token ids,
    /// positions and cache rows `n_past..n_past+T`, the causal mask (0 where key `j ≤ n_past + i`
    /// for query `i`, −∞ elsewhere, f16), and for sliding-window models the windowed mask. A step
    /// of [`Outputs::Selected`]`(n)` returns the last `n` positions.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `tokens` or `n_past` do not match the step, or a token is
    /// outside the vocabulary.
    pub fn step_inputs(
        &self,
        step: &Step,
        tokens: &[i32],
        n_past: usize,
    ) -> Result<Vec<(TensorId, Vec<u8>)>> {
        if !self.step_fits(step, tokens.len(), n_past) {
            return Err(Error::InvalidArgument(format!(
                "{} tokens after {n_past} do not fit a step of {} tokens attending over {} rows",
                tokens.len(),
                step.n_tokens,
                step.n_kv
            )));
        }
        let t = tokens.len();
        let rows: Vec<usize> = (n_past..n_past + t).collect();
        let outs: Vec<usize> = (t - step.n_outputs..t).collect();
        // Cache row j holds position j of the one sequence.
        self.batch_inputs(step, tokens, &rows, &rows, &outs, |i, j, window| {
            let p = n_past + i;
            j <= p && p - j < window
        })
    }

    /// The bytes of the inputs of `step` for a batch: token `i` is `tokens[i]` at
    /// `positions[i]`, written to cache row `rows[i]`; `outs` are the tokens whose logits the
    /// step returns (for [`Outputs::Selected`]); `visible(i, j, window)` says whether token `i`
    /// sees cache row `j` when it looks back fewer than `window` positions.
    pub(crate) fn batch_inputs(
        &self,
        step: &Step,
        tokens: &[i32],
        positions: &[usize],
        rows: &[usize],
        outs: &[usize],
        visible: impl Fn(usize, usize, usize) -> bool,
    ) -> Result<Vec<(TensorId, Vec<u8>)>> {
        let c = self.config();
        let n_vocab = c.n_vocab;
        if tokens.len() != step.n_tokens {
            return Err(Error::InvalidArgument(format!(
                "{} tokens for a step of {}",
                tokens.len(),
                step.n_tokens
            )));
        }
        let all_swa = (0..c.n_layer).all(|il| c.is_swa(il));
        if let Some(bad) = tokens
            .iter()
            .find(|&&tok| usize::try_from(tok).map_or(true, |u| u >= n_vocab))
        {
            return Err(Error::InvalidArgument(format!(
                "token {bad} is outside the vocabulary 0..{n_vocab}"
            )));
        }
        // Positions and rows are below n_ctx, which validate() keeps within i32.
        let i32_bytes = |v: &mut dyn Iterator<Item = i32>| -> Vec<u8> {
            v.flat_map(|x| x.to_le_bytes()).collect()
        };
        let as_i32 = |v: &[usize]| i32_bytes(&mut v.iter().map(|&p| p as i32));
        let n_kv = step.n_kv;
        let (zero, ninf) = (
            half::f16::from_f32(0.0).to_le_bytes(),
            half::f16::NEG_INFINITY.to_le_bytes(),
        );
        let mask_bytes = |window: usize| {
            let mut m = Vec::with_capacity(2 * n_kv * tokens.len());
            for i in 0..tokens.len() {
                for j in 0..n_kv {
                    m.extend_from_slice(if visible(i, j, window) { &zero } else { &ninf });
                }
            }
            m
        };
        let mut out = vec![
            (step.tokens, i32_bytes(&mut tokens.iter().copied())),
            (step.positions, as_i32(positions)),
            (step.kv_rows, as_i32(rows)),
            (
                step.mask,
                mask_bytes(if all_swa { c.n_swa } else { usize::MAX }),
            ),
        ];
        if let Some(m) = step.mask_swa {
            out.push((m, mask_bytes(c.n_swa)));
        }
        if let Some(ids) = step.out_rows {
            if outs.len() != step.n_outputs {
                return Err(Error::InvalidArgument(format!(
                    "{} output rows for a step of {}",
                    outs.len(),
                    step.n_outputs
                )));
            }
            out.push((ids, as_i32(outs)));
        }
        Ok(out)
    }
}
