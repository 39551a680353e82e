//! Trace files: our JSONL, Mooncake's, the router's access log ([`access_log`]) and OpenAI
//! request bodies ([`openai`]).
//!
//! # Our JSONL format
//!
//! One JSON object per line (blank lines are skipped), one request per object:
//!
//! ```json
//! {"t": 0.25, "messages": [{"role": "system", "segments": [[4611686018427387905, 512]]},
//!                          {"role": "user", "content": "what does clause 4 say?"}],
//!  "output_tokens": 120, "group": "tenant-a", "model": "llama-3.1-8b"}
//! ```
//!
//! - `t` (required): arrival time, seconds from the start (finite, not negative). Requests are
//!   sorted by `t` (stably) and numbered 0.. in that order.
//! - `messages` (required): `role` is `system`, `user` or `assistant`, and the content is
//!   either `segments`, a list of `[id, tokens]` pairs of prefix-chained content ids (equal id
//!   means equal content *and* equal everything before it; ids are unsigned 64-bit integers, read
//!   them exactly), or `content`, literal text: one token per whitespace-separated word, with a
//!   content id chained from the previous segment, the role and the words
//!   ([`crate::text::text_segment`]), so replaying your own logs keeps their sharing structure.
//! - `output_tokens` (required, at least 1): tokens to generate.
//! - `group` (optional): the routing group (`prompt_cache_key`); `model` (optional).
//!
//! [`write_jsonl`] always writes the `segments` form, so reading back gives the same requests.
//!
//! # Mooncake format
//!
//! One JSON object per line with `timestamp` (milliseconds), `input_length`, `output_length`
//! and `hash_ids`: one id per 512-token block, prefix-chained. Each line becomes one user message
//! whose segments are the blocks ([`crate::ids::mooncake_id`] of each hash id, 512 tokens).
//! When `input_length` does not match the ids: if it is shorter, the last used block is truncated
//! and surplus ids are dropped; if it is longer than `512 * hash_ids.len()`, the excess becomes
//! one tail segment unique to the request (its content is unknown, so nothing is assumed
//! shared). `output_length` 0 is read as 1 (an engine generates at least one token).

pub mod access_log;
pub mod openai;

pub use access_log::{
    parse_access_log, parse_access_log_records, parse_access_log_with_records, AccessRecord,
};
pub use openai::{parse_openai_bodies, OPENAI_CHUNK_WORDS, OPENAI_DEFAULT_OUTPUT_TOKENS};

use crate::ids::{block_hash, mooncake_id, mooncake_tail_id};
use crate::request::{Message, Request, Role, Segment};
use crate::text::text_segment;
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Write;
use std::path::Path;

/// Tokens per Mooncake hash id.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

/// A trace file that cannot be read; names the line and field.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line does not parse.
    #[error("{path}:{line}: {why}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong, naming the field.
        why: String,
    },
    /// The file as a whole is unusable (e.g. it holds no request).
    #[error("{path}: {why}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// One line of a Mooncake trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MooncakeRecord {
    /// Arrival, milliseconds from the start.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Tokens generated.
    pub output_length: u32,
    /// One id per 512-token block of the prompt, prefix-chained.
    pub hash_ids: Vec<u64>,
}

impl MooncakeRecord {
    /// The request of this record (see the module doc for mismatched lengths); `line` numbers
    /// the record (it salts the unique tail segment) and becomes the request id.
    pub fn to_request(&self, line: u64) -> Result<Request, String> {
        if !(self.timestamp.is_finite() && self.timestamp >= 0.0) {
            return Err("timestamp: must be a finite, non-negative number of milliseconds".into());
        }
        if self.input_length == 0 {
            return Err("input_length: must be at least 1".into());
        }
        let segments = chained_segments(
            &self.hash_ids,
            self.input_length,
            MOONCAKE_BLOCK_TOKENS,
            line,
        );
        Ok(Request {
            id: line,
            arrival_s: self.timestamp / 1000.0,
            group: None,
            model: None,
            messages: vec![Message::new(Role::User, segments)],
            output_tokens: self.output_length.max(1),
        })
    }
}

