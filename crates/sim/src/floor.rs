//! The floor under every router's time to first token, in the engine model.
//!
//! A request's first token can come no sooner than it would on an idle engine that already holds
//! every prefix any earlier request computed: waiting, sharing a step with other work or being
//! admitted later only add time (a step's cost grows with its work, and splitting a prefill over
//! more steps costs at least as much as one step), and no cache can hold more than what earlier
//! requests computed ([`oracle_cached_tokens`]). Requests are issued in workload order by both
//! drivers, so "earlier" is the workload's order. The floor of each percentile is that
//! percentile of the per-request floors: if every request's TTFT is at least its floor, the
//! k-th smallest TTFT is at least the k-th smallest floor.
//!
//! It answers "how much could any router still gain here?" and shows which targets the model
//! rules out: on a workload where one request in ten is the first touch of a long document, the
//! P90 request computes a whole document on every router.

use prefix_router_engine_model::EngineConfig;
use prefix_router_workload::trace::oracle_cached_tokens;
use prefix_router_workload::Request;

use crate::stats::LatencySummary;

/// Percentiles of the per-request floor on time to first token, in milliseconds.
pub fn ttft_floor(requests: &[Request], engine: &EngineConfig) -> LatencySummary {
    let cached = oracle_cached_tokens(requests, engine.block_tokens);
    let mut floors: Vec<f64> = requests
        .iter()
        .zip(cached)
        .map(|(r, c)| {
            1e3 * engine
                .cost
                .idle_ttft(r.prompt_tokens(), c, engine.max_batched_tokens)
        })
        .collect();
    floors.sort_by(f64::total_cmp);
    LatencySummary::from_sorted(&floors)
}

#[cfg(test)]
mod tests {
    use crate::testkit::{config, shared_docs};
    use crate::{simulate, Driver};
    use prefix_router_core::StrategyKind;

    #[test]
    fn no_strategy_beats_the_floor_light_or_loaded_open_or_closed() {
        let all: Vec<StrategyKind> = StrategyKind::all().collect();
        for (rate, driver) in [
            (5.0, Driver::OpenLoop),
            (400.0, Driver::OpenLoop),
            (1.0, Driver::ClosedLoop { clients: 16 }),
        ] {
            let w = shared_docs(400, 30, rate, 3);
            let mut c = config(3, &all);
            c.driver = driver;
            c.clairvoyant = true;
            let report = simulate(&w, &c, &mut |_| {}).expect("runs");
            let floor = report
                .ttft_floor_ms
                .expect("the simulator knows its engines");
            for r in &report.results {
                let at = |p: usize| r.ttft_percentiles_ms[p];
                assert!(
                    at(50) >= floor.p50 - 1e-9
                        && at(90) >= floor.p90 - 1e-9
                        && at(99) >= floor.p99 - 1e-9,
                    "{} at {rate}/s {driver:?}: {:?} under the floor {floor:?}",
                    r.strategy,
                    r.ttft_ms
                );
            }
        }
    }

    #[test]
    fn a_request_alone_on_an_idle_fleet_takes_exactly_its_floor() {
        // Far apart, each request meets an idle engine: the floor is reached, not just
        // approached, where the router keeps every revisit on its document's home.
        let w = shared_docs(40, 4, 0.05, 5);
        let kind = StrategyKind::named("prefix-aware").expect("registered");
        let report = simulate(&w, &config(2, &[kind]), &mut |_| {}).expect("runs");
        let floor = report.ttft_floor_ms.expect("known");
        let got = report.results[0].ttft_ms;
        for (a, b) in [
            (got.p50, floor.p50),
            (got.p90, floor.p90),
            (got.p99, floor.p99),
        ] {
            assert!((a - b).abs() < 1e-6, "{got:?} against the floor {floor:?}");
        }
    }
}
