//! Tessera's tensor split as one ggml device.
//!
//! `TESSERA_GGML_SPLIT=cpu:2` (any list Tessera's registry selects: `CPU0,CPU1`, `SYCL0,VK0`,
//! ...) adds the ggml device `TesseraMETA`: a [`MetaDevice`] over those devices that splits a
//! llama-family model by tensor name ([`LlamaSplitPolicy`], the policy of Tessera's own
//! `--split-mode tensor`) and runs every graph ggml hands it on all of them, with all-reduces.
//! `TESSERA_GGML_TENSOR_SPLIT=3,1` sets uneven shares, as llama.cpp's `--tensor-split` does.
//!
//! The policy needs the model's attention shape (head size, query and KV heads), which the
//! weights of a llama model without Q/K norms do not show but its graph does (the ROPE of
//! `Qcur` and `Kcur`). ggml allocates a buffer, places tensors in it (`init_tensor`) and writes
//! them before any graph runs, so a buffer of this device is *staged*: held whole in the first
//! device's memory while its tensors are recorded. The first graph the device runs *seals*
//! every staged buffer ggml did not mark as compute memory (weights, KV caches): the policy is
//! learned from that graph and the weights, each tensor is placed (split or mirrored), its data
//! moves into per-device slices (weights in each device's weight layout) and the staging memory
//! goes. A graph without attention (ggml's op tests) seals with every tensor mirrored.
//!
//! Compute buffers stay plain memory of the first device. Graph inputs are read from it by
//! every device (copied in where a device cannot read it); of the nodes, only those ggml may
//! read afterwards are written back to it: nodes nothing else in the graph reads, and views of
//! them. The others live in the meta device's own per-device memory only, and a later read of
//! one through ggml is an error naming it ([`MetaCtx::check_read`]), never stale bytes.

use crate::ggml::{self, Level};
use crate::objects::{BufferCtx, Lost, MetaCtx, Stage};
use crate::sys;
use parking_lot::Mutex;
use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tessera::meta::{MetaDevice, SplitLayout, SplitPolicy, SplitState};
use tessera::{BufferType, TensorDesc};
use tessera_model::LlamaSplitPolicy;

/// The environment variable naming the devices of the meta device.
pub const SPLIT_ENV: &str = "TESSERA_GGML_SPLIT";
/// The environment variable with the devices' shares (`3,1`; even when unset).
pub const RATIOS_ENV: &str = "TESSERA_GGML_TENSOR_SPLIT";
/// The meta device's name in ggml (`Tessera` + this).
pub const NAME: &str = "META";

/// The meta device `TESSERA_GGML_SPLIT` asks for; `None` when it is unset or empty.
///
/// # Errors
/// A device list the registry cannot select, or bad shares, as a message naming the variable.
pub(crate) fn from_env() -> Result<Option<MetaCtx>, String> {
    let list = std::env::var(SPLIT_ENV).unwrap_or_default();
    if list.trim().is_empty() {
        return Ok(None);
    }
    let ratios = std::env::var(RATIOS_ENV).unwrap_or_default();
    build(list.trim(), ratios.trim()).map(Some)
}

/// A meta device over the devices `list` selects, with shares `ratios` (empty: even).
pub(crate) fn build(list: &str, ratios: &str) -> Result<MetaCtx, String> {
    let devices = tessera::registry()
        .select(list)
        .map_err(|e| format!("{SPLIT_ENV}={list}: {e}"))?;
    let learned = Arc::new(Mutex::new(None));
    let mut device = MetaDevice::new(
        &devices,
        LearnedPolicy {
            learned: learned.clone(),
        },
    )
    .map_err(|e| format!("{SPLIT_ENV}={list}: {e}"))?;
    if !ratios.is_empty() {
        let r = tessera::meta::ratio::parse_ratios(ratios, devices.len())
            .map_err(|e| format!("{RATIOS_ENV}={ratios}: {e}"))?;
        device = device
            .with_ratios(&r)
            .map_err(|e| format!("{RATIOS_ENV}={ratios}: {e}"))?;
    }
    Ok(MetaCtx {
        device,
        learned,
        pending: Mutex::new(Vec::new()),
        lost: Mutex::new(Vec::new()),
        keep_all: AtomicBool::new(false),
        last_graph: Mutex::new(u64::MAX),
    })
}

