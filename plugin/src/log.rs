//! Logs across the boundary. A plugin has its own copy of `tracing` (and of every static), so
//! its events would vanish; instead the export adapter installs [`HostLog`] as the plugin's
//! global subscriber, which formats each event and hands it to the host's [`RawLogFn`], and the
//! host re-emits it with its own `tracing` under the target `tessera::plugin`, naming the file.
#![allow(unsafe_code)]

use super::abi::{RawHeader, RawHost, RawLogFn, RawStr, log_level};
use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::RwLock;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// The host's callback as the plugin stores it.
#[derive(Clone, Copy)]
struct Sink {
    log: RawLogFn,
    ctx: usize,
    max: u32,
}

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

fn level_code(l: &Level) -> u32 {
    match *l {
        Level::ERROR => log_level::ERROR,
        Level::WARN => log_level::WARN,
        Level::INFO => log_level::INFO,
        Level::DEBUG => log_level::DEBUG,
        Level::TRACE => log_level::TRACE,
    }
}

fn sink() -> Option<Sink> {
    SINK.read().ok().and_then(|s| *s)
}

/// Plugin side: whether the host takes error-level events.
pub(crate) fn host_listens() -> bool {
    sink().is_some_and(|s| s.max >= log_level::ERROR)
}

/// Plugin side: remembers the host's log callback and makes [`HostLog`] the global subscriber
/// of this copy of `tracing` (once; later inits only update the callback).
///
/// # Safety
/// `host` is null or points to a [`RawHost`] table readable for the call.
pub(crate) unsafe fn install(host: *const RawHost) {
    if host.is_null() {
        return;
    }
    // SAFETY: the header is the first field of every table and readable (caller's guarantee).
    let header = unsafe { std::ptr::read(host as *const RawHeader) };
    if header.magic != super::abi::ABI_MAGIC
        || (header.struct_size as usize) < std::mem::offset_of!(RawHost, setting)
    {
        return; // a host we cannot read: run without logs rather than guess
    }
    // SAFETY: the table covers the log entries (checked above), which precede `setting`.
    let (log, log_ctx, max) = unsafe {
        (
            std::ptr::addr_of!((*host).log).read(),
            std::ptr::addr_of!((*host).log_ctx).read(),
            std::ptr::addr_of!((*host).max_log_level).read(),
        )
    };
    if let Ok(mut s) = SINK.write() {
        *s = Some(Sink {
            log,
            ctx: log_ctx as usize,
            max,
        });
    }
    // Fails when this copy already has a subscriber (a second init): the callback is updated.
    let _ = tracing::subscriber::set_global_default(HostLog);
    tracing::callsite::rebuild_interest_cache();
}

/// A `tracing` subscriber that forwards every event to the host's callback. Spans are not
/// forwarded (the host's log lines carry the plugin file instead).
#[derive(Debug, Clone, Copy, Default)]
pub struct HostLog;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let sep = if self.0.is_empty() { "" } else { " " };
            let _ = write!(self.0, "{sep}{}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let sep = if self.0.is_empty() { "" } else { " " };
            let _ = write!(self.0, "{sep}{}={value}", field.name());
        }
    }
}

impl Subscriber for HostLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        sink().is_some_and(|s| level_code(metadata.level()) <= s.max)
    }
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(match sink().map_or(log_level::OFF, |s| s.max) {
            log_level::OFF => LevelFilter::OFF,
            log_level::ERROR => LevelFilter::ERROR,
            log_level::WARN => LevelFilter::WARN,
            log_level::INFO => LevelFilter::INFO,
            log_level::DEBUG => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        })
    }
    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _span: &Id, _values: &Record<'_>) {}
    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let Some(s) = sink() else { return };
        let mut msg = Message(String::new());
        event.record(&mut msg);
        let target = event.metadata().target();
        // SAFETY: the host's callback accepts calls from any thread while the plugin is loaded
        // (ABI contract); both strings live for the call.
        unsafe {
            (s.log)(
                s.ctx as *mut c_void,
                level_code(event.metadata().level()),
                RawStr::new(target),
                RawStr::new(&msg.0),
            )
        }
    }
    fn enter(&self, _span: &Id) {}
    fn exit(&self, _span: &Id) {}
}

/// Host side: the most verbose level the host's subscriber wants now.
pub(crate) fn host_max_level() -> u32 {
    match LevelFilter::current().into_level() {
        None => log_level::OFF,
        Some(l) => level_code(&l),
    }
}

/// Host side: the callback a plugin logs through; `ctx` is the `&'static str` file name.
pub(crate) unsafe extern "C" fn host_log(
    ctx: *mut c_void,
    level: u32,
    target: RawStr,
    msg: RawStr,
) {
    let _ = std::panic::catch_unwind(|| {
        let file: &str = if ctx.is_null() {
            "plugin"
        } else {
            // SAFETY: the loader passes a leaked `Box<String>` that lives for the process.
            unsafe { &*(ctx as *const String) }
        };
        // SAFETY: both strings are lent for the call (ABI contract).
        let (target, msg) = unsafe { (target.to_str_lossy(), msg.to_str_lossy()) };
        match level {
            log_level::ERROR => {
                tracing::error!(target: "tessera::plugin", plugin = file, source = %target, "{msg}")
            }
            log_level::WARN => {
                tracing::warn!(target: "tessera::plugin", plugin = file, source = %target, "{msg}")
            }
            log_level::INFO => {
                tracing::info!(target: "tessera::plugin", plugin = file, source = %target, "{msg}")
            }
            log_level::DEBUG => {
                tracing::debug!(target: "tessera::plugin", plugin = file, source = %target, "{msg}")
            }
            _ => {
                tracing::trace!(target: "tessera::plugin", plugin = file, source = %target, "{msg}")
            }
        }
    });
}
