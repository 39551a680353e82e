//! `bench`'s report: a load-generator run against an OpenAI-compatible URL as `simulate`'s
//! report (the same table, JSON schema and plot), plus what only a real run has (errors by
//! kind, send rate and lag). The demo reads its runs through [`strategy_result`] too.

use std::collections::BTreeMap;

use prefix_router_loadgen::{BenchConfig, BenchOutcome, FailureKind, LatencyStats, LoadMode};
use prefix_router_sim::stats::hit_rate_series;
use prefix_router_sim::{
    table, Driver, FleetSummary, LatencySummary, Report, StrategyResult, WorkloadSource,
    WorkloadSummary,
};
use prefix_router_workload::{trace, Request};

use crate::ReplayError;

/// Block size of the oracle hit rate (vLLM's default, as in `simulate`).
const ORACLE_BLOCK_TOKENS: u32 = 16;

/// Buckets of the hit-rate-over-time series (as `simulate`).
pub const HIT_RATE_BUCKETS: usize = 50;

/// Failed requests whose details are printed.
const SHOWN_FAILURES: usize = 3;

/// The `bench` JSON: `simulate`'s report shape with the target in place of the fleet.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    /// What was replayed.
    pub workload: WorkloadSummary,
    /// What it was replayed against.
    pub fleet: TargetSummary,
    /// Hit rate of one infinite cache seeing every sent request in order (16-token blocks).
    pub oracle_hit_rate: f64,
    /// One entry per run (one for `bench`).
    pub results: Vec<BenchResult>,
}

/// The target as the report describes it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TargetSummary {
    /// Base URL as given.
    pub target: String,
    /// Endpoint the requests went to.
    pub endpoint: String,
    /// Distinct `x-prefix-router-instance` values seen (0 when the target sends none).
    pub instances: u32,
    /// Those values, sorted.
    pub instance_ids: Vec<String>,
    /// The `--model` override, if any.
    pub model: Option<String>,
    /// Per-request timeout, seconds.
    pub timeout_s: f64,
}

/// One run's result: `simulate`'s fields plus what only a real run has.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    /// The fields `simulate` reports.
    #[serde(flatten)]
    pub result: StrategyResult,
    /// Failed requests by kind (every kind listed).
    pub errors: BTreeMap<String, u64>,
    /// Requests sent.
    pub sent: u64,
    /// Requests failed.
    pub failed: u64,
    /// Mean rate of the actual sends, requests per second.
    pub send_rate_rps: Option<f64>,
    /// Mean rate the schedule asked for (open loop), requests per second.
    pub scheduled_rate_rps: Option<f64>,
    /// How late sends were against the open-loop schedule, milliseconds.
    pub send_lag_ms: LatencyStats,
    /// Completed requests whose usage reported `cached_tokens`.
    pub cached_tokens_reported: u64,
    /// From the start to the last answer, seconds.
    pub wall_s: f64,
}

fn summary(s: LatencyStats) -> LatencySummary {
    LatencySummary {
        p50: s.p50,
        p90: s.p90,
        p99: s.p99,
        mean: s.mean,
    }
}

