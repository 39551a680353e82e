//! Bounded text helpers for key extraction: the prefix buffer that stops at `prefix_length`
//! characters, and a JSON string decoder that works on the raw (still escaped) string text so
//! that the part of a long string beyond the prefix is never copied.

use super::ExtractError;
use crate::chain::ChainBuilder;

/// Expected-type text used when a decoded string holds an escaped lone surrogate.
pub(crate) const NO_LONE_SURROGATE: &str = "a string without unpaired UTF-16 surrogate escapes";

/// The canonical text of a request as the extractor decodes it: its first characters, kept
/// for the key (a copy of at most `prefix_length` characters), and, when a chain is asked for,
/// the chain. The chain is hashed from the key's copy while the text fits in it, then from the
/// decoded pieces as they come (see [`ChainBuilder`]), so a prompt longer than the key is never
/// copied whole. Both stop at their own bound; the text is read as far as the further one.
#[derive(Debug)]
pub(crate) struct PrefixText<'b> {
    /// The key's text.
    buf: &'b mut String,
    /// Characters the key's text still takes.
    key_room: usize,
    /// Whether the key's text is known to be ASCII.
    key_ascii: bool,
    /// Characters still read by anything (the key or the chain).
    remaining: usize,
    /// The chain, given the key's text once the key is full (or at the end, if it never
    /// fills), and everything after the key as it comes.
    chain: Option<ChainBuilder<'b>>,
}

impl<'b> PrefixText<'b> {
    /// An empty prefix that will hold at most `max_chars` characters, reusing `buf`.
    pub(crate) fn new(buf: &'b mut String, max_chars: usize) -> Self {
        buf.clear();
        Self {
            buf,
            key_room: max_chars,
            key_ascii: true,
            remaining: max_chars,
            chain: None,
        }
    }

    /// [`PrefixText::new`] for a key of `key_chars` characters that also builds `chain`.
    pub(crate) fn with_chain(
        buf: &'b mut String,
        key_chars: usize,
        chain: ChainBuilder<'b>,
    ) -> Self {
        let mut p = Self::new(buf, key_chars.max(chain.room()));
        p.key_room = key_chars;
        p.chain = Some(chain);
        p
    }

    /// Whether everything that reads the text has all it takes (everything else is ignored).
    pub(crate) fn is_full(&self) -> bool {
        self.remaining == 0
    }

    /// The key's text: the first characters taken, at most the key's bound.
    pub(crate) fn as_str(&self) -> &str {
        self.buf
    }

