//! The op conformance suite on every CUDA device: one trial per (device × case), compared with
//! the f64 reference. Without a GPU the trials are ignored with the reason in their names
//! (`[skipped: libcuda.so.1 not found ...] cuda/...`); `TESSERA_REQUIRE=cuda` makes that a failure.
//!
//! On a GPU, also runs every case on a second stream of `CUDA0` and on the logical device
//! `cuda:2`'s second device (a second GPU, or the same GPU shared).

use libtest_mimic::{Arguments, Failed, Trial};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use tessera_core::{Backend, BackendOptions, Device, DeviceRegistry};
use tessera_tests::{Case, Status, all_cases, format_line, run_case};

thread_local! {
    static BACKENDS: RefCell<HashMap<String, Box<dyn Backend>>> = RefCell::new(HashMap::new());
}

fn run_trial(key: &str, device: &dyn Device, case: &Case) -> Result<(), Failed> {
    BACKENDS.with(|cell| {
        let mut map = cell.borrow_mut();
        if !map.contains_key(key) {
            let backend = device
                .init_backend(&BackendOptions::default())
                .map_err(|e| Failed::from(format!("{}: init_backend: {e}", device.name())))?;
            map.insert(key.to_string(), backend);
        }
        let backend = map
            .get_mut(key)
            .ok_or_else(|| Failed::from("backend cache lost its entry"))?;
        let outcome = run_case(device, backend.as_mut(), case);
        match outcome.status {
            Status::Pass { .. } => Ok(()),
            Status::Fail { .. } | Status::NotSupported(_) => {
                map.remove(key);
                Err(Failed::from(format_line(&outcome)))
            }
        }
    })
}

fn main() {
    let args = Arguments::from_args();
    let cases = all_cases();
    let registry = DeviceRegistry::new();
    registry.register(tessera_cuda::registry());
    let require =
        std::env::var("TESSERA_REQUIRE").is_ok_and(|v| v.split(',').any(|b| b.trim() == "cuda"));

    let mut targets: Vec<(String, Arc<dyn Device>)> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    for info in registry.backends() {
        if let Err(reason) = &info.devices {
            skipped.push((info.name.clone(), reason.clone()));
        }
    }
    for dev in registry.devices() {
        targets.push((dev.name().to_string(), dev));
    }
    if !targets.is_empty()
        && let Ok(devs) = registry.select("cuda:2")
        && let Some(second) = devs.get(1)
    {
        targets.push((format!("cuda:2/{}", second.name()), second.clone()));
    }

    let mut trials = Vec::new();
    for (key, dev) in &targets {
        for case in &cases {
            let (key, dev, case) = (key.clone(), dev.clone(), case.clone());
            let name = format!("{key}/{}", case.label());
            trials.push(Trial::test(name, move || {
                run_trial(&key, dev.as_ref(), &case)
            }));
        }
    }
    for (backend, reason) in &skipped {
        for case in &cases {
            let name = format!("[skipped: {reason}] {backend}/{}", case.label());
            if require {
                let reason = reason.clone();
                trials.push(Trial::test(name, move || {
                    Err(Failed::from(format!("TESSERA_REQUIRE=cuda: {reason}")))
                }));
            } else {
                trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
            }
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
