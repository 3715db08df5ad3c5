//! Backends as run-time plugins. The harness first builds the CPU, CUDA, HIP and SYCL plugins
//! (`libtessera_cpu.so`, `libtessera_cuda.so`, `libtessera_hip.so`, `libtessera_sycl.so`) and the
//! deliberately broken test plugins with the same cargo, profile and target directory as this
//! test, then runs, one trial each:
//!
//! - `conformance/<device>/<case>`: the whole op conformance suite on the plugin-loaded CPU
//!   device, exactly as `conformance.rs` runs it on the compiled-in one;
//! - `cpu-plugin/...`: names and registration, set/get, 2-D copies, typed errors across the
//!   boundary, events in both directions, host memory, foreign buffers refused by name, the comm
//!   trio through `proc_address` on two plugin devices, the generic all-reduce, plugin logs;
//! - `cuda-plugin/...`, `hip-plugin/...`, `sycl-plugin/...`: the vendor plugins load with or
//!   without their runtime and export the comm trio by name;
//! - `broken/...`: wrong ABI version, truncated table, missing entry symbol, a constructor that
//!   panics, calls that panic, files that are not libraries, and a directory scan that keeps
//!   going past the bad files.
//!
//! A failed build fails every trial with cargo's output: CI must run these, never skip them.

use libtest_mimic::{Arguments, Failed, Trial};
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use tessera_core::comm::{Algorithm, AllReduce, CommSlice, Wire};
use tessera_core::comm::{CommApi, CommOutcome};
use tessera_core::{
    Backend, BackendOptions, Bindings, Buffer, Context, DType, Device, DeviceRegistry, Error,
    Registry,
};
use tessera_plugin::{LoadError, PluginRegistry, load_backend};
use tessera_tests::{Case, Status, all_cases, format_line, run_case};

