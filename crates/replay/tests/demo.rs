//! The demo through the library, over real sockets on 127.0.0.1: mock engines, routers (two
//! replicas, subscribed to the engines' KV events) and the load generator, one fleet per
//! strategy, torn down after each. Small and fast: 40 requests over 4 documents on 3 engines
//! of the `small` preset, at 20 times real speed.

use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_replay::demo::{self, render, Demo, DemoConfig};
use prefix_router_replay::ReplayError;
use prefix_router_sim::{SimWorkload, WorkloadSource};
use prefix_router_workload::{generators, Arrival, WorkloadKind, WorkloadSpec};

fn kind(name: &str) -> StrategyKind {
    StrategyKind::named(name).unwrap_or_else(|| panic!("no strategy {name}"))
}

fn config(strategies: &[&str]) -> DemoConfig {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
    spec.seed = 5;
    spec.requests = 40;
    spec.arrival = Arrival::Closed { clients: 4 };
    spec.params
        .apply_override("documents=4")
        .unwrap_or_else(|e| panic!("{e}"));
    let requests = generators::generate(&spec).collect();
    DemoConfig {
        instances: 3,
        strategies: strategies
            .iter()
            .map(|&n| StrategyConfig::new(kind(n)))
            .collect(),
        workload: SimWorkload {
            name: "long-context".into(),
            source: WorkloadSource::Generated { spec },
            requests,
        },
        preset: "small".into(),
        time_scale: 0.05,
        duration_s: None,
        seed: 5,
        replicas: 1,
        engine_queues: false,
        kv_events: false,
        kv_events_drop: 0.0,
        prefix_length: PrefixLength::new(1024).unwrap_or_else(|e| panic!("{e}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_strategy_runs_on_its_own_fleet_and_is_reported_beside_simulate() {
    let mut cfg = config(&["random", "kv-aware"]);
    assert!(
        demo::reads_tokens(&cfg.strategies).unwrap_or(false),
        "kv-aware reads the engines' events"
    );
    cfg.kv_events = true;
    cfg.replicas = 2;
    let demo = Demo::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    let simulated = demo.simulate().unwrap_or_else(|e| panic!("{e}"));
    let mut runs = Vec::new();
    for i in 0..2 {
        let run = demo
            .run_strategy(i, |_| {})
            .await
            .unwrap_or_else(|e| panic!("strategy {i}: {e}"));
        runs.push(run);
    }
    assert!(
        demo::failures(&runs).is_empty(),
        "{:?}",
        demo::failures(&runs)
    );
    for run in &runs {
        assert_eq!(run.summary.sent, 40, "{}", run.summary.strategy);
        assert_eq!(run.result.requests, 40, "{}", run.summary.strategy);
        assert_eq!(run.summary.replicas, 2);
        // A closed loop has no schedule to be late against.
        assert!(run.summary.send_lag_p99_wall_ms.is_none());
        // All three engines are named, whether or not a strategy left one idle.
        assert_eq!(run.result.instance_ids.len(), 3);
        // The engines' own TTFT was read, so the HTTP path's cost is measured, not assumed.
        assert!(run.summary.engine_ttft_mean_ms.is_some_and(|ms| ms > 0.0));
        let kv = run.summary.kv_events.unwrap_or_default();
        assert!(
            kv.batches > 0.0,
            "{}: no KV-event batch applied",
            run.summary.strategy
        );
    }
    // Four documents read nine times each: the one that routes on the engines' caches hits.
    assert!(
        runs[1].result.kv_hit_rate > 0.5,
        "kv-aware hit rate {}",
        runs[1].result.kv_hit_rate
    );
    let report = demo.report(&simulated, &runs);
    assert_eq!(report.simulated.len(), 2);
    assert_eq!(report.report.results.len(), 2);
    let text = render(&report);
    assert!(text.contains("KV events"), "{text}");
    assert!(text.contains("2 router replicas"), "{text}");
    assert!(
        text.contains("simulate, same workload and settings"),
        "{text}"
    );
    // Every run sent the whole workload: the simulation of all of it stands.
    assert!(demo
        .simulate_sent(&runs)
        .unwrap_or_else(|e| panic!("{e}"))
        .is_none());
    // A strategy the config does not have is an error, not a panic.
    assert!(matches!(
        demo.run_strategy(2, |_| {}).await,
        Err(ReplayError::NoStrategy(2))
    ));
}

#[test]
fn an_unknown_preset_is_named_before_anything_starts() {
    let mut cfg = config(&["random"]);
    cfg.preset = "no-such-gpu".into();
    match Demo::new(cfg) {
        Err(e @ ReplayError::Preset(_)) => {
            let text = e.to_string();
            assert!(text.contains("no-such-gpu"), "{text}");
            assert!(
                text.contains("small"),
                "the known presets are listed: {text}"
            );
        }
        other => panic!("expected the preset's error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_its_duration_is_compared_with_a_simulation_of_what_it_sent() {
    let mut cfg = config(&["random", "cache-aware"]);
    // 2.5 ms of wall time: the 4 clients' first requests go out, hardly any more.
    cfg.duration_s = Some(0.05);
    let demo = Demo::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    let mut runs = Vec::new();
    for i in 0..2 {
        runs.push(
            demo.run_strategy(i, |_| {})
                .await
                .unwrap_or_else(|e| panic!("strategy {i}: {e}")),
        );
    }
    for run in &runs {
        assert!(run.sent.len() < 40, "the duration did not cut the run");
        assert_eq!(run.sent.len() as u64, run.summary.sent);
    }
    let cut = demo
        .simulate_sent(&runs)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("a cut run is simulated on what it sent"));
    assert_eq!(cut.results.len(), 2);
    for (run, sim) in runs.iter().zip(&cut.results) {
        assert_eq!(sim.strategy, run.summary.strategy);
        assert_eq!(sim.requests, run.sent.len() as u64, "{}", sim.strategy);
    }
    let most = runs.iter().map(|r| r.sent.len()).max().unwrap_or(0) as u64;
    assert_eq!(cut.workload.requests, most);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_run_says_how_late_its_sends_were() {
    let mut cfg = config(&["random"]);
    let WorkloadSource::Generated { spec } = &mut cfg.workload.source else {
        panic!("a generated workload")
    };
    spec.requests = 12;
    spec.arrival = Arrival::Poisson { rate: 20.0 };
    cfg.workload.requests = generators::generate(spec).collect();
    let demo = Demo::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    let simulated = demo.simulate().unwrap_or_else(|e| panic!("{e}"));
    let run = demo
        .run_strategy(0, |_| {})
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let lag = run.summary.send_lag_p99_wall_ms;
    assert!(lag.is_some_and(|ms| ms >= 0.0), "{lag:?}");
    let text = render(&demo.report(&simulated, &[run]));
    assert!(
        text.contains("sends late against the open-loop schedule: P99"),
        "{text}"
    );
}
