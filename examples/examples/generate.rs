//! Generate text from a GGUF model file, printing each token's text as soon as it is produced.
//!
//! Steps: open the file (memory-mapped), read its tokenizer and hyper-parameters, load the
//! weights on the CPU in a [`Session`], evaluate the prompt, then repeatedly pick the next
//! token from the last position's logits and feed it back. Tokens are picked by llama.cpp's
//! sampler chain (`tessera_model::sampling`: repetition penalty, top-k, top-p, min-p,
//! temperature, a seeded draw), so one seed always gives the same text. Generation stops after
//! `N_TOKENS` tokens or at the end-of-sequence token.
//!
//! Works with the architectures `tessera run --help` lists. Run it with:
//!
//! ```sh
//! cargo run --release -p tessera-examples --example generate -- MODEL.gguf ["PROMPT"] [N_TOKENS] [TEMPERATURE]
//! ```
//!
//! (a model to try: Gemma 3 270M, `gemma-3-270m-q4_k_m.gguf`; `PROMPT` defaults to
//! "Once upon a time", `N_TOKENS` to 32, `TEMPERATURE` to 0.8; 0 is greedy).

use anyhow::{Context as _, bail};
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;
use tessera::gguf::GgufFile;
use tessera_model::sampling::{Sampler, SamplerConfig};
use tessera_model::{LlamaConfig, LlamaModel, Session, SessionOptions, Tokenizer};

const USAGE: &str = "usage: generate MODEL.gguf [PROMPT] [N_TOKENS] [TEMPERATURE]";

fn main() -> anyhow::Result<()> {
    // ---- Arguments: the model path is required, the rest have defaults. ----
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let prompt = args.get(1).map_or("Once upon a time", String::as_str);
    let n_tokens: usize = match args.get(2).map(|s| s.parse()) {
        None => 32,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("N_TOKENS must be a whole number\n{USAGE}");
            std::process::exit(2);
        }
    };
    let temperature: f32 = match args.get(3).map(|s| s.parse()) {
        None => 0.8,
        Some(Ok(t)) => t,
        Some(Err(_)) => {
            eprintln!("TEMPERATURE must be a number\n{USAGE}");
            std::process::exit(2);
        }
    };
    // llama.cpp's chain and defaults (top-k 40, top-p 0.95, min-p 0.05); a mild repetition
    // penalty over the last 64 tokens. `Sampler::new` rejects out-of-range values by name.
    let mut sampler = Sampler::new(SamplerConfig {
        temperature,
        repeat_penalty: 1.1,
        seed: 42,
        ..SamplerConfig::default()
    })?;

    // ---- Open the file and tokenize the prompt. ----
    // Errors name the file (and the key or tensor at fault).
    let file = Arc::new(GgufFile::open(path)?);
    let tok = Tokenizer::from_gguf(&file).context("reading the tokenizer")?;
    // Add BOS if the vocabulary asks for it; don't interpret `<...>` control-token text.
    let prompt_tokens = tok.encode(prompt, tok.adds_bos(), false);
    if prompt_tokens.is_empty() {
        bail!("the prompt encodes to no tokens");
    }

    // ---- Load the model. ----
    // The KV cache needs a row per token: the prompt plus what we generate.
    let config = LlamaConfig::from_gguf(&file)?;
    let n_ctx = prompt_tokens.len() + n_tokens;
    if n_ctx > config.n_ctx {
        bail!(
            "{} prompt tokens + {n_tokens} new ones exceed the model's context of {}",
            prompt_tokens.len(),
            config.n_ctx
        );
    }
    let model = LlamaModel::from_gguf(file.clone(), Some(n_ctx))?;
    // The whole model on one device (`SplitMode::None`; `Layer`, `Tensor` or `Expert` with more
    // devices split it).
    let cpu = tessera::registry().device("CPU")?;
    let mut session = Session::open(&model, &[cpu], &SessionOptions::default())?;

    // ---- Generate. ----
    let mut out = std::io::stdout();
    print!("{prompt}");
    out.flush()?;
    let start = Instant::now();
    // `eval_last` returns the logits (one score per vocabulary entry) of the last token only.
    let mut logits = session.eval_last(&prompt_tokens)?;
    // The repetition penalty looks at the prompt too.
    for &t in &prompt_tokens {
        sampler.accept(t);
    }
    // A token's bytes can end inside a UTF-8 character; keep such a tail until it completes.
    let mut pending: Vec<u8> = Vec::new();
    let mut generated = 0;
    while generated < n_tokens {
        if let Some((i, v)) = tessera_model::first_non_finite(&logits) {
            bail!("logit {i} is {v}: the model produced a non-finite value");
        }
        let next = sampler.sample(&logits)?;
        sampler.accept(next);
        if Some(next) == tok.eos() {
            break;
        }
        pending.extend(tok.token_to_piece(next, false)?);
        print_complete_utf8(&mut pending, &mut out)?;
        generated += 1;
        if generated < n_tokens {
            logits = session.eval_last(&[next])?;
        }
    }
    pending.push(b'\n');
    print_complete_utf8(&mut pending, &mut out)?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "{} prompt + {generated} generated tokens in {secs:.2} s",
        prompt_tokens.len()
    );
    Ok(())
}

/// Writes the complete UTF-8 characters at the front of `pending` and keeps an unfinished one.
fn print_complete_utf8(pending: &mut Vec<u8>, out: &mut impl Write) -> std::io::Result<()> {
    let complete = match std::str::from_utf8(pending) {
        Ok(s) => s.len(),
        // The bytes so far are the start of a character: wait for the rest.
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        // Invalid bytes: print them (replaced by U+FFFD) rather than wait forever.
        Err(_) => pending.len(),
    };
    out.write_all(String::from_utf8_lossy(&pending[..complete]).as_bytes())?;
    out.flush()?;
    pending.drain(..complete);
    Ok(())
}
