//! `tessera run`: load a GGUF model, tokenize a prompt, evaluate it and stream generated text,
//! then print prompt and generation speed.

use super::session::{devices_for, open_session};
use anyhow::Context as _;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tessera::gguf::GgufFile;
use tessera_model::sampling::{Sampler, SamplerConfig};
use tessera_model::tokenizer::{ChatTemplate, user_turn};
use tessera_model::{LlamaModel, SplitMode, Tokenizer};

/// Arguments of `tessera run`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// GGUF model file (its `general.architecture` one of the architectures listed below).
    #[arg(short = 'm', long)]
    pub model: PathBuf,
    /// Prompt text.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Tokens to generate (stops early at end-of-sequence).
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    pub n_predict: usize,
    /// none, layer, tensor or expert (tensor with whole experts per device in mixture-of-experts
    /// layers).
    #[arg(long, value_parser = super::args::split_mode, default_value = "none")]
    pub split_mode: SplitMode,
    /// Devices: comma-separated names, or KIND:N (default: CPU for none, cpu:2 otherwise).
    #[arg(long)]
    pub devices: Option<String>,
    /// Split ratios of the layer and tensor modes, one per device.
    #[arg(long, value_delimiter = ',', value_parser = super::args::ratio)]
    pub ratios: Vec<f32>,
    /// With tensor or expert: cut the devices into this many equal groups, each splitting
    /// its layers tensor-parallel, with the layers split between the groups.
    #[arg(long, default_value_t = 1, value_parser = super::args::count)]
    pub tp_groups: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub cache: super::session::CacheTypeArgs,
    /// Context (KV cache rows); default: prompt + generated tokens, within the model's context.
    #[arg(short = 'c', long, value_parser = super::args::context)]
    pub ctx_size: Option<usize>,
    /// Threads in all, divided among the CPU devices as llama.cpp's -t (default: one per core
    /// of each device).
    #[arg(short = 't', long, value_parser = super::args::threads)]
    pub threads: Option<usize>,
    /// Writes the logits of every evaluated position (f32 little-endian, row-major
    /// [n_tokens × n_vocab]) to this file.
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Parse special-token text (e.g. `<start_of_turn>`) in the prompt.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub parse_special: bool,
    /// Wrap the prompt as one user turn with the file's chat template (as llama.cpp's
    /// `llama_chat_apply_template`: built-in ChatML where it detects ChatML, else the Jinja
    /// template), opening the assistant's turn.
    #[arg(long)]
    pub chat: bool,
    /// With `--chat`: a system turn before the prompt.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// With `--chat`: always render the Jinja template (as llama.cpp's `--jinja`).
    #[arg(long, requires = "chat")]
    pub jinja: bool,
    /// When a step's logits hold a NaN or infinity (always an error: nothing is sampled from
    /// them), re-run the step with every op checked and name the first op that produced one.
    #[arg(long)]
    pub check_finite: bool,
    #[command(flatten)]
    pub dist: super::dist::DistArgs,
}

/// The sampler chain's flags, named and defaulted as llama.cpp's (except `--temp`: 0, greedy, so
/// a run is reproducible unless asked otherwise; llama.cpp's CLI uses 0.8). The chain runs
/// penalties → top-k → top-p → min-p → temperature → draw.
#[derive(Clone, Debug, clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature, a finite number >= 0; 0 is greedy (the argmax after penalties).
    #[arg(long, default_value_t = SamplerConfig::default().temperature, value_parser = super::args::temperature)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: off).
    #[arg(long, default_value_t = SamplerConfig::default().top_k)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1: off).
    #[arg(long, default_value_t = SamplerConfig::default().top_p)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0: off).
    #[arg(long, default_value_t = SamplerConfig::default().min_p)]
    pub min_p: f32,
    /// Divide (positive) or multiply (negative) the logits of recently seen tokens by this (1: off).
    #[arg(long, default_value_t = SamplerConfig::default().repeat_penalty)]
    pub repeat_penalty: f32,
    /// Subtract this times a recent token's count from its logit (0: off).
    #[arg(long, default_value_t = SamplerConfig::default().frequency_penalty)]
    pub frequency_penalty: f32,
    /// Subtract this once from the logit of every recent token (0: off).
    #[arg(long, default_value_t = SamplerConfig::default().presence_penalty)]
    pub presence_penalty: f32,
    /// How many of the last tokens (prompt included) the penalties look at (0: off).
    #[arg(long, default_value_t = SamplerConfig::default().penalty_last_n)]
    pub repeat_last_n: usize,
    /// Seed of the sampler: one seed, one text.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

