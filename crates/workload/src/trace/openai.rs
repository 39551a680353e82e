//! OpenAI request bodies as a trace: a JSONL file with one `/v1/chat/completions` or
//! `/v1/completions` body per line (blank lines are skipped), as a proxy or gateway logs them.
//!
//! ```json
//! {"model": "m", "messages": [{"role": "system", "content": "You are..."},
//!                             {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
//!  "max_tokens": 64, "timestamp": 1700000000.25, "prompt_cache_key": "tenant-a"}
//! {"model": "m", "prompt": "Once upon a time", "max_tokens": 32}
//! ```
//!
//! - `messages` (chat) or `prompt` (completions, a string): exactly one of them. Roles `system`
//!   and `developer` are system, `user` and `tool` are user, `assistant` is assistant; any other
//!   role is an error. `content` is a string, a list of parts (`text` parts are read, others
//!   such as `image_url` are skipped) or null. A body without any word is an error.
//! - Text is one token per whitespace-separated word, cut into segments of
//!   [`OPENAI_CHUNK_WORDS`] words ([`crate::text::text_segments`]) chained across the whole
//!   prompt, message boundaries included, so equal prompt openings give equal ids.
//! - `max_completion_tokens`, else `max_tokens`, else [`OPENAI_DEFAULT_OUTPUT_TOKENS`], is the
//!   output length (0 is read as 1: an engine generates at least one token).
//! - `prompt_cache_key` (a string) is the routing group; `model` the model.
//! - `timestamp` (optional, seconds): if every line has one, arrivals are seconds from the
//!   smallest, and requests are sorted by arrival (stably) and numbered in that order. If no
//!   line has one, lines arrive in file order one second apart (`--rate` rescales that to any
//!   mean rate). Some lines with one and some without is an error.
//!
//! Other fields (`stream`, `temperature`, `tools`, ...) are ignored.

use super::TraceError;
use crate::request::{Message, Request, Role, Segment};
use crate::text::{chunk_segments, text_segments};
use serde_json::{Map, Value};

/// Words per segment of an OpenAI body's text. Shared openings are found at segment
/// granularity: a document pasted into a user message and followed by different questions still
/// shares its leading chunks, which one segment per message would lose (the whole message's id
/// would differ). 64 words keeps memory bounded (a 16-byte segment per 64 words) while cache
/// blocks of 16 tokens are still matched to within a few blocks.
pub const OPENAI_CHUNK_WORDS: usize = 64;

/// Output tokens of a body that sets neither `max_completion_tokens` nor `max_tokens` (OpenAI's
/// own default is "until the context ends", which a replay cannot use): a typical chat answer.
pub const OPENAI_DEFAULT_OUTPUT_TOKENS: u32 = 128;

/// Parses OpenAI request bodies, one a line (see the module doc); `path` only labels errors.
/// Errors name the line and the field.
pub fn parse_openai_bodies(text: &str, path: &str) -> Result<Vec<Request>, TraceError> {
    let mut parsed: Vec<(usize, Option<f64>, Request)> = Vec::new();
    for (i, (n, l)) in super::numbered_lines(text).enumerate() {
        let (timestamp, request) = parse_body(l, i as u64)
            .and_then(|(t, q)| q.check_size().map(|()| (t, q)))
            .map_err(|why| TraceError::Line {
                path: path.to_string(),
                line: n,
                why,
            })?;
        parsed.push((n, timestamp, request));
    }
    let timed = parsed.iter().filter(|(_, t, _)| t.is_some()).count();
    if timed == 0 {
        // No clock in the file: file order, one a second, for --rate to rescale.
        for (_, _, r) in &mut parsed {
            r.arrival_s = r.id as f64;
        }
        return Ok(parsed.into_iter().map(|(_, _, r)| r).collect());
    }
    if let Some((n, _, _)) = parsed.iter().find(|(_, t, _)| t.is_none()) {
        return Err(TraceError::Line {
            path: path.to_string(),
            line: *n,
            why: "timestamp: every line needs one once any line has one".into(),
        });
    }
    let start = parsed
        .iter()
        .filter_map(|(_, t, _)| *t)
        .fold(f64::INFINITY, f64::min);
    let mut out: Vec<Request> = parsed
        .into_iter()
        .map(|(_, t, mut r)| {
            r.arrival_s = t.map_or(0.0, |t| t - start);
            r
        })
        .collect();
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    for (i, r) in out.iter_mut().enumerate() {
        r.id = i as u64;
    }
    Ok(out)
}

