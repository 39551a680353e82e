//! Continuous batching over a prefix cache.

use crate::CostModel;

/// Limits and costs of one engine.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EngineConfig {
    /// Tokens per KV block (16 in vLLM).
    pub block_tokens: u32,
    /// KV cache capacity in blocks (shared by running requests and the prefix cache).
    pub kv_capacity_blocks: u32,
    /// Most sequences running at once (vLLM `max_num_seqs`).
    pub max_num_seqs: u32,
    /// Token budget per step (vLLM `max_num_batched_tokens`, chunked prefill).
    pub max_batched_tokens: u32,
    /// Step time model.
    pub cost: CostModel,
}

/// A request handed to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRequest {
    /// Caller's id, echoed in events.
    pub id: u64,
    /// Chained hash of each *full* block of the prompt, in order (equal hash: equal content up to
    /// and including that block).
    pub block_hashes: Vec<u64>,
    /// Prompt length in tokens (≥ 1; may exceed `block_hashes.len() * block_tokens` by a partial block).
    pub prompt_tokens: u32,
    /// Tokens to generate (≥ 1).
    pub output_tokens: u32,
}

/// Something that happened inside the engine at a given time.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// The first output token was produced (prefill done).
    FirstToken {
        /// Request id.
        id: u64,
        /// When.
        at: f64,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: u32,
    },
    /// The last output token was produced; the request left the engine.
    Finished {
        /// Request id.
        id: u64,
        /// When.
        at: f64,
    },
}

/// Counters since start, for reports and metrics.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct EngineStats {
    /// Requests admitted.
    pub requests: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of those, served from the prefix cache.
    pub cached_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Running now.
    pub running: u32,
    /// Waiting now.
    pub waiting: u32,
    /// KV blocks in use by running requests.
    pub used_blocks: u32,
}

/// One engine: FCFS waiting queue, continuous batching, prefix cache.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(config: EngineConfig) -> Self {
        Self { config }
    }
    /// Configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
    /// Queues a request arriving at `now` (must not be earlier than the last `advance`).
    pub fn submit(&mut self, now: f64, req: EngineRequest) {
        todo!("{now} {req:?}")
    }
    /// When the engine next produces events if nothing else arrives (end of the current step);
    /// `None` when idle.
    pub fn next_event_at(&self) -> Option<f64> {
        todo!()
    }
    /// Runs every step that ends at or before `now`, appending what happened to `out` in time order.
    pub fn advance(&mut self, now: f64, out: &mut Vec<EngineEvent>) {
        todo!("{now} {out:?}")
    }
    /// Counters.
    pub fn stats(&self) -> EngineStats {
        todo!()
    }
}
