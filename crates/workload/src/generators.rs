//! Seeded workload generators.

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Arrival {
    /// Open loop: Poisson arrivals at `rate` requests per second.
    Poisson { rate: f64 },
    /// Closed loop: `clients` concurrent clients, each sending its next request when the last ends.
    Closed { clients: u32 },
}

/// The built-in workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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
}
