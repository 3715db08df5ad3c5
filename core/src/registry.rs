//! Vendor registries and the process-wide list of them.
//!
//! Each vendor crate exports one [`Registry`]. The facade registers the compiled-in ones into
//! [`DeviceRegistry::global`]; plugins add theirs at load time. Device selection (`CPU`, `cpu:4`,
//! `cuda0,cuda1`) goes through [`DeviceRegistry::select`].

use crate::backend::Device;
use crate::error::{Error, Result};
use parking_lot::RwLock;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The address of an optional backend function found by name (ggml's `get_proc_address`).
/// Calling it needs the exact signature its name documents, so only the typed wrappers in core
/// turn it back into a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcAddress(*const c_void);

impl ProcAddress {
    /// Wraps a function address.
    pub fn new(ptr: *const c_void) -> ProcAddress {
        ProcAddress(ptr)
    }
    /// The raw address.
    pub fn as_ptr(self) -> *const c_void {
        self.0
    }
}

/// One vendor's entry point.
pub trait Registry: Send + Sync + 'static {
    /// Lower-case backend name: `cpu`, `cuda`, `hip`, `sycl`.
    fn name(&self) -> &str;
    /// Cheap check that the backend can run here (library present, device count > 0).
    ///
    /// # Errors
    /// [`Error::Unavailable`] with the reason.
    fn probe(&self) -> Result<()>;
    /// The devices this backend exposes by default.
    ///
    /// # Errors
    /// [`Error::Unavailable`] and vendor errors.
    fn devices(&self) -> Result<Vec<Arc<dyn Device>>>;
    /// Optional. `n` devices for a `KIND:N` selector. Default: the first `n` of
    /// [`Registry::devices`], or an error if there are fewer.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] when fewer exist.
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        let devs = self.devices()?;
        if devs.len() < n {
            return Err(Error::NoSuchDevice {
                wanted: format!("{}:{n}", self.name()),
                available: format!("{} {} device(s)", devs.len(), self.name()),
            });
        }
        Ok(devs.into_iter().take(n).collect())
    }
    /// Optional. A backend-specific function by name (the comm trio `tessera_comm_init` /
    /// `tessera_comm_allreduce_tensor` / `tessera_comm_free`, vendor extras). Default `None`: not
    /// provided, the generic path runs.
    fn proc_address(&self, _name: &str) -> Option<ProcAddress> {
        None
    }
    /// Where the backend came from: `built-in`, or the plugin file.
    fn origin(&self) -> String {
        "built-in".to_string()
    }
}

struct Entry {
    registry: Arc<dyn Registry>,
    devices: std::result::Result<Vec<Arc<dyn Device>>, String>,
}

/// All registered backends and their devices.
#[derive(Default)]
pub struct DeviceRegistry {
    entries: RwLock<Vec<Entry>>,
}

impl fmt::Debug for DeviceRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self
            .entries
            .read()
            .iter()
            .map(|e| e.registry.name().to_string())
            .collect();
        f.debug_struct("DeviceRegistry")
            .field("backends", &names)
            .finish()
    }
}

/// One backend as `tessera devices` reports it.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// Backend name.
    pub name: String,
    /// `built-in` or the plugin path.
    pub origin: String,
    /// Its devices, or why there are none.
    pub devices: std::result::Result<Vec<Arc<dyn Device>>, String>,
}

impl DeviceRegistry {
    /// An empty registry (tests; most code uses [`DeviceRegistry::global`]).
    pub fn new() -> DeviceRegistry {
        DeviceRegistry::default()
    }

    /// The process-wide registry.
    pub fn global() -> &'static DeviceRegistry {
        static GLOBAL: OnceLock<DeviceRegistry> = OnceLock::new();
        GLOBAL.get_or_init(DeviceRegistry::new)
    }

    /// Adds a backend, enumerating its devices now. A backend that is unavailable is kept with its
    /// reason (so `tessera devices` can print it) and contributes no devices. Registering a name
    /// twice keeps the first.
    pub fn register(&self, registry: Arc<dyn Registry>) {
        let mut entries = self.entries.write();
        if entries.iter().any(|e| e.registry.name() == registry.name()) {
            tracing::debug!(backend = registry.name(), "backend already registered");
            return;
        }
        let devices = registry
            .probe()
            .and_then(|_| registry.devices())
            .map_err(|e| e.to_string());
        match &devices {
            Ok(d) => tracing::debug!(
                backend = registry.name(),
                devices = d.len(),
                "registered backend"
            ),
            Err(e) => tracing::info!(backend = registry.name(), reason = %e, "backend unavailable"),
        }
        entries.push(Entry { registry, devices });
    }

    /// Every backend with its devices or the reason it has none.
    pub fn backends(&self) -> Vec<BackendInfo> {
        self.entries
            .read()
            .iter()
            .map(|e| BackendInfo {
                name: e.registry.name().to_string(),
                origin: e.registry.origin(),
                devices: e.devices.clone(),
            })
            .collect()
    }

    /// The registry of backend `name` (case-insensitive).
    pub fn registry(&self, name: &str) -> Option<Arc<dyn Registry>> {
        self.entries
            .read()
            .iter()
            .find(|e| e.registry.name().eq_ignore_ascii_case(name))
            .map(|e| e.registry.clone())
    }

    /// All devices of all available backends, in registration order.
    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.entries
            .read()
            .iter()
            .filter_map(|e| e.devices.as_ref().ok())
            .flatten()
            .cloned()
            .collect()
    }

    /// The device named `name` (case-insensitive), or the `i`-th device for a number.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] listing the names that exist.
    pub fn device(&self, name: &str) -> Result<Arc<dyn Device>> {
        let devs = self.devices();
        let found = match name.parse::<usize>() {
            Ok(i) => devs.get(i).cloned(),
            Err(_) => devs
                .iter()
                .find(|d| d.name().eq_ignore_ascii_case(name))
                .cloned(),
        };
        found.ok_or_else(|| Error::NoSuchDevice {
            wanted: name.to_string(),
            available: self.device_names(),
        })
    }

    fn device_names(&self) -> String {
        let names: Vec<String> = self
            .devices()
            .iter()
            .map(|d| d.name().to_string())
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }

    /// Devices for a `--devices` list: comma-separated device names, or `KIND:N` for `N` devices
    /// of backend `KIND` (`cpu:4` = four CPU devices sharing the cores).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] for an unknown name or kind, [`Error::InvalidArgument`] for a bad
    /// count or an empty list.
    pub fn select(&self, list: &str) -> Result<Vec<Arc<dyn Device>>> {
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if let Some((kind, n)) = item.split_once(':') {
                let n: usize = n.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "'{item}': the count after ':' must be a positive integer"
                    ))
                })?;
                let reg = self.registry(kind).ok_or_else(|| Error::NoSuchDevice {
                    wanted: item.to_string(),
                    available: self
                        .backends()
                        .iter()
                        .map(|b| b.name.clone())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
                reg.probe()?;
                out.extend(reg.devices_with_count(n)?);
            } else {
                out.push(self.device(item)?);
            }
        }
        if out.is_empty() {
            return Err(Error::InvalidArgument("empty device list".into()));
        }
        Ok(out)
    }
}
