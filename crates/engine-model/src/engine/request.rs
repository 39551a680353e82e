//! What goes into an engine (requests, and why one is refused) and what comes out (events,
//! counters).

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

/// Why a request was refused by [`Engine::try_submit`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// `prompt_tokens` is zero.
    #[error("request {id}: `prompt_tokens` must be at least 1")]
    EmptyPrompt {
        /// Request id.
        id: u64,
    },
    /// `output_tokens` is zero.
    #[error("request {id}: `output_tokens` must be at least 1")]
    NoOutput {
        /// Request id.
        id: u64,
    },
    /// More block hashes than the prompt has full blocks.
    #[error(
        "request {id}: {hashes} `block_hashes` but a prompt of {prompt_tokens} tokens has only \
         {full_blocks} full blocks"
    )]
    TooManyBlocks {
        /// Request id.
        id: u64,
        /// `block_hashes.len()`.
        hashes: usize,
        /// `prompt_tokens`.
        prompt_tokens: u32,
        /// `prompt_tokens / block_tokens`.
        full_blocks: u32,
    },
    /// The arrival time is not finite or lies before the engine's clock.
    #[error(
        "request {id}: arrival time {now} is not finite or is before the engine clock {clock}"
    )]
    BadTime {
        /// Request id.
        id: u64,
        /// The `now` given.
        now: f64,
        /// The engine's clock.
        clock: f64,
    },
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

impl EngineEvent {
    /// When the event happened.
    pub fn at(&self) -> f64 {
        match self {
            EngineEvent::FirstToken { at, .. } | EngineEvent::Finished { at, .. } => *at,
        }
    }

    /// The request it concerns.
    pub fn id(&self) -> u64 {
        match self {
            EngineEvent::FirstToken { id, .. } | EngineEvent::Finished { id, .. } => *id,
        }
    }
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
    /// KV blocks held by the prefix cache now (referenced or evictable).
    pub cached_blocks: u32,
    /// Blocks evicted from the prefix cache since start.
    pub evicted_blocks: u64,
    /// Requests finished since start.
    pub finished: u64,
    /// Steps run since start.
    pub steps: u64,
}
