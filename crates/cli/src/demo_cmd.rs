//! `prefix-router demo`: the whole story over real HTTP on one machine. The flags, the
//! progress bars and the printing; the run itself (mock engines and routers on 127.0.0.1, one
//! fleet per strategy, the replay, the conversion to engine time and the report) is
//! [`prefix_router_replay::demo`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_replay::demo::{self, fmt_speed, render, Demo, DemoConfig};
use prefix_router_replay::ReplayError;
use prefix_router_sim::{plot, SimWorkload};

use crate::args::DEFAULT_PREFIX_LENGTH;
use crate::progress::DelayedBar;
use crate::workload_flags::{self, GeneratedFlags};

/// Default wall seconds per engine second. See the `--time-scale` help for the choice.
pub const DEFAULT_TIME_SCALE: f64 = 0.08;

/// Default SVG written next to where the demo runs.
pub const DEFAULT_PLOT: &str = "prefix-router-demo.svg";

/// Flags of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Mock engines behind the router (started fresh, with empty caches, for every strategy).
    #[arg(long, value_name = "N", default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub instances: u32,

    /// Strategies to run, one after another, each on its own fresh fleet. The default pair is
    /// what fits the two-minute budget on two cores with the full published workload; every
    /// further strategy adds about as much again.
    #[arg(
        long,
        value_name = "a,b,...",
        value_delimiter = ',',
        default_value = "random,prefix-aware",
        value_parser = crate::args::parse_strategy
    )]
    pub strategies: Vec<StrategyKind>,

    /// A strategy's own parameter, `NAME=VALUE` (repeatable; see the list below).
    #[arg(long = "strategy-param", value_name = "NAME=VALUE")]
    pub strategy_params: Vec<String>,

    /// Built-in workload (see `prefix-router presets`).
    #[arg(long, value_name = "NAME", default_value = "long-context")]
    pub workload: String,

    /// Number of requests (default: the workload's own, 5,400 for long-context: 600 documents
    /// × 9 requests, the published experiment's regime).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,

    /// Closed loop with C concurrent clients (default: the workload's own, 32 for
    /// long-context).
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub concurrency: Option<u32>,

    /// Generated workload parameter, e.g. `--param documents=100` (repeatable; as `simulate`).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,

    /// Engine preset of every mock engine (see `prefix-router presets`).
    #[arg(long, value_name = "P", default_value = crate::args::DEFAULT_PRESET)]
    pub preset: String,

    /// Wall seconds per engine second. The default 0.08 replays the full long-context workload
    /// (about 1,000 engine seconds for random plus prefix-aware) in about 80 s. Faster scales
    /// shrink the engines' times but not the HTTP path's own cost (about 1-2.5 ms of wall
    /// time per request on two cores), which then weighs 1/X times more in engine
    /// milliseconds; the demo prints that overhead after the table.
    #[arg(long, value_name = "X", default_value_t = DEFAULT_TIME_SCALE, value_parser = parse_time_scale)]
    pub time_scale: f64,

    /// Stop sending new requests after S engine seconds per strategy (S × time scale of wall
    /// time); requests in flight still finish.
    #[arg(long, value_name = "S", value_parser = crate::args::parse_seconds)]
    pub duration: Option<f64>,

    /// Seed of the workload generator (the router's own random choices are not seeded).
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,

    /// Write the report as JSON to FILE (`simulate`'s schema, in engine time, plus the demo's
    /// own figures).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Router replicas in front of the engines, each with the same configuration; the
    /// workload's requests are dealt among them in turn and each closed-loop client talks to
    /// one (the load a fleet behind several replicas sees). Each learns on its own.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub replicas: u32,

    /// Every router scrapes the engines' queues (`[engine_metrics] scrape` with
    /// `route_on_queues`, every 50 wall ms, trusted for 200) and counts other replicas'
    /// requests in its load; without it each replica sees only its own traffic.
    #[arg(long)]
    pub engine_queues: bool,

    /// Every mock engine publishes its KV-cache events (ZeroMQ on 127.0.0.1, with replay) and
    /// every router subscribes, tokenizing requests as the engines do (`builtin:words`): what
    /// `kv-aware` routes on.
    #[arg(long)]
    pub kv_events: bool,

    /// Share (0..1) of KV-event batches each engine drops (still replayable), with
    /// `--kv-events`: the router must notice the gaps and recover.
    #[arg(long, value_name = "F", default_value_t = 0.0, requires = "kv_events", value_parser = crate::args::parse_share)]
    pub kv_events_drop: f64,

    /// Where the SVG with the TTFT CDFs, per-instance shares and hit rate over time goes.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_PLOT)]
    pub plot: PathBuf,
}

