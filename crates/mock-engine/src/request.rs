//! Parsing and checking OpenAI request bodies; every refusal names the field at fault.

use serde_json::{Map, Value};

use crate::api_error::ApiError;
use crate::config::{DEFAULT_MAX_TOKENS, MAX_OUTPUT_TOKENS};
use prefix_router_tokenize::{ChatTokenizer, Message};

use crate::responses::{self, ResponseStore, Turn};
use crate::tokenizer::{PromptTokens, Tokenizer};

/// Which API shape a request uses (and its response takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApiKind {
    /// `/v1/chat/completions`: `messages` in, `chat.completion` out.
    Chat,
    /// `/v1/completions`: `prompt` in, `text_completion` out.
    Completion,
    /// `/v1/responses`: `instructions` and `input` in, `response` out ([`crate::responses`]).
    Responses,
}

/// A checked inference request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Inference {
    pub kind: ApiKind,
    pub model: String,
    pub prompt: PromptTokens,
    pub max_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    /// A Responses request that asks to be stored (`store`, true by default): its messages, for
    /// the answer to be stored with.
    pub conversation: Option<Vec<Turn>>,
}

/// vLLM's refusal of `stream_options` on a request that does not stream (400).
pub(crate) const STREAM_OPTIONS_WITHOUT_STREAM: &str =
    "Stream options can only be defined when `stream=True`.";

/// Parses a body for `kind`; with `kind == None` (native `/invocations`) the shape is chosen by
/// the body (`messages`: chat, `prompt`: completion). A missing or empty `model` means
/// `default_model` (the served model, as vLLM takes it).
#[cfg(test)]
pub(crate) fn parse(
    kind: Option<ApiKind>,
    body: &[u8],
    default_model: Option<&str>,
    block_tokens: u32,
    tokenizer: Option<&ChatTokenizer>,
) -> Result<Inference, ApiError> {
    parse_in(
        kind,
        body,
        default_model,
        block_tokens,
        tokenizer,
        &ResponseStore::default(),
    )
}

/// As [`parse`], with the responses this engine stored (a Responses request may continue one).
pub(crate) fn parse_in(
    kind: Option<ApiKind>,
    body: &[u8],
    default_model: Option<&str>,
    block_tokens: u32,
    tokenizer: Option<&ChatTokenizer>,
    store: &ResponseStore,
) -> Result<Inference, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::bad_body("the body must be a JSON object"));
    };
    let kind = match kind {
        Some(k) => k,
        None if obj.contains_key("messages") => ApiKind::Chat,
        None if obj.contains_key("prompt") => ApiKind::Completion,
        None => {
            return Err(ApiError::bad_body(
                "the body needs `messages` (chat) or `prompt` (completion)",
            ))
        }
    };
    // As vLLM: without `model` (or with an empty one), the model it serves.
    let model = match (obj.get("model"), default_model) {
        (Some(Value::String(m)), _) if !m.is_empty() => m.clone(),
        (None | Some(Value::Null), Some(d)) => d.to_owned(),
        (Some(Value::String(_)), Some(d)) => d.to_owned(),
        (None | Some(Value::Null), None) => {
            return Err(ApiError::invalid("model", "`model` is required"))
        }
        (Some(_), _) => {
            return Err(ApiError::invalid(
                "model",
                "`model` must be a non-empty string",
            ))
        }
    };
    let mut tok = Tokenizer::new(block_tokens);
    let mut texts = Texts::default();
    match kind {
        ApiKind::Chat => messages(&obj, &mut texts)?,
        ApiKind::Completion => prompt(&obj, &mut texts)?,
        ApiKind::Responses => responses::messages(&obj, store, &mut texts.0)?,
    }
    match tokenizer {
        // One token per word (the workload's text model).
        None => texts.0.iter().for_each(|(_, t)| tok.push_text(t)),
        // The model's own tokens: the template renders the messages, the tokenizer encodes.
        Some(t) => {
            let ids = match kind {
                ApiKind::Chat | ApiKind::Responses => {
                    let m: Vec<Message<'_>> = texts
                        .0
                        .iter()
                        .map(|(role, content)| Message { role, content })
                        .collect();
                    t.chat_ids(&m)
                }
                ApiKind::Completion => {
                    t.prompt_ids(texts.0.first().map_or("", |(_, p)| p.as_str()))
                }
            }
            .map_err(|e| {
                let field = match kind {
                    ApiKind::Chat => "messages",
                    ApiKind::Completion => "prompt",
                    ApiKind::Responses => "input",
                };
                ApiError::invalid(field, e.to_string())
            })?;
            ids.into_iter().for_each(|id| tok.push_token(u64::from(id)));
        }
    }
    let max_tokens = match (
        uint_field(&obj, "max_completion_tokens")?,
        uint_field(&obj, "max_tokens")?,
        uint_field(&obj, "max_output_tokens")?,
    ) {
        (_, _, Some(n)) if kind == ApiKind::Responses => n,
        (Some(n), _, _) => n,
        (None, Some(n), _) => n,
        _ => DEFAULT_MAX_TOKENS,
    };
    let conversation = match kind {
        ApiKind::Responses => match bool_field(&obj, "store", "store")? {
            Some(false) => None,
            _ => Some(texts.0.clone()),
        },
        _ => None,
    };
    let stream = bool_field(&obj, "stream", "stream")?.unwrap_or(false);
    if !stream && !matches!(obj.get("stream_options"), None | Some(Value::Null)) {
        return Err(ApiError::invalid(
            "stream_options",
            STREAM_OPTIONS_WITHOUT_STREAM,
        ));
    }
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            bool_field(o, "include_usage", "stream_options.include_usage")?.unwrap_or(false)
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    match obj.get("n") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(1) => {}
        Some(_) => return Err(ApiError::invalid("n", "only `n` = 1 is supported")),
    }
    Ok(Inference {
        kind,
        model,
        prompt: tok.finish(),
        max_tokens,
        stream,
        include_usage,
        conversation,
    })
}

