//! Reading an OpenAI-style server-sent-event stream: splitting bytes into events and reading
//! each event's JSON chunk.
//!
//! Lines end in `\n` or `\r\n` (what every OpenAI-compatible server sends; a bare `\r` line end
//! is not supported). Comment lines (`:`) and fields other than `data` are ignored; several
//! `data` lines of one event are joined with `\n`, as the SSE specification says.

use serde::Deserialize;

/// Longest line accepted; a stream that exceeds it is malformed, not a reason to run out of
/// memory.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Why a stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// A line was longer than [`MAX_LINE_BYTES`].
    #[error("SSE line longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    /// One event's `data` lines together were longer than [`MAX_LINE_BYTES`] (many lines and no
    /// blank line to end the event).
    #[error("SSE event's data longer than {MAX_LINE_BYTES} bytes")]
    EventTooLong,
    /// A line was not UTF-8.
    #[error("SSE line is not UTF-8")]
    NotUtf8,
    /// An event's data was not a chunk object.
    #[error("bad chunk JSON: {0}")]
    BadJson(String),
}

/// Incremental SSE splitter: feed bytes as they arrive, get complete events' data.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, unfinished line.
    line: Vec<u8>,
    /// Data of the current event so far.
    data: String,
    /// Whether the current event has a `data` field (an empty one counts).
    has_data: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes`; appends the data of every event they complete to `events`.
    pub fn push(&mut self, mut bytes: &[u8], events: &mut Vec<String>) -> Result<(), StreamError> {
        while let Some(pos) = bytes.iter().position(|&b| b == b'\n') {
            if self.line.len() + pos > MAX_LINE_BYTES {
                return Err(StreamError::LineTooLong);
            }
            self.line.extend_from_slice(&bytes[..pos]);
            bytes = &bytes[pos + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.line_done(&line, events)?;
            // Reuse the allocation for the next line.
            line.clear();
            self.line = line;
        }
        if self.line.len() + bytes.len() > MAX_LINE_BYTES {
            return Err(StreamError::LineTooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// Ends the stream: an event still open (no blank line after it) is dispatched.
    pub fn finish(&mut self, events: &mut Vec<String>) -> Result<(), StreamError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, events)?;
        }
        self.dispatch(events);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], events: &mut Vec<String>) -> Result<(), StreamError> {
        if line.is_empty() {
            self.dispatch(events);
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| StreamError::NotUtf8)?;
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            if self.data.len() + value.len() + 1 > MAX_LINE_BYTES {
                return Err(StreamError::EventTooLong);
            }
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        Ok(())
    }

    fn dispatch(&mut self, events: &mut Vec<String>) {
        if self.has_data {
            events.push(std::mem::take(&mut self.data));
            self.has_data = false;
        }
    }
}

/// Token counts from a chunk's (or a whole response's) `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
}

/// What one event of the stream said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// `data: [DONE]`: the stream is complete.
    Done,
    /// A chunk object.
    Data {
        /// Whether it carries generated text (`delta.content`, `delta.reasoning_content` or a
        /// completion's `text`, non-empty).
        content: bool,
        /// Its `usage`, when present and not null.
        usage: Option<Usage>,
        /// Its `error` message, when the server reports a failure inside the stream.
        error: Option<String>,
    },
}

