//! Cache-aware decision cost: a 64 KiB native prompt (its byte chain computed in the loop) and
//! the expected-TTFT choice, against an index already holding 1 Mi tracked blocks, on 7 and 64
//! instances. Half of the measured prompts share a long prefix with indexed traffic (a deep
//! match), half are new (the walk stops at once). `instances` measures `select` alone;
//! `dispatch_instances` the whole dispatch a server's decision histogram times (the choice, then
//! the index stamping every block of the prompt on the chosen instance) and the ticket's
//! finish: the same probes, each a revisit of its own first round after that (the index, full,
//! evicts as it inserts, and stays at its budget).
//!
//! `revisit_256KiB` times what the server's decision histogram times for issue 12's largest
//! prompt: the dispatch alone (the chain computed beforehand, as the server does while reading
//! the body) of a 256 KiB prompt sent before, 2,048 blocks the index must restamp, round robin
//! over 16 such prompts (1.3 MiB of entries: beyond the level-2 cache);
//! `revisit_256KiB_from_memory` the same over all 512 prompts of the index, whose entries then
//! come from memory, and `new_tail_256KiB_from_memory` those prompts each with a new last
//! block (a known document, a new question). `DISPATCH_LOOP` (see [`dispatch_loop`]) counts instructions instead.

use criterion::{black_box, criterion_group, BenchmarkId, Criterion, Throughput};
use prefix_router_core::extract::native_route;
use prefix_router_core::{
    dispatch, Chain, End, Fleet, FleetSnapshot, InstanceSpec, KeyHash, KeyOptions, PrefixLength,
    RouteRequest, RouteRng, Strategy, StrategyConfig, StrategyKind,
};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

const PROMPT: usize = 64 * 1024;

/// A native request with its key and chain, at `now`.
fn request(key: KeyHash, chain: &Chain, now: f64) -> RouteRequest<'_> {
    RouteRequest {
        key: Some(key),
        chain: &chain.blocks,
        prompt_units: chain.units,
        model: None,
        now,
        tokens: None,
        whole_answer: false,
    }
}

/// The next of `probes` in turn (`at` moves on), routed: its key and chain.
fn next_probe(probes: &[Vec<u8>], at: &mut usize, opts: &KeyOptions) -> (KeyHash, Chain) {
    *at = (*at + 1) % probes.len();
    native_route(black_box(&probes[*at]), None, opts).expect("routes")
}

/// A cache-aware strategy with an index of 1 Mi blocks, the key options that read its chains
/// (a 1,024-character key), and a fleet of `instances` (addresses 10.0.x.y, never dialled).
fn cache_aware_on(instances: usize) -> (Arc<dyn Strategy>, KeyOptions, Fleet) {
    let kind = StrategyKind::named("cache-aware").expect("registered");
    let mut config = StrategyConfig::new(kind);
    config
        .params
        .insert("index-blocks".into(), "1048576".into());
    let strategy = config.build().expect("builds");
    let spec = strategy.chain_spec().expect("cache-aware reads chains");
    let opts = KeyOptions {
        prefix_length: PrefixLength::new(1024).expect("valid"),
        chain: Some(spec),
    };
    let fleet = Fleet::new(
        (0..instances)
            .map(|i| InstanceSpec::from_url(format!("http://10.0.{}.{}:8000", i / 256, i % 256)))
            .collect(),
    );
    (strategy, opts, fleet)
}

