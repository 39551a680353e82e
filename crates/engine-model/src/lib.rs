//! A model of one vLLM-like inference engine, driven by a clock it is handed.
//!
//! Pure: no I/O, no threads, no wall clock. Time is `f64` seconds chosen by the caller, so the
//! simulator can run it as fast as it can and the mock engine can run it in real time.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cache;
pub mod cost;
pub mod engine;
pub mod presets;
pub mod spec;

pub use cache::{CacheChange, PrefixCache, PrefixMatch};
pub use cost::{CostModel, StepWork};
pub use engine::{
    ConfigError, Engine, EngineConfig, EngineEvent, EngineRequest, EngineStats, RequestError,
};
pub use presets::{preset, Preset, PRESETS};
