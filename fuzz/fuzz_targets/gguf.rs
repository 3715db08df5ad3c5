//! The GGUF reader on whole files: every byte string is a typed error or a file whose every
//! tensor range lies inside it; the model config and tokenizer readers run on what parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera::gguf::{GgufFile, ReadOptions};
use tessera_model::{LlamaConfig, Tokenizer};

fuzz_target!(|data: &[u8]| {
    for opts in [
        ReadOptions::default(),
        ReadOptions::allow_unsupported_types(),
    ] {
        let Ok(file) = GgufFile::from_bytes(data.to_vec(), "fuzz.gguf", &opts) else {
            continue;
        };
        assert!(file.data_offset() <= data.len().next_multiple_of(file.alignment()));
        for t in file.tensors() {
            let r = t.file_range();
            assert!(
                r.start <= r.end && r.end <= data.len(),
                "{} {r:?}",
                t.name()
            );
            assert_eq!(r.len(), t.nbytes());
            let _ = t.dtype();
            if let Ok(bytes) = file.tensor_bytes(t.name()) {
                assert_eq!(bytes.len(), t.nbytes());
            }
        }
        for (key, value) in file.metadata().iter() {
            let _ = (key.len(), value.type_description(), value.to_u64());
        }
        let _ = LlamaConfig::from_gguf(&file);
        if let Ok(tok) = Tokenizer::from_gguf(&file) {
            let ids = tok.encode("Hello world <s>!", true, true);
            let _ = tok.decode(&ids, true);
        }
    }
});
