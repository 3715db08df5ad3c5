//! Runs a [`Case`] on a device and compares it with the reference.
//!
//! Nothing a backend does can make the runner panic: support refusals become
//! [`Status::NotSupported`], errors and panics inside the backend become [`Status::Fail`] with
//! the error text.

use crate::cases::{Case, DEFAULT_FLOAT_INIT, Init, Rng, Tolerance, generate};
use crate::reference::{RefMemory, decode_tensor, encode};
use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use tessera_core::{Backend, Context, DType, Device, Graph, Support, TensorDesc, TensorId};

/// The result of one case on one device.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// Within tolerance; the largest NMSE over the outputs.
    Pass {
        /// Normalized mean squared error.
        nmse: f64,
    },
    /// Out of tolerance, wrong, or an error.
    Fail {
        /// The NMSE when outputs were compared.
        nmse: Option<f64>,
        /// What went wrong (bound exceeded and where, or the error text).
        reason: String,
    },
    /// The device refused a node in `supports_op`.
    NotSupported(String),
}

/// One line of a conformance report.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseOutcome {
    /// The case label.
    pub label: String,
    /// The device name.
    pub device: String,
    /// What happened.
    pub status: Status,
}

impl CaseOutcome {
    /// Whether the case passed.
    pub fn passed(&self) -> bool {
        matches!(self.status, Status::Pass { .. })
    }
}

/// Counts of outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Cases that passed.
    pub passed: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Cases the device does not support.
    pub not_supported: usize,
}

impl Summary {
    /// Counts `outcomes`.
    pub fn of<'a>(outcomes: impl IntoIterator<Item = &'a CaseOutcome>) -> Summary {
        let mut s = Summary::default();
        for o in outcomes {
            s.add(o);
        }
        s
    }

    /// Adds one outcome.
    pub fn add(&mut self, o: &CaseOutcome) {
        match o.status {
            Status::Pass { .. } => self.passed += 1,
            Status::Fail { .. } => self.failed += 1,
            Status::NotSupported(_) => self.not_supported += 1,
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} not supported",
            self.passed, self.failed, self.not_supported
        )
    }
}

/// The ggml-style report line: `LABEL DEVICE: OK (nmse 2.1e-09)`, `... FAIL (reason)`,
/// `... NOT SUPPORTED (reason)`.
pub fn format_line(o: &CaseOutcome) -> String {
    let status = match &o.status {
        Status::Pass { nmse } => format!("OK (nmse {nmse:.1e})"),
        Status::Fail { reason, .. } => format!("FAIL ({reason})"),
        Status::NotSupported(r) => format!("NOT SUPPORTED ({r})"),
    };
    format!("{} {}: {status}", o.label, o.device)
}

fn panic_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs `f`, turning a panic into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(format!("{what} panicked: {}", panic_text(p.as_ref()))))
}

/// The non-view tensor whose storage `id` uses.
fn base_of(tensors: &[TensorDesc], mut id: TensorId) -> TensorId {
    while let Some(v) = tensors.get(id.index()).and_then(TensorDesc::view_of) {
        id = v.src;
    }
    id
}

/// The leaf bytes of a built case: each graph leaf filled by its rule (or the default), encoded.
fn leaf_bytes(
    case: &Case,
    ctx: &Context,
    graph: &Graph,
    inits: &[(TensorId, Init)],
) -> Result<Vec<(TensorId, Vec<u8>)>, String> {
    let tensors = ctx.tensors();
    let mut out = Vec::new();
    for (n, &leaf) in graph.leafs().iter().enumerate() {
        let t = &tensors[leaf.index()];
        let init = inits
            .iter()
            .rev()
            .find(|(id, _)| base_of(tensors, *id) == leaf)
            .map(|&(_, i)| i);
        let init = init.unwrap_or(if t.dtype() == DType::I32 {
            Init::Ints { lo: 0, hi: 0 }
        } else {
            DEFAULT_FLOAT_INIT
        });
        let mut rng = Rng::for_label(case.label(), n as u64);
        let vals = generate(init, t.ne(), &mut rng)
            .map_err(|e| format!("leaf {}: {e}", ctx.label(leaf)))?;
        out.push((leaf, encode(t.dtype(), &vals)?));
    }
    Ok(out)
}