impl Default for SamplingArgs {
    fn default() -> Self {
        let c = SamplerConfig::default();
        SamplingArgs {
            temp: c.temperature,
            top_k: c.top_k,
            top_p: c.top_p,
            min_p: c.min_p,
            repeat_penalty: c.repeat_penalty,
            frequency_penalty: c.frequency_penalty,
            presence_penalty: c.presence_penalty,
            repeat_last_n: c.penalty_last_n,
            seed: 42,
        }
    }
}

impl SamplingArgs {
    /// The sampler these flags describe.
    ///
    /// # Errors
    /// A parameter out of its range, named with the range.
    pub fn sampler(&self) -> anyhow::Result<Sampler> {
        let config = SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_last_n: self.repeat_last_n,
            seed: self.seed,
        };
        Ok(Sampler::new(config)?)
    }
}

/// Runs `tessera run`.
///
/// # Errors
/// File, tokenizer, model, device and compute errors.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let job = super::dist::Job::start(&args.dist, &super::dist::fingerprint(Some(&args.model))?)?;
    job.finish(run_job(args, &job))
}

/// The next token on every rank: rank 0 samples it and broadcasts it, so that every rank feeds
/// the same token even where sampling could differ (it does not: logits are gathered
/// identically, but the token must never depend on that).
fn next_token(
    job: &super::dist::Job,
    logits: &[f32],
    sampler: &mut Sampler,
) -> anyhow::Result<i32> {
    let mut tok = sampler.sample(logits)?.to_le_bytes();
    if let Some(comm) = job.comm() {
        comm.broadcast(0, &mut tok, "sampled token")?;
    }
    let tok = i32::from_le_bytes(tok);
    // Every rank's penalty window holds the token every rank feeds.
    sampler.accept(tok);
    Ok(tok)
}

