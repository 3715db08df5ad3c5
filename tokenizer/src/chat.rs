//! Chat templates: a GGUF file's `tokenizer.chat_template` applied to a conversation.
//!
//! Two renderers, as in llama.cpp:
//! - [`ChatTemplate::render`] does what `llama_chat_apply_template` does: a template llama.cpp
//!   recognises as ChatML (it contains `<|im_start|>`, and neither Phi-4's `<|im_sep|>` nor
//!   SmolVLM's `<end_of_utterance>`) is rendered by its built-in ChatML formatter — so a
//!   template's own default system prompt (SmolLM2's) is not injected; any other template is
//!   rendered as Jinja.
//! - [`ChatTemplate::render_jinja`] always renders the Jinja source (`minijinja`, with HF's
//!   `trim_blocks` / `lstrip_blocks`, loop controls, `raise_exception` and Python string
//!   methods), as llama.cpp's `--jinja` does. `bos_token` / `eos_token` are the vocabulary's
//!   texts; a leading `bos_token` is dropped from the result when the vocabulary adds BOS itself
//!   (as llama.cpp's Jinja path does).

mod bounded;

use super::Tokenizer;
use tessera_gguf::Metadata;

/// GGUF key of the chat template.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// Why a conversation could not be rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The file has no `tokenizer.chat_template`.
    #[error("{file}: no chat template ({KEY_CHAT_TEMPLATE} is absent)")]
    NoTemplate {
        /// The file.
        file: String,
    },
    /// The template is not a string, does not parse, or fails while rendering.
    #[error("{file}: chat template: {reason}")]
    Render {
        /// The file.
        file: String,
        /// The parse or render error.
        reason: String,
    },
}

/// One turn of a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChatMessage<'a> {
    /// `system`, `user` or `assistant`.
    pub role: &'a str,
    /// The text.
    pub content: &'a str,
}

/// A file's chat template with the special-token texts it may use.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    file: String,
    source: String,
    bos: String,
    eos: String,
    /// The vocabulary adds BOS itself: a leading `bos_token` is dropped.
    strip_bos: bool,
}

impl ChatTemplate {
    /// The template of a file's metadata; `tok` (the file's tokenizer) gives `bos_token` and
    /// `eos_token`.
    ///
    /// # Errors
    /// [`ChatError::NoTemplate`] when the key is absent, [`ChatError::Render`] when it is not a
    /// string.
    pub fn from_metadata(md: &Metadata, tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        let file = md.source().to_string();
        if !md.contains(KEY_CHAT_TEMPLATE) {
            return Err(ChatError::NoTemplate { file });
        }
        let source = md
            .get_str(KEY_CHAT_TEMPLATE)
            .map_err(|e| ChatError::Render {
                file: file.clone(),
                reason: e.to_string(),
            })?
            .to_string();
        let text = |t: Option<i32>| {
            t.and_then(|t| tok.token_text(t))
                .unwrap_or_default()
                .to_string()
        };
        Ok(ChatTemplate {
            file,
            source,
            bos: text(tok.bos()),
            eos: text(tok.eos()),
            strip_bos: tok.adds_bos(),
        })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether llama.cpp renders this template with its built-in ChatML formatter.
    pub fn is_builtin_chatml(&self) -> bool {
        let has = |s: &str| self.source.contains(s);
        has("<|im_start|>") && !has("<|im_sep|>") && !has("<end_of_utterance>")
    }

    /// `messages` as `llama_chat_apply_template` renders them (see the module doc); with
    /// `add_generation_prompt`, the opening of the assistant's turn follows.
    ///
    /// # Errors
    /// As [`ChatTemplate::render_jinja`].
    pub fn render(
        &self,
        messages: &[ChatMessage<'_>],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        if !self.is_builtin_chatml() {
            return self.render_jinja(messages, add_generation_prompt);
        }
        let mut out = String::new();
        for m in messages {
            out += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
        }
        if add_generation_prompt {
            out += "<|im_start|>assistant\n";
        }
        Ok(out)
    }

    /// `messages` rendered by the Jinja template itself.
    ///
    /// # Errors
    /// [`ChatError::Render`]: the template does not parse, raises, or fails while rendering.
    pub fn render_jinja(
        &self,
        messages: &[ChatMessage<'_>],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let err = |e: minijinja::Error| ChatError::Render {
            file: self.file.clone(),
            reason: format!("{e:#}"),
        };
        let content: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        let budget = RenderBudget::for_input(self.source.len() + content, messages.len());
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(budget.fuel));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, _> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("raise_exception: {msg}"),
            ))
        });
        bounded::guard_sequence_filters(&mut env);
        bounded::guard_output(&mut env);
        env.add_template("chat", &self.source).map_err(err)?;
        let msgs: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| minijinja::context! { role => m.role, content => m.content })
            .collect();
        let ctx = minijinja::context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.as_str(),
            eos_token => self.eos.as_str(),
        };
        let mut sink = bounded::CappedWriter::new(budget.max_bytes);
        let rendered = env
            .get_template("chat")
            .and_then(|t| t.render_captured_to(ctx, &mut sink).map(|_| ()));
        if sink.overflowed() {
            return Err(ChatError::Render {
                file: self.file.clone(),
                reason: format!(
                    "the rendered prompt exceeds {} bytes (the limit for this template and conversation)",
                    budget.max_bytes
                ),
            });
        }
        rendered.map_err(err)?;
        let out = sink.into_string();
        Ok(match out.strip_prefix(self.bos.as_str()) {
            Some(rest) if self.strip_bos && !self.bos.is_empty() => rest.to_string(),
            _ => out,
        })
    }
}

/// Limits on one render: a hostile template must fail promptly, not render for minutes or
/// fill memory (`{{ (1,2) * 10**9 }}` is one instruction producing a billion items).
#[derive(Clone, Copy, Debug)]
struct RenderBudget {
    /// minijinja instructions (loop iterations, calls, emits).
    fuel: u64,
    /// Bytes of rendered text.
    max_bytes: usize,
}

impl RenderBudget {
    /// Real chat templates spend well under 100k instructions and emit the conversation plus a
    /// few KiB of markup; these bounds leave one to two orders of magnitude above that.
    fn for_input(input_bytes: usize, n_messages: usize) -> RenderBudget {
        RenderBudget {
            fuel: 2_000_000 + 20_000 * n_messages as u64,
            max_bytes: (1 << 20) + 8 * input_bytes,
        }
    }
}

/// A one-turn conversation: `user`, after a `system` turn when given.
pub fn user_turn<'a>(system: Option<&'a str>, user: &'a str) -> Vec<ChatMessage<'a>> {
    let mut msgs = Vec::with_capacity(2);
    if let Some(s) = system {
        msgs.push(ChatMessage {
            role: "system",
            content: s,
        });
    }
    msgs.push(ChatMessage {
        role: "user",
        content: user,
    });
    msgs
}

#[cfg(test)]
mod tests;
