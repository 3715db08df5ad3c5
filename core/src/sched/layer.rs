//! Layer placement for split mode `layer`: consecutive layers on consecutive devices.

use crate::error::{Error, Result};

/// Device index for each of `n_layers` layers: consecutive layers on consecutive devices, in
/// proportion to `ratios` (one entry per device; empty means an even split). A device whose
/// ratio is 0 gets no layer.
///
/// # Errors
/// [`Error::InvalidArgument`] for no devices, a ratio count that differs from `n_devices`, or
/// negative / non-finite / all-zero ratios.
pub fn layer_devices(n_layers: usize, ratios: &[f32], n_devices: usize) -> Result<Vec<usize>> {
    if n_devices == 0 {
        return Err(Error::InvalidArgument(
            "layer split needs at least one device".into(),
        ));
    }
    let even = vec![1.0f32; n_devices];
    let ratios = if ratios.is_empty() { &even[..] } else { ratios };
    if ratios.len() != n_devices {
        return Err(Error::InvalidArgument(format!(
            "{} ratios given for {n_devices} devices",
            ratios.len()
        )));
    }
    if ratios.iter().any(|r| !r.is_finite() || *r < 0.0) {
        return Err(Error::InvalidArgument(format!(
            "ratios {ratios:?} must be finite and non-negative"
        )));
    }
    let total: f64 = ratios.iter().map(|&r| r as f64).sum();
    if total <= 0.0 {
        return Err(Error::InvalidArgument("ratios sum to zero".into()));
    }
    // Layer i goes to the first device whose cumulative share covers the layer's midpoint.
    let mut cum = Vec::with_capacity(n_devices);
    let mut acc = 0.0;
    for &r in ratios {
        acc += r as f64 / total;
        cum.push(acc);
    }
    Ok((0..n_layers)
        .map(|i| {
            let mid = (i as f64 + 0.5) / n_layers as f64;
            cum.iter().position(|&c| mid < c).unwrap_or(n_devices - 1)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_and_uneven_splits() {
        assert_eq!(layer_devices(4, &[], 2).unwrap(), vec![0, 0, 1, 1]);
        assert_eq!(layer_devices(4, &[3.0, 1.0], 2).unwrap(), vec![0, 0, 0, 1]);
        assert_eq!(
            layer_devices(4, &[1.0, 0.0, 1.0], 3).unwrap(),
            vec![0, 0, 2, 2]
        );
        assert_eq!(layer_devices(5, &[], 1).unwrap(), vec![0; 5]);
        assert!(layer_devices(4, &[1.0], 2).is_err());
        assert!(layer_devices(4, &[0.0, 0.0], 2).is_err());
        assert!(layer_devices(4, &[], 0).is_err());
    }
}
