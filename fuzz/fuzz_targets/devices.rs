//! `--devices` and `--ratios`: the registry's device-list parser (`cpu:3`, `CPU,cpu:2`, names,
//! indices) and the ratio parser, followed by everything a split does with the ratios (meta
//! device, per-device lengths of a segment, layer placement). Typed errors only; the split
//! lengths must add up, respect the granularity and follow the ratios' zeros.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::meta::ratio::{parse_ratios, split_lengths};
use tessera::meta::MetaDevice;
use tessera_model::LlamaSplitPolicy;
use tessera::sched::layer_devices;

#[derive(Arbitrary, Debug)]
struct Input {
    devices: String,
    ratios: String,
    ne: u16,
    granularity: u8,
    rotation: u16,
    n_layers: u8,
}

fuzz_target!(|inp: Input| {
    let devs = tessera::registry().select(&inp.devices);
    let n = match &devs {
        Ok(d) => {
            assert!(!d.is_empty());
            d.len()
        }
        Err(_) => 1 + inp.devices.len() % 4,
    };
    let Ok(ratios) = parse_ratios(&inp.ratios, n) else {
        return;
    };
    assert!(ratios.is_empty() || ratios.len() == n);
    assert!(ratios.iter().all(|r| r.is_finite() && *r >= 0.0));
    if let Ok(devs) = &devs
        && n <= 8
    {
        let policy = LlamaSplitPolicy::new(n, 8, 2, 64, 512, 1536, 2);
        let meta = MetaDevice::new(devs, policy);
        if !ratios.is_empty()
            && let Ok(m) = meta
        {
            m.with_ratios(&ratios).expect("parsed ratios are accepted");
        }
    }
    let g = usize::from(inp.granularity).max(1);
    let ne = usize::from(inp.ne) / g * g;
    let lens = split_lengths(ne, n, &ratios, g, usize::from(inp.rotation))
        .expect("parsed ratios split any multiple of the granularity");
    assert_eq!(lens.len(), n);
    assert_eq!(lens.iter().sum::<usize>(), ne);
    let rot = usize::from(inp.rotation) % n;
    for (j, &l) in lens.iter().enumerate() {
        // Every device but the one taking the remainder gets whole granules.
        if j != (n - 1 + rot) % n {
            assert_eq!(l % g, 0, "{lens:?}");
        }
        if !ratios.is_empty() && ratios[j] == 0.0 && j != (n - 1 + rot) % n {
            assert_eq!(l, 0, "{ratios:?} {lens:?}");
        }
    }
    let placement =
        layer_devices(usize::from(inp.n_layers), &ratios, n).expect("parsed ratios place layers");
    assert_eq!(placement.len(), usize::from(inp.n_layers));
    assert!(placement.iter().all(|&d| d < n));
    assert!(placement.windows(2).all(|w| w[0] <= w[1]));
});
