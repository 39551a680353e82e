//! The demo: the whole story over real HTTP on one machine. For each strategy in turn it
//! starts N fresh mock engines and one router (or several replicas) on 127.0.0.1 ephemeral
//! ports, replays the workload through the router(s) with the load generator, stops them, and
//! reports the runs as `simulate` reports its own (in engine time), beside `simulate`'s figures
//! for the same workload and settings.
//!
//! Engines run at `time_scale` wall seconds per engine second, so every wall-clock measurement
//! is converted back: durations divided by the scale, rates multiplied by it. What the HTTP path
//! itself costs (rendering, router, tokenizing, SSE) is not scaled by the engines' clock, so it
//! weighs 1/scale times more in engine units; the demo measures it (client TTFT against the
//! engines' own TTFT histogram) and counts it as it is.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prefix_router_core::{PrefixLength, StrategyConfig};
use prefix_router_engine_model::EngineConfig;
use prefix_router_loadgen::{affinity, run_split, BenchConfig, LoadMode, Progress};
use prefix_router_mock_engine::{KvEventsConfig, MockEngine, MockEngineConfig};
use prefix_router_server::settings::KvEventsEndpoint;
use prefix_router_server::{upstream, Router, RunningRouter, Settings};
use prefix_router_sim::{
    engine_config, simulate, Driver, FleetSummary, Report, RouterModel, ScrapeModel, SimConfig,
    SimWorkload, StrategyResult, WorkloadSource,
};
use prefix_router_workload::Arrival;

use crate::bench::{strategy_result, HIT_RATE_BUCKETS};
use crate::ReplayError;

mod render;
mod report;
pub use render::{fmt_speed, render};
pub use report::{to_engine_time, ttft_sum_count, DemoReport, KvEventSummary, RunSummary};

/// How often each router scrapes the engines' queues with `engine_queues`, and how long a
/// reading is trusted (wall time; 0.6 and 2.5 engine seconds at the default time scale).
const QUEUE_SCRAPE: Duration = Duration::from_millis(50);
const QUEUE_STALE: Duration = Duration::from_millis(200);

/// Per-request limit, wall seconds (a healthy demo answers in well under a second).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a router may take to subscribe to every engine's KV events.
const FEEDS_WAIT: Duration = Duration::from_secs(10);

/// What a demo runs.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Mock engines behind the router(s), started fresh for every strategy.
    pub instances: u32,
    /// The strategies, one after another, each on its own fleet.
    pub strategies: Vec<StrategyConfig>,
    /// What is replayed (arrival times in engine seconds).
    pub workload: SimWorkload,
    /// Engine preset of every mock engine.
    pub preset: String,
    /// Wall seconds per engine second.
    pub time_scale: f64,
    /// Stop sending after this many engine seconds per strategy.
    pub duration_s: Option<f64>,
    /// Seed of the mock engines and of `simulate` (the routers' own choices are not seeded).
    pub seed: u64,
    /// Router replicas in front of the engines; requests are dealt among them in turn.
    pub replicas: u32,
    /// Every router scrapes the engines' queues and counts them in its load.
    pub engine_queues: bool,
    /// Every engine publishes its KV events and every router subscribes.
    pub kv_events: bool,
    /// Share of KV-event batches each engine drops (still replayable).
    pub kv_events_drop: f64,
    /// The routers' fixed-length key.
    pub prefix_length: PrefixLength,
}

