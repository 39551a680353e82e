//! From a run's raw records to the numbers a report shows.

use prefix_router_workload::{Affinity, Request};

use prefix_router_workload::ScaleEvent;

use crate::members::instance_id;
use crate::report::{AfterScale, Placement, StrategyResult};
use crate::run::{RequestRecord, RunOutcome};
use crate::stats::{hit_rate_series, percentile_curve, LatencySummary};

/// Seconds on each side of a scale event that [`AfterScale`] compares.
pub const SCALE_WINDOW_S: f64 = 60.0;

/// The requests that arrived within [`SCALE_WINDOW_S`] before and after each event.
fn after_scale(
    requests: &[Request],
    outcome: &RunOutcome,
    scale: &[ScaleEvent],
) -> Vec<AfterScale> {
    let window = |from: f64, to: f64| {
        let mut cached = 0u64;
        let mut prompt = 0u64;
        let mut ttft: Vec<f64> = Vec::new();
        for (r, q) in outcome.records.iter().zip(requests) {
            if r.start_s >= from && r.start_s < to {
                cached += u64::from(r.cached_tokens);
                prompt += u64::from(q.prompt_tokens());
                ttft.push((r.first_token_s - r.start_s) * 1000.0);
            }
        }
        ttft.sort_by(f64::total_cmp);
        let hit = if prompt > 0 {
            cached as f64 / prompt as f64
        } else {
            0.0
        };
        (hit, LatencySummary::from_sorted(&ttft).p90)
    };
    scale
        .iter()
        .map(|e| {
            let (hit_rate_before, ttft_p90_before_ms) = window(e.at_s - SCALE_WINDOW_S, e.at_s);
            let (hit_rate_after, ttft_p90_after_ms) = window(e.at_s, e.at_s + SCALE_WINDOW_S);
            AfterScale {
                at_s: e.at_s,
                delta: e.delta,
                hit_rate_before,
                hit_rate_after,
                ttft_p90_before_ms,
                ttft_p90_after_ms,
            }
        })
        .collect()
}

/// Summarizes one strategy's run of `requests` (every record must be finished).
pub fn summarize(
    strategy: &str,
    requests: &[Request],
    outcome: &RunOutcome,
    buckets: usize,
    scale: &[ScaleEvent],
) -> StrategyResult {
    let records = &outcome.records;
    let n = records.len();
    let mut ttft: Vec<f64> = records
        .iter()
        .map(|r| (r.first_token_s - r.start_s) * 1000.0)
        .collect();
    let mut e2e: Vec<f64> = records
        .iter()
        .map(|r| (r.finish_s - r.start_s) * 1000.0)
        .collect();
    ttft.sort_by(f64::total_cmp);
    e2e.sort_by(f64::total_cmp);

    let prompt_tokens: u64 = requests.iter().map(|r| u64::from(r.prompt_tokens())).sum();
    let cached_tokens: u64 = records.iter().map(|r| u64::from(r.cached_tokens)).sum();
    let output_tokens: u64 = requests.iter().map(|r| u64::from(r.output_tokens)).sum();
    let first_arrival = records
        .iter()
        .map(|r| r.start_s)
        .fold(f64::INFINITY, f64::min);
    let last_finish = records
        .iter()
        .map(|r| r.finish_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let makespan = if n > 0 {
        (last_finish - first_arrival).max(0.0)
    } else {
        0.0
    };
    let per_second = |count: u64| {
        if makespan > 0.0 {
            count as f64 / makespan
        } else {
            0.0
        }
    };
    let total_dispatched: u64 = outcome.dispatched.iter().sum();
    let fraction = |part: u64, whole: u64| {
        if whole > 0 {
            part as f64 / whole as f64
        } else {
            0.0
        }
    };

    let series = hit_rate_series(
        records
            .iter()
            .zip(requests)
            .map(|(r, q)| (r.first_token_s, r.cached_tokens, q.prompt_tokens())),
        if n > 0 { last_finish } else { 0.0 },
        buckets,
    );

    let served = records
        .iter()
        .zip(requests)
        .filter(|(r, _)| r.instance != u32::MAX)
        .map(|(r, q)| (q, r.instance));
    let affinity = Some(Affinity::of(served, outcome.dispatched.len()));
    StrategyResult {
        affinity,
        after_scale: after_scale(requests, outcome, scale),
        strategy: strategy.to_string(),
        requests: n as u64,
        ttft_ms: LatencySummary::from_sorted(&ttft),
        e2e_ms: LatencySummary::from_sorted(&e2e),
        kv_hit_rate: fraction(cached_tokens, prompt_tokens),
        throughput_rps: per_second(n as u64),
        output_tokens_per_s: per_second(output_tokens),
        instance_share: outcome
            .dispatched
            .iter()
            .map(|&d| fraction(d, total_dispatched))
            .collect(),
        overflow_rate: fraction(outcome.overflows, n as u64),
        instance_ids: (0..outcome.dispatched.len()).map(instance_id).collect(),
        instance_requests: outcome.dispatched.clone(),
        decisions: outcome.decisions.clone(),
        prompt_tokens,
        cached_tokens,
        output_tokens,
        makespan_s: makespan,
        ttft_percentiles_ms: percentile_curve(&ttft),
        hit_rate_over_time: series,
        strategy_stats: outcome.strategy_stats.clone(),
        placement: placement(records, &ttft),
    }
}

/// Where a strategy sent each request against the soonest start on offer then (`None` when the
/// run did not read the engines' times: no `--clairvoyant`, or the clairvoyant row itself).
/// `sorted_ttft_ms`: the run's times to first token, sorted.
fn placement(records: &[RequestRecord], sorted_ttft_ms: &[f64]) -> Option<Placement> {
    let read: Vec<&RequestRecord> = records
        .iter()
        .filter(|r| r.chosen_first_token_s.is_finite() && r.soonest_first_token_s.is_finite())
        .collect();
    if read.is_empty() {
        return None;
    }
    let mut lost: Vec<f64> = read
        .iter()
        .map(|r| (1e3 * (r.chosen_first_token_s - r.soonest_first_token_s)).max(0.0))
        .collect();
    lost.sort_by(f64::total_cmp);
    let at_soonest = lost.iter().filter(|&&l| l < 1.0).count() as f64 / lost.len() as f64;
    let p90 = LatencySummary::from_sorted(sorted_ttft_ms).p90;
    // The slowest 10%, and of those the ones some instance would have started under the P90.
    let (slow, placed) = read
        .iter()
        .filter(|r| 1e3 * (r.first_token_s - r.start_s) >= p90)
        .fold((0usize, 0usize), |(slow, placed), r| {
            let could = 1e3 * (r.soonest_first_token_s - r.start_s) < p90;
            (slow + 1, placed + usize::from(could))
        });
    Some(Placement {
        at_soonest,
        lost_ms: LatencySummary::from_sorted(&lost),
        slow_placed: if slow == 0 {
            0.0
        } else {
            placed as f64 / slow as f64
        },
    })
}
