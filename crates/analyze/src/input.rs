//! The traffic to analyze: a trace file of any format `simulate` replays, read once.

use std::path::Path;

use prefix_router_workload::trace::{self, AccessRecord, TraceError, TraceFormat};
use prefix_router_workload::Request;

use crate::observed::Observed;

/// Requests to analyze, and what the router itself saw when the trace is its access log.
#[derive(Debug, Clone)]
pub struct Input {
    /// Where the requests came from (a path, or a generator's name).
    pub label: String,
    /// The format it was read as (`None`: built in memory).
    pub format: Option<TraceFormat>,
    /// The requests, sorted by arrival.
    pub requests: Vec<Request>,
    /// The access log's lines, in the requests' order (sorted by arrival), when the trace is
    /// the router's own log: what it saw ([`Input::observed`]).
    pub records: Option<Vec<AccessRecord>>,
}

impl Input {
    /// Reads a trace file: our JSONL, the router's access log, Mooncake's JSONL, ShareGPT, or a
    /// JSONL of OpenAI request bodies (detected from the content).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let (label, text) = trace::read_text(path)?;
        let (format, requests, records) = trace::parse_trace_with_records(&text, &label)?;
        Ok(Input {
            label,
            format: Some(format),
            requests,
            records,
        })
    }

    /// Requests already in memory (a generated workload, a test).
    pub fn from_requests(label: impl Into<String>, requests: Vec<Request>) -> Self {
        Input {
            label: label.into(),
            format: None,
            requests,
            records: None,
        }
    }

    /// Keeps the first `n` requests (and their access-log lines).
    pub fn truncate(&mut self, n: usize) {
        self.requests.truncate(n);
        if let Some(r) = &mut self.records {
            r.truncate(n);
        }
    }

    /// What the router saw, when the trace is its access log.
    pub fn observed(&self) -> Option<Observed> {
        self.records.as_deref().map(Observed::from_records)
    }

    /// Seconds from the first arrival to the last.
    pub fn span_s(&self) -> f64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => (b.arrival_s - a.arrival_s).max(0.0),
            _ => 0.0,
        }
    }

    /// Mean arrival rate over the span, requests per second (0 for a single instant).
    pub fn rate_rps(&self) -> f64 {
        let span = self.span_s();
        if span > 0.0 {
            self.requests.len().saturating_sub(1) as f64 / span
        } else {
            0.0
        }
    }
}
