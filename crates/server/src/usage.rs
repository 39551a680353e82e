//! Finding the engine's prompt usage in a response body as it streams by.
//!
//! Engines report `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens` in a
//! non-streaming JSON answer, and in a streamed answer in the chunk that carries usage (usually
//! the last before `data: [DONE]`, with `stream_options.include_usage`). Cache-aware routing
//! compares `cached_tokens` with what it predicted, so the relay hands both to the request's
//! ticket. The Responses API names them `usage.input_tokens`,
//! `usage.input_tokens_details.cached_tokens` and `usage.output_tokens`, in its JSON answer and in
//! a stream's `response.completed` event. The body is neither buffered nor parsed nor delayed:
//! each chunk is searched for the byte patterns `"prompt_tokens":` (or `"input_tokens":`),
//! `"cached_tokens":` and `"completion_tokens":` (or `"output_tokens":`, for the access log)
//! followed by a number (or `null`), and
//! the last [`TAIL`] bytes are kept so that a pattern cut between two chunks is still found.
//!
//! In valid JSON those byte sequences only occur as object keys: inside a string their quotes
//! would be escaped. The last value seen wins (a stream with continuous usage repeats it).

use prefix_router_core::Usage;

/// Bytes of the stream kept from one chunk to the next. A match (pattern, whitespace, up to ten
/// digits and the byte after them) is about 30 bytes; more whitespace than fits is not JSON any
/// engine writes.
pub const TAIL: usize = 64;

/// The patterns are `"prompt_tokens":`, `"cached_tokens":` and `"completion_tokens":`: a name,
/// then this common end.
const SUFFIX: &[u8] = b"_tokens\":";
const PROMPT_NAME: &[u8] = b"\"prompt";
const CACHED_NAME: &[u8] = b"\"cached";
const COMPLETION_NAME: &[u8] = b"\"completion";
/// The Responses API's names for the prompt's and the answer's tokens.
const INPUT_NAME: &[u8] = b"\"input";
const OUTPUT_NAME: &[u8] = b"\"output";
const _: () = assert!(COMPLETION_NAME.len() + SUFFIX.len() + MAX_SPACE + 10 < TAIL);

static SUFFIX_FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(SUFFIX));

/// The usage found so far in one response body.
#[derive(Debug, Clone)]
pub struct UsageScanner {
    tail: [u8; TAIL],
    tail_len: usize,
    prompt_tokens: Option<u32>,
    cached_tokens: Option<u32>,
    completion_tokens: Option<u32>,
}

/// What follows a pattern.
enum Value {
    /// A number, or `null` (`None`).
    Done(Option<u32>),
    /// The data ends before the value does: look again with more of the stream.
    Cut,
    /// Anything else (a string, an object, a number too large): ignored.
    Other,
}

impl Default for UsageScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl UsageScanner {
    /// A scanner that has seen nothing.
    pub fn new() -> Self {
        Self {
            tail: [0; TAIL],
            tail_len: 0,
            prompt_tokens: None,
            cached_tokens: None,
            completion_tokens: None,
        }
    }

    /// `usage.completion_tokens`, when seen (the access log's output tokens).
    pub fn completion_tokens(&self) -> Option<u32> {
        self.completion_tokens
    }

