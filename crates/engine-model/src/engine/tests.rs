//! Scheduler, cache and timing behaviour of [`Engine`].

use super::*;
use crate::presets;
use crate::CostModel;
use proptest::prelude::*;

/// A test engine: 16-token blocks, simple round costs, no frontend latency.
fn config(capacity: u32, max_num_seqs: u32, budget: u32) -> EngineConfig {
    EngineConfig {
        block_tokens: 16,
        kv_capacity_blocks: capacity,
        max_num_seqs,
        max_batched_tokens: budget,
        cost: CostModel {
            step_overhead_s: 0.001,
            per_seq_s: 0.0,
            weight_read_s: 0.010,
            linear_s_per_token: 1e-5,
            attention_s_per_pair: 1e-9,
            kv_read_s_per_token: 1e-7,
            request_overhead_s: 0.0,
        },
    }
}

/// A prompt of `tokens` tokens whose full blocks hash as `chain` followed by `id`-unique blocks.
fn request(id: u64, chain: &[u64], tokens: u32, output: u32) -> EngineRequest {
    let full = (tokens / 16) as usize;
    let mut block_hashes: Vec<u64> = chain.iter().copied().take(full).collect();
    while block_hashes.len() < full {
        block_hashes.push((id << 32) | block_hashes.len() as u64);
    }
    EngineRequest {
        id,
        block_hashes,
        prompt_tokens: tokens,
        output_tokens: output,
    }
}

/// Drives `engine` through `arrivals` (sorted by time) until idle, as a simulator would.
fn run(engine: &mut Engine, arrivals: Vec<(f64, EngineRequest)>) -> Vec<EngineEvent> {
    let mut out = Vec::new();
    let mut arrivals = arrivals.into_iter().peekable();
    for _ in 0..1_000_000 {
        let next_arrival = arrivals.peek().map(|a| a.0);
        match (next_arrival, engine.next_event_at()) {
            (None, None) => return out,
            (Some(a), e) if e.is_none_or(|e| a < e) => {
                engine.advance(a, &mut out);
                if let Some((t, req)) = arrivals.next() {
                    engine.submit(t, req);
                }
            }
            (_, Some(e)) => engine.advance(e, &mut out),
            (Some(_), None) => unreachable!("covered by the arrival arm"),
        }
    }
    panic!("engine did not go idle");
}

fn first_token(events: &[EngineEvent], id: u64) -> (f64, u32) {
    events
        .iter()
        .find_map(|e| match *e {
            EngineEvent::FirstToken {
                id: i,
                at,
                cached_tokens,
            } if i == id => Some((at, cached_tokens)),
            _ => None,
        })
        .expect("first token")
}

fn finished(events: &[EngineEvent], id: u64) -> f64 {
    events
        .iter()
        .find_map(|e| match *e {
            EngineEvent::Finished { id: i, at } if i == id => Some(at),
            _ => None,
        })
        .expect("finished")
}

#[test]
fn repeated_prompt_is_served_from_cache() {
    let mut e = Engine::new(config(1000, 8, 512));
    let chain: Vec<u64> = (1..=20).collect();
    // 100 tokens: 6 full blocks + 4 tokens.
    let ev = run(
        &mut e,
        vec![
            (0.0, request(1, &chain, 100, 3)),
            (1.0, request(2, &chain, 100, 3)),
        ],
    );
    assert_eq!(first_token(&ev, 1).1, 0);
    assert_eq!(first_token(&ev, 2).1, 96);
    // 64 tokens: 4 full blocks all cached, capped at len - 1.
    let ev = run(&mut e, vec![(2.0, request(3, &chain, 64, 1))]);
    assert_eq!(first_token(&ev, 3).1, 63);
    let s = e.stats();
    assert_eq!(
        (s.requests, s.prompt_tokens, s.cached_tokens),
        (3, 264, 159)
    );
}

#[test]
fn a_different_prefix_is_not_a_hit() {
    let mut e = Engine::new(config(1000, 8, 512));
    let a: Vec<u64> = (1..=10).collect();
    let mut b = a.clone();
    b[2] = 99; // same first two blocks, then diverges
    let c: Vec<u64> = (100..110).collect();
    let ev = run(
        &mut e,
        vec![
            (0.0, request(1, &a, 160, 1)),
            (1.0, request(2, &b, 160, 1)),
            (2.0, request(3, &c, 160, 1)),
        ],
    );
    assert_eq!(first_token(&ev, 2).1, 32);
    assert_eq!(first_token(&ev, 3).1, 0);
}

