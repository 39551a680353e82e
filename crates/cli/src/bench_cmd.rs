//! `prefix-router bench`: replays a workload over HTTP against an OpenAI-compatible URL with the
//! load generator, then prints the same table and writes the same JSON schema and plot as
//! `simulate`, plus what only a real run has (errors by kind, send rate and lag).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use prefix_router_loadgen::{run_with_progress, BenchConfig, LoadMode, Progress};
use prefix_router_replay::bench::{bench_report, render_extras, render_table, sim_report};
use prefix_router_sim::{plot, SimWorkload, WorkloadSource};
use prefix_router_workload::Arrival;

use crate::workload_flags::{self, GeneratedFlags};

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
    #[arg(long, value_name = "R", conflicts_with = "concurrency", value_parser = crate::args::parse_positive)]
    pub rate: Option<f64>,

    /// Closed loop: C workers, each sending its next request when the previous one ends.
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Option<u32>,

    /// Stop sending new requests after S seconds (in-flight ones still finish or time out).
    #[arg(long, value_name = "S", conflicts_with = "requests", value_parser = crate::args::parse_seconds)]
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

    /// Send this share of the requests (0 to 1, spread evenly) with `stream: false`, as batch
    /// or evaluation traffic is; their TTFT is then the whole answer's time.
    #[arg(long, value_name = "SHARE", default_value_t = 0.0)]
    pub unstreamed: f64,

    /// Replace every request's `model` with NAME.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,

    /// Name of this run in the table and JSON (default: the target URL).
    #[arg(long, value_name = "NAME")]
    pub label: Option<String>,

    /// Per-request limit in seconds, from the send to the last byte; also bounds the wait for
    /// requests in flight when --duration ends.
    #[arg(long, value_name = "S", default_value_t = 300.0, value_parser = crate::args::parse_seconds)]
    pub timeout: f64,

    /// Write the report as JSON to FILE (the `simulate` schema plus errors and send figures).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write an SVG with the TTFT CDF, the per-instance share and the hit rate over time.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    crate::report_file::check_folders(&[
        ("--json", args.json.as_deref()),
        ("--plot", args.plot.as_deref()),
    ])?;
    let SimWorkload {
        name,
        source,
        requests,
    } = load_workload(&args)?;
    let mode = load_mode(&args, &source);
    let config = BenchConfig {
        target: args.target.clone(),
        mode,
        duration: args.duration.map(Duration::from_secs_f64),
        max_requests: args.requests,
        timeout: Duration::from_secs_f64(args.timeout),
        model: args.model.clone(),
        wait_for_target: prefix_router_loadgen::config::DEFAULT_WAIT_FOR_TARGET,
        unstreamed: args.unstreamed,
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
/// `--concurrency` set on a generator's arrivals; a trace's `--rate` is the load mode's).
fn load_workload(args: &BenchArgs) -> Result<SimWorkload> {
    match &args.trace {
        Some(path) => workload_flags::trace(path, args.requests),
        None => workload_flags::generated(&GeneratedFlags {
            name: args
                .workload
                .as_deref()
                .unwrap_or(workload_flags::DEFAULT_WORKLOAD),
            seed: args.seed,
            requests: args.requests,
            rate: args.rate,
            concurrency: args.concurrency,
            groups: args.groups,
            params: &args.params,
        }),
    }
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
            self.bar = Some(crate::progress::bar(len));
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
            None => crate::note!("{}", first_plain_line(p, &self.target)),
            Some(last) if p.elapsed_s - last >= PLAIN_EVERY_S => crate::note!("{}", plain_line(p)),
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
        let w = load_workload(&a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load_mode(&a, &w.source), LoadMode::OpenLoop { rate: None });
        let Ok(a) = args(&["--concurrency", "3", "--requests", "4"]) else {
            panic!("parse")
        };
        let w = load_workload(&a).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((w.name.as_str(), w.requests.len()), ("long-context", 4));
        assert_eq!(
            load_mode(&a, &w.source),
            LoadMode::ClosedLoop { concurrency: 3 }
        );
        assert!(args(&["--rate", "1", "--concurrency", "2"]).is_err());
        assert!(args(&["--duration", "1", "--requests", "2"]).is_err());
        assert!(args(&["--timeout", "0"]).is_err());
    }
}
