//! Build-script helpers shared by Tessera's vendor backends.
//!
//! Build scripts use [`discover`] to find a toolkit from an environment variable or a list of
//! candidate locations, telling cargo to re-run when those variables change, and to explain what
//! is missing (as a `cargo:warning`) when nothing is found. Vendor-specific helpers live in their
//! own modules.

pub mod discover;
pub mod hip;
pub mod sycl;
