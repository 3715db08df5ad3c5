//! Non-finite values in a step: where the first NaN or infinity of a graph comes from.
//!
//! Sessions with `check_finite` on run each step's [`Graph::with_all_outputs`] (no node's
//! memory is reused), read every node back in execution order and report the first whose value
//! holds a NaN or infinity, so the error names the op that produced it rather than the logits
//! it reached (or did not reach: activations quantized to Q8_0 for a matmul turn NaN into 0).

use tessera::ops::OpKind;
use tessera::{DType, Error, Graph, Result, TensorDesc, TensorId};

/// The first non-finite value of `values`: its index and value.
pub fn first_non_finite(values: &[f32]) -> Option<(usize, f32)> {
    values
        .iter()
        .position(|v| !v.is_finite())
        .map(|i| (i, values[i]))
}

/// A node whose value holds a NaN or infinity.
#[derive(Clone, Debug)]
pub(crate) struct NonFiniteNode {
    pub(crate) id: TensorId,
    pub(crate) index: usize,
    pub(crate) value: f32,
}

/// Whether a node's value is worth reading: float results computed by the node itself
/// (views compute nothing and are checked where their data is produced).
fn checked(t: &TensorDesc) -> bool {
    matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && !t.op().kind().is_view()
        && t.op().kind() != OpKind::None
        && t.is_contiguous()
}

/// The first node of `graph`, in execution order, whose value (read by `read`) is not finite.
///
/// # Errors
/// Whatever `read` returns.
pub(crate) fn first_non_finite_node(
    graph: &Graph,
    mut read: impl FnMut(TensorId, &TensorDesc) -> Result<Vec<u8>>,
) -> Result<Option<NonFiniteNode>> {
    for &id in graph.nodes() {
        let t = graph.tensor(id)?;
        if !checked(t) {
            continue;
        }
        let bytes = read(id, t)?;
        let values = tessera::decode_to_f32(t.dtype(), &bytes)?;
        if let Some((index, value)) = first_non_finite(&values) {
            return Ok(Some(NonFiniteNode { id, index, value }));
        }
    }
    Ok(None)
}

/// The error naming `found`, the first node of `graph` producing a non-finite value.
pub(crate) fn non_finite_error(
    device: String,
    graph: &Graph,
    found: &NonFiniteNode,
    n_tokens: usize,
    n_past: usize,
) -> Error {
    let (op, srcs) = graph.tensor(found.id).map_or(("?", String::new()), |t| {
        let srcs: Vec<String> = t.srcs().map(|s| graph.label(s)).collect();
        (t.op().name(), srcs.join(", "))
    });
    Error::Compute {
        device,
        reason: format!(
            "{} at element {} of {} ({op} of {srcs}) is the first non-finite value of the step \
             of {n_tokens} token(s) at position {n_past}",
            found.value,
            found.index,
            graph.label(found.id)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_non_finite_value() {
        assert_eq!(first_non_finite(&[1.0, 2.0]), None);
        let (i, v) = first_non_finite(&[1.0, f32::INFINITY, f32::NAN]).unwrap();
        assert_eq!((i, v), (1, f32::INFINITY));
        let (i, v) = first_non_finite(&[f32::NAN]).unwrap();
        assert!(i == 0 && v.is_nan());
    }
}