#[test]
fn blocks_become_cached_as_prefill_computes_them() {
    // Budget 128: request 1's 200-token prompt takes 2 steps. Request 2, with the same prompt,
    // arrives during the first step and finds the 8 blocks computed by it.
    let mut e = Engine::new(config(1000, 8, 128));
    let chain: Vec<u64> = (1..=16).collect();
    let mut out = Vec::new();
    e.submit(0.0, request(1, &chain, 200, 1));
    e.advance(0.0, &mut out);
    let first_end = e.next_event_at().expect("step running");
    // Ready during step 1: joins step 2 with the 56 tokens of budget request 1 leaves.
    e.submit(first_end / 2.0, request(2, &chain, 200, 1));
    let ev = run(&mut e, Vec::new());
    assert_eq!(first_token(&ev, 2).1, 128);
}

#[test]
fn lru_eviction_spares_recent_and_referenced_blocks() {
    // 28 blocks. Requests 1 and 2: 64-token prompt (4 full blocks) + 16 output = 5 blocks.
    let mut e = Engine::new(config(28, 8, 512));
    let old: Vec<u64> = (1..=4).collect();
    let recent: Vec<u64> = (11..=14).collect();
    let held: Vec<u64> = (21..=24).collect();
    run(
        &mut e,
        vec![
            (0.0, request(1, &old, 64, 16)),
            (1.0, request(2, &recent, 64, 16)),
        ],
    );
    assert_eq!(e.cache().cached_blocks(), 8);
    // A long-running request (11 blocks) keeps its blocks referenced.
    let mut out = Vec::new();
    e.submit(2.0, request(3, &held, 64, 100));
    e.advance(2.5, &mut out);
    assert!(held.iter().all(|&h| e.cache().refs(h) == Some(1)));
    // 8 cached + 11 held = 19 occupied; a 10-block request needs 9 free + 1 evicted.
    e.submit(2.5, request(4, &[], 144, 16));
    e.advance(2.6, &mut out);
    assert_eq!(e.running(), 2);
    assert!(
        !e.cache().contains(4),
        "tail of the least recently used chain evicted first"
    );
    assert!(old[..3].iter().all(|&h| e.cache().contains(h)));
    assert!(recent.iter().all(|&h| e.cache().contains(h)));
    // The next request needs more than free + evictable: it waits, and nothing referenced goes.
    e.submit(2.6, request(5, &[], 320, 16)); // 21 blocks > 28 - 11 held
    e.advance(2.7, &mut out);
    assert_eq!(e.waiting(), 1);
    assert!(held.iter().all(|&h| e.cache().contains(h)));
    assert!(e.cache().occupied_blocks() <= 28);
}

#[test]
fn continuous_batching_shares_decode_steps() {
    let alone = {
        let mut e = Engine::new(config(1000, 8, 512));
        let ev = run(&mut e, vec![(0.0, request(1, &[], 64, 200))]);
        finished(&ev, 1)
    };
    let mut e = Engine::new(config(1000, 8, 512));
    let ev = run(
        &mut e,
        vec![
            (0.0, request(1, &[], 64, 200)),
            (0.0, request(2, &[], 64, 200)),
        ],
    );
    let both = finished(&ev, 1).max(finished(&ev, 2));
    assert!(
        both < 1.2 * alone,
        "two together {both} vs one alone {alone}"
    );
}

#[test]
fn max_num_seqs_queues_extra_requests_fcfs() {
    let mut e = Engine::new(config(1000, 2, 512));
    let arrivals = (1..=4).map(|id| (0.0, request(id, &[], 32, 10))).collect();
    let ev = run(&mut e, arrivals);
    let firsts: Vec<u64> = ev
        .iter()
        .filter(|e| matches!(e, EngineEvent::FirstToken { .. }))
        .map(EngineEvent::id)
        .collect();
    assert_eq!(firsts, vec![1, 2, 3, 4]);
    assert!(first_token(&ev, 3).0 >= finished(&ev, 1).min(finished(&ev, 2)));
    assert!(first_token(&ev, 2).0 < finished(&ev, 1));
}

#[test]
fn token_budget_chunks_a_long_prefill() {
    let cfg = config(1000, 8, 256);
    let cost = cfg.cost.clone();
    let mut e = Engine::new(cfg);
    let ev = run(&mut e, vec![(0.0, request(1, &[], 1000, 1))]);
    // ceil(1000 / 256) = 4 steps.
    assert_eq!(e.stats().steps, 4);
    let expected = cost.idle_ttft(1000, 0, 256);
    assert!((first_token(&ev, 1).0 - expected).abs() < 1e-12);
    assert!(first_token(&ev, 1).0 > cost.idle_ttft(1000, 0, 1000));
}

