//! Generate text from a GGUF model file, printing each token's text as soon as it is produced.
//!
//! Steps: open the file (memory-mapped), read its tokenizer and hyper-parameters, load the
//! weights on the CPU in a [`Session`], then let a [`Generator`] evaluate the prompt and
//! repeatedly pick the next token from the last position's logits and feed it back. Tokens are
//! picked by llama.cpp's sampler chain (`tessera_model::sampling`: repetition penalty, top-k,
//! top-p, min-p, temperature, a seeded draw), so one seed always gives the same text. The
//! generator's pieces are text that is safe to print (a character split over two tokens is
//! held back); generation stops after `N_TOKENS` tokens, at the end-of-sequence token, or at
//! the stop string "\n\n\n".
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
use tessera::gguf::GgufFile;
use tessera_model::sampling::{Sampler, SamplerConfig};
use tessera_model::{Generator, LlamaConfig, LlamaModel, Session, Tokenizer};

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
    let sampler = Sampler::new(SamplerConfig {
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
    // The whole model on the CPU (`.devices(..)` and `.split(Split::Layer {..})`, `Tensor` or
    // `Expert` spread it over more devices).
    let mut session = Session::builder(&model).build()?;

    // ---- Generate. ----
    let mut out = std::io::stdout();
    print!("{prompt}");
    out.flush()?;
    // The sampler's repetition penalty sees the prompt too.
    let mut generator = Generator::new(&mut session, &tok, sampler, &prompt_tokens)
        .max_tokens(n_tokens)
        .stop_strings(&["\n\n\n".to_string()]);
    for piece in &mut generator {
        // Errors name the op or device; non-finite logits are refused, never sampled.
        out.write_all(piece?.text.as_bytes())?;
        out.flush()?;
    }
    println!();
    let stats = generator.stats();
    eprintln!(
        "{} prompt tokens ({:.1} t/s) + {} generated ({:.1} t/s); stopped: {:?}",
        stats.prompt_tokens,
        stats.prompt_tps(),
        stats.generated,
        stats.gen_tps(),
        generator.finish_reason()
    );
    Ok(())
}
