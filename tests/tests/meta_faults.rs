//! Faults in the meta device's collectives (issue 20, item 4): a peer stream that fails while
//! queueing its sub-graph, a device whose queued work fails (reported at synchronize), a
//! generic all-reduce whose exchange fails mid-call, and a vendor comm returning an error
//! mid-graph. Each ends that graph with an error, after which the same meta stream runs the next
//! graph to the same bit-exact result and every weight reads back unchanged.
//!
//! The faults are injected by wrapping CPU devices: [`FaultyDevice`] (backend `faulty`) hands out
//! [`FaultyBackend`] streams that fail on a countdown, and the `faulty` registry exports a comm
//! trio that forwards to the CPU comm (the wrapped streams downcast to their CPU stream) unless
//! its countdown says to fail.

use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use tessera_core::backend::{DeviceCaps, DeviceType, MemoryInfo, Support};
use tessera_core::comm::{COMM_ALLREDUCE, COMM_FREE, COMM_INIT, RawCommSlice};
use tessera_core::comm::{CommAllReduceFn, CommFreeFn, CommInitFn, comm_proc_address};
use tessera_core::meta::ratio::split_lengths;
use tessera_core::meta::{CommPath, MetaDevice, SplitLayout, SplitState};
use tessera_core::{
    Backend, BackendOptions, Bindings, Buffer, BufferType, Context, DType, Device, DeviceRegistry,
    Error, Event, Graph, ProcAddress, Registry, Result, TensorDesc, TensorId,
};

/// Countdowns: the k-th call from now fails (0: never).
#[derive(Debug, Default)]
struct Faults {
    /// `compute` returns an error without queueing anything.
    compute: AtomicUsize,
    /// `compute` queues the graph, and the next `synchronize` reports a device failure.
    deferred: AtomicUsize,
    /// `copy_async` (the generic all-reduce's exchanges) returns an error.
    copy: AtomicUsize,
}

/// Whether this call is the one `c` counts down to.
fn hit(c: &AtomicUsize) -> bool {
    c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok_and(|v| v == 1)
}

/// Vendor all-reduce calls until the comm fails (0: never).
static COMM_FAULT: AtomicUsize = AtomicUsize::new(0);
/// Vendor all-reduce calls that failed (injected).
static COMM_FAILED: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug)]
struct FaultyDevice {
    inner: Arc<dyn Device>,
    faults: Arc<Faults>,
}

impl Device for FaultyDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> String {
        format!("{} with injected faults", self.inner.description())
    }
    fn backend_name(&self) -> &str {
        "faulty"
    }
    fn kind(&self) -> DeviceType {
        self.inner.kind()
    }
    fn memory(&self) -> MemoryInfo {
        self.inner.memory()
    }
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.inner.buffer_type()
    }
    fn supports_op(&self, tensors: &[TensorDesc], node: TensorId) -> Support {
        self.inner.supports_op(tensors, node)
    }
    fn supports_buffer_type(&self, buft: &dyn BufferType) -> bool {
        self.inner.supports_buffer_type(buft)
    }
    fn owns_buffer(&self, buf: &dyn Buffer) -> bool {
        self.inner.owns_buffer(buf)
    }
    fn can_access(&self, buf: &dyn Buffer) -> bool {
        self.inner.can_access(buf)
    }
    fn init_backend(&self, opts: &BackendOptions) -> Result<Box<dyn Backend>> {
        Ok(Box::new(FaultyBackend {
            inner: self.inner.init_backend(opts)?,
            faults: self.faults.clone(),
            failed: None,
        }))
    }
}

#[derive(Debug)]
struct FaultyBackend {
    inner: Box<dyn Backend>,
    faults: Arc<Faults>,
    /// A failure of queued work, reported by the next `synchronize`.
    failed: Option<Error>,
}

