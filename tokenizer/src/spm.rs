//! SentencePiece-style BPE (GGUF `tokenizer.ggml.model = "llama"`): the merge loop over one
//! whitespace-escaped fragment, and byte fallback.
//!
//! Every char starts as a symbol; the adjacent pair whose concatenation is a token with the
//! highest score (the leftmost on ties) is merged, until no adjacent pair forms a token. A final
//! symbol that is not a token (a char outside the vocabulary) becomes its UTF-8 bytes as
//! `<0xXX>` tokens, as llama.cpp does.

use super::{Token, Vocab};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// SentencePiece's visible space, U+2581.
pub(super) const SPACE: char = '\u{2581}';

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

/// A candidate merge; `BinaryHeap` pops the greatest: the highest score, then the leftmost.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Pair {
    fn eq(&self, o: &Pair) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl Ord for Pair {
    fn cmp(&self, o: &Pair) -> Ordering {
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, o: &Pair) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// `text` with spaces escaped to U+2581, and one U+2581 in front when `prefix_space`.
pub(super) fn escape(text: &str, prefix_space: bool) -> String {
    let mut s = String::with_capacity(text.len() + 3);
    if prefix_space {
        s.push(SPACE);
    }
    s.extend(text.chars().map(|c| if c == ' ' { SPACE } else { c }));
    s
}

/// Appends the tokens of the escaped fragment `text` to `out`. A symbol that is not a token
/// becomes the `byte_token` of each of its bytes, or one unknown token when some byte has none
/// (or nothing, without an unknown token).
pub(super) fn tokenize(
    vocab: &Vocab,
    text: &str,
    byte_token: impl Fn(u8) -> Option<Token>,
    out: &mut Vec<Token>,
) {
    let n = text.chars().count();
    let mut syms: Vec<Sym> = text
        .char_indices()
        .enumerate()
        .map(|(i, (start, c))| Sym {
            start,
            len: c.len_utf8(),
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
        })
        .collect();
    let mut heap = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<Pair>, syms: &[Sym], l: usize, r: usize| {
        if l == NONE || r == NONE {
            return;
        }
        let size = syms[l].len + syms[r].len;
        let joined = &text[syms[l].start..syms[l].start + size];
        if let Some(id) = vocab.id(joined) {
            heap.push(Pair {
                score: vocab.score(id),
                left: l,
                right: r,
                size,
            });
        }
    };
    for i in 1..n {
        push(&mut heap, &syms, i - 1, i);
    }
    while let Some(p) = heap.pop() {
        let (l, r) = (p.left, p.right);
        // Stale: one side has merged with something else since the pair was queued.
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != p.size {
            continue;
        }
        syms[l].len = p.size;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        if syms[r].next != NONE {
            let next = syms[r].next;
            syms[next].prev = l;
        }
        push(&mut heap, &syms, syms[l].prev, l);
        push(&mut heap, &syms, l, syms[l].next);
    }
    let mut i = if n == 0 { NONE } else { 0 };
    while i != NONE {
        let s = &text[syms[i].start..syms[i].start + syms[i].len];
        match vocab.id(s) {
            Some(id) => out.push(id),
            None => match s.bytes().map(&byte_token).collect::<Option<Vec<_>>>() {
                Some(bytes) => out.extend(bytes),
                None => out.extend(vocab.unk),
            },
        }
        i = syms[i].next;
    }
}
