//! Tessera devices as ggml backends.
//!
//! This crate builds `libggml_tessera.so`, a dynamic ggml backend: a program built on ggml
//! (llama.cpp, whisper.cpp, ggml's own tests) loads it at run time with
//! `ggml_backend_load("libggml_tessera.so")` or `GGML_BACKEND_PATH=/path/libggml_tessera.so`, and
//! every device of Tessera's registry (the CPU device, plus SYCL, Vulkan, CUDA or HIP devices when
//! the matching feature is on) appears as a ggml device named `Tessera<name>` (`TesseraCPU`,
//! `TesseraVK0`, ...). llama.cpp's scheduler then places on them every op whose translation
//! Tessera's device accepts ([`translate`]), and the rest on its own CPU backend.
//!
//! The interface is ggml 0.25.3's (backend API version 2), the tree vendored in
//! llama-cpp-python 0.3.36; [`sys`] holds bindings generated from its headers. At load the
//! plugin checks the host's `ggml_version()` and declines to register under any other version,
//! with a message saying so, rather than misread structures laid out differently.
//!
//! The unsafe surface is the C ABI: every `extern "C"` entry point checks its pointers, converts
//! ggml's structures into Tessera's descriptors, and turns every Tessera error into a logged
//! message and ggml's failure value, never a panic across the boundary.

#![allow(unsafe_code)]

mod buffer;
mod ggml;
mod layout;
mod meta_device;
mod objects;
mod registry;
mod stream;
#[allow(unsafe_op_in_unsafe_fn)]
pub mod sys;
#[cfg(all(test, feature = "cpu"))]
mod tests;
#[cfg(all(test, feature = "cpu"))]
mod tests_meta;
pub mod translate;
mod weights;

pub use ggml::{GGML_VERSION, check_version};

/// ggml's entry point for a dynamic backend: the registry of Tessera devices, or null (with a
/// logged reason) when the loading process's ggml is not the version these bindings describe.
#[unsafe(no_mangle)]
pub extern "C" fn ggml_backend_init() -> sys::ggml_backend_reg_t {
    crate::ggml::guard("ggml_backend_init", std::ptr::null_mut(), || {
        registry::init()
    })
}

/// ggml's score of a dynamic backend (higher is preferred by `ggml_backend_load_best`, 0 means
/// unusable here): 1 when Tessera has a device and the host's ggml matches, else 0.
#[unsafe(no_mangle)]
pub extern "C" fn ggml_backend_score() -> i32 {
    crate::ggml::guard("ggml_backend_score", 0, || {
        // ggml asks for the score before it initialises the backend: this is where a host of
        // another ggml version learns why the plugin stays out.
        if let Err(e) = check_version() {
            ggml::log(ggml::Level::Error, &e);
            return 0;
        }
        i32::from(!tessera::registry().devices().is_empty())
    })
}