/// `simulate`'s per-strategy result for a bench outcome, named `label`. `fleet` names the
/// instances known to be behind the target (the demo started them): one that served nothing
/// counts with a share of 0, as in `simulate`, so the table's smallest share reads 0.0% where a
/// strategy left instances idle. `bench` only knows the instances that answered, and passes none.
pub fn strategy_result(outcome: &BenchOutcome, label: &str, fleet: &[String]) -> StrategyResult {
    let mut per_instance = outcome.instance_requests();
    for id in fleet {
        per_instance.entry(id.clone()).or_insert(0);
    }
    let with_instance: u64 = per_instance.values().sum();
    let instance_share = per_instance
        .values()
        .map(|&n| n as f64 / with_instance.max(1) as f64)
        .collect();
    let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let samples: Vec<(f64, u32, u32)> = outcome
        .records
        .iter()
        .filter(|r| r.is_ok())
        .filter_map(|r| {
            let usage = r.usage?;
            let prompt = usage.prompt_tokens?;
            let at = r.first_content_s.unwrap_or(r.finished_s);
            Some((at, clamp(usage.cached_tokens.unwrap_or(0)), clamp(prompt)))
        })
        .collect();
    let horizon = samples.iter().map(|s| s.0).fold(0.0, f64::max);
    StrategyResult {
        strategy: label.to_string(),
        requests: outcome.completed(),
        ttft_ms: summary(outcome.ttft_ms()),
        e2e_ms: summary(outcome.e2e_ms()),
        kv_hit_rate: outcome.hit_rate(),
        throughput_rps: outcome.throughput_rps(),
        output_tokens_per_s: outcome.output_tokens_per_s(),
        instance_share,
        overflow_rate: outcome.overflow_rate(),
        instance_ids: per_instance.keys().cloned().collect(),
        instance_requests: per_instance.values().copied().collect(),
        decisions: outcome.decisions(),
        prompt_tokens: outcome.prompt_tokens(),
        cached_tokens: outcome.cached_tokens(),
        output_tokens: outcome.output_tokens(),
        makespan_s: outcome.makespan_s(),
        ttft_percentiles_ms: outcome.ttft_percentiles_ms(),
        hit_rate_over_time: hit_rate_series(samples.into_iter(), horizon, HIT_RATE_BUCKETS),
        strategy_stats: None,
        affinity: None,
        after_scale: Vec::new(),
        placement: None,
    }
}

/// The bench result: `simulate`'s fields plus errors and send figures.
pub fn bench_result(outcome: &BenchOutcome, label: &str) -> BenchResult {
    let failures = outcome.failures();
    let errors = FailureKind::ALL
        .iter()
        .map(|k| (k.label().to_string(), failures.get(k).copied().unwrap_or(0)))
        .collect();
    BenchResult {
        result: strategy_result(outcome, label, &[]),
        errors,
        sent: outcome.sent(),
        failed: failures.values().sum(),
        send_rate_rps: outcome.send_rate_rps(),
        scheduled_rate_rps: match outcome.mode {
            LoadMode::OpenLoop { .. } => outcome.scheduled_rate_rps(),
            LoadMode::ClosedLoop { .. } => None,
        },
        send_lag_ms: outcome.send_lag_ms(),
        cached_tokens_reported: outcome.cached_tokens_reported(),
        wall_s: outcome.wall_s,
    }
}

/// The whole report for one outcome. `requests` is the workload as loaded; the sent ones (its
/// first `sent`, since both drivers send in order) are what the summary describes.
pub fn bench_report(
    name: &str,
    source: WorkloadSource,
    requests: &[Request],
    outcome: &BenchOutcome,
    label: &str,
    config: &BenchConfig,
) -> BenchReport {
    let sent = &requests[..requests
        .len()
        .min(usize::try_from(outcome.sent()).unwrap_or(usize::MAX))];
    let n = sent.len().max(1) as f64;
    let driver = match outcome.mode {
        LoadMode::OpenLoop { .. } => Driver::OpenLoop,
        LoadMode::ClosedLoop { concurrency } => Driver::ClosedLoop {
            clients: concurrency,
        },
    };
    let due = outcome.records.iter().map(|r| r.due_s);
    let arrival_span_s = match outcome.mode {
        LoadMode::OpenLoop { .. } => due.fold(0.0, f64::max),
        LoadMode::ClosedLoop { .. } => 0.0,
    };
    let result = bench_result(outcome, label);
    BenchReport {
        workload: WorkloadSummary {
            name: name.to_string(),
            source,
            requests: sent.len() as u64,
            driver,
            mean_prompt_tokens: sent
                .iter()
                .map(|r| f64::from(r.prompt_tokens()))
                .sum::<f64>()
                / n,
            mean_output_tokens: sent.iter().map(|r| f64::from(r.output_tokens)).sum::<f64>() / n,
            arrival_span_s,
        },
        fleet: TargetSummary {
            target: outcome.target.clone(),
            endpoint: outcome.endpoint.clone(),
            instances: u32::try_from(result.result.instance_ids.len()).unwrap_or(u32::MAX),
            instance_ids: result.result.instance_ids.clone(),
            model: config.model.clone(),
            timeout_s: config.timeout.as_secs_f64(),
        },
        oracle_hit_rate: trace::oracle_hit_rate(sent, ORACLE_BLOCK_TOKENS),
        results: vec![result],
    }
}

