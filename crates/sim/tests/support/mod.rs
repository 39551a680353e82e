//! Shared by the simulator's integration tests: one strategy's run of a workload.

use std::sync::Arc;

use prefix_router_core::Strategy;
use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_sim::run::{run_replicas, RunInputs, RunOutcome};
use prefix_router_sim::{engine_config, routing_keys, Driver, SimConfig};
use prefix_router_workload::Request;

/// Runs `requests` through the first strategy of `config` on a fresh fleet, behind
/// `config.routers.replicas` router replicas.
pub fn run_first(requests: &[Request], config: &SimConfig) -> RunOutcome {
    let engine = engine_config(&config.preset).expect("preset");
    let keys = routing_keys(requests, config).expect("keys");
    let s: Vec<Arc<dyn Strategy>> = (0..config.routers.replicas)
        .map(|_| config.strategies[0].build().expect("builds"))
        .collect();
    let inputs = RunInputs {
        requests,
        keys: &keys,
        engine: &engine,
        config,
        chains: None,
    };
    run_replicas(inputs, &s, &mut |_| {}).expect("runs")
}

/// `strategy` on 7 instances of `preset`, `clients` closed-loop clients, seed `seed`, one
/// router, the default KV-event model: each test changes what it is about.
pub fn config(preset: &str, strategy: &str, clients: u32, seed: u64) -> SimConfig {
    let kind = StrategyKind::named(strategy).expect("registered");
    SimConfig {
        preset: preset.into(),
        instances: 7,
        strategies: vec![StrategyConfig::new(kind)],
        prefix_length: PrefixLength::new(1024).expect("valid"),
        seed,
        driver: Driver::ClosedLoop { clients },
        scale: Vec::new(),
        hit_rate_buckets: 1,
        kv_events: Default::default(),
        routers: Default::default(),
        prewarm: None,
        clairvoyant: false,
    }
}
