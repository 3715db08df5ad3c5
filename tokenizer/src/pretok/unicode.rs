//! Code point flags as llama.cpp's `unicode_cpt_flags`: one general category (number, letter,
//! mark, punctuation, symbol, or other) plus White_Space, from `regex-syntax`'s Unicode tables.

use regex_syntax::hir::{self, HirKind};
use std::sync::OnceLock;

/// A code point's general category, as far as the pre-tokenizers tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cat {
    /// `\p{N}`.
    Number,
    /// `\p{L}`.
    Letter,
    /// `\p{M}` (llama.cpp's "accent mark").
    Mark,
    /// `\p{P}`.
    Punct,
    /// `\p{S}`.
    Symbol,
    /// Separators, controls, unassigned and private-use code points.
    Other,
}

/// The flags of one code point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Flags {
    pub cat: Cat,
    /// Unicode White_Space (llama.cpp's `unicode_set_whitespace` is the same set).
    pub ws: bool,
}

impl Flags {
    pub fn is_letter(self) -> bool {
        self.cat == Cat::Letter
    }

    pub fn is_number(self) -> bool {
        self.cat == Cat::Number
    }

    pub fn is_mark(self) -> bool {
        self.cat == Cat::Mark
    }
}

const CLASSES: [(&str, Cat); 5] = [
    (r"\p{L}", Cat::Letter),
    (r"\p{N}", Cat::Number),
    (r"\p{M}", Cat::Mark),
    (r"\p{P}", Cat::Punct),
    (r"\p{S}", Cat::Symbol),
];

/// Sorted, disjoint `(first, last, category)` ranges of the five categories.
fn ranges() -> &'static [(char, char, Cat)] {
    static RANGES: OnceLock<Vec<(char, char, Cat)>> = OnceLock::new();
    RANGES.get_or_init(|| {
        let mut all = Vec::new();
        for (pattern, cat) in CLASSES {
            // The patterns are constants that parse to Unicode classes; anything else leaves
            // the category empty rather than panicking.
            if let Ok(HirKind::Class(hir::Class::Unicode(c))) =
                regex_syntax::parse(pattern).map(|h| h.into_kind())
            {
                all.extend(c.ranges().iter().map(|r| (r.start(), r.end(), cat)));
            }
        }
        all.sort_by_key(|r| r.0);
        all
    })
}

/// The flags of `c`.
pub(super) fn flags(c: char) -> Flags {
    let ws = c.is_whitespace();
    let cat = if c.is_ascii() {
        match c {
            'a'..='z' | 'A'..='Z' => Cat::Letter,
            '0'..='9' => Cat::Number,
            '$' | '+' | '<' | '=' | '>' | '^' | '`' | '|' | '~' => Cat::Symbol,
            c if c.is_ascii_punctuation() => Cat::Punct,
            _ => Cat::Other,
        }
    } else {
        let r = ranges();
        match r.binary_search_by(|&(lo, _, _)| lo.cmp(&c)) {
            Ok(i) => r[i].2,
            Err(0) => Cat::Other,
            Err(i) if c <= r[i - 1].1 => r[i - 1].2,
            Err(_) => Cat::Other,
        }
    };
    Flags { cat, ws }
}

/// `\p{L}`.
#[cfg(test)]
fn is_letter(c: char) -> bool {
    flags(c).is_letter()
}

/// llama.cpp's `unicode_cpt_is_han`: the CJK ideograph blocks.
pub(super) fn is_han(c: char) -> bool {
    matches!(u32::from(c),
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0x2CEB0..=0x2EBEF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories() {
        for c in ['a', 'Z', 'é', 'ß', 'Ж', '中', 'ひ', 'ا'] {
            assert!(is_letter(c), "{c}");
        }
        // Digits, Roman numeral Ⅻ (Nl), a combining mark (Mn), emoji and punctuation are not.
        for c in ['1', '٣', 'Ⅻ', '\u{0301}', '🦀', '!', ' ', '\u{094D}'] {
            assert!(!is_letter(c), "{c:?}");
        }
        assert_eq!(flags('Ⅻ').cat, Cat::Number);
        assert_eq!(flags('\u{0301}').cat, Cat::Mark);
        assert_eq!(flags('🦀').cat, Cat::Symbol);
        assert_eq!(flags('$').cat, Cat::Symbol);
        assert_eq!(flags('_').cat, Cat::Punct);
        assert_eq!(flags('、').cat, Cat::Punct);
        assert_eq!(
            flags('\u{3000}'),
            Flags {
                cat: Cat::Other,
                ws: true
            }
        );
        assert!(is_han('漢') && !is_han('ひ'));
    }
}
