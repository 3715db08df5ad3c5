//! Operating-system glue: CPU affinity, core count, memory figures, CPU model.
#![allow(unsafe_code)]

/// Logical cores this process may run on.
pub(crate) fn core_count() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The cores of this process's affinity mask, in order (all cores up to [`core_count`] where the
/// mask cannot be read).
pub(crate) fn allowed_cores() -> Vec<usize> {
    affinity(0)
}

/// The cores of the process's main thread: what the process may use, even when asked from a
/// thread pinned to fewer (a device's worker).
pub(crate) fn process_cores() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        affinity(pid)
    }
    #[cfg(not(target_os = "linux"))]
    affinity(0)
}

/// The cores of thread `tid`'s affinity mask (0: the calling thread).
fn affinity(tid: i32) -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `cpu_set_t` is plain data; zeroed is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the pointer and size describe `set`, which lives for the call.
        let rc = unsafe {
            libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
        };
        if rc == 0 {
            // SAFETY: `set` was filled by the kernel; CPU_ISSET only reads it.
            let cores: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect();
            if !cores.is_empty() {
                return cores;
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = tid;
    (0..core_count()).collect()
}

/// Pins the calling thread to `cores`; failure is logged, not fatal (containers may forbid it).
pub(crate) fn pin_current_thread(cores: &[usize]) {
    #[cfg(target_os = "linux")]
    {
        if cores.is_empty() {
            return;
        }
        // SAFETY: zeroed `cpu_set_t` is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cores {
            if c < libc::CPU_SETSIZE as usize {
                // SAFETY: `c` is below CPU_SETSIZE, so CPU_SET stays inside `set`.
                unsafe { libc::CPU_SET(c, &mut set) };
            }
        }
        // SAFETY: the pointer and size describe `set`; pid 0 = the calling thread.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            tracing::debug!(?cores, "sched_setaffinity failed; thread left unpinned");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cores;
}

/// (available, total) bytes of host memory.
pub(crate) fn memory() -> (usize, usize) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<usize>().ok())
            .map(|kb| kb * 1024)
    };
    let total = field("MemTotal:").unwrap_or(0);
    (field("MemAvailable:").unwrap_or(total), total)
}

/// The CPU model name.
pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
