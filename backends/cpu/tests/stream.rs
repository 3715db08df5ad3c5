//! Stream behaviour of the CPU backend: asynchronous compute, several devices at once, events,
//! and the error paths a user can trigger.

use std::sync::Arc;
use tessera_core::backend::HostMemory;
use tessera_core::{
    BackendOptions, Bindings, Context, DType, Device, Error, TensorBuffer, TensorId,
};
use tessera_cpu::{CpuDevice, split_devices};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// y = (w · x) * 2 for a 64×64 f32 weight.
fn small_graph() -> (Context, TensorId, TensorId, TensorId) {
    let mut ctx = Context::new();
    let w = ctx.new_named("w", DType::F32, [64, 64]).unwrap();
    let x = ctx.new_named("x", DType::F32, [64, 3]).unwrap();
    let mm = ctx.mul_mat(w, x).unwrap();
    let y = ctx.scale(mm, 2.0).unwrap();
    (ctx, w, x, y)
}

fn expected(w: &[f32], x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; 64 * 3];
    for c in 0..3 {
        for r in 0..64 {
            out[c * 64 + r] = 2.0 * (0..64).map(|i| w[r * 64 + i] * x[c * 64 + i]).sum::<f32>();
        }
    }
    out
}

#[test]
fn devices_compute_concurrently_and_correctly() {
    let devs = split_devices(4);
    let (ctx, w, x, y) = small_graph();
    let graph = ctx.build_forward(y).unwrap();
    let mut runs = Vec::new();
    for (i, d) in devs.iter().enumerate() {
        let buf = d.buffer_type().alloc_tensors(&ctx).unwrap();
        let wv: Vec<f32> = (0..64 * 64)
            .map(|j| ((j * (i + 3)) % 17) as f32 / 17.0 - 0.5)
            .collect();
        let xv: Vec<f32> = (0..64 * 3)
            .map(|j| ((j * 7 + i) % 13) as f32 / 13.0)
            .collect();
        buf.set_f32(w, &wv).unwrap();
        buf.set_f32(x, &xv).unwrap();
        let mut be = d.init_backend(&BackendOptions::with_threads(2)).unwrap();
        // Queue several runs on every device before waiting on any of them.
        for _ in 0..5 {
            be.compute(&graph, buf.bindings()).unwrap();
        }
        runs.push((be, buf, expected(&wv, &xv)));
    }
    for (mut be, buf, want) in runs {
        be.synchronize().unwrap();
        let got = buf.get_f32(y).unwrap();
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-3, "max error {err}");
    }
}

#[test]
fn host_writes_wait_for_queued_graphs() {
    let dev = CpuDevice::new("CPU", vec![]);
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, [1 << 16]).unwrap();
    let mut cur = a;
    for _ in 0..20 {
        cur = ctx.scale_bias(cur, 1.0, 1.0).unwrap();
    }
    let graph = ctx.build_forward(cur).unwrap();
    let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
    buf.set_f32(a, &vec![0.0; 1 << 16]).unwrap();
    let mut be = dev.init_backend(&BackendOptions::with_threads(1)).unwrap();
    be.compute(&graph, buf.bindings()).unwrap();
    // This write is ordered after the queued graph: the graph must have read zeros.
    buf.set_f32(a, &vec![100.0; 1 << 16]).unwrap();
    be.synchronize().unwrap();
    assert!(buf.get_f32(cur).unwrap().iter().all(|&v| v == 20.0));
}

#[test]
fn events_order_work_across_streams() {
    let devs = split_devices(2);
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, [1024]).unwrap();
    let b = ctx.scale(a, 3.0).unwrap();
    let graph = ctx.build_forward(b).unwrap();
    let buf = devs[0].buffer_type().alloc_tensors(&ctx).unwrap();
    buf.set_f32(a, &vec![1.0; 1024]).unwrap();
    let mut s0 = devs[0].init_backend(&BackendOptions::default()).unwrap();
    let mut s1 = devs[1].init_backend(&BackendOptions::default()).unwrap();
    s0.compute(&graph, buf.bindings()).unwrap();
    let ev = s0
        .record_event()
        .unwrap()
        .expect("CPU streams support events");
    s1.wait_event(&ev).unwrap();
    let ev1 = s1.record_event().unwrap().unwrap();
    ev1.synchronize().unwrap();
    assert!(ev.is_complete());
    assert_eq!(buf.get_f32(b).unwrap(), vec![3.0; 1024]);
}

#[test]
fn unallocated_tensor_is_a_typed_error() {
    let dev = CpuDevice::new("CPU", vec![]);
    let (ctx, _, _, y) = small_graph();
    let graph = ctx.build_forward(y).unwrap();
    let mut be = dev.init_backend(&BackendOptions::default()).unwrap();
    let err = be.compute(&graph, &Bindings::new()).unwrap_err();
    assert!(matches!(err, Error::NotAllocated { .. }), "{err}");
    assert!(
        err.to_string().contains("'w'") || err.to_string().contains("'x'"),
        "{err}"
    );
}

#[test]
fn buffer_too_small_is_out_of_bounds() {
    let dev = CpuDevice::new("CPU", vec![]);
    let (ctx, w, _, y) = small_graph();
    let graph = ctx.build_forward(y).unwrap();
    let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
    let mut bindings = buf.bindings().clone();
    let tiny = dev.buffer_type().alloc(16).unwrap();
    bindings.bind(w, tiny, 0);
    let mut be = dev.init_backend(&BackendOptions::default()).unwrap();
    assert!(matches!(
        be.compute(&graph, &bindings),
        Err(Error::OutOfBounds { .. })
    ));
}