/// The prompt's texts: `(role, content)` of each message in order (a completion prompt is one,
/// with no role). Text parts of one content are joined by a newline.
#[derive(Debug, Default)]
struct Texts(Vec<(String, String)>);

/// Reads `messages`: every message's role and text content, in order.
fn messages(obj: &Map<String, Value>, texts: &mut Texts) -> Result<(), ApiError> {
    let list = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must not be empty",
            ))
        }
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(_) => return Err(ApiError::invalid("messages", "`messages` must be an array")),
    };
    for (i, m) in list.iter().enumerate() {
        let Value::Object(m) = m else {
            return Err(ApiError::invalid(
                format!("messages[{i}]"),
                "each message must be an object",
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r))
                if matches!(
                    r.as_str(),
                    "system" | "developer" | "user" | "assistant" | "tool"
                ) =>
            {
                r.clone()
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    "`role` must be one of system, developer, user, assistant, tool",
                ))
            }
        };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            Some(Value::Array(parts)) => text_parts(parts, &["text"], |j| {
                ApiError::invalid(
                    format!("messages[{i}].content[{j}]"),
                    "content parts must be {\"type\":\"text\",\"text\":\"...\"}",
                )
            })?,
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("messages[{i}].content"),
                    "`content` must be a string or an array of text parts",
                ))
            }
        };
        texts.0.push((role, content));
    }
    Ok(())
}

/// The `text` of content parts whose `type` is one of `kinds`, joined by a newline; `bad(j)` is
/// the error for part `j` of another kind (or without a string `text`).
pub(crate) fn text_parts(
    parts: &[Value],
    kinds: &[&str],
    bad: impl Fn(usize) -> ApiError,
) -> Result<String, ApiError> {
    let mut joined: Vec<&str> = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        match (p.get("type").and_then(Value::as_str), p.get("text")) {
            (Some(t), Some(Value::String(text))) if kinds.contains(&t) => joined.push(text),
            _ => return Err(bad(j)),
        }
    }
    Ok(joined.join("\n"))
}