    /// The chain builder with everything taken, when a chain is built.
    pub(crate) fn take_chain(&mut self) -> Option<ChainBuilder<'b>> {
        // A key that filled has been handed over already (see `key_filled`).
        if self.key_room > 0 {
            self.key_filled();
        }
        self.chain.take()
    }

    /// Hands the key's text to the chain: once, when the key is full or at the end.
    fn key_filled(&mut self) {
        if let Some(chain) = &mut self.chain {
            chain.push(self.buf, self.key_ascii);
        }
    }

    /// Appends one character if there is room.
    pub(crate) fn push_char(&mut self, c: char) {
        if self.remaining == 0 {
            return;
        }
        self.remaining -= 1;
        if self.key_room > 0 {
            self.buf.push(c);
            self.key_ascii &= c.is_ascii();
            self.key_room -= 1;
            if self.key_room == 0 {
                self.key_filled();
            }
        } else if let Some(chain) = &mut self.chain {
            chain.push_char(c);
        }
    }

    /// Appends as much of `s` as fits, never cutting a character.
    pub(crate) fn push_str(&mut self, s: &str) {
        if self.remaining == 0 {
            return;
        }
        // Most text is ASCII: one vectorised check answers the count, and the key's cut and
        // the chain's skip their own passes over the text.
        let (head, n) = if s.len() <= self.remaining && s.is_ascii() {
            (s, s.len())
        } else {
            take_chars(s, self.remaining)
        };
        let ascii = n == head.len();
        self.remaining -= n;
        let mut rest = head;
        if self.key_room > 0 {
            let (key, k) = if ascii {
                let k = head.len().min(self.key_room);
                (&head[..k], k)
            } else {
                take_chars(head, self.key_room)
            };
            self.buf.push_str(key);
            self.key_ascii &= k == key.len();
            self.key_room -= k;
            if self.key_room > 0 {
                return;
            }
            rest = &head[key.len()..];
            self.key_filled();
        }
        if let Some(chain) = &mut self.chain {
            chain.push(rest, ascii);
        }
    }

    /// Decodes the raw JSON string `raw` (with its quotes) into the prefix, stopping when full.
    /// Unescaped runs are copied as whole slices (one vectorised search for the next backslash,
    /// one vectorised character count, one copy); each escape is decoded straight into the
    /// buffer. Nothing of the string is looked at once the prefix is full (the parser has
    /// already validated it as JSON).
    pub(crate) fn push_json_str(
        &mut self,
        raw: &str,
        field: &'static str,
    ) -> Result<(), ExtractError> {
        let inner = strip_quotes(raw, field)?;
        let bytes = inner.as_bytes();
        let mut pos = 0usize;
        while pos < bytes.len() && self.remaining > 0 {
            if bytes[pos] == b'\\' {
                if let Some(c) = bmp_escape(bytes, pos) {
                    self.push_char(c);
                    pos += 6;
                    continue;
                }
                let (c, used) = decode_escape(bytes, pos, field)?;
                self.push_char(c);
                pos += used;
            } else {
                // The prefix takes at most `remaining` more characters, 4 bytes at most each:
                // the search for the next escape stops there, not at the end of a prompt the
                // prefix will never reach (a 256 KiB prompt under a 1,024-character key).
                let window = pos
                    .saturating_add(self.remaining.saturating_mul(4))
                    .min(bytes.len());
                let run_end = find_byte(&bytes[..window], pos, b'\\')
                    .unwrap_or_else(|| floor_char(inner, window));
                self.push_str(&inner[pos..run_end]);
                pos = run_end;
            }
        }
        Ok(())
    }
}

/// The largest character boundary of `s` at or before byte `at` (within `s`; at most 3 steps
/// back).
fn floor_char(s: &str, at: usize) -> usize {
    (at.saturating_sub(3)..=at)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// The longest head of `s` holding at most `n` characters, and its character count. Counts
/// character starts in vectorisable blocks instead of walking `char_indices` one by one.
pub(crate) fn take_chars(s: &str, n: usize) -> (&str, usize) {
    let bytes = s.as_bytes();
    if bytes.len() <= n {
        // At most n bytes, hence at most n characters.
        return (s, count_char_starts(bytes));
    }
    let mut end = 0usize;
    let mut taken = 0usize;
    // Each byte starts at most one character, so advancing by `n - taken` bytes never
    // overshoots the n-th character start.
    while taken < n && end < bytes.len() {
        let next = (end + (n - taken)).min(bytes.len());
        taken += count_char_starts(&bytes[end..next]);
        end = next;
    }
    // `end` may sit inside the last started character: include its continuation bytes.
    while end < bytes.len() && !s.is_char_boundary(end) {
        end += 1;
    }
    (&s[..end], taken)
}

/// Number of UTF-8 character starts (bytes that are not continuation bytes 0b10xx_xxxx).
#[inline]
pub(crate) fn count_char_starts(bytes: &[u8]) -> usize {
    count_matching(bytes, |b| (b as i8) >= -0x40)
}

/// Number of bytes of `bytes` for which `pred` holds. Counts each block of up to 128 bytes
/// (the last one too: runs between escapes are short) into a byte-wide counter, which the
/// compiler turns into 16-lane SIMD adds; a plain `filter().count()` accumulates into 64-bit
/// lanes, two bytes per step, 4-8x slower.
#[inline(always)]
pub(crate) fn count_matching(bytes: &[u8], pred: impl Fn(u8) -> bool) -> usize {
    const COUNT_BLOCK: usize = 128;
    let mut total = 0usize;
    for chunk in bytes.chunks(COUNT_BLOCK) {
        let mut n = 0u8;
        for &b in chunk {
            n += u8::from(pred(b));
        }
        total += usize::from(n);
    }
    total
}

/// Decodes the JSON string `raw` (including its surrounding quotes), handing decoded pieces to
/// `sink` until it returns false. The parser has already checked the string's structure; this
/// function still refuses, naming `field`, a malformed `\u` escape or an unpaired surrogate in
/// the part it decodes (a string whose text is used must be valid Unicode).
pub(crate) fn decode_json_str(
    raw: &str,
    field: &'static str,
    mut sink: impl FnMut(&str) -> bool,
) -> Result<(), ExtractError> {
    let inner = strip_quotes(raw, field)?;
    let bytes = inner.as_bytes();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let run_end = find_byte(bytes, pos, b'\\').unwrap_or(bytes.len());
        if run_end > pos && !sink(&inner[pos..run_end]) {
            return Ok(());
        }
        if run_end == bytes.len() {
            break;
        }
        let (c, used) = decode_escape(bytes, run_end, field)?;
        let mut tmp = [0u8; 4];
        if !sink(c.encode_utf8(&mut tmp)) {
            return Ok(());
        }
        pos = run_end + used;
    }
    Ok(())
}

