//! llama.cpp's hand-written splitters (`unicode_regex_split_custom_*` in `src/unicode.cpp`),
//! which it runs instead of the regexes they stand for. Ported step for step, quirks included:
//! the results differ from the regexes in corner cases, and llama.cpp's are the reference.
//!
//! Each works on one segment of code points and appends the lengths of its words.

use super::unicode::{Flags, flags, is_han};

/// A segment being cut into words.
struct Cursor<'a> {
    cps: &'a [char],
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl<'a> Cursor<'a> {
    fn new(cps: &'a [char], out: &'a mut Vec<usize>) -> Cursor<'a> {
        Cursor {
            cps,
            prev_end: 0,
            out,
        }
    }

    fn len(&self) -> usize {
        self.cps.len()
    }

    fn cpt(&self, pos: usize) -> Option<char> {
        self.cps.get(pos).copied()
    }

    /// `None` past the segment (llama.cpp's all-zero flags).
    fn flags(&self, pos: usize) -> Option<Flags> {
        self.cpt(pos).map(flags)
    }

    fn is(&self, pos: usize, f: impl Fn(Flags) -> bool) -> bool {
        self.flags(pos).is_some_and(f)
    }

    /// Ends a word at `end`; returns its length (0: nothing added).
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }

    /// Length of the contraction (`'s`, `'re`, …) at `pos`, if any.
    fn contraction(&self, pos: usize, fold_case: bool) -> Option<usize> {
        let low = |c: Option<char>| c.map(|c| if fold_case { c.to_ascii_lowercase() } else { c });
        if self.cpt(pos) != Some('\'') || pos + 1 >= self.len() {
            return None;
        }
        let next = low(self.cpt(pos + 1));
        if matches!(next, Some('s' | 't' | 'm' | 'd')) {
            return Some(2);
        }
        if pos + 2 < self.len() {
            let next2 = low(self.cpt(pos + 2));
            if matches!(
                (next, next2),
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            ) {
                return Some(3);
            }
        }
        None
    }

    /// `\p{N}{1,max}` repeated over the run of numbers at `pos`; returns the end.
    fn numbers(&mut self, mut pos: usize, max: usize) -> usize {
        let mut start = pos;
        while self.is(pos, Flags::is_number) {
            pos += 1;
            if pos - start >= max {
                self.add(pos);
                start = pos;
            }
        }
        self.add(pos);
        pos
    }

    /// ` ?[^\s…]+[\r\n]*` from `pos` (the optional space taken), `other` being the class;
    /// returns the end.
    fn other_run(&mut self, mut pos: usize, other: impl Fn(Flags) -> bool) -> usize {
        while self.is(pos, &other) {
            pos += 1;
        }
        while matches!(self.cpt(pos), Some('\r' | '\n')) {
            pos += 1;
        }
        self.add(pos);
        pos
    }

    /// The shared tail: ` ?[^\s\p{L}\p{N}]+` handled by the caller, then `\s*[\r\n]+` (when
    /// `newlines`), `\s+(?!\S)`, `\s+`, else one code point. Returns the new position.
    fn whitespace(&mut self, pos: usize, newlines: bool) -> usize {
        let mut n = 0;
        let mut last_crlf = 0;
        while self.is(pos + n, |f| f.ws) {
            if matches!(self.cpt(pos + n), Some('\r' | '\n')) {
                last_crlf = pos + n + 1;
            }
            n += 1;
        }
        let end = if newlines && last_crlf > 0 {
            last_crlf
        } else if n > 1 && self.cpt(pos + n).is_some() {
            pos + n - 1
        } else if n > 0 {
            pos + n
        } else {
            pos + 1
        };
        self.add(end);
        end
    }
}

