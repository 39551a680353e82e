//! Key extraction with the router's own JSON reader: one pass over the body, in the order of the
//! document, with the same visits as [`super::serde_impl`] (top-level object, `messages`, each
//! message) and the same shared canonical-text builder.
//!
//! Why a third reader: on a long prompt, serde_json's string skipping checks every byte for a
//! quote, a backslash or a control character eight bytes at a time in general-purpose registers
//! (about 2.4 instructions per byte under callgrind: a quarter of everything the router did for
//! a 16 KiB chat request). Here a string is crossed with vectorised searches ([`find_stop`]).
//!
//! It accepts and refuses exactly what the serde_json reader does, with the same typed errors
//! (syntax errors carry their own wording): a differential test over the extraction tests, a
//! proptest over generated bodies and the fuzz targets hold it to that. Rules it shares with
//! serde_json: RFC 8259 syntax (whitespace is space, tab, CR, LF; no trailing commas; numbers
//! without leading zeros; no control characters in strings; escapes `\" \\ \/ \b \f \n \r \t`
//! and `\uXXXX`), object keys that are read must be valid Unicode once unescaped (a lone
//! surrogate escape is refused) while skipped strings are not decoded; and a value of the wrong
//! type where `messages` or a message is expected is still read (a malformed or out-of-range one
//! is a syntax error) before the typed error is given.

use super::canon::{Api, Canon, JsonNode, MessageFields, TopField};
use super::text::{decode_json_str, hex4};
use super::{checked_body, with_scratch, ExtractError, KeyOptions, RequestInfo, MAX_DEPTH};
use crate::PrefixLength;
use std::borrow::Cow;

/// `POST /v1/chat/completions` with this reader; same contract as [`super::chat_request`].
pub fn chat_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    extract(body, &KeyOptions::key_only(len), Api::Chat)
}

/// `POST /v1/completions` with this reader; same contract as [`super::completion_request`].
pub fn completion_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    extract(body, &KeyOptions::key_only(len), Api::Completion)
}

pub(crate) fn extract(
    body: &[u8],
    opts: &KeyOptions,
    api: Api,
) -> Result<RequestInfo, ExtractError> {
    let text = checked_body(body)?;
    with_scratch(|scratch| {
        let mut canon = Canon::new(api, scratch, opts, body.len());
        let mut r = Reader::new(text);
        r.ws();
        if r.peek() != Some(b'{') {
            return Err(match r.value() {
                Ok(_) => ExtractError::Json("expected a JSON object".into()),
                Err(e) => e,
            });
        }
        if api == Api::Responses {
            responses_top(&mut r, &mut canon)?;
        } else {
            r.object(|r, key| top_entry(r, &mut canon, &key))?;
        }
        r.ws();
        if r.pos != text.len() {
            return Err(r.syntax("trailing characters"));
        }
        canon.finish()
    })
}

fn top_entry(r: &mut Reader<'_>, canon: &mut Canon<'_>, key: &str) -> Result<(), ExtractError> {
    let field = canon.top_field(key);
    canon.mark(field)?;
    match field {
        TopField::Main if canon.api() == Api::Chat => {
            r.open(
                b'[',
                ExtractError::FieldType {
                    field: "messages",
                    expected: "an array of message objects",
                },
            )?;
            r.array(|r| message(r, canon))
        }
        TopField::Other => r.value().map(drop),
        _ => {
            let raw = r.value()?;
            match field {
                TopField::Main => canon.prompt(Raw(raw)),
                f => canon.scalar(f, raw),
            }
        }
    }
}

/// A Responses body's top level: `instructions` and `input` are read whole first, then handed
/// over in that order ([`Canon::instructions`]).
fn responses_top(r: &mut Reader<'_>, canon: &mut Canon<'_>) -> Result<(), ExtractError> {
    let (mut instructions, mut input) = (None, None);
    r.object(|r, key| {
        let field = canon.top_field(&key);
        canon.mark(field)?;
        match field {
            TopField::Other => r.value().map(drop),
            TopField::Main => r.value().map(|v| input = Some(v)),
            TopField::Instructions => r.value().map(|v| instructions = Some(v)),
            f => canon.scalar(f, r.value()?),
        }
    })?;
    if let Some(raw) = instructions {
        canon.instructions(raw)?;
    }
    match input {
        Some(raw) => canon.input(Raw(raw)),
        None => Ok(()),
    }
}

fn message(r: &mut Reader<'_>, canon: &mut Canon<'_>) -> Result<(), ExtractError> {
    r.open(
        b'{',
        ExtractError::FieldType {
            field: "messages[]",
            expected: "an object",
        },
    )?;
    let mut fields: MessageFields<Raw<'_>> = MessageFields::default();
    r.object(|r, key| {
        if MessageFields::<Raw<'_>>::wants(&key) {
            let raw = r.value()?;
            fields.set(&key, Raw(raw))
        } else {
            r.value().map(drop)
        }
    })?;
    canon.message(fields)
}