type TrialResult = Result<(), Failed>;
/// A named trial body.
type Named = (&'static str, fn() -> TrialResult);

// ===== Building and loading =====

/// Where the plugins are, once built.
struct Built {
    cpu: PathBuf,
    cuda: PathBuf,
    hip: PathBuf,
    sycl: PathBuf,
    examples: PathBuf,
}

/// Builds the plugins into this test's own target directory and profile, so nothing is rebuilt
/// beyond linking the cdylibs.
fn build() -> Result<Built, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // target/<profile dir>/deps/plugin-<hash>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("the test executable is not in <target>/<profile>/deps")?;
    let target_dir = profile_dir
        .parent()
        .ok_or("the test executable is not in <target>/<profile>/deps")?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => "release",
        _ => "test",
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace root")?;
    let out = std::process::Command::new(cargo)
        .current_dir(workspace)
        .args(["build", "--profile", profile])
        .args(["-p", "tessera-cpu-plugin", "-p", "tessera-cuda-plugin"])
        .args(["-p", "tessera-hip-plugin", "-p", "tessera-sycl-plugin"])
        .args(["-p", "tessera-test-plugins"])
        .args(["--lib", "--examples", "--target-dir"])
        .arg(target_dir)
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build of the plugins failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let so = |dir: &Path, stem: &str| {
        dir.join(format!(
            "{}{stem}{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ))
    };
    let built = Built {
        cpu: so(profile_dir, "tessera_cpu"),
        cuda: so(profile_dir, "tessera_cuda"),
        hip: so(profile_dir, "tessera_hip"),
        sycl: so(profile_dir, "tessera_sycl"),
        examples: profile_dir.join("examples"),
    };
    if !built.cpu.is_file() {
        return Err(format!("{} was not produced", built.cpu.display()));
    }
    Ok(built)
}

fn example(built: &Built, stem: &str) -> PathBuf {
    built.examples.join(format!(
        "{}{stem}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ))
}

static CPU_PLUGIN: OnceLock<Result<Arc<PluginRegistry>, String>> = OnceLock::new();

fn cpu_plugin() -> Result<Arc<PluginRegistry>, Failed> {
    CPU_PLUGIN
        .get()
        .cloned()
        .unwrap_or_else(|| Err("the CPU plugin was never loaded".into()))
        .map_err(Failed::from)
}

fn check(ok: bool, what: impl FnOnce() -> String) -> TrialResult {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn read_f32(buf: &dyn Buffer, offset: usize, n: usize) -> Result<Vec<f32>, Failed> {
    let mut b = vec![0u8; n * 4];
    buf.read(offset, &mut b).map_err(|e| e.to_string())?;
    Ok(tessera_core::dtype::f32_from_le_bytes(&b))
}

fn err<T>(r: tessera_core::Result<T>) -> Result<T, Failed> {
    r.map_err(|e| Failed::from(e.to_string()))
}

// ===== The vendor plugins =====

/// A vendor plugin (`libtessera_cuda.so`, `libtessera_hip.so`, `libtessera_sycl.so`) loads on any machine: with its
/// runtime and a device it lists devices named `prefix...`, without them its registry has none
/// and says why; either way the comm trio is found by name across the ABI.
fn vendor_plugin_loads(path: &Path, backend: &str, prefix: &str) -> TrialResult {
    let reg = load_backend(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    check(reg.name() == format!("{backend}@{file}"), || {
        format!("registry name {:?}", reg.name())
    })?;
    for sym in [
        "tessera_comm_init",
        "tessera_comm_allreduce_tensor",
        "tessera_comm_free",
    ] {
        check(reg.proc_address(sym).is_some(), || {
            format!("{sym} not found")
        })?;
    }
    check(reg.proc_address("tessera_no_such_symbol").is_none(), || {
        "an unknown name resolved".into()
    })?;
    match reg.probe() {
        Ok(()) => {
            let devs = err(reg.devices())?;
            check(!devs.is_empty(), || "probe passed but no devices".into())?;
            for d in &devs {
                check(d.name().starts_with(prefix), || {
                    format!("device {}", d.name())
                })?;
            }
            eprintln!("{file}: {} device(s) through the plugin", devs.len());
        }
        Err(why) => {
            let why = why.to_string();
            check(!why.is_empty(), || "no reason given".into())?;
            check(reg.devices().is_err(), || {
                "devices() without a runtime".into()
            })?;
            eprintln!("{file}: no devices here: {why}");
        }
    }
    Ok(())
}

// ===== The meta device over plugin devices =====

/// `softmax(W2 · silu(W1 · x) + x)` with W1 column-split and W2 row-split (one all-reduce) on a
/// meta device over `devs`; returns the output.
fn meta_mlp(devs: &[Arc<dyn Device>]) -> Result<Vec<f32>, Failed> {
    use tessera_core::meta::{MetaDevice, SplitLayout, SplitState};
    let policy = |t: &tessera_core::TensorDesc, l: &SplitLayout| {
        let n = l.n_devices;
        let even = |len: usize| (0..n).map(|j| len * (j + 1) / n - len * j / n).collect();
        match t.name() {
            "w1" => SplitState::axis_lens(1, even(t.ne()[1])),
            "w2" => SplitState::axis_lens(0, even(t.ne()[0])),
            _ => Ok(SplitState::mirrored()),
        }
    };
    let (d, f, t) = (64, 96, 3);
    let mut ctx = tessera_core::Context::new();
    let x = err(ctx.new_named("x", DType::F32, [d, t]))?;
    let w1 = err(ctx.new_named("w1", DType::F32, [d, f]))?;
    let w2 = err(ctx.new_named("w2", DType::F32, [f, d]))?;
    let h = err(ctx.mul_mat(w1, x))?;
    let h = err(ctx.silu(h))?;
    let o = err(ctx.mul_mat(w2, h))?;
    let o = err(ctx.add(o, x))?;
    let y = err(ctx.soft_max(o))?;
    err(ctx.set_output(y))?;
    let graph = err(ctx.build_forward(y))?;
    let meta = err(MetaDevice::new(devs, policy))?;
    let weights = err(meta
        .buffer_type()
        .alloc_tensors_where(&ctx, |t| t.name().starts_with('w')))?;
    let vals = |n: usize, k: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7 + k * 13) % 23) as f32 / 23.0 - 0.5)
            .collect()
    };
    err(weights.set_f32(w1, &vals(d * f, 1)))?;
    err(weights.set_f32(w2, &vals(f * d, 2)))?;
    let io = err(devs[0]
        .buffer_type()
        .alloc_tensors_where(&ctx, |t| t.name() == "x" || t.flags().output))?;
    err(io.set_f32(x, &vals(d * t, 3)))?;
    let mut b = tessera_core::Bindings::new();
    b.extend(weights.bindings());
    b.extend(io.bindings());
    let mut be = err(meta.init_backend(&BackendOptions::with_threads(1)))?;
    err(be.compute(&graph, &b))?;
    err(be.synchronize())?;
    err(io.get_f32(y))
}

fn meta_device_over_two_plugin_devices() -> TrialResult {
    let p = cpu_plugin()?;
    let devs = err(p.devices_with_count(2))?;
    let got = meta_mlp(&devs)?;
    let single: Vec<Arc<dyn Device>> = vec![Arc::new(tessera_cpu::CpuDevice::new("CPU", vec![]))];
    let want = meta_mlp(&single)?;
    let num: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    check(num / den <= 1e-10, || format!("nmse {:e}", num / den))
}

// ===== Conformance on the plugin device =====

thread_local! {
    static BACKENDS: RefCell<HashMap<String, Box<dyn Backend>>> = RefCell::new(HashMap::new());
}

fn conformance_trial(device: &dyn Device, case: &Case) -> TrialResult {
    BACKENDS.with(|cell| {
        let mut map = cell.borrow_mut();
        let key = device.name().to_string();
        if !map.contains_key(&key) {
            let b = device
                .init_backend(&BackendOptions::default())
                .map_err(|e| format!("{}: init_backend: {e}", device.name()))?;
            map.insert(key.clone(), b);
        }
        let backend = map.get_mut(&key).ok_or("backend cache lost its entry")?;
        let outcome = run_case(device, backend.as_mut(), case);
        match outcome.status {
            Status::Pass { .. } => Ok(()),
            Status::Fail { .. } | Status::NotSupported(_) => {
                map.remove(&key);
                Err(format_line(&outcome).into())
            }
        }
    })
}

// ===== The CPU plugin =====

fn names_and_registration() -> TrialResult {
    let p = cpu_plugin()?;
    check(p.name() == "cpu@libtessera_cpu.so", || {
        format!("registry name {}", p.name())
    })?;
    check(p.plugin_name() == "cpu", || p.plugin_name().into())?;
    check(p.origin().ends_with("libtessera_cpu.so"), || p.origin())?;
    let reg = DeviceRegistry::new();
    reg.register(tessera_cpu::registry());
    reg.register(p.clone());
    let infos = reg.backends();
    check(infos.len() == 2, || format!("{} backends", infos.len()))?;
    let devs = err(p.devices())?;
    for d in &devs {
        check(d.name().ends_with("@libtessera_cpu.so"), || d.name().into())?;
        check(d.backend_name() == p.name(), || d.backend_name().into())?;
        // The device is found by its name and its backend by the device's backend name.
        check(reg.device(d.name()).is_ok(), || {
            format!("{} not found", d.name())
        })?;
        check(reg.registry(d.backend_name()).is_some(), || {
            "backend not found by the device's backend name".into()
        })?;
    }
    check(
        err(reg.select("cpu@libtessera_cpu.so:3"))?.len() == 3,
        || "select NAME:3".into(),
    )?;
    // Loading the same file again gives the same plugin (same registry object underneath).
    let again = load_backend(p.file()).map_err(|e| e.to_string())?;
    check(again.name() == p.name(), || again.name().into())
}

fn set_get_and_2d_copies() -> TrialResult {
    let p = cpu_plugin()?;
    let dev = err(p.devices())?.remove(0);
    let mut ctx = Context::new();
    let a = err(ctx.new_tensor(DType::F32, [8, 4]))?;
    let y = err(ctx.scale(a, 2.0))?;
    let graph = err(ctx.build_forward(y))?;
    let tb = err(dev.buffer_type().alloc_tensors(&ctx))?;
    let vals: Vec<f32> = (0..32).map(|i| i as f32 - 7.5).collect();
    err(tb.set_f32(a, &vals))?;
    check(err(tb.get_f32(a))? == vals, || "get after set".into())?;
    let mut be = err(dev.init_backend(&BackendOptions::with_threads(1)))?;
    err(be.compute(&graph, tb.bindings()))?;
    err(be.synchronize())?;
    let want: Vec<f32> = vals.iter().map(|v| v * 2.0).collect();
    check(err(tb.get_f32(y))? == want, || "scale result".into())?;

    // 2-D: three blocks of 8 bytes, 24 bytes apart in the buffer, 8 apart on the host.
    let buf = tb.buffer().clone();
    let host: Vec<u8> = (0..24).collect();
    err(buf.memset(0, 72, 0xAA))?;
    err(buf.write_2d(0, &host, 8, 3, 24, 8))?;
    let mut back = vec![0u8; 24];
    err(buf.read_2d(0, &mut back, 8, 3, 24, 8))?;
    check(back == host, || format!("read_2d {back:?}"))?;
    let mut gap = [0u8; 16];
    err(buf.read(8, &mut gap))?;
    check(gap.iter().all(|&b| b == 0xAA), || {
        "2-D write touched the gaps".into()
    })?;

    // Typed errors cross the boundary with their fields.
    match buf.write(buf.size() - 2, &[0; 8]) {
        Err(Error::OutOfBounds { size, .. }) if size == buf.size() => {}
        other => return Err(format!("out-of-range write gave {other:?}").into()),
    }
    match buf.write_2d(0, &host, 8, 4, 24, 8) {
        Err(Error::OutOfBounds { .. }) => {}
        other => return Err(format!("short host slice gave {other:?}").into()),
    }

    // Plugin → plugin copies go device-side; plugin ↔ built-in copies are staged.
    let other = err(dev.buffer_type().alloc(128))?;
    err(tessera_core::backend::copy_between(
        buf.as_ref(),
        0,
        other.as_ref(),
        0,
        24,
    ))?;
    let builtin = err(tessera_cpu::CpuDevice::new("CPU", vec![])
        .buffer_type()
        .alloc(64))?;
    err(tessera_core::backend::copy_between(
        other.as_ref(),
        0,
        builtin.as_ref(),
        8,
        24,
    ))?;
    let mut staged = vec![0u8; 8];
    err(builtin.read(8, &mut staged))?;
    check(staged == host[..8], || format!("staged copy {staged:?}"))?;

    // Ordered writes and reads on the plugin stream.
    err(be.write_async(other.as_ref(), 32, &f32_bytes(&[1.5, 2.5])))?;
    let mut out = vec![0u8; 8];
    err(be.read_async(other.as_ref(), 32, &mut out))?;
    check(out == f32_bytes(&[1.5, 2.5]), || {
        "write_async/read_async".into()
    })
}

fn events_cross_both_ways() -> TrialResult {
    let p = cpu_plugin()?;
    let pdev = err(p.devices())?.remove(0);
    let cdev: Arc<dyn Device> = Arc::new(tessera_cpu::CpuDevice::new("CPU", vec![]));
    let mut ctx = Context::new();
    let a = err(ctx.new_tensor(DType::F32, [256, 64]))?;
    let mut y = a;
    for _ in 0..8 {
        y = err(ctx.silu(y))?;
    }
    let graph = err(ctx.build_forward(y))?;
    let vals: Vec<f32> = (0..256 * 64)
        .map(|i| (i % 97) as f32 / 50.0 - 1.0)
        .collect();
    let nbytes = vals.len() * 4;
    let y_off =
        |tb: &tessera_core::TensorBuffer| tb.bindings().slot(y).map(|s| s.offset).unwrap_or(0);

    // Plugin stream → event → built-in stream copies the plugin's result.
    let ptb = err(pdev.buffer_type().alloc_tensors(&ctx))?;
    err(ptb.set_f32(a, &vals))?;
    let mut ps = err(pdev.init_backend(&BackendOptions::with_threads(1)))?;
    let mut cs = err(cdev.init_backend(&BackendOptions::with_threads(1)))?;
    err(ps.compute(&graph, ptb.bindings()))?;
    let ev = err(ps.record_event())?.ok_or("the plugin stream records no events")?;
    let dst = err(cdev.buffer_type().alloc(nbytes))?;
    err(cs.wait_event(&ev))?;
    err(cs.copy_async(ptb.buffer(), y_off(&ptb), &dst, 0, nbytes))?;
    err(cs.synchronize())?;
    err(ev.synchronize())?;
    check(ev.is_complete(), || {
        "event incomplete after synchronize".into()
    })?;
    let want = err(ptb.get_f32(y))?;
    check(read_f32(dst.as_ref(), 0, vals.len())? == want, || {
        "built-in stream copied before the plugin's graph finished".into()
    })?;

    // Built-in stream → host event lent to the plugin stream, which then copies.
    let ctb = err(cdev.buffer_type().alloc_tensors(&ctx))?;
    err(ctb.set_f32(a, &vals))?;
    err(cs.compute(&graph, ctb.bindings()))?;
    let ev = err(cs.record_event())?.ok_or("the CPU stream records no events")?;
    let pdst = err(pdev.buffer_type().alloc(nbytes))?;
    err(ps.wait_event(&ev))?;
    err(ps.copy_async(ctb.buffer(), y_off(&ctb), &pdst, 0, nbytes))?;
    err(ps.synchronize())?;
    check(read_f32(pdst.as_ref(), 0, vals.len())? == want, || {
        "plugin stream copied before the built-in graph finished".into()
    })?;

    // Plugin → plugin: an event of one plugin stream waited on natively by another.
    let mut ps2 = err(pdev.init_backend(&BackendOptions::with_threads(1)))?;
    let ptb2 = err(pdev.buffer_type().alloc_tensors(&ctx))?;
    err(ptb2.set_f32(a, &vals))?;
    err(ps.compute(&graph, ptb2.bindings()))?;
    let ev = err(ps.record_event())?.ok_or("no event")?;
    let pdst2 = err(pdev.buffer_type().alloc(nbytes))?;
    err(ps2.wait_event(&ev))?;
    err(ps2.copy_async(ptb2.buffer(), y_off(&ptb2), &pdst2, 0, nbytes))?;
    err(ps2.synchronize())?;
    check(read_f32(pdst2.as_ref(), 0, vals.len())? == want, || {
        "plugin stream copied before the other plugin stream finished".into()
    })
}

fn host_memory_and_foreign_buffers() -> TrialResult {
    let p = cpu_plugin()?;
    let dev = err(p.devices())?.remove(0);
    check(dev.caps().buffer_from_host, || {
        "caps lost buffer_from_host".into()
    })?;
    let bytes: Arc<Vec<u8>> = Arc::new(f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    let wrapped = err(dev.buffer_from_host(bytes.clone()))?.ok_or("declined host memory")?;
    check(read_f32(wrapped.as_ref(), 4, 2)? == [2.0, 3.0], || {
        "wrapped read".into()
    })?;
    check(wrapped.write(0, &[0; 4]).is_err(), || {
        "wrapped host memory is writable".into()
    })?;
    check(
        dev.owns_buffer(wrapped.as_ref()) || dev.can_access(wrapped.as_ref()),
        || "the plugin device does not recognise its own buffer".into(),
    )?;
    drop(wrapped);
    check(Arc::strong_count(&bytes) == 1, || {
        "the plugin did not release the host memory".into()
    })?;

    // A tensor bound to built-in memory is refused by name, before anything runs.
    let mut ctx = Context::new();
    let a = err(ctx.new_named("weights", DType::F32, [16]))?;
    let y = err(ctx.sqr(a))?;
    let graph = err(ctx.build_forward(y))?;
    let builtin = err(tessera_cpu::CpuDevice::new("CPU", vec![])
        .buffer_type()
        .alloc(64))?;
    let mine = err(dev.buffer_type().alloc(64))?;
    check(!dev.can_access(builtin.as_ref()), || {
        "plugin claims built-in memory".into()
    })?;
    let mut b = Bindings::new();
    b.bind(a, builtin, 0);
    b.bind(y, mine, 0);
    let mut be = err(dev.init_backend(&BackendOptions::with_threads(1)))?;
    match be.compute(&graph, &b) {
        Err(Error::Foreign { what, .. }) if what.contains("'weights'") => Ok(()),
        other => Err(format!("foreign binding gave {other:?}").into()),
    }
}

fn comm_trio_on_two_plugin_devices() -> TrialResult {
    let p = cpu_plugin()?;
    let devs = err(p.devices_with_count(2))?;
    let api = CommApi::from_registry(p.as_ref()).ok_or("no comm trio through proc_address")?;
    let mut streams: Vec<Box<dyn Backend>> = devs
        .iter()
        .map(|d| d.init_backend(&BackendOptions::with_threads(1)))
        .collect::<tessera_core::Result<_>>()
        .map_err(|e| e.to_string())?;
    let len = 10_000;
    let bufs: Vec<Arc<dyn Buffer>> = devs
        .iter()
        .map(|d| d.buffer_type().alloc(16 + len * 4))
        .collect::<tessera_core::Result<_>>()
        .map_err(|e| e.to_string())?;
    for (j, b) in bufs.iter().enumerate() {
        let v: Vec<f32> = (0..len).map(|i| (i * (j + 1)) as f32).collect();
        err(b.write(16, &f32_bytes(&v)))?;
    }
    let slices: Vec<CommSlice> = bufs
        .iter()
        .map(|b| CommSlice {
            buffer: b.clone(),
            offset: 16,
            len,
            contributes: true,
        })
        .collect();
    let mut comm = api
        .init(&mut streams)
        .ok_or("the plugin's comm declined its own streams")?;
    check(err(comm.allreduce(&slices))? == CommOutcome::Done, || {
        "declined".into()
    })?;
    for s in streams.iter_mut() {
        err(s.synchronize())?;
    }
    for b in &bufs {
        let got = read_f32(b.as_ref(), 16, len)?;
        check(
            got.iter().enumerate().all(|(i, &v)| v == (3 * i) as f32),
            || "comm sum is wrong".into(),
        )?;
    }
    // Memory the plugin cannot see: declined before anything is enqueued.
    let builtin = err(tessera_cpu::CpuDevice::new("CPU", vec![])
        .buffer_type()
        .alloc(16 + len * 4))?;
    let mixed = vec![
        slices[0].clone(),
        CommSlice {
            buffer: builtin,
            ..slices[1].clone()
        },
    ];
    check(
        err(comm.allreduce(&mixed))? == CommOutcome::Declined,
        || "a built-in buffer was not declined".into(),
    )?;
    drop(comm);
    // Streams of a plugin and of the built-in backend: init declines.
    let mut mixed_streams: Vec<Box<dyn Backend>> = vec![
        streams.remove(0),
        err(tessera_cpu::CpuDevice::new("CPU", vec![])
            .init_backend(&BackendOptions::with_threads(1)))?,
    ];
    check(api.init(&mut mixed_streams).is_none(), || {
        "mixed streams accepted".into()
    })?;

    // The generic all-reduce (copies, events, ADD graphs) on plugin devices.
    let mut streams: Vec<Box<dyn Backend>> = devs
        .iter()
        .map(|d| d.init_backend(&BackendOptions::with_threads(1)))
        .collect::<tessera_core::Result<_>>()
        .map_err(|e| e.to_string())?;
    let mut ar = err(AllReduce::new(&devs, Wire::F32, Algorithm::Ring))?;
    err(ar.run(&mut streams, &slices))?;
    for s in streams.iter_mut() {
        err(s.synchronize())?;
    }
    for b in &bufs {
        let got = read_f32(b.as_ref(), 16, len)?;
        check(
            got.iter().enumerate().all(|(i, &v)| v == (6 * i) as f32),
            || "generic all-reduce sum is wrong".into(),
        )?;
    }
    Ok(())
}

// ===== Logs =====

/// Records the host's re-emitted plugin events (target `tessera::plugin`).
struct Recorder;

static LOGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Fields(String);
impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={v:?} ", f.name()));
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target() == "tessera::plugin"
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        let mut f = Fields(String::new());
        e.record(&mut f);
        if let Ok(mut logs) = LOGS.lock() {
            logs.push(f.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn plugin_logs_reach_the_host() -> TrialResult {
    let p = cpu_plugin()?;
    let dev = err(p.devices())?.remove(0);
    // Starting a CPU stream logs at debug level inside the plugin.
    drop(err(dev.init_backend(&BackendOptions::with_threads(1)))?);
    let logs = LOGS.lock().map_err(|_| "log lock poisoned")?.clone();
    check(
        logs.iter()
            .any(|l| l.contains("CPU stream started") && l.contains("libtessera_cpu.so")),
        || format!("no forwarded plugin log among {logs:?}"),
    )
}

/// The CPU plugin's device count under `cpu.devices` = 3, set from the host's code, then unset.
fn settings_reach_the_plugin() -> TrialResult {
    use tessera_core::settings::{self, Setting};
    let p = cpu_plugin()?;
    if std::env::var_os(Setting::CpuDevices.env()).is_some() {
        return Err(format!(
            "{} is set: unset it for this test",
            Setting::CpuDevices.env()
        )
        .into());
    }
    err(settings::set(Setting::CpuDevices, "3"))?;
    let three = p.devices().map(|d| d.len());
    err(settings::clear(Setting::CpuDevices))?;
    let one = p.devices().map(|d| d.len());
    check(matches!((&three, &one), (Ok(3), Ok(1))), || {
        format!("devices with cpu.devices=3 then unset: {three:?}, {one:?}")
    })
}

// ===== Broken plugins =====

fn expect_load_error(path: &Path, ok: impl FnOnce(&LoadError) -> bool) -> TrialResult {
    match load_backend(path) {
        Ok(r) => Err(format!("{} loaded as {}", path.display(), r.name()).into()),
        Err(e) => {
            let file = path.display().to_string();
            check(e.file() == file && e.to_string().contains(&file), || {
                format!("error does not name the file: {e}")
            })?;
            check(ok(&e), || format!("unexpected error: {e:?}"))
        }
    }
}

fn panicking_calls_are_typed_errors(built: &Built) -> TrialResult {
    let path = example(built, "tessera_panicky");
    let p = load_backend(&path).map_err(|e| e.to_string())?;
    let dev = err(p.devices())?.remove(0);
    check(dev.name() == "TOY@libtessera_panicky.so", || {
        dev.name().into()
    })?;
    let file = path.display().to_string();
    match dev.init_backend(&BackendOptions::default()) {
        Err(Error::Plugin {
            file: f,
            call,
            reason,
        }) if f == file
            && call == "device.init_backend"
            && reason.contains("deliberate panic in init_backend") => {}
        other => return Err(format!("panicking init_backend gave {other:?}").into()),
    }
    let buf = err(dev.buffer_type().alloc(16))?;
    match buf.write(0, &[1, 2, 3]) {
        Err(Error::Plugin { call, reason, .. })
            if call == "buffer.write" && reason.contains("deliberate panic in write") => {}
        other => return Err(format!("panicking write gave {other:?}").into()),
    }
    // The plugin keeps working after a panic.
    let mut back = [9u8; 4];
    err(buf.read(0, &mut back))?;
    check(back == [0; 4], || format!("read after panic {back:?}"))?;
    // Errors (not panics) keep their variant.
    match buf.read(12, &mut [0u8; 8]) {
        Err(Error::OutOfBounds { .. }) => Ok(()),
        other => Err(format!("out-of-range read gave {other:?}").into()),
    }
}

fn scan_keeps_going(built: &Built) -> TrialResult {
    let dir = std::env::temp_dir().join(format!("tessera-plugin-scan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let link = |src: &Path, name: &str| -> Result<(), Failed> {
        std::os::unix::fs::symlink(src, dir.join(name)).map_err(|e| Failed::from(e.to_string()))
    };
    link(&built.cpu, "libtessera_cpu.so")?;
    link(
        &example(built, "tessera_bad_version"),
        "libtessera_bad_version.so",
    )?;
    link(
        &example(built, "tessera_no_entry"),
        "libtessera-no-entry.so",
    )?;
    std::fs::write(dir.join("libtessera_junk.so"), b"not a library").map_err(|e| e.to_string())?;
    std::fs::write(dir.join("libother.so"), b"ignored: not a tessera name")
        .map_err(|e| e.to_string())?;
    std::fs::write(dir.join("libtessera_.so"), b"ignored: empty name")
        .map_err(|e| e.to_string())?;

    let reg = DeviceRegistry::new();
    let report = tessera_plugin::load_dirs(&reg, std::slice::from_ref(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    check(report.loaded.len() == 1 && report.failed.len() == 3, || {
        format!("{report:?}")
    })?;
    check(
        report.loaded[0].0.ends_with("libtessera_cpu.so")
            && report.loaded[0].1.name() == "cpu@libtessera_cpu.so",
        || format!("{report:?}"),
    )?;
    for (file, e) in &report.failed {
        check(e.file() == file.display().to_string(), || format!("{e}"))?;
    }
    check(
        reg.devices()
            .iter()
            .any(|d| d.name().ends_with("@libtessera_cpu.so")),
        || "the good plugin's devices are not registered".into(),
    )
}

fn main() {
    // Installed before any plugin loads: the host tells plugins its log level at load time.
    let _ = tracing::subscriber::set_global_default(Recorder);
    let args = Arguments::from_args();
    let built = build();
    let mut trials = Vec::new();
    let built = match built {
        Ok(b) => Arc::new(b),
        Err(reason) => {
            // Every trial fails with the reason: a missing plugin is a failure here, not a skip.
            let reason = Arc::new(reason);
            trials.push(Trial::test("build/plugins", move || {
                Err(reason.as_str().into())
            }));
            libtest_mimic::run(&args, trials).exit();
        }
    };
    let _ = CPU_PLUGIN
        .set(load_backend(&built.cpu).map_err(|e| format!("loading {}: {e}", built.cpu.display())));

    // Before any trial runs (settings are process-wide): a value set in the host's code reaches
    // the plugin's own copy of the settings, which reads it when it lists its devices.
    let settings_reach = settings_reach_the_plugin();
    trials.push(Trial::test(
        "cpu-plugin/settings_reach_the_plugin",
        move || settings_reach,
    ));

    // The whole conformance suite on the plugin's default device(s).
    match cpu_plugin().and_then(|p| p.devices().map_err(|e| e.to_string().into())) {
        Ok(devices) => {
            for dev in devices {
                for case in all_cases() {
                    let d = dev.clone();
                    let name = format!("conformance/{}/{}", dev.name(), case.label());
                    trials.push(Trial::test(name, move || {
                        conformance_trial(d.as_ref(), &case)
                    }));
                }
            }
        }
        Err(e) => {
            let reason = format!("{e:?}");
            trials.push(Trial::test("conformance/load", move || Err(reason.into())));
        }
    }

    let plain: [Named; 7] = [
        ("cpu-plugin/names_and_registration", names_and_registration),
        ("cpu-plugin/set_get_and_2d_copies", set_get_and_2d_copies),
        ("cpu-plugin/events_cross_both_ways", events_cross_both_ways),
        (
            "cpu-plugin/host_memory_and_foreign_buffers",
            host_memory_and_foreign_buffers,
        ),
        (
            "cpu-plugin/comm_trio_on_two_plugin_devices",
            comm_trio_on_two_plugin_devices,
        ),
        (
            "cpu-plugin/plugin_logs_reach_the_host",
            plugin_logs_reach_the_host,
        ),
        (
            "cpu-plugin/meta_device_over_two_plugin_devices",
            meta_device_over_two_plugin_devices,
        ),
    ];
    for (name, f) in plain {
        trials.push(Trial::test(name, f));
    }

    let b = built.clone();
    trials.push(Trial::test(
        "cuda-plugin/loads_with_or_without_a_gpu",
        move || vendor_plugin_loads(&b.cuda, "cuda", "CUDA"),
    ));
    let b = built.clone();
    trials.push(Trial::test(
        "hip-plugin/loads_with_or_without_a_gpu",
        move || vendor_plugin_loads(&b.hip, "hip", "HIP"),
    ));
    let b = built.clone();
    trials.push(Trial::test(
        "sycl-plugin/loads_with_or_without_a_runtime",
        move || vendor_plugin_loads(&b.sycl, "sycl", "SYCL"),
    ));
    let b = built.clone();
    trials.push(Trial::test("broken/wrong_abi_version", move || {
        expect_load_error(&example(&b, "tessera_bad_version"), |e| {
            matches!(e, LoadError::AbiVersion { found: 999, expected, table: "registry", .. }
                if *expected == tessera_plugin::abi::ABI_VERSION)
        })
    }));
    let b = built.clone();
    trials.push(Trial::test("broken/truncated_device_table", move || {
        expect_load_error(&example(&b, "tessera_bad_size"), |e| {
            matches!(
                e,
                LoadError::StructSize {
                    table: "device",
                    found: 24,
                    ..
                }
            )
        })
    }));
    let b = built.clone();
    trials.push(Trial::test("broken/missing_entry_symbol", move || {
        expect_load_error(&example(&b, "tessera_no_entry"), |e| {
            matches!(
                e,
                LoadError::MissingSymbol {
                    symbol: "tessera_backend_init",
                    ..
                }
            )
        })
    }));
    let b = built.clone();
    trials.push(Trial::test("broken/panicking_constructor", move || {
        expect_load_error(&example(&b, "tessera_panicky_init"), |e| {
            matches!(e, LoadError::InitFailed { .. })
        })
    }));
    trials.push(Trial::test("broken/missing_file", || {
        expect_load_error(Path::new("/nonexistent/libtessera_nothing.so"), |e| {
            matches!(e, LoadError::Open { .. })
        })
    }));
    let b = built.clone();
    trials.push(Trial::test("broken/panicking_calls", move || {
        panicking_calls_are_typed_errors(&b)
    }));
    let b = built.clone();
    trials.push(Trial::test(
        "broken/scan_keeps_going_past_bad_files",
        move || scan_keeps_going(&b),
    ));
    libtest_mimic::run(&args, trials).exit();
}
