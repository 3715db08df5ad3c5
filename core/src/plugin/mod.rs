//! The C boundary of Tessera: functions found by name through [`crate::Registry::proc_address`]
//! (the comm trio), and whole backends loaded from shared libraries at run time.
//!
//! - [`abi`]: the `#[repr(C)]` tables (registry, device, buffer type, buffer, backend, event),
//!   each with magic, ABI version and size, and the flat graph form.
//! - [`codec`]: conversions between core's graphs, descriptors and errors and those flat forms
//!   (public so plugin authors and the fuzz targets can decode what crosses the boundary).
//! - The export adapter: [`export_backend!`](crate::export_backend) turns a Rust [`crate::Registry`]
//!   into those tables in a `cdylib`, catching panics and forwarding `tracing` logs to the host.
//! - The import adapter: [`load_backend`] opens a library and wraps its tables back into the
//!   core traits ([`PluginRegistry`]); [`search_dirs`] and [`find_plugins`] implement the
//!   `TESSERA_BACKEND_PATH` scan.
//!
//! This is one of the two places in core allowed to use `unsafe`: turning an address back into a
//! function is only sound for the exact signature its name documents, so callers go through the
//! typed wrappers here and never transmute themselves.

pub mod abi;
pub mod codec;
mod comm;
mod comm_impl;
mod export;
mod import;
mod log;

pub use codec::FlatGraph;
pub use comm::{
    COMM_ALLREDUCE, COMM_FREE, COMM_ID_BYTES, COMM_INIT, COMM_INIT_RANKS, COMM_UNIQUE_ID,
    CommAllReduceFn, CommApi, CommFreeFn, CommInitFn, CommInitRanksFn, CommOutcome, CommUniqueIdFn,
    RanksCommApi, RawCommSlice, VendorComm,
};
pub use comm_impl::{
    CommCall, comm_allreduce_with, comm_free_with, comm_init_with, comm_proc_address,
};
#[doc(hidden)]
pub use export::export_entry;
pub use import::{
    BACKEND_PATH_ENV, LoadError, LoadReport, PluginRegistry, backend_handle, buffer_handle,
    env_dirs, find_plugins, is_plugin_file_name, load_backend, load_dirs, search_dirs,
};
pub use log::HostLog;
