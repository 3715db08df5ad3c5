//! Vulkan runtime checks beyond op conformance: devices (split logical devices), buffers
//! (blocking and stream-ordered, unaligned fills, copies within and across devices), pinned host
//! buffers (stream copies to and from device memory), events
//! across streams and devices, a test kernel launched end to end (argument block, specialization
//! constant, a grid split above `maxComputeWorkGroupCount`), kernels not yet ported, and the
//! on-disk pipeline cache. Without a loader or device every trial is ignored with the reason in
//! its name; `TESSERA_REQUIRE=vulkan` makes that a failure.
//!
//! The process runs with `TESSERA_VULKAN_SPLIT=2` (two logical devices per physical device) and
//! a pipeline cache in a temporary folder unless the environment sets them.

use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::Arc;
use tessera_core::comm::CommSlice;
use tessera_core::comm::{CommApi, CommOutcome};
use tessera_core::{Backend, BackendOptions, Buffer, Device, DeviceType, ProcAddress, Registry};
use tessera_gpu::comm_host::{self, HostWire};
use tessera_gpu::{Driver, GpuContext};
use tessera_kernels::gpu::KERNELS;
use tessera_kernels::gpu::launch::{Arg, Launch};
use tessera_vulkan::{Vulkan, VulkanRegistry};

