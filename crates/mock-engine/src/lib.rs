//! An OpenAI-compatible fake inference server whose timing and prefix cache come from
//! `prefix-router-engine-model`, run in real time.
//!
//! One task owns the [`Engine`](prefix_router_engine_model::Engine): HTTP handlers hand it
//! tokenized requests over a channel; it sleeps until the engine's next step ends (engine
//! seconds × `time_scale` = wall seconds), wakes early on new submissions, and delivers every
//! request's tokens to its HTTP response as the steps produce them. So concurrent requests
//! really share decode steps, wait in a queue past the engine's limits, and hit the prefix
//! cache when their text repeats.
//!
//! Served: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses` (streaming
//! and not; stored responses continued with `previous_response_id`, read with
//! `GET /v1/responses/{id}`),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (vLLM's metric names), and the native
//! `POST /invocations` / `GET /ping`. Fault injection ([`Faults`]) makes it fail on purpose.
//!
//! ```no_run
//! # async fn demo() -> Result<(), prefix_router_mock_engine::StartError> {
//! use prefix_router_mock_engine::{MockEngine, MockEngineConfig};
//! let config = MockEngineConfig::from_preset("small")?.with_time_scale(0.05);
//! let engine = MockEngine::bind("127.0.0.1:0".parse().unwrap(), config).await?;
//! println!("serving on {}", engine.url());
//! engine.shutdown().await;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod api_error;
mod body;
mod config;
mod driver;
mod error;
mod faults;
mod handlers;
mod instant;
pub mod kv_events;
mod metrics;
mod request;
mod response;
mod responses;
mod server;
mod stream;
pub mod tokenizer;
mod words;

pub use config::{Faults, MockEngineConfig, DEFAULT_MAX_TOKENS, DEFAULT_MODEL, MAX_OUTPUT_TOKENS};
pub use error::{ConfigError, StartError};
pub use kv_events::KvEventsConfig;
pub use server::{MockEngine, ShutdownHandle};