/// Compares `got` with `want` under `tol`; `Ok(nmse)` when within it.
///
/// NMSE = Σ(got−want)² / Σ want² (Σ(got−want)² when Σ want² = 0). A NaN in `got` fails.
///
/// # Errors
/// A description of the first problem: NaN, a length mismatch, the bound exceeded (with the
/// largest absolute error and where), or elements differing under [`Tolerance::Exact`].
pub fn compare(got: &[f64], want: &[f64], tol: Tolerance) -> Result<f64, (Option<f64>, String)> {
    if got.len() != want.len() {
        return Err((
            None,
            format!("{} elements, expected {}", got.len(), want.len()),
        ));
    }
    if let Some(i) = got.iter().position(|v| v.is_nan()) {
        return Err((None, format!("NaN in the output at element {i}")));
    }
    if let Some(i) = want.iter().position(|v| v.is_nan()) {
        return Err((
            None,
            format!("the reference is NaN at element {i} (a broken case)"),
        ));
    }
    let (mut num, mut den, mut max_err, mut at, mut differ) =
        (0.0f64, 0.0f64, 0.0f64, 0usize, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        // Equal infinities (masked-out logits) are no error.
        let e = if g == w { 0.0 } else { g - w };
        if e != 0.0 {
            differ += 1;
        }
        if e.abs() > max_err || e.is_nan() {
            max_err = e.abs();
            at = i;
        }
        num += e * e;
        if w.is_finite() {
            den += w * w;
        }
    }
    let nmse = if den > 0.0 { num / den } else { num };
    let detail = || {
        format!(
            "max abs err {max_err:.3e} at element {at}: got {} want {}",
            got[at], want[at]
        )
    };
    match tol {
        Tolerance::Exact if differ > 0 => Err((
            Some(nmse),
            format!("{differ} of {} elements differ, {}", got.len(), detail()),
        )),
        Tolerance::Nmse(bound) if nmse.is_nan() || nmse > bound => Err((
            Some(nmse),
            format!("nmse {nmse:.2e} > {bound:.0e}, {}", detail()),
        )),
        _ => Ok(nmse),
    }
}

/// Builds `case`, asks `device` whether it supports every computing node, runs the graph on
/// `backend` (a stream of `device`) and compares each output with the reference interpreter run
/// on the same leaf bytes.
pub fn run_case(device: &dyn Device, backend: &mut dyn Backend, case: &Case) -> CaseOutcome {
    let status = run_status(device, backend, case);
    CaseOutcome {
        label: case.label().to_string(),
        device: device.name().to_string(),
        status,
    }
}

fn fail(reason: String) -> Status {
    Status::Fail { nmse: None, reason }
}

/// Why `device` declines a node of `case` (`Ok(None)`: it supports them all); `Err` when the case
/// does not build or `supports_op` panics.
///
/// # Errors
/// The reason, as a [`Status::Fail`] would give it.
pub fn case_support(device: &dyn Device, case: &Case) -> Result<Option<String>, String> {
    let mut ctx = Context::new();
    let built = case
        .build(&mut ctx)
        .map_err(|e| format!("case does not build: {e}"))?;
    let roots: Vec<TensorId> = built.roots.iter().chain(&built.outputs).copied().collect();
    let graph = ctx
        .build_forward_multi(&roots)
        .map_err(|e| format!("case does not build: {e}"))?;
    declined(device, &ctx, &graph)
}

fn declined(device: &dyn Device, ctx: &Context, graph: &Graph) -> Result<Option<String>, String> {
    for &node in graph.nodes() {
        let t = &ctx.tensors()[node.index()];
        if t.op().kind().is_view() {
            continue;
        }
        let support = guarded(
            "supports_op",
            || Ok(device.supports_op(ctx.tensors(), node)),
        )?;
        if let Support::No(reason) = support {
            return Ok(Some(format!("{}: {reason}", t.op().name())));
        }
    }
    Ok(None)
}