#[test]
fn decodes_take_budget_before_prefills() {
    // Budget 16: one running decode leaves 15 tokens for the newcomer's prefill.
    let mut e = Engine::new(config(1000, 8, 16));
    let mut out = Vec::new();
    e.submit(0.0, request(1, &[], 8, 100));
    let t = e.next_event_at().expect("wake-up");
    e.advance(t, &mut out);
    let t = e.next_event_at().expect("step");
    e.advance(t, &mut out); // request 1 has its first token and decodes from now on
    e.submit(t, request(2, &[], 30, 1));
    let ev = run(&mut e, Vec::new());
    // 30 tokens at 15 per step: two steps after it joins.
    let steps_for_2 = e.stats().steps;
    assert!(steps_for_2 >= 3);
    let ft = first_token(&ev, 2).0;
    assert!(ft > t);
    assert_eq!(finished(&ev, 2), ft);
}

#[test]
fn output_of_one_token_finishes_at_first_token() {
    let mut e = Engine::new(config(100, 8, 512));
    let ev = run(&mut e, vec![(0.0, request(7, &[], 20, 1))]);
    assert_eq!(ev.len(), 2);
    assert_eq!(first_token(&ev, 7).0, finished(&ev, 7));
    assert!(matches!(ev[0], EngineEvent::FirstToken { .. }));
}

#[test]
fn a_request_joins_the_next_step_when_one_is_running() {
    let mut e = Engine::new(config(1000, 8, 512));
    let mut out = Vec::new();
    e.submit(0.0, request(1, &[], 64, 50));
    e.advance(0.0, &mut out);
    let end = e.next_event_at().expect("step");
    e.submit(end / 2.0, request(2, &[], 64, 1));
    e.advance(end / 2.0, &mut out);
    assert_eq!(e.running(), 1, "no joining mid-step");
    let ev = run(&mut e, Vec::new());
    assert!(first_token(&ev, 2).0 > end);
}

#[test]
fn frontend_overhead_delays_scheduling() {
    let mut cfg = config(1000, 8, 512);
    cfg.cost.request_overhead_s = 0.05;
    let cost = cfg.cost.clone();
    let mut e = Engine::new(cfg);
    let ev = run(&mut e, vec![(1.0, request(1, &[], 64, 1))]);
    assert!((first_token(&ev, 1).0 - (1.0 + cost.idle_ttft(64, 0, 512))).abs() < 1e-12);
}

#[test]
fn a_request_larger_than_the_cache_runs_alone_overcommitted() {
    let mut e = Engine::new(config(4, 8, 512));
    let mut out = Vec::new();
    e.submit(0.0, request(1, &[], 32, 1)); // 3 blocks: fits
    e.submit(0.0, request(2, &[], 160, 16)); // 11 blocks: never fits
    e.submit(0.0, request(3, &[], 16, 1)); // behind it, FCFS
    e.advance(0.0, &mut out);
    assert_eq!(e.running(), 1);
    let ev = run(&mut e, Vec::new());
    assert!(first_token(&ev, 2).0 >= finished(&ev, 1));
    assert!(first_token(&ev, 3).0 >= finished(&ev, 2));
    assert_eq!(e.stats().finished, 3);
    assert_eq!(e.cache().used_blocks(), 0);
}

#[test]
fn a_request_larger_than_the_cache_leaves_no_more_than_the_cache_behind() {
    let mut e = Engine::new(config(4, 8, 512));
    let doc: Vec<u64> = (1..=10).collect();
    run(&mut e, vec![(0.0, request(1, &doc, 160, 1))]);
    assert!(
        e.cache().cached_blocks() <= 4,
        "{}",
        e.cache().cached_blocks()
    );
    let ev = run(&mut e, vec![(100.0, request(2, &doc, 160, 1))]);
    let (_, cached) = first_token(&ev, 2);
    assert!(
        cached <= 64,
        "{cached} tokens cached of a 160-token prompt in a 64-token cache"
    );
}

#[test]
fn llama_70b_ttft_lies_in_the_published_envelope() {
    let cfg = presets::llama_3_1_70b_h100x8();
    let mut e = Engine::new(cfg);
    let doc: Vec<u64> = (1..=500).collect();
    let ev = run(
        &mut e,
        vec![
            (0.0, request(1, &doc, 8000, 100)),
            (10.0, request(2, &doc, 8000, 100)),
        ],
    );
    let uncached = first_token(&ev, 1).0;
    let (at, cached_tokens) = first_token(&ev, 2);
    let cached = at - 10.0;
    assert_eq!(cached_tokens, 7999);
    let (lo, hi) = (
        presets::PUBLISHED_TTFT_FLOOR_S,
        presets::PUBLISHED_TTFT_TOP_S,
    );
    assert!((lo - 1e-9..=hi).contains(&uncached), "uncached {uncached}");
    assert!((lo - 1e-9..=hi).contains(&cached), "cached {cached}");
    assert!(uncached > 3.0 * cached);
}

