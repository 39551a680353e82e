//! Speed of the engine model: simulated requests per second of wall time.
//!
//! Workload (seeded): prompts of 100-1000 tokens whose first half comes from a pool of 200
//! shared prefixes (so the cache hits and evicts), outputs of 50-200 tokens, Poisson arrivals
//! at about 80% of what the `small` preset serves. `one_engine` drives one engine;
//! `fleet_of_7` drives seven, requests spread by prefix, with the event loop a simulator runs.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use prefix_router_engine_model::{presets, Engine, EngineEvent, EngineRequest};
use rand::Rng;
use rand_distr::{Distribution, Exp};
use rand_pcg::Pcg64Mcg;

const REQUESTS: usize = 20_000;

/// `(arrival time, engine index, request)` sorted by time.
fn workload(engines: usize, rate_per_engine: f64, seed: u128) -> Vec<(f64, usize, EngineRequest)> {
    let mut rng = Pcg64Mcg::new(seed);
    let gaps = Exp::new(rate_per_engine * engines as f64).expect("positive rate");
    let mut t = 0.0;
    (0..REQUESTS as u64)
        .map(|id| {
            t += gaps.sample(&mut rng);
            let prompt: u32 = rng.gen_range(100..=1000);
            let output: u32 = rng.gen_range(50..=200);
            let prefix: u64 = rng.gen_range(0..200);
            let full = (prompt / 16) as u64;
            let shared = full / 2;
            let block_hashes = (0..full)
                .map(|b| {
                    if b < shared {
                        (prefix << 32) | b
                    } else {
                        (1 << 63) | (id << 16) | b
                    }
                })
                .collect();
            let req = EngineRequest {
                id,
                block_hashes,
                prompt_tokens: prompt,
                output_tokens: output,
            };
            (t, (prefix % engines as u64) as usize, req)
        })
        .collect()
}

/// Runs the fleet until every request finished; returns the number of events seen.
fn drive(engines: &mut [Engine], work: Vec<(f64, usize, EngineRequest)>) -> usize {
    let mut out: Vec<EngineEvent> = Vec::with_capacity(1024);
    let mut seen = 0;
    let mut arrivals = work.into_iter().peekable();
    loop {
        let mut next_engine = f64::INFINITY;
        for e in engines.iter() {
            if let Some(t) = e.next_event_at() {
                next_engine = next_engine.min(t);
            }
        }
        let next_arrival = arrivals.peek().map_or(f64::INFINITY, |a| a.0);
        if next_arrival == f64::INFINITY && next_engine == f64::INFINITY {
            return seen;
        }
        if next_arrival < next_engine {
            if let Some((t, i, req)) = arrivals.next() {
                engines[i].advance(t, &mut out);
                engines[i].submit(t, req);
            }
        } else {
            for e in engines.iter_mut() {
                if e.next_event_at().is_some_and(|t| t <= next_engine) {
                    e.advance(next_engine, &mut out);
                }
            }
        }
        seen += out.len();
        out.clear();
    }
}

/// Prints what the workload does to the engines, once, so the figures can be read in context.
fn describe(name: &str, n: usize, work: &[(f64, usize, EngineRequest)]) {
    let mut engines: Vec<Engine> = (0..n).map(|_| Engine::new(presets::small())).collect();
    let span = work.last().map_or(0.0, |w| w.0);
    drive(&mut engines, work.to_vec());
    let (mut prompt, mut cached, mut generated, mut steps) = (0, 0, 0, 0);
    for e in &engines {
        let s = e.stats();
        (prompt, cached, generated, steps) = (
            prompt + s.prompt_tokens,
            cached + s.cached_tokens,
            generated + s.generation_tokens,
            steps + s.steps,
        );
    }
    eprintln!(
        "{name}: {REQUESTS} requests over {span:.0} simulated s, hit rate {:.1}%, \
         {:.1} tokens per step",
        100.0 * cached as f64 / prompt as f64,
        (generated + prompt - cached) as f64 / steps as f64,
    );
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_small");
    group.throughput(Throughput::Elements(REQUESTS as u64));
    group.sample_size(10);
    for (name, n) in [("one_engine", 1usize), ("fleet_of_7", 7)] {
        let work = workload(n, 25.0, 42);
        describe(name, n, &work);
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let engines: Vec<Engine> =
                        (0..n).map(|_| Engine::new(presets::small())).collect();
                    (engines, work.clone())
                },
                |(mut engines, work)| {
                    let seen = drive(&mut engines, work);
                    assert_eq!(seen, 2 * REQUESTS);
                    engines
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
