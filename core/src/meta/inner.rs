//! What a meta device is made of ([`MetaInner`]), shared by its device, buffer type, buffers
//! and streams, and how its static tensors are split ([`SplitPolicy`] under a [`SplitLayout`]).
//! It depends on none of them, so they depend on it and never on each other for it.

use super::split::SplitState;
use crate::backend::Device;
use crate::comm::{DistComm, Wire};
use crate::error::Result;
use crate::tensor::TensorDesc;
use std::fmt;
use std::sync::Arc;

/// How many devices a split spans and their `-ts` ratios (empty = even).
#[derive(Clone, Debug, PartialEq)]
pub struct SplitLayout {
    /// Devices of the meta device.
    pub n_devices: usize,
    /// One ratio per device, or empty for an even split.
    pub ratios: Vec<f32>,
}

/// Chooses the split state of each statically allocated tensor (weights, caches) of a meta
/// device. Compute tensors get theirs by propagation.
pub trait SplitPolicy: Send + Sync {
    /// The state of `desc` (named as the model names it) under `layout`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when the tensor cannot be split
    /// as the policy wants.
    fn split_state(&self, desc: &TensorDesc, layout: &SplitLayout) -> Result<SplitState>;

    /// Optional. One line on choices the policy makes beyond single tensors (e.g. how each
    /// mixture-of-experts layer splits its experts) under `layout`, for
    /// [`MetaDevice::describe`](super::MetaDevice::describe). Default: empty.
    fn describe(&self, _layout: &SplitLayout) -> String {
        String::new()
    }
}

impl<F> SplitPolicy for F
where
    F: Fn(&TensorDesc, &SplitLayout) -> Result<SplitState> + Send + Sync,
{
    fn split_state(&self, desc: &TensorDesc, layout: &SplitLayout) -> Result<SplitState> {
        self(desc, layout)
    }
}

/// What a meta device is made of; shared by its buffer type, buffers and streams.
pub(crate) struct MetaInner {
    pub(crate) name: String,
    pub(crate) devices: Vec<Arc<dyn Device>>,
    pub(crate) policy: Arc<dyn SplitPolicy>,
    pub(crate) layout: SplitLayout,
    pub(crate) wire: Wire,
    pub(crate) vendor_comm: bool,
    /// Set when the devices span several processes: which are this process's.
    pub(crate) dist: Option<DistPart>,
}

/// The ranks of a distributed meta device.
#[derive(Clone, Debug)]
pub(crate) struct DistPart {
    pub(crate) comm: Arc<dyn DistComm>,
    /// The rank owning each device (ranks' devices are contiguous, in rank order).
    pub(crate) owner: Vec<usize>,
}

impl MetaInner {
    /// Whether device `j` belongs to this process.
    pub(crate) fn is_local(&self, j: usize) -> bool {
        self.dist
            .as_ref()
            .is_none_or(|d| d.owner[j] == d.comm.rank())
    }

    /// This process's devices: a contiguous range of the device list.
    pub(crate) fn local_range(&self) -> std::ops::Range<usize> {
        match &self.dist {
            None => 0..self.devices.len(),
            Some(d) => {
                let me = d.comm.rank();
                let start = d.owner.iter().position(|&r| r == me).unwrap_or(0);
                let len = d.owner.iter().filter(|&&r| r == me).count();
                start..start + len
            }
        }
    }
}

impl fmt::Debug for MetaInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetaInner")
            .field("name", &self.name)
            .field("layout", &self.layout)
            .finish()
    }
}