fn parse_time_scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!(
            "time_scale must be a number within (0, 100] (wall seconds per engine second), got '{s}'"
        )),
    }
}

/// Runs `demo`.
pub fn run(mut args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    crate::report_file::check_folders(&[
        ("--json", args.json.as_deref()),
        ("--plot", Some(args.plot.as_path())),
    ])?;
    let workload = load_workload(&args)?;
    let mut strategies: Vec<StrategyConfig> = args
        .strategies
        .iter()
        .map(|&k| StrategyConfig::new(k))
        .collect();
    crate::args::apply_strategy_params(&mut strategies, &args.strategy_params)?;
    if demo::reads_tokens(&strategies)? && !args.kv_events {
        crate::note!("demo: kv-aware routes on the engines' KV events: turning on --kv-events");
        args.kv_events = true;
    }
    let demo = Demo::new(DemoConfig {
        instances: args.instances,
        strategies,
        workload,
        preset: args.preset.clone(),
        time_scale: args.time_scale,
        duration_s: args.duration,
        seed: args.seed,
        replicas: args.replicas,
        engine_queues: args.engine_queues,
        kv_events: args.kv_events,
        kv_events_drop: args.kv_events_drop,
        prefix_length: PrefixLength::new(u64::from(DEFAULT_PREFIX_LENGTH))?,
    })
    .map_err(|e| match e {
        // The flag that names it, as every other setting's error does.
        ReplayError::Preset(e) => anyhow::anyhow!("--preset: {e}"),
        e => e.into(),
    })?;
    let simulated = demo.simulate()?;
    let config = demo.config();
    crate::note!(
        "demo: {} requests of {} per strategy through {} mock engines ({}) and {}, engines at {}x real time ({} wall s per engine s)",
        config.workload.requests.len(),
        config.workload.name,
        args.instances,
        args.preset,
        match args.replicas {
            1 => "one router".to_string(),
            n => format!("{n} router replicas"),
        },
        fmt_speed(args.time_scale),
        args.time_scale
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let n = config.strategies.len();
    let mut runs = Vec::with_capacity(n);
    for (i, strategy) in config.strategies.iter().enumerate() {
        let name = strategy.kind.name();
        let label = format!("{name} ({}/{n})", i + 1);
        let bar = Arc::new(Mutex::new(DelayedBar::new()));
        let updates = Arc::clone(&bar);
        let message = label.clone();
        let run = runtime.block_on(demo.run_strategy(i, move |p| {
            updates
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .update_raw(p.completed + p.failed, p.planned, &message)
        }));
        bar.lock().unwrap_or_else(|e| e.into_inner()).finish();
        let run = run.with_context(|| format!("demo with {name}"))?;
        crate::note!(
            "demo: {label}: {} completed, {} failed in {:.1} s wall ({:.0} engine s)",
            run.result.requests,
            run.summary.failed,
            run.summary.wall_s,
            run.summary.wall_s / args.time_scale
        );
        runs.push(run);
    }
    drop(runtime);

    // A --duration that stopped the runs early: simulate what each one sent.
    let simulated = match demo.simulate_sent(&runs)? {
        Some(cut) => {
            let sent: Vec<String> = runs.iter().map(|r| r.sent.len().to_string()).collect();
            crate::note!(
                "demo: --duration stopped the runs after {} of {} requests; simulate is run on the requests each sent",
                sent.join(", "),
                config.workload.requests.len()
            );
            cut
        }
        None => simulated,
    };
    let report = demo.report(&simulated, &runs);
    crate::out::print(&render(&report))?;
    plot::write_svg(&report.report, &args.plot)
        .with_context(|| format!("--plot {}", args.plot.display()))?;
    crate::out::print(&format!(
        "TTFT CDFs, instance shares and hit rate over time: {}\n",
        args.plot.display()
    ))?;
    if let Some(path) = &args.json {
        crate::report_file::write_json(path, &report)?;
    }
    crate::note!("demo: finished in {:.1} s", started.elapsed().as_secs_f64());
    let failed = demo::failures(&runs);
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// Generates the named workload with the flags applied (as `simulate` does).
fn load_workload(args: &DemoArgs) -> Result<SimWorkload> {
    workload_flags::generated(&GeneratedFlags {
        name: &args.workload,
        seed: args.seed,
        requests: args.requests,
        rate: None,
        concurrency: args.concurrency,
        groups: None,
        params: &args.params,
    })
}