/// The text between the quotes of a raw JSON string.
fn strip_quotes<'r>(raw: &'r str, field: &'static str) -> Result<&'r str, ExtractError> {
    raw.strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or(ExtractError::FieldType {
            field,
            expected: "a string",
        })
}

/// The common escape in non-ASCII text sent ASCII-only: `\uXXXX` of a character of the Basic
/// Multilingual Plane (not a surrogate), decoded inline; anything else is `None`, left to
/// [`decode_escape`].
#[inline(always)]
fn bmp_escape(bytes: &[u8], at: usize) -> Option<char> {
    if bytes.get(at + 1) != Some(&b'u') {
        return None;
    }
    let v = hex4(bytes, at + 2)?;
    if (0xD800..=0xDFFF).contains(&v) {
        return None;
    }
    char::from_u32(u32::from(v))
}

/// Decodes the escape starting with the backslash at `at`: the character and the bytes used.
#[inline]
fn decode_escape(
    bytes: &[u8],
    at: usize,
    field: &'static str,
) -> Result<(char, usize), ExtractError> {
    let esc = bytes
        .get(at + 1)
        .copied()
        .ok_or_else(|| bad_escape(field))?;
    Ok(match esc {
        b'"' => ('"', 2),
        b'\\' => ('\\', 2),
        b'/' => ('/', 2),
        b'b' => ('\u{8}', 2),
        b'f' => ('\u{c}', 2),
        b'n' => ('\n', 2),
        b'r' => ('\r', 2),
        b't' => ('\t', 2),
        b'u' => {
            let hi = hex4(bytes, at + 2).ok_or_else(|| bad_escape(field))?;
            match hi {
                0xD800..=0xDBFF => {
                    let lo =
                        if bytes.get(at + 6) == Some(&b'\\') && bytes.get(at + 7) == Some(&b'u') {
                            hex4(bytes, at + 8).ok_or_else(|| bad_escape(field))?
                        } else {
                            return Err(lone_surrogate(field));
                        };
                    if !(0xDC00..=0xDFFF).contains(&lo) {
                        return Err(lone_surrogate(field));
                    }
                    let cp = 0x10000 + ((u32::from(hi) - 0xD800) << 10) + (u32::from(lo) - 0xDC00);
                    (char::from_u32(cp).ok_or_else(|| lone_surrogate(field))?, 12)
                }
                0xDC00..=0xDFFF => return Err(lone_surrogate(field)),
                _ => (
                    char::from_u32(u32::from(hi)).ok_or_else(|| lone_surrogate(field))?,
                    6,
                ),
            }
        }
        _ => return Err(bad_escape(field)),
    })
}

/// Value of each byte as a hex digit, or 0xFF.
const HEX_DIGIT: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

#[inline(always)]
pub(crate) fn hex4(bytes: &[u8], at: usize) -> Option<u16> {
    let d = bytes.get(at..at + 4)?;
    let [a, b, c, e] = [d[0], d[1], d[2], d[3]].map(|x| HEX_DIGIT[usize::from(x)]);
    if (a | b | c | e) & 0xF0 != 0 {
        return None;
    }
    Some(u16::from(a) << 12 | u16::from(b) << 8 | u16::from(c) << 4 | u16::from(e))
}