fn bench(c: &mut Criterion) {
    let mut rng = RouteRng::seed_from_u64(11);
    let mut group = c.benchmark_group("cache_aware_decision_64KiB_index_1Mi_blocks");
    for n in [7usize, 64] {
        let (strategy, opts, fleet) = cache_aware_on(n);
        let snap = fleet.snapshot();
        // Fill the index: 64 KiB prompts are 512 blocks of 128 bytes; 2,100 of them fill 1 Mi.
        let mut docs: Vec<Vec<u8>> = Vec::new();
        for _ in 0..2100 {
            let body: Vec<u8> = (0..PROMPT).map(|_| rng.gen_range(0x20..0x7f)).collect();
            let (key, chain) = native_route(&body, None, &opts).expect("routes");
            let req = request(key, &chain, 0.0);
            let d = dispatch(&strategy, &req, &snap, &mut rng).expect("dispatches");
            d.ticket.finish(End::Finished { usage: None }, 0.1);
            docs.push(body);
        }
        let stats = strategy.stats().expect("cache-aware has stats");
        assert!(stats.index_blocks >= 1_000_000, "{}", stats.index_blocks);
        // Probes: the most recent documents with a new tail (deep match), and new prompts.
        let probes: Vec<Vec<u8>> = (0..64)
            .map(|i| {
                if i % 2 == 0 {
                    let mut b = docs[docs.len() - 1 - i].clone();
                    for x in &mut b[PROMPT - 200..] {
                        *x = b'q';
                    }
                    b
                } else {
                    (0..PROMPT).map(|_| rng.gen_range(0x20..0x7f)).collect()
                }
            })
            .collect();
        group.throughput(Throughput::Elements(1));
        let mut at = 0usize;
        group.bench_with_input(BenchmarkId::new("instances", n), &n, |b, _| {
            b.iter(|| {
                let (key, chain) = next_probe(&probes, &mut at, &opts);
                let req = request(key, &chain, 1.0);
                black_box(strategy.select(&req, &snap, &mut rng).ok())
            })
        });
        group.bench_with_input(BenchmarkId::new("dispatch_instances", n), &n, |b, _| {
            b.iter(|| {
                let (key, chain) = next_probe(&probes, &mut at, &opts);
                let req = request(key, &chain, 1.0);
                let d = dispatch(&strategy, &req, &snap, &mut rng).expect("dispatches");
                d.ticket.finish(End::Finished { usage: None }, 1.1);
            })
        });
    }
    group.finish();
}

/// A cache-aware strategy on 7 instances whose index (budget 1 Mi blocks) was sent `count`
/// 256 KiB prompts of 2,048 blocks each: the strategy, the fleet and the prompts still indexed
/// (the budget evicts the oldest whole), oldest first.
fn long_prompts(count: usize) -> (Arc<dyn Strategy>, Fleet, Vec<(KeyHash, Chain)>) {
    const LONG: usize = 256 * 1024;
    let mut rng = RouteRng::seed_from_u64(12);
    let (strategy, opts, fleet) = cache_aware_on(7);
    let snap = fleet.snapshot();
    let mut all: Vec<(KeyHash, Chain)> = Vec::new();
    for _ in 0..count {
        let body: Vec<u8> = (0..LONG).map(|_| rng.gen_range(0x20..0x7f)).collect();
        let (key, chain) = native_route(&body, None, &opts).expect("routes");
        let d =
            dispatch(&strategy, &request(key, &chain, 0.0), &snap, &mut rng).expect("dispatches");
        d.ticket.finish(End::Finished { usage: None }, 0.1);
        all.push((key, chain));
    }
    let indexed = (1 << 20) / 2048;
    let all = all.split_off(count.saturating_sub(indexed));
    (strategy, fleet, all)
}

/// Sends `chain` again (a revisit) or with its last block new (`new_tail`: a known document
/// with a new question; the chain's 16 KiB are copied to change it, inside what is measured,
/// the same for every build), and finishes the ticket.
fn send(
    strategy: &Arc<dyn Strategy>,
    snap: &FleetSnapshot,
    rng: &mut RouteRng,
    (key, chain): &(KeyHash, Chain),
    new_tail: Option<u64>,
) {
    let mut tailed;
    let chain = match new_tail {
        Some(h) => {
            tailed = chain.clone();
            if let Some(last) = tailed.blocks.last_mut() {
                *last = h;
            }
            &tailed
        }
        None => chain,
    };
    let d = dispatch(strategy, &request(*key, chain, 1.0), snap, rng).expect("dispatches");
    d.ticket.finish(End::Finished { usage: None }, 1.1);
}

