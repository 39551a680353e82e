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
mod params;
pub(crate) mod schedule;

pub use distributions::{TokenDist, TokenRange};
pub use param_override::ParamError;
pub use params::{
    AgentParams, HotPrefixParams, LongContextParams, RagParams, SharedSystemPromptParams,
    SharegptParams, DEFAULT_DOC_TOKENS, DEFAULT_LONG_CONTEXT_CLIENTS,
    DEFAULT_LONG_CONTEXT_DOCUMENTS, DEFAULT_LONG_CONTEXT_REQUESTS, DEFAULT_RATE, DEFAULT_REQUESTS,
};

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
