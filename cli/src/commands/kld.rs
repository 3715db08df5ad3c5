//! `tessera kld`: what each KV cache type costs, as llama-perplexity's `--kl-divergence` shows
//! it: the KL divergence of its next-token distributions from the F16 cache's, how often the
//! most likely token is the same, and the perplexity of the text, over a text of thousands of
//! tokens.

use super::session::{MIB, devices_for, open_session, status};
use anyhow::Context as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use tessera::gguf::GgufFile;
use tessera_model::{KvCacheTypes, LlamaModel, Session, SplitMode, Tokenizer};

/// The text scored when no `-f` is given: the Apache-2.0 license the crate ships (about 2,600
/// tokens of English prose for the usual vocabularies).
const DEFAULT_TEXT: &str = include_str!("../../LICENSE-APACHE");

/// Arguments of `tessera kld`.
#[derive(Clone, Debug, clap::Args)]
pub struct KldArgs {
    /// GGUF model file.
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Text file to score (default: the Apache-2.0 license text shipped with Tessera).
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Tokens per chunk: each chunk is evaluated from an empty cache and its second half is
    /// scored, the first half being context (as llama-perplexity).
    #[arg(short = 'c', long, default_value_t = 512, value_parser = super::args::context)]
    pub ctx_size: usize,
    /// Chunks to score (default: as many as the text fills).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Cache types compared with F16, comma-separated: `q8_0` (K and V) or `q8_0/q4_0` (K/V).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "q8_0,q5_1,q5_0,q4_1,q4_0,iq4_nl"
    )]
    pub types: Vec<String>,
    /// none, layer, tensor or expert.
    #[arg(long, value_parser = super::args::split_mode, default_value = "none")]
    pub split_mode: SplitMode,
    /// Devices: comma-separated names, or KIND:N (default: CPU for none, cpu:2 otherwise).
    #[arg(long)]
    pub devices: Option<String>,
    /// Threads in all, divided among the CPU devices as llama.cpp's -t.
    #[arg(short = 't', long, value_parser = super::args::threads)]
    pub threads: Option<usize>,
}

/// One cache type's statistics over the scored positions.
struct Scores {
    types: KvCacheTypes,
    kv_bytes: usize,
    kld: Vec<f64>,
    same_top: usize,
    nll: f64,
}

/// `log Σ exp(x)` of a row.
fn log_sum_exp(x: &[f32]) -> f64 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f64 = x.iter().map(|&v| f64::from(v - m).exp()).sum();
    f64::from(m) + s.ln()
}

/// KL(p ‖ q) of the softmaxes of two logit rows, and whether their argmaxes agree.
fn kl_divergence(base: &[f32], other: &[f32]) -> (f64, bool) {
    let (lb, lo) = (log_sum_exp(base), log_sum_exp(other));
    let mut kl = 0.0;
    for (&b, &o) in base.iter().zip(other) {
        let lp = f64::from(b) - lb;
        kl += lp.exp() * (lp - (f64::from(o) - lo));
    }
    let same = tessera_model::argmax(base) == tessera_model::argmax(other);
    (kl.max(0.0), same)
}

/// Parses `q8_0` (both caches) or `q8_0/q4_0` (K/V).
fn parse_types(s: &str) -> anyhow::Result<KvCacheTypes> {
    let (k, v) = s.split_once('/').unwrap_or((s, s));
    Ok(KvCacheTypes::parse(k.trim(), v.trim())?)
}

