//! Process-wide settings that change how backends run: the `TESSERA_*` environment variables,
//! settable from code as well ([`set`]), checked when set.
//!
//! Every [`Setting`] has an environment variable ([`Setting::env`]) and a key
//! ([`Setting::key`], e.g. `cpu.repack`). A value [`set`] from code wins over the environment;
//! backends read them through [`var`] (or [`var_once`] for values they read once per process).
//! Setting one from code is what `std::env::set_var` would do, without its `unsafe` (another
//! thread may be reading the environment) and with the value checked at once.
//!
//! Each setting is read at a known moment ([`Setting::read`]): when devices are listed, when a
//! stream or buffer is made, or once per process. A value set after a once-per-process read is
//! refused with [`Error::InvalidArgument`], since it could no longer take effect.
//!
//! Variables that locate things (library paths, kernel caches, the plugin path) stay
//! environment-only: they describe the machine, not the run.
//!
//! ```
//! use tessera_core::settings::{self, Setting};
//! settings::set(Setting::GpuReplay, "0")?;
//! assert_eq!(settings::var(Setting::GpuReplay.env()).as_deref(), Some("0"));
//! assert!(settings::set(Setting::CpuDevices, "0").is_err());
//! settings::clear(Setting::GpuReplay)?;
//! # Ok::<(), tessera_core::Error>(())
//! ```

use crate::{Error, Result};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::OnceLock;

/// A setting that changes how a backend runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Setting {
    /// Lowers the CPU kernels' instruction-set level (e.g. `avx2`, `neon`): for comparisons
    /// and for testing lower levels on a newer CPU.
    CpuIsa,
    /// `0` keeps CPU weights in the file's layout instead of repacking them for the kernels
    /// (ggml's `--no-repack`).
    CpuRepack,
    /// Lists the CPU as this many devices, the cores divided among them.
    CpuDevices,
    /// Slice size in bytes from which the CPU all-reduce writes with streaming stores.
    CpuCommStreamFrom,
    /// `0` turns off replay of recorded GPU programs (CUDA graphs, Vulkan command buffers,
    /// hipGraph).
    GpuReplay,
    /// `0` turns off the GPU plan's fused launches.
    GpuFuse,
    /// `0` turns off the GPU GEMVs on 8-bit activations.
    GpuGemv8,
    /// Where the GPU kernels on tensor-core tiles (the quantized GEMM, prompt attention) run:
    /// `0` nowhere, `1` also where they are emulated; by default on GPUs with the instructions.
    GpuMma,
    /// Keys per block of the GPU split decode attention (rounded up to a multiple of 32).
    GpuFaChunk,
    /// Weight rows per block of the GPU GEMVs on 8-bit activations.
    GpuG8Rows,
    /// CUDA all-reduce: `nccl` (default) or `none` (the generic path).
    CudaAllReduce,
    /// HIP all-reduce: `rccl` (default) or `none` (the generic path).
    HipAllReduce,
    /// `1` records HIP programs with hipGraph and replays them (off by default: not yet run on
    /// an AMD GPU).
    HipGraphs,
    /// SYCL all-reduce: `ring` (default) or `none` (the generic path).
    SyclAllReduce,
    /// Vulkan all-reduce through the host: `f32` (default), `bf16` (half the bytes) or `none`.
    VulkanAllReduce,
    /// `0` keeps Vulkan's quantized GEMVs on f32 activations where the device has int8 dot
    /// products.
    VulkanInt8,
    /// `0` loads the Vulkan kernels without subgroup arithmetic.
    VulkanSubgroups,
    /// `plan` dispatches Vulkan launches as the plan gives them also on CPU implementations.
    VulkanGeometry,
    /// Opens each Vulkan device as this many logical devices.
    VulkanSplit,
}

/// When a backend reads a [`Setting`], so when a value set from code takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadAt {
    /// When a backend makes its devices: the process registry's at its first listing; a later
    /// value reaches only devices made afterwards (`select("cpu:N")`, `split_devices`).
    DeviceList,
    /// When a stream, comm or buffer is made: later sessions see a new value.
    Creation,
    /// Once per process, at first use: a later [`set`] of another value is refused.
    Once,
}

