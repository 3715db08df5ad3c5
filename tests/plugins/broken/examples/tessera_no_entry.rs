//! A shared library that is not a Tessera plugin: it exports no `tessera_backend_init`.

/// Something else entirely.
#[unsafe(no_mangle)]
pub extern "C" fn tessera_something_else() -> i32 {
    42
}