impl Backend for FaultyBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn compute(&mut self, graph: &Graph, bindings: &Bindings) -> Result<()> {
        if hit(&self.faults.compute) {
            return Err(Error::Compute {
                device: self.name().to_string(),
                reason: "injected: stream refused its sub-graph".into(),
            });
        }
        self.inner.compute(graph, bindings)?;
        if hit(&self.faults.deferred) {
            self.failed = Some(Error::Compute {
                device: self.name().to_string(),
                reason: "injected: queued sub-graph failed on the device".into(),
            });
        }
        Ok(())
    }
    fn synchronize(&mut self) -> Result<()> {
        let r = self.inner.synchronize();
        match self.failed.take() {
            Some(e) => Err(e),
            None => r,
        }
    }
    fn write_async(&mut self, dst: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        self.inner.write_async(dst, offset, data)
    }
    fn read_async(&mut self, src: &dyn Buffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.inner.read_async(src, offset, dst)
    }
    fn copy_async(
        &mut self,
        src: &Arc<dyn Buffer>,
        src_offset: usize,
        dst: &Arc<dyn Buffer>,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        if hit(&self.faults.copy) {
            return Err(Error::Compute {
                device: self.name().to_string(),
                reason: "injected: all-reduce exchange failed".into(),
            });
        }
        self.inner.copy_async(src, src_offset, dst, dst_offset, len)
    }
    fn record_event(&mut self) -> Result<Option<Event>> {
        self.inner.record_event()
    }
    fn wait_event(&mut self, event: &Event) -> Result<()> {
        self.inner.wait_event(event)
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        // The CPU comm finds the CPU stream behind the wrapper and queues its jobs there, in
        // order with the sub-graphs this wrapper forwards.
        self.inner.as_any_mut()
    }
}

/// The CPU comm trio, looked up once.
fn cpu_trio() -> (CommInitFn, CommAllReduceFn, CommFreeFn) {
    let reg = tessera_cpu::registry();
    let addr = |name: &str| reg.proc_address(name).expect("the CPU comm").as_ptr();
    // SAFETY: the CPU registry exports these names with exactly these signatures (the comm
    // ABI, `tessera_core::comm`).
    unsafe {
        (
            std::mem::transmute::<*const c_void, CommInitFn>(addr(COMM_INIT)),
            std::mem::transmute::<*const c_void, CommAllReduceFn>(addr(COMM_ALLREDUCE)),
            std::mem::transmute::<*const c_void, CommFreeFn>(addr(COMM_FREE)),
        )
    }
}

unsafe extern "C" fn faulty_init(streams: *const *mut c_void, n: usize) -> *mut c_void {
    // SAFETY: the arguments are forwarded unchanged under the same contract.
    unsafe { (cpu_trio().0)(streams, n) }
}

unsafe extern "C" fn faulty_allreduce(
    ctx: *mut c_void,
    slices: *const RawCommSlice,
    n: usize,
) -> i32 {
    if hit(&COMM_FAULT) {
        COMM_FAILED.fetch_add(1, Ordering::SeqCst);
        return -5;
    }
    // SAFETY: as for `faulty_init`.
    unsafe { (cpu_trio().1)(ctx, slices, n) }
}

unsafe extern "C" fn faulty_free(ctx: *mut c_void) {
    // SAFETY: as for `faulty_init`.
    unsafe { (cpu_trio().2)(ctx) }
}

#[derive(Debug)]
struct FaultyRegistry;

impl Registry for FaultyRegistry {
    fn name(&self) -> &str {
        "faulty"
    }
    fn probe(&self) -> Result<()> {
        Ok(())
    }
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        Ok(Vec::new())
    }
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        comm_proc_address(name, faulty_init, faulty_allreduce, faulty_free)
    }
}

/// `n` CPU devices behind fault injectors (and their injectors).
fn devices(n: usize) -> (Vec<Arc<dyn Device>>, Vec<Arc<Faults>>) {
    static REG: Once = Once::new();
    REG.call_once(|| {
        DeviceRegistry::global().register(tessera_cpu::registry());
        DeviceRegistry::global().register(Arc::new(FaultyRegistry));
    });
    let faults: Vec<Arc<Faults>> = (0..n).map(|_| Arc::default()).collect();
    let devs = tessera_cpu::split_devices(n)
        .into_iter()
        .zip(&faults)
        .map(|(d, f)| {
            Arc::new(FaultyDevice {
                inner: Arc::new(d),
                faults: f.clone(),
            }) as Arc<dyn Device>
        })
        .collect();
    (devs, faults)
}