/// The simulator's report for the table and plot renderers. Their fleet line describes engine
/// presets, which a remote target does not have: the preset's fields are placeholders here and
/// [`render_table`] replaces that line.
pub fn sim_report(report: &BenchReport) -> Result<Report, ReplayError> {
    let preset = prefix_router_engine_model::PRESETS
        .first()
        .ok_or(ReplayError::NoPreset)?;
    Ok(Report {
        workload: report.workload.clone(),
        fleet: FleetSummary {
            instances: report.fleet.instances,
            preset: report.fleet.target.clone(),
            engine: (preset.config)(),
            prefix_length: 0,
            seed: 0,
            scale_events: Vec::new(),
            strategies: Vec::new(),
            routers: Default::default(),
        },
        oracle_hit_rate: report.oracle_hit_rate,
        ttft_floor_ms: None,
        results: report.results.iter().map(|r| r.result.clone()).collect(),
    })
}

/// `simulate`'s table with the fleet line describing the target.
pub fn render_table(report: &BenchReport) -> Result<String, ReplayError> {
    let text = table::render(&sim_report(report)?);
    let f = &report.fleet;
    let instances = match f.instances {
        0 => "no x-prefix-router-instance header seen".to_string(),
        1 => "1 instance seen".to_string(),
        n => format!("{n} instances seen"),
    };
    let target = format!("Target:   {} ({instances})", f.endpoint);
    Ok(text
        .lines()
        .map(|l| {
            if l.starts_with("Fleet:") {
                target.as_str()
            } else {
                l
            }
        })
        .fold(String::new(), |mut out, l| {
            out.push_str(l);
            out.push('\n');
            out
        }))
}

