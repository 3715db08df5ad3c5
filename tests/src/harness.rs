//! The conformance harness of every backend's suite: one libtest-mimic trial per (device ×
//! case), compared with the f64 reference. Without devices the trials are ignored with the
//! reason in their names (`[skipped: ...] cuda/...`); `TESSERA_REQUIRE=<backend>` makes that a
//! failure. A backend may declare the dtypes it covers (the GPU kernels:
//! [`crate::GPU_KERNEL_DTYPES`]): cases with other dtypes, or writing one of
//! [`crate::GPU_READ_ONLY_DTYPES`], are ignored with that reason; any other unsupported case fails.

use crate::{Case, GPU_READ_ONLY_DTYPES, Status, all_cases, format_line, run_case};
use libtest_mimic::{Arguments, Failed, Trial};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use tessera_core::{Backend, BackendOptions, DType, Device, DeviceRegistry, Registry};

/// One stream per (test thread, device), reused by the thread's trials. Kept in a static rather
/// than thread-locals so that they are dropped before the process exits: a vendor runtime torn
/// down at exit while a worker thread's TLS destructor still waits on its queue aborts.
type Streams = HashMap<(ThreadId, String), Box<dyn Backend>>;
static STREAMS: Mutex<Option<Streams>> = Mutex::new(None);

fn take_stream(key: &str) -> Option<Box<dyn Backend>> {
    let mut map = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    map.as_mut()?
        .remove(&(std::thread::current().id(), key.to_string()))
}

fn keep_stream(key: &str, backend: Box<dyn Backend>) {
    let mut map = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    map.get_or_insert_with(HashMap::new)
        .insert((std::thread::current().id(), key.to_string()), backend);
}

fn run_trial(key: &str, device: &dyn Device, case: &Case) -> Result<(), Failed> {
    let mut backend = match take_stream(key) {
        Some(b) => b,
        None => device
            .init_backend(&BackendOptions::default())
            .map_err(|e| Failed::from(format!("{}: init_backend: {e}", device.name())))?,
    };
    let outcome = run_case(device, backend.as_mut(), case);
    match outcome.status {
        Status::Pass { .. } => {
            keep_stream(key, backend);
            Ok(())
        }
        // A failed run may leave an error queued on the stream: the next trial starts afresh.
        Status::Fail { .. } | Status::NotSupported(_) => Err(Failed::from(format_line(&outcome))),
    }
}

/// Runs the suite on every device of `registry` (named `backend`), plus the second device of
/// the selector `second` (e.g. `cuda:2`) as its own target, and exits with the result: every
/// case on the first device, every sixteenth on each other one (a different sixteenth each;
/// `TESSERA_CONFORMANCE_EVERY_DEVICE=1` runs all). With `covers`, cases using other dtypes are
/// listed as ignored instead of run.
pub fn run_device_suite(
    backend: &str,
    registry: Arc<dyn Registry>,
    second: Option<&str>,
    covers: Option<&[DType]>,
) -> ! {
    device_suite(backend, registry, second, covers, false)
}

/// As [`run_device_suite`], for a backend still gaining kernels (Vulkan): cases whose nodes a
/// device declines (`supports_op` says no) are listed as ignored with the reason in their names
/// instead of failing.
pub fn run_device_suite_declining(
    backend: &str,
    registry: Arc<dyn Registry>,
    second: Option<&str>,
    covers: Option<&[DType]>,
) -> ! {
    device_suite(backend, registry, second, covers, true)
}

/// On devices after the first, the conformance suite runs one case in this many.
const EXTRA_DEVICE_STRIDE: usize = 16;

