//! Shared by the simulator's integration tests: one strategy's run of a workload.

use std::sync::Arc;

use prefix_router_core::Strategy;
use prefix_router_sim::run::{run_replicas, RunInputs, RunOutcome};
use prefix_router_sim::{engine_config, routing_keys, SimConfig};
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
