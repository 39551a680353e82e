//! Each built-in workload's parameters and their defaults (and why those defaults).

use super::{TokenDist, TokenRange};

/// Default number of shared documents in `long-context`: the pool every request draws its
/// 8,000-token prefix from.
///
/// Derivation (see the README's calibration section): one `llama-3.1-70b-h100x8` instance holds
/// about 1.29M tokens of KV cache, i.e. about 160 documents. A pool of 600 documents is a
/// working set of 4.8M tokens: 3.7 times one instance's cache (so an instance that sees every
/// document, as under random routing, keeps only about a quarter of them resident) and about
/// half the 7-instance fleet's 9.0M tokens (so when each instance sees only its seventh of the
/// pool, as under prefix-aware routing, everything fits). This is the regime the published
/// figures describe: random routing near 25%, prefix-aware limited by first touches only.
pub const DEFAULT_LONG_CONTEXT_DOCUMENTS: u32 = 600;
/// Default number of requests of `long-context`: 9 per document, the requests-per-prefix ratio
/// CALIBRATION.md derives from the published hit rates (about 9.3). The ceiling of any router is
/// then about 1 - 1/9 of the document tokens (the simulator prints it as the oracle hit rate).
pub const DEFAULT_LONG_CONTEXT_REQUESTS: u64 = 9 * DEFAULT_LONG_CONTEXT_DOCUMENTS as u64;
/// Default `long-context` load: closed loop with this many concurrent clients (about 4.6 per
/// instance), the way LLM benchmark clients drive an endpoint. Closed loop lets a faster fleet
/// finish more requests per second, which is how throughput can differ between strategies.
pub const DEFAULT_LONG_CONTEXT_CLIENTS: u32 = 32;
/// Default document length of `long-context`, tokens (the published experiment's prefixes).
pub const DEFAULT_DOC_TOKENS: u32 = 8_000;
/// Default number of requests of the other workloads.
pub const DEFAULT_REQUESTS: u64 = 5_000;
/// Default arrival rate of the other workloads, requests per second.
pub const DEFAULT_RATE: f64 = 5.0;

/// `long-context` parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LongContextParams {
    /// Shared documents in the pool; each request picks one uniformly.
    pub documents: u32,
    /// Tokens per document.
    pub doc_tokens: u32,
    /// Tokens of the unique question after the document (uniform).
    pub question_tokens: TokenRange,
    /// Tokens of the answer (uniform).
    pub output_tokens: TokenRange,
}

impl Default for LongContextParams {
    fn default() -> Self {
        LongContextParams {
            documents: DEFAULT_LONG_CONTEXT_DOCUMENTS,
            doc_tokens: DEFAULT_DOC_TOKENS,
            question_tokens: TokenRange::new(20, 60),
            output_tokens: TokenRange::new(100, 300),
        }
    }
}

/// `shared-system-prompt` parameters: `long-context`'s documents behind one shared opening.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SharedSystemPromptParams {
    /// Tokens of the system prompt every request opens with (600 tokens of our five-character
    /// words: 3,000 characters). With `--groups`, each tenant has its own.
    pub system_tokens: u32,
    /// Shared documents in the pool; each request picks one uniformly.
    pub documents: u32,
    /// Tokens per document.
    pub doc_tokens: u32,
    /// Tokens of the unique question after the document (uniform).
    pub question_tokens: TokenRange,
    /// Tokens of the answer (uniform).
    pub output_tokens: TokenRange,
}

impl Default for SharedSystemPromptParams {
    fn default() -> Self {
        let lc = LongContextParams::default();
        SharedSystemPromptParams {
            system_tokens: 600,
            documents: lc.documents,
            doc_tokens: lc.doc_tokens,
            question_tokens: lc.question_tokens,
            output_tokens: lc.output_tokens,
        }
    }
}

/// `sharegpt` parameters. The length distributions are chosen to fall in the ranges the issue
/// gives for ShareGPT-like chats (user 10-300, assistant 50-400 tokens), not fitted to a dataset;
/// replay the real file with [`crate::sharegpt`] for that.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SharegptParams {
    /// Mean turns per conversation of the untruncated geometric distribution.
    pub mean_turns: f64,
    /// Most turns per conversation (the geometric draw is truncated here).
    pub max_turns: u32,
    /// Tokens of each user message.
    pub user_tokens: TokenDist,
    /// Tokens of each assistant answer (the request's `output_tokens`; resent next turn).
    pub assistant_tokens: TokenDist,
    /// Fraction of conversations that start with a system prompt.
    pub system_prompt_share: f64,
    /// Distinct system prompts those conversations pick from (uniformly).
    pub system_prompts: u32,
    /// Tokens of a system prompt.
    pub system_prompt_tokens: u32,
    /// Mean user think time between an answer and the next question, seconds (exponential).
    pub think_time_s: f64,
    /// Assumed seconds per generated token, so a turn waits for the previous answer.
    pub decode_s_per_token: f64,
}

