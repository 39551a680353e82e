//! Discrete-event fleet simulator: one router, N engine models, one workload, several strategies.
//!
//! The router side runs the real `prefix-router-core` code: routing keys come from the same
//! extraction function the HTTP server uses, decisions from the same strategy objects, and the
//! in-flight counts they read are the router's own view (acquired at dispatch, released when the
//! last token comes back). The engine side is `prefix-router-engine-model`, one engine per
//! instance. Everything is seeded: the same inputs give a byte-identical report.
//!
//! Entry point: [`simulate`]; presentation: [`table::render`] and [`plot::write_svg`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clairvoyant;
pub mod config;
pub mod error;
pub mod events;
pub mod floor;
pub mod input;
pub mod members;
pub mod metrics;
pub mod plot;
pub mod prewarm;
pub mod queue;
pub mod report;
pub mod routers;
pub mod run;
pub mod simulate;
pub mod stats;
pub mod sweep;
pub mod table;

pub use config::{Driver, SimConfig};
pub use error::SimError;
pub use events::KvEventModel;
pub use input::{SimWorkload, WorkloadSource};
pub use report::{
    FleetSummary, Placement, Report, StrategyResult, StrategySettings, WorkloadSummary,
};
pub use routers::{RouterModel, ScrapeModel};
pub use simulate::{engine_config, routing_keys, simulate, simulate_keyed, Prepared, Progress};
pub use stats::{HitRateBucket, LatencySummary};

#[cfg(test)]
mod testkit;