/// Whether any of `strategies` routes on the engines' KV events (kv-aware): without them it
/// would silently be cache-aware, so a demo of it needs `kv_events`.
pub fn reads_tokens(strategies: &[StrategyConfig]) -> Result<bool, ReplayError> {
    for s in strategies {
        if s.build()?.reads_tokens() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A demo ready to run: its settings checked, the engines' and the simulator's settings made.
#[derive(Debug)]
pub struct Demo {
    config: DemoConfig,
    engine: EngineConfig,
    mock: MockEngineConfig,
    driver: Driver,
    sim: SimConfig,
}

/// One strategy's run, converted to engine time.
#[derive(Debug, Clone)]
pub struct StrategyRun {
    /// `simulate`'s fields.
    pub result: StrategyResult,
    /// What only the demo has.
    pub summary: RunSummary,
    /// The first failed request's kind and detail, if any failed.
    pub first_failure: Option<String>,
    /// The positions in the workload of the requests it sent (all of them unless `duration_s`
    /// stopped it), ascending.
    pub sent: Vec<usize>,
}

impl Demo {
    /// Checks `config` and prepares the mock engines' and the simulator's settings.
    pub fn new(config: DemoConfig) -> Result<Self, ReplayError> {
        let engine = engine_config(&config.preset).map_err(ReplayError::Preset)?;
        let mut mock = MockEngineConfig::new(engine.clone()).with_time_scale(config.time_scale);
        mock.seed = config.seed;
        if config.kv_events {
            mock.kv_events = Some(KvEventsConfig {
                drop_rate: config.kv_events_drop,
                ..KvEventsConfig::default()
            });
        }
        mock.validate()?;
        let driver = match &config.workload.source {
            WorkloadSource::Generated { spec } => match spec.arrival {
                Arrival::Closed { clients } => Driver::ClosedLoop { clients },
                Arrival::Poisson { .. } => Driver::OpenLoop,
            },
            WorkloadSource::Trace { .. } => Driver::OpenLoop,
        };
        let sim = SimConfig {
            preset: config.preset.clone(),
            instances: config.instances,
            strategies: config.strategies.clone(),
            prefix_length: config.prefix_length,
            seed: config.seed,
            driver,
            scale: Vec::new(),
            hit_rate_buckets: HIT_RATE_BUCKETS,
            kv_events: Default::default(),
            // The same replicas, scraping as often in engine time as the routers do in wall time.
            routers: RouterModel {
                replicas: config.replicas,
                scrape: config.engine_queues.then(|| ScrapeModel {
                    interval_s: QUEUE_SCRAPE.as_secs_f64() / config.time_scale,
                    delay_s: ScrapeModel::default().delay_s,
                    stale_after_s: QUEUE_STALE.as_secs_f64() / config.time_scale,
                }),
            },
            prewarm: None,
            clairvoyant: false,
        };
        Ok(Self {
            config,
            engine,
            mock,
            driver,
            sim,
        })
    }

    /// Its settings.
    pub fn config(&self) -> &DemoConfig {
        &self.config
    }

    /// `simulate` on the same workload and settings: cheap, and the yardstick the demo should
    /// meet.
    pub fn simulate(&self) -> Result<Report, ReplayError> {
        Ok(simulate(&self.config.workload, &self.sim, &mut |_| {})?)
    }

    /// `simulate` on what each run sent, when `duration_s` stopped a run before the end of the
    /// workload (`None` otherwise: [`Demo::simulate`] stands). Each strategy is simulated on
    /// exactly the requests it sent, so its figures sit beside its own run's; the workload line
    /// describes the largest of those sets. Without this, a cut run of 96 requests was compared
    /// with a simulation of all 300.
    pub fn simulate_sent(&self, runs: &[StrategyRun]) -> Result<Option<Report>, ReplayError> {
        let all = self.config.workload.requests.len();
        if self.config.duration_s.is_none() || runs.iter().all(|r| r.sent.len() == all) {
            return Ok(None);
        }
        let mut combined: Option<(usize, Report)> = None;
        let mut results = Vec::with_capacity(runs.len());
        for (i, run) in runs.iter().enumerate() {
            let strategy = self
                .config
                .strategies
                .get(i)
                .ok_or(ReplayError::NoStrategy(i))?;
            let mut workload = self.config.workload.clone();
            workload.requests = run
                .sent
                .iter()
                .filter_map(|&k| self.config.workload.requests.get(k).cloned())
                .collect();
            let sim = SimConfig {
                strategies: vec![strategy.clone()],
                ..self.sim.clone()
            };
            let report = simulate(&workload, &sim, &mut |_| {})?;
            results.extend(report.results.iter().cloned());
            if combined.as_ref().is_none_or(|(n, _)| run.sent.len() > *n) {
                combined = Some((run.sent.len(), report));
            }
        }
        Ok(combined.map(|(_, mut report)| {
            report.results = results;
            report
        }))
    }

    /// Runs strategy number `i` of the config: fresh engines, the router(s), the replay, the
    /// teardown; results in engine time. `progress` hears from the load generator.
    pub async fn run_strategy<F>(&self, i: usize, progress: F) -> Result<StrategyRun, ReplayError>
    where
        F: FnMut(&Progress) + Send + 'static,
    {
        let cfg = &self.config;
        let strategy = cfg.strategies.get(i).ok_or(ReplayError::NoStrategy(i))?;
        let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
        let mut engines = Vec::with_capacity(cfg.instances as usize);
        for _ in 0..cfg.instances {
            match MockEngine::bind(loopback, self.mock.clone()).await {
                Ok(e) => engines.push(e),
                Err(e) => {
                    stop(Vec::new(), engines).await;
                    return Err(e.into());
                }
            }
        }
        let routers = match self.start_routers(strategy, &engines).await {
            Ok(routers) => routers,
            Err(e) => {
                stop(Vec::new(), engines).await;
                return Err(e);
            }
        };
        let fleet: Vec<String> = engines.iter().map(MockEngine::url).collect();

        let scale = cfg.time_scale;
        // Open-loop arrivals are engine seconds: squeeze them onto the wall clock.
        let mut requests = cfg.workload.requests.clone();
        if self.driver == Driver::OpenLoop {
            for r in &mut requests {
                r.arrival_s *= scale;
            }
        }
        let configs: Vec<BenchConfig> = routers.iter().map(|r| self.bench_config(r)).collect();
        let outcome = run_split(&configs, requests.clone(), progress).await;
        let (engine_ttft, kv_events) = match self.read_metrics(&engines, &routers).await {
            Ok(read) => read,
            Err(e) => {
                stop(routers, engines).await;
                return Err(e);
            }
        };
        stop(routers, engines).await;
        let outcome = outcome?;
        let affinity = affinity(&outcome, &requests, cfg.instances as usize);

        let ok_ttft: Vec<f64> = outcome
            .records
            .iter()
            .filter(|r| r.is_ok())
            .filter_map(|r| r.ttft_s())
            .collect();
        let client_ttft_mean_wall_ms =
            ok_ttft.iter().sum::<f64>() / ok_ttft.len().max(1) as f64 * 1e3;
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
            send_lag_p99_wall_ms: (self.driver == Driver::OpenLoop)
                .then(|| outcome.send_lag_ms().p99),
            replicas: cfg.replicas,
            engine_queues: cfg.engine_queues,
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
            sent: outcome.records.iter().map(|r| r.index).collect(),
        })
    }

    /// The router replicas for `strategy` in front of `engines`, each subscribed to the
    /// engines' KV events before it is returned when the demo has them.
    async fn start_routers(
        &self,
        strategy: &StrategyConfig,
        engines: &[MockEngine],
    ) -> Result<Vec<RunningRouter>, ReplayError> {
        let cfg = &self.config;
        let mut settings = Settings::with_instances(engines.iter().map(MockEngine::url))?;
        settings.listen = ([127, 0, 0, 1], 0).into();
        settings.routing.strategy = strategy.clone();
        settings.routing.prefix_length = cfg.prefix_length;
        if cfg.engine_queues {
            settings.engine_metrics.scrape = true;
            settings.engine_metrics.route_on_queues = true;
            settings.engine_metrics.interval = QUEUE_SCRAPE;
            settings.engine_metrics.stale_after = QUEUE_STALE;
        }
        if cfg.kv_events {
            settings.kv_events.subscribe = true;
            settings.kv_events.tokenizer = Some(prefix_router_tokenize::WORDS.into());
            settings.kv_events.endpoints = engines
                .iter()
                .map(|e| {
                    Ok(KvEventsEndpoint {
                        instance: e.url(),
                        publisher: e
                            .kv_events_endpoint()
                            .ok_or(ReplayError::NoKvSocket)?
                            .to_string(),
                        replay: e.kv_events_replay_endpoint().map(str::to_string),
                    })
                })
                .collect::<Result<_, ReplayError>>()?;
            settings = settings.validate()?;
        }
        let mut routers = Vec::with_capacity(cfg.replicas as usize);
        for _ in 0..cfg.replicas {
            let started = match Router::start(settings.clone(), None).await {
                Ok(router) => router,
                Err(e) => {
                    stop(routers, Vec::new()).await;
                    return Err(e.into());
                }
            };
            let subscribed = if cfg.kv_events {
                wait_for_feeds(&started, engines).await
            } else {
                Ok(())
            };
            routers.push(started);
            if let Err(e) = subscribed {
                stop(routers, Vec::new()).await;
                return Err(e);
            }
        }
        Ok(routers)
    }

    /// The load generator's settings for one router.
    fn bench_config(&self, router: &RunningRouter) -> BenchConfig {
        let scale = self.config.time_scale;
        BenchConfig {
            target: format!("http://{}", router.local_addr()),
            mode: match self.driver {
                Driver::OpenLoop => LoadMode::OpenLoop { rate: None },
                Driver::ClosedLoop { clients } => LoadMode::ClosedLoop {
                    concurrency: clients,
                },
            },
            duration: self
                .config
                .duration_s
                .map(|s| Duration::from_secs_f64((s * scale).max(1e-3))),
            max_requests: None,
            timeout: REQUEST_TIMEOUT,
            // Generated workloads name no model; the engines serve theirs.
            model: Some(self.mock.model.clone()),
            wait_for_target: prefix_router_loadgen::config::DEFAULT_WAIT_FOR_TARGET,
            unstreamed: 0.0,
        }
    }

    /// The engines' own TTFT histogram (sum in engine seconds, count), to tell their share of
    /// the client's TTFT from the HTTP path's; and with KV events, what the routers'
    /// subscribers saw.
    async fn read_metrics(
        &self,
        engines: &[MockEngine],
        routers: &[RunningRouter],
    ) -> Result<((f64, u64), Option<KvEventSummary>), ReplayError> {
        let client = upstream::client(
            Duration::from_secs(2),
            prefix_router_server::tls::ClientTls::new(&Default::default())?.config(),
            0,
        );
        let page = |addr: SocketAddr| {
            let client = &client;
            async move {
                let base = format!("http://{addr}");
                upstream::get(client, &base, "/metrics", 4 << 20, Duration::from_secs(5))
                    .await
                    .map(|(_, page)| String::from_utf8_lossy(&page).into_owned())
            }
        };
        let mut engine_ttft = (0.0, 0u64);
        for e in engines {
            if let Some(text) = page(e.local_addr()).await {
                let (sum, count) = ttft_sum_count(&text);
                engine_ttft.0 += sum;
                engine_ttft.1 += count;
            }
        }
        let mut kv_events = None;
        if self.config.kv_events {
            let mut sum = KvEventSummary::default();
            for router in routers {
                if let Some(text) = page(router.local_addr()).await {
                    sum.add(&text);
                }
            }
            kv_events = Some(sum);
        }
        Ok((engine_ttft, kv_events))
    }

    /// The demo's report: the runs as `simulate`'s report (engine time), and `simulated`
    /// (from [`Demo::simulate`]) beside them.
    pub fn report(&self, simulated: &Report, runs: &[StrategyRun]) -> DemoReport {
        let cfg = &self.config;
        let report = Report {
            workload: simulated.workload.clone(),
            fleet: FleetSummary {
                instances: cfg.instances,
                preset: cfg.preset.clone(),
                engine: self.engine.clone(),
                prefix_length: cfg.prefix_length.get(),
                seed: cfg.seed,
                scale_events: Vec::new(),
                strategies: simulated.fleet.strategies.clone(),
                routers: simulated.fleet.routers,
            },
            oracle_hit_rate: simulated.oracle_hit_rate,
            // Not printed beside HTTP runs: the demo subtracts its HTTP path's mean cost, which
            // can take a measured percentile under the model's floor and make the line read
            // false.
            ttft_floor_ms: None,
            results: runs.iter().map(|r| r.result.clone()).collect(),
        };
        DemoReport {
            report,
            time_scale: cfg.time_scale,
            runs: runs.iter().map(|r| r.summary.clone()).collect(),
            simulated: simulated.results.clone(),
        }
    }
}

/// One line per run that failed requests or completed none, with the first failure's detail.
pub fn failures(runs: &[StrategyRun]) -> Vec<String> {
    runs.iter()
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
        .collect()
}

/// Shuts the routers down, then the engines.
async fn stop(routers: Vec<RunningRouter>, engines: Vec<MockEngine>) {
    for router in routers {
        router.shutdown().await;
    }
    for e in engines {
        e.shutdown().await;
    }
}

/// Waits until `router` is subscribed to every engine's KV events (what each published before
/// is replayed to it).
async fn wait_for_feeds(router: &RunningRouter, engines: &[MockEngine]) -> Result<(), ReplayError> {
    let deadline = Instant::now() + FEEDS_WAIT;
    let feeds = router
        .state()
        .kv_events
        .as_ref()
        .ok_or(ReplayError::NoFeeds)?;
    for e in engines {
        while !feeds.is_connected(&e.url()) {
            if Instant::now() > deadline {
                return Err(ReplayError::NotSubscribed {
                    instance: e.url(),
                    within_s: FEEDS_WAIT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}
