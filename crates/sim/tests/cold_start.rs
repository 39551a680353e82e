//! Cold start with caches that hold about a quarter of the documents (the HTTP
//! scenario in the simulator): 7 instances of the `small` preset (64k-token caches, 8 documents
//! of 8,000 tokens each), 32 documents, 8 closed-loop clients, 400 requests.

mod support;

use prefix_router_sim::run::RunOutcome;

use prefix_router_workload::{generators, Arrival, Request, WorkloadKind, WorkloadSpec};
use std::collections::BTreeMap;

fn workload(seed: u64) -> Vec<Request> {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
    spec.seed = seed;
    spec.requests = 400;
    spec.arrival = Arrival::Closed { clients: 8 };
    spec.params
        .apply_override("documents=32")
        .expect("a valid parameter");
    generators::generate(&spec).collect()
}

fn run(requests: &[Request], strategy: &str, seed: u64) -> RunOutcome {
    support::run_first(requests, &support::config("small", strategy, 8, seed))
}

/// Documents whose requests mostly went to each instance.
fn documents_per_instance(requests: &[Request], out: &RunOutcome) -> Vec<usize> {
    let mut by_doc: BTreeMap<u64, BTreeMap<u32, usize>> = BTreeMap::new();
    for (q, r) in requests.iter().zip(&out.records) {
        let doc = q.messages[0].segments[0].id;
        *by_doc
            .entry(doc)
            .or_default()
            .entry(r.instance)
            .or_default() += 1;
    }
    let mut per = vec![0usize; out.dispatched.len()];
    for counts in by_doc.values() {
        if let Some((&i, _)) = counts.iter().max_by_key(|(_, &n)| n) {
            per[i as usize] += 1;
        }
    }
    per
}

fn p99_ttft_ms(out: &RunOutcome) -> f64 {
    let mut t: Vec<f64> = out
        .records
        .iter()
        .map(|r| (r.first_token_s - r.start_s) * 1000.0)
        .collect();
    t.sort_by(f64::total_cmp);
    t[(t.len() * 99 / 100).min(t.len() - 1)]
}

#[test]
fn cache_aware_spreads_documents_and_keeps_the_first_touches_off_one_queue() {
    for seed in 1..=3 {
        let requests = workload(seed);
        let ca = run(&requests, "cache-aware", seed);
        let pa = run(&requests, "prefix-aware", seed);
        let per = documents_per_instance(&requests, &ca);
        let (lo, hi) = (per.iter().min().copied(), per.iter().max().copied());
        println!(
            "seed {seed}: cache-aware documents per instance {per:?}, prefix-aware {:?}; P99 {:.1} ms vs {:.1} ms",
            documents_per_instance(&requests, &pa),
            p99_ttft_ms(&ca),
            p99_ttft_ms(&pa)
        );
        let mean = 32.0 / 7.0;
        assert!(
            per.iter().all(|&n| (n as f64 - mean).abs() <= 1.0),
            "seed {seed}: documents per instance {per:?} (mean {mean:.2}; range {lo:?}-{hi:?})"
        );
        assert!(p99_ttft_ms(&ca) <= p99_ttft_ms(&pa) * 1.05, "seed {seed}");
    }
}
