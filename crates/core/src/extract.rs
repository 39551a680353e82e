//! Routing-key extraction from request bodies (native and OpenAI-compatible APIs).

use crate::{GroupError, KeyHash, PrefixLength};

/// What the router needs from a request body: its key, the model it names and whether it streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// Hash of (group, prefix).
    pub key: KeyHash,
    /// `model` field, if any: selects eligible instances.
    pub model: Option<String>,
    /// `stream` field (false when absent).
    pub stream: bool,
}

/// A request body the router cannot route; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtractError {
    /// Not JSON, or truncated.
    #[error("request body is not valid JSON: {0}")]
    Json(String),
    /// A field of the wrong type.
    #[error("field '{field}' must be {expected}")]
    FieldType { field: &'static str, expected: &'static str },
    /// A required field is missing.
    #[error("missing required field '{0}'")]
    Missing(&'static str),
    /// Invalid routing group id.
    #[error("invalid routing group id: {0}")]
    Group(#[from] GroupError),
}

/// Native API: the first `len` bytes of the raw body, group from the `X-Prefix-Aware-Id` header.
pub fn native_key(body: &[u8], group_header: Option<&[u8]>, len: PrefixLength) -> Result<KeyHash, ExtractError> {
    todo!("{body:?} {group_header:?} {len:?}")
}

/// `POST /v1/chat/completions`.
pub fn chat_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    todo!("{body:?} {len:?}")
}

/// `POST /v1/completions`.
pub fn completion_request(body: &[u8], len: PrefixLength) -> Result<RequestInfo, ExtractError> {
    todo!("{body:?} {len:?}")
}
