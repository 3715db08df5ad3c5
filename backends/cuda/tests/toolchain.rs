//! What CI can check without a GPU: NVRTC compiles every kernel source of `kernels/gpu` to PTX
//! and CUBIN for sm_80 and sm_90 with no error and no warning, and each kernel alone as a
//! narrowed compile unit; compiled images are cached on disk; NCCL loads and reports its version.
//!
//! NVRTC and NCCL come from `TESSERA_NVRTC_PATH` / `TESSERA_NCCL_PATH`, the loader path or the
//! nearest `.venv` (see `.ci/run`). When a library is missing the trials are ignored with the
//! reason in their names, except under `CI=true` (or `TESSERA_REQUIRE=cuda`), where they fail.

use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::Arc;
use tessera_cuda::compile::{cache_file_name, compile_cached};
use tessera_cuda::nccl::Nccl;
use tessera_cuda::nvrtc::{Nvrtc, Target};
use tessera_kernels::gpu::unit::{TypeSet, Unit};
use tessera_kernels::gpu::{HEADERS, KERNELS, SOURCES};

/// The tile products `mma.cuh` issues on sm_80 and later, and a source that must use each.
const MMA: [(&str, &str); 2] = [
    (
        "matmul.cu",
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
    ),
    (
        "attn.cu",
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    ),
];

/// Architectures every kernel must compile for.
const ARCHS: [u32; 2] = [80, 90];

/// A trial for a missing library: a failure when required (CI), else ignored with the reason.
fn missing(name: String, reason: &str) -> Trial {
    tessera_tests::harness::missing_trial("cuda", name, reason)
}

fn compile_trial(
    nvrtc: Arc<Nvrtc>,
    file: &'static str,
    source: &'static str,
    target: Target,
) -> Trial {
    let name = format!("nvrtc/{file}/{}", target.arch_flag());
    Trial::test(name, move || {
        let out = nvrtc
            .compile(file, source, HEADERS, target, &[])
            .map_err(|e| Failed::from(e.to_string()))?;
        if !out.log.is_empty() {
            return Err(Failed::from(format!(
                "compiler output (warnings count as failures):\n{}",
                out.log
            )));
        }
        if out.image.is_empty() {
            return Err(Failed::from("empty image"));
        }
        match target {
            Target::Ptx(a) => {
                let text = String::from_utf8_lossy(&out.image);
                if !text.contains(&format!(".target sm_{a}")) {
                    return Err(Failed::from(format!("PTX lacks `.target sm_{a}`")));
                }
                // The quantized GEMM and prompt attention multiply on tensor cores from sm_80
                // on, not through mma.cuh's portable tile products.
                for (source, instruction) in MMA {
                    if file == source && !text.contains(instruction) {
                        return Err(Failed::from(format!("PTX lacks `{instruction}`")));
                    }
                }
            }
            Target::Cubin(_) => {
                if !out.image.starts_with(b"\x7fELF") {
                    return Err(Failed::from("CUBIN is not an ELF image"));
                }
            }
        }
        let image = String::from_utf8_lossy(&out.image);
        for (_, kernel) in KERNELS.iter().filter(|(f, _)| *f == file) {
            if !image.contains(kernel) {
                return Err(Failed::from(format!("{kernel} missing from the image")));
            }
        }
        Ok(())
    })
}

fn cache_trial(nvrtc: Arc<Nvrtc>) -> Trial {
    Trial::test("nvrtc/disk_cache", move || {
        let (file, source) = SOURCES[0];
        let target = Target::Cubin(80);
        let name = cache_file_name(&nvrtc, file, source, target);
        if !name.contains("sm_80") || !name.ends_with(".cubin") {
            return Err(Failed::from(format!("unexpected cache file name {name}")));
        }
        let first = compile_cached(&nvrtc, file, source, target)
            .map_err(|e| Failed::from(e.to_string()))?;
        let second = compile_cached(&nvrtc, file, source, target)
            .map_err(|e| Failed::from(e.to_string()))?;
        if first != second {
            return Err(Failed::from(
                "the cached image differs from the compiled one",
            ));
        }
        if let Some(dir) = tessera_cuda::compile::cache_dir()
            && !dir.join(&name).exists()
        {
            return Err(Failed::from(format!(
                "{} was not written",
                dir.join(&name).display()
            )));
        }
        Ok(())
    })
}

