//! Prewarming on scale-out in the simulator (prefix-aware and cache-aware): long-context on 7 instances of the default preset,
//! one instance added at 300 s (of about 450), once the caches hold the documents. Without prewarming, the prefixes rendezvous moves to it miss
//! there and the hit rate dips in the minute after; with it, the new instance first gets the
//! hottest of those prefixes (one-token replays) and the dip is at least halved. The replays
//! are not workload requests: every request is still served exactly once.

mod support;

use prefix_router_core::prewarm::PrewarmConfig;
use prefix_router_sim::metrics::summarize;
use prefix_router_workload::{generators, Request, ScaleEvent, WorkloadKind, WorkloadSpec};

fn workload() -> Vec<Request> {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
    spec.seed = 1;
    generators::generate(&spec).collect()
}

fn dip(requests: &[Request], strategy: &str, prewarm: bool) -> (f64, f64, f64, u64) {
    let mut c = support::config("llama-3.1-70b-h100x8", strategy, 32, 1);
    let at_s = 300.0;
    c.scale = vec![ScaleEvent { at_s, delta: 1 }];
    c.prewarm = prewarm.then(PrewarmConfig::default);
    let out = support::run_first(requests, &c);
    assert!(out.records.iter().all(|r| r.finish_s.is_finite()));
    assert_eq!(out.records.len(), requests.len());
    let new_instance = out.dispatched.len() - 1;
    let r = summarize(strategy, requests, &out, 1, &c.scale);
    let a = &r.after_scale[0];
    (
        a.hit_rate_before - a.hit_rate_after,
        a.ttft_p90_after_ms,
        r.kv_hit_rate,
        out.dispatched[new_instance],
    )
}

// Four simulations of the default long-context run: 71 s in a debug build, a few in release.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "long simulation: run `cargo test --release -p prefix-router-sim --test prewarm`"
)]
fn prewarming_halves_the_hit_rate_dip_after_scale_out() {
    let requests = workload();
    let (cold, cold_p90, cold_hit, cold_new) = dip(&requests, "prefix-aware", false);
    let (warm, warm_p90, warm_hit, warm_new) = dip(&requests, "prefix-aware", true);
    eprintln!(
        "prefix-aware: dip {:.1} points without prewarming, {:.1} with; TTFT P90 after {cold_p90:.1} / {warm_p90:.1} ms; run hit rate {:.1}% / {:.1}%",
        100.0 * cold,
        100.0 * warm,
        100.0 * cold_hit,
        100.0 * warm_hit
    );
    assert!(cold > 0.02, "scale-out without prewarming dips: {cold}");
    assert!(
        warm <= cold / 2.0,
        "dip {warm} with prewarming against {cold} without"
    );
    assert!(warm_p90 <= cold_p90 * 1.05, "{warm_p90} against {cold_p90}");
    assert!(warm_hit >= cold_hit);
    // The new instance takes its share once warm.
    assert!(
        warm_new * 10 >= cold_new * 8,
        "{warm_new} against {cold_new} requests"
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "long simulation: run `cargo test --release -p prefix-router-sim --test prewarm`"
)]
fn cache_aware_gets_its_hottest_prefixes_replicated_and_the_new_instance_used() {
    // cache-aware moves no cached prefix to an empty instance; what goes there is hot prefixes
    // gaining a home and new ones, so the hottest are replayed to it.
    let requests = workload();
    let (cold, _, cold_hit, cold_new) = dip(&requests, "cache-aware", false);
    let (warm, _, warm_hit, warm_new) = dip(&requests, "cache-aware", true);
    eprintln!(
        "cache-aware: dip {:.1} points without prewarming, {:.1} with; the new instance took {cold_new} / {warm_new} requests; run hit rate {:.1}% / {:.1}%",
        100.0 * cold,
        100.0 * warm,
        100.0 * cold_hit,
        100.0 * warm_hit
    );
    // Since an instance keeps the revisits it alone holds past the share bound (`hold-share`),
    // cache-aware barely dips here even cold (-0.1 points, i.e. none; 1.6 before). But the new
    // instance then sits nearly idle (10 requests) until hot prefixes need another home:
    // prewarming puts it to use (170) without a dip.
    assert!(cold < 0.02, "{cold}");
    assert!(
        warm <= cold.max(0.0) + 0.005,
        "dip {warm} with prewarming against {cold} without"
    );
    assert!(
        warm_new >= 4 * cold_new.max(1),
        "{warm_new} against {cold_new}"
    );
    assert!(warm_hit >= cold_hit);
}
