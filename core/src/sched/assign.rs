//! Which device runs each node, and why (ggml's scheduler passes, with the cause recorded).
//!
//! Order of precedence: the user's choice; the owner of a pre-allocated tensor the node writes
//! into (KV caches) or reads as a weight; expansion from assigned neighbours, first among the
//! higher-priority devices and then including the last (fallback) one; finally, the device that
//! supports the op and holds most of its inputs.

use crate::backend::{Bindings, Device};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::OpKind;
use crate::tensor::{TensorDesc, TensorId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// Why a node runs where it does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// Chosen with [`super::Scheduler::set_tensor_device`].
    User,
    /// It writes into memory this device owns (CPY / SET_ROWS into a cache).
    Destination,
    /// It reads this weight, which lives on the device.
    Weight(String),
    /// Follows the previous assigned node.
    ExpandDown,
    /// Follows the next assigned node.
    ExpandUp,
    /// No neighbour could take it: the supporting device with most inputs.
    Fallback(String),
    /// A view computes nothing: it lives with the tensor it views.
    View,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::User => f.write_str("user"),
            Cause::Destination => f.write_str("writes into this device's memory"),
            Cause::Weight(w) => write!(f, "weight {w}"),
            Cause::ExpandDown => f.write_str("expand down"),
            Cause::ExpandUp => f.write_str("expand up"),
            Cause::Fallback(why) => write!(f, "fallback: {why}"),
            Cause::View => f.write_str("view"),
        }
    }
}

/// One node's device and the reason.
#[derive(Clone, Debug)]
pub struct Assignment {
    /// The node.
    pub node: TensorId,
    /// Index into the scheduler's devices.
    pub device: usize,
    /// Why.
    pub cause: Cause,
}

/// Index of the device that owns `buf` (else the first that can access it).
pub(crate) fn owner(
    devices: &[Arc<dyn Device>],
    buf: &dyn crate::backend::Buffer,
) -> Result<usize> {
    devices
        .iter()
        .position(|d| d.owns_buffer(buf))
        .or_else(|| devices.iter().position(|d| d.can_access(buf)))
        .ok_or_else(|| {
            Error::InvalidArgument(format!("no scheduled device can access {}", buf.name()))
        })
}

/// The tensor at the end of `id`'s view chain.
pub(crate) fn root(tensors: &[TensorDesc], mut id: TensorId) -> TensorId {
    while let Some(v) = tensors[id.index()].view {
        id = v.src;
    }
    id
}

/// A view op (a leaf is not one): computes nothing, its storage is the viewed tensor's.
pub(crate) fn pure_view(t: &TensorDesc) -> bool {
    t.op.kind().is_view() && t.op.kind() != OpKind::None
}

