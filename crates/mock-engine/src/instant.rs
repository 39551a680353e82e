//! Instant answers: no engine model, no tokenizer, no cache. Every inference request is answered
//! at once with its `max_tokens` of text (a stream sends them as chunks, usage last when asked).
//!
//! For measuring a proxy's own cost: what a proxy adds is the difference between the client's
//! latency through it and straight to the upstream, and that difference is readable only when
//! the upstream itself is cheap. So the body is only skimmed: the fields that shape the answer
//! are read, the prompt is skipped unparsed (`IgnoredAny`), and `prompt_tokens` is an estimate
//! (a quarter of the body's bytes), not a count. With no cache there is no cached count to
//! report either: `usage` has no `prompt_tokens_details`, as from vLLM without
//! `--enable-prompt-tokens-details`. (Reporting 0 cached tokens for every request made
//! `cache-aware` learn that each engine's cache holds about one block, a state no real engine
//! puts it in, and the cost benchmarks then measured that router instead of one whose
//! placements hold.)

use serde::de::IgnoredAny;
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::api_error::ApiError;
use crate::config::{DEFAULT_MAX_TOKENS, MAX_OUTPUT_TOKENS};
use crate::driver::Progress;
use crate::request::ApiKind;
use crate::request::STREAM_OPTIONS_WITHOUT_STREAM;

/// The fields of a request body an instant answer needs.
#[derive(Debug, Deserialize)]
struct Skim {
    model: Option<String>,
    messages: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
    max_tokens: Option<u32>,
    /// The Responses API's output bound.
    max_output_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// What an instant answer is made of.
#[derive(Debug)]
pub(crate) struct Instant {
    pub kind: ApiKind,
    pub model: String,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
}

/// Skims `body` for `kind` (`None`: native `/invocations`, shaped by its fields, with
/// `default_model` when `model` is missing). Malformed bodies are still a 400 naming the fault.
pub(crate) fn skim(
    kind: Option<ApiKind>,
    body: &[u8],
    default_model: Option<&str>,
) -> Result<Instant, ApiError> {
    let s: Skim = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("the body is not a valid request: {e}")))?;
    let kind = match kind {
        Some(k) => k,
        None if s.messages.is_some() => ApiKind::Chat,
        None if s.prompt.is_some() => ApiKind::Completion,
        None => {
            return Err(ApiError::bad_body(
                "the body needs `messages` (chat) or `prompt` (completion)",
            ))
        }
    };
    let model = match (s.model, default_model) {
        (Some(m), _) if !m.is_empty() => m,
        (_, Some(d)) => d.to_owned(),
        _ => return Err(ApiError::invalid("model", "`model` is required")),
    };
    let stream = s.stream.unwrap_or(false);
    if s.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            STREAM_OPTIONS_WITHOUT_STREAM,
        ));
    }
    let max_tokens = s
        .max_output_tokens
        .filter(|_| kind == ApiKind::Responses)
        .or(s.max_completion_tokens)
        .or(s.max_tokens)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    if !(1..=MAX_OUTPUT_TOKENS).contains(&max_tokens) {
        return Err(ApiError::invalid(
            "max_tokens",
            format!("`max_tokens` must be in 1..={MAX_OUTPUT_TOKENS}"),
        ));
    }
    Ok(Instant {
        kind,
        model,
        prompt_tokens: u32::try_from(body.len() / 4).unwrap_or(u32::MAX).max(1),
        max_tokens,
        stream,
        include_usage: s
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

/// The progress an engine would report, all of it at once: started (no cache to report on), each
/// token (a stream sends one chunk per token, as an engine's does), finished. The sender is
/// dropped, so the receiver ends after `Finished`.
pub(crate) fn progress(max_tokens: u32) -> mpsc::UnboundedReceiver<Progress> {
    let (tx, rx) = mpsc::unbounded_channel();
    let steps = std::iter::once(Progress::Started {
        cached_tokens: None,
    })
    .chain((1..=max_tokens).map(Progress::Generated))
    .chain(std::iter::once(Progress::Finished));
    for p in steps {
        // The receiver is alive: it is returned below.
        let _ = tx.send(p);
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skims_the_fields_that_shape_the_answer() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hello there"}],
            "max_completion_tokens":3,"max_tokens":9,"stream":true,
            "stream_options":{"include_usage":true},"temperature":0.5}"#;
        let i = skim(Some(ApiKind::Chat), body, None).unwrap();
        assert_eq!((i.model.as_str(), i.max_tokens), ("m", 3));
        assert!(i.stream && i.include_usage);
        assert_eq!(i.prompt_tokens as usize, body.len() / 4);
        let native = skim(None, br#"{"prompt":"x"}"#, Some("base")).unwrap();
        assert_eq!(
            (native.kind, native.model.as_str()),
            (ApiKind::Completion, "base")
        );
        assert_eq!(native.max_tokens, DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn bad_bodies_are_still_refused() {
        assert!(skim(Some(ApiKind::Chat), b"not json", None).is_err());
        assert!(skim(Some(ApiKind::Chat), br#"{"messages":[]}"#, None).is_err());
        assert!(skim(None, br#"{"model":"m"}"#, None).is_err());
        let e = skim(
            Some(ApiKind::Chat),
            br#"{"model":"m","max_tokens":70000}"#,
            None,
        );
        assert!(e.is_err());
    }
}
