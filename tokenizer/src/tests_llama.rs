//! Against llama.cpp itself: its vocabulary-only GGUFs with reference tokenizations
//! (`models/ggml-vocab-*.gguf` + `.gguf.inp` / `.gguf.out`, as `tests/test-tokenizer-0.cpp`
//! reads them), our own text set recorded with llama.cpp (`tests/reference/tokenizer/`), and
//! the vocabularies of SmolLM2 and Gemma 3.
//!
//! The vocabulary files come from the llama-cpp-python sdist (`.ci/run` unpacks them and sets
//! `TESSERA_LLAMA_VOCABS`); the model files from `TESSERA_SMOLLM2_GGUF` / `TESSERA_GEMMA3_GGUF`.
//! Without them the tests print `skipped: …` and pass, except under CI (`CI` set), where they
//! fail.

use super::*;
use std::path::{Path, PathBuf};
use tessera_gguf::{GgufFile, ReadOptions};

/// The directory or file named by `var`, or `None` after printing why (failing under CI).
fn input(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) if Path::new(&p).exists() => Some(PathBuf::from(p)),
        other => {
            let why = match other {
                Some(p) => format!("{var}={} does not exist", Path::new(&p).display()),
                None => format!("{var} is not set"),
            };
            assert!(
                std::env::var_os("CI").is_none(),
                "{what}: {why} (required under CI)"
            );
            eprintln!("skipped: {what}: {why}");
            None
        }
    }
}

fn open(path: &Path) -> GgufFile {
    GgufFile::open_with(path, &ReadOptions::allow_unsupported_types())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace's `tests/reference/tokenizer/`.
fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/reference/tokenizer")
}

/// llama.cpp's test cases: inputs separated by `\n__ggml_vocab_test__\n`, one line of ids each.
fn read_cases(inp: &Path, out: &Path) -> Vec<(String, Vec<Token>)> {
    let raw = std::fs::read_to_string(inp).unwrap();
    let mut texts: Vec<&str> = raw.split("\n__ggml_vocab_test__\n").collect();
    // llama.cpp stops at the end of the text: no empty case after a final separator.
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let ids: Vec<Vec<Token>> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{}", inp.display());
    texts.into_iter().map(String::from).zip(ids).collect()
}

/// Tokenizes every case (no BOS/EOS, specials not parsed, as llama.cpp's test); returns the
/// number that match and prints the first mismatches.
fn check(tok: &Tokenizer, name: &str, cases: &[(String, Vec<Token>)]) -> usize {
    let mut ok = 0;
    let mut shown = 0;
    for (text, want) in cases {
        let got = tok.encode(text, false, false);
        if &got == want {
            ok += 1;
        } else if shown < 3 {
            shown += 1;
            eprintln!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}");
        }
    }
    ok
}

#[test]
fn llama_cpp_vocab_files() {
    let Some(dir) = input("TESSERA_LLAMA_VOCABS", "llama.cpp vocab files") else {
        return;
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    paths.sort();
    // Every vocabulary with committed ids must be there: a file missing from the download would
    // otherwise drop its checks silently.
    for e in std::fs::read_dir(reference_dir()).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(stem) = name
            .strip_suffix(".out")
            .filter(|s| s.starts_with("ggml-vocab-"))
        {
            assert!(
                paths
                    .iter()
                    .any(|p| p.file_stem().is_some_and(|f| f == stem)),
                "{stem}.gguf is missing from {}",
                dir.display()
            );
        }
    }
    let mut failed = Vec::new();
    let mut table = String::new();
    for path in &paths {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let inp = path.with_extension("gguf.inp");
        let out = path.with_extension("gguf.out");
        let file = open(path);
        let tok = match Tokenizer::from_gguf(&file) {
            Ok(t) => t,
            Err(e @ TokenizerError::UnsupportedModel { .. }) => {
                table += &format!("{name}: not BPE/SPM ({e})\n");
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
        };
        let pre = tok
            .pre_tokenizer()
            .map_or("spm".into(), |p| format!("{p:?}"));
        table += &format!("{name} [{pre}]:");
        // llama.cpp's own cases where it ships them, then ours (texts.txt).
        let ours = reference_dir().join(format!("{name}.out"));
        for (inp, out) in [(inp, out), (reference_dir().join("texts.txt"), ours)] {
            if !out.exists() {
                table += " -";
                continue;
            }
            let cases = read_cases(&inp, &out);
            let ok = check(&tok, &name, &cases);
            table += &format!(" {ok}/{}", cases.len());
            if ok != cases.len() {
                failed.push(name.clone());
            }
        }
        table += "\n";
    }
    eprintln!("{table}");
    assert!(failed.is_empty(), "mismatches in {failed:?}");
}

/// Our texts on a real model's vocabulary, against llama.cpp's ids in `reference`.
fn real_vocab(path: &Path, reference: &str) -> Tokenizer {
    let file = open(path);
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"));
    let dir = reference_dir();
    let cases = read_cases(&dir.join("texts.txt"), &dir.join(reference));
    let ok = check(&tok, reference, &cases);
    eprintln!("{reference}: {ok}/{} match", cases.len());
    assert_eq!(ok, cases.len(), "{reference}");
    tok
}

/// The rendered prompt and its ids, as `llama_tokenize.cpp`'s chat mode prints them.
fn read_chat(name: &str) -> (String, Vec<Token>) {
    let raw = std::fs::read_to_string(reference_dir().join(name)).unwrap();
    let (text, ids) = raw.split_once("\n__ids__\n").unwrap();
    let ids = ids.split_whitespace().map(|t| t.parse().unwrap()).collect();
    (text.to_string(), ids)
}

#[test]
fn smollm2_vocab_and_chat() {
    let Some(path) = input("TESSERA_SMOLLM2_GGUF", "SmolLM2 GGUF") else {
        return;
    };
    let tok = real_vocab(&path, "smollm2.out");
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizer::Smollm));
    let file = open(&path);
    let tmpl = ChatTemplate::from_metadata(file.metadata(), &tok).unwrap();
    assert!(tmpl.is_builtin_chatml());
    let q = "What is the capital of France?";
    for (system, reference) in [
        (None, "smollm2_chat.txt"),
        (Some("You are terse."), "smollm2_chat_system.txt"),
    ] {
        let (want, want_ids) = read_chat(reference);
        let msgs = user_turn(system, q);
        let got = tmpl.render(&msgs, true).unwrap();
        assert_eq!(got, want, "{reference}");
        assert_eq!(
            tok.encode(&got, tok.adds_bos(), true),
            want_ids,
            "{reference}"
        );
        // With a system turn the Jinja template agrees with llama.cpp's built-in ChatML;
        // without one it adds SmolLM2's default system prompt.
        let jinja = tmpl.render_jinja(&msgs, true).unwrap();
        if system.is_some() {
            assert_eq!(jinja, want);
        } else {
            let default = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, \
                           trained by Hugging Face<|im_end|>\n";
            assert_eq!(jinja, format!("{default}{want}"));
        }
    }
}

#[test]
fn gemma3_vocab_and_no_template() {
    let Some(path) = input("TESSERA_GEMMA3_GGUF", "Gemma 3 GGUF") else {
        return;
    };
    let tok = real_vocab(&path, "gemma3.out");
    assert_eq!(tok.model_name(), "llama");
    // The file carries no `tokenizer.chat_template`: `--chat` refuses it, naming the file.
    let file = open(&path);
    let e = ChatTemplate::from_metadata(file.metadata(), &tok).unwrap_err();
    assert!(matches!(e, ChatError::NoTemplate { .. }), "{e}");
    assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
}
