//! Open- and closed-loop HTTP load generator for prefix-router.
//!
//! Replays a workload of `prefix-router-workload` (generated or read from a trace) against any
//! OpenAI-compatible base URL: our router, an engine directly, or another router. Every request
//! is `POST {target}/v1/chat/completions` with the request's deterministic chat body (equal
//! prefixes give equal bytes), streaming, with `stream_options.include_usage` so the final chunk
//! reports prompt, cached and output tokens.
//!
//! Two drivers:
//! - **open loop**: each request is sent at its scheduled time whatever the server does, so a
//!   slow server shows up as latency instead of a slower schedule; how late each send was is
//!   recorded;
//! - **closed loop**: `C` workers each send their next request when the previous one ends.
//!
//! Per request it measures time to first content chunk, end-to-end latency, tokens, the
//! router's `x-prefix-router-instance` / `x-prefix-router-decision` headers and the kind of any
//! failure; [`BenchOutcome`] keeps the records and their latencies sorted, for exact nearest-rank percentiles.
//!
//! Entry points: [`run`] and [`run_with_progress`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod config;
pub mod driver;
pub mod error;
pub mod outcome;
pub mod record;
pub mod schedule;
pub mod split;
pub mod sse;

pub use config::{BenchConfig, LoadMode, Target};
pub use driver::{run, run_with_progress, Progress};
pub use error::{FailureKind, LoadgenError};
pub use outcome::{BenchOutcome, LatencyStats};
pub use record::{Failure, RequestRecord};
pub use split::{affinity, run_split, Affinity};
pub use sse::Usage;
