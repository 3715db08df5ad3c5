//! Tessera's plugin ABI: whole backends shipped as shared libraries and loaded at run time.
//!
//! A plugin is a `cdylib` exporting one symbol, `tessera_backend_init`, that returns a table of
//! C function pointers; the host wraps those tables back into the `tessera-core` traits, so a
//! loaded device is used exactly like a compiled-in one. (The comm trio a backend offers by
//! name, `comm_init` / `comm_allreduce_tensor` / `comm_free`, lives in `tessera_core::comm`:
//! compiled-in backends export it too; this crate forwards it across the library boundary.)
//!
//! - [`abi`]: the `#[repr(C)]` tables (registry, device, buffer type, buffer, backend, event),
//!   each with magic, ABI version and size, and the flat graph form.
//! - [`codec`]: conversions between core's graphs, descriptors and errors and those flat forms
//!   (public so plugin authors and the fuzz targets can decode what crosses the boundary).
//! - The export adapter: [`export_backend!`](crate::export_backend) turns a Rust
//!   [`tessera_core::Registry`] into those tables in a `cdylib`, catching panics and forwarding `tracing` logs to the host.
//! - The import adapter: [`load_backend`] opens a library and wraps its tables back into the
//!   core traits ([`PluginRegistry`]); [`search_dirs`] and [`find_plugins`] implement the
//!   `TESSERA_BACKEND_PATH` scan.
//!
//! Nearly all of this crate is `unsafe` by nature (raw tables crossing a C boundary), which is
//! why it is a crate of its own: the core stays almost free of `unsafe`. Turning an address back
//! into a function is only sound for the exact signature its name documents, so callers go
//! through the typed wrappers here and never transmute themselves.

pub mod abi;
pub mod codec;
mod export;
mod import;
mod log;
mod settings;

pub use codec::FlatGraph;
#[doc(hidden)]
pub use export::export_entry;
pub use import::{
    BACKEND_PATH_ENV, LoadError, LoadReport, PluginRegistry, backend_handle, buffer_handle,
    env_dirs, find_plugins, is_plugin_file_name, load_backend, load_dirs, search_dirs,
};
pub use log::HostLog;