#[test]
fn events_come_in_time_order() {
    let mut e = Engine::new(config(200, 4, 128));
    let arrivals = (0..40u64)
        .map(|i| {
            (
                i as f64 * 0.003,
                request(
                    i,
                    &[1, 2, 3],
                    40 + (i as u32 * 37) % 300,
                    1 + (i as u32 * 13) % 40,
                ),
            )
        })
        .collect();
    let ev = run(&mut e, arrivals);
    assert_eq!(ev.len(), 80);
    assert!(ev.windows(2).all(|w| w[0].at() <= w[1].at()));
}

#[test]
fn try_new_and_try_submit_name_the_bad_field() {
    let mut bad = config(10, 8, 4);
    assert_eq!(
        Engine::try_new(bad.clone()).err(),
        Some(ConfigError::BudgetBelowSeqs { budget: 4, seqs: 8 })
    );
    bad.max_batched_tokens = 8;
    bad.cost.weight_read_s = f64::NAN;
    let Err(err) = Engine::try_new(bad.clone()) else {
        panic!("bad cost accepted")
    };
    assert!(err.to_string().contains("cost.weight_read_s"), "{err}");
    // `new` repairs instead of failing.
    assert_eq!(Engine::new(bad).config().cost.weight_read_s, 0.0);

    let mut e = Engine::try_new(config(10, 8, 64)).expect("valid");
    let r = |p, o, n| EngineRequest {
        id: 9,
        block_hashes: vec![0; n],
        prompt_tokens: p,
        output_tokens: o,
    };
    assert_eq!(
        e.try_submit(0.0, r(0, 1, 0)),
        Err(RequestError::EmptyPrompt { id: 9 })
    );
    assert_eq!(
        e.try_submit(0.0, r(1, 0, 0)),
        Err(RequestError::NoOutput { id: 9 })
    );
    assert!(matches!(
        e.try_submit(0.0, r(20, 1, 2)),
        Err(RequestError::TooManyBlocks { .. })
    ));
    assert_eq!(e.try_submit(1.0, r(20, 1, 1)), Ok(()));
    assert!(matches!(
        e.try_submit(0.5, r(20, 1, 1)),
        Err(RequestError::BadTime { .. })
    ));
}

/// One generated request: (gap since the previous arrival, prefix chain, prompt, output).
type GenRequest = (f64, u64, u32, u32);

/// Arbitrary workloads for the invariants below.
fn workload() -> impl Strategy<Value = (u32, u32, u32, Vec<GenRequest>)> {
    (
        1u32..40, // capacity in blocks
        1u32..6,  // max_num_seqs
        0u32..64, // budget above max_num_seqs
        proptest::collection::vec((0.0f64..0.05, 0u64..4, 1u32..200, 1u32..12), 1..40),
    )
}