/// The comm across processes (`--dist mpi` with CUDA devices): the registry exports its two
/// functions, and making a job id either works (NCCL needs no GPU for it) or is a clean error
/// with NCCL's reason. With no GPU there is nothing to join: `MetaDevice` then reduces within
/// each rank and across ranks through MPI (tests of the facade cover that path).
fn across_processes_trial() -> Trial {
    Trial::test("nccl/comm_across_processes", || {
        let reg = tessera_cuda::registry();
        let api = tessera_core::comm::RanksCommApi::from_registry(reg.as_ref())
            .ok_or_else(|| Failed::from("the CUDA registry exports no comm across processes"))?;
        match api.unique_id() {
            Ok(id) => {
                if id.len() != tessera_core::comm::COMM_ID_BYTES || id.iter().all(|&b| b == 0) {
                    return Err(Failed::from(format!("implausible job id {id:?}")));
                }
                println!("NCCL made a job id without a GPU ({} bytes)", id.len());
            }
            Err(e) => println!("no job id here (reported, not a crash): {e}"),
        }
        Ok(())
    })
}

/// A one-kernel unit with a narrowed type set (`tessera_kernels::gpu::unit`, what SYCL builds
/// per launch) compiles under NVRTC too, without warnings, and its PTX holds that kernel alone.
fn unit_trial(nvrtc: Arc<Nvrtc>, kernel: &'static str) -> Trial {
    Trial::test(format!("nvrtc/unit/{kernel}"), move || {
        // f32 and f16 activations, K-quant and Q4_0 weights: float, block and super-block
        // decoders survive, the others are compiled out.
        let unit = Unit::kernel(kernel, TypeSet::from_codes([0, 1, 5, 14]))
            .ok_or_else(|| Failed::from(format!("no unit for {kernel}")))?;
        let source = unit.assemble("").ok_or_else(|| Failed::from("no source"))?;
        let out = nvrtc
            .compile(&unit.label(), &source, &[], Target::Ptx(80), &[])
            .map_err(|e| Failed::from(e.to_string()))?;
        if !out.log.is_empty() {
            return Err(Failed::from(format!(
                "compiler output (warnings count as failures):\n{}",
                out.log
            )));
        }
        let ptx = String::from_utf8_lossy(&out.image);
        for &(_, k) in KERNELS {
            let entry = ptx.contains(&format!(".entry {k}("));
            if entry != (k == kernel) {
                return Err(Failed::from(format!(
                    "{}: entry {k} {}",
                    unit.label(),
                    if entry { "present" } else { "missing" }
                )));
            }
        }
        Ok(())
    })
}

/// Sources whose kernels must not spill registers to local memory: the GEMV, GEMM and attention
/// kernels, where a spill turns register traffic into memory traffic on the hot path.
const NO_SPILL: [&str; 2] = ["matmul.cu", "attn.cu"];

/// `source` compiled to CUBIN for sm_`arch` with ptxas's resource report (`-Xptxas -v`): fails
/// naming every function with spill stores or loads, and prints each kernel's registers.
fn spill_trial(nvrtc: Arc<Nvrtc>, file: &'static str, source: &'static str, arch: u32) -> Trial {
    Trial::test(format!("nvrtc/resources/{file}/sm_{arch}"), move || {
        // With the tuning constants TESSERA_CUDA_DEFINES sets, as the kernels run with them.
        let defines = tessera_cuda::compile::defines();
        let mut options = vec!["-Xptxas=-v"];
        options.extend(defines.iter().map(String::as_str));
        let out = nvrtc
            .compile(file, source, HEADERS, Target::Cubin(arch), &options)
            .map_err(|e| Failed::from(e.to_string()))?;
        let report = resource_report(&out.log);
        if report.is_empty() {
            return Err(Failed::from(format!(
                "no resource report in the compiler output:\n{}",
                out.log
            )));
        }
        let mut spills = Vec::new();
        for (function, registers, spill_bytes) in &report {
            println!(
                "{file} sm_{arch}: {function}: {registers} registers, {spill_bytes} bytes spilled"
            );
            if *spill_bytes > 0 {
                spills.push(format!("{function} ({spill_bytes} bytes)"));
            }
        }
        if spills.is_empty() {
            Ok(())
        } else {
            Err(Failed::from(format!("spills in {}", spills.join(", "))))
        }
    })
}

