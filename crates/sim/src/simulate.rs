//! The entry point: every strategy over the same workload, each on a fresh fleet.

use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{KeyHash, KeyOptions, StrategyConfig};
use prefix_router_engine_model::{EngineConfig, PRESETS};
use prefix_router_workload::Request;

use crate::clairvoyant::{run_clairvoyant, CLAIRVOYANT};
use crate::metrics::summarize;
use crate::report::{FleetSummary, Report, StrategySettings, WorkloadSummary};
use crate::run::{run_replicas, Chains, RunInputs};
use crate::{SimConfig, SimError, SimWorkload};

/// Where a simulation is, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress<'a> {
    /// Strategy running now.
    pub strategy: &'a str,
    /// Its position among the runs (0-based).
    pub strategy_index: usize,
    /// Runs in all: the strategies, then the clairvoyant reference when asked for.
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
    prefix_router_engine_model::preset(preset)
        .map(|p| (p.config)())
        .ok_or_else(|| SimError::UnknownPreset {
            name: preset.to_string(),
            known: PRESETS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
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
            crate::run::route_info(req, &KeyOptions::key_only(len))
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
    engine_config(&config.preset)?;
    if workload.requests.is_empty() {
        return Err(SimError::EmptyWorkload);
    }
    let keys = routing_keys(&workload.requests, config)?;
    let prepared = Prepared {
        keys: &keys,
        chains: None,
        oracle_hit_rate: None,
    };
    simulate_keyed(workload, config, prepared, progress)
}

/// What a sweep that replays the same requests many times derives once and hands every run.
#[derive(Debug, Clone, Copy)]
pub struct Prepared<'a> {
    /// Each request's routing key at the config's prefix length ([`routing_keys`]).
    pub keys: &'a [KeyHash],
    /// Each request's chain, for the strategies cut with its spec ([`Chains`]).
    pub chains: Option<&'a Chains>,
    /// The trace's oracle hit rate at the engine's block size (computed when `None`).
    pub oracle_hit_rate: Option<f64>,
}