/// The llama-family policy once learned; every tensor mirrored before.
struct LearnedPolicy {
    learned: Arc<Mutex<Option<LlamaSplitPolicy>>>,
}

impl SplitPolicy for LearnedPolicy {
    fn split_state(&self, desc: &TensorDesc, _: &SplitLayout) -> tessera::Result<SplitState> {
        match &*self.learned.lock() {
            // llama.cpp keeps the input embedding on its CPU backend: a `token_embd.weight` in
            // this device's memory is the copy a tied model reads as its output projection.
            Some(p) if desc.name() == "token_embd.weight" => p.state_for("output.weight", desc),
            Some(p) => p.state_for(desc.name(), desc),
            None => Ok(SplitState::mirrored()),
        }
    }

    fn describe(&self, _: &SplitLayout) -> String {
        match &*self.learned.lock() {
            Some(p) => format!(
                "llama-family policy: {} heads, {} KV heads of {}",
                p.n_head, p.n_head_kv, p.head_dim
            ),
            None => "every tensor mirrored until a model's graph is seen".into(),
        }
    }
}

impl Stage {
    fn usage(&self) -> sys::ggml_backend_buffer_usage {
        if self.ggml == 0 {
            return sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_ANY;
        }
        // SAFETY: `ggml` is the live ggml buffer whose context holds this stage.
        unsafe { (*(self.ggml as *const sys::ggml_backend_buffer)).usage }
    }
}

impl MetaCtx {
    /// Whether every node's value is written back (see [`MetaCtx::declined`]).
    pub(crate) fn keep_all(&self) -> bool {
        self.keep_all.load(Ordering::Relaxed)
    }

    /// ggml asked to run `op` here and was told no (or read a value that was not written back):
    /// its scheduler runs ops elsewhere, between parts of the graph on this device, and a later
    /// part may read an earlier part's intermediate value. From now on every node's value is
    /// written back to ggml's memory (slower: each is gathered from the devices), said once in
    /// the log.
    pub(crate) fn declined(&self, op: &str) {
        if !self.keep_all.swap(true, Ordering::Relaxed) {
            crate::objects::note_freed();
            ggml::log(
                Level::Warning,
                &format!(
                    "Tessera{NAME} cannot run {op}: ggml runs it elsewhere, so graphs may reach \
                     this device in several parts; every value computed here is now written \
                     back to ggml's memory, which is slower"
                ),
            );
        }
    }

    /// Lists a new staged buffer.
    pub(crate) fn add_pending(&self, key: usize) {
        self.pending.lock().push(key);
    }

    /// Forgets a buffer ggml frees.
    pub(crate) fn forget(&self, key: usize) {
        self.pending.lock().retain(|&k| k != key);
        self.lost.lock().retain(|l| l.buf != key);
    }

    /// Records the nodes of the graph just run (translation `id`) that were not written back;
    /// `written` are the ranges it wrote back. The same graph again (a decode loop) replaces its
    /// own entries; another part keeps what earlier parts lost, except where it wrote.
    pub(crate) fn set_lost(&self, id: u64, lost: &[Lost], written: &[(usize, usize, usize)]) {
        let mut l = self.lost.lock();
        let mut last = self.last_graph.lock();
        if *last == id {
            l.clear();
        } else {
            let overlaps =
                |x: &Lost, b: usize, s: usize, e: usize| x.buf == b && x.start < e && s < x.end;
            l.retain(|x| {
                !written.iter().any(|&(b, s, e)| overlaps(x, b, s, e))
                    && !lost.iter().any(|n| overlaps(x, n.buf, n.start, n.end))
            });
            *last = id;
        }
        l.extend_from_slice(lost);
    }

    /// ggml wrote `start..end` of buffer `buf`: whatever was lost there is replaced.
    pub(crate) fn rewritten(&self, buf: usize, start: usize, end: usize) {
        let mut l = self.lost.lock();
        if !l.is_empty() {
            l.retain(|x| x.buf != buf || x.end <= start || end <= x.start);
        }
    }

