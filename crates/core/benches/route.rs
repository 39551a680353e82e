//! Native key plus prefix-aware decision: 1 KiB and 64 KiB prefixes on 7, 64 and 1,024 instances.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prefix_router_core::extract::native_key;
use prefix_router_core::{
    Fleet, InstanceSpec, PrefixLength, RouteRequest, RouteRng, StrategyConfig, StrategyKind,
};
use rand::{Rng, SeedableRng};

fn bench(c: &mut Criterion) {
    let mut rng = RouteRng::seed_from_u64(7);
    let strategy =
        match StrategyConfig::new(StrategyKind::named("prefix-aware").expect("registered")).build()
        {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
    let mut group = c.benchmark_group("native_key_and_prefix_aware_decision");
    for prefix in [1024usize, 65536] {
        // The body is twice the prefix: only the first `prefix` bytes are hashed.
        let body: Vec<u8> = (0..prefix * 2).map(|_| rng.gen_range(0x20..0x7f)).collect();
        let len = match PrefixLength::new(prefix as u64) {
            Ok(l) => l,
            Err(e) => panic!("{e}"),
        };
        for n in [7usize, 64, 1024] {
            let specs = (0..n)
                .map(|i| {
                    InstanceSpec::from_url(format!("http://10.0.{}.{}:8000", i / 256, i % 256))
                })
                .collect();
            let fleet = Fleet::new(specs);
            let snap = fleet.snapshot();
            // Some load so that the decision reads real counters.
            for (i, inst) in snap.instances().iter().enumerate() {
                for _ in 0..(i % 5) {
                    inst.acquire();
                }
            }
            group.throughput(Throughput::Elements(1));
            group.bench_with_input(
                BenchmarkId::new(format!("prefix_{}KiB", prefix / 1024), n),
                &n,
                |b, _| {
                    b.iter(|| {
                        let key = native_key(black_box(&body), Some(b"tenant-1"), len).ok();
                        let req = RouteRequest {
                            key,
                            model: None,
                            ..RouteRequest::keyed(None, None)
                        };
                        black_box(strategy.select(&req, &snap, &mut rng).ok())
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
