//! What the demo reports beyond `simulate`'s fields, and the conversion of its wall-clock runs
//! to engine time.

use prefix_router_loadgen::{Affinity, BenchOutcome};
use prefix_router_server::prom;
use prefix_router_sim::{Report, StrategyResult};

/// The `demo` JSON: `simulate`'s report (engine time) plus what only the demo has.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoReport {
    /// `simulate`'s fields; every time and rate in engine units.
    #[serde(flatten)]
    pub report: Report,
    /// Wall seconds per engine second the engines ran at.
    pub time_scale: f64,
    /// Per strategy: sends, failures and the measured HTTP-path overhead.
    pub runs: Vec<RunSummary>,
    /// `simulate`'s results for the same workload and settings.
    pub simulated: Vec<StrategyResult>,
}

/// What one strategy's run did, beyond `simulate`'s fields.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunSummary {
    /// Strategy name.
    pub strategy: String,
    /// Requests sent.
    pub sent: u64,
    /// Requests that failed.
    pub failed: u64,
    /// Wall seconds of the replay.
    pub wall_s: f64,
    /// Mean TTFT the engines themselves measured (submission to first token), engine ms.
    pub engine_ttft_mean_ms: Option<f64>,
    /// Mean TTFT the client measured, wall ms.
    pub client_ttft_mean_wall_ms: f64,
    /// The HTTP path's share of each TTFT (client mean minus the engines' own, both in wall
    /// time), wall ms; counted 1:1 in the engine-time results, not divided by the time scale.
    pub http_path_wall_ms: f64,
    /// TTFT P50 if every wall millisecond were divided by the time scale (HTTP path
    /// included), engine ms: what the table would read without that accounting.
    pub ttft_p50_all_scaled_ms: f64,
    /// Open loop: how late the load generator sent against the schedule, P99 in wall ms (a
    /// late send is time the TTFT figures do not see). `None` in a closed loop.
    pub send_lag_p99_wall_ms: Option<f64>,
    /// Router replicas the load was split across.
    pub replicas: u32,
    /// Whether the routers counted the engines' scraped queues.
    pub engine_queues: bool,
    /// How requests sharing a prefix stayed together, and the busiest instance's load.
    pub affinity: Affinity,
    /// With `--kv-events`: what the routers' subscribers saw, summed over the replicas.
    pub kv_events: Option<KvEventSummary>,
}

/// The routers' KV-event subscribers over one run (from their `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct KvEventSummary {
    /// Batches applied.
    pub batches: f64,
    /// Sequence gaps seen (joining a stream that had started counts one).
    pub gaps: f64,
    /// Gaps filled from the replay sockets.
    pub recovered: f64,
    /// Gaps given up (the view then partial).
    pub lost: f64,
    /// Recoveries timed.
    pub recoveries: f64,
    /// Their total time, from a gap's detection to the end of its replay, wall seconds.
    pub recovery_s: f64,
    /// Every recovery took at most this long, wall ms (the histogram bucket's bound).
    pub recovery_max_ms: f64,
}

impl KvEventSummary {
    /// Adds what one router's metrics page says.
    pub fn add(&mut self, page: &str) {
        let value =
            |name: &str, labels: &[(&str, &str)]| prom::value(page, name, labels).unwrap_or(0.0);
        self.batches += value("prefix_router_kv_event_batches_total", &[]);
        self.gaps += value("prefix_router_kv_event_gaps_total", &[]);
        let replays = "prefix_router_kv_event_replays_total";
        self.recovered += value(replays, &[("kind", "recovered")]);
        self.lost += value(replays, &[("kind", "lost")]);
        let count = value("prefix_router_kv_event_recovery_seconds_count", &[]);
        self.recoveries += count;
        self.recovery_s += value("prefix_router_kv_event_recovery_seconds_sum", &[]);
        // The smallest bucket bound that every observation is under.
        let max = prom::samples(page)
            .filter(|s| s.name == "prefix_router_kv_event_recovery_seconds_bucket")
            .filter(|s| count > 0.0 && s.value >= count)
            .filter_map(|s| s.label("le").and_then(|le| le.parse::<f64>().ok()))
            .fold(f64::INFINITY, f64::min);
        if max.is_finite() {
            self.recovery_max_ms = self.recovery_max_ms.max(max * 1e3);
        }
    }
    /// Mean recovery, wall ms.
    pub fn recovery_mean_ms(&self) -> f64 {
        if self.recoveries > 0.0 {
            self.recovery_s / self.recoveries * 1e3
        } else {
            0.0
        }
    }
}

/// The outcome in engine time. Points in time are divided by the time scale; a request's TTFT
/// and end-to-end latency are split into the HTTP path's `path_s` wall seconds, which run at
/// real speed and are kept as they are, and the rest, which the engines stretched by the time
/// scale and is divided by it. (`path_s` = 0: everything divided.)
pub fn to_engine_time(outcome: &BenchOutcome, scale: f64, path_s: f64) -> BenchOutcome {
    let span = |d: f64| d.min(path_s) + (d - path_s).max(0.0) / scale;
    let records = outcome
        .records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            let sent = r.sent_s;
            r.due_s /= scale;
            r.sent_s /= scale;
            r.first_content_s = r.first_content_s.map(|t| r.sent_s + span(t - sent));
            r.finished_s = r.sent_s + span(r.finished_s - sent);
            r
        })
        .collect();
    BenchOutcome::from_records(
        outcome.target.clone(),
        outcome.endpoint.clone(),
        outcome.mode,
        outcome.planned,
        records,
        outcome.wall_s / scale,
    )
}

/// Sum (seconds) and count of `vllm:time_to_first_token_seconds` in a Prometheus text page.
pub fn ttft_sum_count(text: &str) -> (f64, u64) {
    let value = |name: &str| prom::value(text, name, &[]).unwrap_or(0.0);
    (
        value("vllm:time_to_first_token_seconds_sum"),
        value("vllm:time_to_first_token_seconds_count") as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_engines_ttft_sum_and_count() {
        let text = "# TYPE vllm:time_to_first_token_seconds histogram\n\
            vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 3\n\
            vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.75\n\
            vllm:time_to_first_token_seconds_count{model_name=\"m\"} 3\n";
        assert_eq!(ttft_sum_count(text), (0.75, 3));
        assert_eq!(ttft_sum_count(""), (0.0, 0));
    }
}
