//! The CPU weight buffer type's packed layouts: everything a user can observe stays as with a
//! plain buffer (bytes read back, copies, MUL_MAT and GET_ROWS results within rounding), and a
//! graph that would misread a packed weight is refused. Which types pack, and how, depends on
//! the kernel level (16-row groups with AVX-512 VNNI, 4-row groups with aarch64 dotprod or
//! i8mm); under `TESSERA_CPU_ISA` or on a CPU without those the plain layout is checked.

use tessera_core::{BackendOptions, Context, DType, Device, Error, TensorBuffer, TensorId};
use tessera_cpu::{CpuBufferType, CpuDevice};

/// Every quantized type MUL_MAT takes; each packs where its buffer type has a layout for it.
const QUANTIZED: [DType; 13] = [
    DType::Q8_0,
    DType::Q4_0,
    DType::Q5_0,
    DType::Q4_1,
    DType::Q5_1,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::IQ4_NL,
    DType::Q2_K,
    DType::Q3_K,
    DType::IQ4_XS,
    DType::MXFP4,
];
const K: usize = 512;
const ROWS: usize = 48;

/// `values` quantized row by row (rows of `K` elements) with ggml's reference quantizers.
fn encode(dtype: DType, values: &[f32]) -> Result<Vec<u8>, String> {
    use tessera_kernels::cpu as k;
    let f: fn(&[f32], &mut [u8]) = match dtype {
        DType::Q8_0 => k::quantize_row_q8_0,
        DType::Q4_0 => k::quantize_row_q4_0,
        DType::Q5_0 => k::quantize_row_q5_0,
        DType::Q4_1 => k::quantize_row_q4_1,
        DType::Q5_1 => k::quantize_row_q5_1,
        DType::Q4_K => k::quantize_row_q4_k,
        DType::Q5_K => k::quantize_row_q5_k,
        DType::Q6_K => k::quantize_row_q6_k,
        DType::Q2_K => k::quantize_row_q2_k,
        DType::Q3_K => k::quantize_row_q3_k,
        DType::IQ4_NL => k::quantize_row_iq4_nl,
        DType::IQ4_XS => k::quantize_row_iq4_xs,
        DType::MXFP4 => k::quantize_row_mxfp4,
        d => return Err(format!("no quantizer for {d}")),
    };
    let rb = K / dtype.block_size() * dtype.type_size();
    let mut out = vec![0u8; values.len() / K * rb];
    for (s, d) in values.chunks_exact(K).zip(out.chunks_exact_mut(rb)) {
        f(s, d);
    }
    Ok(out)
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0) * (1 + i % 5) as f32)
        .collect()
}

/// Whether this machine's weight buffers pack (AVX-512 VNNI or aarch64 dotprod, and not opted
/// out); the tests print why they check less when they do not.
fn packs(dev: &CpuDevice) -> bool {
    let buft = dev.weight_buffer_type();
    let packs = buft
        .as_any()
        .downcast_ref::<CpuBufferType>()
        .is_some_and(|b| b.packs());
    if !packs {
        eprintln!(
            "note: weight buffers do not pack on this CPU (or TESSERA_CPU_REPACK=0): the plain layout is checked instead"
        );
    }
    packs
}

/// Whether this machine's weight buffers pack `dtype`.
fn packs_type(dev: &CpuDevice, dtype: DType) -> bool {
    let buft = dev.weight_buffer_type();
    buft.as_any()
        .downcast_ref::<CpuBufferType>()
        .is_some_and(|b| b.pack_layout(dtype).is_some())
}

struct Case {
    ctx: Context,
    w: TensorId,
    x: TensorId,
    ids: TensorId,
    mm: TensorId,
    rows: TensorId,
}

fn case(dtype: DType, n: usize) -> Case {
    let mut ctx = Context::new();
    let w = ctx.new_named("w", dtype, [K, ROWS]).unwrap();
    let x = ctx.new_named("x", DType::F32, [K, n]).unwrap();
    let ids = ctx.new_named("ids", DType::I32, [3]).unwrap();
    let mm = ctx.mul_mat(w, x).unwrap();
    let rows = ctx.get_rows(w, ids).unwrap();
    Case {
        ctx,
        w,
        x,
        ids,
        mm,
        rows,
    }
}

