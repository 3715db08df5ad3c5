//! Serve several requests at once: continuous batching on one [`Session`].
//!
//! Each request is a sequence of the session's shared KV cache. Every step is one [`Batch`]:
//! the prompts of requests that just arrived and the next token of every running one. A request
//! leaves when it ends (end-of-sequence, its token limit, or a stop string); its cells are freed
//! and a waiting request takes its place in the next step. Each sequence has its own sampler
//! and its own [`TextStream`] (text released only when it is complete, stop strings held back).
//!
//! With a GGUF file the prompts are text; without one a synthetic model and vocabulary stand
//! in, so the example runs anywhere:
//!
//! ```sh
//! cargo run --release -p tessera-examples --example serve -- [MODEL.gguf] [MAX_RUNNING]
//! ```

use anyhow::Context as _;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;
use tessera::gguf::GgufFile;
use tessera_model::sampling::{Sampler, SamplerConfig};
use tessera_model::{
    Batch, BatchLogits, LlamaConfig, LlamaModel, SeqId, Session, TextStream, Token, Tokenizer,
};

/// Tokens generated per request at most.
const MAX_NEW: usize = 24;

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "Once upon a time",
    "A list of prime numbers: 2, 3, 5,",
    "The quick brown fox",
    "In 1969, the first",
    "def fibonacci(n):",
];

/// A request being served.
struct Running {
    id: usize,
    seq: SeqId,
    sampler: Sampler,
    text: TextStream,
    out: String,
    generated: usize,
    /// The token to evaluate in the next step (None: its prompt is in the batch).
    next: Option<Token>,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let max_running: usize = args.get(1).map_or(Ok(4), |s| s.parse())?;
    let (model, tok) = match args.first() {
        Some(path) => {
            let file = Arc::new(GgufFile::open(path)?);
            let tok = Tokenizer::from_gguf(&file).context("reading the tokenizer")?;
            (LlamaModel::from_gguf(file, Some(512))?, tok)
        }
        None => {
            let model = LlamaModel::new(LlamaConfig::tiny(), 7)?;
            let tok = model.synthetic_tokenizer()?;
            (model, tok)
        }
    };
    // One session for every request: they share the weights and the cache's cells.
    let mut session = Session::builder(&model)
        .context(512)
        .max_sequences(max_running)
        .build()?;

    let mut waiting: VecDeque<(usize, Vec<Token>)> = PROMPTS
        .iter()
        .enumerate()
        .map(|(id, p)| (id, tok.encode(p, tok.adds_bos(), false)))
        .collect();
    let mut running: Vec<Running> = Vec::new();
    let mut free: Vec<SeqId> = (0..max_running as SeqId).rev().collect();
    let mut batch = Batch::new();
    let mut logits = BatchLogits::default();
    let (start, mut steps, mut tokens) = (Instant::now(), 0, 0);
    while !waiting.is_empty() || !running.is_empty() {
        batch.clear();
        // Running requests: their last token, at their next position.
        for r in &running {
            if let Some(t) = r.next {
                batch.add(t, session.seq_next_pos(r.seq)?, r.seq, true);
            }
        }
        // Waiting requests join while there is a free sequence id and room in the cache for
        // their prompt and every running request's remaining tokens.
        let n_ctx = session.model().config().n_ctx;
        let mut reserved: usize = running.iter().map(|r| MAX_NEW - r.generated).sum();
        while let (Some(seq), Some((_, prompt))) = (free.last().copied(), waiting.front()) {
            if session.cells_used() + reserved + prompt.len() + MAX_NEW > n_ctx {
                break;
            }
            reserved += prompt.len() + MAX_NEW;
            let (id, prompt) = waiting.pop_front().context("checked above")?;
            free.pop();
            batch.add_sequence(seq, 0, &prompt);
            let mut sampler = Sampler::new(SamplerConfig {
                temperature: 0.7,
                seed: id as u64,
                ..SamplerConfig::default()
            })?;
            for &t in &prompt {
                sampler.accept(t);
            }
            running.push(Running {
                id,
                seq,
                sampler,
                text: TextStream::new(&["\n\n".to_string()]),
                out: String::new(),
                generated: 0,
                next: None,
            });
        }
        // One step for everyone; each sequence's last token asked for its logits.
        session.decode_into(&batch, &mut logits)?;
        steps += 1;
        tokens += batch.len();
        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            // The row of this sequence's last token in the batch.
            let row = (0..batch.len())
                .rev()
                .find(|&j| batch.tokens()[j].seq == r.seq)
                .and_then(|j| logits.get(j))
                .context("every sequence in the batch asked for its logits")?;
            let t = r.sampler.sample(row)?;
            r.sampler.accept(t);
            let eos = Some(t) == tok.eos();
            if !eos {
                r.out += &r.text.push(&tok.token_to_piece(t, false)?);
                r.generated += 1;
            }
            if eos || r.generated == MAX_NEW || r.text.stopped().is_some() {
                r.out += &r.text.finish();
                println!("[{}] {}{}", r.id, PROMPTS[r.id], r.out);
                // The request leaves: its cells serve the next one.
                session.seq_remove(Some(r.seq), 0, usize::MAX)?;
                free.push(r.seq);
                running.swap_remove(i);
            } else {
                r.next = Some(t);
                i += 1;
            }
        }
    }
    eprintln!(
        "{} requests, {tokens} tokens in {steps} steps ({:.1} tokens/s), at most {max_running} at once",
        PROMPTS.len(),
        tokens as f64 / start.elapsed().as_secs_f64()
    );
    Ok(())
}