#[derive(Deserialize)]
struct ChunkJson {
    #[serde(default)]
    choices: Vec<ChoiceJson>,
    #[serde(default)]
    usage: Option<UsageJson>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ChoiceJson {
    #[serde(default)]
    delta: Option<TextJson>,
    #[serde(default)]
    message: Option<TextJson>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct TextJson {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
}

#[derive(Deserialize)]
struct UsageJson {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<DetailsJson>,
}

#[derive(Deserialize)]
struct DetailsJson {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl TextJson {
    fn has_text(&self) -> bool {
        let non_empty = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
        non_empty(&self.content) || non_empty(&self.reasoning_content)
    }
}

/// Reads one event's data: `[DONE]` or a chunk object (a streamed chunk, or a whole
/// non-streamed response, whose `message` counts as content).
pub fn parse_chunk(data: &str) -> Result<Chunk, StreamError> {
    if data.trim() == "[DONE]" {
        return Ok(Chunk::Done);
    }
    let json: ChunkJson =
        serde_json::from_str(data).map_err(|e| StreamError::BadJson(e.to_string()))?;
    let content = json.choices.iter().any(|c| {
        c.delta.as_ref().is_some_and(TextJson::has_text)
            || c.message.as_ref().is_some_and(TextJson::has_text)
            || c.text.as_deref().is_some_and(|t| !t.is_empty())
    });
    let usage = json.usage.map(|u| Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
    });
    let error = json.error.filter(|e| !e.is_null()).map(|e| match e {
        serde_json::Value::Object(ref m) => {
            match (
                m.get("message").and_then(|v| v.as_str()),
                m.get("code").and_then(|v| v.as_str()),
            ) {
                (Some(msg), Some(code)) => format!("{msg} ({code})"),
                (Some(msg), None) => msg.to_string(),
                _ => e.to_string(),
            }
        }
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    });
    Ok(Chunk::Data {
        content,
        usage,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Result<Vec<String>, StreamError> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out)?;
        }
        p.finish(&mut out)?;
        Ok(out)
    }

    #[test]
    fn events_across_arbitrary_splits() {
        let stream = b"data: {\"a\":1}\n\n: comment\r\ndata: x\r\ndata: y\r\n\r\nevent: e\nid: 3\ndata: [DONE]\n\n";
        let expected = vec!["{\"a\":1}".to_string(), "x\ny".into(), "[DONE]".into()];
        assert_eq!(split(&[stream]), Ok(expected.clone()));
        for cut in 0..stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(split(&[a, b]), Ok(expected.clone()), "cut at {cut}");
        }
        let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(split(&bytewise), Ok(expected));
    }

    #[test]
    fn unterminated_last_event_is_dispatched() {
        assert_eq!(split(&[b"data:[DONE]"]), Ok(vec!["[DONE]".into()]));
        assert_eq!(split(&[b"retry: 5\n\n"]), Ok(vec![]));
    }

    #[test]
    fn an_event_that_never_ends_is_bounded_like_a_line() {
        let mut p = SseParser::new();
        let mut events = Vec::new();
        let line = format!("data: {}\n", "x".repeat(1 << 20));
        let mut result = Ok(());
        for _ in 0..17 {
            result = p.push(line.as_bytes(), &mut events);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(StreamError::EventTooLong));
        assert!(p.data.len() <= MAX_LINE_BYTES);
        assert!(events.is_empty());
    }

    #[test]
    fn bad_bytes_are_errors() {
        assert_eq!(split(&[b"data: \xff\xfe\n\n"]), Err(StreamError::NotUtf8));
    }

    #[test]
    fn chunks() {
        assert_eq!(parse_chunk("[DONE]"), Ok(Chunk::Done));
        let c =
            parse_chunk(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
        assert_eq!(
            c,
            Ok(Chunk::Data {
                content: false,
                usage: None,
                error: None
            })
        );
        let c = parse_chunk(r#"{"choices":[{"delta":{"content":"hi"}}],"usage":null}"#);
        assert!(matches!(
            c,
            Ok(Chunk::Data {
                content: true,
                usage: None,
                ..
            })
        ));
        let c = parse_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":64}}}"#,
        );
        let want = Usage {
            prompt_tokens: Some(100),
            completion_tokens: Some(7),
            cached_tokens: Some(64),
        };
        assert!(matches!(c, Ok(Chunk::Data { content: false, usage: Some(u), .. }) if u == want));
        let c = parse_chunk(r#"{"choices":[{"text":"x"}]}"#);
        assert!(matches!(c, Ok(Chunk::Data { content: true, .. })));
        let c = parse_chunk(r#"{"error":{"message":"boom","code":500}}"#);
        assert!(matches!(c, Ok(Chunk::Data { error: Some(ref m), .. }) if m == "boom"));
        assert!(matches!(
            parse_chunk("{not json"),
            Err(StreamError::BadJson(_))
        ));
        assert!(matches!(parse_chunk("[1,2]"), Err(StreamError::BadJson(_))));
    }
}
