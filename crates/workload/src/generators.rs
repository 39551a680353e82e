//! Seeded workload generators.
//!
//! [`generate`] turns a [`WorkloadSpec`] into a lazy iterator of requests in arrival order, ids
//! `0..`, identical for identical specs (one `Pcg64Mcg` seeded from `seed` drives every choice).
//! Every kind is a stream of *sessions* (a document query, a chat, an agent run) that start as a
//! Poisson process; multi-turn sessions send each next turn after the previous answer would
//! plausibly have been generated plus a think (or tool) time, and each turn resends the history.

mod distributions;
mod param_override;
pub(crate) use distributions::exponential;
mod kinds;
pub(crate) mod schedule;

pub use distributions::{TokenDist, TokenRange};
pub use param_override::ParamError;

use crate::ids::generator_id;
use crate::request::Request;
use distributions::ZipfRanks;
use kinds::Groups;
use rand::SeedableRng;
use rand_pcg::Pcg64Mcg;
use std::str::FromStr;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Arrival {
    /// Open loop: Poisson arrivals at `rate` requests per second.
    Poisson {
        /// Mean requests per second over the whole workload (sessions start at
        /// `rate / mean turns per session`).
        rate: f64,
    },
    /// Closed loop: `clients` concurrent clients, each sending its next request when the last ends.
    /// The generator then orders requests on a nominal Poisson schedule at `clients` requests
    /// per second; the driver replaces the times.
    Closed {
        /// Concurrent clients.
        clients: u32,
    },
}

impl Arrival {
    /// The rate the generator schedules with: `rate` (open) or `clients` per second (closed).
    pub fn nominal_rate(&self) -> f64 {
        match *self {
            Arrival::Poisson { rate } => rate,
            Arrival::Closed { clients } => f64::from(clients.max(1)),
        }
    }
}

/// The built-in workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// The published experiment: 8,000-token shared documents + a short question.
    LongContext,
    /// Short, varied multi-turn chats; each turn resends the history.
    Sharegpt,
    /// Retrieval-augmented: a shared system prompt + several retrieved chunks + a question.
    Rag,
    /// Agents: a long, growing history of steps.
    Agent,
    /// One prefix carries a large share of traffic.
    HotPrefix,
    /// One long system prompt shared by every request, then one of many documents.
    SharedSystemPrompt,
}

/// A workload name that is not one of [`WorkloadKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown workload '{0}' (expected one of: long-context, sharegpt, rag, agent, hot-prefix, shared-system-prompt)")]
pub struct UnknownWorkload(pub String);

impl WorkloadKind {
    /// Every kind, in documentation order.
    pub const ALL: [WorkloadKind; 6] = [
        WorkloadKind::LongContext,
        WorkloadKind::Sharegpt,
        WorkloadKind::Rag,
        WorkloadKind::Agent,
        WorkloadKind::HotPrefix,
        WorkloadKind::SharedSystemPrompt,
    ];

    /// The kebab-case name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::LongContext => "long-context",
            WorkloadKind::Sharegpt => "sharegpt",
            WorkloadKind::Rag => "rag",
            WorkloadKind::Agent => "agent",
            WorkloadKind::HotPrefix => "hot-prefix",
            WorkloadKind::SharedSystemPrompt => "shared-system-prompt",
        }
    }

    /// One line saying what the workload is, for `--help` and reports.
    pub fn description(self) -> &'static str {
        match self {
            WorkloadKind::LongContext => {
                "shared 8,000-token documents, each request one document plus a short unique question (the published experiment)"
            }
            WorkloadKind::Sharegpt => {
                "short, varied multi-turn chats; every turn resends the conversation so far"
            }
            WorkloadKind::Rag => {
                "a shared system prompt, k retrieved chunks of a Zipf-popular corpus, and a question"
            }
            WorkloadKind::Agent => {
                "agent runs: long per-type instructions and a history that grows by a tool result and an action per step"
            }
            WorkloadKind::HotPrefix => {
                "one prefix carries a large share of the traffic, the rest spread over a long tail"
            }
            WorkloadKind::SharedSystemPrompt => {
                "one 3,000-character system prompt opens every request, then one of the long-context documents and a question"
            }
        }
    }
}

impl FromStr for WorkloadKind {
    type Err = UnknownWorkload;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkloadKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownWorkload(s.to_string()))
    }
}

impl std::fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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

/// The parameters of one workload kind. Serializes as the bare parameter object (the kind is
/// [`WorkloadSpec::kind`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum WorkloadParams {
    /// `long-context`.
    LongContext(LongContextParams),
    /// `sharegpt`.
    Sharegpt(SharegptParams),
    /// `rag`.
    Rag(RagParams),
    /// `agent`.
    Agent(AgentParams),
    /// `hot-prefix`.
    HotPrefix(HotPrefixParams),
    /// `shared-system-prompt`.
    SharedSystemPrompt(SharedSystemPromptParams),
}

