//! The result of a run: every request's record, its latencies sorted, and derived figures.
//!
//! Percentiles are the exact nearest rank of the samples ([`nearest_rank`], the definition
//! `simulate` uses), so a P99 is a latency some request had and the demo's figures sit beside
//! the simulator's on the same terms. Every record is kept anyway: sorting their latencies costs
//! less than the run's own bookkeeping.

use std::collections::BTreeMap;

use prefix_router_workload::percentile::nearest_rank;

use crate::{FailureKind, LoadMode, RequestRecord};

/// Decision labels that mean the key's preferred instance was skipped because of load: the
/// server's and the simulator's (`cache-aware`'s `hot_replica` and `load` among them).
pub const OVERFLOW_DECISIONS: [&str; 4] = prefix_router_core::Reason::OVERFLOW_LABELS;

/// Percentiles, mean and maximum of a latency, milliseconds (all 0 when there are no samples).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct LatencyStats {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
    /// Largest.
    pub max: f64,
}

/// Everything a run observed.
#[derive(Debug, Clone)]
pub struct BenchOutcome {
    /// The target as given.
    pub target: String,
    /// The endpoint requests went to.
    pub endpoint: String,
    /// Pacing used.
    pub mode: LoadMode,
    /// Requests the run could have sent (the list after `max_requests`).
    pub planned: u64,
    /// One record per request sent, in the request list's order.
    pub records: Vec<RequestRecord>,
    /// From the start to the last response, seconds.
    pub wall_s: f64,
    /// The model given to requests that named none: the first the target listed.
    pub model_from_target: Option<String>,
    /// Milliseconds, ascending.
    ttft_ms: Vec<f64>,
    e2e_ms: Vec<f64>,
    send_lag_ms: Vec<f64>,
}

/// `seconds` in milliseconds, sorted ascending.
fn sorted_ms(seconds: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = seconds.map(|s| s * 1e3).collect();
    v.sort_by(f64::total_cmp);
    v
}

fn stats(sorted: &[f64]) -> LatencyStats {
    let at = |p: f64| nearest_rank(sorted, p).unwrap_or(0.0);
    LatencyStats {
        count: sorted.len() as u64,
        p50: at(50.0),
        p90: at(90.0),
        p99: at(99.0),
        mean: sorted.iter().sum::<f64>() / sorted.len().max(1) as f64,
        max: sorted.last().copied().unwrap_or(0.0),
    }
}

/// `(n - 1) / (last - first)` over ascending times: the mean rate of `n` events.
fn rate(times: impl Iterator<Item = f64>) -> Option<f64> {
    let (mut n, mut first, mut last) = (0u64, f64::INFINITY, f64::NEG_INFINITY);
    for t in times {
        n += 1;
        first = first.min(t);
        last = last.max(t);
    }
    (n >= 2 && last > first).then(|| (n - 1) as f64 / (last - first))
}

impl BenchOutcome {
    /// Builds the outcome from the records of a run (sorted here by index).
    pub fn from_records(
        target: String,
        endpoint: String,
        mode: LoadMode,
        planned: u64,
        mut records: Vec<RequestRecord>,
        wall_s: f64,
    ) -> Self {
        records.sort_by_key(|r| r.index);
        let ok = || records.iter().filter(|r| r.is_ok());
        let ttft_ms = sorted_ms(ok().filter_map(RequestRecord::ttft_s));
        let e2e_ms = sorted_ms(ok().map(RequestRecord::e2e_s));
        let send_lag_ms = match mode {
            LoadMode::OpenLoop { .. } => sorted_ms(records.iter().map(RequestRecord::send_lag_s)),
            LoadMode::ClosedLoop { .. } => Vec::new(),
        };
        BenchOutcome {
            target,
            endpoint,
            mode,
            planned,
            records,
            wall_s,
            model_from_target: None,
            ttft_ms,
            e2e_ms,
            send_lag_ms,
        }
    }

    fn ok(&self) -> impl Iterator<Item = &RequestRecord> {
        self.records.iter().filter(|r| r.is_ok())
    }

    /// Requests sent.
    pub fn sent(&self) -> u64 {
        self.records.len() as u64
    }

    /// Requests answered completely.
    pub fn completed(&self) -> u64 {
        self.ok().count() as u64
    }

    /// Failed requests by kind (kinds that did not occur are absent).
    pub fn failures(&self) -> BTreeMap<FailureKind, u64> {
        let mut out = BTreeMap::new();
        for f in self.records.iter().filter_map(|r| r.failure.as_ref()) {
            *out.entry(f.kind).or_insert(0) += 1;
        }
        out
    }

    /// Time to first content chunk of completed requests that had one.
    pub fn ttft_ms(&self) -> LatencyStats {
        stats(&self.ttft_ms)
    }

    /// Send-to-end latency of completed requests.
    pub fn e2e_ms(&self) -> LatencyStats {
        stats(&self.e2e_ms)
    }

    /// How late sends were against the open-loop schedule (no samples in closed loop).
    pub fn send_lag_ms(&self) -> LatencyStats {
        stats(&self.send_lag_ms)
    }

    /// TTFT percentiles 0, 1, ..., 100 in milliseconds (empty when there are no samples).
    pub fn ttft_percentiles_ms(&self) -> Vec<f64> {
        if self.ttft_ms.is_empty() {
            return Vec::new();
        }
        (0..=100)
            .filter_map(|p| nearest_rank(&self.ttft_ms, f64::from(p)))
            .collect()
    }

