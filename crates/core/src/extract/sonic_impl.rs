//! Key extraction with sonic-rs's lazy (on-demand) reader.
//!
//! The body's top-level entries are iterated with [`sonic_rs::to_object_iter`], which validates
//! each value while skipping it (SIMD) but builds nothing; `messages`, each message and its
//! parts are then walked lazily over the already-validated raw text, and the shared
//! canonical-text builder unescapes only the characters it keeps.
//!
//! Three checks close the gaps between sonic-rs's lazy validation and a full JSON parser, so
//! that this extractor accepts and refuses exactly what the serde_json one does:
//! - `\u` escapes must have four hex digits (sonic-rs's skipping does not look at them): one
//!   word-at-a-time scan for backslashes;
//! - nothing but whitespace may follow the closing brace (the lazy iterator stops there);
//! - nesting depth: sonic-rs skips nested values recursively with no depth limit, so a body
//!   of a million `[` would overflow the stack. A body that nests deeper than
//!   [`MAX_LAZY_DEPTH`] is refused before sonic-rs sees it, with the serde_json extractor's
//!   error.

use super::canon::{Api, Canon, JsonNode};
use super::text::{find_byte, nests_deeper_than};
use super::{with_scratch, ExtractError, KeyOptions, RequestInfo};
use crate::PrefixLength;
use sonic_rs::LazyValue;

/// Deepest nesting handed to sonic-rs's recursive skipping (deeper bodies are refused).
pub const MAX_LAZY_DEPTH: usize = super::MAX_DEPTH;

/// `POST /v1/chat/completions` with sonic-rs; same contract as [`super::chat_request`].
pub fn chat_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    extract(body, &KeyOptions::key_only(len), Api::Chat)
}

/// `POST /v1/completions` with sonic-rs; same contract as [`super::completion_request`].
pub fn completion_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    extract(body, &KeyOptions::key_only(len), Api::Completion)
}

pub(crate) fn extract(
    body: &[u8],
    opts: &KeyOptions,
    api: Api,
) -> Result<RequestInfo, ExtractError> {
    check_unicode_escapes(body)?;
    if nests_deeper_than(body, MAX_LAZY_DEPTH) {
        return Err(ExtractError::too_deep());
    }
    with_scratch(|scratch| {
        let mut canon = Canon::new(api, scratch, opts, body.len());
        let mut end: Option<usize> = None;
        for entry in sonic_rs::to_object_iter(body) {
            let (key, value) = entry.map_err(json_error)?;
            let raw = value.as_raw_str();
            end = Some(offset_in(body, raw)? + raw.len());
            canon.top_entry(&key, Lazy(value))?;
        }
        check_trailing(body, end)?;
        canon.finish()
    })
}

fn json_error(e: sonic_rs::Error) -> ExtractError {
    ExtractError::Json(e.to_string())
}

/// A lazily parsed value.
struct Lazy<'de>(LazyValue<'de>);

impl JsonNode for Lazy<'_> {
    fn raw(&self) -> &str {
        self.0.as_raw_str()
    }

    fn for_each_element(
        &self,
        mut f: impl FnMut(Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        let iter = self
            .0
            .clone()
            .into_array_iter()
            .ok_or_else(|| not_container("an array"))?;
        for v in iter {
            f(Lazy(v.map_err(json_error)?))?;
        }
        Ok(())
    }

    fn for_each_entry(
        &self,
        mut f: impl FnMut(&str, Self) -> Result<(), ExtractError>,
    ) -> Result<(), ExtractError> {
        let iter = self
            .0
            .clone()
            .into_object_iter()
            .ok_or_else(|| not_container("an object"))?;
        for e in iter {
            let (k, v) = e.map_err(json_error)?;
            f(&k, Lazy(v))?;
        }
        Ok(())
    }
}

fn not_container(what: &str) -> ExtractError {
    ExtractError::Json(format!("expected {what}"))
}

