//! The import adapter: loads a plugin's shared library, checks its tables, and wraps them back
//! into the core traits, so a plugin's devices work wherever a compiled-in device does.
//!
//! Every wrapper holds an `Arc` of the loaded library (and libraries stay mapped for the life of
//! the process), so no table or code disappears under a live object. A wrapper of a plugin
//! object carries the plugin's handle: when the plugin's own streams or devices receive it back
//! (bindings, copies, `owns_buffer`), they get their own object, never a host wrapper.

mod comm;
mod device;
mod loader;
mod memory;
mod stream;

pub use device::PluginRegistry;
pub use loader::{
    BACKEND_PATH_ENV, LoadError, env_dirs, find_plugins, is_plugin_file_name, search_dirs,
};

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tessera_core::backend::{Backend, Buffer};
use tessera_core::registry::{DeviceRegistry, Registry};

/// What [`load_dirs`] did, file by file.
#[derive(Default)]
pub struct LoadReport {
    /// The plugins loaded (or found already loaded) and registered, with their files.
    pub loaded: Vec<(PathBuf, Arc<dyn Registry>)>,
    /// The files that failed, each with its typed error.
    pub failed: Vec<(PathBuf, LoadError)>,
}

impl std::fmt::Debug for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let loaded: Vec<(&PathBuf, &str)> =
            self.loaded.iter().map(|(p, r)| (p, r.name())).collect();
        f.debug_struct("LoadReport")
            .field("loaded", &loaded)
            .field("failed", &self.failed)
            .finish()
    }
}

/// Loads every plugin file [`find_plugins`] finds in `dirs` and registers it in `registry`. A
/// file that fails is reported (and logged as a warning) and the others still load; a file
/// already registered (same path as a backend's origin) is reported as loaded, not loaded twice.
pub fn load_dirs(registry: &DeviceRegistry, dirs: &[PathBuf]) -> LoadReport {
    let mut report = LoadReport::default();
    for file in find_plugins(dirs) {
        let origin = file.display().to_string();
        if let Some(known) = registry.backends().into_iter().find(|b| b.origin == origin)
            && let Some(r) = registry.registry(&known.name)
        {
            report.loaded.push((file, r));
            continue;
        }
        match load_backend(&file) {
            Ok(r) => {
                registry.register(r.clone());
                report.loaded.push((file, r));
            }
            Err(e) => {
                tracing::warn!("backend plugin not loaded: {e}");
                report.failed.push((file, e));
            }
        }
    }
    report
}

/// Loads the backend plugin at `path`: opens the library, calls `tessera_backend_init`, checks
/// the magic, ABI version and size of every table, and returns its registry (not yet
/// registered anywhere; see [`tessera_core::DeviceRegistry::register`]).
///
/// # Errors
/// A [`LoadError`] naming the file: it cannot be opened, lacks the entry symbol, its entry
/// returned nothing, or a table has the wrong magic, version or size.
pub fn load_backend(path: impl AsRef<Path>) -> Result<Arc<PluginRegistry>, LoadError> {
    let lib = loader::open(path.as_ref())?;
    let reg = PluginRegistry::new(lib);
    tracing::debug!(
        backend = reg.name_str(),
        file = reg.file(),
        "loaded backend plugin"
    );
    Ok(Arc::new(reg))
}

/// The plugin handle behind a plugin buffer (a `*const Arc<dyn Buffer>` of the plugin), for
/// vendor extras found through [`tessera_core::Registry::proc_address`]; `None` for other buffers.
pub fn buffer_handle(buf: &dyn Buffer) -> Option<*const c_void> {
    memory::PluginBuffer::parts(buf).map(|(_, h)| h as *const c_void)
}

/// The plugin handle behind a plugin stream (a `*mut Box<dyn Backend>` of the plugin), for
/// vendor extras; `None` for other streams.
pub fn backend_handle(backend: &mut dyn Backend) -> Option<*mut c_void> {
    backend
        .as_any_mut()
        .downcast_mut::<stream::PluginBackend>()
        .map(|b| b.h)
}
