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

/// One eligible instance's first-token time for a request sent now.
#[derive(Debug, Clone, Copy)]
pub struct FirstToken {
    /// Its position in the fleet snapshot.
    pub position: usize,
    /// When the request's first token would come there, seconds.
    pub at: f64,
    /// Requests in flight there.
    pub in_flight: u32,
}

/// When `probe`, sent at `now`, would get its first token on each instance eligible for
/// `model`, each engine run forward on a copy with nothing arriving after it.
pub fn first_tokens(
    fleet: &SimFleet,
    now: f64,
    probe: &EngineRequest,
    model: Option<&str>,
) -> Vec<FirstToken> {
    fleet
        .snapshot(0)
        .instances()
        .iter()
        .enumerate()
        .filter(|(_, view)| view.is_eligible(model))
        .filter_map(|(position, view)| {
            let instance = fleet.instance_at(position)?;
            let at = fleet.instances[instance]
                .engine
                .first_token_if_sent(now, probe)?;
            Some(FirstToken {
                position,
                at,
                in_flight: view.in_flight(),
            })
        })
        .collect()
}

/// The clairvoyant choice among `times` ([`first_tokens`]): the soonest first token (ties:
/// fewer in flight, then the first), counted in flight through `strategy`.
pub fn soonest(
    fleet: &SimFleet,
    times: &[FirstToken],
    route: &RouteRequest<'_>,
    strategy: &Arc<dyn Strategy>,
) -> Result<Dispatched, SimError> {
    let best = times
        .iter()
        .min_by(|a, b| a.at.total_cmp(&b.at).then(a.in_flight.cmp(&b.in_flight)))
        .ok_or_else(|| SimError::InvalidConfig {
            field: "strategies",
            why: format!("{CLAIRVOYANT}: no eligible instance at {} s", route.now),
        })?;
    let view = Arc::clone(&fleet.snapshot(0).instances()[best.position]);
    let ticket = dispatch_to(strategy, route, view, Reason::LeastOutstanding);
    Ok(Dispatched {
        index: best.position,
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
    fn each_strategys_choices_are_read_against_the_soonest_start() {
        // Alone on idle engines: prefix-aware keeps each document on its home, which is
        // always the soonest start; random sends revisits to instances that must recompute.
        let w = shared_docs(60, 4, 0.05, 5);
        let mut c = config(3, &kinds(&["prefix-aware", "random"]));
        let without = simulate(&w, &c, &mut |_| {}).expect("runs");
        assert!(without.results.iter().all(|r| r.placement.is_none()));
        c.clairvoyant = true;
        let report = simulate(&w, &c, &mut |_| {}).expect("runs");
        let [pa, rnd, cv] = &report.results[..] else {
            panic!("three rows, got {}", report.results.len());
        };
        assert!(
            cv.placement.is_none(),
            "the reference is not read against itself"
        );
        let pa = pa.placement.as_ref().expect("read");
        assert_eq!(pa.at_soonest, 1.0, "{pa:?}");
        assert_eq!(pa.lost_ms.p99, 0.0, "{pa:?}");
        let rnd = rnd.placement.as_ref().expect("read");
        assert!(rnd.at_soonest < 0.95 && rnd.lost_ms.p90 > 1.0, "{rnd:?}");
        // Reading the engines changes nothing the strategies do.
        for (a, b) in without.results.iter().zip(&report.results) {
            assert_eq!(a.ttft_percentiles_ms, b.ttft_percentiles_ms);
        }
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