/// [`simulate`] with each request's routing key already derived by [`routing_keys`] at
/// `config.prefix_length`: a sweep that replays the same requests many times (other
/// strategies, fleet sizes, arrival rates) derives the keys once per prefix length, which on
/// long prompts costs more than a simulation ([`Prepared`]).
pub fn simulate_keyed(
    workload: &SimWorkload,
    config: &SimConfig,
    prepared: Prepared<'_>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Report, SimError> {
    config.validate()?;
    let engine = engine_config(&config.preset)?;
    let requests = &workload.requests;
    if requests.is_empty() {
        return Err(SimError::EmptyWorkload);
    }
    let Prepared { keys, chains, .. } = prepared;
    if keys.len() != requests.len() {
        return Err(SimError::InvalidConfig {
            field: "keys",
            why: format!(
                "{} routing keys for {} requests: derive them with routing_keys",
                keys.len(),
                requests.len()
            ),
        });
    }
    if let Some(c) = chains.filter(|c| c.chains.len() != requests.len()) {
        return Err(SimError::InvalidConfig {
            field: "chains",
            why: format!(
                "{} chains for {} requests: derive them with Chains::derive",
                c.chains.len(),
                requests.len()
            ),
        });
    }
    // One strategy per router replica, each built alike and learning on its own.
    let strategies = config
        .strategies
        .iter()
        .map(|s| {
            (0..config.routers.replicas.max(1))
                .map(|_| s.build())
                .collect()
        })
        .collect::<Result<Vec<Vec<_>>, _>>()?;
    let inputs = RunInputs {
        requests,
        keys,
        engine: &engine,
        config,
        chains,
    };

    let total = requests.len() as u64;
    // Every run, in order: the strategies', then the clairvoyant reference's.
    let names: Vec<&str> = strategies
        .iter()
        .map(|replicas| replicas.first().map_or("", |s| s.name()))
        .chain(config.clairvoyant.then_some(CLAIRVOYANT))
        .collect();
    let mut results = Vec::with_capacity(names.len());
    for (index, &name) in names.iter().enumerate() {
        let mut report = |finished: u64| {
            progress(Progress {
                strategy: name,
                strategy_index: index,
                strategies: names.len(),
                finished,
                requests: total,
            })
        };
        report(0);
        let outcome = match strategies.get(index) {
            Some(replicas) => run_replicas(inputs, replicas, &mut report)?,
            None => run_clairvoyant(inputs, &mut report)?,
        };
        results.push(summarize(
            name,
            requests,
            &outcome,
            config.hit_rate_buckets,
            &config.scale,
        ));
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
            routers: config.routers,
        },
        oracle_hit_rate: prepared.oracle_hit_rate.unwrap_or_else(|| {
            prefix_router_workload::trace::oracle_hit_rate(requests, engine.block_tokens)
        }),
        ttft_floor_ms: Some(crate::floor::ttft_floor(requests, &engine)),
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
        mean_prompt_tokens: reqs
            .iter()
            .map(|r| f64::from(r.prompt_tokens()))
            .sum::<f64>()
            / n,
        mean_output_tokens: reqs.iter().map(|r| f64::from(r.output_tokens)).sum::<f64>() / n,
        arrival_span_s: last - first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{config, shared_docs};
    use crate::Driver;
    use prefix_router_core::StrategyKind;
    use prefix_router_workload::ScaleEvent;

    fn quiet(_: Progress<'_>) {}

    #[test]
    fn every_request_finishes_and_shares_add_up() {
        let w = shared_docs(300, 20, 20.0, 1);
        let report = simulate(
            &w,
            &config(4, &StrategyKind::all().collect::<Vec<_>>()),
            &mut quiet,
        )
        .expect("simulation runs");
        assert_eq!(report.results.len(), StrategyKind::all().count());
        for r in &report.results {
            assert_eq!(r.requests, 300, "{}", r.strategy);
            assert_eq!(r.instance_share.len(), 4);
            assert!((r.instance_share.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            assert!(r.ttft_ms.p50 > 0.0 && r.ttft_ms.p50 <= r.e2e_ms.p50);
            assert!((0.0..=1.0).contains(&r.kv_hit_rate));
            assert!(
                r.kv_hit_rate <= report.oracle_hit_rate + 1e-9,
                "{} beats the oracle",
                r.strategy
            );
            assert!(r.throughput_rps > 0.0 && r.output_tokens_per_s > 0.0);
            assert_eq!(r.decisions.values().sum::<u64>(), 300);
        }
    }

    #[test]
    fn prefix_aware_hits_more_than_random_on_shared_documents() {
        let w = shared_docs(400, 60, 10.0, 2);
        let report = simulate(
            &w,
            &config(
                4,
                &[
                    StrategyKind::named("random").expect("registered"),
                    StrategyKind::named("prefix-aware").expect("registered"),
                ],
            ),
            &mut quiet,
        )
        .expect("simulation runs");
        let (random, aware) = (&report.results[0], &report.results[1]);
        assert!(
            aware.kv_hit_rate > random.kv_hit_rate + 0.1,
            "{} vs {}",
            aware.kv_hit_rate,
            random.kv_hit_rate
        );
    }

    #[test]
    fn same_seed_gives_byte_identical_json() {
        let w = shared_docs(200, 10, 30.0, 3);
        let c = config(3, &StrategyKind::all().collect::<Vec<_>>());
        let a = serde_json::to_string(&simulate(&w, &c, &mut quiet).expect("runs"))
            .expect("serializes");
        let b = serde_json::to_string(&simulate(&w, &c, &mut quiet).expect("runs"))
            .expect("serializes");
        assert_eq!(a, b);
    }

    #[test]
    fn closed_loop_never_exceeds_its_clients() {
        let w = shared_docs(200, 10, 1.0, 4);
        let mut c = config(
            3,
            &[StrategyKind::named("least-outstanding").expect("registered")],
        );
        c.driver = Driver::ClosedLoop { clients: 5 };
        let report = simulate(&w, &c, &mut quiet).expect("runs");
        let r = &report.results[0];
        assert_eq!(r.requests, 200);
        // 5 clients back to back: the run is far shorter than the open-loop arrival span (~200 s).
        assert!(r.makespan_s < 100.0, "makespan {}", r.makespan_s);
    }

    #[test]
    fn scale_events_add_and_drain_instances() {
        let w = shared_docs(600, 30, 20.0, 5);
        let mut c = config(
            3,
            &[
                StrategyKind::named("round-robin").expect("registered"),
                StrategyKind::named("prefix-aware").expect("registered"),
            ],
        );
        c.scale = vec![
            ScaleEvent {
                at_s: 10.0,
                delta: 2,
            },
            ScaleEvent {
                at_s: 20.0,
                delta: -3,
            },
        ];
        let report = simulate(&w, &c, &mut quiet).expect("runs");
        for r in &report.results {
            assert_eq!(r.instance_share.len(), 5, "{}", r.strategy);
            assert_eq!(
                r.instance_ids,
                vec!["sim-0", "sim-1", "sim-2", "sim-3", "sim-4"]
            );
            assert!(
                r.instance_share[3] > 0.0 && r.instance_share[4] > 0.0,
                "{}: new instances got work",
                r.strategy
            );
            assert_eq!(r.requests, 600);
        }
    }

    #[test]
    fn invalid_inputs_are_typed_errors() {
        let w = shared_docs(10, 2, 1.0, 6);
        let empty = SimWorkload {
            requests: Vec::new(),
            ..w.clone()
        };
        assert!(matches!(
            simulate(
                &empty,
                &config(2, &StrategyKind::all().collect::<Vec<_>>()),
                &mut quiet
            ),
            Err(SimError::EmptyWorkload)
        ));
        assert!(matches!(
            simulate(
                &w,
                &config(0, &StrategyKind::all().collect::<Vec<_>>()),
                &mut quiet
            ),
            Err(SimError::ZeroInstances)
        ));
        let mut bad_preset = config(2, &StrategyKind::all().collect::<Vec<_>>());
        bad_preset.preset = "no-such-gpu".into();
        let e = simulate(&w, &bad_preset, &mut quiet)
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("no-such-gpu"), "{e}");
        let mut all_gone = config(2, &StrategyKind::all().collect::<Vec<_>>());
        all_gone.scale = vec![ScaleEvent {
            at_s: 1.0,
            delta: -2,
        }];
        assert!(matches!(
            simulate(&w, &all_gone, &mut quiet),
            Err(SimError::InvalidConfig { field: "scale", .. })
        ));
        let mut unsorted = w.clone();
        unsorted.requests.swap(0, 5);
        assert!(matches!(
            simulate(
                &unsorted,
                &config(2, &StrategyKind::all().collect::<Vec<_>>()),
                &mut quiet
            ),
            Err(SimError::InvalidRequest { .. })
        ));
    }

    #[test]
    fn progress_reaches_the_total() {
        let w = shared_docs(50, 5, 10.0, 8);
        let mut last = None;
        simulate(
            &w,
            &config(
                2,
                &[
                    StrategyKind::named("random").expect("registered"),
                    StrategyKind::named("prefix-aware").expect("registered"),
                ],
            ),
            &mut |p| last = Some((p.done_total(), p.grand_total())),
        )
        .expect("runs");
        assert_eq!(last, Some((100, 100)));
    }
}