fn bad_escape(field: &'static str) -> ExtractError {
    ExtractError::Json(format!("invalid escape sequence in field '{field}'"))
}

fn lone_surrogate(field: &'static str) -> ExtractError {
    ExtractError::FieldType {
        field,
        expected: NO_LONE_SURROGATE,
    }
}

/// Decodes a whole JSON string into an owned `String` (for short fields such as `model`).
pub(crate) fn decode_owned(raw: &str, field: &'static str) -> Result<String, ExtractError> {
    let mut out = String::with_capacity(raw.len().saturating_sub(2));
    decode_json_str(raw, field, |p| {
        out.push_str(p);
        true
    })?;
    Ok(out)
}

/// Position of the first `needle` byte in `hay` at or after `from`.
pub(crate) fn find_byte(hay: &[u8], from: usize, needle: u8) -> Option<usize> {
    // memchr picks AVX2 or SSE2 at run time: on a 16 KiB chat body under callgrind, the
    // hand-written 32-byte block scan this replaced was ~9% of the router's instructions.
    memchr::memchr(needle, hay.get(from..)?).map(|i| from + i)
}

/// Whether the body nests deeper than `limit` arrays/objects (outside strings). A cheap count of brackets
/// answers "no" for most bodies; otherwise a string-aware scan measures the depth.
pub(crate) fn nests_deeper_than(body: &[u8], limit: usize) -> bool {
    // memchr2 (AVX2 where the CPU has it) stops at the (limit + 1)-th opening bracket: a chat
    // body has a handful, so this is a fraction of an instruction per byte.
    let brackets = memchr::memchr2_iter(b'[', b'{', body)
        .take(limit + 1)
        .count();
    if brackets <= limit {
        return false;
    }
    let mut depth = 0usize;
    let mut i = 0usize;
    while i < body.len() {
        match body[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'"' => {
                // Skip the string: the next quote preceded by an even number of backslashes.
                let mut k = i + 1;
                loop {
                    match find_byte(body, k, b'"') {
                        Some(q) => {
                            let backslashes =
                                body[..q].iter().rev().take_while(|&&b| b == b'\\').count();
                            if backslashes % 2 == 0 {
                                i = q;
                                break;
                            }
                            k = q + 1;
                        }
                        // Unterminated string: the parser will refuse it; no deep recursion.
                        None => return false,
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn take_chars_never_cuts_a_character() {
        assert_eq!(take_chars("héllo", 2), ("hé", 2));
        assert_eq!(take_chars("日本語", 2), ("日本", 2));
        assert_eq!(take_chars("ab", 5), ("ab", 2));
        assert_eq!(take_chars("😀😀😀", 1), ("😀", 1));
    }

    #[test]
    fn decodes_escapes_and_pairs() {
        assert_eq!(
            decode_owned(r#""a\nb\u00e9\ud83d\ude00\"\\\/""#, "f"),
            Ok("a\nbé😀\"\\/".to_string())
        );
    }

    #[test]
    fn refuses_lone_surrogates_and_bad_hex_naming_the_field() {
        let lone = ExtractError::FieldType {
            field: "f",
            expected: NO_LONE_SURROGATE,
        };
        assert_eq!(decode_owned(r#""\ud800""#, "f"), Err(lone.clone()));
        assert_eq!(decode_owned(r#""\udc00x""#, "f"), Err(lone.clone()));
        assert_eq!(decode_owned(r#""\ud800\u0041""#, "f"), Err(lone));
        assert!(
            matches!(decode_owned(r#""\uZZZZ""#, "f"), Err(ExtractError::Json(m)) if m.contains("'f'"))
        );
    }

    #[test]
    fn prefix_stops_at_the_limit() {
        let mut buf = String::new();
        let mut p = PrefixText::new(&mut buf, 4);
        assert_eq!(p.push_json_str(r#""ab\u00e9\ud83d\ude00zz""#, "f"), Ok(()));
        assert!(p.is_full());
        p.push_char('x');
        assert_eq!(p.as_str(), "abé😀");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn take_chars_matches_naive(s in "\\PC{0,40}", n in 0usize..50) {
            let naive: String = s.chars().take(n).collect();
            let (head, count) = take_chars(&s, n);
            prop_assert_eq!(head, naive.as_str());
            prop_assert_eq!(count, naive.chars().count());
        }

        #[test]
        fn prefix_of_ascii_only_json_matches_chars(s in "\\PC{0,40}", upper in any::<bool>(), n in 1usize..50) {
            // JSON text of `s` with every non-ASCII or control character as `\uXXXX` (pairs
            // above U+FFFF), in either hex case: the escape fast path and the general one.
            let mut raw = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => raw.push_str("\\\""),
                    '\\' => raw.push_str("\\\\"),
                    c if c.is_ascii() && !c.is_ascii_control() => raw.push(c),
                    c => {
                        for u in c.encode_utf16(&mut [0u16; 2]) {
                            raw.push_str(&if upper { format!("\\u{u:04X}") } else { format!("\\u{u:04x}") });
                        }
                    }
                }
            }
            raw.push('"');
            let mut buf = String::new();
            let mut p = PrefixText::new(&mut buf, n);
            prop_assert_eq!(p.push_json_str(&raw, "f"), Ok(()));
            let expected: String = s.chars().take(n).collect();
            prop_assert_eq!(p.as_str(), expected.as_str());
        }

        #[test]
        fn a_short_prefix_of_long_strings_matches_chars(
            a in "(\\PC|[\"\\\\\n]){0,300}",
            b in "(\\PC|[\"\\\\\n]){0,300}",
            n in 0usize..80,
        ) {
            // Raw UTF-8 and escapes mixed (serde_json's encoding), two strings in a row, the
            // prefix often full part way through the first: the search for the next escape
            // stops where the prefix must, on a character boundary.
            let mut buf = String::new();
            let mut p = PrefixText::new(&mut buf, n);
            for s in [&a, &b] {
                let raw = serde_json::to_string(s).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(p.push_json_str(&raw, "f"), Ok(()));
            }
            let expected: String = a.chars().chain(b.chars()).take(n).collect();
            prop_assert_eq!(p.as_str(), expected.as_str());
        }

        #[test]
        fn key_and_chain_follow_their_own_bounds(
            a in "(\\PC|[\"\\\\\n]|[a-z ]{8,40}){0,40}",
            b in "(\\PC|[\"\\\\\n]){0,40}",
            key_chars in 0usize..80,
            max in 0u32..120,
            block in 1u32..9,
        ) {
            // The key is the first `key_chars` characters; the chain is that of the first
            // `max`, whether it was hashed from the key's copy, from the pieces, or both.
            let spec = crate::chain::ChainSpec { block_units: block, max_units: max };
            let mut buf = String::new();
            let mut pending = Vec::new();
            let chain = ChainBuilder::new(spec, 0, &mut pending);
            let mut p = PrefixText::with_chain(&mut buf, key_chars, chain);
            let raw = serde_json::to_string(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(p.push_json_str(&raw, "f"), Ok(()));
            p.push_char('\u{1E}');
            p.push_str(&b);
            let text = format!("{a}\u{1E}{b}");
            let key: String = text.chars().take(key_chars).collect();
            prop_assert_eq!(p.as_str(), key.as_str());
            let got = p.take_chain().map(|c| c.finish(None));
            prop_assert_eq!(got, Some(crate::chain::Chain::of_chars(None, &text, spec)));
        }

        #[test]
        fn count_matching_matches_filter(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            prop_assert_eq!(
                count_char_starts(&bytes),
                bytes.iter().filter(|&&b| (b as i8) >= -0x40).count()
            );
        }

        #[test]
        fn decode_matches_serde_json(s in "\\PC{0,40}") {
            let raw = serde_json::to_string(&s).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decode_owned(&raw, "f"), Ok(s));
        }

        #[test]
        fn find_byte_matches_position(hay in proptest::collection::vec(prop_oneof![Just(b'\\'), any::<u8>()], 0..200), from in 0usize..210) {
            let expected = hay.get(from..).and_then(|r| r.iter().position(|&b| b == b'\\')).map(|i| i + from);
            prop_assert_eq!(find_byte(&hay, from, b'\\'), expected);
        }
    }
}
