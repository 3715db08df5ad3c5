//! Byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`): GPT-2's byte ↔ unicode map, merge
//! ranks from `tokenizer.ggml.merges`, and the merge loop over one pre-tokenized word.
//!
//! Merging repeatedly joins the adjacent pair of symbols with the lowest merge rank (the
//! leftmost on ties) until no adjacent pair has a rank, as llama.cpp and GPT-2 do.

use super::{Token, Vocab};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::OnceLock;

/// GPT-2's map from bytes to printable chars: printable Latin-1 bytes map to themselves, the
/// others (controls, space, DEL, NBSP, soft hyphen) to U+0100 onwards in byte order.
fn byte_chars() -> &'static [char; 256] {
    static MAP: OnceLock<[char; 256]> = OnceLock::new();
    MAP.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut map = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            map[b as usize] = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                // 256..=323 are all valid scalar values.
                char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
        }
        map
    })
}

/// GPT-2's char for byte `b`.
pub(super) fn byte_char(b: u8) -> char {
    byte_chars()[b as usize]
}

fn char_bytes() -> &'static HashMap<char, u8> {
    static MAP: OnceLock<HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| (0..=255u8).map(|b| (byte_chars()[b as usize], b)).collect())
}

/// `text`'s bytes as GPT-2 byte chars (what byte-level vocabularies store).
pub(super) fn encode_bytes(text: &str) -> String {
    text.bytes().map(byte_char).collect()
}

/// The bytes of a byte-level token's text; chars outside the map keep their UTF-8 bytes.
pub(super) fn decode_bytes(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match char_bytes().get(&c) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
}

/// Merge ranks: the position of each pair in `tokenizer.ggml.merges`.
#[derive(Clone, Debug, Default)]
pub(super) struct Merges {
    /// Interned merge parts, so lookups need no allocation.
    parts: HashMap<String, u32>,
    ranks: HashMap<(u32, u32), u32>,
}

impl Merges {
    /// Parses `"left right"` lines (split at the first space after the first char).
    ///
    /// # Errors
    /// The index and text of the first line without a separating space.
    pub(super) fn parse(lines: &[String]) -> Result<Merges, String> {
        let mut m = Merges::default();
        for (rank, line) in lines.iter().enumerate() {
            let first = line.chars().next().map_or(0, char::len_utf8);
            let split = line[first..].find(' ').map(|p| p + first);
            let Some(at) = split else {
                return Err(format!(
                    "merge {rank} {line:?} has no space separating two parts"
                ));
            };
            let (l, r) = (m.intern(&line[..at]), m.intern(&line[at + 1..]));
            let rank = u32::try_from(rank).map_err(|_| "more than 2^32 merges".to_string())?;
            // The first occurrence of a pair wins, as in a rank map built in order.
            m.ranks.entry((l, r)).or_insert(rank);
        }
        Ok(m)
    }

    fn intern(&mut self, s: &str) -> u32 {
        let n = self.parts.len() as u32;
        *self.parts.entry(s.to_string()).or_insert(n)
    }

    /// Number of merges.
    pub(super) fn len(&self) -> usize {
        self.ranks.len()
    }

    fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let l = *self.parts.get(left)?;
        let r = *self.parts.get(right)?;
        self.ranks.get(&(l, r)).copied()
    }
}

const NONE: usize = usize::MAX;

/// A symbol: a byte range of the word, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

/// The symbols of `text`, one per char.
pub(super) fn char_symbols(text: &str) -> Vec<(usize, usize)> {
    text.char_indices()
        .map(|(i, c)| (i, c.len_utf8()))
        .collect()
}

fn link(spans: &[(usize, usize)]) -> Vec<Sym> {
    let n = spans.len();
    spans
        .iter()
        .enumerate()
        .map(|(i, &(start, len))| Sym {
            start,
            len,
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
        })
        .collect()
}

