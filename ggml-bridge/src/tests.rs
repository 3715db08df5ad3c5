//! Translation checks without a ggml host: ggml tensors built by hand as ggml's builders would
//! make them, probed on Tessera's CPU device.

use crate::sys;
use crate::translate::supports;
use std::sync::Arc;
use tessera::{DType, Device};

fn cpu() -> Arc<dyn Device> {
    tessera::registry().device("CPU").expect("the CPU device")
}

/// A ggml tensor of `dtype` and shape `ne` with ggml's contiguous strides, computed by `op`
/// from `src` (boxed so that pointers to it stay put).
fn tensor(
    dtype: DType,
    ne: [i64; 4],
    op: sys::ggml_op,
    src: &[*mut sys::ggml_tensor],
) -> Box<sys::ggml_tensor> {
    // SAFETY: ggml_tensor is plain data; all-zero is a valid (empty) tensor.
    let mut t: Box<sys::ggml_tensor> = Box::new(unsafe { std::mem::zeroed() });
    t.type_ = dtype.ggml_type_id();
    t.ne = ne;
    let ne_u = ne.map(|n| n as usize);
    t.nb = tessera_core::tensor::contiguous_strides(dtype, ne_u);
    t.op = op;
    for (i, &s) in src.iter().enumerate() {
        t.src[i] = s;
    }
    t
}

fn ptr(t: &mut sys::ggml_tensor) -> *mut sys::ggml_tensor {
    t
}

fn probe(t: &sys::ggml_tensor) -> Result<(), String> {
    // SAFETY: `t` and its sources live on the caller's stack.
    unsafe { supports(cpu().as_ref(), t) }.map_err(|d| d.to_string())
}