/// Runs `tessera kld` and prints its table.
///
/// # Errors
/// Unreadable files, a text too short for one chunk, unknown cache types, loading and compute
/// errors.
pub fn run(args: &KldArgs) -> anyhow::Result<()> {
    let types: Vec<KvCacheTypes> = args
        .types
        .iter()
        .map(|s| parse_types(s))
        .collect::<anyhow::Result<_>>()?;
    let file = Arc::new(
        GgufFile::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?,
    );
    let tok = Tokenizer::from_gguf(&file).context("reading the tokenizer")?;
    let text = match &args.file {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => DEFAULT_TEXT.to_string(),
    };
    let tokens = tok.encode(&text, tok.adds_bos(), false);
    let c = args.ctx_size;
    // The second half of a chunk is scored, each position against the token after it: at least
    // one position needs a chunk of 4.
    if c < 4 {
        anyhow::bail!("-c {c}: a chunk needs at least 4 tokens (its second half is scored)");
    }
    let fits = tokens.len() / c;
    let n_chunks = args.chunks.map_or(fits, |n| n.min(fits));
    if n_chunks == 0 {
        anyhow::bail!(
            "the text has {} tokens, fewer than one chunk of {c} (lower -c)",
            tokens.len()
        );
    }
    let base = LlamaModel::from_gguf(file, Some(c))?;
    let devices = devices_for(args.split_mode, args.devices.as_deref())?;
    let opts = super::session::Load::new(args.split_mode).with_threads(args.threads);
    eprintln!(
        "scoring {n_chunks} chunks of {c} tokens ({} of the text's {} tokens), the second half of each",
        n_chunks * c,
        tokens.len()
    );
    let mut reference = open_session(&base, &devices, opts.clone())?;
    let mut sessions: Vec<(Session, Scores)> = Vec::with_capacity(types.len());
    for &t in &types {
        let s = open_session(&base, &devices, opts.clone().with_cache_types(t))?;
        let kv_bytes = s.model().cache_bytes_total();
        sessions.push((
            s,
            Scores {
                types: t,
                kv_bytes,
                kld: Vec::new(),
                same_top: 0,
                nll: 0.0,
            },
        ));
    }
    let n_vocab = base.config().n_vocab;
    let first = c / 2;
    let (mut base_nll, mut scored) = (0.0f64, 0usize);
    let tty = std::io::stderr().is_terminal();
    for chunk in 0..n_chunks {
        if tty {
            status(format_args!("chunk {}/{n_chunks}", chunk + 1));
        }
        // Each chunk starts with BOS where the model's tokenizer adds one, as llama-perplexity
        // starts its chunks: without it a chunk's context is out of distribution (Gemma 3's
        // perplexity was 15.7 instead of 10.1 on the default text), and the KL figures of
        // different programs only compare under the same protocol.
        let mut chunk_toks = tokens[chunk * c..(chunk + 1) * c].to_vec();
        if let Some(bos) = tok.bos().filter(|_| tok.adds_bos()) {
            chunk_toks[0] = bos;
        }
        let toks = &chunk_toks[..];
        reference.reset();
        let want = reference.eval(toks)?;
        for i in first..c - 1 {
            let row = &want[i * n_vocab..(i + 1) * n_vocab];
            base_nll += log_sum_exp(row) - f64::from(row[toks[i + 1] as usize]);
        }
        scored += c - 1 - first;
        for (s, sc) in &mut sessions {
            s.reset();
            let got = s.eval(toks)?;
            for i in first..c - 1 {
                let (b, o) = (
                    &want[i * n_vocab..(i + 1) * n_vocab],
                    &got[i * n_vocab..(i + 1) * n_vocab],
                );
                let (kl, same) = kl_divergence(b, o);
                sc.kld.push(kl);
                sc.same_top += usize::from(same);
                sc.nll += log_sum_exp(o) - f64::from(o[toks[i + 1] as usize]);
            }
        }
    }
    if tty {
        eprintln!();
    }
    let f16_bytes = reference.model().cache_bytes_total();
    println!(
        "| {:<6} | {:<6} | {:>10} | {:>9} | {:>10} | {:>10} | {:>10} | {:>10} | {:>9} |",
        "type_k",
        "type_v",
        "KV MiB",
        "vs f16",
        "PPL",
        "mean KLD",
        "median KLD",
        "99% KLD",
        "same top"
    );
    println!(
        "| {:-<6} | {:-<6} | {:->10} | {:->9} | {:->10} | {:->10} | {:->10} | {:->10} | {:->9} |",
        "", "", "", "", "", "", "", "", ""
    );
    println!(
        "| {:<6} | {:<6} | {:>10.2} | {:>9} | {:>10.4} | {:>10} | {:>10} | {:>10} | {:>9} |",
        "f16",
        "f16",
        f16_bytes as f64 / MIB,
        "1.00×",
        (base_nll / scored as f64).exp(),
        "-",
        "-",
        "-",
        "-"
    );
    for (_, sc) in &mut sessions {
        let n = sc.kld.len() as f64;
        let mean = sc.kld.iter().sum::<f64>() / n;
        sc.kld.sort_by(f64::total_cmp);
        let at = |q: f64| sc.kld[((n - 1.0) * q).round() as usize];
        println!(
            "| {:<6} | {:<6} | {:>10.2} | {:>9} | {:>10.4} | {:>10.6} | {:>10.6} | {:>10.6} | {:>8.2}% |",
            sc.types.k.name(),
            sc.types.v.name(),
            sc.kv_bytes as f64 / MIB,
            format!("{:.2}×", sc.kv_bytes as f64 / f16_bytes as f64),
            (sc.nll / scored as f64).exp(),
            mean,
            at(0.5),
            at(0.99),
            100.0 * sc.same_top as f64 / n
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_is_zero_for_equal_rows_and_positive_otherwise() {
        let a = [1.0f32, 2.0, 3.0, -1.0];
        let (kl, same) = kl_divergence(&a, &a);
        assert!(kl.abs() < 1e-12 && same);
        let b = [1.0f32, 3.5, 3.0, -1.0];
        let (kl, same) = kl_divergence(&a, &b);
        // Σ p (log p − log q) by hand for these rows.
        let soft = |x: &[f32]| {
            let l = log_sum_exp(x);
            x.iter().map(|&v| f64::from(v) - l).collect::<Vec<_>>()
        };
        let (lp, lq) = (soft(&a), soft(&b));
        let want: f64 = lp.iter().zip(&lq).map(|(p, q)| p.exp() * (p - q)).sum();
        assert!((kl - want).abs() < 1e-12 && kl > 0.0 && !same);
    }

    #[test]
    fn types_parse_as_one_or_a_pair() {
        let t = parse_types("q8_0").unwrap();
        assert_eq!((t.k, t.v), (tessera::DType::Q8_0, tessera::DType::Q8_0));
        let t = parse_types("q8_0/iq4_nl").unwrap();
        assert_eq!(t.v, tessera::DType::IQ4_NL);
        assert!(parse_types("q3_k").is_err());
        assert!(DEFAULT_TEXT.len() > 10_000);
    }
}
