//! The shared runtime over a host-memory driver: what CUDA and HIP run through but cannot run
//! here without a GPU — registry naming and bounds, logical devices sharing a GPU, buffer
//! and stream copies (same GPU, peer, host fallback), events, the kernel cache's errors, and the
//! comm trio's declines and slice validation, and the stream profile. Kernels do not execute on
//! this driver: modules other than elementwise.cu, matmul.cu, copy.cu and norm.cu fail to load
//! with a reason, which the cache must keep and report; their kernels "launch" by being counted, so graphs of
//! element-wise nodes and products go through planning and launching.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tessera_core::comm::{CommApi, CommCall};
use tessera_core::{
    Backend, BackendOptions, Buffer, Context, DType, Device, Error, Registry, Result,
};
use tessera_gpu::nccl::Nccl;
use tessera_gpu::{
    Driver, GpuBuffer, GpuRegistry, GpuStream, NoPinned, RegistryDriver, Runtime, Unit,
    validate_slices,
};
use tessera_kernels::gpu::launch::Launch;

#[derive(Debug)]
struct Gpu {
    ordinal: usize,
    name: String,
}

#[derive(Debug)]
struct Mem {
    gpu: Arc<Gpu>,
    addr: u64,
    bytes: Mutex<Vec<u8>>,
}

#[derive(Debug)]
struct Stream {
    gpu: Arc<Gpu>,
    /// Kernels this stream ran (a replay runs each kernel it recorded).
    launches: AtomicUsize,
    /// The kernels being recorded, while recording.
    recording: Mutex<Option<Vec<&'static str>>>,
    /// Makes the next recordings fail at their first launch.
    fail_recording: AtomicBool,
}

/// Copies recorded by the mock, to check which path a copy took.
static PEER_COPIES: AtomicUsize = AtomicUsize::new(0);
static NEXT_ADDR: AtomicU64 = AtomicU64::new(0x1000);

#[derive(Debug)]
struct Mock;

fn range(mem: &Mem, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
    let size = mem.bytes.lock().unwrap().len();
    tessera_core::error::check_range(&"mock memory", offset, len, size)?;
    Ok(offset..offset + len)
}

fn copy_mem(dst: &Mem, doff: usize, src: &Mem, soff: usize, len: usize) -> Result<()> {
    let (d, s) = (range(dst, doff, len)?, range(src, soff, len)?);
    let data = src.bytes.lock().unwrap()[s].to_vec();
    dst.bytes.lock().unwrap()[d].copy_from_slice(&data);
    Ok(())
}

impl Driver for Mock {
    const NAME: &'static str = "mock";
    type Gpu = Gpu;
    type Mem = Mem;
    type Pinned = NoPinned;
    type Stream = Stream;
    type Event = ();
    type Module = ();
    type Function = &'static str;

