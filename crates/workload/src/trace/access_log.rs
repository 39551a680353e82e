//! The router's access log (`serve --access-log`) as a trace: each line's block chain becomes
//! the request's segments, so the simulator sees the same sharing the router saw.
//!
//! A line's `chain` holds one hash per full block of `block_units` characters (bytes for the
//! native API), each covering everything before it, like Mooncake's `hash_ids`. A request's
//! tokens are what the engine reported (`prompt_tokens`); without a report, its units at the
//! log's units a token. Each block becomes a segment of the same number of tokens in every
//! request: its units at the log's units a token (over every line that reported its tokens;
//! four when none did). What is left after the last full block becomes a tail segment unique
//! to the request. One rate for the whole log, not each request's own: two requests sharing a
//! chain but not a token density (their questions differ) cut it at different token positions,
//! and the simulator's blocks, named by segment and position, then shared almost nothing (an
//! oracle hit rate of 1.7% for two copies of a 100-block document). `output_tokens` missing (the engine
//! reported no usage) is read as 1. The group hash stays the request's group, so tenants stay
//! apart; the time is seconds from the log's first line.
//!
//! The record also keeps what the router observed (the instance, the reason, the status, the
//! outcome, the latencies, the engine's cached tokens), so an analysis can set what the router
//! saw beside what the simulator predicts ([`parse_access_log_records`]).

use super::{numbered_lines, Message, Request, Role, TraceError};

/// Units a token when the engine reported no `prompt_tokens`: English text runs about four
/// characters a token.
pub const UNITS_PER_TOKEN: f64 = 4.0;

/// The fields of an access-log line a replay or an analysis needs (the others are ignored).
/// Every observed field is optional so logs of older servers, and hand-written lines, still read.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct AccessRecord {
    /// Arrival, Unix seconds.
    pub t: f64,
    /// The API called: `chat`, `completions`, `invocations` (the native API), `other`.
    #[serde(default)]
    pub api: Option<String>,
    /// Requested model.
    #[serde(default)]
    pub model: Option<String>,
    /// Hash of the routing group, hex.
    #[serde(default)]
    pub group: Option<String>,
    /// Prompt length in units.
    pub prompt_units: u32,
    /// Units per block.
    pub block_units: u32,
    /// Block hashes.
    pub chain: Vec<u64>,
    /// The engine's prompt tokens.
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    /// The engine's output tokens.
    #[serde(default)]
    pub output_tokens: Option<u32>,
    /// The instance the request went to (the last one, after retries).
    #[serde(default)]
    pub instance: Option<String>,
    /// Why it went there (the routing decision's reason).
    #[serde(default)]
    pub reason: Option<String>,
    /// HTTP status the instance answered (the server writes 0 when none came).
    #[serde(default)]
    pub status: Option<u16>,
    /// How it ended (`ok`, `upstream_error`, `cancelled`, ...).
    #[serde(default)]
    pub outcome: Option<String>,
    /// Arrival to first response byte, seconds.
    #[serde(default)]
    pub ttft_s: Option<f64>,
    /// Arrival to end, seconds.
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// The engine's cached prompt tokens (`usage.prompt_tokens_details.cached_tokens`).
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

impl AccessRecord {
    /// What makes a line unusable whatever else the log holds.
    fn check(&self) -> Result<(), String> {
        if !self.t.is_finite() {
            return Err("t: must be a finite Unix time".into());
        }
        if self.block_units == 0 && !self.chain.is_empty() {
            return Err("block_units: must be at least 1 with a chain".into());
        }
        Ok(())
    }