/// The segments of a prompt of `tokens` tokens known by the chained hashes of its blocks of
/// `per_block` tokens: one segment a block (the last used one cut to what is left, surplus
/// hashes dropped), and what runs past the hashes one tail segment unique to request `line`
/// (its content is unknown, so nothing is assumed shared).
fn chained_segments(hashes: &[u64], tokens: u32, per_block: u32, line: u64) -> Vec<Segment> {
    let mut left = tokens;
    let mut segments = Vec::with_capacity(hashes.len() + 1);
    let mut last = 0u64;
    for &h in hashes {
        if left == 0 {
            break;
        }
        let t = left.min(per_block.max(1));
        last = mooncake_id(h);
        segments.push(Segment {
            id: last,
            tokens: t,
        });
        left -= t;
    }
    if left > 0 {
        segments.push(Segment {
            id: mooncake_tail_id(last, line),
            tokens: left,
        });
    }
    segments
}

#[derive(serde::Serialize, serde::Deserialize)]
struct LineMessage {
    role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    segments: Option<Vec<(u64, u32)>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<String>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Line {
    t: f64,
    messages: Vec<LineMessage>,
    output_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
}

impl Line {
    fn into_request(self, id: u64) -> Result<Request, String> {
        if !(self.t.is_finite() && self.t >= 0.0) {
            return Err("t: must be a finite, non-negative number of seconds".into());
        }
        if self.output_tokens == 0 {
            return Err("output_tokens: must be at least 1".into());
        }
        let mut parent = 0u64;
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.into_iter().enumerate() {
            let segments = match (m.segments, m.content) {
                (Some(s), None) => {
                    let mut out = Vec::with_capacity(s.len());
                    for (id, tokens) in s {
                        if tokens == 0 {
                            return Err(format!("messages[{i}].segments: a segment has 0 tokens"));
                        }
                        out.push(Segment { id, tokens });
                    }
                    out
                }
                (None, Some(text)) => text_segment(parent, m.role, &text).into_iter().collect(),
                _ => {
                    return Err(format!(
                        "messages[{i}]: needs exactly one of `segments` and `content`"
                    ))
                }
            };
            if let Some(s) = segments.last() {
                parent = s.id;
            }
            messages.push(Message::new(m.role, segments));
        }
        Ok(Request {
            id,
            arrival_s: self.t,
            group: self.group,
            model: self.model,
            messages,
            output_tokens: self.output_tokens,
        })
    }
}

/// Writes `requests` in our JSONL format (segments form), one line each.
pub fn write_jsonl<W: Write>(requests: &[Request], mut out: W) -> std::io::Result<()> {
    for r in requests {
        let line = Line {
            t: r.arrival_s,
            messages: r
                .messages
                .iter()
                .map(|m| LineMessage {
                    role: m.role,
                    segments: Some(m.segments.iter().map(|s| (s.id, s.tokens)).collect()),
                    content: None,
                })
                .collect(),
            output_tokens: r.output_tokens,
            group: r.group.clone(),
            model: r.model.clone(),
        };
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Non-blank lines with their 1-based numbers.
fn numbered_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
}

/// Parses our JSONL text; `path` only labels errors. Requests are sorted by `t` and numbered.
pub fn parse_jsonl(text: &str, path: &str) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    for (n, l) in numbered_lines(text) {
        let err = |why: String| TraceError::Line {
            path: path.to_string(),
            line: n,
            why,
        };
        let line: Line = serde_json::from_str(l).map_err(|e| err(e.to_string()))?;
        let request = line.into_request(0).map_err(err)?;
        request.check_size().map_err(err)?;
        out.push(request);
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    for (i, r) in out.iter_mut().enumerate() {
        r.id = i as u64;
    }
    Ok(out)
}

/// Parses Mooncake JSONL text into records; `path` only labels errors.
pub fn parse_mooncake_records(text: &str, path: &str) -> Result<Vec<MooncakeRecord>, TraceError> {
    numbered_lines(text)
        .map(|(n, l)| {
            serde_json::from_str(l).map_err(|e| TraceError::Line {
                path: path.to_string(),
                line: n,
                why: e.to_string(),
            })
        })
        .collect()
}

/// Parses Mooncake JSONL text into requests (sorted by timestamp, numbered in that order).
pub fn parse_mooncake(text: &str, path: &str) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    for (i, (n, l)) in numbered_lines(text).enumerate() {
        let err = |why: String| TraceError::Line {
            path: path.to_string(),
            line: n,
            why,
        };
        let record: MooncakeRecord = serde_json::from_str(l).map_err(|e| err(e.to_string()))?;
        let request = record.to_request(i as u64).map_err(err)?;
        request.check_size().map_err(err)?;
        out.push(request);
    }
    out.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    for (i, r) in out.iter_mut().enumerate() {
        r.id = i as u64;
    }
    Ok(out)
}

/// The formats [`load_trace`] recognizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// Our JSONL.
    Jsonl,
    /// Mooncake JSONL (lines carry `hash_ids`).
    Mooncake,
    /// The router's access log (lines carry `chain` and `block_units`).
    AccessLog,
    /// A ShareGPT JSON array.
    Sharegpt,
    /// OpenAI request bodies, one a line ([`openai`]).
    OpenAi,
}

