//! Routing-key extraction from request bodies (native and OpenAI-compatible APIs).
//!
//! # Native API
//! The key is the first `prefix_length` **bytes** of the raw body (the whole body when shorter),
//! grouped by the `X-Prefix-Aware-Id` (or `X-Amzn-SageMaker-Prefix-Aware-Id`) header value.
//!
//! # OpenAI APIs: the canonical text
//! The key is the first `prefix_length` **characters** (Unicode scalar values; a character is
//! never cut) of a canonical text, grouped by `prompt_cache_key`. Separators are ASCII control
//! characters that JSON text rarely carries, so that field boundaries cannot be faked by content:
//!
//! - Chat (`messages`), for each message in order:
//!   `role`, U+001F ([`ROLE_SEPARATOR`]), the content, the tool calls, U+001E ([`MESSAGE_END`]).
//!   - content: a string as is; an array of parts contributes, in order, the `text` of each
//!     `{"type": "text"}` part, and for any other part (`image_url`, `input_audio`, `file`, ...)
//!     U+FFFC ([`PART_STAND_IN`]) followed by 16 lowercase hex digits of xxh3-64 (seed
//!     [`PART_SEED`]) of that part's JSON text as sent, so different images give different keys
//!     and the same request always gives the same key; null or absent content contributes nothing.
//!   - each assistant tool call: U+001D ([`TOOL_CALL_START`]), `function.name`, U+001F,
//!     `function.arguments` (absent or null values contribute nothing).
//! - Completions (`prompt`): a string as is; an array of strings joined by U+001E
//!   ([`PROMPT_SEPARATOR`]); an array of token ids as decimal numbers joined by a space; an array
//!   of token-id arrays, each rendered so, joined by U+001E.
//!
//! Types are checked everywhere in `messages`/`prompt`, also past the prefix: `role` a string,
//! `content` a string, an array of part objects with a string `type` (and a string `text` for
//! text parts) or null, `tool_calls` an array of objects or null. `model` must be a string,
//! `stream` a boolean, `prompt_cache_key` a valid group id (each may be null, meaning absent).
//! A repeated field of those is refused. Strings whose text is used must decode to valid
//! Unicode (an escaped unpaired surrogate is refused, naming the field).
//!
//! # Performance contract
//! No owned copy of the body is built: strings are borrowed raw and unescaped only up to the
//! prefix (in a reusable per-thread buffer of at most `prefix_length` characters); once the
//! prefix is full, text is no longer accumulated. The whole body is still validated as JSON,
//! and `model`/`prompt_cache_key` are found wherever they appear. Three back ends implement
//! this ([`scan_impl`], the router's own reader; [`serde_impl`]; [`sonic_impl`]); they are
//! differential-tested to agree (unit tests, proptests, fuzz targets), and the fastest,
//! [`scan_impl`], is the default (`BENCHMARKS.md`, "Key extraction from OpenAI chat bodies").

mod canon;
pub mod scan_impl;
pub mod serde_impl;
pub mod sonic_impl;
pub(crate) mod text;

pub use canon::PART_SEED;

use crate::chain::{Chain, ChainSpec};
use crate::{GroupError, GroupId, KeyHash, PrefixLength};
use std::cell::RefCell;

/// Between a message's role and its content; between a tool call's name and arguments.
pub const ROLE_SEPARATOR: char = '\u{1F}';
/// Ends each message.
pub const MESSAGE_END: char = '\u{1E}';
/// Starts each tool call.
pub const TOOL_CALL_START: char = '\u{1D}';
/// Starts the stand-in of a non-text content part.
pub const PART_STAND_IN: char = '\u{FFFC}';
/// Between the prompts (or token-id arrays) of a batched completion prompt.
pub const PROMPT_SEPARATOR: char = '\u{1E}';

/// What the router needs from a request body: its key, the model it names and whether it streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// Hash of (group, prefix).
    pub key: KeyHash,
    /// The canonical text's block chain (empty unless [`KeyOptions::chain`] asked for it).
    pub chain: Chain,
    /// `model` field, if any: selects eligible instances.
    pub model: Option<String>,
    /// `stream` field (false when absent).
    pub stream: bool,
}

/// How far extraction reads: the key's prefix and, when a strategy wants it, the block chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyOptions {
    /// Characters (bytes for the native API) of the routing key.
    pub prefix_length: PrefixLength,
    /// The block chain to compute, if any (read in the same pass, up to its own bound).
    pub chain: Option<ChainSpec>,
}

