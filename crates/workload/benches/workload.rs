//! Costs the simulator pays per request: block hashes, routing-key text, generation.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use prefix_router_workload::{generate, Request, WorkloadKind, WorkloadSpec};

fn long_context_request() -> Option<Request> {
    let spec = WorkloadSpec {
        requests: 1,
        ..WorkloadSpec::default_for(WorkloadKind::LongContext)
    };
    generate(&spec).next()
}

fn benches(c: &mut Criterion) {
    let Some(r) = long_context_request() else {
        return;
    };
    let mut buf = Vec::new();
    c.bench_function("block_hashes 8k-token prompt, 16-token blocks", |b| {
        b.iter(|| {
            black_box(&r).block_hashes_into(16, &mut buf);
            black_box(buf.len())
        })
    });
    c.bench_function("chat_body 8k-token prompt, max_chars 4096", |b| {
        b.iter(|| black_box(&r).chat_body(false, Some(4096)))
    });
    c.bench_function("chat_body 8k-token prompt, full", |b| {
        b.iter(|| black_box(&r).chat_body(false, None))
    });
    for kind in [
        WorkloadKind::LongContext,
        WorkloadKind::Sharegpt,
        WorkloadKind::Agent,
    ] {
        let spec = WorkloadSpec {
            requests: 10_000,
            ..WorkloadSpec::default_for(kind)
        };
        c.bench_function(&format!("generate 10k {kind}"), |b| {
            b.iter(|| generate(black_box(&spec)).count())
        });
    }
}

criterion_group!(workload, benches);
criterion_main!(workload);