fn run_status(device: &dyn Device, backend: &mut dyn Backend, case: &Case) -> Status {
    let mut ctx = Context::new();
    let built = match case.build(&mut ctx) {
        Ok(b) => b,
        Err(e) => return fail(format!("case does not build: {e}")),
    };
    let roots: Vec<TensorId> = built.roots.iter().chain(&built.outputs).copied().collect();
    let graph = match ctx.build_forward_multi(&roots) {
        Ok(g) => g,
        Err(e) => return fail(format!("case does not build: {e}")),
    };
    match declined(device, &ctx, &graph) {
        Ok(None) => {}
        Ok(Some(reason)) => return Status::NotSupported(reason),
        Err(e) => return fail(e),
    }
    let leaves = match guarded("the reference", || {
        leaf_bytes(case, &ctx, &graph, &built.inits)
    }) {
        Ok(l) => l,
        Err(e) => return fail(format!("case inputs: {e}")),
    };

    // The reference, on the same leaf bytes.
    let want = guarded("the reference", || {
        let mut mem = RefMemory::new(ctx.tensors());
        mem.set_llama_rounding(case.llama_rounding());
        for (id, bytes) in &leaves {
            mem.set_bytes(*id, bytes)?;
        }
        mem.eval(&graph)?;
        built
            .outputs
            .iter()
            .map(|&o| mem.read(o))
            .collect::<Result<Vec<_>, _>>()
    });
    let want = match want {
        Ok(w) => w,
        Err(e) => return fail(format!("reference: {e}")),
    };

    // The device.
    let got = guarded("the backend", || {
        let buf = device
            .buffer_type()
            .alloc_tensors(&ctx)
            .map_err(|e| format!("alloc: {e}"))?;
        for (id, bytes) in &leaves {
            buf.set(*id, bytes)
                .map_err(|e| format!("set {}: {e}", ctx.label(*id)))?;
        }
        backend
            .compute(&graph, buf.bindings())
            .map_err(|e| format!("compute: {e}"))?;
        backend
            .synchronize()
            .map_err(|e| format!("synchronize: {e}"))?;
        let mut outs = Vec::new();
        for &o in &built.outputs {
            let t = &ctx.tensors()[o.index()];
            let mut bytes = vec![0u8; t.nbytes()];
            buf.get(o, &mut bytes)
                .map_err(|e| format!("get {}: {e}", ctx.label(o)))?;
            outs.push(decode_tensor(t, &bytes)?);
        }
        Ok(outs)
    });
    let got = match got {
        Ok(g) => g,
        Err(e) => return fail(e),
    };

    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        match compare(g, w, case.tolerance()) {
            Ok(nmse) => worst = worst.max(nmse),
            Err((nmse, reason)) => {
                let reason = if got.len() > 1 {
                    format!("output {i}: {reason}")
                } else {
                    reason
                };
                return Status::Fail { nmse, reason };
            }
        }
    }
    Status::Pass { nmse: worst }
}

#[cfg(test)]
mod tests {
    //! The runner against a device that computes with the reference itself (every case must
    //! pass), and against broken devices (failures must be reported, never panic).

    use super::*;
    use crate::cases::all_cases;
    use std::sync::{Arc, Mutex};
    use tessera_core::backend::HostMemory;
    use tessera_core::{
        BackendOptions, Bindings, Buffer, BufferType, DeviceCaps, DeviceType, Error, MemoryInfo,
        Result,
    };

    #[derive(Debug)]
    struct HostBuf(Mutex<Vec<u8>>);