#[test]
fn quantized_mul_mat_and_elementwise_ops_are_accepted() {
    let mut w = tensor(DType::Q8_0, [64, 16, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut x = tensor(DType::F32, [64, 4, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let y = tensor(
        DType::F32,
        [16, 4, 1, 1],
        sys::ggml_op_GGML_OP_MUL_MAT,
        &[ptr(&mut w), ptr(&mut x)],
    );
    probe(&y).unwrap();
    let mut b = tensor(DType::F32, [64, 1, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let add = tensor(
        DType::F32,
        [64, 4, 1, 1],
        sys::ggml_op_GGML_OP_ADD,
        &[ptr(&mut x), ptr(&mut b)],
    );
    probe(&add).unwrap();
    let mut norm = tensor(
        DType::F32,
        [64, 4, 1, 1],
        sys::ggml_op_GGML_OP_RMS_NORM,
        &[ptr(&mut x)],
    );
    norm.op_params[0] = 1e-6f32.to_bits() as i32;
    probe(&norm).unwrap();
    probe(&w).unwrap();
}

#[test]
fn ops_without_a_translation_are_declined_by_name() {
    let mut x = tensor(DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let y = tensor(
        DType::F32,
        [8, 4, 1, 1],
        sys::ggml_op_GGML_OP_POOL_1D,
        &[ptr(&mut x)],
    );
    let e = probe(&y).unwrap_err();
    assert!(e.contains("has no Tessera translation"), "{e}");
    // A unary op Tessera lacks (ABS = 0).
    let mut u = tensor(
        DType::F32,
        [8, 4, 1, 1],
        sys::ggml_op_GGML_OP_UNARY,
        &[ptr(&mut x)],
    );
    u.op_params[0] = 0;
    assert!(probe(&u).unwrap_err().contains("unary op 0"));
    // A dtype Tessera lacks (I64 = 27) as a source.
    let mut ids = tensor(DType::I32, [4, 1, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    ids.type_ = 27;
    let g = tensor(
        DType::F32,
        [8, 4, 1, 1],
        sys::ggml_op_GGML_OP_GET_ROWS,
        &[ptr(&mut x), ptr(&mut ids)],
    );
    assert!(probe(&g).unwrap_err().contains("ggml type 27"));
}

#[test]
fn parameters_outside_the_translation_are_declined_not_guessed() {
    let mut q = tensor(DType::F32, [64, 4, 3, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut pos = tensor(DType::I32, [3, 1, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut r = tensor(
        DType::F32,
        [64, 4, 3, 1],
        sys::ggml_op_GGML_OP_ROPE,
        &[ptr(&mut q), ptr(&mut pos)],
    );
    r.op_params[1] = 64;
    r.op_params[2] = 2; // NEOX
    r.op_params[5] = 10000f32.to_bits() as i32;
    r.op_params[6] = 1f32.to_bits() as i32;
    r.op_params[8] = 1f32.to_bits() as i32;
    probe(&r).unwrap();
    r.op_params[7] = 1f32.to_bits() as i32; // YaRN's ext_factor
    assert!(probe(&r).unwrap_err().contains("YaRN"));
    r.op_params[7] = 0;
    r.op_params[2] = 8; // GGML_ROPE_TYPE_MROPE
    assert!(probe(&r).unwrap_err().contains("rope mode 8"));
}

#[test]
fn views_become_strided_views_of_the_owner_or_are_declined() {
    // A transposed view of a [8, 4] f32 matrix, then CONT of it.
    let mut m = tensor(DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut tr = tensor(
        DType::F32,
        [4, 8, 1, 1],
        sys::ggml_op_GGML_OP_TRANSPOSE,
        &[ptr(&mut m)],
    );
    tr.nb = [32, 4, 128, 128];
    tr.view_src = ptr(&mut m);
    probe(&tr).unwrap();
    let c = tensor(
        DType::F32,
        [4, 8, 1, 1],
        sys::ggml_op_GGML_OP_CONT,
        &[ptr(&mut tr)],
    );
    probe(&c).unwrap();
    // A result whose layout is not what Tessera's op makes: MUL_MAT with a padded output row.
    let mut w = tensor(DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut x = tensor(DType::F32, [8, 2, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut y = tensor(
        DType::F32,
        [4, 2, 1, 1],
        sys::ggml_op_GGML_OP_MUL_MAT,
        &[ptr(&mut w), ptr(&mut x)],
    );
    y.nb = [4, 32, 64, 64];
    let e = probe(&y).unwrap_err();
    assert!(e.contains("strides"), "{e}");
}

#[test]
fn strides_no_tessera_view_expresses_are_declined() {
    // Every other element of each row: rows are not contiguous and no axis order makes them so.
    let mut m = tensor(DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut v = tensor(
        DType::F32,
        [4, 4, 1, 1],
        sys::ggml_op_GGML_OP_VIEW,
        &[ptr(&mut m)],
    );
    v.nb = [8, 32, 128, 128];
    v.view_src = ptr(&mut m);
    let e = probe(&v).unwrap_err();
    assert!(e.contains("not a view Tessera can express"), "{e}");
}

#[test]
fn without_a_ggml_host_the_plugin_stays_out_and_says_why() {
    // This test binary has no ggml: the version check fails with the missing symbol named, and
    // ggml's entry points decline instead of crashing.
    let e = crate::check_version().unwrap_err();
    assert!(e.contains("ggml_version"), "{e}");
    assert!(crate::ggml_backend_init().is_null());
    assert_eq!(crate::ggml_backend_score(), 0);
}

#[test]
fn tessera_devices_get_ggml_names_and_types() {
    let cpu = cpu();
    assert_eq!(crate::registry::ggml_name(cpu.as_ref()), "TesseraCPU");
    // Not CPU: ggml picks its own CPU backend by type.
    assert_eq!(
        crate::registry::ggml_type(cpu.as_ref()),
        sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_IGPU
    );
}

/// A buffer of this plugin on the CPU device, as `buft_alloc_buffer` makes it, behind a ggml
/// buffer of `usage` (boxed so that pointers to both stay put).
fn bridge_buffer(
    size: usize,
    usage: sys::ggml_backend_buffer_usage,
) -> (
    Box<crate::objects::BufferCtx>,
    Box<sys::ggml_backend_buffer>,
) {
    let dev = cpu();
    let mut ctx = Box::new(crate::objects::BufferCtx::new(
        dev.weight_buffer_type().alloc(size).unwrap(),
        crate::weights::has_weight_layout(dev.as_ref()),
        1 << 40,
        size,
        None,
    ));
    // SAFETY: ggml_backend_buffer is plain data; all-zero is a valid (empty) buffer.
    let mut buf: Box<sys::ggml_backend_buffer> = Box::new(unsafe { std::mem::zeroed() });
    buf.context = (&mut *ctx as *mut crate::objects::BufferCtx).cast();
    buf.size = size;
    buf.usage = usage;
    (ctx, buf)
}

#[test]
fn whole_weights_in_a_weights_buffer_take_the_device_layout_and_read_back_as_written() {
    let dev = cpu();
    let (k, rows): (usize, usize) = (256, 64);
    let values: Vec<f32> = (0..k * rows)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0)
        .collect();
    let bytes = tessera::encode_f32(DType::Q4_0, &values).unwrap();
    // Whether this machine's CPU kernels repack Q4_0 at all (AVX-512 VNNI, arm64 dotprod), as
    // the device's weight buffer type says.
    let buft = dev.weight_buffer_type();
    let packs = buft
        .as_any()
        .downcast_ref::<tessera::cpu::CpuBufferType>()
        .expect("the CPU device's weight buffer type")
        .pack_layout(DType::Q4_0)
        .is_some_and(|l| rows.is_multiple_of(l.rows()));
    if !packs {
        println!("skipped in part: the CPU kernels here keep Q4_0 in ggml's layout");
    }
    let weights = sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
    let any = sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_ANY;
    for (usage, want) in [(weights, packs), (any, false)] {
        let (ctx, mut buf) = bridge_buffer(bytes.len(), usage);
        let mut t = tensor(
            DType::Q4_0,
            [k as i64, rows as i64, 1, 1],
            sys::ggml_op_GGML_OP_NONE,
            &[],
        );
        t.data = ctx.base as *mut std::ffi::c_void;
        t.buffer = &mut *buf;
        // SAFETY: `buf` is a buffer of this plugin holding `t`; `bytes` is all of `t`.
        unsafe {
            crate::buffer::buf_set_tensor(
                &mut *buf,
                ptr(&mut t),
                bytes.as_ptr().cast(),
                0,
                bytes.len(),
            )
        };
        assert_eq!(
            ctx.buffer().holds_device_layout(0, bytes.len()),
            want,
            "usage {usage}"
        );
        let mut back = vec![0u8; bytes.len()];
        // SAFETY: as above; `back` holds all of `t`.
        unsafe {
            crate::buffer::buf_get_tensor(
                &mut *buf,
                ptr(&mut t),
                back.as_mut_ptr().cast(),
                0,
                back.len(),
            )
        };
        assert!(
            back == bytes,
            "usage {usage}: ggml reads back other bytes than it wrote"
        );
        // A part of a weight is written as it is, and unpacks what it touches.
        let part = [0x11u8; 18];
        // SAFETY: as above; 18 bytes (one Q4_0 block) inside `t`.
        unsafe {
            crate::buffer::buf_set_tensor(&mut *buf, ptr(&mut t), part.as_ptr().cast(), 0, 18)
        };
        assert!(
            !ctx.buffer().holds_device_layout(0, bytes.len()),
            "usage {usage}"
        );
    }
}

#[test]
fn ops_reading_a_weight_in_the_device_layout_otherwise_are_declined() {
    use crate::weights::misread;
    let mut w = tensor(DType::Q4_0, [64, 16, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut x = tensor(DType::F32, [64, 4, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let wp = ptr(&mut w) as *const sys::ggml_tensor;
    let held = |t: &sys::ggml_tensor| std::ptr::eq(t, wp);
    let check = |t: &sys::ggml_tensor| {
        // SAFETY: the tensors and their sources live on this stack frame.
        unsafe { misread(t, held) }
    };
    let mm = tensor(
        DType::F32,
        [16, 4, 1, 1],
        sys::ggml_op_GGML_OP_MUL_MAT,
        &[ptr(&mut w), ptr(&mut x)],
    );
    assert_eq!(
        check(&mm),
        None,
        "MUL_MAT reads its weight in the device layout"
    );
    let mut ids = tensor(DType::I32, [2, 1, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let rows = tensor(
        DType::F32,
        [64, 2, 1, 1],
        sys::ggml_op_GGML_OP_GET_ROWS,
        &[ptr(&mut w), ptr(&mut ids)],
    );
    assert_eq!(check(&rows), None);
    // The weight as another operand, under another op, or through a view: declined.
    let swapped = tensor(
        DType::F32,
        [4, 16, 1, 1],
        sys::ggml_op_GGML_OP_MUL_MAT,
        &[ptr(&mut x), ptr(&mut w)],
    );
    assert!(check(&swapped).unwrap().contains("source 1"));
    let cpy = tensor(
        DType::F32,
        [64, 16, 1, 1],
        sys::ggml_op_GGML_OP_CPY,
        &[ptr(&mut w)],
    );
    assert!(check(&cpy).is_some());
    let mut view = tensor(
        DType::Q4_0,
        [64, 8, 1, 1],
        sys::ggml_op_GGML_OP_VIEW,
        &[ptr(&mut w)],
    );
    view.view_src = ptr(&mut w);
    assert!(check(&view).unwrap().contains("view"));
    let mm_view = tensor(
        DType::F32,
        [8, 4, 1, 1],
        sys::ggml_op_GGML_OP_MUL_MAT,
        &[ptr(&mut view), ptr(&mut x)],
    );
    assert!(check(&mm_view).is_some());
    // A weight not held in the device layout reads as usual.
    let mut plain = tensor(DType::Q4_0, [64, 16, 1, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let cpy_plain = tensor(
        DType::F32,
        [64, 16, 1, 1],
        sys::ggml_op_GGML_OP_CPY,
        &[ptr(&mut plain)],
    );
    assert_eq!(check(&cpy_plain), None);
}

#[test]
fn a_contiguous_copy_in_another_shape_is_accepted() {
    // llama.cpp's attention output: [d, heads, T] permuted to [d, T, heads]... made contiguous as
    // [d * heads, T] by ggml_cont_2d.
    let mut x = tensor(DType::F32, [16, 4, 3, 1], sys::ggml_op_GGML_OP_NONE, &[]);
    let mut p = tensor(
        DType::F32,
        [16, 3, 4, 1],
        sys::ggml_op_GGML_OP_PERMUTE,
        &[ptr(&mut x)],
    );
    p.nb = [4, 64 * 4, 16 * 4, 16 * 4 * 4 * 3];
    p.view_src = ptr(&mut x);
    let c = tensor(
        DType::F32,
        [48, 4, 1, 1],
        sys::ggml_op_GGML_OP_CONT,
        &[ptr(&mut p)],
    );
    probe(&c).unwrap();
    // A shape of another element count is still declined.
    let bad = tensor(
        DType::F32,
        [40, 4, 1, 1],
        sys::ggml_op_GGML_OP_CONT,
        &[ptr(&mut p)],
    );
    assert!(probe(&bad).is_err());
}