/// Byte offset of `raw` (a slice of `body` handed out by sonic-rs) within `body`.
fn offset_in(body: &[u8], raw: &str) -> Result<usize, ExtractError> {
    (raw.as_ptr() as usize)
        .checked_sub(body.as_ptr() as usize)
        .filter(|off| off + raw.len() <= body.len())
        .ok_or_else(|| ExtractError::Json("value outside the request body".into()))
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// After the last value (or the opening brace of an empty object): whitespace, `}`, whitespace.
fn check_trailing(body: &[u8], end: Option<usize>) -> Result<(), ExtractError> {
    let start = match end {
        Some(e) => e,
        None => body
            .iter()
            .position(|&b| !is_ws(b))
            .map_or(body.len(), |i| i + 1),
    };
    let mut rest = body
        .get(start..)
        .unwrap_or_default()
        .iter()
        .copied()
        .skip_while(|&b| is_ws(b));
    if rest.next() != Some(b'}') {
        return Err(ExtractError::Json(
            "expected '}' at the end of the object".into(),
        ));
    }
    if rest.any(|b| !is_ws(b)) {
        return Err(ExtractError::Json(
            "trailing characters after the JSON object".into(),
        ));
    }
    Ok(())
}

/// Every `\u` escape is followed by four hex digits. Backslashes only occur inside strings in
/// JSON, and each starts an escape, so walking from one to the next is exact on valid input.
fn check_unicode_escapes(body: &[u8]) -> Result<(), ExtractError> {
    let mut i = 0usize;
    while let Some(j) = find_byte(body, i, b'\\') {
        if body.get(j + 1) == Some(&b'u') {
            let ok = body
                .get(j + 2..j + 6)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
            if !ok {
                return Err(ExtractError::Json(format!(
                    "invalid \\u escape at byte {j}"
                )));
            }
            i = j + 6;
        } else {
            i = j + 2;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::serde_impl;
    use super::*;

    #[test]
    fn escape_check() {
        assert!(check_unicode_escapes(br#"{"a":"\u00e9\\u\n"}"#).is_ok());
        assert!(check_unicode_escapes(br#"{"a":"\uZZZZ"}"#).is_err());
        assert!(check_unicode_escapes(br#"{"a":"\u12"}"#).is_err());
    }

    #[test]
    fn depth_bound() {
        let shallow = format!("{{\"a\":\"{}\"}}", "[".repeat(1000));
        assert!(!nests_deeper_than(shallow.as_bytes(), 128));
        let deep = format!("{{\"a\":{}", "[".repeat(1000));
        assert!(nests_deeper_than(deep.as_bytes(), 128));
        let escaped = format!("{{\"a\":\"\\\"{}\"}}", "[".repeat(1000));
        assert!(!nests_deeper_than(escaped.as_bytes(), 128));
        // Both back ends refuse a deep unused field, with the same error.
        let body = format!(
            r#"{{"unused":{}{},"messages":[{{"role":"user","content":"x"}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let len = PrefixLength::new(1024).unwrap_or_else(|e| panic!("{e}"));
        let sonic = chat_request(body.as_bytes(), len);
        let serde = serde_impl::chat_request(body.as_bytes(), len);
        assert!(
            matches!(&sonic, Err(ExtractError::Json(m)) if m.contains("deeper than 128")),
            "{sonic:?}"
        );
        assert_eq!(sonic, serde);
        // Shallow enough for sonic-rs's recursive skipping in a debug build's 2 MiB test
        // thread (it overflows at about 40 levels there; a release build takes 128).
        let ok = format!(
            r#"{{"unused":{}{},"messages":[{{"role":"user","content":"x"}}]}}"#,
            "[".repeat(10),
            "]".repeat(10)
        );
        assert!(chat_request(ok.as_bytes(), len).is_ok());
        assert!(serde_impl::chat_request(ok.as_bytes(), len).is_ok());
    }

    #[test]
    fn trailing() {
        assert!(check_trailing(b" {} ", None).is_ok());
        assert!(check_trailing(b"{\"a\":1 } x", Some(6)).is_err());
        assert!(check_trailing(b"{\"a\":1 }\n", Some(6)).is_ok());
    }
}