/// W1 column-parallel, W2 row-parallel (one all-reduce per layer), by the layout's ratios.
fn policy(desc: &TensorDesc, l: &SplitLayout) -> Result<SplitState> {
    let lens = |len: usize| split_lengths(len, l.n_devices, &l.ratios, 1, 0);
    match desc.name() {
        n if n.starts_with("w1") => SplitState::axis_lens(1, lens(desc.ne()[1])?),
        n if n.starts_with("w2") => SplitState::axis_lens(0, lens(desc.ne()[0])?),
        _ => Ok(SplitState::mirrored()),
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// Two MLP layers, `y = softmax(W2b · silu(W1b · (W2a · silu(W1a · x) + x)) + ...)`: two
/// all-reduces per graph, so a fault can land before, between or after them.
struct Net {
    ctx: Context,
    graph: Graph,
    x: TensorId,
    weights: Vec<(TensorId, u32)>,
    y: TensorId,
}

fn net(d: usize, f: usize, t: usize) -> Net {
    let mut ctx = Context::new();
    let x = ctx.new_named("x", DType::F32, [d, t]).unwrap();
    let mut h = x;
    let mut weights = Vec::new();
    for (i, seed) in [(0, 11), (1, 21)] {
        let w1 = ctx
            .new_named(&format!("w1.{i}"), DType::F32, [d, f])
            .unwrap();
        let w2 = ctx
            .new_named(&format!("w2.{i}"), DType::F32, [f, d])
            .unwrap();
        weights.push((w1, seed));
        weights.push((w2, seed + 1));
        let a = ctx.mul_mat(w1, h).unwrap();
        let a = ctx.silu(a).unwrap();
        let o = ctx.mul_mat(w2, a).unwrap();
        h = ctx.add(o, h).unwrap();
    }
    let y = ctx.soft_max(h).unwrap();
    ctx.set_output(y).unwrap();
    let graph = ctx.build_forward(y).unwrap();
    Net {
        ctx,
        graph,
        x,
        weights,
        y,
    }
}

/// One meta stream over `devs`, its weights and I/O, and the fault-free output.
struct Rig {
    be: tessera_core::meta::MetaBackend,
    weights: tessera_core::TensorBuffer,
    io: tessera_core::TensorBuffer,
    bindings: Bindings,
    want: Vec<f32>,
}

fn rig(n: &Net, devs: &[Arc<dyn Device>], ratios: &[f32], vendor: bool) -> Rig {
    let meta = MetaDevice::new(devs, policy)
        .unwrap()
        .with_ratios(ratios)
        .unwrap()
        .with_vendor_comm(vendor);
    let weights = meta
        .buffer_type()
        .alloc_tensors_where(&n.ctx, |t| t.name().starts_with('w'))
        .unwrap();
    for &(id, seed) in &n.weights {
        let ne = n.ctx.tensor(id).unwrap().nelements();
        weights.set_f32(id, &values(ne, seed)).unwrap();
    }
    let io = devs[0]
        .buffer_type()
        .alloc_tensors_where(&n.ctx, |t| t.name() == "x" || t.flags().output)
        .unwrap();
    let nx = n.ctx.tensor(n.x).unwrap().nelements();
    io.set_f32(n.x, &values(nx, 13)).unwrap();
    let mut bindings = Bindings::new();
    bindings.extend(weights.bindings());
    bindings.extend(io.bindings());
    let mut be = meta
        .init_meta_backend(&BackendOptions::with_threads(1))
        .unwrap();
    let want_path = if vendor {
        CommPath::Vendor("faulty".into())
    } else {
        CommPath::Generic
    };
    assert_eq!(be.comm_path(), &want_path);
    be.compute(&n.graph, &bindings).unwrap();
    be.synchronize().unwrap();
    let want = io.get_f32(n.y).unwrap();
    Rig {
        be,
        weights,
        io,
        bindings,
        want,
    }
}

/// Runs the graph once with the fault armed (it must fail), then again (it must succeed with the
/// fault-free output, bit for bit), and checks every weight.
fn fails_then_recovers(n: &Net, r: &mut Rig, what: &str) {
    let failed =
        r.be.compute(&n.graph, &r.bindings)
            .and_then(|()| r.be.synchronize());
    let e = failed.expect_err(what).to_string();
    assert!(
        e.contains("injected") || e.contains("returned -5"),
        "{what}: {e}"
    );
    // Anything a failed graph still owes (its output, a device's error) must not leak into the
    // next one: its output is never written, not even while the next graph is queued (outputs
    // are gathered into bound buffers by `synchronize`).
    let ny = n.ctx.tensor(n.y).unwrap().nelements();
    let sentinel = vec![1234.5f32; ny];
    r.io.set_f32(n.y, &sentinel).unwrap();
    for round in 0..2 {
        r.be.compute(&n.graph, &r.bindings)
            .unwrap_or_else(|e| panic!("{what}: graph {round} after the fault: {e}"));
        if round == 0 {
            assert!(
                r.io.get_f32(n.y).unwrap() == sentinel,
                "{what}: the failed graph's output was delivered"
            );
        }
        r.be.synchronize()
            .unwrap_or_else(|e| panic!("{what}: graph {round} after the fault: {e}"));
        let got = r.io.get_f32(n.y).unwrap();
        assert!(
            got.iter()
                .zip(&r.want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: graph {round} after the fault differs"
        );
    }
    for &(id, seed) in &n.weights {
        let ne = n.ctx.tensor(id).unwrap().nelements();
        assert_eq!(
            r.weights.get_f32(id).unwrap(),
            values(ne, seed),
            "{what}: weight {} changed",
            n.ctx.label(id)
        );
    }
}

const RATIOS: [f32; 3] = [2.0, 1.0, 1.0];

/// The comm countdown is global: tests run one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_peer_stream_failing_mid_graph_fails_the_graph_and_nothing_else() {
    let _serial = serial();
    let n = net(64, 96, 3);
    for vendor in [true, false] {
        for dev in 0..3 {
            // Sub-graphs per device and graph: one per all-reduce segment (3). The 2nd call is the
            // sub-graph between the two all-reduces.
            for (kind, at) in [
                ("compute", 2),
                ("deferred", 2),
                ("compute", 3),
                ("deferred", 1),
            ] {
                let (devs, faults) = devices(3);
                let mut r = rig(&n, &devs, &RATIOS, vendor);
                let f = &faults[dev];
                match kind {
                    "compute" => f.compute.store(at, Ordering::SeqCst),
                    _ => f.deferred.store(at, Ordering::SeqCst),
                }
                let what = format!("vendor={vendor} device {dev}: {kind} fault at call {at}");
                fails_then_recovers(&n, &mut r, &what);
            }
        }
    }
}

#[test]
fn two_devices_failing_in_one_graph_leave_no_error_behind() {
    let _serial = serial();
    let n = net(64, 96, 3);
    for vendor in [true, false] {
        // Device 0's first sub-graph fails on the device (seen only when it is synchronized);
        // device 2 then refuses its second sub-graph, which ends the graph at `compute`.
        let (devs, faults) = devices(3);
        let mut r = rig(&n, &devs, &RATIOS, vendor);
        faults[0].deferred.store(1, Ordering::SeqCst);
        faults[2].compute.store(2, Ordering::SeqCst);
        fails_then_recovers(
            &n,
            &mut r,
            &format!("vendor={vendor}: two faults in one graph"),
        );
    }
}

#[test]
fn a_generic_all_reduce_exchange_failing_mid_call_fails_the_graph_only() {
    let _serial = serial();
    let n = net(64, 96, 3);
    for dev in 0..3 {
        // Every device sends at least twice per graph (once per all-reduce).
        for at in [1, 2] {
            let (devs, faults) = devices(3);
            let mut r = rig(&n, &devs, &RATIOS, false);
            faults[dev].copy.store(at, Ordering::SeqCst);
            let what = format!("generic: device {dev} exchange {at} fails");
            fails_then_recovers(&n, &mut r, &what);
        }
    }
}

#[test]
fn a_vendor_comm_error_mid_graph_fails_the_graph_only() {
    let _serial = serial();
    let n = net(64, 96, 3);
    // The 1st or 2nd all-reduce of the graph.
    for at in [1, 2] {
        let (devs, _) = devices(3);
        let mut r = rig(&n, &devs, &RATIOS, true);
        let before = COMM_FAILED.load(Ordering::SeqCst);
        COMM_FAULT.store(at, Ordering::SeqCst);
        fails_then_recovers(&n, &mut r, &format!("vendor comm error at reduce {at}"));
        assert_eq!(COMM_FAILED.load(Ordering::SeqCst), before + 1);
    }
}