/// A value's exact text, already read (hence valid JSON).
#[derive(Debug, Clone, Copy)]
struct Raw<'a>(&'a str);

impl JsonNode for Raw<'_> {
    fn raw(&self) -> &str {
        self.0
    }

    fn for_each_element(
        &self,
        mut f: impl FnMut(Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        let mut r = Reader::new(self.0);
        if r.peek() != Some(b'[') {
            return Err(ExtractError::Json("expected an array".into()));
        }
        r.array(|r| {
            let v = r.value()?;
            f(Raw(v))
        })
    }

    fn for_each_entry(
        &self,
        mut f: impl FnMut(&str, Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        let mut r = Reader::new(self.0);
        if r.peek() != Some(b'{') {
            return Err(ExtractError::Json("expected an object".into()));
        }
        r.object(|r, key| {
            let v = r.value()?;
            f(&key, Raw(v))
        })
    }
}

/// A cursor over JSON text. Every method leaves `pos` just past what it read.
struct Reader<'a> {
    s: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Reader<'a> {
    fn new(s: &'a str) -> Self {
        Self {
            s,
            pos: 0,
            depth: 0,
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.s.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    #[cold]
    fn syntax(&self, what: &str) -> ExtractError {
        ExtractError::Json(format!("{what} at byte {}", self.pos))
    }

    /// Reads one value (after optional whitespace) and returns its text.
    fn value(&mut self) -> Result<&'a str, ExtractError> {
        self.ws();
        let start = self.pos;
        match self.peek() {
            Some(b'"') => self.string().map(drop)?,
            Some(b'{') => self.nested(|r| r.skip_object())?,
            Some(b'[') => self.nested(|r| r.array(|r| r.value().map(drop)))?,
            Some(b't') => self.literal(b"true")?,
            Some(b'f') => self.literal(b"false")?,
            Some(b'n') => self.literal(b"null")?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            _ => return Err(self.syntax("expected a value")),
        }
        Ok(&self.s[start..self.pos])
    }

    /// Runs a container read one level deeper. The body's depth was checked before reading;
    /// this bound only makes the recursion's limit local and certain.
    fn nested(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        if self.depth >= MAX_DEPTH {
            return Err(ExtractError::too_deep());
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ExtractError> {
        if self.bytes().get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.syntax("invalid literal"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Result<(), ExtractError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.syntax("invalid number"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.syntax("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.syntax("invalid number"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.syntax("invalid number"));
            }
        }
        Ok(())
    }

    /// Crosses a string (at its opening quote): each run of plain text up to the next quote,
    /// backslash or control character ([`find_stop`]), each escape checked. Whether it held an
    /// escape.
    fn string(&mut self) -> Result<bool, ExtractError> {
        self.pos += 1;
        let mut escaped = false;
        loop {
            let rest = self.bytes().get(self.pos..).unwrap_or_default();
            let Some(at) = find_stop(rest) else {
                return Err(self.syntax("unterminated string"));
            };
            self.pos += at;
            match rest[at] {
                b'"' => {
                    self.pos += 1;
                    return Ok(escaped);
                }
                b'\\' => escaped = true,
                _ => return Err(self.syntax("control character in a string")),
            }
            // Escapes back to back (text sent ASCII-only is one `\uXXXX` after another) are
            // crossed here, without a search between them.
            loop {
                self.pos += self.escape_len()?;
                if self.bytes().get(self.pos) != Some(&b'\\') {
                    break;
                }
            }
        }
    }

    /// The length of the escape at `pos` (a backslash), checked. `\u` first and its digits
    /// through a table: a jump table over the escape letter and four branchy digit tests
    /// mispredicted enough to make a 1 MiB all-escaped body twice as slow as serde_json.
    #[inline(always)]
    fn escape_len(&self) -> Result<usize, ExtractError> {
        match self.bytes().get(self.pos + 1) {
            Some(b'u') if hex4(self.bytes(), self.pos + 2).is_some() => Ok(6),
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(2),
            _ => Err(self.syntax("invalid escape")),
        }
    }

    /// An object key (at its opening quote), unescaped; refused unless it is valid Unicode.
    fn key(&mut self) -> Result<Cow<'a, str>, ExtractError> {
        let start = self.pos;
        let escaped = self.string()?;
        let raw = &self.s[start..self.pos];
        let inner = &raw[1..raw.len() - 1];
        if !escaped {
            return Ok(Cow::Borrowed(inner));
        }
        let mut key = String::with_capacity(inner.len());
        decode_json_str(raw, "key", |piece| {
            key.push_str(piece);
            true
        })
        .map_err(|_| self.syntax("invalid escape in an object key"))?;
        Ok(Cow::Owned(key))
    }

    /// An object's entries (at `{`): `f` reads each value.
    fn object(
        &mut self,
        f: impl FnMut(&mut Self, Cow<'a, str>) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        self.entries(true, f)
    }

    /// An object no one reads (at `{`): its keys are crossed, not decoded, as serde_json's
    /// skipping does (a lone surrogate escape in such a key is not an error).
    fn skip_object(&mut self) -> Result<(), ExtractError> {
        self.entries(false, |r, _| r.value().map(drop))
    }

    fn entries(
        &mut self,
        read_keys: bool,
        mut f: impl FnMut(&mut Self, Cow<'a, str>) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        self.items(b'}', |r| {
            r.ws();
            if r.peek() != Some(b'"') {
                return Err(r.syntax("expected an object key"));
            }
            let key = if read_keys {
                r.key()?
            } else {
                r.string()?;
                Cow::Borrowed("")
            };
            r.ws();
            if r.peek() != Some(b':') {
                return Err(r.syntax("expected ':'"));
            }
            r.pos += 1;
            f(r, key)
        })
    }

    /// An array's elements (at `[`): `f` reads each one.
    fn array(
        &mut self,
        f: impl FnMut(&mut Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        self.items(b']', f)
    }

    /// A container's items (at its opening bracket), separated by commas, up to `close` (`]` or
    /// `}`); `item` reads each one.
    fn items(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        self.pos += 1;
        self.ws();
        if self.peek() == Some(close) {
            self.pos += 1;
            return Ok(());
        }
        loop {
            item(self)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(c) if c == close => {
                    self.pos += 1;
                    return Ok(());
                }
                _ if close == b']' => return Err(self.syntax("expected ',' or ']'")),
                _ => return Err(self.syntax("expected ',' or '}'")),
            }
        }
    }

    /// Whitespace, then the opening bracket `open` of the container a field must hold; for any
    /// other value, the `typed` error once the value is read as serde_json reads it.
    fn open(&mut self, open: u8, typed: ExtractError) -> Result<(), ExtractError> {
        self.ws();
        if self.peek() == Some(open) {
            Ok(())
        } else {
            Err(self.wrong_type(typed))
        }
    }

    /// `typed`, for a value of the wrong type where an object or array was expected, once the
    /// value is read as serde_json reads it: an array or object is not read further, a string
    /// must decode, a number must be in range; a malformed value gives its syntax error.
    fn wrong_type(&mut self, typed: ExtractError) -> ExtractError {
        match self.peek() {
            Some(b'[' | b'{') => typed,
            Some(b'"') => match self.key() {
                Ok(_) => typed,
                Err(e) => e,
            },
            _ => match self.value() {
                Ok(raw) if raw.parse::<f64>().is_ok_and(|x| x.is_infinite()) => {
                    self.syntax("number out of range")
                }
                Ok(_) => typed,
                Err(e) => e,
            },
        }
    }
}

/// Whether `c` ends a run of plain string text: a quote, a backslash or a control character.
#[inline(always)]
fn stops_a_run(c: u8) -> bool {
    // `|`, not `||`: no branch per test, so that a block's tests vectorise.
    (c == b'"') | (c == b'\\') | (c < 0x20)
}

/// The first quote, backslash or control character of `bytes`. Whether a block of [`SCAN`]
/// bytes holds one is an or-reduction over the block, which the compiler turns into vector
/// compares and ors with one horizontal step at the end; [`first_stop`] then finds it.
#[inline]
fn find_stop(bytes: &[u8]) -> Option<usize> {
    let mut blocks = bytes.chunks_exact(SCAN);
    let mut base = 0usize;
    for block in &mut blocks {
        let any = block
            .iter()
            .fold(0u8, |acc, &c| acc | u8::from(stops_a_run(c)));
        if any != 0 {
            return first_stop(block).map(|i| base + i);
        }
        base += SCAN;
    }
    first_stop(blocks.remainder()).map(|i| base + i)
}

/// Bytes per block of [`find_stop`]: long enough that the horizontal step is a small share,
/// short enough that a run ending early (an escape every line) does not read far past it.
/// Measured (instructions per extraction under callgrind, 16 KiB English / CJK bodies): 32
/// bytes 44.2k / 145k, 64 bytes 38.2k / 144k, 128 bytes 41.2k / 156k.
const SCAN: usize = 64;
/// Bytes per step of [`first_stop`].
const STEP: usize = 32;

/// The first stop in `bytes` (at most a [`SCAN`] block), [`STEP`] bytes at a time: the tests
/// as a byte array (vector compares again), read eight at a time as words.
#[inline]
fn first_stop(bytes: &[u8]) -> Option<usize> {
    let mut steps = bytes.chunks_exact(STEP);
    let mut base = 0usize;
    for step in &mut steps {
        let mut flags = [0u8; STEP];
        for (f, &c) in flags.iter_mut().zip(step) {
            *f = u8::from(stops_a_run(c));
        }
        for (k, w) in flags.chunks_exact(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            let word = u64::from_le_bytes(word);
            if word != 0 {
                return Some(base + k * 8 + (word.trailing_zeros() / 8) as usize);
            }
        }
        base += STEP;
    }
    steps
        .remainder()
        .iter()
        .position(|&c| stops_a_run(c))
        .map(|i| base + i)
}

#[cfg(test)]
mod tests;
