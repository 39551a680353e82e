//! Workloads replayed over real HTTP, reported as `simulate` reports its own, so that a real
//! run and a simulated one read side by side:
//!
//! - [`bench`]: a load-generator run against any OpenAI-compatible URL as `simulate`'s report
//!   (table, JSON and plot), plus what only a real run has (errors, send rate and lag);
//! - [`demo`]: mock engines and routers started on 127.0.0.1 for each strategy in turn, the
//!   workload replayed through them, and the runs in engine time beside `simulate`'s figures.
//!
//! The CLI's `bench` and `demo` only parse flags, print and write files; what they do is here.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod demo;

/// Why a replay could not run or be reported.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The table renderer needs an engine preset and none is compiled in.
    #[error("no engine preset to render the table with")]
    NoPreset,
    /// The engine preset is not known.
    #[error("preset: {0}")]
    Preset(#[source] prefix_router_sim::SimError),
    /// The simulator could not run the same workload.
    #[error("simulate: {0}")]
    Simulate(#[from] prefix_router_sim::SimError),
    /// A strategy's settings do not build.
    #[error("strategy: {0}")]
    Strategy(#[from] prefix_router_core::ConfigError),
    /// No strategy at that position of the config.
    #[error("no strategy number {0} in the demo's config")]
    NoStrategy(usize),
    /// The mock engines' settings are invalid.
    #[error("mock engine: {0}")]
    MockEngine(#[from] prefix_router_mock_engine::ConfigError),
    /// A mock engine could not start.
    #[error("starting a mock engine: {0}")]
    EngineStart(#[from] prefix_router_mock_engine::StartError),
    /// The router's settings are invalid.
    #[error("router settings: {0}")]
    Settings(#[from] prefix_router_server::settings::SettingsError),
    /// A router could not start.
    #[error("starting the router: {0}")]
    RouterStart(#[from] prefix_router_server::ServerError),
    /// The load generator could not run.
    #[error("load generator: {0}")]
    Loadgen(#[from] prefix_router_loadgen::LoadgenError),
    /// A mock engine started with KV events has no socket to subscribe to.
    #[error("a mock engine without its KV-event socket")]
    NoKvSocket,
    /// A router set to subscribe to KV events has no feeds.
    #[error("the router has no KV-event feeds")]
    NoFeeds,
    /// A router did not subscribe in time.
    #[error("the router did not subscribe to {instance}'s KV events within {within_s} s")]
    NotSubscribed {
        /// The engine it did not reach.
        instance: String,
        /// How long it was given.
        within_s: u64,
    },
}