fn bench_revisit(c: &mut Criterion) {
    let mut group = c.benchmark_group("cache_aware_dispatch_index_1Mi_blocks");
    let (strategy, fleet, all) = long_prompts(520);
    let snap = fleet.snapshot();
    let mut rng = RouteRng::seed_from_u64(13);
    let stats = strategy.stats().expect("cache-aware has stats");
    assert!(stats.index_blocks >= 1_000_000, "{}", stats.index_blocks);
    let kept = &all[all.len() - 16..];
    group.throughput(Throughput::Elements(1));
    let mut at = 0usize;
    group.bench_function("revisit_256KiB", |b| {
        b.iter(|| {
            at = (at + 1) % kept.len();
            send(&strategy, &snap, &mut rng, &kept[at], None);
        })
    });
    // The same, round robin over every prompt of the index (40 MiB of entries, more than
    // the last-level cache): each revisit reads its entries from memory, as on a server where
    // the bodies, the socket buffers and the client and engines on the other cores have
    // pushed them out since the prompt was last sent (there a 256 KiB revisit's decision took
    // about 16 µs of samples, 9 in the choice and 6.5 in the touch, against 7 µs here in all).
    let mut at = 0usize;
    group.bench_function("revisit_256KiB_from_memory", |b| {
        b.iter(|| {
            at = (at + 1) % all.len();
            send(&strategy, &snap, &mut rng, &all[at], None);
        })
    });
    // The same prompts with a new last block each time (a known document, a new question).
    let (mut at, mut tail) = (0usize, 0u64);
    group.bench_function("new_tail_256KiB_from_memory", |b| {
        b.iter(|| {
            at = (at + 1) % all.len();
            tail += 1;
            send(
                &strategy,
                &snap,
                &mut rng,
                &all[at],
                Some(0x5eed_0000_0000 + tail),
            );
        })
    });
    group.finish();
}

/// 8 conversations of 512 blocks (64 KiB) each, built up 4 blocks a turn, the conversations'
/// turns interleaved (as agents' steps are): each chain's blocks sit in the index's slab in
/// runs of 4, between other conversations' runs. The strategy, the fleet and the chains.
fn grown_conversations() -> (Arc<dyn Strategy>, Fleet, Vec<(KeyHash, Chain)>) {
    let (strategy, _, fleet) = cache_aware_on(7);
    let snap = fleet.snapshot();
    let mut rng = RouteRng::seed_from_u64(14);
    let block = |c: u64, b: u64| (c + 1) << 32 | b;
    let full = |c: u64, len: u64| Chain {
        blocks: (0..len).map(|b| block(c, b)).collect(),
        units: (len * 128) as u32,
        group: None,
    };
    for turn in 1..=128u64 {
        for c in 0..8 {
            let chain = full(c, turn * 4);
            let d = dispatch(
                &strategy,
                &request(KeyHash(c), &chain, 0.0),
                &snap,
                &mut rng,
            )
            .expect("dispatches");
            d.ticket.finish(End::Finished { usage: None }, 0.1);
        }
    }
    let all = (0..8).map(|c| (KeyHash(c), full(c, 512))).collect();
    (strategy, fleet, all)
}

/// `DISPATCH_LOOP="<revisit|new-tail|grown> <n>"`: 32 prompts of 256 KiB indexed, then `n`
/// dispatches of them in turn, sent again or each with a new last block; or (`grown`) the 8
/// conversations of [`grown_conversations`] sent again in turn. Then exits: for counting
/// instructions under callgrind (`bench/dispatch-instructions.sh` runs it at two values of
/// `n` and takes the difference).
fn dispatch_loop(spec: &str) {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    let [case, n] = parts.as_slice() else {
        panic!("DISPATCH_LOOP wants '<revisit|new-tail|grown> <n>', got {spec:?}");
    };
    let n: u64 = n.parse().unwrap_or_else(|e| panic!("DISPATCH_LOOP n: {e}"));
    let new_tail = match *case {
        "revisit" | "grown" => false,
        "new-tail" => true,
        other => panic!("DISPATCH_LOOP: unknown case {other:?}"),
    };
    let (strategy, fleet, all) = if *case == "grown" {
        grown_conversations()
    } else {
        long_prompts(32)
    };
    let snap = fleet.snapshot();
    let mut rng = RouteRng::seed_from_u64(13);
    for i in 0..n {
        let tail = new_tail.then_some(0x5eed_0000_0000 + i);
        send(
            &strategy,
            &snap,
            &mut rng,
            &all[i as usize % all.len()],
            tail,
        );
    }
    // The script checks for this line: a bench binary without this mode runs criterion instead.
    eprintln!("DISPATCH_LOOP done: {case} {n}");
}

criterion_group!(benches, bench, bench_revisit);

fn main() {
    if let Ok(spec) = std::env::var("DISPATCH_LOOP") {
        dispatch_loop(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