    fn ordinal(gpu: &Gpu) -> usize {
        gpu.ordinal
    }
    fn gpu_name(gpu: &Gpu) -> &str {
        &gpu.name
    }
    fn describe(gpu: &Gpu) -> String {
        format!("{} (mock GPU {})", gpu.name, gpu.ordinal)
    }
    fn total_mem(_: &Gpu) -> usize {
        1 << 20
    }
    fn mem_info(_: &Gpu) -> Result<(usize, usize)> {
        Ok((1 << 19, 1 << 20))
    }
    fn alloc(gpu: &Arc<Gpu>, bytes: usize) -> Result<Mem> {
        let addr =
            NEXT_ADDR.fetch_add(bytes.max(1).next_multiple_of(256) as u64, Ordering::Relaxed);
        Ok(Mem {
            gpu: gpu.clone(),
            addr,
            bytes: Mutex::new(vec![0xAB; bytes]),
        })
    }
    fn mem_ptr(mem: &Mem) -> u64 {
        mem.addr
    }
    fn mem_size(mem: &Mem) -> usize {
        mem.bytes.lock().unwrap().len()
    }
    fn mem_gpu(mem: &Mem) -> &Arc<Gpu> {
        &mem.gpu
    }
    fn write(mem: &Mem, offset: usize, src: &[u8]) -> Result<()> {
        let r = range(mem, offset, src.len())?;
        mem.bytes.lock().unwrap()[r].copy_from_slice(src);
        Ok(())
    }
    fn read(mem: &Mem, offset: usize, dst: &mut [u8]) -> Result<()> {
        let r = range(mem, offset, dst.len())?;
        dst.copy_from_slice(&mem.bytes.lock().unwrap()[r]);
        Ok(())
    }
    fn memset(mem: &Mem, offset: usize, len: usize, value: u8) -> Result<()> {
        let r = range(mem, offset, len)?;
        mem.bytes.lock().unwrap()[r].fill(value);
        Ok(())
    }
    fn copy(dst: &Mem, doff: usize, src: &Mem, soff: usize, len: usize) -> Result<()> {
        copy_mem(dst, doff, src, soff, len)
    }
    fn stream_create(gpu: &Arc<Gpu>) -> Result<Stream> {
        Ok(Stream {
            gpu: gpu.clone(),
            launches: AtomicUsize::new(0),
            recording: Mutex::new(None),
            fail_recording: AtomicBool::new(false),
        })
    }
    fn stream_gpu(stream: &Stream) -> &Arc<Gpu> {
        &stream.gpu
    }
    fn stream_sync(_: &Stream) -> Result<()> {
        Ok(())
    }
    fn stream_wait(_: &Stream, _: &()) -> Result<()> {
        Ok(())
    }
    fn copy_async(_: &Stream, d: &Mem, doff: usize, s: &Mem, soff: usize, n: usize) -> Result<()> {
        copy_mem(d, doff, s, soff, n)
    }
    fn copy_peer_async(
        _: &Stream,
        d: &Mem,
        doff: usize,
        s: &Mem,
        soff: usize,
        n: usize,
    ) -> Result<()> {
        PEER_COPIES.fetch_add(1, Ordering::Relaxed);
        copy_mem(d, doff, s, soff, n)
    }
    fn write_staged(_: &Stream, dst: &Mem, offset: usize, src: &[u8]) -> Result<()> {
        Mock::write(dst, offset, src)
    }
    fn read_staged(_: &Stream, src: &Mem, offset: usize, dst: &mut [u8]) -> Result<()> {
        Mock::read(src, offset, dst)
    }
    fn memset_async(_: &Stream, mem: &Mem, offset: usize, len: usize, value: u8) -> Result<()> {
        Mock::memset(mem, offset, len, value)
    }
    fn event_record(_: &Stream) -> Result<()> {
        Ok(())
    }
    fn event_sync(_: &()) -> Result<()> {
        Ok(())
    }
    fn event_query(_: &()) -> bool {
        true
    }
    fn load_module(&self, gpu: &Arc<Gpu>, unit: &Unit) -> Result<()> {
        if matches!(
            unit.file,
            "elementwise.cu" | "matmul.cu" | "copy.cu" | "norm.cu"
        ) {
            return Ok(());
        }
        Err(Error::Compute {
            device: gpu.name.clone(),
            reason: format!("the mock has no compiler for {}", unit.file),
        })
    }
    fn function(_: &(), name: &str) -> Result<&'static str> {
        tessera_kernels::gpu::KERNELS
            .iter()
            .find(|(_, k)| *k == name)
            .map(|(_, k)| *k)
            .ok_or_else(|| Error::InvalidArgument(format!("no mock kernel {name}")))
    }
    unsafe fn launch(s: &Stream, f: &&'static str, l: &Launch) -> Result<()> {
        assert_eq!(*f, l.kernel, "the stream launches the kernel it planned");
        match s.recording.lock().unwrap().as_mut() {
            Some(_) if s.fail_recording.load(Ordering::Relaxed) => {
                return Err(Error::InvalidArgument("mock recording failed".into()));
            }
            Some(r) => r.push(f),
            None => {
                s.launches.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }
    fn record_begin(s: &Stream) -> Result<bool> {
        *s.recording.lock().unwrap() = Some(Vec::new());
        Ok(true)
    }
    fn record_end(s: &Stream) -> Result<Box<dyn Any + Send + Sync>> {
        let r = s.recording.lock().unwrap().take();
        Ok(Box::new(r.expect("recording")))
    }
    fn replay(s: &Stream, r: &(dyn Any + Send + Sync)) -> Result<()> {
        let kernels = r
            .downcast_ref::<Vec<&'static str>>()
            .expect("a mock recording");
        s.launches.fetch_add(kernels.len(), Ordering::Relaxed);
        Ok(())
    }
}

fn open() -> std::result::Result<Runtime<Mock>, String> {
    Runtime::open_each(Mock, 2, |i| {
        Ok::<_, String>(Arc::new(Gpu {
            ordinal: i,
            name: format!("Mock {i}"),
        }))
    })
}

impl RegistryDriver for Mock {
    const DEVICE_PREFIX: &'static str = "MOCK";
    const ALLREDUCE_ENV: &'static str = "TESSERA_MOCK_ALLREDUCE";
    fn runtime() -> &'static std::result::Result<Runtime<Mock>, String> {
        static RUNTIME: std::sync::OnceLock<std::result::Result<Runtime<Mock>, String>> =
            std::sync::OnceLock::new();
        RUNTIME.get_or_init(open)
    }
    fn stream_raw(_: &Stream) -> *mut std::ffi::c_void {
        std::ptr::null_mut()
    }
    fn bind_gpu(_: &Gpu) -> Result<()> {
        Ok(())
    }
    fn load_collectives() -> Result<Nccl> {
        Err(Error::Unavailable {
            backend: "mock".into(),
            reason: "no collective library".into(),
        })
    }
}

