//! `prefix-router demo`: the whole story over real HTTP on one machine. For each strategy in
//! turn it starts N fresh mock engines and one router (or `--replicas` of them) on 127.0.0.1
//! ephemeral ports, replays the workload through the router(s) with the load generator, stops
//! them, and finally prints
//! `simulate`'s table for the runs (in engine time), `simulate`'s own figures for the same
//! workload and settings, and where the published experiment stands beside them.
//!
//! Engines run `--time-scale` times faster than real (engine seconds × X = wall seconds), so
//! every wall-clock measurement is converted back: durations divided by X, rates multiplied by
//! X. What the HTTP path itself costs (rendering, router, tokenizing, SSE) is not scaled by the
//! engines' clock, so it weighs 1/X times more in engine units; the demo measures it (client
//! TTFT against the engines' own TTFT histogram) and prints it.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_loadgen::{
    affinity, run_split, Affinity, BenchConfig, BenchOutcome, LoadMode, Progress,
};
use prefix_router_mock_engine::{KvEventsConfig, MockEngine, MockEngineConfig};
use prefix_router_server::settings::KvEventsEndpoint;
use prefix_router_server::{prom, upstream, Router, Settings};
use prefix_router_sim::{
    engine_config, plot, simulate, table, Driver, FleetSummary, Report, RouterModel, ScrapeModel,
    SimConfig, SimWorkload, StrategyResult, WorkloadSource,
};
use prefix_router_workload::{Arrival, Request};

use crate::args::DEFAULT_PREFIX_LENGTH;
use crate::bench_cmd::strategy_result;
use crate::workload_flags::{self, GeneratedFlags};

/// Default wall seconds per engine second. See the `--time-scale` help for the choice.
pub const DEFAULT_TIME_SCALE: f64 = 0.08;

/// Default SVG written next to where the demo runs.
pub const DEFAULT_PLOT: &str = "prefix-router-demo.svg";

/// Buckets of the hit-rate-over-time series (as `simulate`).
const HIT_RATE_BUCKETS: usize = 50;

/// How often each router scrapes the engines' queues with `--engine-queues`, and how long a
/// reading is trusted (wall time; 0.6 and 2.5 engine seconds at the default time scale).
const QUEUE_SCRAPE: Duration = Duration::from_millis(50);
const QUEUE_STALE: Duration = Duration::from_millis(200);

/// Per-request limit, wall seconds (a healthy demo answers in well under a second).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

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
    #[arg(long, value_name = "S", value_parser = parse_positive)]
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

fn parse_positive(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("must be a positive number, got '{s}'")),
    }
}

