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
//! - Responses (`/v1/responses`): `instructions` as a message of role `system`, then `input`: a
//!   string as one message of role `user`; an array of items, each as a message (role, U+001F,
//!   content, U+001E): a message item's role and content (the `text` of `input_text`,
//!   `output_text` and `text` parts, other parts as in chat); a `function_call` as U+001D, its
//!   `name`, U+001F, its `arguments`; a `function_call_output` as role `tool` with its `output`;
//!   any other item (reasoning, item references, built-in tools' calls) as U+FFFC and its hash,
//!   as a non-text part. `instructions` come first whatever the fields' order in the body (the
//!   engine renders them first, and the OpenAI Python SDK writes `input` before them).
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
#[cfg(test)]
mod responses_tests;
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
    /// The Responses API's `previous_response_id` (`None` for other APIs): the response the
    /// request continues, stored by the instance that gave it.
    pub previous_response_id: Option<String>,
    /// A Responses API request whose response the engine stores (`store` not false): its id is
    /// worth remembering. False for other APIs.
    pub stores_response: bool,
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

/// `POST /v1/responses` with the chain as `opts` asks: the router's entry point. The text is
/// `instructions` as a system message, then `input`'s items as messages (see
/// [`canon`]'s `Canon::input`), whatever the fields' order in the body.
pub fn responses_route(body: &[u8], opts: &KeyOptions) -> Result<RequestInfo, ExtractError> {
    scan_impl::extract(body, opts, canon::Api::Responses)
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

/// The body as text, once it is known to be UTF-8 and nested at most [`MAX_DEPTH`] deep: the
/// checks the serde_json and own readers make before reading, in this order, so that both give
/// these errors first. simdutf8 picks AVX2/SSE4.2 at run time (~10x faster than
/// `std::str::from_utf8` on non-ASCII text); serde_json would otherwise skip the UTF-8 check for
/// ignored strings. Depth: serde_json limits the nesting of what it parses, not of what it
/// skips (an unused field, a raw value), and a body nested 10,000 deep may crash the engine's
/// parser.
pub(crate) fn checked_body(body: &[u8]) -> Result<&str, ExtractError> {
    let text = simdutf8::basic::from_utf8(body).map_err(|_| utf8_error(body))?;
    if text::nests_deeper_than(body, MAX_DEPTH) {
        return Err(ExtractError::too_deep());
    }
    Ok(text)
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

/// The buffers one extraction writes into, reused across requests on a thread.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The key's text: never more than `prefix_length` characters (at most 4 x 65,536 bytes).
    pub(crate) key: String,
    /// A chain block that spans decoded pieces: one block at most.
    pub(crate) pending: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch {
            key: String::new(),
            pending: Vec::new(),
        })
    };
}

/// Runs `f` with this thread's scratch buffers (fresh ones if they are unavailable: a nested
/// extraction, or a thread being torn down).
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut scratch = SCRATCH
        .try_with(|b| b.try_borrow_mut().map(|mut b| std::mem::take(&mut *b)).ok())
        .ok()
        .flatten()
        .unwrap_or_default();
    let r = f(&mut scratch);
    scratch.key.clear();
    scratch.pending.clear();
    let _ = SCRATCH.try_with(|b| {
        if let Ok(mut slot) = b.try_borrow_mut() {
            *slot = scratch;
        }
    });
    r
}

#[cfg(test)]
mod tests;
