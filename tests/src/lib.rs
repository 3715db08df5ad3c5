//! Tessera's op conformance suite: [`cases`] describes small graphs covering every op of the op
//! set, [`reference`](mod@reference) computes them with a scalar `f64` interpreter over
//! byte-faithful storage, and [`runner`] runs a case on a device and compares the two.
//!
//! ```no_run
//! # fn demo(device: &dyn tessera_core::Device) -> tessera_core::Result<()> {
//! use tessera_core::BackendOptions;
//! let mut backend = device.init_backend(&BackendOptions::default())?;
//! for case in tessera_tests::filter(tessera_tests::all_cases(), Some("MUL_MAT")) {
//!     let outcome = tessera_tests::run_case(device, backend.as_mut(), &case);
//!     println!("{}", tessera_tests::format_line(&outcome));
//! }
//! # Ok(())
//! # }
//! ```

pub mod cases;
pub mod harness;
pub mod reference;
pub mod runner;

pub use cases::{
    Case, GPU_KERNEL_DTYPES, GPU_READ_ONLY_DTYPES, Tolerance, all_cases, filter, known_gap,
};
pub use runner::{CaseOutcome, Status, Summary, format_line, run_case};
