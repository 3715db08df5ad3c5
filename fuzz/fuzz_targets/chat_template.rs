//! The chat-template renderer on arbitrary templates (what `tokenizer.chat_template` of a
//! hostile GGUF file holds) and conversations: both renderers return text or a typed
//! [`ChatError`](tessera_model::tokenizer::ChatError), never panic, and finish promptly.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tessera::gguf::Metadata;
use tessera_model::Tokenizer;
use tessera_model::tokenizer::{
    ChatMessage, ChatTemplate, KEY_CHAT_TEMPLATE, KEY_MODEL, KEY_SCORES, KEY_TOKEN_TYPE, KEY_TOKENS,
};

#[derive(Arbitrary, Debug)]
struct Input {
    template: String,
    messages: Vec<(u8, String)>,
    add_generation_prompt: bool,
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let (texts, scores, types) = tessera_model::synthetic_vocab(400);
        let mut md = Metadata::new("fuzz-vocab");
        md.set(KEY_MODEL, "llama");
        md.set(KEY_TOKENS, texts);
        md.set(KEY_SCORES, scores);
        md.set(KEY_TOKEN_TYPE, types);
        Tokenizer::from_metadata(&md).expect("the synthetic vocabulary loads")
    })
}

fuzz_target!(|inp: Input| {
    let mut md = Metadata::new("fuzz.gguf");
    md.set(KEY_CHAT_TEMPLATE, inp.template.as_str());
    let tmpl = ChatTemplate::from_metadata(&md, tokenizer()).expect("a string template");
    let roles = ["system", "user", "assistant", "tool", ""];
    let msgs: Vec<ChatMessage<'_>> = inp
        .messages
        .iter()
        .map(|(r, c)| ChatMessage {
            role: roles[usize::from(*r) % roles.len()],
            content: c,
        })
        .collect();
    let _ = tmpl.render(&msgs, inp.add_generation_prompt);
    let _ = tmpl.render_jinja(&msgs, inp.add_generation_prompt);
});
