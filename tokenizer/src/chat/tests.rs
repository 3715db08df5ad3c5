//! Bounds on hostile templates (fuzz findings) and that real templates still render.

use super::bounded::MAX_FILTER_ITEMS;
use super::*;
use crate::{KEY_MODEL, KEY_SCORES, KEY_TOKEN_TYPE, KEY_TOKENS};
use std::time::{Duration, Instant};

fn template(source: &str) -> ChatTemplate {
    let (texts, scores, types) = crate::synthetic_vocab(300);
    let mut md = Metadata::new("hostile.gguf");
    md.set(KEY_MODEL, "llama");
    md.set(KEY_TOKENS, texts);
    md.set(KEY_SCORES, scores);
    md.set(KEY_TOKEN_TYPE, types);
    let tok = Tokenizer::from_metadata(&md).unwrap();
    md.set(KEY_CHAT_TEMPLATE, source);
    ChatTemplate::from_metadata(&md, &tok).unwrap()
}

/// Renders and returns the error text, failing the test when it renders or takes long. The time
/// bound is loose (a debug build on a loaded 2-core machine); an unbounded render takes minutes.
fn refused(source: &str) -> String {
    let t = Instant::now();
    let out = template(source).render_jinja(&user_turn(None, "hi"), true);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(20), "{source:?} took {took:?}");
    match out {
        Ok(text) => panic!("{source:?} rendered {} bytes", text.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn fuzz_finding_repeated_tuple_is_cut_at_the_output_limit() {
    // fuzz/seeds/chat_template/timeout-abdd2641: a 194-million-item lazy sequence, emitted.
    let src = "{##}= G\n}}={({{73\n*(888,87,872)\n*(888872)\n\n\n}}";
    let e = refused(src);
    assert!(
        e.contains("hostile.gguf") && e.contains("output on a value"),
        "{e}"
    );
    // Nested inside a small sequence, and printed item by item past the output limit.
    let e = refused("{{ [1, [(1,2) * 100000000]] }}");
    assert!(e.contains("output on a value"), "{e}");
    let e = refused("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
    assert!(e.contains("exceeds"), "{e}");
}

#[test]
fn long_loops_run_out_of_fuel() {
    let e = refused("{% for i in (1,2) * 100000000 %}{% endfor %}");
    assert!(e.contains("fuel"), "{e}");
}

#[test]
fn materialising_filters_refuse_huge_sequences() {
    for f in [
        "list", "join", "sort", "unique", "reverse", "sum", "max", "tojson", "last",
    ] {
        let e = refused(&format!("{{{{ ((1,2) * 100000000) | {f} }}}}"));
        assert!(
            e.contains(&format!(
                "filter `{f}` on a value of more than {MAX_FILTER_ITEMS}"
            )),
            "{f}: {e}"
        );
    }
}

#[test]
fn guarded_filters_keep_their_arguments_and_results() {
    let t = template(
        "{{ [3,1,2] | sort | join(', ') }}|{{ [3,1,2] | sort(reverse=true) | list }}|\
         {{ messages | map(attribute='role') | join('+') }}|{{ {'b':1,'a':2} | dictsort }}|\
         {{ [1,2,2] | unique | list | length }}|{{ ((1,2) * 3) | list }}",
    );
    let msgs = user_turn(Some("sys"), "hi");
    assert_eq!(
        t.render_jinja(&msgs, false).unwrap(),
        "1, 2, 3|[3, 2, 1]|system+user|[[\"a\", 2], [\"b\", 1]]|2|[1, 2, 1, 2, 1, 2]"
    );
}

#[test]
fn a_large_real_conversation_still_renders() {
    // 2,000 turns of 1 KiB through a ChatML-like Jinja template: well inside both bounds.
    let t = template(
        "{% for m in messages %}<|turn|>{{ m.role }}\n{{ m.content | trim }}<|end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|turn|>assistant\n{% endif %}",
    );
    let text = "x".repeat(1024);
    let msgs: Vec<ChatMessage<'_>> = (0..2000)
        .map(|i| ChatMessage {
            role: if i % 2 == 0 { "user" } else { "assistant" },
            content: &text,
        })
        .collect();
    let out = t.render_jinja(&msgs, true).unwrap();
    assert_eq!(out.matches("<|end|>").count(), 2000);
}