/// A candidate merge; `BinaryHeap` pops the greatest, so the lowest rank (then the leftmost)
/// compares greatest.
#[derive(PartialEq, Eq)]
struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Pair {
    fn cmp(&self, o: &Pair) -> Ordering {
        o.rank.cmp(&self.rank).then(o.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, o: &Pair) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// How [`tokenize_word`] treats a word (llama.cpp's per-pre-tokenizer switches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WordOpts {
    /// A word that is itself a token is taken whole.
    pub ignore_merges: bool,
    /// Words are GPT-2 byte chars (else raw UTF-8, with `<0xXX>` byte tokens).
    pub byte_encode: bool,
    /// A word of newlines only that is a token is taken whole (Gemma 4).
    pub whole_newlines: bool,
}

/// Tokens of one pre-tokenized (and, with `byte_encode`, byte-mapped) word. Symbols left that
/// are not tokens fall back, as in llama.cpp, to a token per byte: the one-byte token text
/// (`byte_encode`) or `<0xXX>`; bytes without one are dropped.
pub(super) fn tokenize_word(
    vocab: &Vocab,
    merges: &Merges,
    word: &str,
    opts: WordOpts,
    out: &mut Vec<Token>,
) {
    let newlines = opts.whole_newlines && word.bytes().all(|b| b == b'\n');
    if (opts.ignore_merges || newlines)
        && let Some(id) = vocab.id(word)
    {
        out.push(id);
        return;
    }
    let mut syms = link(&char_symbols(word));
    let text = |s: &Sym| &word[s.start..s.start + s.len];
    let mut heap = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<Pair>, syms: &[Sym], l: usize, r: usize| {
        if l == NONE || r == NONE {
            return;
        }
        if let Some(rank) = merges.rank(text(&syms[l]), text(&syms[r])) {
            let size = syms[l].len + syms[r].len;
            heap.push(Pair {
                rank,
                left: l,
                right: r,
                size,
            });
        }
    };
    for i in 1..syms.len() {
        push(&mut heap, &syms, i - 1, i);
    }
    while let Some(p) = heap.pop() {
        let (l, r) = (p.left, p.right);
        // Stale: one side has merged with something else since the pair was queued.
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != p.size {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        if syms[r].next != NONE {
            let n = syms[r].next;
            syms[n].prev = l;
        }
        push(&mut heap, &syms, syms[l].prev, l);
        push(&mut heap, &syms, l, syms[l].next);
    }
    let mut i = if syms.is_empty() { NONE } else { 0 };
    while i != NONE {
        let s = text(&syms[i]);
        match vocab.id(s) {
            Some(id) => out.push(id),
            None => {
                for b in s.bytes() {
                    let id = if opts.byte_encode {
                        // A lone byte of a multi-byte char is no valid token text.
                        b.is_ascii()
                            .then(|| vocab.id(char::from(b).encode_utf8(&mut [0; 4])))
                            .flatten()
                    } else {
                        vocab.id(&format!("<0x{b:02X}>"))
                    };
                    out.extend(id);
                }
            }
        }
        i = syms[i].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_gpt2s() {
        assert_eq!(encode_bytes(" "), "Ġ");
        assert_eq!(encode_bytes("\n"), "Ċ");
        assert_eq!(encode_bytes("a!~"), "a!~");
        assert_eq!(byte_chars()[0], 'Ā');
        assert_eq!(byte_chars()[0xAD], 'Ń');
        assert_eq!(byte_chars()[0xA0], 'ł');
        let mut back = Vec::new();
        for b in 0..=255u8 {
            decode_bytes(&byte_chars()[b as usize].to_string(), &mut back);
        }
        assert_eq!(back, (0..=255).collect::<Vec<u8>>());
        assert_eq!(char_bytes().len(), 256);
        let mut raw = Vec::new();
        decode_bytes("é€", &mut raw);
        assert_eq!(raw, [0xE9, 0xE2, 0x82, 0xAC]);
    }

    #[test]
    fn merges_parse_and_rank() {
        let lines: Vec<String> = ["Ġ t", "h e", "Ġt he", "h e"].map(String::from).to_vec();
        let m = Merges::parse(&lines).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m.rank("Ġ", "t"), Some(0));
        assert_eq!(m.rank("h", "e"), Some(1));
        assert_eq!(m.rank("Ġt", "he"), Some(2));
        assert_eq!(m.rank("t", "h"), None);
        assert!(Merges::parse(&["nospace".to_string()]).is_err());
        // A part may start with a space: the split is after the first char.
        let m = Merges::parse(&["  x".to_string()]).unwrap();
        assert_eq!(m.rank(" ", "x"), Some(0));
    }
}