/// Runs MUL_MAT and GET_ROWS with the weight in `buf`; returns both outputs.
fn run(dev: &CpuDevice, c: &Case, buf: &TensorBuffer, n: usize) -> (Vec<f32>, Vec<f32>) {
    let w_bytes = encode(c.ctx.tensor(c.w).unwrap().dtype(), &values(K * ROWS, 1)).unwrap();
    buf.set(c.w, &w_bytes).unwrap();
    buf.set_f32(c.x, &values(K * n, 2)).unwrap();
    buf.set_i32(c.ids, &[0, 17, 47]).unwrap();
    let graph = c.ctx.build_forward_multi(&[c.mm, c.rows]).unwrap();
    let mut be = dev.init_backend(&BackendOptions::with_threads(2)).unwrap();
    be.compute(&graph, buf.bindings()).unwrap();
    be.synchronize().unwrap();
    (buf.get_f32(c.mm).unwrap(), buf.get_f32(c.rows).unwrap())
}

#[test]
fn packed_weights_give_the_plain_results_and_read_back_as_written() {
    let dev = CpuDevice::new("CPU", vec![]);
    packs(&dev);
    for dtype in QUANTIZED.into_iter().filter(|&d| packs_type(&dev, d)) {
        for n in [1, 2, 5, 70] {
            let c = case(dtype, n);
            let plain = dev.buffer_type().alloc_tensors(&c.ctx).unwrap();
            let packed = dev.weight_buffer_type().alloc_tensors(&c.ctx).unwrap();
            let (want_mm, want_rows) = run(&dev, &c, &plain, n);
            let (got_mm, got_rows) = run(&dev, &c, &packed, n);
            // Dequantized rows are the same bytes decoded: exact. Products differ only in the
            // f32 summation order: max-abs within 1e-5 of the largest output.
            assert_eq!(got_rows, want_rows, "{dtype} GET_ROWS");
            let scale = want_mm.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = want_mm
                .iter()
                .zip(&got_mm)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                err <= 1e-5 * scale,
                "{dtype} n={n}: max-abs {err}, scale {scale}"
            );

            // Reading the weight back gives the bytes written, whole and in pieces that cut
            // groups and blocks.
            let w_bytes = encode(dtype, &values(K * ROWS, 1)).unwrap();
            let mut back = vec![0u8; w_bytes.len()];
            packed.get(c.w, &mut back).unwrap();
            assert_eq!(back, w_bytes, "{dtype}: read back");
            let mut piece = vec![0u8; 1000.min(w_bytes.len() - 37)];
            packed.get_at(c.w, 37, &mut piece).unwrap();
            assert_eq!(
                piece,
                w_bytes[37..37 + piece.len()],
                "{dtype}: partial read"
            );
            {
                let cpu = packed
                    .buffer()
                    .as_any()
                    .downcast_ref::<tessera_cpu::CpuBuffer>()
                    .unwrap();
                assert_eq!(cpu.packed_tensors(), 1, "{dtype}: the weight is packed");
                let mut raw = vec![0u8; w_bytes.len()];
                let slot = packed.bindings().slot(c.w).unwrap();
                // Copying out through another buffer also sees ggml's bytes.
                let other = dev.buffer_type().alloc(w_bytes.len()).unwrap();
                assert!(
                    other
                        .copy_from(packed.buffer().as_ref(), slot.offset, 0, w_bytes.len())
                        .unwrap()
                );
                other.read(0, &mut raw).unwrap();
                assert_eq!(raw, w_bytes, "{dtype}: copy out");
            }
        }
    }
}

#[test]
fn weights_without_a_packed_layout_stay_plain() {
    let dev = CpuDevice::new("CPU", vec![]);
    for dtype in QUANTIZED.into_iter().filter(|&d| !packs_type(&dev, d)) {
        let n = 5;
        let c = case(dtype, n);
        let plain = dev.buffer_type().alloc_tensors(&c.ctx).unwrap();
        let weights = dev.weight_buffer_type().alloc_tensors(&c.ctx).unwrap();
        // Same bytes, same kernels: identical results.
        assert_eq!(
            run(&dev, &c, &weights, n),
            run(&dev, &c, &plain, n),
            "{dtype}"
        );
        let cpu = weights
            .buffer()
            .as_any()
            .downcast_ref::<tessera_cpu::CpuBuffer>()
            .unwrap();
        assert_eq!(cpu.packed_tensors(), 0, "{dtype}: nothing is packed");
        let w_bytes = encode(dtype, &values(K * ROWS, 1)).unwrap();
        let mut back = vec![0u8; w_bytes.len()];
        weights.get(c.w, &mut back).unwrap();
        assert_eq!(back, w_bytes, "{dtype}: read back");
    }
}