impl TraceFormat {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Jsonl => "jsonl",
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::AccessLog => "access-log",
            TraceFormat::Sharegpt => "sharegpt",
            TraceFormat::OpenAi => "openai",
        }
    }
}

/// Guesses the format of trace text: a JSON array is ShareGPT; a first line with `hash_ids` is
/// Mooncake, one with `chain` and `block_units` the router's access log, one that is an OpenAI
/// request body (a `messages` list whose first message has `content`, or a string `prompt`, and
/// neither of our `t` and `output_tokens`) OpenAI bodies; anything else is ours.
pub fn detect_format(text: &str) -> TraceFormat {
    if text.trim_start().starts_with('[') {
        return TraceFormat::Sharegpt;
    }
    let first = numbered_lines(text).next().map(|(_, l)| l).unwrap_or("");
    match serde_json::from_str::<serde_json::Value>(first) {
        Ok(v) if v.get("hash_ids").is_some() => TraceFormat::Mooncake,
        Ok(v) if v.get("chain").is_some() && v.get("block_units").is_some() => {
            TraceFormat::AccessLog
        }
        Ok(v) if looks_like_openai_body(&v) => TraceFormat::OpenAi,
        _ => TraceFormat::Jsonl,
    }
}

fn looks_like_openai_body(v: &serde_json::Value) -> bool {
    // Our JSONL may hold `content` messages too, but it always has `t` and `output_tokens`,
    // which no OpenAI body does.
    if v.get("t").is_some() || v.get("output_tokens").is_some() {
        return false;
    }
    let chat = v
        .get("messages")
        .and_then(|m| m.as_array())
        .and_then(|m| m.first())
        .is_some_and(|m| m.get("content").is_some());
    chat || v.get("prompt").is_some_and(|p| p.is_string())
}

/// Reads a trace file of any recognized format ([`detect_format`]: our JSONL, Mooncake, the
/// router's access log, OpenAI bodies, ShareGPT); ShareGPT files are replayed with
/// [`crate::sharegpt::ReplayOptions::default`]. Errors name the file, line and field.
pub fn load_trace(path: impl AsRef<Path>) -> Result<Vec<Request>, TraceError> {
    load_trace_as(path).map(|(_, requests)| requests)
}

/// [`load_trace`], also saying which format the file was read as (one read of the file).
pub fn load_trace_as(path: impl AsRef<Path>) -> Result<(TraceFormat, Vec<Request>), TraceError> {
    let (label, text) = read_text(path)?;
    parse_trace(&text, &label)
}

/// A trace file's text and the label its errors use (the path as given).
pub fn read_text(path: impl AsRef<Path>) -> Result<(String, String), TraceError> {
    let path = path.as_ref();
    let label = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((label, text)),
        Err(source) => Err(TraceError::Io {
            path: label,
            source,
        }),
    }
}