type TrialResult = Result<(), Failed>;
type Named = (&'static str, fn() -> TrialResult);

const TEST_FILL: &[u8] = include_bytes!("data/k_test_fill.spv");

fn check(ok: bool, what: impl FnOnce() -> String) -> TrialResult {
    if ok { Ok(()) } else { Err(what().into()) }
}

fn e<T>(r: tessera_core::Result<T>) -> Result<T, Failed> {
    r.map_err(|e| Failed::from(e.to_string()))
}

fn contexts() -> Result<&'static [Arc<GpuContext<Vulkan>>], Failed> {
    e(VulkanRegistry::new().contexts())
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn devices() -> TrialResult {
    let reg = VulkanRegistry::new();
    let all = e(reg.devices())?;
    let names: Vec<&str> = all.iter().map(|d| d.name()).collect();
    check(names.first() == Some(&"VK0"), || format!("{names:?}"))?;
    for (i, d) in all.iter().enumerate() {
        eprintln!("{}: {} [{}]", d.name(), d.description(), d.kind());
        check(d.name() == format!("VK{i}"), || format!("{names:?}"))?;
        check(d.memory().total > 0, || format!("{}: no memory", d.name()))?;
        check(d.kind() != DeviceType::Cpu, || {
            "a Vulkan device claims to be the host CPU".into()
        })?;
    }
    let two = e(reg.devices_with_count(2))?;
    check(two.len() == 2 && two[0].name() != two[1].name(), || {
        format!(
            "vulkan:2 gave {:?}",
            two.iter().map(|d| d.name()).collect::<Vec<_>>()
        )
    })?;
    if std::env::var("TESSERA_VULKAN_SPLIT").as_deref() == Ok("2") {
        check(all.len() % 2 == 0 && all.len() >= 2, || {
            format!("split 2 gave {names:?}")
        })?;
    }
    check(e(reg.devices_with_count(0)).is_err(), || {
        "vulkan:0 accepted".into()
    })
}

fn buffers() -> TrialResult {
    let dev = &e(VulkanRegistry::new().devices())?[0];
    let buf = e(dev.buffer_type().alloc(1003))?;
    let data: Vec<u8> = (0..1003u32).map(|i| (i * 7 + 1) as u8).collect();
    e(buf.write(0, &data))?;
    e(buf.memset(5, 10, 0xab))?;
    let mut want = data.clone();
    want[5..15].fill(0xab);
    let mut got = vec![0u8; 1003];
    e(buf.read(0, &mut got))?;
    check(got == want, || "blocking write/memset/read".into())?;
    check(buf.read(1000, &mut [0u8; 8]).is_err(), || {
        "read past the end accepted".into()
    })?;

    // Stream order: staged write, unaligned queued fill, device copy, staged read.
    let mut s = e(dev.init_backend(&BackendOptions::default()))?;
    let other = e(dev.buffer_type().alloc(1003))?;
    e(s.write_async(other.as_ref(), 1, &data[..999]))?;
    e(s.copy_async(&buf, 100, &other, 3, 501))?;
    let mut back = vec![0u8; 1003];
    e(s.read_async(other.as_ref(), 0, &mut back))?;
    e(s.synchronize())?;
    let mut want2 = vec![0u8; 1003];
    e(other.read(0, &mut want2))?;
    check(back == want2, || {
        "stream read differs from blocking read".into()
    })?;
    check(
        back[3..504] == want[100..601] && back[504..1000] == data[503..999],
        || "stream write/copy".into(),
    )?;
    Ok(())
}

fn out_of_bounds<T>(r: tessera_core::Result<T>, what: &str) -> TrialResult {
    match r {
        Err(tessera_core::Error::OutOfBounds { .. }) => Ok(()),
        Err(e) => Err(format!("{what}: not OutOfBounds but {e}").into()),
        Ok(_) => Err(format!("{what}: out of range accepted").into()),
    }
}

/// The pinned host buffer type: zeroed, written and filled by the host, copied to and from device
/// memory by a stream (odd offsets and lengths, after queued work), range errors typed.
fn host_buffers() -> TrialResult {
    let devs = e(VulkanRegistry::new().devices())?;
    let dev = &devs[0];
    check(dev.caps().host_buffer, || {
        format!("{}: caps report no host buffers", dev.name())
    })?;
    let hbt = dev
        .host_buffer_type()
        .ok_or_else(|| Failed::from("no host buffer type"))?;
    check(hbt.is_host(), || {
        format!("{} is not a host type", hbt.name())
    })?;
    let host = e(hbt.alloc(1001))?;
    let back = e(hbt.alloc(1000))?;
    check(host.is_host() && host.size() == 1001, || {
        format!("{}: size {}", host.name(), host.size())
    })?;
    let mut got = vec![0xffu8; 1001];
    e(host.read(0, &mut got))?;
    check(got.iter().all(|&b| b == 0), || "not zeroed".into())?;
    let pattern: Vec<u8> = (0..1001u32).map(|i| (i * 13 + 5) as u8).collect();
    e(host.write(0, &pattern))?;

    let devbuf = e(dev.buffer_type().alloc(1003))?;
    let mut s = e(dev.init_backend(&BackendOptions::default()))?;
    // Queued before the copies: a staged write of the whole device buffer.
    e(s.write_async(devbuf.as_ref(), 0, &[0x5a; 1003]))?;
    e(s.copy_async(&host, 7, &devbuf, 13, 977))?;
    e(s.copy_async(&devbuf, 10, &back, 3, 991))?;
    // No synchronize: the host read waits for the device's queued work.
    let mut got = vec![0u8; 1000];
    e(back.read(0, &mut got))?;
    let mut want_dev = vec![0x5au8; 1003];
    want_dev[13..990].copy_from_slice(&pattern[7..984]);
    let mut want = vec![0u8; 1000];
    want[3..994].copy_from_slice(&want_dev[10..1001]);
    check(got == want, || "host -> device -> host bytes".into())?;
    let mut dev_got = vec![0u8; 1003];
    e(devbuf.read(0, &mut dev_got))?;
    check(dev_got == want_dev, || {
        "device bytes after host copy".into()
    })?;

    // Host fill, then host -> device again after a queued device fill.
    e(host.memset(5, 11, 0xcd))?;
    let mut want_host = pattern.clone();
    want_host[5..16].fill(0xcd);
    let mut got = vec![0u8; 1001];
    e(host.read(0, &mut got))?;
    check(got == want_host, || "host memset".into())?;
    e(s.copy_async(&host, 1, &devbuf, 0, 21))?;
    e(s.synchronize())?;
    e(devbuf.read(0, &mut dev_got))?;
    want_dev[..21].copy_from_slice(&want_host[1..22]);
    check(dev_got == want_dev, || {
        "device bytes after host memset".into()
    })?;

    // Out of range: typed errors, and the stream still works.
    out_of_bounds(host.read(995, &mut [0u8; 8]), "host read")?;
    out_of_bounds(host.write(1000, &[1, 2]), "host write")?;
    out_of_bounds(host.memset(990, 12, 0), "host memset")?;
    out_of_bounds(s.copy_async(&host, 990, &devbuf, 0, 20), "copy from host")?;
    out_of_bounds(s.copy_async(&host, 0, &devbuf, 1000, 4), "copy to device")?;
    out_of_bounds(s.copy_async(&devbuf, 1000, &back, 0, 8), "copy from device")?;
    out_of_bounds(s.copy_async(&devbuf, 0, &back, 996, 8), "copy to host")?;
    e(s.copy_async(&devbuf, 0, &back, 0, 4))?;
    e(s.synchronize())?;
    let mut four = [0u8; 4];
    e(back.read(0, &mut four))?;
    check(four[..] == want_dev[..4], || "copy after errors".into())?;

    // Another logical device's stream with this device's host memory (the blocking path).
    if let Some(dev1) = devs.get(1) {
        let other = e(dev1.buffer_type().alloc(64))?;
        let mut s1 = e(dev1.init_backend(&BackendOptions::default()))?;
        e(s1.write_async(other.as_ref(), 0, &[0x33; 64]))?;
        e(s1.copy_async(&host, 100, &other, 3, 50))?;
        e(s1.copy_async(&other, 0, &back, 500, 64))?;
        let mut got = vec![0u8; 64];
        e(back.read(500, &mut got))?;
        let mut want = vec![0x33u8; 64];
        want[3..53].copy_from_slice(&want_host[100..150]);
        check(got == want, || {
            "host buffer with another device's stream".into()
        })?;
    }
    Ok(())
}

fn fills() -> TrialResult {
    let ctx = &contexts()?[0];
    let gpu = ctx.gpu();
    let mem = e(Vulkan::alloc(gpu, 64))?;
    e(Vulkan::memset(&mem, 0, 64, 0x11))?;
    let s = e(Vulkan::stream_create(gpu))?;
    for (off, len, v) in [
        (1usize, 2usize, 0xa1u8),
        (5, 13, 0xb2),
        (20, 4, 0xc3),
        (31, 1, 0xd4),
        (40, 0, 0xe5),
    ] {
        e(Vulkan::memset_async(&s, &mem, off, len, v))?;
    }
    e(Vulkan::stream_sync(&s))?;
    let mut got = [0u8; 64];
    e(Vulkan::read(&mem, 0, &mut got))?;
    let mut want = [0x11u8; 64];
    want[1..3].fill(0xa1);
    want[5..18].fill(0xb2);
    want[20..24].fill(0xc3);
    want[31] = 0xd4;
    check(got == want, || format!("{got:02x?}"))?;
    // A stream dropped with work recorded still runs it.
    let s2 = e(Vulkan::stream_create(gpu))?;
    e(Vulkan::memset_async(&s2, &mem, 40, 8, 0x77))?;
    drop(s2);
    e(Vulkan::read(&mem, 0, &mut got))?;
    want[40..48].fill(0x77);
    check(got == want, || format!("after drop: {got:02x?}"))
}

fn test_fill(grid: (u32, u32, u32), block: u32, n: usize) -> TrialResult {
    let ctx = &contexts()?[0];
    let gpu = ctx.gpu();
    let f = e(gpu.load_spirv("k_test_fill", TEST_FILL))?;
    let mem = e(Vulkan::alloc(gpu, (n + 16) * 4))?;
    e(Vulkan::memset(&mem, 0, (n + 16) * 4, 0))?;
    let s = e(Vulkan::stream_create(gpu))?;
    let launch = Launch {
        kernel: "k_test_fill",
        grid,
        block,
        args: vec![
            Arg::Ptr(Vulkan::mem_ptr(&mem)),
            Arg::I64(n as i64),
            Arg::F32(0.5),
            Arg::F32(-3.0),
        ],
    };
    // SAFETY: k_test_fill takes (float*, long long, float, float); it writes dst[0..n], inside
    // `mem`, which lives past the synchronization below.
    e(unsafe { Vulkan::launch(&s, &f, &launch) })?;
    e(Vulkan::stream_sync(&s))?;
    let mut raw = vec![0u8; (n + 16) * 4];
    e(Vulkan::read(&mem, 0, &mut raw))?;
    let got = floats(&raw);
    if let Some(i) = (0..n).find(|&i| got[i] != 0.5 * i as f32 - 3.0) {
        return Err(format!("dst[{i}] = {} (want {})", got[i], 0.5 * i as f32 - 3.0).into());
    }
    check(got[n..].iter().all(|&v| v == 0.0), || "wrote past n".into())
}

fn kernel_small() -> TrialResult {
    // n not a multiple of the block; then another block size (another pipeline).
    test_fill((4, 1, 1), 64, 250)?;
    test_fill((2, 1, 1), 256, 500)
}

fn kernel_split_grid() -> TrialResult {
    // 70000 blocks: above lavapipe's (and most devices') 65535 per dimension.
    test_fill((70_000, 1, 1), 32, 70_000 * 32)
}

fn many_launches_and_events() -> TrialResult {
    let ctx = &contexts()?[0];
    let gpu = ctx.gpu();
    let f = e(gpu.load_spirv("k_test_fill", TEST_FILL))?;
    let n = 1000usize;
    let mem = e(Vulkan::alloc(gpu, n * 4))?;
    let (a, b) = (
        e(Vulkan::stream_create(gpu))?,
        e(Vulkan::stream_create(gpu))?,
    );
    // 600 launches on `a` (more than one batch), the last one's values win.
    for k in 0..600 {
        let launch = Launch {
            kernel: "k_test_fill",
            grid: (8, 1, 1),
            block: 128,
            args: vec![
                Arg::Ptr(Vulkan::mem_ptr(&mem)),
                Arg::I64(n as i64),
                Arg::F32(k as f32),
                Arg::F32(1.0),
            ],
        };
        // SAFETY: as in `test_fill`.
        e(unsafe { Vulkan::launch(&a, &f, &launch) })?;
    }
    let ev = e(Vulkan::event_record(&a))?;
    // `b` copies after the event: sees the last fill.
    let copy = e(Vulkan::alloc(gpu, n * 4))?;
    e(Vulkan::stream_wait(&b, &ev))?;
    e(Vulkan::copy_async(&b, &copy, 0, &mem, 0, n * 4))?;
    let done = e(Vulkan::event_record(&b))?;
    e(Vulkan::event_sync(&done))?;
    check(
        Vulkan::event_query(&ev) && Vulkan::event_query(&done),
        || "events incomplete after sync".into(),
    )?;
    let mut raw = vec![0u8; n * 4];
    e(Vulkan::read(&copy, 0, &mut raw))?;
    let got = floats(&raw);
    check((0..n).all(|i| got[i] == 599.0 * i as f32 + 1.0), || {
        format!("copy saw {:?}", &got[..4])
    })
}

fn two_devices() -> TrialResult {
    let ctxs = contexts()?;
    if ctxs.len() < 2 {
        return Err("fewer than two logical devices (TESSERA_VULKAN_SPLIT=2 expected)".into());
    }
    let (g0, g1) = (ctxs[0].gpu(), ctxs[1].gpu());
    check(
        !Vulkan::can_copy(g0, g1) || Vulkan::ordinal(g0) != Vulkan::ordinal(g1),
        || "two logical devices share an ordinal".into(),
    )?;
    let m0 = e(Vulkan::alloc(g0, 4096))?;
    let m1 = e(Vulkan::alloc(g1, 4096))?;
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    e(Vulkan::write(&m0, 0, &data))?;
    e(Vulkan::copy(&m1, 0, &m0, 0, 4096))?;
    // Work on device 1 waits for an event of device 0.
    let s0 = e(Vulkan::stream_create(g0))?;
    let s1 = e(Vulkan::stream_create(g1))?;
    e(Vulkan::memset_async(&s0, &m0, 0, 16, 9))?;
    let ev = e(Vulkan::event_record(&s0))?;
    e(Vulkan::stream_wait(&s1, &ev))?;
    e(Vulkan::memset_async(&s1, &m1, 4000, 96, 7))?;
    e(Vulkan::stream_sync(&s1))?;
    let mut got = vec![0u8; 4096];
    e(Vulkan::read(&m1, 0, &mut got))?;
    let mut want = data.clone();
    want[4000..].fill(7);
    check(got == want, || "cross-device copy or fill".into())?;
    check(Vulkan::event_query(&ev), || "device 0 event".into())?;
    // A stream of device 0 handed memory of device 1 takes the blocking path.
    e(Vulkan::memset_async(&s0, &m1, 0, 8, 5))?;
    e(Vulkan::copy_async(&s0, &m1, 8, &m0, 100, 8))?;
    e(Vulkan::write_staged(&s0, &m1, 16, &[1, 2, 3]))?;
    let mut three = [0u8; 3];
    e(Vulkan::read_staged(&s0, &m1, 16, &mut three))?;
    e(Vulkan::stream_sync(&s0))?;
    e(Vulkan::read(&m1, 0, &mut got))?;
    want[..8].fill(5);
    want[8..16].copy_from_slice(&data[100..108]);
    want[16..19].copy_from_slice(&[1, 2, 3]);
    check(got == want && three == [1, 2, 3], || {
        "foreign memory through a stream".into()
    })
}

fn unported_kernels() -> TrialResult {
    let ctx = &contexts()?[0];
    let ported = tessera_vulkan::ported_kernels();
    eprintln!("ported kernels: {ported:?}");
    let s = e(Vulkan::stream_create(ctx.gpu()))?;
    for &(_, name) in KERNELS {
        let has = Vulkan::has_kernel(ctx.gpu(), name);
        check(has == ported.contains(&name), || {
            format!("has_kernel({name})")
        })?;
        if has {
            continue;
        }
        let f = e(ctx.kernels().get(name))?;
        let launch = Launch {
            kernel: name,
            grid: (1, 1, 1),
            block: 32,
            args: Vec::new(),
        };
        // SAFETY: a kernel without SPIR-V is refused before anything is queued.
        let r = unsafe { Vulkan::launch(&s, &f, &launch) };
        check(
            r.as_ref()
                .is_err_and(|e| e.to_string().contains("not yet ported")),
            || format!("{name}: {r:?}"),
        )?;
    }
    Ok(())
}

fn pipeline_cache() -> TrialResult {
    let ctx = &contexts()?[0];
    let gpu = ctx.gpu();
    let Some(path) = gpu.pipeline_cache() else {
        eprintln!("pipeline cache off");
        return Ok(());
    };
    test_fill((1, 1, 1), 96, 96)?;
    gpu.save_pipeline_cache();
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    check(len > 0, || format!("{} not written", path.display()))
}

/// The Vulkan registry with its comm trio's wire fixed (the tests never set the variable).
struct Wired(VulkanRegistry, HostWire);

impl Registry for Wired {
    fn name(&self) -> &str {
        "vulkan"
    }
    fn probe(&self) -> tessera_core::Result<()> {
        self.0.probe()
    }
    fn devices(&self) -> tessera_core::Result<Vec<Arc<dyn Device>>> {
        self.0.devices()
    }
    fn proc_address(&self, name: &str) -> Option<ProcAddress> {
        comm_host::proc_address_with_wire::<Vulkan>(name, self.1)
    }
}

/// Value `i` of device `j`: every float class the wire meets (signs, tiny, large, halfway
/// between two bf16 values).
fn comm_value(j: usize, i: usize) -> f32 {
    let base = ((i * 7919 + j * 104_729) % 2001) as f32 - 1000.0;
    match i % 3 {
        0 => base * 1e-3,
        1 => base * 37.5,
        _ => f32::from_bits((base.to_bits() & 0xffff_0000) | 0x8000),
    }
}

fn bf16_round(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// All-reduces through the registry's trio over `devices`, one comm for every length of
/// `lens` in turn (so its scratch grows and is reused), slices at byte offset 16, device
/// `silent` filled with NaN and not contributing. Each slice is written by its stream just before
/// the call, unsynchronised, over stale values (the Vulkan driver's blocking reads wait for the
/// whole device, so on Vulkan this cannot catch a comm that ignored stream order). Checks
/// every device's result bit for bit against the host sum in device order (f32), or the sum of
/// bf16-rounded values rounded once (bf16); then that a misaligned slice (and, on devices with
/// their own GPUs, slices handed to the wrong members) declines and leaves the values alone.
fn comm_case(
    reg: &dyn Registry,
    devices: &[Arc<dyn Device>],
    lens: &[usize],
    silent: usize,
    wire: HostWire,
    own_gpus: bool,
) -> TrialResult {
    let n = devices.len();
    let api = CommApi::from_registry(reg).ok_or("the Vulkan registry exports no comm trio")?;
    let mut streams: Vec<Box<dyn Backend>> = devices
        .iter()
        .map(|d| d.init_backend(&BackendOptions::default()))
        .collect::<tessera_core::Result<_>>()
        .map_err(|e| Failed::from(e.to_string()))?;
    let mut comm = api
        .init(&mut streams)
        .ok_or("the host-staged comm declined")?;
    for &len in lens {
        let bufs: Vec<Arc<dyn Buffer>> = devices
            .iter()
            .map(|d| d.buffer_type().alloc(16 + len * 4))
            .collect::<tessera_core::Result<_>>()
            .map_err(|e| Failed::from(e.to_string()))?;
        for (j, (b, s)) in bufs.iter().zip(streams.iter_mut()).enumerate() {
            let v: Vec<u8> = (0..len)
                .flat_map(|i| {
                    if j == silent {
                        f32::NAN
                    } else {
                        comm_value(j, i)
                    }
                    .to_le_bytes()
                })
                .collect();
            // Stale values first, then the real ones in stream order.
            e(b.write(16, &vec![0x7f; len * 4]))?;
            e(s.write_async(b.as_ref(), 16, &v))?;
        }
        let slices: Vec<CommSlice> = bufs
            .iter()
            .enumerate()
            .map(|(j, b)| CommSlice {
                buffer: b.clone(),
                offset: 16,
                len,
                contributes: j != silent,
            })
            .collect();
        let outcome = e(comm.allreduce(&slices))?;
        check(matches!(outcome, CommOutcome::Done), || {
            format!("{outcome:?}")
        })?;
        for s in streams.iter_mut() {
            e(s.synchronize())?;
        }
        let want: Vec<f32> = (0..len)
            .map(|i| {
                let mut acc = 0.0f32;
                for j in (0..n).filter(|&j| j != silent) {
                    acc += match wire {
                        HostWire::F32 => comm_value(j, i),
                        HostWire::Bf16 => bf16_round(comm_value(j, i)),
                    };
                }
                if wire == HostWire::Bf16 {
                    bf16_round(acc)
                } else {
                    acc
                }
            })
            .collect();
        let read_all = || -> Result<Vec<Vec<f32>>, Failed> {
            bufs.iter()
                .map(|b| {
                    let mut raw = vec![0u8; len * 4];
                    e(b.read(16, &mut raw))?;
                    Ok(floats(&raw))
                })
                .collect()
        };
        let got = read_all()?;
        for (j, g) in got.iter().enumerate() {
            if let Some(i) = (0..len).find(|&i| g[i].to_bits() != want[i].to_bits()) {
                return Err(format!(
                    "{wire:?} n={n} len={len} device {j} value {i}: {} (want {})",
                    g[i], want[i]
                )
                .into());
            }
        }
        if len == 0 {
            continue;
        }
        let odd: Vec<CommSlice> = slices
            .iter()
            .map(|s| CommSlice {
                offset: 2,
                ..s.clone()
            })
            .collect();
        let outcome = e(comm.allreduce(&odd))?;
        check(matches!(outcome, CommOutcome::Declined), || {
            format!("misaligned: {outcome:?}")
        })?;
        if own_gpus {
            let mut swapped = slices.clone();
            swapped.rotate_left(1);
            let outcome = e(comm.allreduce(&swapped))?;
            check(matches!(outcome, CommOutcome::Declined), || {
                format!("slices of other members' GPUs: {outcome:?}")
            })?;
        }
        for s in streams.iter_mut() {
            e(s.synchronize())?;
        }
        let after: Vec<Vec<u32>> = read_all()?
            .iter()
            .map(|g| g.iter().map(|v| v.to_bits()).collect())
            .collect();
        let before: Vec<Vec<u32>> = got
            .iter()
            .map(|g| g.iter().map(|v| v.to_bits()).collect())
            .collect();
        check(after == before, || "a declined call changed values".into())?;
    }
    Ok(())
}

/// The host-staged comm trio, found by name: two devices with their own contexts and three
/// logical devices sharing one, f32 and bf16 wires, 0 to 70,001 values on one comm.
fn comm_trio() -> TrialResult {
    let reg = VulkanRegistry::new();
    check(CommApi::from_registry(&reg).is_some(), || {
        "no trio by name".into()
    })?;
    let pairs = e(reg.devices())?;
    let three = e(reg.devices_with_count(3))?;
    let lens = [1000, 70_001, 0, 1, 1000];
    for wire in [HostWire::F32, HostWire::Bf16] {
        let wired = Wired(VulkanRegistry::new(), wire);
        comm_case(
            &wired,
            &pairs[..2.min(pairs.len())],
            &lens,
            usize::MAX,
            wire,
            true,
        )?;
        comm_case(&wired, &three, &lens, 1, wire, false)?;
    }
    Ok(())
}

fn main() {
    // SAFETY: no other thread exists yet.
    unsafe {
        if std::env::var_os("TESSERA_VULKAN_SPLIT").is_none() {
            std::env::set_var("TESSERA_VULKAN_SPLIT", "2");
        }
        if std::env::var_os("TESSERA_VULKAN_CACHE").is_none() {
            let dir =
                std::env::temp_dir().join(format!("tessera-vulkan-test-{}", std::process::id()));
            std::env::set_var("TESSERA_VULKAN_CACHE", dir);
        }
    }
    let args = Arguments::from_args();
    let require =
        std::env::var("TESSERA_REQUIRE").is_ok_and(|v| v.split(',').any(|b| b.trim() == "vulkan"));
    let reason = VulkanRegistry::new().reason();
    let all: &[Named] = &[
        ("devices", devices),
        ("buffers", buffers),
        ("host_buffers", host_buffers),
        ("fills", fills),
        ("kernel_small", kernel_small),
        ("kernel_split_grid", kernel_split_grid),
        ("many_launches_and_events", many_launches_and_events),
        ("two_devices", two_devices),
        ("unported_kernels", unported_kernels),
        ("pipeline_cache", pipeline_cache),
        ("comm_trio", comm_trio),
    ];
    let trials =
        all.iter()
            .map(|&(name, f)| match &reason {
                None => Trial::test(name, f),
                Some(why) if require => {
                    let msg = format!("TESSERA_REQUIRE=vulkan: {why}");
                    Trial::test(name, move || Err(Failed::from(msg)))
                }
                Some(why) => Trial::test(format!("[skipped: {why}] {name}"), || Ok(()))
                    .with_ignored_flag(true),
            })
            .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(dir) = std::env::var("TESSERA_VULKAN_CACHE")
        && dir.contains("tessera-vulkan-test-")
    {
        let _ = std::fs::remove_dir_all(dir);
    }
    conclusion.exit();
}
