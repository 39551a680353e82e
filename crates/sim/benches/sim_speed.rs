//! Simulator speed: simulated requests per second on one core (small preset, 7 instances).
//!
//! Run: `cargo bench -p prefix-router-sim --bench sim_speed`. The figure to read is the
//! throughput line (elements/s = simulated requests per second); the target is at least
//! 1,000,000 simulated requests per minute (16,667 per second).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_sim::{simulate, Driver, SimConfig, SimWorkload, WorkloadSource};
use prefix_router_workload::{generators, Arrival, WorkloadKind, WorkloadSpec};

const REQUESTS: u64 = 20_000;

fn workload(kind: WorkloadKind, rate: f64) -> SimWorkload {
    let mut spec = WorkloadSpec::default_for(kind);
    spec.seed = 1;
    spec.requests = REQUESTS;
    spec.arrival = Arrival::Poisson { rate };
    let requests = generators::generate(&spec).collect();
    SimWorkload {
        name: format!("{kind:?}"),
        source: WorkloadSource::Generated { spec },
        requests,
    }
}

fn config(kind: StrategyKind) -> SimConfig {
    SimConfig {
        preset: "small".into(),
        instances: 7,
        strategies: vec![StrategyConfig::new(kind)],
        prefix_length: PrefixLength::new(1024).expect("valid prefix length"),
        seed: 1,
        driver: Driver::OpenLoop,
        scale: Vec::new(),
        hit_rate_buckets: 50,
        kv_events: Default::default(),
        routers: Default::default(),
        prewarm: None,
        clairvoyant: false,
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    group.throughput(Throughput::Elements(REQUESTS));
    let sharegpt = workload(WorkloadKind::Sharegpt, 20.0);
    for kind in [
        StrategyKind::named("random").expect("registered"),
        StrategyKind::named("prefix-aware").expect("registered"),
    ] {
        let cfg = config(kind);
        group.bench_function(format!("sharegpt-20k-small-x7/{}", kind.name()), |b| {
            b.iter(|| simulate(&sharegpt, &cfg, &mut |_| {}).expect("simulation runs"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
