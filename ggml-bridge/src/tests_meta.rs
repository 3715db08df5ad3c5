//! The meta device offered to ggml (`TESSERA_GGML_SPLIT`), without a ggml host: staged buffers
//! sealed with the policy learned from a graph, refused reads of values not written back, the
//! exported thread-count function, and configuration errors.

use crate::meta_device;
use crate::objects::BufferCtx;
use crate::objects::{Lost, MetaCtx};
use crate::sys;
use std::ffi::c_void;
use tessera::DType;
use tessera::meta::{MetaBuffer, SplitKind};

/// A ggml tensor of `dtype` and shape `ne`, contiguous, named `name`.
fn tensor(name: &str, dtype: DType, ne: [i64; 4], op: sys::ggml_op) -> Box<sys::ggml_tensor> {
    // SAFETY: ggml_tensor is plain data; all-zero is a valid (empty) tensor.
    let mut t: Box<sys::ggml_tensor> = Box::new(unsafe { std::mem::zeroed() });
    t.type_ = dtype.ggml_type_id();
    t.ne = ne;
    t.nb = tessera_core::tensor::contiguous_strides(dtype, ne.map(|n| n as usize));
    t.op = op;
    for (d, c) in t.name.iter_mut().zip(name.bytes()) {
        *d = c as std::ffi::c_char;
    }
    t
}

/// A staged buffer of `meta` of `size` bytes at ggml address `base`, as ggml would hold it with
/// `usage`, listed as pending (boxed: each points at the other).
fn staged_buffer(
    meta: &'static MetaCtx,
    size: usize,
    base: usize,
    usage: sys::ggml_backend_buffer_usage,
) -> (Box<BufferCtx>, Box<sys::ggml_backend_buffer>) {
    let first = meta.device.devices()[0].clone();
    let ctx = Box::new(BufferCtx::new(
        first.buffer_type().alloc(size).unwrap(),
        false,
        base,
        size,
        Some(meta),
    ));
    // SAFETY: ggml_backend_buffer is plain data; all-zero is a valid (empty) buffer.
    let mut buf: Box<sys::ggml_backend_buffer> = Box::new(unsafe { std::mem::zeroed() });
    buf.context = (&*ctx as *const BufferCtx).cast_mut().cast();
    buf.size = size;
    buf.usage = usage;
    ctx.stage.as_ref().unwrap().lock().ggml = &*buf as *const _ as usize;
    meta.add_pending(ctx.key());
    (ctx, buf)
}

fn meta_over_two_cpus() -> &'static MetaCtx {
    Box::leak(Box::new(
        meta_device::build("cpu:2", "").expect("two CPU devices"),
    ))
}

/// The ROPE nodes of one llama layer with `heads` query and `kv` KV heads of `hd` (boxed: the
/// graph's pointers to them must stay put).
#[allow(clippy::vec_box)]
fn ropes(hd: i64, heads: i64, kv: i64) -> Vec<Box<sys::ggml_tensor>> {
    vec![
        tensor(
            "Qcur-0",
            DType::F32,
            [hd, heads, 3, 1],
            sys::ggml_op_GGML_OP_ROPE,
        ),
        tensor(
            "Kcur-0",
            DType::F32,
            [hd, kv, 3, 1],
            sys::ggml_op_GGML_OP_ROPE,
        ),
    ]
}