impl Default for SharegptParams {
    fn default() -> Self {
        SharegptParams {
            mean_turns: 3.0,
            max_turns: 10,
            user_tokens: TokenDist {
                median: 60.0,
                sigma: 1.0,
                min: 10,
                max: 300,
            },
            assistant_tokens: TokenDist {
                median: 180.0,
                sigma: 0.6,
                min: 50,
                max: 400,
            },
            system_prompt_share: 0.05,
            system_prompts: 3,
            system_prompt_tokens: 120,
            think_time_s: 10.0,
            decode_s_per_token: 0.03,
        }
    }
}

/// `rag` parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RagParams {
    /// Tokens of the system prompt every request shares.
    pub system_prompt_tokens: u32,
    /// Chunks in the corpus.
    pub corpus_chunks: u32,
    /// Tokens per chunk.
    pub chunk_tokens: u32,
    /// Distinct chunks retrieved per request, in draw order.
    pub chunks_per_request: u32,
    /// Zipf exponent of chunk popularity (0 = uniform).
    pub zipf_exponent: f64,
    /// Tokens of the question after the chunks (uniform).
    pub question_tokens: TokenRange,
    /// Tokens of the answer (uniform).
    pub output_tokens: TokenRange,
}

impl Default for RagParams {
    fn default() -> Self {
        RagParams {
            system_prompt_tokens: 300,
            corpus_chunks: 10_000,
            chunk_tokens: 256,
            chunks_per_request: 4,
            zipf_exponent: 1.0,
            question_tokens: TokenRange::new(10, 60),
            output_tokens: TokenRange::new(50, 300),
        }
    }
}

/// `agent` parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentParams {
    /// Agent types; each has its own instructions, shared by all its sessions.
    pub agent_types: u32,
    /// Tokens of an agent type's instructions.
    pub instructions_tokens: u32,
    /// Tokens of the session's task (uniform).
    pub task_tokens: TokenRange,
    /// Mean steps per session of the untruncated geometric distribution.
    pub mean_steps: f64,
    /// Most steps per session.
    pub max_steps: u32,
    /// Tokens of a tool result appended after each action.
    pub tool_result_tokens: TokenDist,
    /// Tokens of a model action (the request's `output_tokens`).
    pub action_tokens: TokenDist,
    /// Mean tool latency between an action and the next step, seconds (exponential).
    pub tool_time_s: f64,
    /// Assumed seconds per generated token, so a step waits for the previous action.
    pub decode_s_per_token: f64,
}

impl Default for AgentParams {
    fn default() -> Self {
        AgentParams {
            agent_types: 4,
            instructions_tokens: 2_000,
            task_tokens: TokenRange::new(50, 200),
            mean_steps: 15.0,
            max_steps: 40,
            tool_result_tokens: TokenDist {
                median: 250.0,
                sigma: 1.0,
                min: 20,
                max: 2_000,
            },
            action_tokens: TokenDist {
                median: 80.0,
                sigma: 0.6,
                min: 10,
                max: 400,
            },
            tool_time_s: 1.5,
            decode_s_per_token: 0.03,
        }
    }
}

/// `hot-prefix` parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HotPrefixParams {
    /// Fraction of requests that carry the hot prefix.
    pub hot_share: f64,
    /// Tokens of every prefix (a system message).
    pub prefix_tokens: u32,
    /// Other prefixes, chosen uniformly by the remaining requests.
    pub tail_prefixes: u32,
    /// Tokens of the unique user message after the prefix (uniform).
    pub suffix_tokens: TokenRange,
    /// Tokens of the answer (uniform).
    pub output_tokens: TokenRange,
}

impl Default for HotPrefixParams {
    fn default() -> Self {
        HotPrefixParams {
            hot_share: 0.5,
            prefix_tokens: 2_000,
            tail_prefixes: 2_000,
            suffix_tokens: TokenRange::new(20, 200),
            output_tokens: TokenRange::new(50, 300),
        }
    }
}
