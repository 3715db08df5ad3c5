//! What CI can check without a GPU (ROCm 5.2 from Debian 12, see `.ci/run`):
//! - the HIP runtime loads and, with no GPU, `hipGetDeviceCount` gives `hipErrorNoDevice`, which
//!   the registry turns into zero devices and a reason (no panic);
//! - hipRTC compiles every kernel source for gfx90a (wave64) and gfx1030 (wave32) with no error
//!   and no warning, into code objects (ELF) whose symbol tables hold every kernel of the source
//!   and its kernel descriptor (`<name>.kd`), for the requested target;
//! - compiled code objects are cached on disk (cold and cached timings are printed);
//! - the bundles embedded at build time by `hipcc --genco` (when hipcc was present) hold a code
//!   object per target with every kernel;
//! - RCCL, when absent (Debian 12 has none), is an error naming it, not a panic;
//! - the runtime exports the stream-capture and graph entry points programs replay through.
//!
//! gfx1100 is never compiled on ROCm 5.2 (its hipRTC aborts the process): the backend refuses it
//! before calling hipRTC, which a trial checks.
//!
//! When the runtime is missing the trials are ignored with the reason in their names, except
//! under `CI=true` (or `TESSERA_REQUIRE=hip`), where they fail.

use libtest_mimic::{Arguments, Failed, Trial};
use std::time::Instant;
use tessera_core::Registry;
use tessera_hip::compile::{AOT_ARCHS, aot_bundle, cache_file_name, compile_cached};
use tessera_hip::sys::{HIP_ERROR_NO_DEVICE, Hip};
use tessera_kernels::hip::{CI_ARCHS, files, kernels_of, source};

/// A trial for a missing library: a failure when required (CI), else ignored with the reason.
fn missing(name: String, reason: &str) -> Trial {
    tessera_tests::harness::missing_trial("hip", name, reason)
}

/// The names of the symbols of an ELF64 little-endian image (`.symtab` and `.dynsym`).
fn elf_symbols(image: &[u8]) -> Result<Vec<String>, String> {
    let u16_at = |o: usize| -> Option<u16> {
        Some(u16::from_le_bytes(image.get(o..o + 2)?.try_into().ok()?))
    };
    let u32_at = |o: usize| -> Option<u32> {
        Some(u32::from_le_bytes(image.get(o..o + 4)?.try_into().ok()?))
    };
    let u64_at = |o: usize| -> Option<usize> {
        Some(u64::from_le_bytes(image.get(o..o + 8)?.try_into().ok()?) as usize)
    };
    if !image.starts_with(b"\x7fELF") || image.get(4) != Some(&2) || image.get(5) != Some(&1) {
        return Err("not an ELF64 little-endian image".into());
    }
    let bad = || "truncated ELF".to_string();
    let shoff = u64_at(0x28).ok_or_else(bad)?;
    let shentsize = u16_at(0x3a).ok_or_else(bad)? as usize;
    let shnum = u16_at(0x3c).ok_or_else(bad)? as usize;
    let section = |i: usize| -> Option<(u32, usize, usize, usize, usize)> {
        let h = shoff + i * shentsize;
        // (type, offset, size, link, entsize)
        Some((
            u32_at(h + 4)?,
            u64_at(h + 0x18)?,
            u64_at(h + 0x20)?,
            u32_at(h + 0x28)? as usize,
            u64_at(h + 0x38)?,
        ))
    };
    let mut names = Vec::new();
    for i in 0..shnum {
        let (ty, off, size, link, entsize) = section(i).ok_or_else(bad)?;
        if (ty != 2 && ty != 11) || entsize == 0 {
            continue;
        }
        let (_, str_off, str_size, _, _) = section(link).ok_or_else(bad)?;
        let strtab = image.get(str_off..str_off + str_size).ok_or_else(bad)?;
        for s in 0..size / entsize {
            let name_off = u32_at(off + s * entsize).ok_or_else(bad)? as usize;
            let Some(rest) = strtab.get(name_off..) else {
                continue;
            };
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            names.push(String::from_utf8_lossy(&rest[..end]).into_owned());
        }
    }
    Ok(names)
}

