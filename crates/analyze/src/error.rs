//! What can go wrong in an analysis, each error naming what to fix.

use prefix_router_sim::SimError;
use prefix_router_workload::trace::TraceError;

/// An analysis that could not run.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// The trace could not be read or parsed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A setting of the analysis is out of range.
    #[error("{field}: {why}")]
    InvalidConfig {
        /// The flag or field.
        field: &'static str,
        /// What is wrong and what is allowed.
        why: String,
    },
    /// A simulation of the sweep failed.
    #[error("simulating {setting}: {source}")]
    Sim {
        /// The setting that was simulated.
        setting: String,
        /// Why it failed.
        #[source]
        source: SimError,
    },
    /// The SVG could not be drawn or written.
    #[error("plot: {0}")]
    Plot(String),
}
