//! The router's access log (`serve --access-log`) as a trace: each line's block chain becomes
//! the request's segments, so the simulator sees the same sharing the router saw.
//!
//! A line's `chain` holds one hash per full block of `block_units` characters (bytes for the
//! native API), each covering everything before it, like Mooncake's `hash_ids`. Tokens are what
//! the engine reported (`prompt_tokens`) spread over the prompt's units; without a report, four
//! units a token. Each block becomes a segment of its share of the tokens; what follows the last
//! full block becomes a tail segment unique to the request. `output_tokens` missing (the engine
//! reported no usage) is read as 1. The group hash stays the request's group, so tenants stay
//! apart; the time is seconds from the log's first line.

use super::{Message, Request, Role};

/// Units a token when the engine reported no `prompt_tokens`: English text runs about four
/// characters a token.
pub const UNITS_PER_TOKEN: f64 = 4.0;

/// The fields of an access-log line a replay needs (the others are ignored).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct AccessRecord {
    /// Arrival, Unix seconds.
    pub t: f64,
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
}

impl AccessRecord {
    /// The request of this line; `line` salts the unique tail and becomes the id. `start` is the
    /// log's first arrival (times become seconds from it).
    pub fn to_request(&self, line: u64, start: f64) -> Result<Request, String> {
        if !(self.t.is_finite() && self.t >= start) {
            return Err("t: must be a finite Unix time".into());
        }
        if self.block_units == 0 && !self.chain.is_empty() {
            return Err("block_units: must be at least 1 with a chain".into());
        }
        let units = self.prompt_units.max(1);
        let tokens = match self.prompt_tokens {
            Some(t) if t > 0 => t,
            _ => (f64::from(units) / UNITS_PER_TOKEN).ceil().max(1.0) as u32,
        };
        let per_block = ((f64::from(self.block_units) * f64::from(tokens) / f64::from(units))
            .round() as u32)
            .max(1);
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
