//! `kv-aware` in the simulator: the engines' KV events (stored and evicted blocks, delivered
//! after a delay, some lost) against `cache-aware`'s inference, on caches small enough to evict
//! often: 7 instances of the `small` preset (65,536-token caches), 65 documents of 8,000 tokens
//! (each cache holds about an eighth of them), 16 closed-loop clients, 1,800 requests.

mod support;

use prefix_router_sim::run::RunOutcome;
use prefix_router_sim::{KvEventModel, SimConfig};
use prefix_router_workload::{generators, Arrival, Request, WorkloadKind, WorkloadSpec};

fn workload() -> Vec<Request> {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
    spec.seed = 4;
    spec.requests = 1800;
    spec.arrival = Arrival::Closed { clients: 16 };
    spec.params
        .apply_override("documents=65")
        .expect("a valid parameter");
    generators::generate(&spec).collect()
}

fn run(requests: &[Request], strategy: &str, kv_events: KvEventModel) -> RunOutcome {
    let config = SimConfig {
        kv_events,
        ..support::config("small", strategy, 16, 4)
    };
    support::run_first(requests, &config)
}

fn hit_rate(requests: &[Request], out: &RunOutcome) -> f64 {
    let prompt: u64 = requests.iter().map(|r| u64::from(r.prompt_tokens())).sum();
    let cached: u64 = out.records.iter().map(|r| u64::from(r.cached_tokens)).sum();
    cached as f64 / prompt as f64
}

fn model(delay_s: f64, loss: f64) -> KvEventModel {
    KvEventModel { delay_s, loss }
}

// Five runs of 1,800 requests: 40 s in a debug build, 3 s in release (`.ci/run` runs it so).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "needs a release build: run `cargo test --release -p prefix-router-sim --test kv_events`"
)]
fn the_engines_events_beat_inference_where_caches_evict_often() {
    let requests = workload();
    let inferred = hit_rate(&requests, &run(&requests, "cache-aware", model(0.01, 0.0)));
    let exact = hit_rate(&requests, &run(&requests, "kv-aware", model(0.01, 0.0)));
    assert!(
        exact > inferred + 0.03,
        "kv-aware {exact:.3} against cache-aware {inferred:.3}"
    );
    // Lost batches and late delivery: a third of the batches lost (each replayed at its
    // instance's next batch) still beats inference; events five seconds late lose the gain.
    let lossy = hit_rate(&requests, &run(&requests, "kv-aware", model(0.01, 0.3)));
    assert!(
        lossy > inferred + 0.03,
        "{lossy:.3} with loss vs {inferred:.3}"
    );
    let late = hit_rate(&requests, &run(&requests, "kv-aware", model(5.0, 0.0)));
    assert!(
        late < exact - 0.03,
        "events five seconds late cost nothing: {late:.3} vs {exact:.3}"
    );
}