#[test]
fn out_of_range_row_index_fails_at_synchronize_without_crashing() {
    let dev = CpuDevice::new("CPU", vec![]);
    let mut ctx = Context::new();
    let table = ctx.new_tensor(DType::F32, [8, 4]).unwrap();
    let ids = ctx.new_named("ids", DType::I32, [2]).unwrap();
    let rows = ctx.get_rows(table, ids).unwrap();
    let graph = ctx.build_forward(rows).unwrap();
    let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
    buf.set_i32(ids, &[1, 7]).unwrap();
    let mut be = dev.init_backend(&BackendOptions::default()).unwrap();
    be.compute(&graph, buf.bindings()).unwrap();
    let err = be.synchronize().unwrap_err();
    assert!(
        matches!(err, Error::Compute { .. }) && err.to_string().contains("index 7"),
        "{err}"
    );
    // The stream stays usable.
    buf.set_i32(ids, &[1, 3]).unwrap();
    be.compute(&graph, buf.bindings()).unwrap();
    be.synchronize().unwrap();
}

#[test]
fn host_memory_is_wrapped_read_only() {
    let dev = CpuDevice::new("CPU", vec![]);
    let mut ctx = Context::new();
    let w = ctx.new_tensor(DType::F32, [4]).unwrap();
    let y = ctx.sqr(w).unwrap();
    let graph = ctx.build_forward(y).unwrap();
    let mem: HostMemory = Arc::new(f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    let host = dev
        .buffer_from_host(mem)
        .unwrap()
        .expect("CPU wraps host memory");
    assert!(matches!(host.write(0, &[0; 4]), Err(Error::ReadOnly(_))));
    let out: TensorBuffer = dev
        .buffer_type()
        .alloc_tensors_where(&ctx, |t| t.op().kind() != tessera_core::OpKind::None)
        .unwrap();
    let mut bindings = out.bindings().clone();
    bindings.bind(w, host.clone(), 0);
    let mut be = dev.init_backend(&BackendOptions::default()).unwrap();
    be.compute(&graph, &bindings).unwrap();
    be.synchronize().unwrap();
    assert_eq!(out.get_f32(y).unwrap(), vec![1.0, 4.0, 9.0, 16.0]);
    // A graph that would write into the read-only memory is refused before it runs.
    let mut bad = bindings.clone();
    bad.bind(y, host, 0);
    assert!(matches!(be.compute(&graph, &bad), Err(Error::ReadOnly(_))));
}

#[test]
fn wrong_sizes_and_dtypes_are_errors() {
    let dev = CpuDevice::new("CPU", vec![]);
    let (ctx, w, x, _) = small_graph();
    let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
    assert!(matches!(
        buf.set(w, &[0u8; 12]),
        Err(Error::SizeMismatch { .. })
    ));
    assert!(matches!(
        buf.set_at(x, 64 * 3 * 4 - 2, &[0u8; 4]),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        buf.set_i32(x, &[0; 192]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        buf.buffer().read(buf.buffer().size(), &mut [0u8; 1]),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(dev.init_backend(&BackendOptions::with_threads(0)).is_err());
}

#[test]
fn host_reads_wait_for_queued_copies() {
    let dev = CpuDevice::new("CPU", vec![]);
    let n = 8 << 20;
    let src = dev.buffer_type().alloc(n).unwrap();
    let dst = dev.buffer_type().alloc(n).unwrap();
    src.write(0, &vec![7u8; n]).unwrap();
    let mut be = dev.init_backend(&BackendOptions::with_threads(1)).unwrap();
    be.copy_async(&src, 0, &dst, 0, n).unwrap();
    // No synchronize: the host read is ordered after the queued copy by the buffer's guard.
    let mut out = vec![0u8; n];
    dst.read(0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 7));
}

/// A buffer of another backend: plain host memory behind a mutex.
#[derive(Debug)]
struct ForeignBuffer(parking_lot::Mutex<Vec<u8>>);

impl tessera_core::Buffer for ForeignBuffer {
    fn size(&self) -> usize {
        self.0.lock().len()
    }
    fn name(&self) -> String {
        "foreign".into()
    }
    fn is_host(&self) -> bool {
        true
    }
    fn write(&self, offset: usize, src: &[u8]) -> tessera_core::Result<()> {
        self.0.lock()[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> tessera_core::Result<()> {
        dst.copy_from_slice(&self.0.lock()[offset..offset + dst.len()]);
        Ok(())
    }
    fn memset(&self, offset: usize, len: usize, value: u8) -> tessera_core::Result<()> {
        self.0.lock()[offset..offset + len].fill(value);
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn copies_from_foreign_buffers_do_not_block_later_graphs() {
    let dev = CpuDevice::new("CPU", vec![]);
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, [1024]).unwrap();
    let b = ctx.scale(a, 2.0).unwrap();
    let graph = ctx.build_forward(b).unwrap();
    let buf = dev.buffer_type().alloc_tensors(&ctx).unwrap();
    let foreign: Arc<dyn tessera_core::Buffer> = Arc::new(ForeignBuffer(parking_lot::Mutex::new(
        f32_bytes(&[1.5; 1024]),
    )));
    let mut be = dev.init_backend(&BackendOptions::with_threads(1)).unwrap();
    // The copy job must not need the host lock, which the graph queued after it already holds.
    for _ in 0..20 {
        be.copy_async(&foreign, 0, buf.buffer(), 0, 4096).unwrap();
        be.compute(&graph, buf.bindings()).unwrap();
    }
    be.synchronize().unwrap();
    assert_eq!(buf.get_f32(b).unwrap(), vec![3.0; 1024]);
}