enum Values {
    Switch,
    Count(usize, usize),
    Bytes,
    Choice(&'static [&'static str]),
    Name,
}

struct Spec {
    key: &'static str,
    env: &'static str,
    values: Values,
    read: ReadAt,
}

impl Setting {
    /// Every setting.
    pub const ALL: &'static [Setting] = &[
        Setting::CpuIsa,
        Setting::CpuRepack,
        Setting::CpuDevices,
        Setting::CpuCommStreamFrom,
        Setting::GpuReplay,
        Setting::GpuFuse,
        Setting::GpuGemv8,
        Setting::GpuMma,
        Setting::GpuFaChunk,
        Setting::GpuG8Rows,
        Setting::CudaAllReduce,
        Setting::HipAllReduce,
        Setting::HipGraphs,
        Setting::SyclAllReduce,
        Setting::VulkanAllReduce,
        Setting::VulkanInt8,
        Setting::VulkanSubgroups,
        Setting::VulkanGeometry,
        Setting::VulkanSplit,
    ];

    fn spec(self) -> Spec {
        use ReadAt::*;
        use Values::*;
        let (key, env, values, read) = match self {
            Setting::CpuIsa => ("cpu.isa", "TESSERA_CPU_ISA", Name, Once),
            Setting::CpuRepack => ("cpu.repack", "TESSERA_CPU_REPACK", Switch, DeviceList),
            Setting::CpuDevices => (
                "cpu.devices",
                "TESSERA_CPU_DEVICES",
                Count(1, 256),
                DeviceList,
            ),
            Setting::CpuCommStreamFrom => (
                "cpu.comm-stream-from",
                "TESSERA_CPU_COMM_STREAM_FROM",
                Bytes,
                Once,
            ),
            Setting::GpuReplay => ("gpu.replay", "TESSERA_GPU_REPLAY", Switch, Creation),
            Setting::GpuFuse => ("gpu.fuse", "TESSERA_GPU_FUSE", Switch, Once),
            Setting::GpuGemv8 => ("gpu.gemv8", "TESSERA_GPU_GEMV8", Switch, Once),
            Setting::GpuMma => ("gpu.mma", "TESSERA_GPU_MMA", Switch, Once),
            Setting::GpuFaChunk => (
                "gpu.fa-chunk",
                "TESSERA_GPU_FA_CHUNK",
                Count(1, 1 << 16),
                Once,
            ),
            Setting::GpuG8Rows => ("gpu.g8-rows", "TESSERA_GPU_G8_ROWS", Count(1, 4), Once),
            Setting::CudaAllReduce => (
                "cuda.all-reduce",
                "TESSERA_CUDA_ALLREDUCE",
                Choice(&["nccl", "none"]),
                Creation,
            ),
            Setting::HipAllReduce => (
                "hip.all-reduce",
                "TESSERA_HIP_ALLREDUCE",
                Choice(&["rccl", "none"]),
                Creation,
            ),
            Setting::HipGraphs => ("hip.graphs", "TESSERA_HIP_GRAPHS", Switch, Creation),
            Setting::SyclAllReduce => (
                "sycl.all-reduce",
                "TESSERA_SYCL_ALLREDUCE",
                Choice(&["ring", "none"]),
                Creation,
            ),
            Setting::VulkanAllReduce => (
                "vulkan.all-reduce",
                "TESSERA_VULKAN_ALLREDUCE",
                Choice(&["f32", "bf16", "none", "host"]),
                Creation,
            ),
            // Vulkan opens its devices once per process.
            Setting::VulkanInt8 => ("vulkan.int8", "TESSERA_VULKAN_INT8", Switch, Once),
            Setting::VulkanSubgroups => {
                ("vulkan.subgroups", "TESSERA_VULKAN_SUBGROUPS", Switch, Once)
            }
            Setting::VulkanGeometry => (
                "vulkan.geometry",
                "TESSERA_VULKAN_GEOMETRY",
                Choice(&["own", "plan"]),
                Once,
            ),
            Setting::VulkanSplit => ("vulkan.split", "TESSERA_VULKAN_SPLIT", Count(1, 16), Once),
        };
        Spec {
            key,
            env,
            values,
            read,
        }
    }

    /// The key, e.g. `cpu.repack` (what `tessera --set KEY=VALUE` takes).
    pub fn key(self) -> &'static str {
        self.spec().key
    }

    /// The environment variable, e.g. `TESSERA_CPU_REPACK`.
    pub fn env(self) -> &'static str {
        self.spec().env
    }

    /// When backends read it.
    pub fn read(self) -> ReadAt {
        self.spec().read
    }

    /// The values it takes, in words, e.g. `0 or 1`.
    pub fn values(self) -> String {
        match self.spec().values {
            Values::Switch => "0 or 1".into(),
            Values::Count(lo, hi) => format!("a count in {lo}..={hi}"),
            Values::Bytes => "a byte count".into(),
            Values::Choice(c) => c.join(", "),
            Values::Name => "a level name (see the CPU backend's chapter)".into(),
        }
    }

    /// The setting with key or environment variable `name`.
    pub fn parse(name: &str) -> Option<Setting> {
        let name = name.trim();
        Setting::ALL
            .iter()
            .copied()
            .find(|s| s.key() == name || s.env() == name)
    }

    /// Checks `value` for this setting, returning it trimmed and, for choices, lower-cased.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the setting and the values it takes.
    pub fn check(self, value: &str) -> Result<String> {
        let v = value.trim();
        let ok = match self.spec().values {
            Values::Switch => matches!(v, "0" | "1"),
            Values::Count(lo, hi) => v.parse::<usize>().is_ok_and(|n| (lo..=hi).contains(&n)),
            Values::Bytes => v.parse::<usize>().is_ok(),
            Values::Choice(c) => c.iter().any(|x| x.eq_ignore_ascii_case(v)),
            Values::Name => {
                !v.is_empty()
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            }
        };
        if !ok {
            return Err(Error::InvalidArgument(format!(
                "setting {} ({}) = {value:?}: expected {}",
                self.key(),
                self.env(),
                self.values()
            )));
        }
        Ok(match self.spec().values {
            Values::Choice(_) | Values::Name => v.to_ascii_lowercase(),
            _ => v.to_string(),
        })
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// Where values come from besides this copy's own table: a plugin's copy of this crate asks
/// its host, so one [`set`] in the host reaches every plugin.
pub type Source = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

#[derive(Default)]
struct State {
    /// Values set from code, by environment variable.
    set: HashMap<&'static str, String>,
    /// Values read once, as read (`None`: unset), by environment variable.
    fixed: HashMap<&'static str, Option<String>>,
}

fn state() -> &'static RwLock<State> {
    static STATE: OnceLock<RwLock<State>> = OnceLock::new();
    STATE.get_or_init(Default::default)
}

