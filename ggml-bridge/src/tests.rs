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
    t.nb = tessera::tensor::contiguous_strides(dtype, ne_u);
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