/// Assigns every node of `graph` a device. Returns the assignments (pure views included) and,
/// for every tensor, its home device where known.
pub(crate) fn assign(
    graph: &Graph,
    weights: &Bindings,
    devices: &[Arc<dyn Device>],
    user: &HashMap<TensorId, usize>,
) -> Result<HashMap<TensorId, Assignment>> {
    let tensors = graph.tensors();
    let supports = |d: usize, n: TensorId| devices[d].supports_op(tensors, n).is_yes();
    let last = devices.len() - 1;
    let mut out: HashMap<TensorId, Assignment> = HashMap::new();
    let weight_owner = |id: TensorId| -> Result<Option<usize>> {
        match weights.resolve(tensors, id) {
            Ok((buf, _)) => owner(devices, buf.as_ref()).map(Some),
            Err(_) => Ok(None),
        }
    };
    let compute: Vec<TensorId> = graph
        .nodes()
        .iter()
        .copied()
        .filter(|&n| !pure_view(&tensors[n.index()]))
        .collect();

    // Pass 1: user choices, destinations, weights.
    for &n in &compute {
        let t = &tensors[n.index()];
        if let Some(&d) = user.get(&n) {
            if d > last {
                return Err(Error::InvalidArgument(format!(
                    "node {} assigned to device {d} of {}",
                    graph.label(n),
                    devices.len()
                )));
            }
            if let crate::backend::Support::No(reason) = devices[d].supports_op(tensors, n) {
                return Err(unsupported(graph, n, &devices[d], reason));
            }
            out.insert(
                n,
                Assignment {
                    node: n,
                    device: d,
                    cause: Cause::User,
                },
            );
            continue;
        }
        if let Some(v) = t.view
            && let Some(d) = weight_owner(v.src)?
        {
            if let crate::backend::Support::No(reason) = devices[d].supports_op(tensors, n) {
                return Err(unsupported(graph, n, &devices[d], reason));
            }
            out.insert(
                n,
                Assignment {
                    node: n,
                    device: d,
                    cause: Cause::Destination,
                },
            );
            continue;
        }
        for s in t.srcs() {
            let is_weight = tensors[root(tensors, s).index()].op.kind() == OpKind::None;
            if is_weight
                && let Some(d) = weight_owner(s)?
                && supports(d, n)
            {
                out.insert(
                    n,
                    Assignment {
                        node: n,
                        device: d,
                        cause: Cause::Weight(graph.label(root(tensors, s))),
                    },
                );
                break;
            }
        }
    }

    // Passes 2-3: expansion, first skipping the fallback device, then including it.
    for include_last in [false, true] {
        for (order, cause) in [(false, Cause::ExpandDown), (true, Cause::ExpandUp)] {
            let mut cur: Option<usize> = None;
            let iter: Box<dyn Iterator<Item = &TensorId>> = if order {
                Box::new(compute.iter().rev())
            } else {
                Box::new(compute.iter())
            };
            for &n in iter {
                match out.get(&n) {
                    Some(a) => {
                        cur = if a.device == last && !include_last {
                            None
                        } else {
                            Some(a.device)
                        }
                    }
                    None => {
                        if let Some(d) = cur {
                            if supports(d, n) {
                                out.insert(
                                    n,
                                    Assignment {
                                        node: n,
                                        device: d,
                                        cause: cause.clone(),
                                    },
                                );
                            } else {
                                cur = None;
                            }
                        }
                    }
                }
            }
        }
    }

    // Pass 4: whatever is left goes where it is supported and most of its inputs already are.
    for &n in &compute {
        if out.contains_key(&n) {
            continue;
        }
        let t = &tensors[n.index()];
        let mut best: Option<(usize, usize)> = None;
        let mut reasons = Vec::new();
        for (d, dev) in devices.iter().enumerate() {
            match dev.supports_op(tensors, n) {
                crate::backend::Support::Yes => {
                    let here = t
                        .srcs()
                        .filter(|&s| {
                            let r = root(tensors, s);
                            out.get(&r).map(|a| a.device) == Some(d)
                                || weight_owner(r).ok().flatten() == Some(d)
                        })
                        .count();
                    if best.is_none_or(|(_, c)| here > c) {
                        best = Some((d, here));
                    }
                }
                crate::backend::Support::No(r) => reasons.push(format!("{}: {r}", dev.name())),
            }
        }
        let Some((d, _)) = best else {
            return Err(Error::Unsupported {
                op: t.op.name().to_string(),
                dtype: t
                    .src(0)
                    .map(|s| tensors[s.index()].dtype)
                    .unwrap_or(t.dtype),
                device: devices
                    .iter()
                    .map(|d| d.name().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                reason: format!(
                    "no scheduled device runs {} ({})",
                    graph.label(n),
                    reasons.join("; ")
                ),
            });
        };
        let why = if reasons.is_empty() {
            "most inputs".to_string()
        } else {
            reasons.join("; ")
        };
        out.insert(
            n,
            Assignment {
                node: n,
                device: d,
                cause: Cause::Fallback(why),
            },
        );
    }

    // Pure views live where the tensor they view lives.
    for &n in graph.nodes() {
        if pure_view(&tensors[n.index()]) {
            let r = root(tensors, n);
            let d = match weight_owner(r)? {
                Some(d) => d,
                None => out.get(&r).map(|a| a.device).unwrap_or(last),
            };
            out.insert(
                n,
                Assignment {
                    node: n,
                    device: d,
                    cause: Cause::View,
                },
            );
        }
    }
    Ok(out)
}

fn unsupported(graph: &Graph, n: TensorId, dev: &Arc<dyn Device>, reason: String) -> Error {
    let t = &graph.tensors()[n.index()];
    Error::Unsupported {
        op: t.op.name().to_string(),
        dtype: t
            .src(0)
            .map(|s| graph.tensors()[s.index()].dtype)
            .unwrap_or(t.dtype),
        device: dev.name().to_string(),
        reason: format!("{} must run there: {reason}", graph.label(n)),
    }
}