fn source() -> &'static OnceLock<Source> {
    static SOURCE: OnceLock<Source> = OnceLock::new();
    &SOURCE
}

/// Sets `setting` to `value` for this process (and its plugins), over its environment variable.
///
/// # Errors
/// [`Error::InvalidArgument`] for a value the setting does not take, or for a setting read once
/// per process ([`ReadAt::Once`]) that was already read with another value.
pub fn set(setting: Setting, value: &str) -> Result<()> {
    let v = setting.check(value)?;
    let mut st = state().write();
    if let Some(read) = st.fixed.get(setting.env())
        && read.as_deref() != Some(v.as_str())
    {
        return Err(Error::InvalidArgument(format!(
            "setting {setting} ({}) was read once for this process ({}); set it before the \
             first device is made",
            setting.env(),
            read.as_deref()
                .map_or("unset".into(), |r| format!("as {r:?}"))
        )));
    }
    st.set.insert(setting.env(), v);
    Ok(())
}

/// Forgets a value [`set`] from code: the environment variable counts again.
///
/// # Errors
/// As [`set`], for a setting already read once with the value being forgotten.
pub fn clear(setting: Setting) -> Result<()> {
    let mut st = state().write();
    if st.fixed.contains_key(setting.env()) && st.set.contains_key(setting.env()) {
        return Err(Error::InvalidArgument(format!(
            "setting {setting} ({}) was read once for this process; it can no longer change",
            setting.env()
        )));
    }
    st.set.remove(setting.env());
    Ok(())
}