    /// The request of this line; `line` salts the unique tail and becomes the id. `start` is the
    /// log's first arrival (times become seconds from it); `units_per_token` the log's rate
    /// ([`units_per_token`]).
    pub fn to_request(
        &self,
        line: u64,
        start: f64,
        units_per_token: f64,
    ) -> Result<Request, String> {
        self.check()?;
        if self.t < start {
            return Err("t: must not be before the log's start".into());
        }
        let units = self.prompt_units.max(1);
        let tokens = match self.prompt_tokens {
            Some(t) if t > 0 => t,
            _ => (f64::from(units) / units_per_token).ceil().max(1.0) as u32,
        };
        let per_block = ((f64::from(self.block_units) / units_per_token).round() as u32).max(1);
        let segments = super::chained_segments(&self.chain, tokens, per_block, line);
        Ok(Request {
            id: line,
            arrival_s: self.t - start,
            group: self.group.clone(),
            model: self.model.clone(),
            messages: vec![Message::new(Role::User, segments)],
            output_tokens: self.output_tokens.unwrap_or(1).max(1),
        })
    }
}

/// Units a token over the lines whose engine reported their tokens ([`UNITS_PER_TOKEN`] when
/// none did): one rate for the whole log, so every request cuts a shared chain at the same
/// token positions.
pub fn units_per_token<'a>(records: impl IntoIterator<Item = &'a AccessRecord>) -> f64 {
    let (mut units, mut tokens) = (0u64, 0u64);
    for r in records {
        if let Some(t) = r.prompt_tokens.filter(|&t| t > 0 && r.prompt_units > 0) {
            units += u64::from(r.prompt_units);
            tokens += u64::from(t);
        }
    }
    if tokens == 0 {
        UNITS_PER_TOKEN
    } else {
        units as f64 / tokens as f64
    }
}

/// The records with their 1-based line numbers, in file order, each checked.
fn numbered_records(text: &str, path: &str) -> Result<Vec<(usize, AccessRecord)>, TraceError> {
    numbered_lines(text)
        .map(|(n, l)| {
            let err = |why: String| TraceError::Line {
                path: path.to_string(),
                line: n,
                why,
            };
            let r: AccessRecord = serde_json::from_str(l).map_err(|e| err(e.to_string()))?;
            r.check().map_err(err)?;
            Ok((n, r))
        })
        .collect()
}

/// Parses the router's access log into its records, in file order (not sorted: the server
/// writes a line when a request ends); `path` only labels errors. A line that
/// [`parse_access_log`] would reject is rejected here with the same error.
pub fn parse_access_log_records(text: &str, path: &str) -> Result<Vec<AccessRecord>, TraceError> {
    Ok(numbered_records(text, path)?
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// Parses the router's access log (`serve --access-log`) into requests, sorted by arrival and
/// numbered in that order; times are seconds from the earliest line.
pub fn parse_access_log(text: &str, path: &str) -> Result<Vec<Request>, TraceError> {
    parse_access_log_with_records(text, path).map(|(requests, _)| requests)
}

/// [`parse_access_log`], also giving each request's line (what the router saw of it), in the
/// same order: one parse for a caller that needs both.
pub fn parse_access_log_with_records(
    text: &str,
    path: &str,
) -> Result<(Vec<Request>, Vec<AccessRecord>), TraceError> {
    let records = numbered_records(text, path)?;
    let start = records
        .iter()
        .map(|(_, r)| r.t)
        .fold(f64::INFINITY, f64::min);
    let rate = units_per_token(records.iter().map(|(_, r)| r));
    let mut pairs = Vec::with_capacity(records.len());
    for (i, (n, r)) in records.into_iter().enumerate() {
        let request = r
            .to_request(i as u64, start, rate)
            .and_then(|q| q.check_size().map(|()| q))
            .map_err(|why| TraceError::Line {
                path: path.to_string(),
                line: n,
                why,
            })?;
        pairs.push((request, r));
    }
    pairs.sort_by(|a, b| a.0.arrival_s.total_cmp(&b.0.arrival_s));
    let (mut requests, records): (Vec<Request>, Vec<AccessRecord>) = pairs.into_iter().unzip();
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i as u64;
    }
    Ok((requests, records))
}
