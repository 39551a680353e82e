//! `prefix-router bench`: replays a workload over HTTP against an OpenAI-compatible URL with the
//! load generator, then prints the same table and writes the same JSON schema and plot as
//! `simulate`, plus what only a real run has (errors by kind, send rate and lag).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prefix_router_loadgen::{
    run_with_progress, BenchConfig, BenchOutcome, FailureKind, LatencyStats, LoadMode, Progress,
};
use prefix_router_sim::stats::hit_rate_series;
use prefix_router_sim::{
    plot, table, Driver, FleetSummary, LatencySummary, Report, StrategyResult, WorkloadSource,
    WorkloadSummary,
};
use prefix_router_workload::{trace, Arrival, Request};

use crate::workload_flags::{self, GeneratedFlags};

/// Workload used when neither `--workload` nor `--trace` is given.
const DEFAULT_WORKLOAD: &str = "long-context";

/// Block size of the oracle hit rate (vLLM's default, as in `simulate`).
const ORACLE_BLOCK_TOKENS: u32 = 16;

/// Buckets of the hit-rate-over-time series.
const HIT_RATE_BUCKETS: usize = 50;

/// Failed requests whose details are printed.
const SHOWN_FAILURES: usize = 3;

/// Flags of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Base URL of an OpenAI-compatible server (our router, an engine, another router);
    /// requests go to {URL}/v1/chat/completions. http only.
    #[arg(long, value_name = "URL")]
    pub target: String,

    /// Built-in workload to generate (see `prefix-router presets`); long-context when neither
    /// --workload nor --trace is given.
    #[arg(long, value_name = "NAME", conflicts_with = "trace")]
    pub workload: Option<String>,

    /// Replay a trace file instead: our JSONL, Mooncake's, ShareGPT, or serve's --access-log.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,

    /// Open loop: send at R requests per second on average (generators: Poisson arrivals;
    /// traces: timestamps rescaled to that mean), whatever the target's speed.
    #[arg(long, value_name = "R", conflicts_with = "concurrency", value_parser = parse_positive)]
    pub rate: Option<f64>,

    /// Closed loop: C workers, each sending its next request when the previous one ends.
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Option<u32>,

    /// Stop sending new requests after S seconds (in-flight ones still finish or time out).
    #[arg(long, value_name = "S", conflicts_with = "requests", value_parser = parse_positive)]
    pub duration: Option<f64>,

    /// Number of requests (generators: how many to make; traces: the first N).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,

    /// Seed of the workload generator.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,

    /// Generated workloads: set one parameter, e.g. `--param documents=10` (repeatable; the
    /// names are those of `simulate`'s JSON `workload.params`).
    #[arg(long = "param", value_name = "KEY=VALUE", conflicts_with = "trace")]
    pub params: Vec<String>,

    /// Generated workloads: spread documents/conversations over G tenants, each with its own
    /// `prompt_cache_key` (as `simulate --groups`).
    #[arg(long, value_name = "G", conflicts_with = "trace", value_parser = clap::value_parser!(u32).range(1..))]
    pub groups: Option<u32>,

    /// Replace every request's `model` with NAME.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,

    /// Name of this run in the table and JSON (default: the target URL).
    #[arg(long, value_name = "NAME")]
    pub label: Option<String>,

    /// Per-request limit in seconds, from the send to the last byte; also bounds the wait for
    /// requests in flight when --duration ends.
    #[arg(long, value_name = "S", default_value_t = 300.0, value_parser = parse_positive)]
    pub timeout: f64,

    /// Write the report as JSON to FILE (the `simulate` schema plus errors and send figures).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write an SVG with the TTFT CDF, the per-instance share and the hit rate over time.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

fn parse_positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("must be a positive number, got '{s}'")),
    }
}

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

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    let (name, source, requests) = load_workload(&args)?;
    let mode = load_mode(&args, &source);
    let config = BenchConfig {
        target: args.target.clone(),
        mode,
        duration: args.duration.map(Duration::from_secs_f64),
        max_requests: args.requests,
        timeout: Duration::from_secs_f64(args.timeout),
        model: args.model.clone(),

        wait_for_target: prefix_router_loadgen::config::DEFAULT_WAIT_FOR_TARGET,
    };
    config.validate().context("bench")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut bar = Bar::new(&args.target);
    let outcome = runtime.block_on(run_with_progress(&config, requests.clone(), |p| {
        bar.update(p)
    }));
    bar.finish();
    let outcome = outcome.context("bench")?;

    let label = args.label.clone().unwrap_or_else(|| args.target.clone());
    let report = bench_report(&name, source, &requests, &outcome, &label, &config);
    crate::out::print(&render_table(&report)?)?;
    crate::out::print(&render_extras(&report, &outcome))?;
    if let Some(path) = &args.json {
        crate::report_file::write_json(path, &report)?;
    }
    if let Some(path) = &args.plot {
        plot::write_svg(&sim_report(&report)?, path)
            .with_context(|| format!("--plot {}", path.display()))?;
    }
    if outcome.sent() > 0 && outcome.completed() == 0 {
        anyhow::bail!(
            "none of the {} requests sent to {} completed (see the errors above)",
            outcome.sent(),
            outcome.endpoint
        );
    }
    Ok(())
}