#[test]
fn a_staged_buffer_is_sealed_split_by_the_learned_policy_and_reads_back_as_written() {
    let meta = meta_over_two_cpus();
    let (hd, heads, kv, embd) = (16i64, 4i64, 2i64, 64i64);
    let mut tensors = [
        tensor(
            "blk.0.attn_q.weight",
            DType::F32,
            [embd, hd * heads, 1, 1],
            sys::ggml_op_GGML_OP_NONE,
        ),
        tensor(
            "blk.0.attn_k.weight",
            DType::F32,
            [embd, hd * kv, 1, 1],
            sys::ggml_op_GGML_OP_NONE,
        ),
        tensor(
            "blk.0.attn_norm.weight",
            DType::F32,
            [embd, 1, 1, 1],
            sys::ggml_op_GGML_OP_NONE,
        ),
    ];
    let size: usize = tensors.iter().map(|t| t.nb[3] * t.ne[3] as usize).sum();
    let weights = sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
    let (ctx, mut buf) = staged_buffer(meta, size, 1 << 41, weights);

    let mut at = 0;
    let mut written = Vec::new();
    for (i, t) in tensors.iter_mut().enumerate() {
        let bytes = t.nb[3] * t.ne[3] as usize;
        t.data = (ctx.base + at) as *mut c_void;
        t.buffer = &mut *buf;
        // SAFETY: `t` lies in `buf`, whose context is `ctx`.
        unsafe { meta_device::record(&ctx, &**t) };
        let values: Vec<f32> = (0..bytes / 4).map(|v| (v * 7 + i) as f32).collect();
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // SAFETY: as above; `data` is all of `t`.
        unsafe {
            crate::buffer::buf_set_tensor(&mut *buf, &mut **t, data.as_ptr().cast(), 0, bytes)
        };
        written.push(data);
        at += bytes;
    }

    // The graph (one layer's rotations) reaches the buffer through the weight its first node
    // reads, and shows the attention's shape.
    let mut nodes = ropes(hd, heads, kv);
    nodes[0].src[0] = &mut *tensors[0];
    let ptrs: Vec<*mut sys::ggml_tensor> = nodes.iter_mut().map(|n| &mut **n as *mut _).collect();
    // SAFETY: the nodes and what they reach live on this frame; `ctx` is pending and live.
    assert!(unsafe { meta_device::seal(meta, &ptrs) }.unwrap());
    let sealed = ctx.buffer();
    let mb = sealed
        .as_any()
        .downcast_ref::<MetaBuffer>()
        .expect("sealed into a meta buffer");
    let state = |name: &str| {
        mb.placements()
            .iter()
            .find(|p| p.desc.name() == name)
            .map(|p| p.state.clone())
            .unwrap_or_else(|| panic!("{name} placed"))
    };
    assert_eq!(state("blk.0.attn_q.weight").kind(), SplitKind::Axis(1));
    assert_eq!(state("blk.0.attn_q.weight").local_lens(), vec![32, 32]);
    assert_eq!(state("blk.0.attn_k.weight").local_lens(), vec![16, 16]);
    assert!(state("blk.0.attn_norm.weight").is_mirrored());
    for (t, want) in tensors.iter_mut().zip(&written) {
        let mut back = vec![0u8; want.len()];
        // SAFETY: as above.
        unsafe {
            crate::buffer::buf_get_tensor(&mut *buf, &**t, back.as_mut_ptr().cast(), 0, back.len())
        };
        assert!(&back == want, "a sealed tensor reads back what ggml wrote");
    }
    // Sealed once: a second graph finds nothing pending.
    // SAFETY: as above.
    assert!(!unsafe { meta_device::seal(meta, &ptrs) }.unwrap());
    meta.forget(ctx.key());
}

#[test]
fn a_graph_without_attention_seals_with_every_tensor_mirrored() {
    let meta = meta_over_two_cpus();
    let mut w = tensor(
        "blk.0.attn_q.weight",
        DType::F32,
        [8, 8, 1, 1],
        sys::ggml_op_GGML_OP_NONE,
    );
    let size = 256;
    let any = sys::ggml_backend_buffer_usage_GGML_BACKEND_BUFFER_USAGE_ANY;
    let (ctx, mut buf) = staged_buffer(meta, size, 1 << 42, any);
    w.data = ctx.base as *mut c_void;
    w.buffer = &mut *buf;
    // SAFETY: `w` lies in `buf`.
    unsafe { meta_device::record(&ctx, &*w) };
    let mut add = tensor("x", DType::F32, [8, 8, 1, 1], sys::ggml_op_GGML_OP_ADD);
    add.src[0] = &mut *w;
    add.src[1] = &mut *w;
    // SAFETY: as above.
    assert!(unsafe { meta_device::seal(meta, &[&mut *add]) }.unwrap());
    let sealed = ctx.buffer();
    let mb = sealed.as_any().downcast_ref::<MetaBuffer>().unwrap();
    assert!(mb.placements()[0].state.is_mirrored());
    meta.forget(ctx.key());
}

