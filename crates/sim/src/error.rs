//! Why a simulation cannot run.

/// A simulation that cannot run; the message names the offending setting or request.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The engine preset name is not one of `prefix_router_engine_model::PRESETS`.
    #[error("unknown preset '{name}' (expected one of: {known})")]
    UnknownPreset {
        /// The name that was asked for.
        name: String,
        /// Every known preset, comma-separated.
        known: String,
    },
    /// The workload holds no request.
    #[error("the workload has no requests")]
    EmptyWorkload,
    /// The fleet would start with no instance.
    #[error("instances must be at least 1, got 0")]
    ZeroInstances,
    /// A setting is out of range or inconsistent; `field` names it.
    #[error("invalid {field}: {why}")]
    InvalidConfig {
        /// The setting (`strategies`, `scale`, `concurrency`, ...).
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// A request of the workload cannot be simulated; `request` is its position.
    #[error("request {request}: {why}")]
    InvalidRequest {
        /// Position of the request in the workload.
        request: usize,
        /// What is wrong with it.
        why: String,
    },
    /// A strategy could not be built from its configuration.
    #[error("strategy configuration: {0}")]
    Strategy(#[from] prefix_router_core::ConfigError),
    /// The router found no instance for a request (should not happen in a healthy simulated fleet).
    #[error("strategy '{strategy}' could not route request {request}: {source}")]
    Route {
        /// Strategy name.
        strategy: String,
        /// Position of the request in the workload.
        request: usize,
        /// Why routing failed.
        source: prefix_router_core::RouteError,
    },
    /// The simulation ended with requests that never finished (an engine never scheduled them).
    #[error(
        "strategy '{strategy}': {unfinished} of {total} requests never finished (engine stalled)"
    )]
    Stalled {
        /// Strategy name.
        strategy: String,
        /// Requests that did not finish.
        unfinished: usize,
        /// Requests in the workload.
        total: usize,
    },
    /// An engine model broke its clock contract (its next step does not lie in the future), which
    /// would make the simulation spin forever.
    #[error(
        "engine of instance {instance} scheduled its next step at {next}s, not after now ({now}s)"
    )]
    EngineClock {
        /// Instance index.
        instance: usize,
        /// Simulated time of the step just run.
        now: f64,
        /// The next step time the engine reported.
        next: f64,
    },
    /// Writing the SVG plot failed.
    #[error("cannot write plot: {0}")]
    Plot(String),
}
