//! What was observed for one request.

use crate::{FailureKind, Usage};

/// A failed request: its kind and a one-line detail for the first few printed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Failure {
    /// Kind (counted in reports).
    pub kind: FailureKind,
    /// What happened, in words.
    pub detail: String,
}

/// One request as the client saw it. Times are seconds since the run's start.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RequestRecord {
    /// Position in the run's request list.
    pub index: usize,
    /// The workload's request id.
    pub id: u64,
    /// When the request was due: its open-loop schedule time, or when a closed-loop worker
    /// took it.
    pub due_s: f64,
    /// When it was handed to the connection (the TTFT clock starts here).
    pub sent_s: f64,
    /// When the first chunk carrying generated text arrived.
    pub first_content_s: Option<f64>,
    /// When the response ended (last byte, error or timeout).
    pub finished_s: f64,
    /// HTTP status, when a response head arrived.
    pub status: Option<u16>,
    /// The `usage` the response reported (the final chunk's), if any.
    pub usage: Option<Usage>,
    /// Chunks that carried generated text.
    pub content_chunks: u64,
    /// The answer came as an event stream, as asked. `false`: a whole JSON answer from a target
    /// that ignored `stream: true`, whose first content is its end (a TTFT that is not one).
    pub streamed: bool,
    /// It was sent with `stream: false` (`--unstreamed`): its answer comes whole by request.
    pub asked_whole: bool,
    /// `x-prefix-router-instance` response header.
    pub instance: Option<String>,
    /// `x-prefix-router-decision` response header.
    pub decision: Option<String>,
    /// Why it failed; `None` for a complete response.
    pub failure: Option<Failure>,
}

impl RequestRecord {
    /// Whether the response was complete and well-formed.
    pub fn is_ok(&self) -> bool {
        self.failure.is_none()
    }

    /// How late the send was against its due time, seconds (≥ 0).
    pub fn send_lag_s(&self) -> f64 {
        (self.sent_s - self.due_s).max(0.0)
    }

    /// Time to first content chunk, seconds.
    pub fn ttft_s(&self) -> Option<f64> {
        self.first_content_s.map(|t| (t - self.sent_s).max(0.0))
    }

    /// Send to end of response, seconds.
    pub fn e2e_s(&self) -> f64 {
        (self.finished_s - self.sent_s).max(0.0)
    }

    /// Output tokens: `usage.completion_tokens`, or the content chunks counted when the server
    /// reported none.
    pub fn output_tokens(&self) -> u64 {
        self.usage
            .and_then(|u| u.completion_tokens)
            .unwrap_or(self.content_chunks)
    }
}