/// One body: its timestamp, if any, and its request numbered `id` (arrival 0, set by the caller).
fn parse_body(line: &str, id: u64) -> Result<(Option<f64>, Request), String> {
    let value: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let Value::Object(body) = value else {
        return Err("a line must be a JSON object (one request body)".into());
    };
    let messages = match (present(&body, "messages"), present(&body, "prompt")) {
        (Some(m), None) => chat_messages(m)?,
        (None, Some(p)) => {
            let text = p.as_str().ok_or("prompt: must be a string")?;
            let mut segments = Vec::new();
            text_segments(0, Role::User, text, OPENAI_CHUNK_WORDS, &mut segments);
            vec![Message::new(Role::User, segments)]
        }
        _ => return Err("needs exactly one of `messages` and `prompt`".into()),
    };
    if messages.iter().all(|m| m.segments.is_empty()) {
        return Err("prompt has no text".into());
    }
    let output_tokens = match present(&body, "max_completion_tokens") {
        Some(v) => count(v, "max_completion_tokens")?,
        None => match present(&body, "max_tokens") {
            Some(v) => count(v, "max_tokens")?,
            None => OPENAI_DEFAULT_OUTPUT_TOKENS,
        },
    };
    let timestamp = match present(&body, "timestamp") {
        Some(v) => Some(
            v.as_f64()
                .filter(|t| t.is_finite())
                .ok_or("timestamp: must be a number of seconds")?,
        ),
        None => None,
    };
    let request = Request {
        id,
        arrival_s: 0.0,
        group: string_field(&body, "prompt_cache_key")?,
        model: string_field(&body, "model")?,
        messages,
        output_tokens: output_tokens.max(1),
    };
    Ok((timestamp, request))
}

/// The field's value, unless it is missing or null (OpenAI clients send null for "not set").
fn present<'a>(body: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

fn string_field(body: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match present(body, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key}: must be a string")),
    }
}

fn count(v: &Value, key: &str) -> Result<u32, String> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("{key}: must be a whole number of tokens"))
}

fn role_of(role: &str) -> Option<Role> {
    match role {
        "system" | "developer" => Some(Role::System),
        "user" | "tool" => Some(Role::User),
        "assistant" => Some(Role::Assistant),
        _ => None,
    }
}

/// The messages of a chat body, their segments chained across the whole prompt.
fn chat_messages(messages: &Value) -> Result<Vec<Message>, String> {
    let list = messages.as_array().ok_or("messages: must be a list")?;
    let mut parent = 0u64;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m = m
            .as_object()
            .ok_or_else(|| format!("messages[{i}]: must be an object"))?;
        let role = match m.get("role") {
            Some(Value::String(r)) => {
                role_of(r).ok_or_else(|| format!("messages[{i}].role: unknown role `{r}`"))?
            }
            _ => return Err(format!("messages[{i}].role: must be a string")),
        };
        let texts = content_texts(present(m, "content"), i)?;
        let mut segments: Vec<Segment> = Vec::new();
        // Parts of one message run on as one text: chunks cross part boundaries, as the
        // engine's prompt does.
        let words = texts.iter().flat_map(|t| crate::text::tokens(t));
        parent = chunk_segments(parent, role, words, OPENAI_CHUNK_WORDS, &mut segments);
        // A message without words (an assistant's tool call, an image) stays, empty, so the
        // replayed body keeps the conversation's turns.
        out.push(Message::new(role, segments));
    }
    Ok(out)
}

/// The text of a message's `content`: a string, a list of parts (text parts kept, others such as
/// images skipped), or none.
fn content_texts(content: Option<&Value>, i: usize) -> Result<Vec<&str>, String> {
    match content {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.as_str()]),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let field = || format!("messages[{i}].content[{j}]");
                let p = p
                    .as_object()
                    .ok_or_else(|| format!("{}: must be an object", field()))?;
                if p.get("type").and_then(Value::as_str) != Some("text") {
                    continue;
                }
                match p.get("text") {
                    Some(Value::String(t)) => texts.push(t.as_str()),
                    _ => return Err(format!("{}.text: must be a string", field())),
                }
            }
            Ok(texts)
        }
        Some(_) => Err(format!(
            "messages[{i}].content: must be a string or a list of parts"
        )),
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
