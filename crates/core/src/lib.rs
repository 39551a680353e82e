//! prefix-router core: routing keys, the fleet view and every routing strategy.
//!
//! This crate is pure and deterministic given a seed: no I/O and no async runtime, so that the
//! HTTP server and the fleet simulator run exactly the same routing code.
#![forbid(unsafe_code)]

pub mod chain;
pub mod config;
pub mod decision;
pub mod dispatch;
pub mod extract;
pub mod fleet;
pub mod group;
pub mod key;
pub mod prehashed;
pub mod prewarm;
pub mod reported;
pub mod residency;
pub mod strategies;
pub mod strategy;
pub mod wire;

pub use chain::{Chain, ChainSpec};
pub use config::{ConcurrencyThreshold, ConfigError, PrefixLength};
pub use decision::{Decision, Reason, RouteError};
pub use dispatch::{dispatch, dispatch_to, Dispatched, End, Ticket};
pub use extract::{ExtractError, KeyOptions, RequestInfo};
pub use fleet::{Fleet, FleetSnapshot, Instance, InstanceId, InstanceSpec, InstanceState};
pub use group::{GroupError, GroupId};
pub use key::KeyHash;
pub use reported::EngineQueue;
pub use residency::{Report, Residency, TokenRoute};
pub use strategy::{
    Feedback, MembershipChange, ParamSpec, RouteRequest, RouteRng, Strategy, StrategyConfig,
    StrategyEntry, StrategyKind, StrategyStats, TicketInfo, Usage, REGISTRY,
};
