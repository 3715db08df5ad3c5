//! The op conformance suite against the CPU backend: one trial per (device × case).
//!
//! Devices: every device of the CPU registry (registered into a fresh [`DeviceRegistry`]), plus
//! the second device of `cpu:2` to exercise several CPU devices in one process. A backend that is
//! unavailable turns its trials into ignored ones named `[skipped: reason] ...`. A case the CPU
//! backend reports NOT SUPPORTED fails: the CPU backend must run every op and dtype.
//! The harness is `tessera_tests::harness`, shared with the vendor suites.
//!
//! Run a subset with a libtest filter, e.g. `cargo test -p tessera-tests --test conformance -- MUL_MAT`.

fn main() {
    tessera_tests::harness::run_device_suite("cpu", tessera_cpu::registry(), Some("cpu:2"), None);
}
