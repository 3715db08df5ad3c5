//! A plugin whose registry constructor panics.

use std::sync::Arc;
use tessera_core::Registry;

tessera_plugin::export_backend!(|| -> Arc<dyn Registry> {
    panic!("deliberate panic in the registry constructor")
});