#[test]
fn a_partial_write_unpacks_the_weight_and_results_follow_the_new_bytes() {
    let dev = CpuDevice::new("CPU", vec![]);
    packs(&dev);
    for dtype in [DType::Q4_1, DType::Q4_0, DType::IQ4_NL] {
        partial_write(&dev, dtype);
    }
}

fn partial_write(dev: &CpuDevice, dtype: DType) {
    let n = 3;
    let c = case(dtype, n);
    let packed = dev.weight_buffer_type().alloc_tensors(&c.ctx).unwrap();
    let plain = dev.buffer_type().alloc_tensors(&c.ctx).unwrap();
    run(dev, &c, &packed, n);
    run(dev, &c, &plain, n);
    // Overwrite row 20 with other values in both buffers.
    let row = encode(dtype, &values(K, 9)).unwrap();
    for b in [&packed, &plain] {
        b.set_at(c.w, 20 * row.len(), &row).unwrap();
    }
    let mut a = vec![0u8; ROWS * row.len()];
    let mut b = vec![0u8; ROWS * row.len()];
    packed.get(c.w, &mut a).unwrap();
    plain.get(c.w, &mut b).unwrap();
    assert_eq!(a, b);
    let cpu = packed
        .buffer()
        .as_any()
        .downcast_ref::<tessera_cpu::CpuBuffer>()
        .unwrap();
    assert_eq!(
        cpu.packed_tensors(),
        0,
        "{dtype}: the write unpacked the weight"
    );
    let graph = c.ctx.build_forward_multi(&[c.mm, c.rows]).unwrap();
    let mut be = dev.init_backend(&BackendOptions::with_threads(1)).unwrap();
    for buf in [&packed, &plain] {
        be.compute(&graph, buf.bindings()).unwrap();
    }
    be.synchronize().unwrap();
    let (ga, gb) = (packed.get_f32(c.mm).unwrap(), plain.get_f32(c.mm).unwrap());
    let scale = gb.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = ga
        .iter()
        .zip(&gb)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(err <= 1e-5 * scale, "{dtype}: max-abs {err}, scale {scale}");
}

#[test]
fn a_graph_that_would_misread_a_packed_weight_is_refused() {
    let dev = CpuDevice::new("CPU", vec![]);
    if !packs(&dev) {
        eprintln!("skipped: nothing is packed here, so nothing can be misread");
        return;
    }
    let mut ctx = Context::new();
    let w = ctx.new_named("w", DType::Q8_0, [K, ROWS]).unwrap();
    let dst = ctx.new_named("dst", DType::Q8_0, [K, ROWS]).unwrap();
    let copy = ctx.cpy(w, dst).unwrap();
    let graph = ctx.build_forward(copy).unwrap();
    let buf = dev.weight_buffer_type().alloc_tensors(&ctx).unwrap();
    buf.set(w, &encode(DType::Q8_0, &values(K * ROWS, 3)).unwrap())
        .unwrap();
    let mut be = dev.init_backend(&BackendOptions::with_threads(1)).unwrap();
    let err = be.compute(&graph, buf.bindings()).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("'w'") || msg.contains("w"), "{msg}");
    assert!(msg.contains("CPY") && msg.contains("packed"), "{msg}");
}

#[test]
fn neighbouring_weights_and_weights_uploaded_in_pieces_stay_usable() {
    // Two weights of one type and row length side by side (their packed ranges merge), and a
    // third uploaded 16 rows at a time: each must still multiply as the plain weights do.
    let dev = CpuDevice::new("CPU", vec![]);
    packs(&dev);
    for dtype in [DType::Q5_0, DType::Q4_0, DType::Q4_K] {
        neighbours(&dev, dtype);
    }
}

