//! The plugin graph codec: what a backend plugin receives across the C ABI. Raw descriptor
//! tables are built from fuzz bytes (with name pointers that are valid, as the ABI promises,
//! but arbitrary bytes behind them) and decoded; a decoded graph goes where a plugin sends it
//! (the CPU device's `supports_op` for every node, the buffer type's `alloc_size` for every
//! tensor) and must survive an encode/decode round trip unchanged.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::TensorId;
use tessera::plugin::FlatGraph;
use tessera::plugin::abi::{NO_TENSOR, RawGraph, RawOp, RawStr, RawTensor};
use tessera::plugin::codec::{decode_graph, decode_op, encode_op};

#[derive(Arbitrary, Debug)]
struct FTensor {
    dtype: u8,
    flags: u8,
    kind: u8,
    sub: u8,
    ints: [u16; 4],
    big_int: Option<(u8, u64)>,
    floats: [f32; 4],
    ne: [u8; 4],
    nb: Option<[u32; 4]>,
    huge: Option<(u8, u64)>,
    src: [Option<u8>; 5],
    view_src: Option<u8>,
    view_offset: u32,
    name: Vec<u8>,
    null_name: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    tensors: Vec<FTensor>,
    nodes: Vec<u16>,
    leafs: Vec<u16>,
    outputs: Vec<u16>,
    raw_op: ([u8; 2], [u64; 4], [f32; 4]),
}

fn idx(v: Option<u8>) -> u32 {
    v.map_or(NO_TENSOR, u32::from)
}

fn raw_tensor(t: &FTensor) -> RawTensor {
    let mut ints = t.ints.map(u64::from);
    if let Some((i, v)) = t.big_int {
        ints[usize::from(i) % 4] = v;
    }
    let ne = t.ne.map(u64::from);
    // Contiguous-looking strides by default; arbitrary ones when given.
    let nb = match t.nb {
        Some(nb) => nb.map(u64::from),
        None => {
            let mut nb = [4u64; 4];
            for d in 1..4 {
                nb[d] = nb[d - 1].saturating_mul(ne[d - 1].max(1));
            }
            nb
        }
    };
    let (mut ne, mut nb) = (ne, nb);
    if let Some((i, v)) = t.huge {
        let d = usize::from(i) % 8;
        if d < 4 { ne[d] = v } else { nb[d - 4] = v }
    }
    RawTensor {
        dtype: u32::from(t.dtype % 48),
        flags: u32::from(t.flags),
        op: RawOp {
            kind: u32::from(t.kind % 40),
            sub: u32::from(t.sub % 12),
            ints,
            floats: t.floats,
        },
        ne,
        nb,
        src: t.src.map(idx),
        view_src: idx(t.view_src),
        view_offset: u64::from(t.view_offset),
        name: if t.null_name && t.name.is_empty() {
            RawStr {
                ptr: std::ptr::null(),
                len: 0,
            }
        } else {
            RawStr {
                ptr: t.name.as_ptr(),
                len: t.name.len(),
            }
        },
    }
}

fuzz_target!(|inp: Input| {
    let ([kind, sub], ints, floats) = inp.raw_op;
    let op = RawOp {
        kind: u32::from(kind),
        sub: u32::from(sub),
        ints,
        floats,
    };
    if let Ok(decoded) = decode_op(&op, "fuzz op") {
        let again = decode_op(&encode_op(&decoded), "fuzz op").expect("re-encoded op decodes");
        assert_eq!(format!("{decoded:?}"), format!("{again:?}"));
    }

    // `inp.tensors` outlives every table below, so every name pointer is readable during the
    // calls, as the ABI requires of the host.
    let table: Vec<RawTensor> = inp.tensors.iter().map(raw_tensor).collect();
    let list = |v: &[u16]| v.iter().map(|&i| u32::from(i)).collect::<Vec<u32>>();
    let (nodes, leafs, outputs) = (list(&inp.nodes), list(&inp.leafs), list(&inp.outputs));
    let raw = RawGraph {
        tensors: if table.is_empty() {
            std::ptr::null()
        } else {
            table.as_ptr()
        },
        n_tensors: table.len(),
        nodes: nodes.as_ptr(),
        n_nodes: nodes.len(),
        leafs: leafs.as_ptr(),
        n_leafs: leafs.len(),
        outputs: outputs.as_ptr(),
        n_outputs: outputs.len(),
    };
    // SAFETY: every pointer of `raw` is readable for its length while `table`, the lists and
    // `inp` live, which is until the end of this closure.
    let Ok(graph) = (unsafe { decode_graph(&raw) }) else {
        return;
    };
    let dev = tessera::registry().device("CPU").expect("the CPU device");
    let buft = dev.buffer_type();
    for (i, t) in graph.tensors().iter().enumerate() {
        let _ = buft.alloc_size(t);
        let _ = dev.supports_op(graph.tensors(), TensorId::from_index(i));
    }
    for &n in graph.nodes() {
        let _ = dev.supports_op(graph.tensors(), n);
    }
    let flat = FlatGraph::from_graph(&graph);
    // SAFETY: `flat` borrows from `graph`, both alive for the call.
    let again = unsafe { decode_graph(&flat.raw()) }.expect("a re-encoded graph decodes");
    assert_eq!(
        format!("{:?}", graph.tensors()),
        format!("{:?}", again.tensors())
    );
    assert_eq!(graph.nodes(), again.nodes());
    assert_eq!(graph.leafs(), again.leafs());
    assert_eq!(graph.outputs(), again.outputs());
});
