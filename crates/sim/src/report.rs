//! The machine-readable result of a simulation (serialized as the `--json` file).
//!
//! Field names are a contract: later checks read `workload`, `fleet`, `oracle_hit_rate` and, per
//! result, `strategy`, `requests`, `ttft_ms`, `e2e_ms`, `kv_hit_rate`, `throughput_rps`,
//! `output_tokens_per_s`, `instance_share` and `overflow_rate`. Other fields are extras.

use std::collections::BTreeMap;

use prefix_router_engine_model::EngineConfig;
use prefix_router_workload::ScaleEvent;

use crate::stats::{HitRateBucket, LatencySummary};
use crate::{Driver, WorkloadSource};

/// Everything a simulation produced, in the JSON shape later checks read.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// What was replayed.
    pub workload: WorkloadSummary,
    /// What it was replayed on.
    pub fleet: FleetSummary,
    /// Hit rate of one infinite cache seeing every request in order: the ceiling for any router.
    pub oracle_hit_rate: f64,
    /// TTFT percentiles no router can beat in the engine model: each request alone on an idle
    /// engine holding every prefix sent before it ([`crate::floor`]); `None` where no engine
    /// model describes the fleet (`bench` against a real one).
    pub ttft_floor_ms: Option<LatencySummary>,
    /// One entry per strategy, in the order they were given.
    pub results: Vec<StrategyResult>,
}

/// The workload as the report describes it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkloadSummary {
    /// Short name.
    pub name: String,
    /// Generator spec or trace file.
    #[serde(flatten)]
    pub source: WorkloadSource,
    /// Requests replayed.
    pub requests: u64,
    /// How clients sent them.
    pub driver: Driver,
    /// Mean prompt length, tokens.
    pub mean_prompt_tokens: f64,
    /// Mean output length, tokens.
    pub mean_output_tokens: f64,
    /// Last arrival time minus first (open loop), seconds.
    pub arrival_span_s: f64,
}

/// The fleet and router settings as the report describes them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetSummary {
    /// Instances at the start.
    pub instances: u32,
    /// Engine preset name.
    pub preset: String,
    /// The preset's engine configuration.
    pub engine: EngineConfig,
    /// Routing-key length in characters.
    pub prefix_length: usize,
    /// Router RNG seed.
    pub seed: u64,
    /// Instances added or removed during the run.
    pub scale_events: Vec<ScaleEvent>,
    /// Settings of each strategy, in run order.
    pub strategies: Vec<StrategySettings>,
    /// The router replicas and what they scrape.
    pub routers: crate::RouterModel,
}

/// A strategy's settings as the report records them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StrategySettings {
    /// Strategy name.
    pub strategy: String,
    /// Prefix-aware overflow threshold (in-flight requests).
    pub concurrency_threshold: u32,
    /// `next-in-order` or `least-outstanding`.
    pub overflow: String,
    /// Bounded-load factor, if any.
    pub balance_factor: Option<f64>,
}

/// What one strategy achieved on the workload.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StrategyResult {
    /// Strategy name.
    pub strategy: String,
    /// Requests completed.
    pub requests: u64,
    /// Time to first token (arrival to first output token), milliseconds.
    pub ttft_ms: LatencySummary,
    /// End-to-end latency (arrival to last output token), milliseconds.
    pub e2e_ms: LatencySummary,
    /// Prompt tokens served from the engines' prefix caches over all prompt tokens (0..1).
    pub kv_hit_rate: f64,
    /// Completed requests over (last finish − first arrival).
    pub throughput_rps: f64,
    /// Output tokens over the same span.
    pub output_tokens_per_s: f64,
    /// Fraction of requests dispatched to each instance (every instance that ever existed, in
    /// creation order).
    pub instance_share: Vec<f64>,
    /// Fraction of decisions that skipped the key's preferred instance because of load (0..1).
    pub overflow_rate: f64,
    /// Instance ids matching `instance_share`.
    pub instance_ids: Vec<String>,
    /// Requests dispatched to each instance.
    pub instance_requests: Vec<u64>,
    /// Decisions by reason label (`preferred`, `overflow`, `random`, ...).
    pub decisions: BTreeMap<String, u64>,
    /// Prompt tokens of all requests.
    pub prompt_tokens: u64,
    /// Of those, served from cache.
    pub cached_tokens: u64,
    /// Output tokens of all requests.
    pub output_tokens: u64,
    /// Last finish minus first arrival, seconds.
    pub makespan_s: f64,
    /// TTFT percentiles 0, 1, ..., 100 in milliseconds (a compact CDF).
    pub ttft_percentiles_ms: Vec<f64>,
    /// Hit rate of requests by the time of their first token.
    pub hit_rate_over_time: Vec<HitRateBucket>,
    /// The strategy's learned state at the end, for strategies that keep one (`cache-aware`:
    /// index size and bytes against its budget, predicted and engine-reported cached tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy_stats: Option<prefix_router_core::StrategyStats>,
    /// How well each shared prefix's requests stayed on one instance, where the requests
    /// are known (the simulator; the demo prints its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<prefix_router_workload::Affinity>,
    /// What each scale event did to the requests around it (the simulator, with `--scale`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_scale: Vec<AfterScale>,
    /// How each decision compared with the soonest start any instance offered at that moment
    /// (the simulator, with `--clairvoyant`; not for the clairvoyant row itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// A strategy's decisions read against every engine's true state at each decision
/// ([`crate::clairvoyant`]): where the request's first token would have come on the instance
/// chosen and on the soonest one, each run forward with nothing arriving after it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Placement {
    /// Share of requests sent where they would start within 1 ms of the soonest (0..1).
    pub at_soonest: f64,
    /// Time to first token lost to the choice (chosen minus soonest), milliseconds.
    pub lost_ms: LatencySummary,
    /// Of the requests at or above the run's P90 time to first token, the share that could
    /// have started under it on another instance (0..1): a tail placement made, not load.
    pub slow_placed: f64,
}

/// The requests around one scale event: the minute before against the minute after
/// ([`crate::metrics::SCALE_WINDOW_S`]), by arrival time.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AfterScale {
    /// When, seconds.
    pub at_s: f64,
    /// Instances added (> 0) or removed (< 0).
    pub delta: i32,
    /// Hit rate of the requests that arrived in the window before it.
    pub hit_rate_before: f64,
    /// Hit rate of the requests that arrived in the window after it.
    pub hit_rate_after: f64,
    /// TTFT P90 of the requests that arrived in the window before it, milliseconds.
    pub ttft_p90_before_ms: f64,
    /// TTFT P90 of the requests that arrived in the window after it, milliseconds.
    pub ttft_p90_after_ms: f64,
}