fn not_word(f: Flags) -> bool {
    !(f.ws || f.is_letter() || f.is_number())
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)` (GPT-2).
pub(super) fn gpt2(cps: &[char], out: &mut Vec<usize>) {
    let mut c = Cursor::new(cps, out);
    let mut pos = 0;
    while pos < c.len() {
        if let Some(n) = c.contraction(pos, false) {
            pos += n;
            c.add(pos);
            continue;
        }
        let space = c.cpt(pos) == Some(' ');
        let f2 = c.flags(pos + usize::from(space));
        let class: Option<fn(Flags) -> bool> = match f2 {
            Some(f) if f.is_letter() => Some(Flags::is_letter),
            Some(f) if f.is_number() => Some(Flags::is_number),
            Some(f) if not_word(f) => Some(not_word),
            _ => None,
        };
        if let Some(class) = class {
            pos += usize::from(space);
            while c.is(pos, class) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        pos = c.whitespace(pos, false);
    }
}

/// LLaMA 3 and relatives: case-insensitive contractions, `[^\r\n\p{L}\p{N}]?\p{L}+` (with
/// `marks`: `[\p{L}\p{M}]+`), `\p{N}{1,max_digits}`, ` ?[^\s\p{L}\p{N}]+[\r\n]*`,
/// `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`. LLaMA 3: 3 digits; Qwen 2: 1; Qwen 3.5: 1 with marks.
pub(super) fn llama3(cps: &[char], max_digits: usize, marks: bool, out: &mut Vec<usize>) {
    let letter = move |f: Flags| f.is_letter() || (marks && f.is_mark());
    let other = move |f: Flags| !(f.ws || letter(f) || f.is_number());
    let mut c = Cursor::new(cps, out);
    let mut pos = 0;
    while pos < c.len() {
        if let Some(n) = c.contraction(pos, true) {
            pos += n;
            c.add(pos);
            continue;
        }
        let cpt = c.cpt(pos);
        let f = c.flags(pos);
        let crlf = matches!(cpt, Some('\r' | '\n'));
        if !crlf
            && !f.is_some_and(Flags::is_number)
            && (f.is_some_and(letter) || c.is(pos + 1, letter))
        {
            pos += 1;
            while c.is(pos, letter) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        if f.is_some_and(Flags::is_number) {
            pos = c.numbers(pos, max_digits);
            continue;
        }
        let space = cpt == Some(' ');
        let f2 = c.flags(pos + usize::from(space));
        // llama.cpp tests `flags2` for the class but `flags` (the first char) for being in range.
        if f2.is_none_or(other) && f.is_some() {
            pos = c.other_run(pos + usize::from(space), other);
            continue;
        }
        pos = c.whitespace(pos, true);
    }
}

/// Kimi K2: `[\p{Han}]+`, letter words without Han chars and with an optional contraction,
/// `\p{N}{1,3}`, ` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
pub(super) fn kimi_k2(cps: &[char], out: &mut Vec<usize>) {
    let mut c = Cursor::new(cps, out);
    let han = |c: &Cursor, p: usize| c.cpt(p).is_some_and(is_han);
    let word = |c: &Cursor, p: usize| c.is(p, Flags::is_letter) && !han(c, p);
    let mut pos = 0;
    while pos < c.len() {
        let cpt = c.cpt(pos);
        let f = c.flags(pos);
        if han(&c, pos) {
            while han(&c, pos) {
                pos += 1;
            }
            c.add(pos);
            continue;
        }
        let lead_ok = !(matches!(cpt, Some('\r' | '\n'))
            || f.is_some_and(|f| f.is_letter() || f.is_number()));
        if word(&c, pos) || (lead_ok && word(&c, pos + 1)) {
            let mut has_lead = false;
            if lead_ok {
                has_lead = true;
                pos += 1;
            }
            let mut has_letters = false;
            while word(&c, pos) {
                has_letters = true;
                pos += 1;
            }
            if has_letters || (!has_lead && word(&c, pos)) {
                if !has_letters {
                    pos += 1;
                }
                while word(&c, pos) {
                    pos += 1;
                }
                pos += c.contraction(pos, true).unwrap_or(0);
                c.add(pos);
                continue;
            } else if has_lead {
                pos -= 1;
            }
        }
        if f.is_some_and(Flags::is_number) {
            pos = c.numbers(pos, 3);
            continue;
        }
        let space = cpt == Some(' ');
        if c.is(pos + usize::from(space), not_word) {
            pos = c.other_run(pos + usize::from(space), not_word);
            continue;
        }
        pos = c.whitespace(pos, true);
    }
}

/// AFMoE (and tiny_aya's `\d{1,3}(?=(?:\d{3})*\b)`): each run of numbers is cut into a leading
/// group of its length mod 3 and then threes. As in llama.cpp, the text before a run joins the
/// run's first group.
pub(super) fn afmoe_digits(cps: &[char], out: &mut Vec<usize>) {
    let mut c = Cursor::new(cps, out);
    let mut pos = 0;
    while pos < c.len() {
        if c.is(pos, Flags::is_number) {
            let start = pos;
            while c.is(pos, Flags::is_number) {
                pos += 1;
            }
            let count = pos - start;
            let mut cur = start;
            if count % 3 > 0 {
                cur += count % 3;
                c.add(cur);
            }
            while cur < start + count {
                cur += 3;
                c.add(cur);
            }
            continue;
        }
        pos += 1;
    }
    if c.prev_end < c.len() {
        c.add(c.len());
    }
}

/// `[^\n]+|[\n]+`: runs of newlines and runs of anything else.
pub(super) fn newlines(cps: &[char], out: &mut Vec<usize>) {
    let mut pos = 0;
    while pos < cps.len() {
        let nl = cps[pos] == '\n';
        let start = pos;
        while pos < cps.len() && (cps[pos] == '\n') == nl {
            pos += 1;
        }
        out.push(pos - start);
    }
}
