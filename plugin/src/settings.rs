//! Settings across the boundary. A plugin has its own copy of `tessera_core::settings`, so a
//! value the host's code sets would not reach it; instead the host lends [`host_setting`] in
//! its [`RawHost`] table and the export adapter makes the plugin's copy ask it
//! (`tessera_core::settings::install_source`).
#![allow(unsafe_code)]

use super::abi::{RawHeader, RawHost, RawSettingFn, RawStr, RawStrOut};

/// Host side: the host's value of settings variable `name`, written to `out`.
pub(crate) unsafe extern "C" fn host_setting(name: RawStr, out: *const RawStrOut) -> i32 {
    std::panic::catch_unwind(|| {
        // SAFETY: the name is lent for the call (ABI contract).
        let name = unsafe { name.to_str_lossy() };
        match tessera_core::settings::var(&name) {
            Some(v) if !out.is_null() => {
                // SAFETY: `out` is the caller's sink, valid for the call.
                unsafe { ((*out).write)((*out).ctx, v.as_ptr(), v.len()) };
                1
            }
            _ => 0,
        }
    })
    .unwrap_or(0)
}

fn ask(f: RawSettingFn, name: &str) -> Option<String> {
    let mut bytes: Vec<u8> = Vec::new();
    let out = RawStrOut::into_vec(&mut bytes);
    // SAFETY: the host's entry, with a name and a sink that live for the call.
    let has = unsafe { f(RawStr::new(name), &out) };
    (has == 1).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

/// Plugin side: makes this copy's settings ask the host, when its table has the entry (older
/// hosts do not: the plugin then reads the environment, as before).
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
        || (header.struct_size as usize) < std::mem::size_of::<RawHost>()
    {
        return;
    }
    // SAFETY: the table covers `setting` (checked above); the host's functions live as long as
    // the host process.
    let f = unsafe { std::ptr::addr_of!((*host).setting).read() };
    tessera_core::settings::install_source(Box::new(move |name| ask(f, name)));
}
