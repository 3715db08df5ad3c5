//! The op conformance suite against the CPU backend: one trial per (device × case).
//!
//! Devices: every device of the CPU registry (registered into a fresh [`DeviceRegistry`]), plus
//! the second device of `cpu:2` to exercise several CPU devices in one process. A backend that is
//! unavailable turns its trials into ignored ones named `[skipped: reason] ...`. A case the CPU
//! backend reports NOT SUPPORTED fails: the CPU backend must run every op.
//!
//! Run a subset with a libtest filter, e.g. `cargo test -p tessera-tests --test conformance -- MUL_MAT`.

use libtest_mimic::{Arguments, Failed, Trial};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use tessera_core::{Backend, BackendOptions, Device, DeviceRegistry};
use tessera_tests::{Case, Status, all_cases, format_line, run_case};

thread_local! {
    /// One stream per (device, test thread): trials on one thread reuse it.
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
            // On the CPU backend, NOT SUPPORTED is a failure too.
            Status::Fail { .. } | Status::NotSupported(_) => {
                // A failed run may leave an error queued on the stream: start the next trial afresh.
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
    registry.register(tessera_cpu::registry());

    // (cache key and trial-name prefix, device)
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
    match registry.select("cpu:2") {
        Ok(devs) => match devs.get(1) {
            Some(second) => targets.push((format!("cpu:2/{}", second.name()), second.clone())),
            None => skipped.push((
                "cpu:2".into(),
                format!("selected {} device(s), expected 2", devs.len()),
            )),
        },
        Err(e) => skipped.push(("cpu:2".into(), e.to_string())),
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
            trials.push(Trial::test(name, || Ok(())).with_ignored_flag(true));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
