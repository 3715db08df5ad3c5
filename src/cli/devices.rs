//! `tessera devices`: backends, their devices, memory and capabilities.

use tessera::{BACKENDS, registry};

/// Prints every backend Tessera knows: its devices, or why it has none.
pub fn run() -> anyhow::Result<()> {
    let reg = registry();
    let infos = reg.backends();
    for (name, built) in BACKENDS {
        let Some(info) = infos.iter().find(|b| b.name == name) else {
            println!(
                "{name}: {}",
                if built {
                    "registered no devices"
                } else {
                    "not built (enable the cargo feature)"
                }
            );
            continue;
        };
        match &info.devices {
            Err(reason) => println!("{name} ({}): unavailable: {reason}", info.origin),
            Ok(devs) => {
                println!("{name} ({}): {} device(s)", info.origin, devs.len());
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
        }
    }
    for info in infos
        .iter()
        .filter(|i| !BACKENDS.iter().any(|(n, _)| *n == i.name))
    {
        let n = info.devices.as_ref().map(|d| d.len()).unwrap_or(0);
        println!("{} ({}): {n} device(s)", info.name, info.origin);
    }
    println!("\nselect with --devices NAME[,NAME...] or KIND:N (e.g. cpu:2)");
    Ok(())
}