/// Every kernel of `file` and its descriptor are symbols of `image`.
fn check_symbols(image: &[u8], file: &str) -> Result<usize, Failed> {
    let symbols = elf_symbols(image).map_err(Failed::from)?;
    let mut n = 0;
    for kernel in kernels_of(file) {
        for sym in [kernel.to_string(), format!("{kernel}.kd")] {
            if !symbols.contains(&sym) {
                return Err(Failed::from(format!(
                    "symbol {sym} missing from the code object"
                )));
            }
            n += 1;
        }
    }
    Ok(n)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn compile_trial(hip: &'static Hip, file: &'static str, arch: &'static str) -> Trial {
    Trial::test(format!("hiprtc/{file}/{arch}"), move || {
        let src = source(file).ok_or("no source")?;
        let t = Instant::now();
        let (code, log) = hip
            .compile(file, &src, arch)
            .map_err(|e| Failed::from(e.to_string()))?;
        let secs = t.elapsed().as_secs_f64();
        if !log.is_empty() {
            return Err(Failed::from(format!(
                "compiler output (warnings count as failures):\n{log}"
            )));
        }
        let n = check_symbols(&code, file)?;
        if !contains(&code, arch.as_bytes()) {
            return Err(Failed::from(format!(
                "the code object does not name {arch}"
            )));
        }
        println!(
            "hipRTC {file} for {arch}: {} bytes, {n} kernel symbols, {secs:.2} s",
            code.len()
        );
        Ok(())
    })
}

fn cache_trial(hip: &'static Hip) -> Trial {
    Trial::test("hiprtc/disk_cache", move || {
        let dir = std::env::temp_dir().join(format!("tessera-hip-cache-{}", std::process::id()));
        // SAFETY: set before any other thread of this test binary reads the environment
        // variable (trials run in this process, but only this one reads XDG_CACHE_HOME).
        unsafe { std::env::set_var("XDG_CACHE_HOME", &dir) };
        let (file, arch) = ("norm.cu", CI_ARCHS[0]);
        let version = hip
            .runtime_version()
            .map_err(|e| Failed::from(e.to_string()))?;
        let name = cache_file_name(file, &source(file).ok_or("no source")?, arch, version);
        let t = Instant::now();
        let first = compile_cached(hip, file, arch).map_err(|e| Failed::from(e.to_string()))?;
        let cold = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let second = compile_cached(hip, file, arch).map_err(|e| Failed::from(e.to_string()))?;
        let cached = t.elapsed().as_secs_f64();
        let written = dir.join("tessera/hip").join(&name).exists();
        let _ = std::fs::remove_dir_all(&dir);
        if first != second {
            return Err(Failed::from(
                "the cached code object differs from the compiled one",
            ));
        }
        if !written {
            return Err(Failed::from(format!("{name} was not written")));
        }
        println!("{file} for {arch}: cold {cold:.3} s, from the disk cache {cached:.4} s");
        Ok(())
    })
}

fn no_device_trial(hip: &'static Hip) -> Trial {
    Trial::test("hip/device_count_or_reason", move || {
        let version = hip
            .runtime_version()
            .map_err(|e| Failed::from(e.to_string()))?;
        let reg = tessera_hip::HipRegistry::new();
        match hip.device_count() {
            Ok(n) if n > 0 => {
                println!("HIP {version}: {n} GPU(s)");
                if reg.gpu_count() == 0 {
                    return Err(Failed::from(format!(
                        "GPUs present, but: {:?}",
                        reg.reason()
                    )));
                }
            }
            other => {
                if let Err(tessera_core::Error::Driver { code, .. }) = &other
                    && *code != HIP_ERROR_NO_DEVICE as i64
                {
                    return Err(Failed::from(format!("unexpected status: {other:?}")));
                }
                let reason = reg.reason().ok_or("no GPU, but no reason given")?;
                if reg.gpu_count() != 0 || reg.devices().is_ok() || reg.probe().is_ok() {
                    return Err(Failed::from("no GPU, yet the registry offers devices"));
                }
                println!("HIP {version}, no device: {reason}");
            }
        }
        Ok(())
    })
}

/// On runtimes before HIP 5.5 a gfx11 hipRTC compile is refused before hipRTC is called (ROCm
/// 5.2's would abort this process).
fn gfx11_trial(hip: &'static Hip) -> Trial {
    Trial::test("hiprtc/gfx1100_refused_before_rocm_5_5", move || {
        let version = hip
            .runtime_version()
            .map_err(|e| Failed::from(e.to_string()))?;
        if version >= 50_500_000 {
            println!("HIP {version} may compile gfx1100; nothing to refuse");
            return Ok(());
        }
        match hip.compile("norm.cu", &source("norm.cu").ok_or("no source")?, "gfx1100") {
            Err(e) => {
                println!("refused: {e}");
                Ok(())
            }
            Ok(_) => Err(Failed::from("a gfx1100 compile was attempted")),
        }
    })
}

fn aot_trial(file: &'static str) -> Trial {
    Trial::test(format!("aot/{file}"), move || {
        let bundle = aot_bundle(file).ok_or("no embedded bundle")?;
        for arch in AOT_ARCHS {
            let id = format!("hipv4-amdgcn-amd-amdhsa--{arch}");
            if !contains(bundle, id.as_bytes()) {
                return Err(Failed::from(format!("bundle lacks {id}")));
            }
        }
        for kernel in kernels_of(file) {
            if !contains(bundle, format!("{kernel}.kd").as_bytes()) {
                return Err(Failed::from(format!("bundle lacks {kernel}")));
            }
        }
        Ok(())
    })
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    let names = || files().flat_map(|f| CI_ARCHS.iter().map(move |a| (f, *a)));
    match Hip::get() {
        Ok(hip) => {
            println!(
                "HIP runtime {:?}, hipRTC {:?}, from {}",
                hip.runtime_version().ok(),
                hip.rtc_version().ok(),
                hip.path().display()
            );
            trials.push(no_device_trial(hip));
            // Programs replay through hipGraph: every runtime CI or users have (4.3 and later)
            // exports its capture API, and a missing entry point would silently turn replay off.
            trials.push(Trial::test("hip/graph_capture_api", move || {
                hip.graphs().map_err(|e| Failed::from(e.to_string()))
            }));
            match hip.rtc_version() {
                Ok(_) => {
                    trials.extend(names().map(|(f, a)| compile_trial(hip, f, a)));
                    trials.push(cache_trial(hip));
                    trials.push(gfx11_trial(hip));
                }
                Err(e) => {
                    let reason = e.to_string();
                    trials
                        .extend(names().map(|(f, a)| missing(format!("hiprtc/{f}/{a}"), &reason)));
                }
            }
        }
        Err(reason) => {
            trials.push(missing("hip/device_count_or_reason".into(), &reason));
            trials.push(missing("hip/graph_capture_api".into(), &reason));
            trials.extend(names().map(|(f, a)| missing(format!("hiprtc/{f}/{a}"), &reason)));
            // Without ROCm the registry must still answer, with a reason.
            trials.push(Trial::test("hip/no_runtime_reason", || {
                let reg = tessera_hip::HipRegistry::new();
                match reg.reason() {
                    Some(_) if reg.gpu_count() == 0 => Ok(()),
                    _ => Err(Failed::from("no runtime, yet no reason")),
                }
            }));
        }
    }
    if AOT_ARCHS.is_empty() {
        trials.push(
            Trial::test(
                "[skipped: hipcc was not found at build time] aot",
                || Ok(()),
            )
            .with_ignored_flag(true),
        );
    } else {
        trials.extend(files().map(aot_trial));
    }
    trials.push(Trial::test("rccl/absent_is_a_reason", || {
        match tessera_hip::load_rccl() {
            Ok(r) => println!("RCCL {:?} from {}", r.version().ok(), r.path().display()),
            Err(e) => println!("RCCL unavailable (the generic all-reduce runs): {e}"),
        }
        Ok(())
    }));
    libtest_mimic::run(&args, trials).exit();
}
