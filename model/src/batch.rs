//! [`Batch`]: tokens of several sequences evaluated in one step, and the logits it returns.

/// A sequence's id: `0..` [`crate::SessionBuilder::max_sequences`].
pub type SeqId = u32;

/// One token of a [`Batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchToken {
    /// The token id.
    pub token: i32,
    /// Its position in its sequence: the sequence's next one (positions follow each other).
    pub pos: usize,
    /// The sequence it extends.
    pub seq: SeqId,
    /// Whether the step returns this token's logits.
    pub logits: bool,
}

/// Tokens of any number of sequences for one [`crate::Session::decode`] step, as llama.cpp's
/// `llama_batch`: prompts of new sequences and the next token of running ones may share a step.
///
/// ```
/// use tessera_model::Batch;
/// let mut batch = Batch::new();
/// batch.add_sequence(0, 0, &[1, 2, 3]); // a prompt: logits for its last token only
/// batch.add(7, 12, 1, true); // the 13th token of sequence 1
/// assert_eq!((batch.len(), batch.n_logits()), (4, 2));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    tokens: Vec<BatchToken>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds `token` at `pos` of sequence `seq`, with its logits if `logits`.
    pub fn add(&mut self, token: i32, pos: usize, seq: SeqId, logits: bool) -> &mut Batch {
        self.tokens.push(BatchToken {
            token,
            pos,
            seq,
            logits,
        });
        self
    }

    /// Adds `tokens` to sequence `seq` from position `pos` on, asking for the last one's logits
    /// (a prompt, or the next token of a running sequence).
    pub fn add_sequence(&mut self, seq: SeqId, pos: usize, tokens: &[i32]) -> &mut Batch {
        let n = tokens.len();
        for (i, &t) in tokens.iter().enumerate() {
            self.add(t, pos + i, seq, i + 1 == n);
        }
        self
    }

    /// Empties the batch, keeping its allocation.
    pub fn clear(&mut self) {
        self.tokens.clear();
    }

    /// Tokens in the batch.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch holds no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens, in order.
    pub fn tokens(&self) -> &[BatchToken] {
        &self.tokens
    }

    /// Tokens whose logits the step returns.
    pub fn n_logits(&self) -> usize {
        self.tokens.iter().filter(|t| t.logits).count()
    }
}

/// The logits a [`crate::Session::decode`] step returns: `n_vocab` values for each batch token
/// that asked for them.
#[derive(Clone, Debug, Default)]
pub struct BatchLogits {
    pub(crate) n_vocab: usize,
    /// For each batch token, its row in `data`.
    pub(crate) rows: Vec<Option<usize>>,
    pub(crate) data: Vec<f32>,
}

impl BatchLogits {
    /// The logits of batch token `i`, if it asked for them.
    pub fn get(&self, i: usize) -> Option<&[f32]> {
        let r = (*self.rows.get(i)?)?;
        self.data.get(r * self.n_vocab..(r + 1) * self.n_vocab)
    }

    /// Rows returned.
    pub fn len(&self) -> usize {
        self.data.len() / self.n_vocab.max(1)
    }

    /// Whether no token asked for logits.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Every row, `n_vocab` values each, in batch order.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The vocabulary size (values per row).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }
}
