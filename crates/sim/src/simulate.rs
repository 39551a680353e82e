//! The entry point: every strategy over the same workload, each on a fresh fleet.

use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{extract, KeyHash, StrategyConfig};
use prefix_router_engine_model::{EngineConfig, PRESETS};
use prefix_router_workload::Request;

use crate::metrics::summarize;
use crate::report::{FleetSummary, Report, StrategySettings, WorkloadSummary};
use crate::run::{run_strategy, RunInputs};
use crate::{oracle, SimConfig, SimError, SimWorkload};

/// Where a simulation is, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress<'a> {
    /// Strategy running now.
    pub strategy: &'a str,
    /// Its position among the strategies (0-based).
    pub strategy_index: usize,
    /// Number of strategies.
    pub strategies: usize,
    /// Requests finished in this strategy's run.
    pub finished: u64,
    /// Requests in the workload.
    pub requests: u64,
}

impl Progress<'_> {
    /// Requests finished over all strategies so far.
    pub fn done_total(&self) -> u64 {
        self.strategy_index as u64 * self.requests + self.finished
    }
    /// Requests to simulate over all strategies.
    pub fn grand_total(&self) -> u64 {
        self.strategies as u64 * self.requests
    }
}

/// Looks an engine preset up by name; the error lists the known ones.
pub fn engine_config(preset: &str) -> Result<EngineConfig, SimError> {
    prefix_router_engine_model::preset(preset).map(|p| (p.config)()).ok_or_else(|| SimError::UnknownPreset {
        name: preset.to_string(),
        known: PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
    })
}

/// Checks the requests and derives each one's routing key exactly as the server would: the chat
/// body rendered (text cut at `prefix_length` characters, which is all the key reads) and passed
/// through the server's own `extract::chat_request`.
pub fn routing_keys(requests: &[Request], config: &SimConfig) -> Result<Vec<KeyHash>, SimError> {
    let len = config.prefix_length;
    let mut last_arrival = f64::NEG_INFINITY;
    requests
        .iter()
        .enumerate()
        .map(|(i, req)| {
            let bad = |why: String| SimError::InvalidRequest { request: i, why };
            if !req.arrival_s.is_finite() || req.arrival_s < 0.0 {
                return Err(bad(format!("arrival_s must be a finite number ≥ 0, got {}", req.arrival_s)));
            }
            if req.arrival_s < last_arrival {
                return Err(bad(format!(
                    "arrival_s {} is earlier than the previous request's {}: requests must be sorted by arrival",
                    req.arrival_s, last_arrival
                )));
            }
            last_arrival = req.arrival_s;
            if req.prompt_tokens() == 0 {
                return Err(bad("prompt has no tokens".into()));
            }
            if req.output_tokens == 0 {
                return Err(bad("output_tokens must be at least 1".into()));
            }
            let body = req.chat_body(false, Some(len.get()));
            extract::chat_request(body.as_bytes(), len)
                .map(|info| info.key)
                .map_err(|e| bad(format!("routing key: {e}")))
        })
        .collect()
}

/// Runs every configured strategy over the workload (one after another, each with a fresh fleet
/// and fresh engines, all from the same seed) and collects the report. Deterministic: the same
/// inputs give the same report, byte for byte once serialized.
pub fn simulate(
    workload: &SimWorkload,
    config: &SimConfig,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Report, SimError> {
    config.validate()?;
    let engine = engine_config(&config.preset)?;
    let requests = &workload.requests;
    if requests.is_empty() {
        return Err(SimError::EmptyWorkload);
    }
    let strategies = config.strategies.iter().map(|s| s.build()).collect::<Result<Vec<_>, _>>()?;
    let keys = routing_keys(requests, config)?;
    let inputs = RunInputs { requests, keys: &keys, engine: &engine, config };

    let total = requests.len() as u64;
    let mut results = Vec::with_capacity(strategies.len());
    for (index, strategy) in strategies.iter().enumerate() {
        let name = strategy.name();
        let mut report = |finished: u64| {
            progress(Progress {
                strategy: name,
                strategy_index: index,
                strategies: strategies.len(),
                finished,
                requests: total,
            })
        };
        report(0);
        let outcome = run_strategy(inputs, strategy.as_ref(), &mut report)?;
        results.push(summarize(name, requests, &outcome, config.hit_rate_buckets));
    }

    Ok(Report {
        workload: workload_summary(workload, config),
        fleet: FleetSummary {
            instances: config.instances,
            preset: config.preset.clone(),
            engine: engine.clone(),
            prefix_length: config.prefix_length.get(),
            seed: config.seed,
            scale_events: config.scale.clone(),
            strategies: config.strategies.iter().map(settings).collect(),
        },
        oracle_hit_rate: oracle::oracle_hit_rate(requests, engine.block_tokens),
        results,
    })
}

fn settings(s: &StrategyConfig) -> StrategySettings {
    StrategySettings {
        strategy: s.kind.name().to_string(),
        concurrency_threshold: s.concurrency_threshold.get(),
        overflow: match s.overflow {
            OverflowPolicy::NextInOrder => "next-in-order",
            OverflowPolicy::LeastOutstanding => "least-outstanding",
        }
        .to_string(),
        balance_factor: s.balance_factor,
    }
}

fn workload_summary(workload: &SimWorkload, config: &SimConfig) -> WorkloadSummary {
    let reqs = &workload.requests;
    let n = reqs.len().max(1) as f64;
    let first = reqs.first().map_or(0.0, |r| r.arrival_s);
    let last = reqs.last().map_or(0.0, |r| r.arrival_s);
    WorkloadSummary {
        name: workload.name.clone(),
        source: workload.source.clone(),
        requests: reqs.len() as u64,
        driver: config.driver,
        mean_prompt_tokens: reqs.iter().map(|r| f64::from(r.prompt_tokens())).sum::<f64>() / n,
        mean_output_tokens: reqs.iter().map(|r| f64::from(r.output_tokens)).sum::<f64>() / n,
        arrival_span_s: last - first,
    }
}