/// Reads `prompt`: a string, or an array holding one string.
fn prompt(obj: &Map<String, Value>, texts: &mut Texts) -> Result<(), ApiError> {
    match obj.get("prompt") {
        Some(Value::String(s)) => texts.0.push((String::new(), s.clone())),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => texts.0.push((String::new(), s.clone())),
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` must be a string or an array of exactly one string",
                ))
            }
        },
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(_) => return Err(ApiError::invalid("prompt", "`prompt` must be a string")),
    }
    Ok(())
}

/// An optional output length field: absent or null, or an integer in 1..=MAX_OUTPUT_TOKENS.
fn uint_field(obj: &Map<String, Value>, name: &str) -> Result<Option<u32>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u64::from(MAX_OUTPUT_TOKENS)).contains(&n) => Ok(Some(n as u32)),
            _ => Err(ApiError::invalid(
                name,
                format!("`{name}` must be an integer from 1 to {MAX_OUTPUT_TOKENS}"),
            )),
        },
    }
}

/// An optional boolean field.
fn bool_field(obj: &Map<String, Value>, name: &str, param: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(
            param,
            format!("`{param}` must be a boolean"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<Inference, ApiError> {
        parse(Some(ApiKind::Chat), body.as_bytes(), None, 16, None)
    }

    fn param(r: Result<Inference, ApiError>) -> Option<String> {
        r.unwrap_err().param
    }

    #[test]
    fn chat_counts_content_words_only() {
        let r = chat(
            r#"{"model":"m","messages":[{"role":"system","content":"a b c"},
                {"role":"user","content":[{"type":"text","text":"d e"}]}],
                "max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!(r.prompt.tokens, 5);
        assert_eq!((r.max_tokens, r.stream, r.include_usage), (5, true, true));
        assert_eq!(r.model, "m");
    }

    #[test]
    fn max_completion_tokens_wins_and_default_applies() {
        let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":3,"max_completion_tokens":7}"#).unwrap();
        assert_eq!(r.max_tokens, 7);
        let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn bad_fields_are_named() {
        let ok_msgs = r#""messages":[{"role":"user","content":"x"}]"#;
        assert_eq!(
            param(chat(&format!("{{{ok_msgs}}}"))).as_deref(),
            Some("model")
        );
        assert_eq!(
            param(chat(r#"{"model":"m","messages":[]}"#)).as_deref(),
            Some("messages")
        );
        assert_eq!(
            param(chat(
                r#"{"model":"m","messages":[{"role":"bot","content":"x"}]}"#
            ))
            .as_deref(),
            Some("messages[0].role")
        );
        assert_eq!(
            param(chat(
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#
            ))
            .as_deref(),
            Some("messages[0].content")
        );
        for (field, v) in [
            ("max_tokens", "0"),
            ("max_tokens", "-1"),
            ("max_tokens", "\"9\""),
            ("max_completion_tokens", "100000000"),
            ("stream", "1"),
            ("n", "2"),
        ] {
            let body = format!(r#"{{"model":"m",{ok_msgs},"{field}":{v}}}"#);
            assert_eq!(param(chat(&body)).as_deref(), Some(field), "{body}");
        }
        let body = format!(
            r#"{{"model":"m",{ok_msgs},"stream":true,"stream_options":{{"include_usage":"yes"}}}}"#
        );
        assert_eq!(
            param(chat(&body)).as_deref(),
            Some("stream_options.include_usage")
        );
        // vLLM refuses stream options on a request that does not stream.
        let body =
            format!(r#"{{"model":"m",{ok_msgs},"stream_options":{{"include_usage":true}}}}"#);
        assert_eq!(param(chat(&body)).as_deref(), Some("stream_options"));
        // Without `model`, or with an empty one, the model it serves (as vLLM).
        let served = |b: &str| parse(Some(ApiKind::Chat), b.as_bytes(), Some("served"), 16, None);
        for body in [
            format!("{{{ok_msgs}}}"),
            format!(r#"{{"model":"",{ok_msgs}}}"#),
        ] {
            assert_eq!(
                served(&body).map(|r| r.model).ok().as_deref(),
                Some("served")
            );
        }
        assert!(chat("{not json").is_err());
        assert!(chat("[1]").is_err());
    }

    #[test]
    fn completion_prompt_shapes() {
        let p = |b: &str| parse(Some(ApiKind::Completion), b.as_bytes(), None, 16, None);
        assert_eq!(
            p(r#"{"model":"m","prompt":"a b"}"#).unwrap().prompt.tokens,
            2
        );
        assert_eq!(
            p(r#"{"model":"m","prompt":["a b c"]}"#)
                .unwrap()
                .prompt
                .tokens,
            3
        );
        assert_eq!(
            param(p(r#"{"model":"m","prompt":["a","b"]}"#)).as_deref(),
            Some("prompt")
        );
        assert_eq!(param(p(r#"{"model":"m"}"#)).as_deref(), Some("prompt"));
    }

    #[test]
    fn native_detects_the_shape_and_defaults_the_model() {
        let r = parse(None, br#"{"prompt":"a"}"#, Some("base"), 16, None).unwrap();
        assert_eq!((r.kind, r.model.as_str()), (ApiKind::Completion, "base"));
        let r = parse(
            None,
            br#"{"messages":[{"role":"user","content":"a"}]}"#,
            Some("base"),
            16,
            None,
        )
        .unwrap();
        assert_eq!(r.kind, ApiKind::Chat);
        assert!(parse(None, br#"{"x":1}"#, Some("base"), 16, None).is_err());
    }
}