fn device_suite(
    backend: &str,
    registry: Arc<dyn Registry>,
    second: Option<&str>,
    covers: Option<&[DType]>,
    declining: bool,
) -> ! {
    let args = Arguments::from_args();
    let cases = all_cases();
    let devices = DeviceRegistry::new();
    devices.register(registry);
    let require =
        std::env::var("TESSERA_REQUIRE").is_ok_and(|v| v.split(',').any(|b| b.trim() == backend));

    let mut targets: Vec<(String, Arc<dyn Device>)> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    for info in devices.backends() {
        if let Err(reason) = &info.devices {
            skipped.push((info.name.clone(), reason.clone()));
        }
    }
    for dev in devices.devices() {
        targets.push((dev.name().to_string(), dev));
    }
    if let Some(sel) = second
        && !targets.is_empty()
    {
        match devices.select(sel) {
            Ok(devs) => match devs.get(1) {
                Some(dev) if targets.iter().any(|(n, _)| n == dev.name()) => {}
                Some(dev) => targets.push((format!("{sel}/{}", dev.name()), dev.clone())),
                None => skipped.push((
                    sel.to_string(),
                    format!("selected {} device(s), expected 2", devs.len()),
                )),
            },
            Err(e) => skipped.push((sel.to_string(), e.to_string())),
        }
    }

    // The first device takes every case; the others (sub-devices, a second logical device) test
    // the per-device plumbing (contexts, queues, kernel caches, buffers), for which every
    // EXTRA_DEVICE_STRIDE-th case is enough, each device a different share, unless
    // TESSERA_CONFORMANCE_EVERY_DEVICE=1. (Every case on every device made these suites a third
    // of CI's time on a 2-core machine.)
    let every_device = std::env::var("TESSERA_CONFORMANCE_EVERY_DEVICE").is_ok_and(|v| v == "1");
    if targets.len() > 1 && !every_device {
        let extra: Vec<&str> = targets[1..].iter().map(|(k, _)| k.as_str()).collect();
        eprintln!(
            "conformance: {} take every case; {} every {EXTRA_DEVICE_STRIDE}th \
             (TESSERA_CONFORMANCE_EVERY_DEVICE=1: all)",
            targets[0].0,
            extra.join(", ")
        );
    }
    let mut trials = Vec::new();
    for (ti, (key, dev)) in targets.iter().enumerate() {
        for (ci, case) in cases.iter().enumerate() {
            if ti > 0 && !every_device && ci % EXTRA_DEVICE_STRIDE != (ti - 1) % EXTRA_DEVICE_STRIDE
            {
                continue;
            }
            let name = format!("{key}/{}", case.label());
            let outside: Vec<String> = match covers {
                Some(covered) => {
                    let mut v: Vec<String> = case
                        .dtypes()
                        .into_iter()
                        .filter(|d| !covered.contains(d))
                        .map(|d| d.name().to_string())
                        .collect();
                    v.extend(
                        case.written_dtypes()
                            .into_iter()
                            .filter(|d| GPU_READ_ONLY_DTYPES.contains(d))
                            .map(|d| format!("writing {d}")),
                    );
                    v
                }
                None => Vec::new(),
            };
            if !outside.is_empty() {
                let name = format!("[no {backend} kernels for {}] {name}", outside.join(","));
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                continue;
            }
            if let Some(why) = crate::cases::sampled_out(backend, case) {
                let name = format!("[sampled on {backend}: {why}] {name}");
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                continue;
            }
            if let Some(gap) = crate::cases::known_gap(backend, case) {
                let name = format!("[known gap on {backend}: {gap}] {name}");
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                continue;
            }
            if declining && let Ok(Some(reason)) = crate::runner::case_support(dev.as_ref(), case) {
                let name = format!("[unsupported on {backend}: {reason}] {name}");
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
                continue;
            }
            let (key, dev, case) = (key.clone(), dev.clone(), case.clone());
            trials.push(Trial::test(name, move || {
                run_trial(&key, dev.as_ref(), &case)
            }));
        }
    }
    for (name, reason) in &skipped {
        for case in &cases {
            let trial = format!("[skipped: {reason}] {name}/{}", case.label());
            if require {
                let msg = format!("TESSERA_REQUIRE={backend}: {reason}");
                trials.push(Trial::test(trial, move || Err(Failed::from(msg))));
            } else {
                trials.push(Trial::test(trial, || Ok(())).with_ignored_flag(true));
            }
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    // Streams go before the process exits (see STREAMS).
    STREAMS.lock().unwrap_or_else(|e| e.into_inner()).take();
    conclusion.exit();
}

/// Whether a toolchain trial of `backend` must run: under `CI=true` (or `1`) or when
/// `TESSERA_REQUIRE` lists `backend`.
pub fn toolchain_required(backend: &str) -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
        || std::env::var("TESSERA_REQUIRE").is_ok_and(|v| v.split(',').any(|b| b.trim() == backend))
}

/// A trial for a missing library of `backend`: a failure when [`toolchain_required`], else
/// ignored with the reason in its name.
pub fn missing_trial(backend: &str, name: String, reason: &str) -> Trial {
    if toolchain_required(backend) {
        let reason = reason.to_string();
        Trial::test(name, move || {
            Err(Failed::from(format!("required in CI: {reason}")))
        })
    } else {
        Trial::test(format!("[skipped: {reason}] {name}"), || Ok(())).with_ignored_flag(true)
    }
}
