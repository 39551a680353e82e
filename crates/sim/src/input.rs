//! The workload a simulation replays: requests plus a description of where they came from.

use prefix_router_workload::{Request, WorkloadSpec};

/// Where a workload's requests came from (recorded in the report).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "source")]
pub enum WorkloadSource {
    /// A seeded generator of the workload crate.
    Generated {
        /// The generator's full specification.
        spec: WorkloadSpec,
    },
    /// A trace file.
    Trace {
        /// Path as given.
        path: String,
        /// Format name (`jsonl`, `mooncake`, ...), as detected by the loader.
        format: String,
    },
}

/// Requests to replay, sorted by arrival, and their provenance.
#[derive(Debug, Clone)]
pub struct SimWorkload {
    /// Short name for tables (`long-context`, a trace's file name, ...).
    pub name: String,
    /// Provenance.
    pub source: WorkloadSource,
    /// The requests, sorted by `arrival_s`.
    pub requests: Vec<Request>,
}