    /// An error naming the node whose value `start..end` of `buf` would hold, if the meta
    /// device did not write it back.
    /// Such a read also turns on writing every value back ([`MetaCtx::declined`]), so that the
    /// next graphs give ggml what it reads.
    pub(crate) fn check_read(&self, buf: usize, start: usize, end: usize) -> Result<(), String> {
        let label = {
            let l = self.lost.lock();
            match l
                .iter()
                .find(|x| x.buf == buf && x.start < end && start < x.end)
            {
                None => return Ok(()),
                Some(x) => x.label.clone(),
            }
        };
        self.declined(&label);
        Err(format!(
            "{label} is read after the graph that computed it on Tessera{NAME}, which kept in \
             ggml's memory only the values nothing else in that graph read (and ggml's outputs); \
             from the next graph on every value is kept"
        ))
    }
}

/// Records a tensor ggml places in a staged buffer (its `init_tensor`).
///
/// # Safety
/// `tensor` is a live tensor placed in the buffer of `ctx`.
pub(crate) unsafe fn record(ctx: &BufferCtx, tensor: *const sys::ggml_tensor) {
    let Some(stage) = &ctx.stage else {
        return;
    };
    // SAFETY: the caller's contract.
    let t = unsafe { &*tensor };
    if !t.view_src.is_null() {
        return;
    }
    let mut st = stage.lock();
    if st.usage() == sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_COMPUTE {
        // Graph memory: never sealed, nothing to record.
        return;
    }
    // SAFETY: as above.
    let name = unsafe { CStr::from_ptr(t.name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above.
    let len = unsafe { crate::layout::nbytes(t) };
    // SAFETY: as above.
    let desc = unsafe { crate::weights::describe_memory(tensor) }
        .zip(unsafe { ctx.offset_of(tensor, 0, len) }.ok());
    match desc {
        Some((desc, at)) if !st.sealed => {
            if desc.nbytes() > 0 {
                st.tensors.push((at, desc));
            }
        }
        Some(_) => ggml::log(
            Level::Warning,
            &format!(
                "Tessera{NAME}: tensor '{name}' is placed in a buffer sealed already; it \
                 cannot be split and reads of it fail"
            ),
        ),
        None => {
            st.undescribed.get_or_insert(name);
        }
    }
}

/// Seals every pending staged buffer of `meta` before `nodes` run (see the module's
/// documentation). Returns whether any buffer moved (translations holding it are stale).
///
/// # Safety
/// `nodes` and every tensor they reach are live; pending buffers are live (ggml frees them
/// through `buf_free`, which forgets them).
pub(crate) unsafe fn seal(meta: &MetaCtx, nodes: &[*mut sys::ggml_tensor]) -> Result<bool, String> {
    // Only the buffers this graph reaches: another buffer may still be being filled (ggml's op
    // tests build and run several graphs at once).
    let pending = {
        let mut pending = meta.pending.lock();
        if pending.is_empty() {
            return Ok(false);
        }
        // SAFETY: the caller's contract.
        let reached = unsafe { reached_buffers(nodes) };
        let (mut now, mut later) = (Vec::new(), Vec::new());
        for &k in pending.iter() {
            // SAFETY: pending keys are live buffer contexts.
            let c = unsafe { &*(k as *const BufferCtx) };
            let Some(stage) = &c.stage else { continue };
            let mut st = stage.lock();
            if st.usage() == sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_COMPUTE {
                // Graph memory stays plain: nothing to seal, now or later.
                st.sealed = true;
            } else if reached.contains(&st.ggml) {
                now.push(k);
            } else {
                later.push(k);
            }
        }
        *pending = later;
        now
    };
    if pending.is_empty() {
        return Ok(false);
    }
    // SAFETY: the caller's contract: pending keys are live buffer contexts.
    let ctxs: Vec<&BufferCtx> = pending
        .iter()
        .map(|&k| unsafe { &*(k as *const BufferCtx) })
        .collect();
    let weights_usage = sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
    let mut weights: Vec<(String, TensorDesc)> = Vec::new();
    for c in &ctxs {
        let Some(stage) = &c.stage else { continue };
        let st = stage.lock();
        if st.usage() == weights_usage {
            weights.extend(
                st.tensors
                    .iter()
                    .map(|(_, d)| (d.name().to_string(), d.clone())),
            );
        }
    }
    if !weights.is_empty() || meta.learned.lock().is_none() {
        // SAFETY: the caller's contract.
        let heads = unsafe { heads(nodes) };
        let learned = heads.map(|h| policy(meta.device.layout(), h, &weights));
        if learned.is_none() && meta.learned.lock().is_some() {
            // A graph without attention (a model's first graph is not one) keeps the policy
            // the model's own graph taught.
            return finish_seal(meta, ctxs);
        }
        match &learned {
            Some(p) => ggml::log(
                Level::Info,
                &format!(
                    "Tessera{NAME}: splitting by tensor name over {}: {} layers, {} heads, {} KV \
                     heads of {} (from the graph's ROPE)",
                    meta.device
                        .devices()
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                    p.n_layer,
                    p.n_head,
                    p.n_head_kv,
                    p.head_dim
                ),
            ),
            None if !weights.is_empty() => ggml::log(
                Level::Warning,
                &format!(
                    "Tessera{NAME}: the first graph shows no attention (no ROPE of Qcur/Kcur), \
                     so the model's weights are mirrored on every device, not split"
                ),
            ),
            None => {}
        }
        *meta.learned.lock() = learned;
    }
    finish_seal(meta, ctxs)
}

fn finish_seal(meta: &MetaCtx, ctxs: Vec<&BufferCtx>) -> Result<bool, String> {
    let mut moved = false;
    for c in ctxs {
        moved |= seal_one(meta, c)?;
    }
    Ok(moved)
}

/// The ggml buffers (addresses) holding any tensor `nodes` reach.
///
/// # Safety
/// `nodes` and every tensor they reach are live.
unsafe fn reached_buffers(nodes: &[*mut sys::ggml_tensor]) -> std::collections::HashSet<usize> {
    let mut seen = std::collections::HashSet::new();
    let mut buffers = std::collections::HashSet::new();
    let mut todo: Vec<*const sys::ggml_tensor> = nodes.iter().map(|&n| n.cast_const()).collect();
    while let Some(p) = todo.pop() {
        if p.is_null() || !seen.insert(p) {
            continue;
        }
        // SAFETY: the caller's contract.
        let t = unsafe { &*p };
        buffers.insert(t.buffer as usize);
        todo.extend(t.src.iter().map(|&s| s.cast_const()));
        todo.push(t.view_src.cast_const());
    }
    buffers
}

fn seal_one(meta: &MetaCtx, c: &BufferCtx) -> Result<bool, String> {
    let Some(stage) = &c.stage else {
        return Ok(false);
    };
    let mut st = stage.lock();
    if st.sealed {
        return Ok(false);
    }
    st.sealed = true;
    let usage = st.usage();
    if usage == sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_COMPUTE
        || st.tensors.is_empty()
    {
        return Ok(false);
    }
    if let Some(name) = &st.undescribed {
        ggml::log(
            Level::Warning,
            &format!(
                "Tessera{NAME}: tensor '{name}' has no Tessera description; its buffer stays \
                 whole on {} and is read by every device",
                meta.device.devices()[0].name()
            ),
        );
        return Ok(false);
    }
    let weights = usage == sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
    let buft = if weights {
        meta.device.meta_weight_buffer_type()
    } else {
        meta.device.meta_buffer_type()
    };
    let placed: Vec<(usize, &TensorDesc)> = st.tensors.iter().map(|(o, d)| (*o, d)).collect();
    let sealed = buft
        .alloc_placed(c.size, &placed)
        .map_err(|e| format!("placing {} tensors on {}: {e}", placed.len(), buft.name()))?;
    let staged = c.buffer();
    let mut bytes = Vec::new();
    for (at, desc) in &st.tensors {
        bytes.resize(desc.nbytes(), 0);
        staged
            .read(*at, &mut bytes)
            .and_then(|()| {
                if weights {
                    sealed.set_tensor(desc, *at, &bytes)
                } else {
                    sealed.write(*at, &bytes)
                }
            })
            .map_err(|e| format!("moving '{}' onto {}: {e}", desc.name(), buft.name()))?;
    }
    let per_device = sealed
        .as_any()
        .downcast_ref::<tessera::meta::MetaBuffer>()
        .map(|mb| {
            let names = meta.device.devices().iter().map(|d| d.name());
            let bytes = mb.device_bytes();
            names
                .zip(bytes)
                .map(|(n, b)| format!("{n} {:.1} MiB", b as f64 / (1 << 20) as f64))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let line = format!(
        "Tessera{NAME}: {} {} of {:.1} MiB placed: {per_device}",
        st.tensors.len(),
        if weights { "weights" } else { "tensors" },
        c.size as f64 / (1 << 20) as f64
    );
    // A model's weights are worth a line in llama.cpp's log; ggml's op tests seal thousands of
    // small buffers.
    if weights {
        ggml::log(Level::Info, &line);
    } else {
        tracing::debug!(target: "tessera::ggml", "{line}");
    }
    c.replace(sealed);
    st.tensors = Vec::new();
    Ok(true)
}

/// Head size, query heads and KV heads, from the ROPE nodes of a llama-family graph (the
/// rotations of `Qcur-{layer}` and `Kcur-{layer}`, shaped `[head_dim, heads, tokens]`; failing
/// names, the most and fewest heads of any rotation).
///
/// # Safety
/// `nodes` and their sources are live.
unsafe fn heads(nodes: &[*mut sys::ggml_tensor]) -> Option<(usize, usize, usize)> {
    let (mut q, mut k) = (None, None);
    let mut all: Vec<(usize, usize)> = Vec::new();
    for &n in nodes {
        // SAFETY: the caller's contract.
        let t = unsafe { &*n };
        if t.op != sys::ggml_op_GGML_OP_ROPE {
            continue;
        }
        let (Ok(hd), Ok(h)) = (usize::try_from(t.ne[0]), usize::try_from(t.ne[1])) else {
            continue;
        };
        // SAFETY: ggml's names are NUL-terminated.
        let name = unsafe { CStr::from_ptr(t.name.as_ptr()) }.to_string_lossy();
        if name.starts_with("Qcur") {
            q.get_or_insert((hd, h));
        } else if name.starts_with("Kcur") {
            k.get_or_insert((hd, h));
        }
        all.push((hd, h));
    }
    match (q, k) {
        (Some((hq, nq)), Some((hk, nk))) if hq == hk && nk > 0 && nq % nk == 0 => {
            Some((hq, nq, nk))
        }
        _ => {
            let hd = all.first()?.0;
            if all.iter().any(|&(d, _)| d != hd) {
                return None;
            }
            let most = all.iter().map(|a| a.1).max()?;
            let fewest = all.iter().map(|a| a.1).min()?;
            (fewest > 0 && most % fewest == 0).then_some((hd, most, fewest))
        }
    }
}

/// The llama-family policy for `layout`, with attention shape `heads` and the rest learned from
/// the weights' shapes.
fn policy(
    layout: &SplitLayout,
    (head_dim, n_head, n_head_kv): (usize, usize, usize),
    weights: &[(String, TensorDesc)],
) -> LlamaSplitPolicy {
    let shape = |base: &str, axis: usize| -> Option<usize> {
        weights
            .iter()
            .find(|(n, _)| {
                n.strip_suffix(base)
                    .is_some_and(|head| head.is_empty() || head.ends_with('.'))
            })
            .map(|(_, d)| d.ne()[axis])
    };
    let n_layer = weights
        .iter()
        .filter_map(|(n, _)| {
            n.strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |l| l + 1);
    let n_embd = shape("attn_norm.weight", 0)
        .or_else(|| shape("output_norm.weight", 0))
        .unwrap_or(n_head * head_dim);
    let n_ff = shape("ffn_up.weight", 1)
        .or_else(|| shape("ffn_gate.weight", 1))
        .or_else(|| shape("ffn_gate_up.weight", 1).map(|n| n / 2))
        .unwrap_or(0);
    let mut p = LlamaSplitPolicy::new(
        layout.n_devices,
        n_head,
        n_head_kv,
        head_dim,
        n_embd,
        n_ff,
        n_layer,
    );
    p.ratios.clone_from(&layout.ratios);
    p.learn_partner_blocks(weights);
    p
}
