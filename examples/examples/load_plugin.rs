//! Load a backend plugin at run time and run a graph on its device.
//!
//! The plugin is the `tessera_example_plugin` example (a shared library wrapping the CPU
//! backend under the name `example`). This program looks for it next to itself, in the
//! `examples` directory of the target profile, loads it with `tessera_plugin::load_backend`,
//! lists the devices it brings, and computes `y = silu(W · x)` on the first one, checking the
//! result against plain Rust.
//!
//! A loaded device is an ordinary `Arc<dyn Device>`: buffers, streams, the scheduler and the
//! meta device use it like a compiled-in one. (`tessera::register_plugin(path)` also registers the
//! plugin in `tessera::registry()`, and directories listed in `TESSERA_BACKEND_PATH` are
//! scanned for `libtessera_*.so` files automatically.)
//!
//! Build the plugin, then run this:
//!
//! ```sh
//! cargo build --release -p tessera-examples --example tessera_example_plugin
//! cargo run --release -p tessera-examples --example load_plugin [-- PATH/TO/PLUGIN.so]
//! ```

use anyhow::{Context as _, ensure};
use std::path::PathBuf;
use tessera::{BackendOptions, Context, DType, Registry};

/// Input and output widths of the test graph.
const K: usize = 8;
const M: usize = 4;
/// The plugin computes in f32 as the CPU backend does: only rounding can differ.
const TOLERANCE: f32 = 1e-5;

fn main() -> anyhow::Result<()> {
    // ---- Find the library: an argument, else next to this executable. ----
    let path = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().context("finding this executable")?;
            let dir = exe.parent().context("this executable has no directory")?;
            // `libtessera_example_plugin.so` on Linux (`.dylib` on macOS, `.dll` on Windows).
            dir.join(format!(
                "{}tessera_example_plugin{}",
                std::env::consts::DLL_PREFIX,
                std::env::consts::DLL_SUFFIX
            ))
        }
    };
    if !path.is_file() {
        eprintln!(
            "{} not found; build the plugin first, with the same profile as this program:\n    \
             cargo build -p tessera-examples --example tessera_example_plugin   (add --release \
             for a release run)",
            path.display()
        );
        std::process::exit(2);
    }

    // ---- Load it. ----
    // Opens the library, calls its `tessera_backend_init` and checks the tables' magic, ABI
    // version and sizes. Errors name the file and what went wrong.
    let registry = tessera_plugin::load_backend(&path)?;
    println!("loaded {} from {}", registry.name(), registry.origin());
    let devices = registry.devices()?;
    for d in &devices {
        println!("  device {} ({} backend)", d.name(), d.backend_name());
    }
    let dev = devices.first().context("the plugin has no devices")?;

    // ---- Run a small graph on the plugin's device. ----
    let w: Vec<f32> = (0..K * M).map(|i| (i as f32 - 15.5) / 16.0).collect();
    let x: Vec<f32> = (0..K).map(|i| 1.0 - i as f32 / 4.0).collect();

    let mut ctx = Context::new();
    let w_id = ctx.new_tensor(DType::F32, [K, M])?;
    let x_id = ctx.new_tensor(DType::F32, [K, 1])?;
    let wx = ctx.mul_mat(w_id, x_id)?; // [M, 1]
    let y = ctx.silu(wx)?;
    let graph = ctx.build_forward(y)?;

    // The buffer lives in the plugin's memory; reads and writes cross the library boundary.
    let buf = dev.buffer_type().alloc_tensors(&ctx)?;
    buf.set_f32(w_id, &w)?;
    buf.set_f32(x_id, &x)?;
    let mut backend = dev.init_backend(&BackendOptions::default())?;
    backend.compute(&graph, buf.bindings())?;
    backend.synchronize()?;
    let got = buf.get_f32(y)?;

    // ---- Check against plain Rust. ----
    let silu = |v: f32| v / (1.0 + (-v).exp());
    let want: Vec<f32> = (0..M)
        .map(|m| silu((0..K).map(|k| w[m * K + k] * x[k]).sum()))
        .collect();
    let err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    println!("y = silu(W·x) on {}: {got:?}", dev.name());
    println!("max |err| against plain Rust: {err:.2e} (≤ {TOLERANCE:.0e})");
    ensure!(
        err <= TOLERANCE,
        "the plugin's result is outside the tolerance"
    );
    println!("PASS");
    Ok(())
}
