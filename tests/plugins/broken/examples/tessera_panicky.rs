//! A plugin whose stream creation and buffer writes panic.

use std::sync::Arc;
use tessera_core::Registry;

tessera_plugin::export_backend!(|| -> Arc<dyn Registry> {
    Arc::new(tessera_test_plugins::ToyRegistry { panicky: true })
});
