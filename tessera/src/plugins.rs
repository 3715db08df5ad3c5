//! Loading backend plugins into the process-wide registry (the loader itself is
//! `tessera_plugin`).

use crate::Registry;
use crate::plugin::{LoadError, LoadReport, env_dirs, load_dirs, search_dirs};
use std::path::Path;
use std::sync::Arc;

/// Loads the backend plugin at `path` and registers it in [`crate::registry()`]. Its registry
/// is named `NAME@FILE` (`cpu@libtessera_cpu.so`), as are its devices, so it never collides with
/// a compiled-in backend.
///
/// # Errors
/// A [`LoadError`] naming the file; nothing is registered then.
pub fn register_plugin(path: impl AsRef<Path>) -> Result<Arc<dyn Registry>, LoadError> {
    let plugin: Arc<dyn Registry> = crate::plugin::load_backend(path)?;
    crate::registry().register(plugin.clone());
    Ok(plugin)
}

/// Loads every plugin found in `TESSERA_BACKEND_PATH` (colon-separated directories, in order)
/// and in the executable's directory (files named `libtessera-*.so` or `libtessera_*.so`) into
/// [`crate::registry()`]. A file that fails is in the report (and logged) and the others still
/// load; a file already loaded is not loaded twice.
pub fn load_all() -> LoadReport {
    load_dirs(crate::registry(), &search_dirs())
}

/// What [`crate::registry()`] does on first use: load the plugins of `TESSERA_BACKEND_PATH`
/// (not the executable's directory), so setting the variable is enough to add plugins.
pub(crate) fn load_env_path(reg: &crate::DeviceRegistry) {
    let dirs = env_dirs();
    if !dirs.is_empty() {
        load_dirs(reg, &dirs);
    }
}