fn run_workload(
    capacity: u32,
    seqs: u32,
    extra: u32,
    reqs: &[GenRequest],
) -> (Vec<EngineEvent>, u32, u32) {
    let mut e = Engine::new(config(capacity, seqs, seqs + extra));
    let mut t = 0.0;
    let mut out = Vec::new();
    let mut peak_used = 0;
    let mut biggest = 0;
    let chains: Vec<Vec<u64>> = (0..4u64)
        .map(|c| (0..20).map(|b| c * 1000 + b).collect())
        .collect();
    let mut pending: Vec<(f64, EngineRequest)> = Vec::new();
    for (i, &(gap, chain, prompt, output)) in reqs.iter().enumerate() {
        t += gap;
        biggest = biggest.max((prompt + output).div_ceil(16));
        pending.push((
            t,
            request(i as u64, &chains[chain as usize], prompt, output),
        ));
    }
    let mut arrivals = pending.into_iter().peekable();
    for _ in 0..100_000 {
        let next_arrival = arrivals.peek().map(|a| a.0);
        match (next_arrival, e.next_event_at()) {
            (None, None) => break,
            (Some(a), ev) if ev.is_none_or(|ev| a < ev) => {
                e.advance(a, &mut out);
                if let Some((at, req)) = arrivals.next() {
                    e.submit(at, req);
                }
            }
            (_, Some(ev)) => e.advance(ev, &mut out),
            (Some(_), None) => unreachable!(),
        }
        peak_used = peak_used
            .max(e.cache().used_blocks())
            .max(e.cache().occupied_blocks());
        if e.next_event_at().is_none() && arrivals.peek().is_none() {
            return (out, peak_used, biggest);
        }
    }
    panic!("engine stuck: {e:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Capacity holds (beyond it only by one oversized request running alone), every request
    /// gets exactly one first token then exactly one finish, events are time ordered, and the
    /// same input gives the same events.
    #[test]
    fn engine_invariants((capacity, seqs, extra, reqs) in workload()) {
        let (events, peak, biggest) = run_workload(capacity, seqs, extra, &reqs);
        prop_assert!(peak <= capacity.max(biggest), "peak {} capacity {} biggest {}", peak, capacity, biggest);
        prop_assert!(events.windows(2).all(|w| w[0].at() <= w[1].at()));
        let n = reqs.len();
        let mut first = vec![0u32; n];
        let mut done = vec![0u32; n];
        for ev in &events {
            let i = ev.id() as usize;
            match ev {
                EngineEvent::FirstToken { cached_tokens, .. } => {
                    prop_assert_eq!(done[i], 0, "finish before first token");
                    prop_assert!(*cached_tokens < reqs[i].2);
                    first[i] += 1;
                }
                EngineEvent::Finished { .. } => {
                    prop_assert_eq!(first[i], 1);
                    done[i] += 1;
                }
            }
        }
        prop_assert!(first.iter().all(|&c| c == 1) && done.iter().all(|&c| c == 1));
        let (again, _, _) = run_workload(capacity, seqs, extra, &reqs);
        prop_assert_eq!(events, again);
    }
}

#[test]
fn progress_counts_generated_tokens_step_by_step() {
    let mut e = Engine::new(config(1000, 8, 512));
    e.submit(0.0, request(1, &[], 40, 3));
    let mut out = Vec::new();
    let mut seen = Vec::new();
    while let Some(t) = e.next_event_at() {
        e.advance(t, &mut out);
        seen.push(e.progress().collect::<Vec<_>>());
    }
    // Admitted (prefill under way, nothing generated), the prefill step ends with the first
    // token, then one token per decode step; the request leaves with its last token.
    assert_eq!(seen, vec![vec![(1, 0)], vec![(1, 1)], vec![(1, 2)], vec![]]);
    assert!(finished(&out, 1) > first_token(&out, 1).0);
}

proptest! {
    /// The look-ahead is the engine's own future: with nothing sent after it, the request's
    /// first token comes exactly when predicted, whatever the engine was doing (queued,
    /// prefilling, decoding, sharing its prefix), and predicting changes nothing.
    #[test]
    fn first_token_if_sent_is_exactly_what_happens_when_nothing_follows(
        before in proptest::collection::vec((0.0f64..0.05, 0u64..3, 1u32..300, 1u32..10), 0..12),
        at in 0.0f64..0.08,
        shared in 0u64..3,
        tokens in 1u32..400,
    ) {
        let mut e = Engine::new(config(64, 4, 128));
        let mut arrivals: Vec<(f64, EngineRequest)> = before
            .iter()
            .enumerate()
            .map(|(i, &(t, doc, tok, out))| (t, request(i as u64, &[doc * 100, doc * 100 + 1], tok, out)))
            .collect();
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut out = Vec::new();
        for (t, req) in arrivals.into_iter().filter(|a| a.0 <= at) {
            e.advance(t, &mut out);
            e.submit(t, req);
        }
        e.advance(at, &mut out);
        let probe = request(1_000, &[shared * 100, shared * 100 + 1], tokens, 2);
        let stats = e.stats();
        let predicted = e.first_token_if_sent(at, &probe).expect("finite time");
        prop_assert_eq!(e.stats(), stats);
        e.submit(at, probe);
        let rest = run(&mut e, Vec::new());
        prop_assert_eq!(predicted, first_token(&rest, 1_000).0);
    }
}

#[test]
fn first_token_if_sent_sees_the_queue_and_the_cache() {
    let mut e = Engine::new(config(1000, 8, 512));
    let idle = e.first_token_if_sent(0.0, &request(9, &[1, 2, 3], 64, 2));
    // Busy with a long prefill: the same request starts later.
    e.submit(0.0, request(1, &[], 4000, 2));
    let mut out = Vec::new();
    e.advance(0.0, &mut out);
    let busy = e.first_token_if_sent(0.0, &request(9, &[1, 2, 3], 64, 2));
    assert!(busy > idle, "{busy:?} against {idle:?}");
    assert_eq!(
        e.first_token_if_sent(f64::NAN, &request(9, &[], 64, 2)),
        None
    );
}