/// The value of environment variable `env`: as [`set`] from code for the setting it names, else
/// the host's (in a plugin), else the environment's.
pub fn var(env: &str) -> Option<String> {
    if let Some(v) = state().read().set.get(env) {
        return Some(v.clone());
    }
    if let Some(src) = source().get() {
        return src(env);
    }
    std::env::var(env).ok()
}

/// [`var`] for a value read once per process: the value read is recorded (as [`Setting::check`]
/// spells it), so that [`set`] refuses to change it afterwards. Read and recorded under one lock,
/// so that no [`set`] lands between them.
pub fn var_once(env: &str) -> Option<String> {
    let mut st = state().write();
    let v = match st.set.get(env) {
        Some(v) => Some(v.clone()),
        None => match source().get() {
            Some(src) => src(env),
            None => std::env::var(env).ok(),
        },
    };
    if let Some(s) = Setting::ALL.iter().find(|s| s.env() == env) {
        let spelled = v
            .as_deref()
            .map(|raw| s.check(raw).unwrap_or_else(|_| raw.to_string()));
        st.fixed.entry(s.env()).or_insert(spelled);
    }
    v
}

/// Every setting with a value from code or the environment, with that value.
pub fn current() -> Vec<(Setting, String)> {
    Setting::ALL
        .iter()
        .filter_map(|&s| var(s.env()).map(|v| (s, v)))
        .collect()
}

/// Makes [`var`] ask `src` for values not [`set`] in this copy (once per process; later calls
/// are ignored). Plugin entry points install their host's lookup here.
pub fn install_source(src: Source) {
    let _ = source().set(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_its_own_key_and_variable() {
        for (i, a) in Setting::ALL.iter().enumerate() {
            assert!(a.env().starts_with("TESSERA_"), "{a}");
            assert_eq!(Setting::parse(a.key()), Some(*a));
            assert_eq!(Setting::parse(a.env()), Some(*a));
            for b in &Setting::ALL[i + 1..] {
                assert_ne!(a.key(), b.key());
                assert_ne!(a.env(), b.env());
            }
        }
        assert_eq!(Setting::parse("cpu.nothing"), None);
    }

    #[test]
    fn values_are_checked() {
        assert_eq!(Setting::CpuRepack.check(" 0 ").unwrap(), "0");
        assert!(Setting::CpuRepack.check("off").is_err());
        assert!(Setting::CpuDevices.check("257").is_err());
        assert_eq!(Setting::VulkanAllReduce.check("BF16").unwrap(), "bf16");
        let e = Setting::SyclAllReduce
            .check("nccl")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sycl.all-reduce") && e.contains("ring, none"),
            "{e}"
        );
        assert!(Setting::CpuIsa.check("avx2").is_ok());
        assert!(Setting::CpuIsa.check("avx-512").is_ok());
        assert!(Setting::CpuIsa.check("").is_err());
        assert_eq!(Setting::VulkanAllReduce.check("host").unwrap(), "host");
    }

    #[test]
    fn set_wins_over_the_environment_until_cleared() {
        let s = Setting::GpuG8Rows;
        set(s, "2").unwrap();
        assert_eq!(var(s.env()).as_deref(), Some("2"));
        assert!(set(s, "5").is_err());
        assert_eq!(
            var(s.env()).as_deref(),
            Some("2"),
            "a refused value changes nothing"
        );
        clear(s).unwrap();
        assert_eq!(var(s.env()), std::env::var(s.env()).ok());
    }

    #[test]
    fn a_value_read_once_cannot_change() {
        let s = Setting::GpuFaChunk;
        set(s, "64").unwrap();
        assert_eq!(var_once(s.env()).as_deref(), Some("64"));
        set(s, "64").unwrap();
        let e = set(s, "128").unwrap_err().to_string();
        assert!(e.contains("gpu.fa-chunk") && e.contains("read once"), "{e}");
        assert!(clear(s).is_err());
        assert_eq!(var(s.env()).as_deref(), Some("64"));
    }
}
