//! `tessera test-ops`: the op conformance suite of `tessera-tests` on the selected devices.

use std::sync::Arc;
use tessera::{BACKENDS, BackendOptions, Device, registry};
use tessera_tests::{Summary, all_cases, filter, format_line, known_gap, run_case};

/// Runs every case matching `op` on every device; returns whether nothing failed.
pub fn run(devices: &[Arc<dyn Device>], op: Option<&str>, quiet: bool) -> anyhow::Result<bool> {
    for (name, built) in BACKENDS {
        if !built {
            println!("{name}: skipped (not built: enable the `{name}` cargo feature)");
        }
    }
    for info in registry().backends() {
        if let Err(reason) = &info.devices {
            println!("{}: skipped ({reason})", info.name);
        }
    }
    if devices.is_empty() {
        anyhow::bail!("no device selected");
    }
    let cases = filter(all_cases(), op);
    if cases.is_empty() {
        anyhow::bail!("no case matches -o {}", op.unwrap_or(""));
    }
    let mut total = Summary::default();
    for dev in devices {
        let mut backend = dev.init_backend(&BackendOptions::default())?;
        let mut summary = Summary::default();
        for case in &cases {
            if let Some(gap) = known_gap(dev.backend_name(), case) {
                if !quiet {
                    println!("{} {}: KNOWN GAP ({gap})", case.label(), dev.name());
                }
                summary.not_supported += 1;
                continue;
            }
            let outcome = run_case(dev.as_ref(), backend.as_mut(), case);
            if !quiet || !outcome.passed() {
                println!("{}", format_line(&outcome));
            }
            summary.add(&outcome);
        }
        println!("{}: {summary}", dev.name());
        total.passed += summary.passed;
        total.failed += summary.failed;
        total.not_supported += summary.not_supported;
    }
    println!("{total}");
    Ok(total.failed == 0)
}