    /// Looks at the next chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if chunk.is_empty() {
            return;
        }
        if chunk.len() <= SMALL_CHUNK {
            // A token's SSE event is a couple of hundred bytes: the tail and the whole chunk
            // are searched in one pass (one search instead of two per token). Matches that
            // start in the tail and were complete there are found again with the same value,
            // in the same order, which changes nothing.
            let mut joined = [0u8; TAIL + SMALL_CHUNK];
            let len = self.tail_len + chunk.len();
            joined[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
            joined[self.tail_len..len].copy_from_slice(chunk);
            self.scan(&joined[..len], len, false);
            self.keep_tail(chunk);
            return;
        }
        // The seam: matches that start in the tail and end in this chunk. Those that start in
        // the chunk are found in the chunk itself; a match that only starts in the tail and was
        // complete there is found again with the same value, which changes nothing.
        let head = &chunk[..chunk.len().min(TAIL)];
        let mut seam = [0u8; 2 * TAIL];
        seam[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        seam[self.tail_len..self.tail_len + head.len()].copy_from_slice(head);
        let starts = self.tail_len;
        self.scan(&seam[..starts + head.len()], starts, false);
        self.scan(chunk, chunk.len(), false);
        self.keep_tail(chunk);
    }

    /// The end of the body: a value that ran up to the very end counts. Returns the usage, if
    /// `prompt_tokens` was seen.
    pub fn finish(&mut self) -> Option<Usage> {
        let tail = self.tail;
        let len = self.tail_len;
        self.scan(&tail[..len], len, true);
        self.usage()
    }

    /// The usage seen so far, if `prompt_tokens` was.
    pub fn usage(&self) -> Option<Usage> {
        self.prompt_tokens.map(|prompt_tokens| Usage {
            prompt_tokens,
            cached_tokens: self.cached_tokens,
        })
    }

    /// Records every complete match in `data` that starts before `starts_before`, in order.
    ///
    /// The three patterns share their end, `_tokens":`: one vectorised search for it (memchr's
    /// `memmem`) skips the text between matches, where stopping at every quote cost about a
    /// fifth of the router's instructions on a token-by-token stream (bench/instructions.sh).
    fn scan(&mut self, data: &[u8], starts_before: usize, at_end: bool) {
        for end in SUFFIX_FINDER.find_iter(data) {
            let before = &data[..end];
            let after = &data[end + SUFFIX.len()..];
            let starts = |name: &[u8]| before.ends_with(name) && end - name.len() < starts_before;
            if starts(PROMPT_NAME) || starts(INPUT_NAME) {
                // `prompt_tokens: null` says nothing: keep what was seen.
                if let Value::Done(Some(n)) = value(after, at_end) {
                    self.prompt_tokens = Some(n);
                }
            } else if starts(CACHED_NAME) {
                if let Value::Done(v) = value(after, at_end) {
                    self.cached_tokens = v;
                }
            } else if starts(COMPLETION_NAME) || starts(OUTPUT_NAME) {
                if let Value::Done(Some(n)) = value(after, at_end) {
                    self.completion_tokens = Some(n);
                }
            }
        }
    }

    /// Keeps the last [`TAIL`] bytes of the stream (tail then chunk).
    fn keep_tail(&mut self, chunk: &[u8]) {
        if chunk.len() >= TAIL {
            self.tail.copy_from_slice(&chunk[chunk.len() - TAIL..]);
            self.tail_len = TAIL;
            return;
        }
        let keep = (TAIL - chunk.len()).min(self.tail_len);
        self.tail
            .copy_within(self.tail_len - keep..self.tail_len, 0);
        self.tail[keep..keep + chunk.len()].copy_from_slice(chunk);
        self.tail_len = keep + chunk.len();
    }
}

/// Chunks up to this size are searched together with the tail, in one pass.
const SMALL_CHUNK: usize = 448;

/// Most whitespace read between a pattern's colon and its value. With the pattern and the
/// longest `u32` (10 digits) it fits in [`TAIL`], so a value is found however the body is cut.
const MAX_SPACE: usize = 16;