impl KeyOptions {
    /// Only the key (what `prefix-aware` needs): text beyond the prefix is never copied.
    pub fn key_only(prefix_length: PrefixLength) -> Self {
        Self {
            prefix_length,
            chain: None,
        }
    }

    /// Characters the canonical-text buffer keeps.
    pub(crate) fn max_chars(&self) -> usize {
        let chain = self.chain.map_or(0, |c| c.max_units as usize);
        self.prefix_length.get().max(chain)
    }
}

/// A request body the router cannot route; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtractError {
    /// Not JSON, or truncated.
    #[error("request body is not valid JSON: {0}")]
    Json(String),
    /// A field of the wrong type.
    #[error("field '{field}' must be {expected}")]
    FieldType {
        field: &'static str,
        expected: &'static str,
    },
    /// A required field is missing.
    #[error("missing required field '{0}'")]
    Missing(&'static str),
    /// Invalid routing group id.
    #[error("invalid routing group id: {0}")]
    Group(#[from] GroupError),
}

/// Deepest nesting of arrays and objects an OpenAI body may have (serde_json's own limit for
/// what it parses); deeper bodies are refused, wherever the nesting is.
pub const MAX_DEPTH: usize = 128;

impl ExtractError {
    /// A body nested deeper than [`MAX_DEPTH`], refused by both back ends alike.
    pub(crate) fn too_deep() -> Self {
        ExtractError::Json(format!("nested deeper than {MAX_DEPTH} arrays and objects"))
    }
}

/// Native API: the first `len` bytes of the raw body, group from the `X-Prefix-Aware-Id` header.
pub fn native_key(
    body: &[u8],
    group_header: Option<&[u8]>,
    len: PrefixLength,
) -> Result<KeyHash, ExtractError> {
    native_route(body, group_header, &KeyOptions::key_only(len)).map(|(key, _)| key)
}

/// `POST /v1/chat/completions` with the chain as `opts` asks: the router's entry point.
pub fn chat_route(body: &[u8], opts: &KeyOptions) -> Result<RequestInfo, ExtractError> {
    scan_impl::extract(body, opts, canon::Api::Chat)
}

/// `POST /v1/completions` with the chain as `opts` asks: the router's entry point.
pub fn completion_route(body: &[u8], opts: &KeyOptions) -> Result<RequestInfo, ExtractError> {
    scan_impl::extract(body, opts, canon::Api::Completion)
}

/// Native API key and (when asked) byte chain.
pub fn native_route(
    body: &[u8],
    group_header: Option<&[u8]>,
    opts: &KeyOptions,
) -> Result<(KeyHash, Chain), ExtractError> {
    let group = group_header.map(GroupId::parse).transpose()?;
    let group = group.as_ref().map(|g| g.as_str());
    let len = opts.prefix_length.get();
    let prefix = body.get(..len).unwrap_or(body);
    let chain = opts
        .chain
        .map(|spec| Chain::of_bytes(group, body, spec))
        .unwrap_or_default();
    Ok((KeyHash::new(group, prefix), chain))
}

/// `POST /v1/chat/completions`: key from `messages` (see the module documentation), `model`,
/// `stream`. Uses the fastest back end on our measurements, [`scan_impl`].
pub fn chat_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    scan_impl::chat_request(body, len)
}

/// `POST /v1/completions`: key from `prompt` (see the module documentation), `model`, `stream`.
/// Uses the fastest back end on our measurements, [`scan_impl`].
pub fn completion_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    scan_impl::completion_request(body, len)
}

/// The body as text, or the error naming the first byte that is not UTF-8. simdutf8 picks
/// AVX2/SSE4.2 at run time: ~10x faster than `std::str::from_utf8` on non-ASCII text.
pub(crate) fn checked_text(body: &[u8]) -> Result<&str, ExtractError> {
    simdutf8::basic::from_utf8(body).map_err(|_| utf8_error(body))
}

/// The error for a body that is not UTF-8, with the position (found again, on this rare path
/// only, by the standard library's validator, which reports it).
#[cold]
fn utf8_error(body: &[u8]) -> ExtractError {
    let at = std::str::from_utf8(body)
        .err()
        .map_or(0, |e| e.valid_up_to());
    ExtractError::Json(format!("invalid UTF-8 at byte {at}"))
}