/// Parses trace text of any recognized format ([`detect_format`]), as [`load_trace_as`] does a
/// file, for a caller that has read the text already; `label` names it in errors. Text with no
/// request is an error.
pub fn parse_trace(text: &str, label: &str) -> Result<(TraceFormat, Vec<Request>), TraceError> {
    parse_trace_with_records(text, label).map(|(format, requests, _)| (format, requests))
}

/// A parsed trace: its format, its requests, and the access log's lines when it is one.
pub type ParsedTrace = (TraceFormat, Vec<Request>, Option<Vec<AccessRecord>>);

/// [`parse_trace`], also giving the access log's lines (in the requests' order) when the trace
/// is the router's own log.
pub fn parse_trace_with_records(text: &str, label: &str) -> Result<ParsedTrace, TraceError> {
    let format = detect_format(text);
    let (requests, records) = match format {
        TraceFormat::Sharegpt => (
            crate::sharegpt::parse_sharegpt(text, label, &Default::default())?.requests,
            None,
        ),
        TraceFormat::Mooncake => (parse_mooncake(text, label)?, None),
        TraceFormat::AccessLog => {
            let (requests, records) = parse_access_log_with_records(text, label)?;
            (requests, Some(records))
        }
        TraceFormat::OpenAi => (parse_openai_bodies(text, label)?, None),
        TraceFormat::Jsonl => (parse_jsonl(text, label)?, None),
    };
    if requests.is_empty() {
        return Err(TraceError::Format {
            path: label.to_string(),
            why: "holds no request".into(),
        });
    }
    Ok((format, requests, records))
}

/// A hasher for keys that are already uniform 64-bit hashes: passes them through.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type HashSet64 = HashSet<u64, BuildHasherDefault<PassThrough>>;

/// The ceiling on any router's hit rate: the fraction of prompt tokens one infinite prefix cache,
/// seeing every request in order, would serve from cache. A request hits its longest run of
/// leading full `block_tokens` blocks seen before (as an engine's prefix cache does); partial
/// blocks never hit. 0 when there are no prompt tokens.
pub fn oracle_hit_rate(requests: &[Request], block_tokens: u32) -> f64 {
    let cached = oracle_cached_tokens(requests, block_tokens);
    let hit: u64 = cached.iter().map(|&c| u64::from(c)).sum();
    let total: u64 = requests.iter().map(|r| u64::from(r.prompt_tokens())).sum();
    if total == 0 {
        0.0
    } else {
        hit as f64 / total as f64
    }
}

/// Each request's prompt tokens that one infinite prefix cache, seeing every request in order,
/// would hold when it arrives: its longest run of leading full blocks sent before. No router can
/// give a request more (an engine's cache only holds what earlier requests computed), so this is
/// what [`oracle_hit_rate`] sums and what a floor on time to first token starts from.
pub fn oracle_cached_tokens(requests: &[Request], block_tokens: u32) -> Vec<u32> {
    let mut seen = HashSet64::default();
    let mut hashes = Vec::new();
    requests
        .iter()
        .map(|r| {
            r.block_hashes_into(block_tokens, &mut hashes);
            let leading = hashes.iter().take_while(|h| seen.contains(h)).count();
            seen.extend(hashes.iter().copied());
            u32::try_from(leading)
                .unwrap_or(u32::MAX)
                .saturating_mul(block_tokens)
        })
        .collect()
}

/// The Mooncake trace's own measure: the fraction of `hash_ids` (partial last blocks included)
/// already seen in an earlier record, counting each record's leading run.
pub fn hash_id_hit_rate(records: &[MooncakeRecord]) -> f64 {
    let mut seen = HashSet64::default();
    let (mut hit, mut total) = (0u64, 0u64);
    for r in records {
        total += r.hash_ids.len() as u64;
        // Mooncake ids are small integers; spread them before the pass-through set.
        let ids: Vec<u64> = r.hash_ids.iter().map(|&h| block_hash(h, 0)).collect();
        hit += ids.iter().take_while(|h| seen.contains(h)).count() as u64;
        seen.extend(ids);
    }
    if total == 0 {
        0.0
    } else {
        hit as f64 / total as f64
    }
}

#[cfg(test)]
mod tests;