impl WorkloadParams {
    /// The defaults of `kind`.
    pub fn default_for(kind: WorkloadKind) -> Self {
        match kind {
            WorkloadKind::LongContext => WorkloadParams::LongContext(Default::default()),
            WorkloadKind::Sharegpt => WorkloadParams::Sharegpt(Default::default()),
            WorkloadKind::Rag => WorkloadParams::Rag(Default::default()),
            WorkloadKind::Agent => WorkloadParams::Agent(Default::default()),
            WorkloadKind::HotPrefix => WorkloadParams::HotPrefix(Default::default()),
            WorkloadKind::SharedSystemPrompt => {
                WorkloadParams::SharedSystemPrompt(Default::default())
            }
        }
    }

    /// The kind these parameters belong to.
    pub fn kind(&self) -> WorkloadKind {
        match self {
            WorkloadParams::LongContext(_) => WorkloadKind::LongContext,
            WorkloadParams::Sharegpt(_) => WorkloadKind::Sharegpt,
            WorkloadParams::Rag(_) => WorkloadKind::Rag,
            WorkloadParams::Agent(_) => WorkloadKind::Agent,
            WorkloadParams::HotPrefix(_) => WorkloadKind::HotPrefix,
            WorkloadParams::SharedSystemPrompt(_) => WorkloadKind::SharedSystemPrompt,
        }
    }
}

/// Everything that determines a generated workload.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkloadSpec {
    /// Which workload.
    pub kind: WorkloadKind,
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of requests.
    pub requests: u64,
    /// Arrival process.
    pub arrival: Arrival,
    /// Routing groups (tenants): when set, each document / prefix / conversation gets a
    /// `prompt_cache_key` `tenant-<k>`, k < groups, by a stable hash.
    pub groups: Option<u32>,
    /// Per-kind parameters; must be of kind `kind` (see [`WorkloadSpec::validate`]).
    pub params: WorkloadParams,
}

/// A workload spec with an unusable value; names the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("workload {kind}: {field}: {why}")]
pub struct SpecError {
    /// The workload.
    pub kind: WorkloadKind,
    /// The offending field (dotted path).
    pub field: &'static str,
    /// What is wrong.
    pub why: String,
}

impl WorkloadSpec {
    /// The defaults of `kind`: seed 0, no groups, the kind's request count and Poisson rate.
    pub fn default_for(kind: WorkloadKind) -> Self {
        let (requests, arrival) = match kind {
            WorkloadKind::LongContext | WorkloadKind::SharedSystemPrompt => (
                DEFAULT_LONG_CONTEXT_REQUESTS,
                Arrival::Closed {
                    clients: DEFAULT_LONG_CONTEXT_CLIENTS,
                },
            ),
            _ => (DEFAULT_REQUESTS, Arrival::Poisson { rate: DEFAULT_RATE }),
        };
        WorkloadSpec {
            kind,
            seed: 0,
            requests,
            arrival,
            groups: None,
            params: WorkloadParams::default_for(kind),
        }
    }

