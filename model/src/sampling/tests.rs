//! The sampler chain against llama.cpp's own test vectors (`tests/test-sampling.cpp`) and its
//! invariants.

use super::stages::*;
use super::*;
use std::collections::HashMap;
use tessera_tokenizer::Token;

/// llama.cpp's `sampler_tester` tolerance.
const TOL: f32 = 1e-5;

/// A configuration with every stage disabled and temperature 1.
fn neutral() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        penalty_last_n: 64,
        seed: 0,
    }
}

/// llama.cpp's tests build logits as `logf(p)`.
fn logits_of(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

fn candidates_of(logits: &[f32]) -> Candidates {
    Candidates {
        data: logits
            .iter()
            .enumerate()
            .map(|(i, &logit)| Candidate {
                id: i as u32,
                logit,
                p: 0.0,
            })
            .collect(),
        sorted: false,
    }
}

fn assert_probs(actual: &[(u32, f32)], expected: &[f32]) {
    assert_eq!(
        actual.len(),
        expected.len(),
        "size mismatch: got {actual:?}, expected {expected:?}"
    );
    for (i, (&(_, p), &e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (p - e).abs() < TOL,
            "entry {i}: got {p}, expected {e} (all: {actual:?})"
        );
    }
}

fn check_stage(config: SamplerConfig, probs: &[f32], expected: &[f32]) {
    let got = probabilities_after(&config, &logits_of(probs), &[]).unwrap();
    assert_probs(&got, expected);
}

/// For parameters `validate` rejects but llama.cpp's tests exercise
/// (top_p = 0, min_p > 1): run the stage directly, then the dist stage.
fn check_raw(probs: &[f32], stage: impl FnOnce(&mut Candidates), expected: &[f32]) {
    let mut c = candidates_of(&logits_of(probs));
    stage(&mut c);
    c.dist(1.0, 0.0);
    let got: Vec<(u32, f32)> = c.data.iter().map(|c| (c.id, c.p)).collect();
    assert_probs(&got, expected);
}

const P4: [f32; 4] = [0.1, 0.2, 0.3, 0.4];

// ---- llama.cpp tests/test-sampling.cpp vectors -------------------------
//
// The expected values below are llama.cpp's test vectors from
// tests/test-sampling.cpp (ggml-org/llama.cpp): test_temp, test_top_k,
// test_top_p, test_min_p, test_penalties and test_sampler_queue, checked
// with the same 1e-5 tolerance after the stage plus a dist stage.

#[test]
fn llama_cpp_temp_vectors() {
    check_stage(
        SamplerConfig {
            temperature: 1.0,
            ..neutral()
        },
        &P4,
        &P4,
    );
    check_stage(
        SamplerConfig {
            temperature: 0.0,
            ..neutral()
        },
        &P4,
        &[0.0, 0.0, 0.0, 1.0],
    );
}

#[test]
fn llama_cpp_top_k_vectors() {
    let k = |top_k| SamplerConfig { top_k, ..neutral() };
    check_stage(k(1), &P4, &[1.0]);
    check_stage(k(3), &P4, &[0.44444, 0.33333, 0.22222]);
    check_stage(k(4), &P4, &[0.4, 0.3, 0.2, 0.1]);
    check_stage(k(0), &P4, &[0.1, 0.2, 0.3, 0.4]);
}

#[test]
fn llama_cpp_top_p_vectors() {
    let p = |top_p| SamplerConfig { top_p, ..neutral() };
    // top_p = 0 is outside the validated range; run the stage directly.
    check_raw(&P4, |c| c.top_p(0.0), &[1.0]);
    check_stage(p(0.7), &P4, &[0.571429, 0.428571]);
    check_stage(p(0.8), &P4, &[0.44444, 0.33333, 0.22222]);
    check_stage(p(1.0), &P4, &[0.1, 0.2, 0.3, 0.4]);
}

#[test]
fn llama_cpp_min_p_vectors() {
    let m = |min_p| SamplerConfig { min_p, ..neutral() };
    let all = [0.1 / 1.0, 0.2 / 1.0, 0.3 / 1.0, 0.4 / 1.0];
    let three = [0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9];
    let two = [0.3 / 0.7, 0.4 / 0.7];
    check_stage(m(0.00), &P4, &all);
    check_stage(m(0.24), &P4, &all);
    check_stage(m(0.26), &P4, &three);
    check_stage(m(0.49), &P4, &three);
    check_stage(m(0.51), &P4, &two);
    check_stage(m(0.74), &P4, &two);
    check_stage(m(0.76), &P4, &[0.4 / 0.4]);
    check_stage(m(1.00), &P4, &[0.4 / 0.4]);
    // min_p = 1.05 is outside the validated range; run the stage directly.
    check_raw(&P4, |c| c.min_p(1.05), &[0.4 / 0.4]);
}

/// (history, expected probabilities, repeat, frequency, presence).
type PenaltyCase = (&'static [u32], [f32; 5], f32, f32, f32);

#[test]
fn llama_cpp_penalty_vectors() {
    // (history, expected, repeat, frequency, presence); the window covers
    // the whole history as in llama.cpp's test_penalties.
    let cases: [PenaltyCase; 6] = [
        (&[0], [0.0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        (&[0, 1, 2], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
        (&[0, 1, 2, 0, 0], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
        (
            &[0],
            [0.000011, 0.249997, 0.249997, 0.249997, 0.249997],
            1.0,
            5.0,
            5.0,
        ),
        (
            &[0, 1, 2],
            [0.000023, 0.000023, 0.000023, 0.499966, 0.499966],
            1.0,
            5.0,
            5.0,
        ),
        (
            &[0, 1, 2, 0, 0],
            [0.000000, 0.000023, 0.000023, 0.499977, 0.499977],
            1.0,
            5.0,
            5.0,
        ),
    ];
    let probs = [0.2f32; 5];
    for (history, expected, repeat, freq, presence) in cases {
        let config = SamplerConfig {
            repeat_penalty: repeat,
            frequency_penalty: freq,
            presence_penalty: presence,
            penalty_last_n: history.len(),
            ..neutral()
        };
        let got = probabilities_after(&config, &logits_of(&probs), history).unwrap();
        assert_probs(&got, &expected);
    }
}

/// Port of llama.cpp's `test_sampler_queue`: logits `ln(i)` over
/// `n_vocab` tokens (token 0 is `-inf`), the stages applied in the given
/// order, and after each stage the expected size and, when sorted, the
/// first and last token ids, computed with llama.cpp's formulas.
fn sampler_queue(n_vocab: usize, seq: &str, top_k: usize, top_p: f32, min_p: f32) {
    let logits: Vec<f32> = (0..n_vocab).map(|i| (i as f32).ln()).collect();
    let mut c = candidates_of(&logits);
    let n = n_vocab as i64;
    let mut min_token_id: i64 = 0;
    let max_token_id: i64 = n - 1;
    for s in seq.chars() {
        match s {
            'k' => c.top_k(top_k),
            'p' => c.top_p(top_p),
            'm' => c.min_p(min_p),
            _ => unreachable!(),
        }
        c.dist(1.0, 0.0);
        let size = c.data.len() as i64;
        let ctx = format!("queue {seq} stage {s} n_vocab={n_vocab} k={top_k} p={top_p} m={min_p}");
        match s {
            'k' => {
                let expected = size.min(top_k as i64);
                min_token_id = min_token_id.max(n - top_k as i64);
                assert_eq!(size, expected, "{ctx}");
                assert_eq!(i64::from(c.data[0].id), max_token_id, "{ctx}");
                assert_eq!(
                    i64::from(c.data[expected as usize - 1].id),
                    min_token_id,
                    "{ctx}"
                );
            }
            'p' => {
                let divisor = n * (n - 1) / 2 - min_token_id * (min_token_id - 1) / 2;
                let target = (top_p * divisor as f32).ceil() as i64;
                min_token_id = n;
                let mut expected = 0;
                let mut cumsum = 0;
                loop {
                    min_token_id -= 1;
                    expected += 1;
                    cumsum += min_token_id;
                    if cumsum >= target {
                        break;
                    }
                }
                if min_token_id == 1 {
                    min_token_id -= 1;
                    expected += 1;
                }
                assert_eq!(size, expected, "{ctx}");
                if c.sorted {
                    assert_eq!(i64::from(c.data[0].id), max_token_id, "{ctx}");
                    assert_eq!(
                        i64::from(c.data[expected as usize - 1].id),
                        min_token_id,
                        "{ctx}"
                    );
                }
            }
            'm' => {
                let mut expected = ((1.0f32 - min_p) * n_vocab as f32).ceil() as i64;
                expected = expected.max(1).min(size);
                min_token_id = (min_p * n_vocab as f32).floor() as i64;
                min_token_id = min_token_id.max(1).max(n - size).min(n - 1);
                assert_eq!(size, expected, "{ctx}");
                if c.sorted {
                    assert_eq!(i64::from(c.data[0].id), max_token_id, "{ctx}");
                    assert_eq!(
                        i64::from(c.data[expected as usize - 1].id),
                        min_token_id,
                        "{ctx}"
                    );
                }
            }
            _ => unreachable!(),
        }
    }
}

#[test]
fn llama_cpp_sampler_queue_vectors() {
    sampler_queue(10000, "k", 10000, 1.0, 1.0);
    sampler_queue(10000, "k", 1, 1.0, 1.0);
    sampler_queue(10000, "p", 10000, 1.0, 1.0);
    sampler_queue(10000, "p", 10000, 0.0, 1.0);
    sampler_queue(10000, "m", 10000, 1.0, 1.0);
    sampler_queue(10000, "m", 10000, 1.0, 1e-12);

    sampler_queue(10000, "k", 100, 1.0000, 1.0);
    sampler_queue(10000, "p", 10000, 0.0003, 1.0);
    sampler_queue(10000, "p", 10000, 0.8000, 1.0);
    sampler_queue(10000, "m", 10000, 1.0000, 9997.9 / 9999.0);
    sampler_queue(10000, "m", 10000, 1.0000, 0.1);

    sampler_queue(10000, "kp", 100, 0.8, 0.1);
    sampler_queue(10000, "km", 100, 0.8, 0.1);
    sampler_queue(10000, "pk", 100, 0.8, 0.1);
    sampler_queue(10000, "pm", 100, 0.8, 0.1);
    sampler_queue(10000, "mk", 100, 0.8, 0.1);
    sampler_queue(10000, "mp", 100, 0.8, 9997.9 / 9999.0);
    sampler_queue(10000, "mp", 100, 0.8, 0.1);

    sampler_queue(10000, "kpm", 100, 0.8, 0.1);
    sampler_queue(10000, "kmp", 100, 0.8, 0.1);
    sampler_queue(10000, "pkm", 100, 0.8, 0.1);
    sampler_queue(10000, "pmk", 100, 0.8, 0.1);
    sampler_queue(10000, "mkp", 100, 0.8, 0.1);
    sampler_queue(10000, "mpk", 100, 0.8, 0.1);
}

// ---- Tessera-specific behaviour ----------------------------------------

/// Deterministic pseudo-random logits in `[-scale, scale)`.
fn random_logits(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) as f32) * scale)
        .collect()
}

#[test]
fn defaults_match_llama_cpp_except_temperature() {
    let c = SamplerConfig::default();
    assert_eq!(c.temperature, 0.0);
    assert_eq!(c.top_k, 40);
    assert_eq!(c.top_p, 0.95);
    assert_eq!(c.min_p, 0.05);
    assert_eq!(c.repeat_penalty, 1.0);
    assert_eq!(c.frequency_penalty, 0.0);
    assert_eq!(c.presence_penalty, 0.0);
    assert_eq!(c.penalty_last_n, 64);
    assert_eq!(c.seed, 0);
    assert!(c.validate().is_ok());
    assert!(SamplerConfig::greedy().validate().is_ok());
}

#[test]
fn greedy_is_argmax() {
    let logits = random_logits(5000, 7, 4.0);
    let expected = logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv { (i, v) } else { (bi, bv) }
        })
        .0 as Token;
    for config in [SamplerConfig::greedy(), SamplerConfig::default()] {
        let mut s = Sampler::new(config).unwrap();
        for _ in 0..3 {
            assert_eq!(s.sample(&logits).unwrap(), expected);
        }
    }
}

#[test]
fn greedy_ties_go_to_lowest_index() {
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(s.sample(&[0.5, 1.0, 1.0, -3.0, 1.0]).unwrap(), 1);
    assert_eq!(s.sample(&[0.0, -0.0]).unwrap(), 0);
    assert_eq!(s.sample(&[-0.0, 0.0]).unwrap(), 0);
    // The probabilities view agrees, also after sorting stages.
    let cfg = SamplerConfig {
        top_k: 2,
        ..SamplerConfig::default()
    };
    let probs = probabilities_after(&cfg, &[0.5, 1.0, 1.0], &[]).unwrap();
    assert_eq!(probs, vec![(1, 1.0), (2, 0.0)]);
}

#[test]
fn greedy_uses_penalized_logits() {
    let config = SamplerConfig {
        repeat_penalty: 2.0,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(config).unwrap();
    let logits = [1.0, 0.9, -5.0];
    assert_eq!(s.sample(&logits).unwrap(), 0);
    s.accept(0);
    // 1.0 / 2 = 0.5 < 0.9
    assert_eq!(s.sample(&logits).unwrap(), 1);
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative() {
    let config = SamplerConfig {
        repeat_penalty: 2.0,
        ..neutral()
    };
    let logits = [-1.0f32, 1.0, 0.5];
    let got = probabilities_after(&config, &logits, &[0, 1]).unwrap();
    // Penalized logits: [-2.0, 0.5, 0.5].
    let w = [(-2.0f64).exp(), 0.5f64.exp(), 0.5f64.exp()];
    let sum: f64 = w.iter().sum();
    let expected: Vec<f32> = w.iter().map(|x| (x / sum) as f32).collect();
    assert_probs(&got, &expected);
}

#[test]
fn frequency_counts_and_presence_once() {
    let config = SamplerConfig {
        frequency_penalty: 0.1,
        presence_penalty: 0.5,
        ..neutral()
    };
    let logits = [0.0f32, 0.0, 0.5];
    let got = probabilities_after(&config, &logits, &[2, 2, 2, 1]).unwrap();
    // token 2: 0.5 - 3 * 0.1 - 0.5 = -0.3; token 1: 0 - 0.1 - 0.5 = -0.6.
    let w = [0.0f64.exp(), (-0.6f64).exp(), (-0.3f64).exp()];
    let sum: f64 = w.iter().sum();
    let expected: Vec<f32> = w.iter().map(|x| (x / sum) as f32).collect();
    assert_probs(&got, &expected);
}

#[test]
fn penalty_window_evicts_oldest_and_ignores_out_of_vocab() {
    let config = SamplerConfig {
        repeat_penalty: 1000.0,
        penalty_last_n: 2,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(config).unwrap();
    let logits = [3.0, 2.0, 1.0];
    s.accept(0);
    assert_eq!(s.sample(&logits).unwrap(), 1);
    s.accept(7_000_000); // outside the vocabulary: ignored
    s.accept(1); // evicts token 0
    assert_eq!(s.sample(&logits).unwrap(), 0);
    s.reset();
    s.accept(0);
    s.accept(1);
    assert_eq!(s.sample(&logits).unwrap(), 2);

    let off = SamplerConfig {
        penalty_last_n: 0,
        ..config_with_penalty()
    };
    let mut s = Sampler::new(off).unwrap();
    s.accept(0);
    assert_eq!(s.sample(&logits).unwrap(), 0);
}

fn config_with_penalty() -> SamplerConfig {
    SamplerConfig {
        repeat_penalty: 1000.0,
        ..SamplerConfig::greedy()
    }
}

fn draws(config: &SamplerConfig, logits: &[f32], n: usize) -> Vec<u32> {
    let mut s = Sampler::new(config.clone()).unwrap();
    (0..n).map(|_| s.sample(logits).unwrap() as u32).collect()
}

#[test]
fn same_seed_same_sequence_different_seeds_differ() {
    let logits = random_logits(1000, 3, 1.0);
    let base = SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        ..SamplerConfig::default()
    };
    let a = draws(
        &SamplerConfig {
            seed: 42,
            ..base.clone()
        },
        &logits,
        50,
    );
    let b = draws(
        &SamplerConfig {
            seed: 42,
            ..base.clone()
        },
        &logits,
        50,
    );
    let c = draws(
        &SamplerConfig {
            seed: 43,
            ..base.clone()
        },
        &logits,
        50,
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Not stuck on one token.
    assert!(a.iter().any(|&t| t != a[0]));
}

#[test]
fn reset_reseeds_and_clears_history() {
    let logits = random_logits(500, 11, 1.0);
    let config = SamplerConfig {
        temperature: 0.9,
        seed: 5,
        repeat_penalty: 1.3,
        ..SamplerConfig::default()
    };
    let mut s = Sampler::new(config.clone()).unwrap();
    let run = |s: &mut Sampler| {
        (0..30)
            .map(|_| {
                let t = s.sample(&logits).unwrap();
                s.accept(t);
                t
            })
            .collect::<Vec<_>>()
    };
    let first = run(&mut s);
    s.reset();
    let second = run(&mut s);
    assert_eq!(first, second);
    let mut fresh = Sampler::new(config).unwrap();
    assert_eq!(run(&mut fresh), first);
}

#[test]
fn validate_rejects_each_bad_parameter() {
    let ok = SamplerConfig::default();
    let cases: Vec<(&str, SamplerConfig)> = vec![
        (
            "temperature",
            SamplerConfig {
                temperature: -0.1,
                ..ok.clone()
            },
        ),
        (
            "temperature",
            SamplerConfig {
                temperature: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "temperature",
            SamplerConfig {
                temperature: f32::INFINITY,
                ..ok.clone()
            },
        ),
        (
            "top_p",
            SamplerConfig {
                top_p: 0.0,
                ..ok.clone()
            },
        ),
        (
            "top_p",
            SamplerConfig {
                top_p: -0.5,
                ..ok.clone()
            },
        ),
        (
            "top_p",
            SamplerConfig {
                top_p: 1.01,
                ..ok.clone()
            },
        ),
        (
            "top_p",
            SamplerConfig {
                top_p: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "min_p",
            SamplerConfig {
                min_p: -0.01,
                ..ok.clone()
            },
        ),
        (
            "min_p",
            SamplerConfig {
                min_p: 1.01,
                ..ok.clone()
            },
        ),
        (
            "min_p",
            SamplerConfig {
                min_p: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: 0.0,
                ..ok.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: -1.0,
                ..ok.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: f32::INFINITY,
                ..ok.clone()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "frequency_penalty",
            SamplerConfig {
                frequency_penalty: f32::NAN,
                ..ok.clone()
            },
        ),
        (
            "frequency_penalty",
            SamplerConfig {
                frequency_penalty: f32::NEG_INFINITY,
                ..ok.clone()
            },
        ),
        (
            "presence_penalty",
            SamplerConfig {
                presence_penalty: f32::INFINITY,
                ..ok.clone()
            },
        ),
        (
            "presence_penalty",
            SamplerConfig {
                presence_penalty: f32::NAN,
                ..ok.clone()
            },
        ),
    ];
    for (name, config) in cases {
        let err = config.validate().unwrap_err();
        match &err {
            SamplerError::InvalidParameter { parameter, .. } => assert_eq!(*parameter, name),
            other => panic!("unexpected error {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(name), "{msg}");
        assert!(msg.contains("expected"), "{msg}");
        assert!(Sampler::new(config).is_err());
    }
    // Boundaries that are accepted.
    for config in [
        SamplerConfig {
            top_p: 1.0,
            min_p: 0.0,
            ..ok.clone()
        },
        SamplerConfig {
            min_p: 1.0,
            ..ok.clone()
        },
        SamplerConfig {
            frequency_penalty: -2.0,
            presence_penalty: -2.0,
            ..ok.clone()
        },
        SamplerConfig {
            repeat_penalty: 0.5,
            ..ok.clone()
        },
    ] {
        assert!(config.validate().is_ok(), "{config:?}");
    }
}

#[test]
fn bad_logits_are_reported() {
    let mut s = Sampler::new(SamplerConfig::default()).unwrap();
    let err = s.sample(&[0.0, 1.0, f32::NAN, f32::INFINITY]).unwrap_err();
    assert!(matches!(err, SamplerError::NonFiniteLogit { index: 2, .. }));
    assert!(err.to_string().contains("index 2"), "{err}");
    let err = s.sample(&[f32::NEG_INFINITY]).unwrap_err();
    assert!(matches!(err, SamplerError::NonFiniteLogit { index: 0, .. }));
    assert_eq!(s.sample(&[]).unwrap_err(), SamplerError::EmptyLogits);
    assert!(s.probabilities(&[1.0, f32::NAN]).is_err());
    // The sampler still works afterwards.
    assert_eq!(s.sample(&[0.0, 1.0]).unwrap(), 1);
    let e: &dyn std::error::Error = &SamplerError::EmptyLogits;
    assert!(!e.to_string().is_empty());
}

#[test]
fn large_vocab_draw() {
    let n = 200_000;
    let mut logits = random_logits(n, 99, 8.0);
    logits[123_456] = 30.0;
    let mut greedy = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(greedy.sample(&logits).unwrap(), 123_456);
    logits[123_456] = 8.0;

    let configs = [
        SamplerConfig {
            temperature: 0.8,
            ..SamplerConfig::default()
        },
        // No top-k: exercises top-p's partial sort on an unsorted list.
        SamplerConfig {
            temperature: 0.8,
            top_k: 0,
            ..SamplerConfig::default()
        },
        // Everything off: a draw over the full vocabulary.
        SamplerConfig {
            temperature: 1.0,
            ..neutral()
        },
    ];
    for config in configs {
        let mut s = Sampler::new(config.clone()).unwrap();
        let start = std::time::Instant::now();
        for _ in 0..20 {
            let t = s.sample(&logits).unwrap();
            assert!((t as usize) < n);
            s.accept(t);
        }
        eprintln!(
            "200k vocab, top_k={} top_p={}: {:?} per token",
            config.top_k,
            config.top_p,
            start.elapsed() / 20
        );
        let probs = s.probabilities(&logits).unwrap();
        let total: f64 = probs.iter().map(|&(_, p)| f64::from(p)).sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
    }
}

#[test]
fn draws_never_leave_top_k() {
    // 97 tokens at logit 0 carry most of the mass; top-3 must drop them.
    let mut logits = vec![0.0f32; 100];
    logits[97] = 0.5;
    logits[98] = 0.6;
    logits[99] = 0.7;
    let config = SamplerConfig {
        temperature: 1.0,
        top_k: 3,
        seed: 1234,
        ..neutral()
    };
    let mut s = Sampler::new(config).unwrap();
    let mut seen = [0usize; 100];
    for _ in 0..20_000 {
        seen[s.sample(&logits).unwrap() as usize] += 1;
    }
    assert!(seen[..97].iter().all(|&n| n == 0));
    assert!(seen[97..].iter().all(|&n| n > 0));
}

#[test]
fn draw_frequencies_follow_probabilities() {
    let config = SamplerConfig {
        seed: 77,
        ..neutral()
    };
    let logits = logits_of(&P4);
    let mut s = Sampler::new(config).unwrap();
    let n = 200_000;
    let mut seen = [0usize; 4];
    for _ in 0..n {
        seen[s.sample(&logits).unwrap() as usize] += 1;
    }
    for (i, &p) in P4.iter().enumerate() {
        let f = seen[i] as f32 / n as f32;
        assert!((f - p).abs() < 0.01, "token {i}: {f} vs {p}");
    }
}

#[test]
fn extreme_values_stay_finite() {
    // A tiny repeat penalty pushes a penalized logit past f32::MAX and a
    // huge frequency penalty below -f32::MAX; both are clamped.
    let config = SamplerConfig {
        temperature: 1e-30,
        repeat_penalty: 1e-30,
        frequency_penalty: 3e38,
        ..neutral()
    };
    let logits = [1e10f32, -1e10, 5.0, f32::MAX];
    let got = probabilities_after(&config, &logits, &[0, 1]).unwrap();
    assert!(got.iter().all(|&(_, p)| p.is_finite()), "{got:?}");
    let total: f32 = got.iter().map(|&(_, p)| p).sum();
    assert!((total - 1.0).abs() < TOL, "{got:?}");
    let mut s = Sampler::new(config).unwrap();
    s.accept(0);
    s.accept(1);
    for _ in 0..10 {
        assert!(s.sample(&logits).unwrap() < 4);
    }
}

#[test]
fn single_pass_top_k_matches_select_then_sort() {
    // Few distinct values, so ties dominate and tie-breaking is checked.
    let n = 20_000;
    let logits: Vec<f32> = random_logits(n, 5, 4.0)
        .into_iter()
        .map(|l| l.round())
        .collect();
    // Also an increasing row, where every logit beats the threshold.
    let rising: Vec<f32> = (0..n).map(|i| i as f32 * 1e-3).collect();
    for row in [&logits, &rising] {
        for k in [1, 2, 40, 255, 256, 257, 1000, n - 1] {
            let mut fast = Candidates::default();
            fast.fill_top_k(row, k);
            let mut slow = Candidates::default();
            slow.fill_all(row);
            slow.top_k(k);
            assert_eq!(fast.data, slow.data, "k = {k}");
            assert!(fast.sorted && slow.sorted);
        }
    }
}

/// Straightforward reference for top-k -> top-p -> min-p -> softmax,
/// sorting the whole vocabulary.
fn reference(config: &SamplerConfig, logits: &[f32]) -> Vec<(u32, f32)> {
    let mut c: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if config.top_k > 0 {
        c.truncate(config.top_k);
    }
    if config.top_p < 1.0 {
        let w: Vec<f64> = c.iter().map(|x| f64::from(x.1 - c[0].1).exp()).collect();
        let sum: f64 = w.iter().sum();
        let mut cum = 0.0;
        let mut last = c.len();
        for (i, wi) in w.iter().enumerate() {
            cum += wi / sum;
            if cum >= f64::from(config.top_p) {
                last = i + 1;
                break;
            }
        }
        c.truncate(last);
    }
    if config.min_p > 0.0 {
        let min = c[0].1 + config.min_p.ln();
        c.retain(|x| x.1 >= min);
    }
    let t = f64::from(config.temperature);
    let w: Vec<f64> = c
        .iter()
        .map(|x| (f64::from(x.1 - c[0].1) / t).exp())
        .collect();
    let sum: f64 = w.iter().sum();
    c.iter()
        .zip(&w)
        .map(|(x, wi)| (x.0, (wi / sum) as f32))
        .collect()
}

#[test]
fn chain_matches_full_sort_reference() {
    // Flat logits make top-p need far more than the 256 pre-sorted
    // candidates; peaked logits stop inside them.
    for (scale, top_p) in [(0.5f32, 0.9f32), (12.0, 0.9), (3.0, 0.5)] {
        let logits = random_logits(5000, 21, scale);
        for top_k in [0usize, 40, 3000] {
            for min_p in [0.0f32, 0.05] {
                let config = SamplerConfig {
                    temperature: 0.7,
                    top_k,
                    top_p,
                    min_p,
                    ..neutral()
                };
                let got = probabilities_after(&config, &logits, &[]).unwrap();
                let want = reference(&config, &logits);
                let mut got_ids: Vec<u32> = got.iter().map(|x| x.0).collect();
                let mut want_ids: Vec<u32> = want.iter().map(|x| x.0).collect();
                got_ids.sort_unstable();
                want_ids.sort_unstable();
                assert_eq!(got_ids, want_ids, "{config:?}");
                let want_p: HashMap<u32, f32> = want.into_iter().collect();
                for (id, p) in got {
                    assert!((p - want_p[&id]).abs() < TOL, "{config:?} id {id}");
                }
            }
        }
    }
}