/// Generates the named workload or reads the trace (`--requests` applied, `--rate` and
/// `--concurrency` set on a generator's arrivals).
fn load_workload(args: &BenchArgs) -> Result<(String, WorkloadSource, Vec<Request>)> {
    if let Some(path) = &args.trace {
        let (format, mut requests) =
            trace::load_trace_as(path).with_context(|| format!("--trace {}", path.display()))?;
        let format = format.name();
        if let Some(n) = args.requests {
            requests.truncate(usize::try_from(n).unwrap_or(usize::MAX));
        }
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let source = WorkloadSource::Trace {
            path: path.display().to_string(),
            format: format.into(),
        };
        return Ok((name, source, requests));
    }
    let name = args.workload.as_deref().unwrap_or(DEFAULT_WORKLOAD);
    let (spec, requests) = workload_flags::generate(&GeneratedFlags {
        name,
        seed: args.seed,
        requests: args.requests,
        rate: args.rate,
        concurrency: args.concurrency,
        groups: args.groups,
        params: &args.params,
    })?;
    Ok((
        name.to_string(),
        WorkloadSource::Generated { spec },
        requests,
    ))
}

/// Open or closed loop, as `simulate` chooses its driver: `--concurrency` wins, then a
/// generator's own arrival process; a trace is replayed open loop (`--rate` rescales it).
fn load_mode(args: &BenchArgs, source: &WorkloadSource) -> LoadMode {
    match (args.concurrency, source) {
        (Some(concurrency), _) => LoadMode::ClosedLoop { concurrency },
        (None, WorkloadSource::Generated { spec }) => match spec.arrival {
            Arrival::Closed { clients } => LoadMode::ClosedLoop {
                concurrency: clients,
            },
            // The generator already drew Poisson arrivals at the rate asked for.
            Arrival::Poisson { .. } => LoadMode::OpenLoop { rate: None },
        },
        (None, WorkloadSource::Trace { .. }) => LoadMode::OpenLoop { rate: args.rate },
    }
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
fn sim_report(report: &BenchReport) -> Result<Report> {
    let preset = prefix_router_engine_model::PRESETS
        .first()
        .context("no engine preset to render the table with")?;
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
pub fn render_table(report: &BenchReport) -> Result<String> {
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
fn render_extras(report: &BenchReport, outcome: &BenchOutcome) -> String {
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
        if r.result.requests > 0 && r.cached_tokens_reported == 0 {
            out.push_str(
                "note: the target reported no usage.prompt_tokens_details.cached_tokens; the hit rate reads 0\n",
            );
        }
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

/// Progress on stderr: a bar when stderr is a terminal; otherwise (a CI log, a pipe, `nohup`)
/// one plain line at the start and one every [`PLAIN_EVERY_S`] seconds, so a long run is never
/// silent for minutes.
struct Bar {
    bar: Option<ProgressBar>,
    terminal: bool,
    /// `elapsed_s` of the last plain line; `None` before the first.
    last_plain_s: Option<f64>,
    /// Where the requests go, for the first plain line.
    target: String,
}

/// Seconds between two plain progress lines.
const PLAIN_EVERY_S: f64 = 30.0;

impl Bar {
    fn new(target: &str) -> Self {
        Bar {
            bar: None,
            terminal: std::io::stderr().is_terminal(),
            last_plain_s: None,
            target: target.to_string(),
        }
    }

    fn update(&mut self, p: &Progress) {
        if !self.terminal {
            self.plain(p);
            return;
        }
        if self.bar.is_none() {
            // With a duration the run ends on time, not on a count: the bar tracks seconds.
            let len = match p.stop_s {
                Some(stop) => (stop * 10.0).ceil() as u64,
                None => p.planned,
            };
            let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
            let style =
                ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            let pos = match p.stop_s {
                Some(_) => (p.elapsed_s * 10.0) as u64,
                None => p.completed + p.failed,
            };
            bar.set_position(pos.min(bar.length().unwrap_or(u64::MAX)));
            bar.set_message(format!(
                "done {}, in flight {}, failed {}",
                p.completed,
                p.in_flight(),
                p.failed
            ));
        }
    }

    fn plain(&mut self, p: &Progress) {
        match self.last_plain_s {
            None => eprintln!("{}", first_plain_line(p, &self.target)),
            Some(last) if p.elapsed_s - last >= PLAIN_EVERY_S => eprintln!("{}", plain_line(p)),
            Some(_) => return,
        }
        self.last_plain_s = Some(p.elapsed_s);
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// The first plain progress line: what the run will do.
fn first_plain_line(p: &Progress, target: &str) -> String {
    let what = match p.stop_s {
        Some(stop) => format!("sending to {target} for {stop:.0} s"),
        None => format!("sending {} requests to {target}", p.planned),
    };
    format!("bench: {what}; progress every {PLAIN_EVERY_S:.0} s")
}

/// One plain progress line: how far the run is and what ends it.
fn plain_line(p: &Progress) -> String {
    let done = p.completed + p.failed;
    let goal = match p.stop_s {
        Some(stop) => format!("sending until {stop:.0} s"),
        None => format!("{done}/{} requests", p.planned),
    };
    format!(
        "bench: {:.0} s, {goal}: done {}, in flight {}, failed {}",
        p.elapsed_s,
        p.completed,
        p.in_flight(),
        p.failed
    )
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
    fn plain_progress_lines_say_what_the_run_does_and_how_far_it_is() {
        let mut p = Progress {
            planned: 5400,
            sent: 12,
            completed: 9,
            failed: 1,
            elapsed_s: 61.4,
            stop_s: None,
        };
        assert_eq!(
            first_plain_line(&p, "http://127.0.0.1:8000"),
            "bench: sending 5400 requests to http://127.0.0.1:8000; progress every 30 s"
        );
        assert_eq!(
            plain_line(&p),
            "bench: 61 s, 10/5400 requests: done 9, in flight 2, failed 1"
        );
        p.stop_s = Some(120.0);
        assert_eq!(
            first_plain_line(&p, "http://x"),
            "bench: sending to http://x for 120 s; progress every 30 s"
        );
        assert!(plain_line(&p).contains("sending until 120 s"));
    }

    #[test]
    fn without_a_terminal_plain_lines_come_at_the_start_and_then_every_30_s() {
        let mut bar = Bar {
            bar: None,
            terminal: false,
            last_plain_s: None,
            target: "http://x".into(),
        };
        let mut printed = Vec::new();
        for t in [0.0, 10.0, 29.9, 30.0, 45.0, 61.0] {
            let before = bar.last_plain_s;
            bar.update(&Progress {
                planned: 10,
                elapsed_s: t,
                ..Progress::default()
            });
            if bar.last_plain_s != before {
                printed.push(t);
            }
        }
        assert_eq!(printed, vec![0.0, 30.0, 61.0]);
        assert!(bar.bar.is_none());
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
    }

    #[test]
    fn modes_follow_simulate() {
        let args = |extra: &[&str]| {
            use clap::Parser;
            #[derive(Debug, clap::Parser)]
            struct T {
                #[command(flatten)]
                a: BenchArgs,
            }
            let mut v = vec!["t", "--target", "http://127.0.0.1:9"];
            v.extend_from_slice(extra);
            T::try_parse_from(v).map(|t| t.a)
        };
        let Ok(a) = args(&["--workload", "rag", "--rate", "5"]) else {
            panic!("parse")
        };
        let (_, source, _) = load_workload(&a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load_mode(&a, &source), LoadMode::OpenLoop { rate: None });
        let Ok(a) = args(&["--concurrency", "3", "--requests", "4"]) else {
            panic!("parse")
        };
        let (name, source, requests) = load_workload(&a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((name.as_str(), requests.len()), ("long-context", 4));
        assert_eq!(
            load_mode(&a, &source),
            LoadMode::ClosedLoop { concurrency: 3 }
        );
        assert!(args(&["--rate", "1", "--concurrency", "2"]).is_err());
        assert!(args(&["--duration", "1", "--requests", "2"]).is_err());
        assert!(args(&["--timeout", "0"]).is_err());
    }
}