/// The value at the start of `data` (after a pattern's colon). Only what a JSON writer can
/// produce is read: at most [`MAX_SPACE`] whitespace bytes, then `null` or a `u32` without
/// leading zeros (JSON has none); anything longer is no count an engine reports.
fn value(data: &[u8], at_end: bool) -> Value {
    let skip = data
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .count();
    if skip > MAX_SPACE {
        return Value::Other;
    }
    let data = &data[skip..];
    let digits = data.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits > 0 {
        if digits > 10 || (digits > 1 && data[0] == b'0') {
            return Value::Other;
        }
        if digits == data.len() && !at_end {
            return Value::Cut;
        }
        // At most ten digits, held to a u32 (a string check and `parse` per value were about
        // 100 instructions).
        return crate::h1::decimal(&data[..digits])
            .and_then(|n| u32::try_from(n).ok())
            .map_or(Value::Other, |n| Value::Done(Some(n)));
    }
    if data.starts_with(b"null") {
        return Value::Done(None);
    }
    if !at_end && b"null".starts_with(data) {
        // Empty (only whitespace so far) or a cut `null`.
        return Value::Cut;
    }
    Value::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u32, cached: Option<u32>) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: prompt,
            cached_tokens: cached,
        })
    }

    #[test]
    fn completion_tokens_are_found_however_the_body_is_cut() {
        let body =
            br#"{"usage":{"prompt_tokens":1234,"completion_tokens":  56,"total_tokens":1290}}"#;
        for cut in 0..=body.len() {
            let mut s = UsageScanner::new();
            s.feed(&body[..cut]);
            s.feed(&body[cut..]);
            let _ = s.finish();
            assert_eq!(s.completion_tokens(), Some(56), "cut at {cut}");
        }
    }

    #[test]
    fn values_up_to_u32_max_are_read_and_larger_ones_ignored() {
        for (text, want) in [
            ("0,", Some(0)),
            ("7}", Some(7)),
            ("4294967295,", Some(u32::MAX)),
            ("4294967296,", None),
            ("9999999999,", None),
            ("12345678901,", None),
            ("012,", None),
        ] {
            let got = match value(text.as_bytes(), false) {
                Value::Done(v) => v,
                _ => None,
            };
            assert_eq!(got, want, "{text}");
        }
    }

    fn whole(body: &[u8]) -> Option<Usage> {
        let mut s = UsageScanner::new();
        s.feed(body);
        s.finish()
    }

    /// Every way of cutting `body` in two, and byte by byte, gives what the whole body gives.
    fn every_split(body: &str, expected: Option<Usage>) {
        let body = body.as_bytes();
        assert_eq!(whole(body), expected, "whole");
        for cut in 0..=body.len() {
            let mut s = UsageScanner::new();
            s.feed(&body[..cut]);
            s.feed(&body[cut..]);
            assert_eq!(s.finish(), expected, "cut at {cut}");
        }
        for a in 0..body.len() {
            let b = (a + 7).min(body.len());
            let mut s = UsageScanner::new();
            s.feed(&body[..a]);
            s.feed(&body[a..b]);
            s.feed(&body[b..]);
            assert_eq!(s.finish(), expected, "cuts at {a} and {b}");
        }
        let mut s = UsageScanner::new();
        for byte in body {
            s.feed(std::slice::from_ref(byte));
        }
        assert_eq!(s.finish(), expected, "byte by byte");
    }

    #[test]
    fn non_streaming_body_with_nested_details() {
        every_split(
            r#"{"id":"c1","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1234,"total_tokens":1240,"completion_tokens":6,"prompt_tokens_details":{"cached_tokens":1024}}}"#,
            usage(1234, Some(1024)),
        );
    }

    #[test]
    fn details_before_the_count_and_whitespace() {
        every_split(
            "{\"usage\": {\"prompt_tokens_details\": {\"cached_tokens\": 16},\n \"prompt_tokens\":\t 77 }}",
            usage(77, Some(16)),
        );
    }

    #[test]
    fn sse_usage_chunk_before_done() {
        let mut body = String::new();
        for i in 0..5 {
            body.push_str(&format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}],\"usage\":null}}\n\n"
            ));
        }
        body.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":5,\"total_tokens\":305,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\n");
        body.push_str("data: [DONE]\n\n");
        every_split(&body, usage(300, Some(256)));
    }

    /// The Responses API: `input_tokens`, `input_tokens_details.cached_tokens` and
    /// `output_tokens`, in a JSON answer and in a stream's `response.completed` event (its
    /// `response.created` event carries `"usage":null`).
    #[test]
    fn responses_usage_is_read() {
        every_split(
            r#"{"id":"resp_1","object":"response","output":[],"usage":{"input_tokens":900,"input_tokens_details":{"cached_tokens":768},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":907}}"#,
            usage(900, Some(768)),
        );
        let body = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\",\"usage\":null}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_2\",\"usage\":{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":64},\"output_tokens\":2,\"total_tokens\":122}}}\n\n",
        );
        every_split(body, usage(120, Some(64)));
        let mut s = UsageScanner::new();
        s.feed(body.as_bytes());
        let _ = s.finish();
        assert_eq!(s.completion_tokens(), Some(2));
    }

    #[test]
    fn chunks_above_and_below_the_one_pass_size_read_alike() {
        // 40 token events (about 2.6 KiB) with a repeated usage: every cut makes one side
        // longer than SMALL_CHUNK and the other shorter, so both ways of searching are used.
        let mut body = String::new();
        for i in 0..40 {
            body.push_str(&format!(
                "data: {{\"choices\":[{{\"delta\":{{\"content\":\"token{i}\"}}}}],\"usage\":{{\"prompt_tokens\":{},\"completion_tokens\":{i}}}}}\n\n",
                1000 + i
            ));
        }
        assert!(body.len() > 2 * SMALL_CHUNK);
        body.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4096,\"completion_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":4000}}}\n\n");
        body.push_str("data: [DONE]\n\n");
        every_split(&body, usage(4096, Some(4000)));
    }

    #[test]
    fn absent_null_and_odd_values() {
        // Not JSON an engine writes (found by the sse_relay fuzz target: a count cut across
        // chunks read differently from the whole): ignored however the body is cut.
        let zeros = format!(
            r#"{{"usage":{{"prompt_tokens":{}341699035}}}}"#,
            "0".repeat(60)
        );
        every_split(&zeros, None);
        every_split(r#"{"usage":{"prompt_tokens":012}}"#, None);
        every_split(r#"{"usage":{"prompt_tokens":12345678901}}"#, None);
        let spaced = format!(r#"{{"usage":{{"prompt_tokens":{}7}}}}"#, " ".repeat(40));
        every_split(&spaced, None);
        let fits = format!(
            r#"{{"usage":{{"prompt_tokens":{}4294967295}}}}"#,
            " ".repeat(16)
        );
        every_split(&fits, usage(4_294_967_295, None));
        every_split(r#"{"choices":[],"usage":null}"#, None);
        every_split(r#"{"object":"list"}"#, None);
        every_split(
            r#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":null}}}"#,
            usage(9, None),
        );
        every_split(r#"{"usage":{"prompt_tokens":9}}"#, usage(9, None));
        every_split(
            r#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":null}}"#,
            usage(9, None),
        );
        // Too large for u32, a string, null: not a count.
        every_split(r#"{"usage":{"prompt_tokens":99999999999}}"#, None);
        every_split(r#"{"usage":{"prompt_tokens":"12"}}"#, None);
        every_split(r#"{"usage":{"prompt_tokens":null}}"#, None);
        // Inside a string the quotes are escaped: not a key.
        every_split(
            r#"{"content":"say \"prompt_tokens\":5 and \"cached_tokens\":3"}"#,
            None,
        );
    }

    #[test]
    fn the_last_value_wins_and_a_body_may_end_in_digits() {
        every_split(
            r#"{"prompt_tokens":1,"cached_tokens":1} {"prompt_tokens":20,"cached_tokens":null} {"prompt_tokens":300,"cached_tokens":3"#,
            usage(300, Some(3)),
        );
        // A prompt longer than the tail between two usage reports.
        let filler = "x".repeat(3 * TAIL);
        every_split(
            &format!(r#"{{"prompt_tokens":5}}{filler}{{"prompt_tokens":6,"cached_tokens":4}}"#),
            usage(6, Some(4)),
        );
    }
}