thread_local! {
    /// The prefix buffer, reused across requests on a thread. It never grows beyond
    /// `prefix_length` characters (at most 4 x 65,536 bytes).
    static PREFIX_BUFFER: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f` with this thread's prefix buffer (a fresh one if it is unavailable).
pub(crate) fn with_prefix_buffer<R>(f: impl FnOnce(&mut String) -> R) -> R {
    let mut buf = PREFIX_BUFFER
        .try_with(|b| b.try_borrow_mut().map(|mut b| std::mem::take(&mut *b)).ok())
        .ok()
        .flatten()
        .unwrap_or_default();
    let r = f(&mut buf);
    buf.clear();
    let _ = PREFIX_BUFFER.try_with(|b| {
        if let Ok(mut slot) = b.try_borrow_mut() {
            *slot = buf;
        }
    });
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    type Extract = fn(&[u8], PrefixLength) -> Result<RequestInfo, ExtractError>;
    const CHAT: [(&str, Extract); 3] = [
        ("serde", serde_impl::chat_request),
        ("sonic", sonic_impl::chat_request),
        ("scan", scan_impl::chat_request),
    ];
    const COMPLETION: [(&str, Extract); 3] = [
        ("serde", serde_impl::completion_request),
        ("sonic", sonic_impl::completion_request),
        ("scan", scan_impl::completion_request),
    ];

    fn len(n: u64) -> PrefixLength {
        PrefixLength::new(n).unwrap_or_else(|e| panic!("{e}"))
    }

    fn key(group: Option<&str>, text: &str) -> KeyHash {
        KeyHash::new(group, text.as_bytes())
    }

    /// Every back end's answer, checked to agree with the first's.
    fn both(fs: [(&str, Extract); 3], body: &str) -> Result<RequestInfo, ExtractError> {
        let a = (fs[0].1)(body.as_bytes(), len(1024));
        for (name, f) in &fs[1..] {
            let b = f(body.as_bytes(), len(1024));
            // JSON syntax errors carry each parser's own message; everything else must be equal.
            if !matches!(
                (&a, &b),
                (Err(ExtractError::Json(_)), Err(ExtractError::Json(_)))
            ) {
                let shown: String = body.chars().take(200).collect();
                assert_eq!(a, b, "{} and {name} disagree on {shown}", fs[0].0);
            }
        }
        a
    }

    #[test]
    fn native_key_takes_bytes_and_group() {
        let body = vec![b'x'; 5000];
        let k = native_key(&body, None, len(1024));
        assert_eq!(k, Ok(KeyHash::new(None, &body[..1024])));
        assert_eq!(
            native_key(b"short", Some(b"t1"), len(1024)),
            Ok(KeyHash::new(Some("t1"), b"short"))
        );
        assert_eq!(
            native_key(b"short", Some(b""), len(1024)),
            Err(ExtractError::Group(GroupError::Length(0)))
        );
        assert!(matches!(
            native_key(b"x", Some(b"a\nb"), len(1024)),
            Err(ExtractError::Group(_))
        ));
    }

    #[test]
    fn chat_canonical_text() {
        let body = r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"content":"Hi \u00e9\n","role":"user"}],"stream":true}"#;
        let info = both(CHAT, body).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            info.key,
            key(None, "system\u{1F}Be brief.\u{1E}user\u{1F}Hi é\n\u{1E}")
        );
        assert_eq!(info.model.as_deref(), Some("m"));
        assert!(info.stream);
    }

    #[test]
    fn chat_parts_tool_calls_and_late_group() {
        let body = r#"{"messages":[
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/1.png"}},{"text":"b","type":"text"}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"arguments":"{\"q\":1}","name":"search"}}]}
        ],"prompt_cache_key":"tenant-7","model":null}"#;
        let info = both(CHAT, body).unwrap_or_else(|e| panic!("{e}"));
        let part = r#"{"type":"image_url","image_url":{"url":"http://x/1.png"}}"#;
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(part.as_bytes(), PART_SEED);
        let text = format!(
            "user\u{1F}a\u{FFFC}{h:016x}b\u{1E}assistant\u{1F}\u{1D}search\u{1F}{{\"q\":1}}\u{1E}"
        );
        assert_eq!(info.key, key(Some("tenant-7"), &text));
        assert_eq!(info.model, None);
        assert!(!info.stream);
        let other = body.replace("1.png", "2.png");
        assert_ne!(
            both(CHAT, &other).map(|i| i.key),
            Ok(info.key),
            "different images, different keys"
        );
    }

    #[test]
    fn chat_prefix_is_cut_at_characters() {
        let content = "é".repeat(3000);
        let body =
            format!(r#"{{"messages":[{{"role":"user","content":"{content}"}}],"model":"m"}}"#);
        let info = both(CHAT, &body).unwrap_or_else(|e| panic!("{e}"));
        let mut text = String::from("user\u{1F}");
        text.extend(std::iter::repeat_n('é', 1024 - 5));
        assert_eq!(info.key, key(None, &text));
        // Characters past the prefix do not matter, but they are still validated.
        let tail_differs = body.replace("\"}],", "x\"}],");
        assert_eq!(both(CHAT, &tail_differs).map(|i| i.key), Ok(info.key));
        let tail_malformed = body.replace("\"}],", "\\q\"}],");
        assert!(matches!(
            both(CHAT, &tail_malformed),
            Err(ExtractError::Json(_))
        ));
    }

    #[test]
    fn chat_errors_name_the_field() {
        use ExtractError::*;
        let cases: &[(&str, ExtractError)] = &[
            (r#"{"model":"m"}"#, Missing("messages")),
            (
                r#"{"messages":{}}"#,
                FieldType {
                    field: "messages",
                    expected: "an array of message objects",
                },
            ),
            (
                r#"{"messages":[1]}"#,
                FieldType {
                    field: "messages[]",
                    expected: "an object",
                },
            ),
            (
                r#"{"messages":[{"content":"x"}]}"#,
                Missing("messages[].role"),
            ),
            (
                r#"{"messages":[{"role":1}]}"#,
                FieldType {
                    field: "messages[].role",
                    expected: "a string",
                },
            ),
            (
                r#"{"messages":[{"role":"u","content":5}]}"#,
                FieldType {
                    field: "messages[].content",
                    expected: "a string, an array of content parts or null",
                },
            ),
            (
                r#"{"messages":[{"role":"u","content":[{"text":"x"}]}]}"#,
                Missing("messages[].content[].type"),
            ),
            (
                r#"{"messages":[{"role":"u","content":[{"type":"text"}]}]}"#,
                Missing("messages[].content[].text"),
            ),
            (
                r#"{"messages":[],"model":3}"#,
                FieldType {
                    field: "model",
                    expected: "a string",
                },
            ),
            (
                r#"{"messages":[],"stream":"yes"}"#,
                FieldType {
                    field: "stream",
                    expected: "a boolean",
                },
            ),
            (
                r#"{"messages":[],"prompt_cache_key":""}"#,
                Group(GroupError::Length(0)),
            ),
            (
                r#"{"messages":[],"prompt_cache_key":"a\u0001"}"#,
                Group(GroupError::NotPrintableAscii {
                    position: 1,
                    byte: 1,
                }),
            ),
            (
                r#"{"messages":[{"role":"u","content":"\ud800"}]}"#,
                FieldType {
                    field: "messages[].content",
                    expected: text::NO_LONE_SURROGATE,
                },
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(both(CHAT, body).as_ref(), Err(expected), "{body}");
        }
        let long_group = format!(
            r#"{{"messages":[],"prompt_cache_key":"{}"}}"#,
            "a".repeat(70)
        );
        assert_eq!(both(CHAT, &long_group), Err(Group(GroupError::Length(70))));
        for malformed in [
            "",
            "[]",
            "{",
            r#"{"messages":[{"role":"u","content":"x"}]"#,
            r#"{"messages":[]} x"#,
            r#"{"messages":[],"model":"a","model":"b"}"#,
            r#"{"messages":[],"x":"\uZZZZ"}"#,
            r#"{"messages":[],"x":01}"#,
            r#"{"messages":[],"x":[1,]}"#,
        ] {
            assert!(matches!(both(CHAT, malformed), Err(Json(_))), "{malformed}");
        }
        let bad_utf8 = b"{\"messages\":[],\"x\":\"\xff\"}";
        for (name, f) in CHAT {
            assert!(matches!(f(bad_utf8, len(1024)), Err(Json(_))), "{name}");
        }
    }

    #[test]
    fn completion_prompt_forms() {
        let cases = [
            (r#"{"prompt":"hello"}"#, "hello"),
            (r#"{"prompt":["a","b"]}"#, "a\u{1E}b"),
            (r#"{"prompt":[1,22,333]}"#, "1 22 333"),
            (r#"{"prompt":[[1,2],[],[3]]}"#, "1 2\u{1E}\u{1E}3"),
        ];
        for (body, text) in cases {
            assert_eq!(
                both(COMPLETION, body).map(|i| i.key),
                Ok(key(None, text)),
                "{body}"
            );
        }
        for bad in [
            r#"{"prompt":5}"#,
            r#"{"prompt":["a",1]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":[1.5]}"#,
            r#"{"prompt":[[1,"a"]]}"#,
        ] {
            assert!(
                matches!(
                    both(COMPLETION, bad),
                    Err(ExtractError::FieldType {
                        field: "prompt",
                        ..
                    })
                ),
                "{bad}"
            );
        }
        assert_eq!(
            both(COMPLETION, r#"{"messages":[]}"#),
            Err(ExtractError::Missing("prompt"))
        );
    }

    #[test]
    fn token_ids_followed_by_whitespace() {
        // Found by the `extract_completion` fuzz target: sonic-rs hands out the raw text of a
        // number in an array with the whitespace before the next `,`/`]`, and the sonic back end
        // refused `{"prompt":[22,3\r\r\r]}`, which serde_json accepts.
        for (body, text) in [
            ("{\"prompt\":[22,3\r\r\r]}", "22 3"),
            ("{\"prompt\":[1 ,\t2\n]}", "1 2"),
            ("{\"prompt\":[ [ 1 , 2 ] , [ 3 ] ]}", "1 2\u{1E}3"),
        ] {
            assert_eq!(
                both(COMPLETION, body).map(|i| i.key),
                Ok(key(None, text)),
                "{body:?}"
            );
        }
    }

    #[test]
    fn deep_nesting_neither_crashes_nor_differs() {
        // Refused, even in a field the key does not read: forwarded, it may crash the engine's
        // parser (Python's json gives up near 1,000 levels).
        let n = 100_000;
        let body = format!(
            r#"{{"x":{}{},"messages":[]}}"#,
            "[".repeat(n),
            "]".repeat(n)
        );
        assert!(
            matches!(both(CHAT, &body), Err(ExtractError::Json(m)) if m.contains("deeper than 128")),
            "{:?}",
            both(CHAT, &body)
        );
        let at_limit = format!(
            r#"{{"x":"{}","y":{}{},"messages":[]}}"#,
            "[".repeat(500),
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(serde_impl::chat_request(at_limit.as_bytes(), len(1024)).is_ok());
        // The own reader recurses once per level: 127 levels fit a 2 MiB test thread even in
        // a debug build.
        assert!(scan_impl::chat_request(at_limit.as_bytes(), len(1024)).is_ok());
        let unterminated = format!(r#"{{"x":{}"#, "[".repeat(n));
        assert!(both(CHAT, &unterminated).is_err());
    }

    #[test]
    fn keys_of_skipped_objects_are_not_decoded() {
        // Found by the `extract_chat` fuzz target against the own reader: serde_json does not
        // decode the keys of a value it skips, so a lone surrogate there is no error.
        let body =
            r#"{"messages":[{"x":[{"\uDDD0":1}],"role":"user","content":"c"}],"y":{"\uD800":2}}"#;
        assert!(both(CHAT, body).is_ok());
        let read = r#"{"messages":[],"\uD800":1}"#;
        assert!(matches!(both(CHAT, read), Err(ExtractError::Json(_))));
    }

    #[test]
    fn chains_agree_across_back_ends() {
        let opts = KeyOptions {
            prefix_length: len(1024),
            chain: Some(ChainSpec {
                block_units: 16,
                max_units: 4096,
            }),
        };
        let long = "word \\n\\u00e9 ".repeat(400);
        for body in [
            format!(
                r#"{{"messages":[{{"role":"system","content":"{long}"}},{{"role":"user","content":[{{"type":"text","text":"q"}}]}}],"prompt_cache_key":"t"}}"#
            ),
            format!(r#"{{"prompt":["{long}","b"]}}"#),
        ] {
            let api = if body.contains("prompt\":[") {
                canon::Api::Completion
            } else {
                canon::Api::Chat
            };
            let scan = scan_impl::extract(body.as_bytes(), &opts, api);
            assert_eq!(scan, serde_impl::extract(body.as_bytes(), &opts, api));
            assert_eq!(scan, sonic_impl::extract(body.as_bytes(), &opts, api));
            assert!(scan.is_ok_and(|i| i.chain.blocks.len() > 100));
        }
    }

    #[test]
    fn default_functions_match_back_ends() {
        let body = br#"{"messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(
            chat_request(body, len(1024)),
            sonic_impl::chat_request(body, len(1024))
        );
        let body = br#"{"prompt":"x"}"#;
        assert_eq!(
            completion_request(body, len(1024)),
            sonic_impl::completion_request(body, len(1024))
        );
    }
}
