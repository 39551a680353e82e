//! The clairvoyant reference: no router, but each request sent where its first token would come
//! soonest, read exactly from a copy of each engine ([`Engine::first_token_if_sent`]).
//!
//! It answers "how much of this workload's time to first token does placement decide?": the
//! gap between a strategy's percentiles and these is what better placement could still win in
//! the model. Much of it rests on what no router sees: each engine's exact queue and batch, and
//! the timing of its steps (a request that reaches an engine just after a step started waits
//! for that step; on a busy engine a decode step takes 12-15 ms here, and a real engine's
//! frontend jitter hides that phase from anyone outside it). It is not a bound either: it
//! prices each request alone and greedily, so a router that spaces arrivals or keeps a prefix
//! together for the requests after it can beat it on some percentiles (`agent` under load).
//!
//! [`Engine::first_token_if_sent`]: prefix_router_engine_model::Engine::first_token_if_sent

use std::sync::Arc;

use prefix_router_core::{
    dispatch_to, Dispatched, Reason, RouteRequest, Strategy, StrategyConfig, StrategyKind,
};
use prefix_router_engine_model::EngineRequest;

use crate::members::SimFleet;
use crate::run::{run_loop, RunInputs, RunOutcome};
use crate::SimError;

/// The name of the clairvoyant reference's results.
pub const CLAIRVOYANT: &str = "clairvoyant";

/// What the tables say of the clairvoyant row.
pub const CLAIRVOYANT_NOTE: &str = "clairvoyant: not a router: each request sent where its first token would come soonest, read from copies of the engines (their queues, batches, caches and step timing, which no router sees); how much placement decides here, not a bound (it prices each request alone)";

/// Replays the workload with every request placed by [`soonest`] on a fresh fleet. Its run
/// counts requests in flight through a round-robin strategy, which never chooses.
pub fn run_clairvoyant(
    inputs: RunInputs<'_>,
    progress: &mut dyn FnMut(u64),
) -> Result<RunOutcome, SimError> {
    let counter = StrategyKind::named("round-robin")
        .map(StrategyConfig::new)
        .ok_or(SimError::InvalidConfig {
            field: "strategies",
            why: "round-robin is not registered".into(),
        })?
        .build()?;
    run_loop(inputs, std::slice::from_ref(&counter), true, progress)
}

/// The clairvoyant choice: the eligible instance where `probe`'s first token would come
/// soonest (ties: fewer in flight, then the first), counted in flight through `strategy`.
pub fn soonest(
    fleet: &SimFleet,
    now: f64,
    probe: &EngineRequest,
    route: &RouteRequest<'_>,
    strategy: &Arc<dyn Strategy>,
) -> Result<Dispatched, SimError> {
    let snapshot = fleet.snapshot(0);
    let mut best: Option<(f64, u32, usize)> = None;
    for (position, view) in snapshot.instances().iter().enumerate() {
        if !view.is_eligible(route.model) {
            continue;
        }
        let Some(instance) = fleet.instance_at(position) else {
            continue;
        };
        let Some(at) = fleet.instances[instance]
            .engine
            .first_token_if_sent(now, probe)
        else {
            continue;
        };
        let candidate = (at, view.in_flight(), position);
        if best.is_none_or(|b| (candidate.0, candidate.1) < (b.0, b.1)) {
            best = Some(candidate);
        }
    }
    let (_, _, position) = best.ok_or_else(|| SimError::InvalidConfig {
        field: "strategies",
        why: format!("{CLAIRVOYANT}: no eligible instance at {now} s"),
    })?;
    let view = Arc::clone(&snapshot.instances()[position]);
    let ticket = dispatch_to(strategy, route, view, Reason::LeastOutstanding);
    Ok(Dispatched {
        index: position,
        reason: Reason::LeastOutstanding,
        ticket,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate;
    use crate::testkit::{config, shared_docs};
    use prefix_router_core::StrategyKind;

    fn kinds(names: &[&str]) -> Vec<StrategyKind> {
        names
            .iter()
            .map(|n| StrategyKind::named(n).expect("registered"))
            .collect()
    }

    #[test]
    fn alone_on_an_idle_fleet_it_takes_exactly_the_floor() {
        // Far apart, every request meets idle engines; the clairvoyant choice is the one
        // holding the longest prefix, which is the floor's assumption.
        let w = shared_docs(40, 4, 0.05, 5);
        let mut c = config(2, &kinds(&["random"]));
        c.clairvoyant = true;
        let report = simulate(&w, &c, &mut |_| {}).expect("runs");
        let floor = report.ttft_floor_ms.expect("known");
        let r = report
            .results
            .iter()
            .find(|r| r.strategy == CLAIRVOYANT)
            .expect("a clairvoyant row after the strategies");
        assert_eq!(r.requests, 40);
        assert_eq!(r.decisions.get(CLAIRVOYANT), Some(&40));
        for (a, b) in [
            (r.ttft_ms.p50, floor.p50),
            (r.ttft_ms.p90, floor.p90),
            (r.ttft_ms.p99, floor.p99),
        ] {
            assert!((a - b).abs() < 1e-6, "{:?} against {floor:?}", r.ttft_ms);
        }
        // The random run kept its place and its own numbers.
        assert_eq!(report.results[0].strategy, "random");
        assert!(report.results[0].ttft_ms.p90 > floor.p90);
    }

    #[test]
    fn loaded_it_starts_requests_sooner_than_the_cache_blind_strategies() {
        // Busy engines and shared documents: reading every engine's queue and cache beats
        // counting requests or choosing at random, at the median and in the tail.
        let w = shared_docs(600, 20, 60.0, 3);
        let mut c = config(3, &kinds(&["random", "least-outstanding"]));
        c.clairvoyant = true;
        let report = simulate(&w, &c, &mut |_| {}).expect("runs");
        let [rnd, lo, cv] = &report.results[..] else {
            panic!("three rows, got {}", report.results.len());
        };
        assert_eq!(cv.strategy, CLAIRVOYANT);
        for blind in [rnd, lo] {
            assert!(
                cv.ttft_ms.p50 < blind.ttft_ms.p50 && cv.ttft_ms.p90 < blind.ttft_ms.p90,
                "{:?} against {}'s {:?}",
                cv.ttft_ms,
                blind.strategy,
                blind.ttft_ms
            );
        }
    }
}