    /// Achieved send rate: the mean rate of the actual send times, requests per second.
    pub fn send_rate_rps(&self) -> Option<f64> {
        rate(self.records.iter().map(|r| r.sent_s))
    }

    /// The rate the schedule asked for over the requests sent (open loop).
    pub fn scheduled_rate_rps(&self) -> Option<f64> {
        rate(self.records.iter().map(|r| r.due_s))
    }

    /// Prompt tokens reported by completed requests.
    pub fn prompt_tokens(&self) -> u64 {
        self.ok()
            .filter_map(|r| r.usage.and_then(|u| u.prompt_tokens))
            .sum()
    }

    /// Cached prompt tokens reported by completed requests (0 where not reported).
    pub fn cached_tokens(&self) -> u64 {
        self.ok()
            .filter(|r| r.usage.and_then(|u| u.prompt_tokens).is_some())
            .filter_map(|r| r.usage.and_then(|u| u.cached_tokens))
            .sum()
    }

    /// Completed requests that asked for a stream and were answered as a whole JSON body: their
    /// TTFT is the whole answer's time.
    pub fn unstreamed(&self) -> u64 {
        self.ok().filter(|r| !r.streamed && !r.asked_whole).count() as u64
    }

    /// Completed requests sent with `stream: false` (`--unstreamed`).
    pub fn asked_whole(&self) -> u64 {
        self.ok().filter(|r| r.asked_whole).count() as u64
    }

    /// Completed requests whose usage reported `cached_tokens`.
    pub fn cached_tokens_reported(&self) -> u64 {
        self.ok()
            .filter(|r| r.usage.and_then(|u| u.cached_tokens).is_some())
            .count() as u64
    }

    /// Output tokens of completed requests.
    pub fn output_tokens(&self) -> u64 {
        self.ok().map(RequestRecord::output_tokens).sum()
    }

    /// Cached over prompt tokens of completed requests (0 when none were reported).
    pub fn hit_rate(&self) -> f64 {
        let prompt = self.prompt_tokens();
        if prompt == 0 {
            0.0
        } else {
            self.cached_tokens() as f64 / prompt as f64
        }
    }

    /// Completed requests per `x-prefix-router-instance` value (requests without the header
    /// are not counted).
    pub fn instance_requests(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for i in self.ok().filter_map(|r| r.instance.as_ref()) {
            *out.entry(i.clone()).or_insert(0) += 1;
        }
        out
    }

    /// Completed requests per `x-prefix-router-decision` value.
    pub fn decisions(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for d in self.ok().filter_map(|r| r.decision.as_ref()) {
            *out.entry(d.clone()).or_insert(0) += 1;
        }
        out
    }

    /// Fraction of decisions (of completed requests that reported one) that were overflows.
    pub fn overflow_rate(&self) -> f64 {
        let d = self.decisions();
        let total: u64 = d.values().sum();
        if total == 0 {
            return 0.0;
        }
        let over: u64 = OVERFLOW_DECISIONS.iter().filter_map(|k| d.get(*k)).sum();
        over as f64 / total as f64
    }

    /// From the first send to the last response's end, seconds.
    pub fn makespan_s(&self) -> f64 {
        let first = self
            .records
            .iter()
            .map(|r| r.sent_s)
            .fold(f64::INFINITY, f64::min);
        let last = self
            .records
            .iter()
            .map(|r| r.finished_s)
            .fold(0.0, f64::max);
        if first.is_finite() {
            (last - first).max(0.0)
        } else {
            0.0
        }
    }

    /// Completed requests per second over the makespan.
    pub fn throughput_rps(&self) -> f64 {
        per_second(self.completed(), self.makespan_s())
    }

    /// Output tokens per second over the makespan.
    pub fn output_tokens_per_s(&self) -> f64 {
        per_second(self.output_tokens(), self.makespan_s())
    }
}

fn per_second(n: u64, span_s: f64) -> f64 {
    if span_s > 0.0 {
        n as f64 / span_s
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(index: usize, ttft_ms: f64) -> RequestRecord {
        RequestRecord {
            index,
            id: index as u64,
            due_s: 0.0,
            sent_s: 0.0,
            first_content_s: Some(ttft_ms / 1e3),
            finished_s: ttft_ms / 1e3 + 0.5,
            status: Some(200),
            usage: None,
            content_chunks: 1,
            streamed: true,
            asked_whole: false,
            instance: None,
            decision: None,
            failure: None,
        }
    }

    #[test]
    fn percentiles_are_latencies_requests_had_at_their_exact_rank() {
        // 1..=100 ms in a shuffled order.
        let records = (0..100)
            .map(|i| record(i, f64::from((i as u32 * 37) % 100 + 1)))
            .collect();
        let out = BenchOutcome::from_records(
            "t".into(),
            "e".into(),
            LoadMode::ClosedLoop { concurrency: 1 },
            100,
            records,
            1.0,
        );
        let curve = out.ttft_percentiles_ms();
        assert_eq!(curve.len(), 101);
        // p × n / 100 exactly: rank 7 of 100, where a float quantile read rank 8.
        for p in [7usize, 14, 28, 55, 56] {
            assert!((curve[p] - p as f64).abs() < 1e-9, "p{p}: {}", curve[p]);
        }
        let s = out.ttft_ms();
        assert_eq!((s.count, s.p50, s.p90, s.p99), (100, 50.0, 90.0, 99.0));
        assert!((s.max - 100.0).abs() < 1e-9 && (s.mean - 50.5).abs() < 1e-9);
        assert!((out.e2e_ms().p99 - 599.0).abs() < 1e-9);
        assert_eq!(out.send_lag_ms().count, 0);
    }
}
