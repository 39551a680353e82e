//! The events a Responses API stream opens with, before its first token.
//!
//! vLLM (as OpenAI) sends a Responses stream's `response.created` and `response.in_progress`
//! events as soon as it takes the request, before queueing and prefill; the first token comes
//! with a later event (`response.output_item.added`, then the deltas). Taken for the first
//! token, those opening events taught cache-aware that prefill was free (a time to first token
//! of about nothing, whatever the prompt), and ended the wait for the first data: a request
//! queued behind others for longer than `timeouts.idle_stream_ms` was cut.
//!
//! [`OpeningEvents`] reads the opening of the stream, event by event, by each event's first
//! line (past comments and `id:`/`retry:` fields): `event: response.created`,
//! `event: response.in_progress` and `event: response.queued` open the stream; any other line
//! (another event name, or an event that starts with its `data:`, which names nothing before its
//! JSON) is the first token. A comment alone (a keep-alive) is not. Once found, nothing more is
//! read.

/// The first line of an event is read up to this many bytes: longer, it is none of the names.
const HEAD: usize = 40;

/// Names of the events sent before the first token.
const OPENING: [&[u8]; 3] = [
    b"response.created",
    b"response.in_progress",
    b"response.queued",
];

/// Where the reader is in the stream's opening events.
#[derive(Debug, Clone, Default)]
pub struct OpeningEvents {
    /// The start of the current event's first line (without `\r`).
    head: Vec<u8>,
    /// Inside an event's body, past its first line.
    in_body: bool,
    /// The last byte read (`\r` skipped) was a line feed.
    after_newline: bool,
    /// Passing over a long line before the event's name (a comment).
    skipping: bool,
}

impl OpeningEvents {
    /// A reader at the stream's start.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the next piece of the stream; `true` once an event that is not an opening one has
    /// begun (its first line is complete, or long enough to tell). After `true`, stop feeding.
    pub fn feed(&mut self, data: &[u8]) -> bool {
        let mut at = 0;
        while at < data.len() {
            if self.in_body {
                // Only the blank line that ends the event matters here: jump from line feed to
                // line feed (a `response.created` event repeats the request's instructions and
                // tools, which may be long).
                let Some(nl) = memchr::memchr(b'\n', &data[at..]) else {
                    // The piece ends inside a line (a lone `\r` does not start one).
                    if data[at..].iter().any(|&b| b != b'\r') {
                        self.after_newline = false;
                    }
                    return false;
                };
                if self.after_newline && data[at..at + nl].iter().all(|&b| b == b'\r') {
                    self.in_body = false;
                }
                self.after_newline = true;
                at += nl + 1;
                continue;
            }
            let b = data[at];
            at += 1;
            match b {
                b'\r' => {}
                b'\n' if self.skipping => self.skipping = false,
                _ if self.skipping => {}
                b'\n' if self.head.is_empty() => {} // blank lines between events
                b'\n' if passed_over(&self.head) => self.head.clear(),
                b'\n' => {
                    if !is_opening(&self.head) {
                        return true;
                    }
                    self.head.clear();
                    self.in_body = true;
                    self.after_newline = true;
                }
                _ if self.head.len() >= HEAD && passed_over(&self.head) => {
                    self.head.clear();
                    self.skipping = true;
                }
                _ if self.head.len() >= HEAD => return true,
                _ => self.head.push(b),
            }
        }
        false
    }
}

/// A line read past on the way to an event's name: a comment (`: keep-alive`), or the `id` and
/// `retry` fields, which may come first.
fn passed_over(line: &[u8]) -> bool {
    line.starts_with(b":") || line.starts_with(b"id:") || line.starts_with(b"retry:")
}

/// Whether an event's first line names an opening event.
fn is_opening(line: &[u8]) -> bool {
    let Some(name) = line.strip_prefix(b"event:") else {
        return false;
    };
    let name = name.trim_ascii();
    OPENING.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where in `stream` the first token begins, fed in pieces of `step` bytes: the end of the
    /// piece in which `feed` first said so.
    fn found_at(stream: &[u8], step: usize) -> Option<usize> {
        let mut o = OpeningEvents::new();
        let mut at = 0;
        for piece in stream.chunks(step) {
            at += piece.len();
            if o.feed(piece) {
                return Some(at);
            }
        }
        None
    }

    fn vllm_stream(newline: &str) -> (String, usize) {
        let tools = "x".repeat(3000);
        let opening = format!(
            "event: response.created{newline}data: {{\"response\":{{\"id\":\"resp_1\",\"instructions\":\"{tools}\"}},\"sequence_number\":0,\"type\":\"response.created\"}}{newline}{newline}event: response.in_progress{newline}data: {{\"response\":{{\"id\":\"resp_1\"}},\"type\":\"response.in_progress\"}}{newline}{newline}"
        );
        let token = format!(
            "event: response.output_item.added{newline}data: {{\"type\":\"response.output_item.added\"}}{newline}{newline}event: response.output_text.delta{newline}data: {{\"delta\":\"hi\"}}{newline}{newline}"
        );
        let first_line_end = opening.len() + "event: response.output_item.added".len() + 1;
        (format!("{opening}{token}"), first_line_end)
    }

    #[test]
    fn the_first_token_is_the_first_event_after_the_opening_ones_however_the_stream_is_cut() {
        for newline in ["\n", "\r\n"] {
            let (stream, first_line_end) = vllm_stream(newline);
            let first_line_end = first_line_end + newline.len() - 1;
            for step in [1, 2, 3, 7, 64, 1000, stream.len()] {
                let at = found_at(stream.as_bytes(), step)
                    .unwrap_or_else(|| panic!("never found, step {step}"));
                // Said in the piece where the first line of the token's event ends.
                assert!(
                    at >= first_line_end && at < first_line_end + step,
                    "step {step}: at {at}, line ends at {first_line_end}"
                );
            }
        }
    }

    #[test]
    fn only_opening_events_are_no_token() {
        let (stream, _) = vllm_stream("\n");
        let opening_only = &stream[..stream.find("event: response.output_item").unwrap_or(0)];
        assert_eq!(found_at(opening_only.as_bytes(), 5), None);
        assert_eq!(
            found_at(b"event: response.queued\ndata: {}\n\n", 4),
            None,
            "queued"
        );
    }

    #[test]
    fn comments_and_ids_before_the_name_are_passed_over() {
        let long_comment = format!(": {}\n\n", "k".repeat(3 * HEAD));
        let stream = format!(
            ": keep-alive\n\n{long_comment}id: 7\nretry: 100\nevent: response.created\ndata: {{}}\n\nid: 8\nevent: response.output_text.delta\ndata: {{}}\n\n"
        );
        let end = stream
            .find("event: response.output_text.delta")
            .unwrap_or(0)
            + "event: response.output_text.delta".len()
            + 1;
        for step in [1, 3, 7, 1000] {
            let at = found_at(stream.as_bytes(), step);
            assert!(
                at.is_some_and(|a| a >= end && a < end + step),
                "step {step}: {at:?}"
            );
        }
    }

    #[test]
    fn anything_else_first_is_the_first_token() {
        for stream in [
            &b"data: {\"type\":\"response.created\"}\n\n"[..],
            b"event: error\ndata: {}\n\n",
            b"event: response.created.but.longer.than.any.opening.name\n",
        ] {
            assert!(
                found_at(stream, 3).is_some(),
                "{}",
                String::from_utf8_lossy(stream)
            );
        }
    }
}