/// Host memory of another backend, for the fallback paths.
#[derive(Debug)]
struct HostVec(Mutex<Vec<u8>>);

impl Buffer for HostVec {
    fn size(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn name(&self) -> String {
        "host vec".into()
    }
    fn is_host(&self) -> bool {
        true
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.0.lock().unwrap()[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        dst.copy_from_slice(&self.0.lock().unwrap()[offset..offset + dst.len()]);
        Ok(())
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> Result<()> {
        self.0.lock().unwrap()[offset..offset + len].fill(value);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn devices(n: usize) -> Vec<Arc<dyn Device>> {
    GpuRegistry::<Mock>::new().devices_with_count(n).unwrap()
}

fn stream(dev: &Arc<dyn Device>) -> Box<dyn Backend> {
    dev.init_backend(&BackendOptions::default()).unwrap()
}

#[test]
fn registry_names_devices_and_shares_gpus_round_robin() {
    let reg = GpuRegistry::<Mock>::new();
    assert_eq!((reg.reason(), reg.gpu_count()), (None, 2));
    assert!(reg.probe().is_ok());
    let devs = devices(3);
    let names: Vec<&str> = devs.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["MOCK0", "MOCK1", "MOCK2"]);
    assert_eq!(devs[2].description(), "Mock 0 (mock GPU 0)");
    assert_eq!(devs[0].memory().free, 1 << 19);
    assert!(!devs[0].caps().host_buffer && devs[0].host_buffer_type().is_none());
    // MOCK2 shares GPU 0 with MOCK0: it reaches MOCK0's memory but does not own it.
    let buf = devs[0].buffer_type().alloc(64).unwrap();
    assert!(devs[2].can_access(buf.as_ref()) && !devs[2].owns_buffer(buf.as_ref()));
    assert!(devs[0].owns_buffer(buf.as_ref()) && !devs[1].can_access(buf.as_ref()));
    for n in [0, 257] {
        assert!(matches!(
            reg.devices_with_count(n),
            Err(Error::InvalidArgument(_))
        ));
    }
}

#[test]
fn buffers_and_streams_copy_on_the_right_path() {
    let devs = devices(2);
    let a: Arc<dyn Buffer> = devs[0].buffer_type().alloc(16).unwrap();
    let b: Arc<dyn Buffer> = devs[1].buffer_type().alloc(16).unwrap();
    let host: Arc<dyn Buffer> = Arc::new(HostVec(Mutex::new(vec![0; 16])));
    let mut s0 = stream(&devs[0]);
    s0.write_async(a.as_ref(), 4, &[1, 2, 3, 4]).unwrap();
    let mut got = [0u8; 4];
    s0.read_async(a.as_ref(), 4, &mut got).unwrap();
    assert_eq!(got, [1, 2, 3, 4]);
    // Another GPU's memory: a peer copy.
    let peers = PEER_COPIES.load(Ordering::Relaxed);
    s0.copy_async(&a, 4, &b, 8, 4).unwrap();
    assert_eq!(PEER_COPIES.load(Ordering::Relaxed), peers + 1);
    b.read(8, &mut got).unwrap();
    assert_eq!(got, [1, 2, 3, 4]);
    // Host memory of another backend: synchronize, then copy through the host.
    s0.copy_async(&b, 8, &host, 0, 4).unwrap();
    host.read(0, &mut got).unwrap();
    assert_eq!(got, [1, 2, 3, 4]);
    // A write to memory the stream's GPU does not hold goes through the buffer.
    s0.write_async(b.as_ref(), 0, &[9]).unwrap();
    b.read(0, &mut got[..1]).unwrap();
    assert_eq!(got[0], 9);
    // Blocking copies between device buffers, and range errors.
    assert!(a.copy_from(b.as_ref(), 8, 0, 4).unwrap());
    assert!(!a.copy_from(host.as_ref(), 0, 0, 4).unwrap());
    assert!(matches!(
        a.write(14, &[0; 4]),
        Err(Error::OutOfBounds { .. })
    ));
    let ev = s0.record_event().unwrap().expect("GPU streams have events");
    let mut s1 = stream(&devs[1]);
    s1.wait_event(&ev).unwrap();
    assert!(ev.is_complete());
    s0.synchronize().unwrap();
}

#[test]
fn a_kernel_source_that_does_not_build_is_an_error_each_time() {
    let devs = devices(1);
    let mut s = stream(&devs[0]);
    let gs = s.as_any_mut().downcast_mut::<GpuStream<Mock>>().unwrap();
    let kernels = gs.context().kernels().clone();
    for _ in 0..2 {
        let e = kernels.get("k_f32_to_bf16").unwrap_err().to_string();
        assert!(e.contains("no compiler for comm.cu"), "{e}");
    }
    let e = kernels.get("k_nope").unwrap_err().to_string();
    assert!(e.contains("no mock kernel named k_nope"), "{e}");
}

#[test]
fn the_comm_trio_declines_what_it_cannot_reduce() {
    let reg = GpuRegistry::<Mock>::new();
    let api = CommApi::from_registry(&reg).expect("the trio is exported");
    // Two logical devices on one GPU: one rank per GPU, so the trio declines.
    let shared = devices(3);
    let mut streams = vec![stream(&shared[0]), stream(&shared[2])];
    assert!(api.init(&mut streams).is_none());
    // Two GPUs, but no collective library: declined too.
    let mut streams = vec![stream(&shared[0]), stream(&shared[1])];
    assert!(api.init(&mut streams).is_none());
    assert!(api.init(&mut []).is_none());
}

#[test]
fn the_comm_across_processes_reports_why_it_cannot_start() {
    let reg = GpuRegistry::<Mock>::new();
    let api = tessera_core::comm::RanksCommApi::from_registry(&reg)
        .expect("the comm across processes is exported");
    // No collective library: no job id (an error, not a crash), and every init declines.
    let e = api.unique_id().unwrap_err().to_string();
    assert!(e.contains("tessera_comm_unique_id returned -1"), "{e}");
    let devs = devices(2);
    let mut streams = vec![stream(&devs[0]), stream(&devs[1])];
    let id = vec![1u8; tessera_core::comm::COMM_ID_BYTES];
    assert!(api.init(&mut streams, &id, 4, 2).is_none());
    // A malformed id is declined before anything else.
    assert!(api.init(&mut streams, &id[..5], 4, 2).is_none());
}

#[test]
fn slices_are_validated_before_anything_is_queued() {
    let devs = devices(2);
    let bufs: Vec<Arc<dyn Buffer>> = devs
        .iter()
        .map(|d| d.buffer_type().alloc(64).unwrap())
        .collect();
    let call = |b: &Arc<dyn Buffer>, offset: usize, len: usize| CommCall {
        buffer: Some(b.clone()),
        offset,
        len,
        contributes: true,
    };
    let on_its_gpu = |m: &usize, g: &<Mock as Driver>::Gpu| Mock::ordinal(g) == *m;
    let members = [0usize, 1];
    let ok = vec![call(&bufs[0], 0, 8), call(&bufs[1], 4, 8)];
    let (len, slots) = validate_slices::<Mock, _>(ok, &members, on_its_gpu).unwrap();
    let gb = bufs[1].as_any().downcast_ref::<GpuBuffer<Mock>>().unwrap();
    assert_eq!((len, slots[1].ptr, slots[1].offset), (8, gb.ptr() + 4, 4));
    let cases = [
        (vec![call(&bufs[0], 0, 16)], -2), // one slice for two members
        (vec![call(&bufs[1], 0, 16), call(&bufs[0], 0, 16)], 1), // swapped GPUs
        (vec![call(&bufs[0], 2, 8), call(&bufs[1], 0, 8)], 1), // misaligned
        (vec![call(&bufs[0], 0, 17), call(&bufs[1], 0, 17)], 1), // past the end
        (vec![call(&bufs[0], 0, 8), call(&bufs[1], 0, 4)], 1), // unequal lengths
    ];
    for (calls, status) in cases {
        assert_eq!(
            validate_slices::<Mock, _>(calls, &members, on_its_gpu).unwrap_err(),
            status
        );
    }
}

/// `(a + b) * b`: two element-wise nodes, allocated on `dev`.
fn two_nodes(dev: &Arc<dyn Device>) -> (tessera_core::Graph, tessera_core::TensorBuffer) {
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, [8, 2]).unwrap();
    let b = ctx.new_tensor(DType::F32, [8, 2]).unwrap();
    let sum = ctx.add(a, b).unwrap();
    let prod = ctx.mul(sum, b).unwrap();
    let graph = ctx.build_forward(prod).unwrap();
    (graph, dev.buffer_type().alloc_tensors(&ctx).unwrap())
}

/// Computes `graph` on `gs` and waits for it.
fn run(gs: &mut GpuStream<Mock>, graph: &tessera_core::Graph, b: &tessera_core::Bindings) {
    gs.compute(graph, b).unwrap();
    gs.synchronize().unwrap();
}

fn mock_stream(s: &mut Box<dyn Backend>) -> &mut GpuStream<Mock> {
    s.as_any_mut().downcast_mut::<GpuStream<Mock>>().unwrap()
}

#[test]
fn the_profile_counts_host_phases_and_launches_per_op() {
    let devs = devices(1);
    let mut s = stream(&devs[0]);
    let gs = mock_stream(&mut s);
    assert!(gs.profile_report().is_none(), "off unless asked for");
    gs.set_profiling(true);
    let (graph, buf) = two_nodes(&devs[0]);
    for _ in 0..3 {
        gs.compute(&graph, buf.bindings()).unwrap();
        gs.synchronize().unwrap();
    }
    // A profile times every launch: no replay, each node launched each time.
    assert_eq!(gs.driver_stream().launches.load(Ordering::Relaxed), 6);
    assert_eq!(gs.program_stats().replayed, 0);
    let report = gs.profile_report().unwrap();
    assert!(
        report.contains("3 graphs, 2.0 nodes and 2.0 launches per graph"),
        "{report}"
    );
    // Host phases are timed; the mock has no timed events, which the report says.
    assert!(
        report.contains("host per graph:") && report.contains("kernel lookup"),
        "{report}"
    );
    assert!(
        report.contains("the driver has no timed events"),
        "{report}"
    );
    let rows: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("| ADD") || l.starts_with("| MUL"))
        .collect();
    assert_eq!(rows.len(), 2, "{report}");
    for r in rows {
        assert!(r.contains("f32 · k_") && r.contains("| 1.0 |"), "{r}");
    }
}

#[test]
fn a_graph_is_planned_once_then_recorded_and_replayed() {
    let devs = devices(1);
    let mut s = stream(&devs[0]);
    let gs = mock_stream(&mut s);
    let (graph, buf) = two_nodes(&devs[0]);
    for _ in 0..4 {
        run(gs, &graph, buf.bindings());
    }
    // Run 1 launches each node; run 2 records (launching nothing) and replays; 3 and 4 replay.
    let stats = gs.program_stats();
    assert_eq!(
        (stats.planned, stats.reused, stats.recorded, stats.replayed),
        (1, 3, 1, 3)
    );
    assert_eq!(gs.driver_stream().launches.load(Ordering::Relaxed), 8);
    // A clone of the graph is the same graph; other memory is not.
    run(gs, &graph.clone(), buf.bindings());
    let (_, other) = two_nodes(&devs[0]);
    run(gs, &graph, other.bindings());
    let stats = gs.program_stats();
    assert_eq!((stats.planned, stats.replayed), (2, 4));
    // An equal graph built again is another graph: planned anew.
    let (graph2, _) = two_nodes(&devs[0]);
    run(gs, &graph2, buf.bindings());
    assert_eq!(gs.program_stats().planned, 3);
    // With replay off every run launches each node.
    gs.set_replay(false);
    let before = gs.driver_stream().launches.load(Ordering::Relaxed);
    for _ in 0..2 {
        run(gs, &graph, buf.bindings());
    }
    assert_eq!(
        gs.driver_stream().launches.load(Ordering::Relaxed) - before,
        4
    );
    assert_eq!(gs.program_stats().replayed, 4);
}

#[test]
fn a_failed_recording_falls_back_to_launching_each_node() {
    let devs = devices(1);
    let mut s = stream(&devs[0]);
    let gs = mock_stream(&mut s);
    gs.driver_stream()
        .fail_recording
        .store(true, Ordering::Relaxed);
    let (graph, buf) = two_nodes(&devs[0]);
    for _ in 0..3 {
        gs.compute(&graph, buf.bindings()).unwrap();
        gs.synchronize().unwrap();
    }
    let stats = gs.program_stats();
    assert_eq!((stats.planned, stats.recorded, stats.replayed), (1, 0, 0));
    assert_eq!(gs.driver_stream().launches.load(Ordering::Relaxed), 6);
    // The failed recording was ended: the stream is not left recording.
    assert!(gs.driver_stream().recording.lock().unwrap().is_none());
}

#[test]
fn a_graph_on_foreign_memory_is_refused_before_anything_runs() {
    let devs = devices(2);
    let mut s = stream(&devs[0]);
    let gs = mock_stream(&mut s);
    let (graph, buf) = two_nodes(&devs[1]);
    let e = gs.compute(&graph, buf.bindings()).unwrap_err().to_string();
    assert!(e.contains("is not memory of MOCK0"), "{e}");
    assert_eq!(gs.driver_stream().launches.load(Ordering::Relaxed), 0);
    assert_eq!(gs.program_stats().planned, 0);
}

/// `w · x` for Q4_0 weights [k, 8] and f32 activations [k, 1, planes]: a GEMV on 8-bit
/// activations, allocated on `dev`.
fn q4_0_gemv(
    dev: &Arc<dyn Device>,
    k: usize,
    planes: usize,
) -> (tessera_core::Graph, tessera_core::TensorBuffer) {
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::Q4_0, [k, 8]).unwrap();
    let x = ctx.new_tensor(DType::F32, [k, 1, planes]).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let graph = ctx.build_forward(y).unwrap();
    (graph, dev.buffer_type().alloc_tensors(&ctx).unwrap())
}

/// A node of several launches (activations rounded into scratch, then the GEMV) runs them in
/// order; the stream's scratch grows to what the largest node asks for, and growing drops the
/// programs planned over the old scratch, so they are planned again.
#[test]
fn nodes_of_several_launches_share_a_scratch_that_grows() {
    let devs = devices(1);
    let mut s = stream(&devs[0]);
    let gs = mock_stream(&mut s);
    gs.set_replay(false);
    assert_eq!(
        gs.scratch_bytes(),
        0,
        "no scratch before a node asks for it"
    );
    let (small, small_buf) = q4_0_gemv(&devs[0], 256, 1);
    run(gs, &small, small_buf.bindings());
    run(gs, &small, small_buf.bindings());
    assert_eq!(gs.driver_stream().launches.load(Ordering::Relaxed), 4);
    assert_eq!(gs.scratch_bytes(), 1 << 16);
    assert_eq!(
        (gs.program_stats().planned, gs.program_stats().reused),
        (1, 1)
    );
    // 4 rows of 32768 levels and their scales: 147,456 bytes, past the 64 KiB held.
    let (large, large_buf) = q4_0_gemv(&devs[0], 32768, 4);
    run(gs, &large, large_buf.bindings());
    assert_eq!(gs.scratch_bytes(), 3 << 16);
    run(gs, &small, small_buf.bindings());
    assert_eq!(
        gs.program_stats().planned,
        3,
        "the small GEMV is planned again"
    );
    assert_eq!(
        gs.scratch_bytes(),
        3 << 16,
        "a smaller need keeps the scratch"
    );
}

/// Products of one input share its rounding into scratch while the input is unchanged, with
/// other nodes between them; a node that writes the input's memory (a copy into it) makes the
/// next product round again, though its launch would be the same.
#[test]
fn products_of_one_input_share_its_rounding_until_the_input_is_written() {
    let devs = devices(1);
    let mut s = stream(&devs[0]);
    let gs = mock_stream(&mut s);
    gs.set_replay(false);
    let mut ctx = Context::new();
    let x = ctx.new_tensor(DType::F32, [256, 1]).unwrap();
    let other = ctx.new_tensor(DType::F32, [256, 1]).unwrap();
    let w: Vec<_> = (0..3)
        .map(|_| ctx.new_tensor(DType::Q4_0, [256, 8]).unwrap())
        .collect();
    let y0 = ctx.mul_mat(w[0], x).unwrap();
    let sq = ctx.mul(x, x).unwrap();
    let y1 = ctx.mul_mat(w[1], x).unwrap();
    let x2 = ctx.cpy(other, x).unwrap();
    let y2 = ctx.mul_mat(w[2], x2).unwrap();
    let graph = ctx.build_forward_multi(&[y0, sq, y1, y2]).unwrap();
    let buf = devs[0].buffer_type().alloc_tensors(&ctx).unwrap();
    run(gs, &graph, buf.bindings());
    let order: Vec<_> = graph.nodes().to_vec();
    let pos = |t| order.iter().position(|&n| n == t);
    // The copy node (x2 is a view of x over it) runs between y1 and y2.
    let copy = (0..graph.tensors().len())
        .map(tessera_core::TensorId::from_index)
        .find(|&id| matches!(graph.tensors()[id.index()].op(), tessera_core::Op::Cpy))
        .unwrap();
    assert!(pos(y0) < pos(sq) && pos(sq) < pos(y1) && pos(y1) < pos(copy) && pos(copy) < pos(y2));
    // Launches: three products with two roundings (y1 shares y0's), the square and the copy.
    assert_eq!(
        gs.driver_stream().launches.load(Ordering::Relaxed),
        3 + 2 + 1 + 1
    );
}

/// A norm scaled by the next node runs fused with it as one launch, also when the norm is a
/// result of the graph or read by another node (the fused launch writes it too).
#[test]
fn a_norm_scaled_by_weights_runs_as_one_launch() {
    let devs = devices(1);
    let mut s = stream(&devs[0]);
    let gs = mock_stream(&mut s);
    gs.set_replay(false);
    let launches_of = |gs: &mut GpuStream<Mock>, norm_is_output: bool, second_reader: bool| {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, [64, 3]).unwrap();
        let w = ctx.new_tensor(DType::F32, [64]).unwrap();
        let n = ctx.rms_norm(x, 1e-6).unwrap();
        let y = ctx.mul(n, w).unwrap();
        let mut outs = vec![y];
        if norm_is_output {
            outs.push(n);
        }
        if second_reader {
            outs.push(ctx.add(n, x).unwrap());
        }
        let graph = ctx.build_forward_multi(&outs).unwrap();
        let buf = devs[0].buffer_type().alloc_tensors(&ctx).unwrap();
        let before = gs.driver_stream().launches.load(Ordering::Relaxed);
        run(gs, &graph, buf.bindings());
        gs.driver_stream().launches.load(Ordering::Relaxed) - before
    };
    assert_eq!(launches_of(gs, false, false), 1);
    assert_eq!(launches_of(gs, true, false), 1);
    assert_eq!(launches_of(gs, false, true), 2);
    gs.set_profiling(true);
    launches_of(gs, false, false);
    let report = gs.profile_report().unwrap();
    assert!(report.contains("MUL f32 · k_norm_mul"), "{report}");
}