#[test]
fn values_the_meta_device_did_not_write_back_are_refused_by_name() {
    let meta = meta_over_two_cpus();
    let lost = |start, label: &str| Lost {
        buf: 7,
        start,
        end: start + 100,
        label: label.into(),
    };
    meta.set_lost(1, &[lost(100, "ADD 'ffn_inp-3'")], &[]);
    assert!(meta.check_read(7, 200, 300).is_ok(), "after the range");
    assert!(meta.check_read(8, 150, 160).is_ok(), "another buffer");
    // Another part of the graph keeps what the first lost, except where it wrote.
    meta.set_lost(2, &[lost(400, "MUL 'norm-3'")], &[(7, 0, 50)]);
    assert!(!meta.keep_all());
    let err = meta.check_read(7, 150, 160).unwrap_err();
    assert!(err.contains("ffn_inp-3"), "{err}");
    assert!(meta.check_read(7, 450, 460).unwrap_err().contains("norm-3"));
    // A refused read makes every later graph keep every value.
    assert!(meta.keep_all());
    // ggml writing a range (an input copied in) replaces the lost value there.
    meta.rewritten(7, 90, 210);
    assert!(meta.check_read(7, 150, 160).is_ok());
    // The same part again (a decode loop) replaces its own list.
    meta.set_lost(2, &[lost(600, "SCALE 'x'")], &[]);
    assert!(meta.check_read(7, 450, 460).is_ok());
    assert!(meta.check_read(7, 650, 660).is_err());
}

#[test]
fn bad_device_lists_and_shares_are_errors_naming_the_variable() {
    let err = meta_device::build("nosuchkind:2", "").err().unwrap();
    assert!(err.contains(meta_device::SPLIT_ENV), "{err}");
    let err = meta_device::build("cpu:2", "1,2,3").err().unwrap();
    assert!(err.contains(meta_device::RATIOS_ENV), "{err}");
    let ok = meta_device::build("cpu:2", "3,1").unwrap();
    assert_eq!(ok.device.devices().len(), 2);
}

#[test]
fn the_thread_count_function_is_found_by_name() {
    // SAFETY: the registry argument is unused; the names are NUL-terminated.
    unsafe {
        let f = crate::registry::reg_get_proc_address(
            std::ptr::null_mut(),
            c"ggml_backend_set_n_threads".as_ptr(),
        );
        assert!(!f.is_null());
        let none = crate::registry::reg_get_proc_address(
            std::ptr::null_mut(),
            c"ggml_backend_comm_init".as_ptr(),
        );
        assert!(none.is_null());
    }
}

#[test]
fn a_part_keeps_its_unread_results_ggml_outputs_and_what_unread_views_show() {
    use crate::translate::kept_nodes;
    let mut a = tensor("a", DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_NONE);
    let mut b = tensor("b", DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_ADD);
    b.src[0] = &mut *a;
    b.src[1] = &mut *a;
    let mut c = tensor("c", DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_MUL);
    c.src[0] = &mut *b;
    c.src[1] = &mut *b;
    let mut d = tensor("d", DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_SCALE);
    d.src[0] = &mut *c;
    let mut e = tensor("e", DType::F32, [8, 4, 1, 1], sys::ggml_op_GGML_OP_SCALE);
    e.src[0] = &mut *d;
    // `v` views `b` and nothing here reads it; `d` is read (by `e`) but flagged as an output.
    let mut v = tensor("v", DType::F32, [8, 2, 1, 1], sys::ggml_op_GGML_OP_VIEW);
    v.src[0] = &mut *b;
    v.view_src = &mut *b;
    d.flags = sys::ggml_tensor_flag_GGML_TENSOR_FLAG_OUTPUT as i32;
    let nodes: Vec<*mut sys::ggml_tensor> = vec![&mut *b, &mut *c, &mut *d, &mut *e, &mut *v];
    // SAFETY: every tensor lives on this frame.
    let kept = unsafe { kept_nodes(&nodes) };
    let has = |t: &sys::ggml_tensor| kept.contains(&(t as *const sys::ggml_tensor));
    assert!(has(&e), "a result nothing reads");
    assert!(has(&d), "ggml's output");
    assert!(has(&v) && has(&b), "an unread view and the tensor it shows");
    assert!(!has(&c), "a value read inside the part only");
}
