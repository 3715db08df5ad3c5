//! `tessera devices`: backends, their devices, memory and capabilities.

use std::path::PathBuf;
use tessera::BackendInfo;
use tessera::{BACKENDS, registry};

/// Prints every backend Tessera knows: its devices, or why it has none. Plugins are loaded first:
/// the files in `load`, then every plugin [`tessera::load_all`] finds (`TESSERA_BACKEND_PATH`
/// and the executable's directory); plugins that fail are listed with the reason.
pub fn run(load: &[PathBuf]) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    for path in load {
        if let Err(e) = tessera::register_plugin(path) {
            failed.push(e);
        }
    }
    failed.extend(tessera::load_all().failed.into_iter().map(|(_, e)| e));
    let reg = registry();
    let infos = reg.backends();
    for (name, built) in BACKENDS {
        match infos.iter().find(|b| b.name == name) {
            Some(info) => print_backend(info),
            None => println!(
                "{name}: {}",
                if built {
                    "registered no devices"
                } else {
                    "not built (enable the cargo feature, or load it as a plugin)"
                }
            ),
        }
    }
    for info in infos
        .iter()
        .filter(|i| !BACKENDS.iter().any(|(n, _)| *n == i.name))
    {
        print_backend(info);
    }
    for e in &failed {
        println!("plugin not loaded: {e}");
    }
    println!("\nselect with --devices NAME[,NAME...] or KIND:N (e.g. cpu:2)");
    print_settings();
    Ok(())
}

/// Every setting, its variable, the values it takes and its value in this run.
fn print_settings() {
    use tessera::settings::{self, Setting};
    println!("\nsettings (--set KEY=VALUE, or the variable):");
    for &s in Setting::ALL {
        let value = settings::var(s.env()).unwrap_or_else(|| "default".into());
        println!(
            "  {:<22} {:<30} {value:<8} ({})",
            s.key(),
            s.env(),
            s.values()
        );
    }
}

fn print_backend(info: &BackendInfo) {
    let origin = if info.origin == "built-in" {
        info.origin.clone()
    } else {
        format!("loaded from {}", info.origin)
    };
    let devs = match &info.devices {
        Err(reason) => {
            println!("{} ({origin}): unavailable: {reason}", info.name);
            return;
        }
        Ok(devs) => devs,
    };
    println!("{} ({origin}): {} device(s)", info.name, devs.len());
    for d in devs {
        let mem = d.memory();
        let caps = d.caps();
        println!(
            "  {:<8} {:<5} {}",
            d.name(),
            d.kind().to_string(),
            d.description()
        );
        println!(
            "           memory {:.1} GiB free / {:.1} GiB; async {}, events {}, host buffers {}, wrap host memory {}",
            mem.free as f64 / (1u64 << 30) as f64,
            mem.total as f64 / (1u64 << 30) as f64,
            caps.is_async,
            caps.events,
            caps.host_buffer,
            caps.buffer_from_host
        );
    }
}