/// ptxas's `-v` report as (function, registers, spill store + load bytes) per function: a
/// `Compiling entry function 'NAME'` or `Function properties for NAME` line names it, then
/// `N bytes spill stores, M bytes spill loads` and `Used R registers` follow.
fn resource_report(log: &str) -> Vec<(String, u32, u32)> {
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    let number_before = |line: &str, word: &str| -> Option<u32> {
        let at = line.find(word)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            let name = rest.trim().to_string();
            if !out.iter().any(|(f, _, _)| *f == name) {
                out.push((name, 0, 0));
            }
        } else if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or(rest).to_string();
            if !out.iter().any(|(f, _, _)| *f == name) {
                out.push((name, 0, 0));
            }
        } else if let Some(last) = out.last_mut() {
            if let (Some(st), Some(ld)) = (
                number_before(line, "bytes spill stores"),
                number_before(line, "bytes spill loads"),
            ) {
                last.2 = st + ld;
            }
            if let Some(r) = number_before(line, "registers") {
                last.1 = r;
            }
        }
    }
    out
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = Vec::new();
    let names = || {
        SOURCES.iter().flat_map(|(f, s)| {
            ARCHS
                .iter()
                .flat_map(move |&a| [Target::Ptx(a), Target::Cubin(a)].map(|t| (*f, *s, t)))
        })
    };
    match Nvrtc::load() {
        Ok(nvrtc) => {
            let nvrtc = Arc::new(nvrtc);
            println!(
                "NVRTC {}.{} from {}",
                nvrtc.version().0,
                nvrtc.version().1,
                nvrtc.path().display()
            );
            for (f, s, t) in names() {
                trials.push(compile_trial(nvrtc.clone(), f, s, t));
            }
            for &(_, k) in KERNELS {
                trials.push(unit_trial(nvrtc.clone(), k));
            }
            for (f, s) in SOURCES.iter().filter(|(f, _)| NO_SPILL.contains(f)) {
                for &a in &ARCHS {
                    trials.push(spill_trial(nvrtc.clone(), f, s, a));
                }
            }
            trials.push(cache_trial(nvrtc));
            trials.push(Trial::test("nvrtc/resources/report_parses", || {
                // As ptxas -v prints it (NVRTC 12.9), one clean kernel and one that spills.
                let log = "ptxas info    : Compiling entry function 'k_a' for 'sm_90'\n\
                    ptxas info    : Function properties for k_a\n\
                    \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                    ptxas info    : Used 40 registers, used 0 barriers, 400 bytes cmem[0]\n\
                    ptxas info    : Compiling entry function 'k_b' for 'sm_90'\n\
                    ptxas info    : Function properties for k_b\n\
                    \x20   8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
                    ptxas info    : Used 255 registers, used 1 barriers, 400 bytes cmem[0]\n";
                let r = resource_report(log);
                let want = vec![("k_a".to_string(), 40, 0), ("k_b".to_string(), 255, 12)];
                if r == want {
                    Ok(())
                } else {
                    Err(Failed::from(format!("parsed {r:?}, expected {want:?}")))
                }
            }));
        }
        Err(e) => {
            let reason = e.to_string();
            for (f, _, t) in names() {
                trials.push(missing(format!("nvrtc/{f}/{}", t.arch_flag()), &reason));
            }
            for &(_, k) in KERNELS {
                trials.push(missing(format!("nvrtc/unit/{k}"), &reason));
            }
            for f in NO_SPILL {
                for a in ARCHS {
                    trials.push(missing(format!("nvrtc/resources/{f}/sm_{a}"), &reason));
                }
            }
            trials.push(missing("nvrtc/disk_cache".into(), &reason));
        }
    }
    match Nccl::load() {
        Ok(nccl) => trials.push(Trial::test("nccl/get_version", move || {
            let v = nccl.version().map_err(|e| Failed::from(e.to_string()))?;
            println!("NCCL {v} from {}", nccl.path().display());
            if v < 21000 {
                return Err(Failed::from(format!("NCCL {v} predates bf16 (2.10)")));
            }
            Ok(())
        })),
        Err(e) => trials.push(missing("nccl/get_version".into(), &e.to_string())),
    }
    trials.push(across_processes_trial());
    libtest_mimic::run(&args, trials).exit();
}