/// What only a real run has: sends, errors, a warning when no hit rate could be read.
pub fn render_extras(report: &BenchReport, outcome: &BenchOutcome) -> String {
    let mut out = String::new();
    if let Some(m) = &outcome.model_from_target {
        out.push_str(&format!(
            "model: {m} (the first the target lists at /v1/models; --model NAME to choose)\n"
        ));
    }
    for r in &report.results {
        let mut line = format!(
            "{}: sent {}, completed {}, failed {}, wall {:.1} s",
            r.result.strategy, r.sent, r.result.requests, r.failed, r.wall_s
        );
        if let (Some(sent), Some(due)) = (r.send_rate_rps, r.scheduled_rate_rps) {
            line.push_str(&format!(
                "; send rate {sent:.2}/s (scheduled {due:.2}/s), send lag p99 {:.1} ms",
                r.send_lag_ms.p99
            ));
        }
        out.push_str(&line);
        out.push('\n');
        let errors: Vec<String> = r
            .errors
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        if !errors.is_empty() {
            out.push_str(&format!("errors: {}\n", errors.join(", ")));
        }
        if r.failed > 0 && r.result.requests > 0 {
            out.push_str(&format!(
                "note: the latencies above are of the {} completed requests only; the {} failed ones are not in them{}\n",
                r.result.requests,
                r.failed,
                match r.errors.get(FailureKind::Timeout.label()).copied().unwrap_or(0) {
                    0 => String::new(),
                    n => format!(" ({n} timed out, each after at least {:.1} s)", report.fleet.timeout_s),
                }
            ));
        }
        if r.result.requests > 0 && r.cached_tokens_reported == 0 {
            out.push_str(
                "note: the target reported no usage.prompt_tokens_details.cached_tokens; the hit rate reads 0\n",
            );
        }
    }
    let whole = outcome.asked_whole();
    if whole > 0 {
        out.push_str(&format!(
            "note: {whole} of the completed requests were sent with \"stream\": false (--unstreamed): their TTFT is the time to the whole answer\n"
        ));
    }
    let unstreamed = outcome.unstreamed();
    if unstreamed > 0 {
        out.push_str(&format!(
            "note: the target answered {unstreamed} of the completed requests whole, not streamed (it ignored \"stream\": true): their TTFT is the time to the whole answer\n"
        ));
    }
    for f in outcome
        .records
        .iter()
        .filter_map(|r| r.failure.as_ref().map(|f| (r.id, f)))
        .take(SHOWN_FAILURES)
    {
        out.push_str(&format!("request {}: {}: {}\n", f.0, f.1.kind, f.1.detail));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_loadgen::{Failure, RequestRecord, Usage};
    use prefix_router_workload::{generators, WorkloadKind, WorkloadSpec};

    fn record(index: usize, instance: &str, decision: &str, cached: u64) -> RequestRecord {
        RequestRecord {
            index,
            id: index as u64,
            due_s: index as f64 * 0.1,
            sent_s: index as f64 * 0.1 + 0.001,
            first_content_s: Some(index as f64 * 0.1 + 0.051),
            finished_s: index as f64 * 0.1 + 0.201,
            status: Some(200),
            usage: Some(Usage {
                prompt_tokens: Some(100),
                completion_tokens: Some(10),
                cached_tokens: Some(cached),
            }),
            content_chunks: 10,
            streamed: true,
            asked_whole: false,
            instance: Some(instance.into()),
            decision: Some(decision.into()),
            failure: None,
        }
    }

    fn outcome() -> BenchOutcome {
        let mut records = vec![
            record(0, "a", "preferred", 0),
            record(1, "a", "cache_hit", 50),
            record(2, "b", "overflow", 50),
            // cache-aware's overflows count as the server and the simulator count them.
            record(3, "a", "hot_replica", 100),
        ];
        let mut failed = record(4, "b", "preferred", 0);
        failed.failure = Some(Failure {
            kind: FailureKind::Http5xx,
            detail: "HTTP 500".into(),
        });
        records.push(failed);
        BenchOutcome::from_records(
            "http://127.0.0.1:9".into(),
            "http://127.0.0.1:9/v1/chat/completions".into(),
            LoadMode::OpenLoop { rate: None },
            5,
            records,
            0.7,
        )
    }

    fn report() -> BenchReport {
        let spec = WorkloadSpec::default_for(WorkloadKind::Rag);
        let requests: Vec<Request> = generators::generate(&spec).take(5).collect();
        let config = BenchConfig::new("http://127.0.0.1:9", LoadMode::OpenLoop { rate: None });
        bench_report(
            "rag",
            WorkloadSource::Generated { spec },
            &requests,
            &outcome(),
            "router",
            &config,
        )
    }

    #[test]
    fn json_has_the_simulate_fields_plus_errors() {
        let json = serde_json::to_value(report()).unwrap_or_default();
        for key in ["workload", "fleet", "oracle_hit_rate", "results"] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        let r = &json["results"][0];
        for key in [
            "strategy",
            "requests",
            "ttft_ms",
            "e2e_ms",
            "kv_hit_rate",
            "throughput_rps",
            "output_tokens_per_s",
            "instance_share",
            "overflow_rate",
            "errors",
        ] {
            assert!(r.get(key).is_some(), "missing results[0].{key}");
        }
        for key in ["p50", "p90", "p99", "mean"] {
            assert!(r["ttft_ms"][key].is_f64(), "ttft_ms.{key}");
            assert!(r["e2e_ms"][key].is_f64(), "e2e_ms.{key}");
        }
        assert_eq!(r["strategy"], "router");
        assert_eq!(r["requests"], 4);
        assert_eq!(r["kv_hit_rate"], 0.5);
        assert_eq!(r["overflow_rate"], 0.5);
        assert_eq!(r["instance_share"], serde_json::json!([0.75, 0.25]));
        assert_eq!(r["errors"]["http-5xx"], 1);
        assert_eq!(r["errors"]["connect"], 0);
        assert_eq!(r["sent"], 5);
        assert_eq!(json["fleet"]["instances"], 2);
        assert_eq!(json["workload"]["requests"], 5);
        assert_eq!(json["workload"]["driver"]["mode"], "open-loop");
        let ttft = r["ttft_ms"]["p50"].as_f64().unwrap_or(0.0);
        assert!((ttft - 50.0).abs() < 0.1, "{ttft}");
    }

    #[test]
    fn instances_known_to_the_caller_that_served_nothing_count_with_a_share_of_0() {
        let fleet = ["a".to_string(), "b".to_string(), "c".to_string()];
        let r = strategy_result(&outcome(), "router", &fleet);
        assert_eq!(r.instance_ids, vec!["a", "b", "c"]);
        assert_eq!(r.instance_requests, vec![3, 1, 0]);
        assert_eq!(r.instance_share, vec![0.75, 0.25, 0.0]);
        // Without a fleet, only the instances that answered.
        let seen = strategy_result(&outcome(), "router", &[]);
        assert_eq!(seen.instance_ids, vec!["a", "b"]);
    }

    #[test]
    fn a_strategy_that_completed_nothing_has_no_latency_and_no_gain() {
        let mut report = report();
        report.results[0].result.strategy = "random".into();
        let failed: Vec<RequestRecord> = (0..3)
            .map(|i| {
                let mut r = record(i, "a", "preferred", 0);
                r.failure = Some(Failure {
                    kind: FailureKind::Timeout,
                    detail: "no complete answer".into(),
                });
                r
            })
            .collect();
        let none = BenchOutcome::from_records(
            "t".into(),
            "e".into(),
            LoadMode::OpenLoop { rate: None },
            3,
            failed,
            1.0,
        );
        report.results.push(bench_result(&none, "cache-aware"));
        let text = render_table(&report).unwrap_or_default();
        assert!(!text.contains("-100.0%"), "{text}");
        assert!(
            text.contains("cache-aware vs random: not compared, cache-aware completed no request"),
            "{text}"
        );
        let row = text
            .lines()
            .find(|l| l.starts_with("cache-aware "))
            .unwrap_or_default();
        assert!(!row.contains("0.0 ") && row.contains(" - "), "{row}");
        // And where some failed, the extras say the latencies leave them out.
        let extras = render_extras(&report, &outcome());
        assert!(
            extras.contains("latencies above are of the 4 completed requests only; the 1 failed"),
            "{extras}"
        );
    }

    #[test]
    fn table_names_the_target() {
        let text = render_table(&report()).unwrap_or_default();
        assert!(
            text.contains("Target:   http://127.0.0.1:9/v1/chat/completions (2 instances seen)")
        );
        assert!(!text.contains("Fleet:"));
        assert!(text.contains("router"));
        let extras = render_extras(&report(), &outcome());
        assert!(extras.contains("errors: http-5xx 1"), "{extras}");
        assert!(extras.contains("request 4: http-5xx: HTTP 500"), "{extras}");
        assert!(!extras.contains("not streamed"), "{extras}");
        let mut whole = outcome();
        whole.records[1].streamed = false;
        let extras = render_extras(&report(), &whole);
        assert!(
            extras.contains("answered 1 of the completed requests whole, not streamed"),
            "{extras}"
        );
    }
}