    /// Checks every field; [`generate`] never panics on a bad spec (it clamps), but a command
    /// line should report the mistake instead.
    pub fn validate(&self) -> Result<(), SpecError> {
        let fail = |field: &'static str, why: &str| {
            Err(SpecError {
                kind: self.kind,
                field,
                why: why.to_string(),
            })
        };
        if self.params.kind() != self.kind {
            return fail("params", &format!("are for {}", self.params.kind()));
        }
        match self.arrival {
            Arrival::Poisson { rate } if !(rate.is_finite() && rate > 0.0) => {
                return fail(
                    "arrival.rate",
                    "must be a positive number of requests per second",
                )
            }
            Arrival::Closed { clients: 0 } => return fail("arrival.clients", "must be at least 1"),
            _ => {}
        }
        if self.groups == Some(0) {
            return fail("groups", "must be at least 1 when set");
        }
        let range = |field: &'static str, r: &TokenRange| {
            if r.min > r.max {
                fail(field, "min is above max")
            } else {
                Ok(())
            }
        };
        let dist = |field: &'static str, d: &TokenDist| {
            if d.min > d.max {
                fail(field, "min is above max")
            } else if !(d.median.is_finite() && d.median > 0.0) {
                fail(field, "median must be positive")
            } else if !(d.sigma.is_finite() && d.sigma >= 0.0) {
                fail(field, "sigma must be finite and not negative")
            } else {
                Ok(())
            }
        };
        let share = |field: &'static str, x: f64| {
            if (0.0..=1.0).contains(&x) {
                Ok(())
            } else {
                fail(field, "must be within 0..=1")
            }
        };
        let time = |field: &'static str, x: f64| {
            if x.is_finite() && x >= 0.0 {
                Ok(())
            } else {
                fail(field, "must be finite and not negative")
            }
        };
        let mean = |field: &'static str, x: f64| {
            if x.is_finite() && x >= 1.0 {
                Ok(())
            } else {
                fail(field, "must be at least 1")
            }
        };
        match &self.params {
            WorkloadParams::LongContext(p) => {
                if p.documents == 0 {
                    return fail("params.documents", "must be at least 1");
                }
                range("params.question_tokens", &p.question_tokens)?;
                range("params.output_tokens", &p.output_tokens)?;
            }
            WorkloadParams::Sharegpt(p) => {
                mean("params.mean_turns", p.mean_turns)?;
                dist("params.user_tokens", &p.user_tokens)?;
                dist("params.assistant_tokens", &p.assistant_tokens)?;
                share("params.system_prompt_share", p.system_prompt_share)?;
                time("params.think_time_s", p.think_time_s)?;
                time("params.decode_s_per_token", p.decode_s_per_token)?;
            }
            WorkloadParams::Rag(p) => {
                if p.corpus_chunks == 0 {
                    return fail("params.corpus_chunks", "must be at least 1");
                }
                if p.chunks_per_request > p.corpus_chunks {
                    return fail("params.chunks_per_request", "exceeds corpus_chunks");
                }
                if !(p.zipf_exponent.is_finite() && p.zipf_exponent >= 0.0) {
                    return fail("params.zipf_exponent", "must be finite and not negative");
                }
                range("params.question_tokens", &p.question_tokens)?;
                range("params.output_tokens", &p.output_tokens)?;
            }
            WorkloadParams::Agent(p) => {
                if p.agent_types == 0 {
                    return fail("params.agent_types", "must be at least 1");
                }
                range("params.task_tokens", &p.task_tokens)?;
                mean("params.mean_steps", p.mean_steps)?;
                dist("params.tool_result_tokens", &p.tool_result_tokens)?;
                dist("params.action_tokens", &p.action_tokens)?;
                time("params.tool_time_s", p.tool_time_s)?;
                time("params.decode_s_per_token", p.decode_s_per_token)?;
            }
            WorkloadParams::SharedSystemPrompt(p) => {
                if p.documents == 0 {
                    return fail("params.documents", "must be at least 1");
                }
                range("params.question_tokens", &p.question_tokens)?;
                range("params.output_tokens", &p.output_tokens)?;
            }
            WorkloadParams::HotPrefix(p) => {
                share("params.hot_share", p.hot_share)?;
                range("params.suffix_tokens", &p.suffix_tokens)?;
                range("params.output_tokens", &p.output_tokens)?;
            }
        }
        Ok(())
    }
}

/// A lazy stream of generated requests, in arrival order, ids `0..`.
pub struct Generator {
    driver: schedule::Driver,
}

impl Iterator for Generator {
    type Item = Request;
    fn next(&mut self) -> Option<Request> {
        self.driver.next()
    }
}

/// Root tags of each kind's id tree, so kinds never share content.
fn kind_root(kind: WorkloadKind, seed: u64) -> u64 {
    generator_id(kind as u64 + 1, seed)
}

/// The requests of `spec`: sorted by `arrival_s`, ids `0..`, identical for identical specs.
/// Parameters come from `spec.params` (the variant decides the shape). Never panics: unusable
/// values are clamped (call [`WorkloadSpec::validate`] first to report them).
pub fn generate(spec: &WorkloadSpec) -> Generator {
    let rng = Pcg64Mcg::seed_from_u64(spec.seed);
    let kind = spec.params.kind();
    let root = kind_root(kind, spec.seed);
    let groups = Groups::new(generator_id(root, u64::MAX), spec.groups);
    let source: Box<dyn schedule::SessionSource> = match &spec.params {
        WorkloadParams::LongContext(p) => Box::new(kinds::LongContext {
            p: p.clone(),
            docs_root: root,
            groups,
        }),
        WorkloadParams::Sharegpt(p) => Box::new(kinds::Sharegpt {
            p: p.clone(),
            root,
            groups,
        }),
        WorkloadParams::Rag(p) => Box::new(kinds::Rag {
            p: p.clone(),
            root,
            zipf: ZipfRanks::new(u64::from(p.corpus_chunks), p.zipf_exponent),
            groups,
        }),
        WorkloadParams::Agent(p) => Box::new(kinds::Agent {
            p: p.clone(),
            root,
            groups,
        }),
        WorkloadParams::HotPrefix(p) => Box::new(kinds::HotPrefix {
            p: p.clone(),
            root,
            groups,
        }),
        WorkloadParams::SharedSystemPrompt(p) => Box::new(kinds::SharedSystemPrompt {
            p: p.clone(),
            root,
            groups,
        }),
    };
    Generator {
        driver: schedule::Driver::new(rng, source, spec.requests, spec.arrival.nominal_rate()),
    }
}

#[cfg(test)]
mod tests;