    impl Buffer for HostBuf {
        fn size(&self) -> usize {
            self.0.lock().map_or(0, |v| v.len())
        }
        fn name(&self) -> String {
            "REF buffer".into()
        }
        fn is_host(&self) -> bool {
            true
        }
        fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
            let mut v = self
                .0
                .lock()
                .map_err(|_| Error::InvalidArgument("poisoned".into()))?;
            let len = v.len();
            v.get_mut(offset..offset + src.len())
                .ok_or(Error::OutOfBounds {
                    what: "REF".into(),
                    offset,
                    end: offset + src.len(),
                    size: len,
                })?
                .copy_from_slice(src);
            Ok(())
        }
        fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
            let v = self
                .0
                .lock()
                .map_err(|_| Error::InvalidArgument("poisoned".into()))?;
            dst.copy_from_slice(
                v.get(offset..offset + dst.len())
                    .ok_or(Error::OutOfBounds {
                        what: "REF".into(),
                        offset,
                        end: offset + dst.len(),
                        size: v.len(),
                    })?,
            );
            Ok(())
        }
        fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
            self.write(offset, &vec![value; len])
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[derive(Debug)]
    struct HostBufType;

    impl BufferType for HostBufType {
        fn name(&self) -> &str {
            "REF"
        }
        fn alignment(&self) -> usize {
            32
        }
        fn is_host(&self) -> bool {
            true
        }
        fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
            Ok(Arc::new(HostBuf(Mutex::new(vec![0; size]))))
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    /// How the fake device misbehaves.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Fault {
        None,
        /// Replaces the first element of every output with this value.
        Poison(f64),
        /// Scales every float output by 1.05 and adds 0.05; adds 1 to i32 outputs.
        Skew,
        /// compute returns an error.
        Error,
        /// compute panics.
        Panic,
        /// supports_op refuses everything.
        Refuse,
    }

    /// The fake device: its fault, and whether it rounds activations as llama.cpp does.
    #[derive(Debug)]
    struct RefDevice(Fault, bool);

    #[derive(Debug)]
    struct RefBackend(Fault, bool);

    impl Device for RefDevice {
        fn name(&self) -> &str {
            "REF"
        }
        fn description(&self) -> String {
            "the reference interpreter".into()
        }
        fn backend_name(&self) -> &str {
            "ref"
        }
        fn kind(&self) -> DeviceType {
            DeviceType::Cpu
        }
        fn memory(&self) -> MemoryInfo {
            MemoryInfo::default()
        }
        fn caps(&self) -> DeviceCaps {
            DeviceCaps::default()
        }
        fn buffer_type(&self) -> Arc<dyn BufferType> {
            Arc::new(HostBufType)
        }
        fn supports_op(&self, _tensors: &[TensorDesc], _node: TensorId) -> Support {
            if self.0 == Fault::Refuse {
                Support::No("refused".into())
            } else {
                Support::Yes
            }
        }
        fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
            buft.name() == "REF"
        }
        fn buffer_from_host(&self, _mem: HostMemory) -> Result<Option<Arc<dyn Buffer>>> {
            Ok(None)
        }
        fn init_backend(&self, _opts: &BackendOptions) -> Result<Box<dyn Backend>> {
            Ok(Box::new(RefBackend(self.0, self.1)))
        }
    }

    impl Backend for RefBackend {
        fn name(&self) -> &str {
            "REF"
        }
        fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
            match self.0 {
                Fault::Error => {
                    return Err(Error::Compute {
                        device: "REF".into(),
                        reason: "boom".into(),
                    });
                }
                Fault::Panic => panic!("kernel bug"),
                _ => {}
            }
            let tensors = graph.tensors();
            let err = |e: String| Error::Compute {
                device: "REF".into(),
                reason: e,
            };
            let mut mem = RefMemory::new(tensors);
            mem.set_llama_rounding(self.1);
            for &leaf in graph.leafs() {
                let t = &tensors[leaf.index()];
                let (buf, off) = bindings.resolve(tensors, leaf)?;
                let mut bytes = vec![0u8; t.nbytes()];
                buf.read(off, &mut bytes)?;
                mem.set_bytes(leaf, &bytes).map_err(err)?;
            }
            mem.eval(graph).map_err(err)?;
            for &o in graph.outputs() {
                let t = &tensors[o.index()];
                // Only faults rewrite outputs: decoding and re-encoding a K-quant is not the
                // identity (its scale search sees different inputs), so fault-free outputs keep
                // their bytes.
                if !t.is_contiguous() || !matches!(self.0, Fault::Poison(_) | Fault::Skew) {
                    continue;
                }
                let mut vals = mem.read(o).map_err(err)?;
                match self.0 {
                    Fault::Poison(x) => vals[0] = x,
                    Fault::Skew if t.dtype() == DType::I32 => {
                        vals.iter_mut().for_each(|v| *v += 1.0)
                    }
                    Fault::Skew => vals.iter_mut().for_each(|v| *v = *v * 1.05 + 0.05),
                    _ => {}
                }
                mem.set_bytes(o, &encode(t.dtype(), &vals).map_err(err)?)
                    .map_err(err)?;
            }
            // Write every stored tensor back: results live in bases that views write through.
            for (i, t) in tensors.iter().enumerate() {
                let id = TensorId::from_index(i);
                if t.is_view() || bindings.slot(id).is_none() {
                    continue;
                }
                let (buf, off) = bindings.resolve(tensors, id)?;
                buf.write(off, &mem.bytes(id).map_err(err)?)?;
            }
            Ok(())
        }
        fn synchronize(&mut self) -> Result<()> {
            Ok(())
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    /// `case` on the fake device, rounding activations where the case's reference does.
    fn run_with(fault: Fault, case: &Case) -> CaseOutcome {
        run_on(RefDevice(fault, case.llama_rounding()), case)
    }

    fn run_on(dev: RefDevice, case: &Case) -> CaseOutcome {
        let mut backend = match dev.init_backend(&BackendOptions::default()) {
            Ok(b) => b,
            Err(e) => panic!("{e}"),
        };
        run_case(&dev, backend.as_mut(), case)
    }

    #[test]
    fn every_case_passes_on_the_reference_device() {
        let mut failures = Vec::new();
        for case in all_cases() {
            let o = run_with(Fault::None, &case);
            match o.status {
                Status::Pass { nmse: 0.0 } => {}
                _ => failures.push(format_line(&o)),
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn faults_are_failures_not_panics() {
        let case = all_cases()
            .into_iter()
            .find(|c| c.op() == "MUL_MAT")
            .expect("a MUL_MAT case");
        let o = run_with(Fault::Error, &case);
        assert!(
            matches!(&o.status, Status::Fail { reason, .. } if reason.contains("boom")),
            "{o:?}"
        );
        let o = run_with(Fault::Panic, &case);
        assert!(
            matches!(&o.status, Status::Fail { reason, .. } if reason.contains("kernel bug")),
            "{o:?}"
        );
        let o = run_with(Fault::Refuse, &case);
        assert_eq!(o.status, Status::NotSupported("MUL_MAT: refused".into()));
        assert!(
            format_line(&o).ends_with("REF: NOT SUPPORTED (MUL_MAT: refused)"),
            "{}",
            format_line(&o)
        );
        let o = run_with(Fault::Poison(f64::NAN), &case);
        assert!(
            matches!(&o.status, Status::Fail { reason, .. } if reason.contains("NaN")),
            "{o:?}"
        );
    }

    #[test]
    fn rounding_cases_need_llama_cpps_rounding() {
        // A device multiplying by exact f32 activations fails every rounding=llama case; one
        // that rounds as llama.cpp does passes them, and the ordinary cases of the same weight
        // types, whose reference keeps exact activations, within their usual bound.
        let cases = all_cases();
        let rounding: Vec<&Case> = cases.iter().filter(|c| c.llama_rounding()).collect();
        assert!(rounding.len() >= 20, "{} rounding cases", rounding.len());
        for case in &rounding {
            let exact = run_on(RefDevice(Fault::None, false), case);
            assert!(!exact.passed(), "{}", format_line(&exact));
            let rounded = run_on(RefDevice(Fault::None, true), case);
            assert!(rounded.passed(), "{}", format_line(&rounded));
        }
        let mut ordinary = 0;
        for case in cases.iter().filter(|c| {
            !c.llama_rounding()
                && c.label().starts_with("MUL_MAT")
                && (c.label().contains("type_a=q8_0,") || c.label().contains("type_a=q4_1,"))
        }) {
            let o = run_on(RefDevice(Fault::None, true), case);
            assert!(o.passed(), "{}", format_line(&o));
            ordinary += 1;
        }
        assert!(ordinary > 10, "{ordinary} ordinary cases");
    }

    #[test]
    fn small_errors_are_caught_for_every_case() {
        // A 5% error must fail every case: no tolerance is so loose that it cannot fail.
        let mut missed = Vec::new();
        for case in all_cases() {
            let o = run_with(Fault::Skew, &case);
            if o.passed() {
                missed.push(format_line(&o));
            }
        }
        assert!(missed.is_empty(), "{}", missed.join("\n"));
    }

    #[test]
    fn compare_rules() {
        assert_eq!(compare(&[1.0, 2.0], &[1.0, 2.0], Tolerance::Exact), Ok(0.0));
        assert!(compare(&[1.0, 2.5], &[1.0, 2.0], Tolerance::Exact).is_err());
        assert!(compare(&[1.0], &[1.0, 2.0], Tolerance::Nmse(1.0)).is_err());
        // Σ ref² = 0: the plain squared error counts.
        assert_eq!(
            compare(&[0.0, 0.0], &[0.0, 0.0], Tolerance::Nmse(0.0)),
            Ok(0.0)
        );
        assert!(compare(&[0.1, 0.0], &[0.0, 0.0], Tolerance::Nmse(1e-3)).is_err());
        let ok = compare(&[1.0, 2.0 + 1e-4], &[1.0, 2.0], Tolerance::Nmse(1e-7));
        assert!(matches!(ok, Ok(n) if (n - 2e-9).abs() < 1e-12), "{ok:?}");
        assert!(
            compare(
                &[f64::NEG_INFINITY],
                &[f64::NEG_INFINITY],
                Tolerance::Nmse(0.0)
            )
            .is_ok()
        );
        let line = format_line(&CaseOutcome {
            label: "SILU(type=f32)".into(),
            device: "CPU".into(),
            status: Status::Pass { nmse: 2.1e-9 },
        });
        assert_eq!(line, "SILU(type=f32) CPU: OK (nmse 2.1e-9)");
        let s = Summary::of(&[CaseOutcome {
            label: "x".into(),
            device: "CPU".into(),
            status: Status::Fail {
                nmse: None,
                reason: "r".into(),
            },
        }]);
        assert_eq!(s.to_string(), "0 passed, 1 failed, 0 not supported");
    }
}