fn run_job(args: &RunArgs, job: &super::dist::Job) -> anyhow::Result<()> {
    let root = job.is_root();
    let sampler = args.sampling.sampler()?;
    let t_load = Instant::now();
    let file = Arc::new(
        GgufFile::open(&args.model).with_context(|| format!("opening {}", args.model.display()))?,
    );
    let tok = Tokenizer::from_gguf(&file).context("reading the tokenizer")?;
    let text = if args.chat {
        let tmpl = ChatTemplate::from_metadata(file.metadata(), &tok)?;
        let msgs = user_turn(args.system.as_deref(), &args.prompt);
        let text = if args.jinja {
            tmpl.render_jinja(&msgs, true)?
        } else {
            tmpl.render(&msgs, true)?
        };
        tracing::info!("chat prompt: {text:?}");
        text
    } else {
        args.prompt.clone()
    };
    let prompt = tok.encode(&text, tok.adds_bos(), args.parse_special || args.chat);
    if prompt.is_empty() {
        anyhow::bail!("the prompt encodes to no tokens");
    }
    let wanted = prompt.len() + args.n_predict.max(1);
    let config = tessera_model::LlamaConfig::from_gguf(&file)?;
    if let Some(c) = args.ctx_size
        && c > config.n_ctx
    {
        anyhow::bail!(
            "-c {c} exceeds the model's context of {} tokens",
            config.n_ctx
        );
    }
    let n_ctx = args.ctx_size.unwrap_or(wanted.min(config.n_ctx));
    if wanted > n_ctx {
        anyhow::bail!(
            "{} prompt tokens + {} to generate exceed the context of {n_ctx} (raise -c)",
            prompt.len(),
            args.n_predict
        );
    }
    let model =
        LlamaModel::from_gguf(file.clone(), Some(n_ctx))?.with_cache_types(args.cache.types()?)?;
    let c = model.config();
    if root {
        eprintln!(
            "model: {} ({}), {} layers, n_embd {}, {} heads ({} KV), vocab {}, {:.1} MiB of weights; \
         prompt {} tokens",
            args.model.display(),
            c.arch.name(),
            c.n_layer,
            c.n_embd,
            c.n_head,
            c.n_head_kv,
            c.n_vocab,
            model.weight_bytes_total() as f64 / (1u64 << 20) as f64,
            prompt.len()
        );
    }
    let devices = devices_for(args.split_mode, args.devices.as_deref())?;
    let opts = super::session::Load::new(args.split_mode)
        .with_ratios(&args.ratios)
        .with_threads(args.threads)
        .with_comm(job.comm())
        .with_groups(args.tp_groups);
    let mut session = open_session(&model, &devices, opts)?;
    session.set_check_finite(args.check_finite);
    if root {
        eprintln!("loaded in {:.2} s", t_load.elapsed().as_secs_f64());
    }

    let mut logits_out = match args.logits_out.as_ref().filter(|_| root) {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut write_logits = |l: &[f32]| -> anyhow::Result<()> {
        if let Some(w) = logits_out.as_mut() {
            for v in l {
                w.write_all(&v.to_le_bytes())?;
            }
        }
        Ok(())
    };

    // Only rank 0 prints the text.
    let mut stdout: Box<dyn Write> = if root {
        Box::new(std::io::stdout())
    } else {
        Box::new(std::io::sink())
    };
    let mut echo = tessera_model::TextStream::default();
    let shown = echo.push(tok.decode(&prompt, false)?.as_bytes());
    stdout.write_all(shown.as_bytes())?;
    stdout.flush()?;
    // Every prompt position's logits only when they are written out; sampling needs the last.
    let all_positions = args.logits_out.is_some();
    let mut generator = tessera_model::Generator::new(&mut session, &tok, sampler, &prompt)
        .max_tokens(args.n_predict)
        .with_picker(|logits, sampler| {
            next_token(job, logits, sampler)
                .map_err(|e| tessera_model::GenerateError::Hook(e.into()))
        })
        .on_logits(all_positions, |l| {
            write_logits(l).map_err(|e| tessera_model::GenerateError::Hook(e.into()))
        });
    for piece in &mut generator {
        let piece = piece.map_err(|e| match e {
            tessera_model::GenerateError::NonFinite { step, index, value } => anyhow::anyhow!(
                "step {step}: logit {index} is {value}; refusing to sample from non-finite \
                 logits (rerun with --check-finite to name the op that produced it)"
            ),
            e => anyhow::Error::new(e),
        })?;
        stdout.write_all(piece.text.as_bytes())?;
        stdout.flush()?;
    }
    let stats = generator.stats();
    drop(generator);
    let rest = echo.finish() + "\n";
    stdout.write_all(rest.as_bytes())?;
    stdout.flush()?;
    if let Some(mut w) = logits_out {
        w.flush()?;
    }
    if !root {
        return Ok(());
    }
    eprintln!(
        "prompt: {} tokens in {:.3} s ({:.2} t/s); generation: {} tokens in {:.3} s \
         ({:.2} t/s); split mode {}",
        stats.prompt_tokens,
        stats.prompt_secs,
        stats.prompt_tps(),
        stats.generated,
        stats.gen_secs,
        stats.gen_tps(),
        args.split_mode.name()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_flags_build_the_chain_and_refuse_bad_values() {
        let greedy = SamplingArgs::default();
        let mut s = greedy.sampler().unwrap();
        assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9]).unwrap(), 1);
        for (name, bad) in [
            (
                "top_p",
                SamplingArgs {
                    top_p: 1.5,
                    ..SamplingArgs::default()
                },
            ),
            (
                "min_p",
                SamplingArgs {
                    min_p: -0.1,
                    ..SamplingArgs::default()
                },
            ),
            (
                "repeat_penalty",
                SamplingArgs {
                    repeat_penalty: 0.0,
                    ..SamplingArgs::default()
                },
            ),
            (
                "frequency_penalty",
                SamplingArgs {
                    frequency_penalty: f32::NAN,
                    ..SamplingArgs::default()
                },
            ),
        ] {
            let e = bad.sampler().unwrap_err().to_string();
            assert!(e.contains(name), "{name}: {e}");
        }
    }

    /// The tiny synthetic model as a GGUF file whose `output.weight` has an f16 NaN block scale.
    fn nan_output_model(dir: &std::path::Path) -> PathBuf {
        use tessera::gguf::{GgufFile, ReadOptions};
        let m = tessera_model::LlamaModel::new(tessera_model::LlamaConfig::tiny(), 3).unwrap();
        let mut bytes = m.to_gguf().unwrap().to_bytes();
        let file = GgufFile::from_bytes(bytes.clone(), "tiny", &ReadOptions::default()).unwrap();
        let at = file
            .tensor_info("output.weight")
            .unwrap()
            .file_range()
            .start;
        bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
        let path = dir.join("nan-output.gguf");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn args(model: PathBuf, check_finite: bool) -> RunArgs {
        RunArgs {
            model,
            prompt: "ab".into(),
            n_predict: 2,
            split_mode: SplitMode::None,
            devices: None,
            ratios: Vec::new(),
            tp_groups: 1,
            sampling: SamplingArgs {
                temp: 0.7,
                seed: 1,
                ..SamplingArgs::default()
            },
            cache: Default::default(),
            ctx_size: None,
            threads: Some(1),
            logits_out: None,
            parse_special: true,
            chat: false,
            system: None,
            jinja: false,
            check_finite,
            dist: Default::default(),
        }
    }

    #[test]
    fn nan_logits_are_an_error_and_check_finite_names_the_op() {
        let dir = std::env::temp_dir().join(format!("tessera-run-nan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = nan_output_model(&dir);
        let e = run(&args(model.clone(), false)).unwrap_err().to_string();
        assert!(
            e.contains("refusing to sample from non-finite logits"),
            "{e}"
        );
        let e = format!("{:#}", run(&args(model, true)).unwrap_err());
        assert!(e.contains("(MUL_MAT of 'output.weight'"), "{e}");
        assert!(e.contains("first non-finite value"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
