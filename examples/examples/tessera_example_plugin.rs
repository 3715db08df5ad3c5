//! A minimal backend plugin: a shared library that Tessera loads at run time.
//!
//! A plugin is a `cdylib` that exports one C symbol, `tessera_backend_init`, returning a table
//! of function pointers for a [`Registry`] (and through it its devices, buffers and streams).
//! `tessera_plugin::export_backend!` generates that symbol from any function returning an
//! `Arc<dyn Registry>`, catching panics at the boundary; the plugin itself needs no `unsafe`.
//!
//! A real plugin would implement `Registry`, `Device`, `BufferType`, `Buffer` and `Backend`
//! for its hardware. To stay small, this one wraps the CPU backend's registry under its own
//! name, `example`: everything else is forwarded to the CPU backend. (The shortest possible
//! plugin is `tessera_plugin::export_backend!(tessera_cpu::registry);`, which is all of
//! `backends/cpu-plugin`.)
//!
//! This file is built as a library, not run. Build it with:
//!
//! ```sh
//! cargo build --release -p tessera-examples --example tessera_example_plugin
//! ```
//!
//! which writes `target/release/examples/libtessera_example_plugin.so`; the `load_plugin`
//! example loads it. The host names the loaded registry after the file,
//! `example@libtessera_example_plugin.so`, and its devices likewise, so they never collide with
//! compiled-in ones.
#![deny(unsafe_code)]

use std::sync::Arc;
use tessera_core::{Device, ProcAddress, Registry, Result};

/// The CPU backend's registry under another name.
struct ExampleRegistry {
    cpu: Arc<dyn Registry>,
}

impl Registry for ExampleRegistry {
    fn name(&self) -> &str {
        "example"
    }

    fn probe(&self) -> Result<()> {
        self.cpu.probe()
    }

    fn devices(&self) -> Result<Vec<Arc<dyn Device>>> {
        self.cpu.devices()
    }

    // `cpu:2`-style selectors ask for a number of devices; the CPU backend makes as many as
    // asked for, each a stream with its own threads.
    fn devices_with_count(&self, n: usize) -> Result<Vec<Arc<dyn Device>>> {
        self.cpu.devices_with_count(n)
    }

    // Optional extras found by name: the CPU backend's shared-memory all-reduce, used when a
    // model is split over several of this plugin's devices.
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        self.cpu.proc_address(name)
    }
}

/// Makes the registry; runs once, when the host first loads the library.
fn make_registry() -> Arc<dyn Registry> {
    Arc::new(ExampleRegistry {
        cpu: tessera_cpu::registry(),
    })
}

// Exports `tessera_backend_init`, the symbol the host looks for.
tessera_plugin::export_backend!(make_registry);