fn parse_time_scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 100.0 => Ok(v),
        _ => Err(format!(
            "time_scale must be a number within (0, 100] (wall seconds per engine second), got '{s}'"
        )),
    }
}

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
    fn add(&mut self, page: &str) {
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

/// One strategy's run, converted to engine time.
struct StrategyRun {
    result: StrategyResult,
    summary: RunSummary,
    first_failure: Option<String>,
}

/// Runs `demo`.
pub fn run(mut args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let workload = load_workload(&args)?;
    let engine = engine_config(&args.preset).context("--preset")?;
    let mut mock = MockEngineConfig::new(engine.clone()).with_time_scale(args.time_scale);
    mock.seed = args.seed;
    mock.validate().context("mock engine")?;
    let prefix_length = PrefixLength::new(u64::from(DEFAULT_PREFIX_LENGTH))?;
    let driver = match &workload.source {
        WorkloadSource::Generated { spec } => match spec.arrival {
            Arrival::Closed { clients } => Driver::ClosedLoop { clients },
            Arrival::Poisson { .. } => Driver::OpenLoop,
        },
        WorkloadSource::Trace { .. } => Driver::OpenLoop,
    };
    let mut strategies: Vec<StrategyConfig> = args
        .strategies
        .iter()
        .map(|&k| StrategyConfig::new(k))
        .collect();
    crate::args::apply_strategy_params(&mut strategies, &args.strategy_params)?;
    // kv-aware without the engines' events would silently be cache-aware.
    let reads_tokens = strategies
        .iter()
        .map(StrategyConfig::build)
        .collect::<Result<Vec<_>, _>>()?
        .iter()
        .any(|s| s.reads_tokens());
    if reads_tokens && !args.kv_events {
        eprintln!("demo: kv-aware routes on the engines' KV events: turning on --kv-events");
        args.kv_events = true;
    }
    let sim_config = SimConfig {
        preset: args.preset.clone(),
        instances: args.instances,
        strategies: strategies.clone(),
        prefix_length,
        seed: args.seed,
        driver,
        scale: Vec::new(),
        hit_rate_buckets: HIT_RATE_BUCKETS,
        kv_events: Default::default(),
        // The same replicas, scraping as often in engine time as the routers do in wall time.
        routers: RouterModel {
            replicas: args.replicas,
            scrape: args.engine_queues.then(|| ScrapeModel {
                interval_s: QUEUE_SCRAPE.as_secs_f64() / args.time_scale,
                delay_s: ScrapeModel::default().delay_s,
                stale_after_s: QUEUE_STALE.as_secs_f64() / args.time_scale,
            }),
        },
        prewarm: None,
        clairvoyant: false,
    };
    // The simulator's view of the same runs: cheap, and the yardstick the demo should meet.
    let simulated = simulate(&workload, &sim_config, &mut |_| {}).context("simulate")?;

    eprintln!(
        "demo: {} requests of {} per strategy through {} mock engines ({}) and {}, engines at {}x real time ({} wall s per engine s)",
        workload.requests.len(),
        workload.name,
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
    let mut runs = Vec::with_capacity(strategies.len());
    for (i, strategy) in strategies.iter().enumerate() {
        let label = format!("{} ({}/{})", strategy.kind.name(), i + 1, strategies.len());
        let run = runtime
            .block_on(run_strategy(
                &args,
                strategy,
                prefix_length,
                &mock,
                &workload.requests,
                driver,
                &label,
            ))
            .with_context(|| format!("demo with {}", strategy.kind.name()))?;
        eprintln!(
            "demo: {label}: {} completed, {} failed in {:.1} s wall ({:.0} engine s)",
            run.result.requests,
            run.summary.failed,
            run.summary.wall_s,
            run.summary.wall_s / args.time_scale
        );
        runs.push(run);
    }
    drop(runtime);

    let report = Report {
        workload: simulated.workload.clone(),
        fleet: FleetSummary {
            instances: args.instances,
            preset: args.preset.clone(),
            engine,
            prefix_length: prefix_length.get(),
            seed: args.seed,
            scale_events: Vec::new(),
            strategies: simulated.fleet.strategies.clone(),
            routers: simulated.fleet.routers,
        },
        oracle_hit_rate: simulated.oracle_hit_rate,
        // Not printed beside HTTP runs: the demo subtracts its HTTP path's mean cost, which can
        // take a measured percentile under the model's floor and make the line read false.
        ttft_floor_ms: None,
        results: runs.iter().map(|r| r.result.clone()).collect(),
    };
    let demo = DemoReport {
        report,
        time_scale: args.time_scale,
        runs: runs.iter().map(|r| r.summary.clone()).collect(),
        simulated: simulated.results.clone(),
    };
    crate::out::print(&render(&demo))?;
    plot::write_svg(&demo.report, &args.plot)
        .with_context(|| format!("--plot {}", args.plot.display()))?;
    crate::out::print(&format!(
        "TTFT CDFs, instance shares and hit rate over time: {}\n",
        args.plot.display()
    ))?;
    if let Some(path) = &args.json {
        crate::report_file::write_json(path, &demo)?;
    }
    eprintln!("demo: finished in {:.1} s", started.elapsed().as_secs_f64());
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| r.summary.failed > 0 || r.result.requests == 0)
        .map(|r| {
            format!(
                "{}: {} of {} requests failed{}",
                r.summary.strategy,
                r.summary.failed,
                r.summary.sent,
                r.first_failure
                    .as_ref()
                    .map(|f| format!(" (first: {f})"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// Generates the named workload with the flags applied (as `simulate` does).
fn load_workload(args: &DemoArgs) -> Result<SimWorkload> {
    let name = args.workload.as_str();
    let (spec, requests) = workload_flags::generate(&GeneratedFlags {
        name,
        seed: args.seed,
        requests: args.requests,
        rate: None,
        concurrency: args.concurrency,
        groups: None,
        params: &args.params,
    })?;
    Ok(SimWorkload {
        name: name.to_string(),
        source: WorkloadSource::Generated { spec },
        requests,
    })
}

/// One strategy: fresh engines, a router, the replay, the teardown; results in engine time.
async fn run_strategy(
    args: &DemoArgs,
    strategy: &StrategyConfig,
    prefix_length: PrefixLength,
    mock: &MockEngineConfig,
    requests: &[Request],
    driver: Driver,
    label: &str,
) -> Result<StrategyRun> {
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut mock = mock.clone();
    if args.kv_events {
        mock.kv_events = Some(KvEventsConfig {
            drop_rate: args.kv_events_drop,
            ..KvEventsConfig::default()
        });
    }
    let mock = &mock;
    let mut engines = Vec::with_capacity(args.instances as usize);
    for _ in 0..args.instances {
        engines.push(
            MockEngine::bind(loopback, mock.clone())
                .await
                .context("starting a mock engine")?,
        );
    }
    let mut settings =
        Settings::with_instances(engines.iter().map(MockEngine::url)).context("router settings")?;
    settings.listen = loopback;
    settings.routing.strategy = strategy.clone();
    settings.routing.prefix_length = prefix_length;
    if args.engine_queues {
        settings.engine_metrics.scrape = true;
        settings.engine_metrics.route_on_queues = true;
        settings.engine_metrics.interval = QUEUE_SCRAPE;
        settings.engine_metrics.stale_after = QUEUE_STALE;
    }
    if args.kv_events {
        settings.kv_events.subscribe = true;
        settings.kv_events.tokenizer = Some(prefix_router_tokenize::WORDS.into());
        settings.kv_events.endpoints = engines
            .iter()
            .map(|e| {
                Ok(KvEventsEndpoint {
                    instance: e.url(),
                    publisher: e
                        .kv_events_endpoint()
                        .context("a mock engine without its KV-event socket")?
                        .to_string(),
                    replay: e.kv_events_replay_endpoint().map(str::to_string),
                })
            })
            .collect::<Result<_>>()?;
        settings = settings.validate().context("router settings")?;
    }
    let mut routers = Vec::with_capacity(args.replicas as usize);
    for _ in 0..args.replicas {
        let router = Router::start(settings.clone(), None)
            .await
            .context("starting the router")?;
        if args.kv_events {
            wait_for_feeds(&router, &engines).await?;
        }
        routers.push(router);
    }

    let scale = args.time_scale;
    // Open-loop arrivals are engine seconds: squeeze them onto the wall clock.
    let mut requests = requests.to_vec();
    if driver == Driver::OpenLoop {
        for r in &mut requests {
            r.arrival_s *= scale;
        }
    }
    let config = |router: &prefix_router_server::RunningRouter| BenchConfig {
        target: format!("http://{}", router.local_addr()),
        mode: match driver {
            Driver::OpenLoop => LoadMode::OpenLoop { rate: None },
            Driver::ClosedLoop { clients } => LoadMode::ClosedLoop {
                concurrency: clients,
            },
        },
        duration: args
            .duration
            .map(|s| Duration::from_secs_f64((s * scale).max(1e-3))),
        max_requests: None,
        timeout: REQUEST_TIMEOUT,
        // Generated workloads name no model; the engines serve theirs.
        model: Some(mock.model.clone()),

        wait_for_target: prefix_router_loadgen::config::DEFAULT_WAIT_FOR_TARGET,
    };
    let configs: Vec<BenchConfig> = routers.iter().map(config).collect();
    let bar = std::sync::Arc::new(std::sync::Mutex::new(Bar::new(label)));
    let updates = std::sync::Arc::clone(&bar);
    let outcome = run_split(&configs, requests.clone(), move |p| {
        updates.lock().unwrap_or_else(|e| e.into_inner()).update(p)
    })
    .await;
    bar.lock().unwrap_or_else(|e| e.into_inner()).finish();
    let outcome = outcome.context("load generator")?;
    let affinity = affinity(&outcome, &requests, args.instances as usize);

    let mut engine_ttft = (0.0, 0u64);
    // The engines' own TTFT histogram (engine seconds), to tell their share from the path's.
    let client = upstream::client(
        Duration::from_secs(2),
        prefix_router_server::tls::client_config(&Default::default())?,
        0,
    );
    for e in &engines {
        let base = format!("http://{}", e.local_addr());
        let page = upstream::get(&client, &base, "/metrics", 4 << 20, Duration::from_secs(5)).await;
        if let Some((_, page)) = page {
            let (sum, count) = ttft_sum_count(&String::from_utf8_lossy(&page));
            engine_ttft.0 += sum;
            engine_ttft.1 += count;
        }
    }
    let kv_events = if args.kv_events {
        let mut sum = KvEventSummary::default();
        for router in &routers {
            let base = format!("http://{}", router.local_addr());
            let page =
                upstream::get(&client, &base, "/metrics", 4 << 20, Duration::from_secs(5)).await;
            if let Some((_, page)) = page {
                sum.add(&String::from_utf8_lossy(&page));
            }
        }
        Some(sum)
    } else {
        None
    };
    for router in routers {
        router.shutdown().await;
    }
    let fleet: Vec<String> = engines.iter().map(MockEngine::url).collect();
    for e in engines {
        e.shutdown().await;
    }

    let ok_ttft: Vec<f64> = outcome
        .records
        .iter()
        .filter(|r| r.is_ok())
        .filter_map(|r| r.ttft_s())
        .collect();
    let client_ttft_mean_wall_ms = ok_ttft.iter().sum::<f64>() / ok_ttft.len().max(1) as f64 * 1e3;
    let engine_ttft_mean_ms =
        (engine_ttft.1 > 0).then(|| engine_ttft.0 / engine_ttft.1 as f64 * 1e3);
    let http_path_wall_ms = engine_ttft_mean_ms
        .map(|e| (client_ttft_mean_wall_ms - e * scale).max(0.0))
        .unwrap_or(0.0);
    let name = strategy.kind.name();
    let result = strategy_result(
        &to_engine_time(&outcome, scale, http_path_wall_ms / 1e3),
        name,
        &fleet,
    );
    let all_scaled = to_engine_time(&outcome, scale, 0.0);
    let summary = RunSummary {
        strategy: name.to_string(),
        sent: outcome.sent(),
        failed: outcome.sent() - outcome.completed(),
        wall_s: outcome.wall_s,
        engine_ttft_mean_ms,
        client_ttft_mean_wall_ms,
        http_path_wall_ms,
        ttft_p50_all_scaled_ms: all_scaled.ttft_ms().p50,
        replicas: args.replicas,
        engine_queues: args.engine_queues,
        affinity,
        kv_events,
    };
    let first_failure = outcome
        .records
        .iter()
        .find_map(|r| r.failure.as_ref())
        .map(|f| format!("{}: {}", f.kind, f.detail));
    Ok(StrategyRun {
        result,
        summary,
        first_failure,
    })
}

/// Waits until `router` is subscribed to every engine's KV events (what each published before
/// is replayed to it).
async fn wait_for_feeds(
    router: &prefix_router_server::RunningRouter,
    engines: &[MockEngine],
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let feeds = router
        .state()
        .kv_events
        .as_ref()
        .context("the router has no KV-event feeds")?;
    for e in engines {
        loop {
            if feeds.is_connected(&e.url()) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the router did not subscribe to {}'s KV events within 10 s",
                    e.url()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// The outcome in engine time. Points in time are divided by the time scale; a request's TTFT
/// and end-to-end latency are split into the HTTP path's `path_s` wall seconds, which run at
/// real speed and are kept as they are, and the rest, which the engines stretched by the time
/// scale and is divided by it. (`path_s` = 0: everything divided.)
fn to_engine_time(outcome: &BenchOutcome, scale: f64, path_s: f64) -> BenchOutcome {
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
fn ttft_sum_count(text: &str) -> (f64, u64) {
    let value = |name: &str| prom::value(text, name, &[]).unwrap_or(0.0);
    (
        value("vllm:time_to_first_token_seconds_sum"),
        value("vllm:time_to_first_token_seconds_count") as u64,
    )
}

/// "12.5" for 0.08.
fn fmt_speed(scale: f64) -> String {
    let x = 1.0 / scale;
    if (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn change(new: f64, old: f64) -> Option<f64> {
    (old > 0.0).then(|| (new / old - 1.0) * 100.0)
}

fn share_range(r: &StrategyResult) -> String {
    let min = r
        .instance_share
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let max = r.instance_share.iter().copied().fold(0.0, f64::max);
    if r.instance_share.is_empty() {
        "-".into()
    } else {
        format!("{} .. {}", pct(min), pct(max))
    }
}

/// The table (simulate's renderer), the overhead, simulate beside, the published experiment.
pub fn render(demo: &DemoReport) -> String {
    let mut out = String::new();
    let scale = demo.time_scale;
    let _ = writeln!(
        out,
        "Demo over real HTTP: mock engines at {}x real time; every figure below is converted back to engine time.",
        fmt_speed(scale)
    );
    // The routers are real servers whose random choices are not seeded: say so instead of the
    // simulator's "router seed".
    let seed_note = format!(", router seed {}", demo.report.fleet.seed);
    out.push_str(&table::render(&demo.report).replacen(
        &seed_note,
        ", router choices unseeded (real server)",
        1,
    ));

    out.push('\n');
    let _ = writeln!(
        out,
        "HTTP path (load generator -> router -> engine and back: rendering, routing, parsing, tokenizing, SSE),\n\
         measured as the client's mean TTFT minus the engines' own; it runs at real speed, so the table counts it\n\
         as it is instead of stretching it {}x with the engines' time:",
        fmt_speed(scale)
    );
    for r in &demo.runs {
        match r.engine_ttft_mean_ms {
            Some(_) => {
                let _ = writeln!(
                    out,
                    "  {:<14} {:.2} ms per request (stretched it would read {:.1} ms: TTFT P50 {:.1} ms instead of the table's); {} of {} failed, {:.1} s wall",
                    r.strategy,
                    r.http_path_wall_ms,
                    r.http_path_wall_ms / scale,
                    r.ttft_p50_all_scaled_ms,
                    r.failed,
                    r.sent,
                    r.wall_s
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  {:<14} engines' TTFT not available: every wall millisecond divided by the time scale",
                    r.strategy
                );
            }
        }
    }

    if let Some(first) = demo.runs.first() {
        out.push('\n');
        let _ = writeln!(
            out,
            "Placement: {} router replica{}{}; engine queues {}:",
            first.replicas,
            if first.replicas == 1 { "" } else { "s" },
            if first.replicas == 1 {
                ""
            } else {
                ", the requests dealt among them in turn, each client on one"
            },
            if first.engine_queues {
                "scraped and counted (--engine-queues)"
            } else {
                "not scraped (each router counts its own requests only)"
            }
        );
        for r in &demo.runs {
            let a = &r.affinity;
            let _ = writeln!(
                out,
                "  {:<18} {} of each prefix's requests on its most-used instance ({} prefixes); busiest instance {:.2}x the mean",
                r.strategy,
                pct(a.on_home),
                a.prefixes,
                a.max_share_over_mean
            );
        }
    }

    if demo.runs.iter().any(|r| r.kv_events.is_some()) {
        out.push('\n');
        let _ = writeln!(
            out,
            "KV events (mock engines publishing over ZeroMQ on 127.0.0.1, every router subscribed; times are wall time):"
        );
        for r in &demo.runs {
            if let Some(k) = &r.kv_events {
                let _ = writeln!(
                    out,
                    "  {:<18} {:.0} batches applied, {:.0} gaps: {:.0} replayed, {:.0} lost; recovery mean {:.2} ms, all within {:.1} ms",
                    r.strategy,
                    k.batches,
                    k.gaps,
                    k.recovered,
                    k.lost,
                    k.recovery_mean_ms(),
                    k.recovery_max_ms
                );
            }
        }
    }

    out.push('\n');
    let _ = writeln!(
        out,
        "simulate, same workload and settings (the discrete-event model of the same engines{}):",
        match demo.runs.first().map_or(1, |r| r.replicas) {
            1 => String::new(),
            n => format!(" behind {n} router replicas"),
        }
    );
    for (d, s) in demo.report.results.iter().zip(&demo.simulated) {
        let _ = writeln!(
            out,
            "  {:<18} hit rate {} (demo {}, {:+.1} points), TTFT P50 {:.1} ms (demo {:.1} ms, {:+.1}%), P90 {:.1} ms (demo {:.1} ms)",
            s.strategy,
            pct(s.kv_hit_rate),
            pct(d.kv_hit_rate),
            (d.kv_hit_rate - s.kv_hit_rate) * 100.0,
            s.ttft_ms.p50,
            d.ttft_ms.p50,
            change(d.ttft_ms.p50, s.ttft_ms.p50).unwrap_or(0.0),
            s.ttft_ms.p90,
            d.ttft_ms.p90,
        );
    }

    let find = |name: &str| demo.report.results.iter().find(|r| r.strategy == name);
    if let (Some(pa), Some(rnd)) = (find("prefix-aware"), find("random")) {
        out.push('\n');
        let fmt_change = |new: f64, old: f64| {
            change(new, old)
                .map(|c| format!("{c:+.1}%"))
                .unwrap_or_else(|| "-".into())
        };
        let rows = [
            (
                "KV hit rate".to_string(),
                "~25% -> up to 82%".to_string(),
                format!("{} -> {}", pct(rnd.kv_hit_rate), pct(pa.kv_hit_rate)),
            ),
            (
                "TTFT P50".into(),
                "-71% .. -77%".into(),
                fmt_change(pa.ttft_ms.p50, rnd.ttft_ms.p50),
            ),
            (
                "TTFT P90".into(),
                "-33% .. -37%".into(),
                fmt_change(pa.ttft_ms.p90, rnd.ttft_ms.p90),
            ),
            (
                "throughput".into(),
                "+15% .. +16%".into(),
                fmt_change(pa.throughput_rps, rnd.throughput_rps),
            ),
            (
                "instance share".into(),
                "13.3% .. 15.4%".into(),
                format!("{} (prefix-aware)", share_range(pa)),
            ),
        ];
        let _ = writeln!(
            out,
            "Published experiment (Llama 3.1 70B on vLLM, 7 instances, 8,000-token shared prefixes) beside this run:"
        );
        let _ = writeln!(
            out,
            "  {:<16} {:<20} this run (prefix-aware vs random)",
            "", "published"
        );
        for (what, published, ours) in rows {
            let _ = writeln!(out, "  {what:<16} {published:<20} {ours}");
        }
    }
    out
}

/// A progress bar on stderr, only when stderr is a terminal.
struct Bar {
    label: String,
    bar: Option<ProgressBar>,
}

impl Bar {
    fn new(label: &str) -> Self {
        Bar {
            label: label.to_string(),
            bar: None,
        }
    }

    fn update(&mut self, p: &Progress) {
        if self.bar.is_none() {
            if !std::io::stderr().is_terminal() {
                return;
            }
            let bar = ProgressBar::with_draw_target(Some(p.planned), ProgressDrawTarget::stderr());
            let style =
                ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(p.completed + p.failed);
            bar.set_message(self.label.clone());
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
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

    #[test]
    fn speeds_read_as_factors() {
        assert_eq!(fmt_speed(0.05), "20");
        assert_eq!(fmt_speed(0.08), "12.50");
        assert_eq!(fmt_speed(1.0), "1");
    }
}
