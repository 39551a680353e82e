//! The HTTP data plane of prefix-router.
//!
//! A reverse proxy in front of a fleet of LLM inference servers: it reads each request once,
//! derives its routing key with `prefix-router-core`, asks the configured strategy for an
//! instance and streams the instance's answer back chunk by chunk. Around that: retries before
//! the response starts, timeouts, active and passive health, Prometheus metrics, an admin API
//! and configuration reload.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access_log;
pub mod admin;
pub mod body;
pub mod canned;
pub mod conn;
pub mod dashboard;
pub mod discovery;
pub mod engine_metrics;
pub mod error;
pub mod fields;
pub mod front;
pub mod guard;
pub mod h1;
pub mod handler;
pub mod health;
pub mod io_threads;
pub mod kubernetes;
pub mod kv_events;
pub mod membership;
pub mod metrics;
pub mod models;
pub mod opening;
pub mod outcome;
pub mod pick;
pub mod pool;
pub mod prewarm;
pub mod prom;
pub mod proxy;
pub mod reload;
pub mod responses;
pub mod routing;
pub mod server;
pub mod settings;
pub mod signals;
pub mod state;
pub mod stats;
pub mod stream;
pub mod tls;
pub mod upstream;
pub mod usage;

pub use error::{ApiError, ServerError};
pub use server::{Front, Router, RunningRouter};
pub use settings::{ConfigSource, Overrides, Settings, SettingsError};
pub use signals::{run_front_until_signal, run_until_signal};