fn neighbours(dev: &CpuDevice, dtype: DType) {
    let packing = packs_type(dev, dtype);
    let mut ctx = Context::new();
    let w: Vec<TensorId> = (0..3)
        .map(|i| ctx.new_named(&format!("w{i}"), dtype, [K, ROWS]).unwrap())
        .collect();
    let x = ctx.new_named("x", DType::F32, [K, 2]).unwrap();
    let outs: Vec<TensorId> = w.iter().map(|&wi| ctx.mul_mat(wi, x).unwrap()).collect();
    let graph = ctx.build_forward_multi(&outs).unwrap();
    let mut be = dev.init_backend(&BackendOptions::with_threads(2)).unwrap();
    let mut results = Vec::new();
    for buft in [dev.buffer_type(), dev.weight_buffer_type()] {
        let buf = buft.alloc_tensors(&ctx).unwrap();
        for (i, &wi) in w.iter().enumerate() {
            let bytes = encode(dtype, &values(K * ROWS, 10 + i)).unwrap();
            if i == 2 {
                let rb = bytes.len() / ROWS;
                for r0 in (0..ROWS).step_by(16) {
                    buf.set_rows(wi, r0, &bytes[r0 * rb..(r0 + 16) * rb])
                        .unwrap();
                }
            } else {
                buf.set(wi, &bytes).unwrap();
            }
        }
        buf.set_f32(x, &values(K * 2, 4)).unwrap();
        be.compute(&graph, buf.bindings()).unwrap();
        be.synchronize().unwrap();
        if packing
            && buft
                .as_any()
                .downcast_ref::<CpuBufferType>()
                .unwrap()
                .packs()
        {
            let cpu = buf
                .buffer()
                .as_any()
                .downcast_ref::<tessera_cpu::CpuBuffer>()
                .unwrap();
            assert!(cpu.packed_tensors() >= 1, "the weights are packed");
        }
        results.push(
            outs.iter()
                .map(|&o| buf.get_f32(o).unwrap())
                .collect::<Vec<_>>(),
        );
    }
    for (i, (a, b)) in results[0].iter().zip(&results[1]).enumerate() {
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = a.iter().zip(b).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(
            err <= 1e-5 * scale,
            "{dtype} w{i}: max-abs {err}, scale {scale}"
        );
    }
}

#[test]
fn a_copy_queued_into_a_packed_weight_is_seen_by_the_graph_queued_after_it() {
    // copy_async then compute on one stream, no synchronisation between: the graph must read
    // the copied ggml bytes, not run the packed kernel over them.
    let dev = CpuDevice::new("CPU", vec![]);
    packs(&dev);
    let c = case(DType::Q8_0, 3);
    let packed = dev.weight_buffer_type().alloc_tensors(&c.ctx).unwrap();
    let plain = dev.buffer_type().alloc_tensors(&c.ctx).unwrap();
    run(&dev, &c, &packed, 3);
    let new_w = encode(DType::Q8_0, &values(K * ROWS, 77)).unwrap();
    let staging = dev.buffer_type().alloc(new_w.len()).unwrap();
    staging.write(0, &new_w).unwrap();
    plain.set(c.w, &new_w).unwrap();
    plain.set_f32(c.x, &values(K * 3, 2)).unwrap();
    plain.set_i32(c.ids, &[0, 17, 47]).unwrap();
    let graph = c.ctx.build_forward_multi(&[c.mm, c.rows]).unwrap();
    let slot = packed.bindings().slot(c.w).unwrap().clone();
    let mut be = dev.init_backend(&BackendOptions::with_threads(2)).unwrap();
    be.copy_async(&staging, 0, &slot.buffer, slot.offset, new_w.len())
        .unwrap();
    be.compute(&graph, packed.bindings()).unwrap();
    be.compute(&graph, plain.bindings()).unwrap();
    be.synchronize().unwrap();
    assert_eq!(
        packed.get_f32(c.rows).unwrap(),
        plain.get_f32(c.rows).unwrap()
    );
    let (a, b) = (packed.get_f32(c.mm).unwrap(), plain.get_f32(c.mm).unwrap());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(err <= 1e-5 * scale, "max-abs {err}, scale {scale}");
    let mut back = vec![0u8; new_w.len()];
    packed.get(c.w, &mut back).unwrap();
    assert_eq!(back, new_w);
}
