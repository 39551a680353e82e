//! A model of one vLLM-like inference engine, driven by a clock it is handed.
//!
//! Pure: no I/O, no threads, no wall clock. Time is `f64` seconds chosen by the caller, so the
//! simulator can run it as fast as it can and the mock engine can run it in real time.
#![forbid(unsafe_code)]

pub mod cache;
pub mod cost;
pub mod engine;
pub mod presets;

pub use cache::PrefixCache;
pub use cost::CostModel;
pub use engine::{Engine, EngineConfig, EngineEvent, EngineRequest, EngineStats};
pub use presets::{preset, Preset, PRESETS};
