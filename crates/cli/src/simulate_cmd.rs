//! `prefix-router simulate`: builds the workload and fleet settings from flags, runs the
//! simulator, prints the table and writes the JSON and SVG files asked for.

use prefix_router_core::prewarm::PrewarmConfig;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use prefix_router_core::{ConcurrencyThreshold, PrefixLength, StrategyConfig};
use prefix_router_sim::sweep::{self, load_sweep};
use prefix_router_sim::{
    plot, simulate, table, Driver, KvEventModel, RouterModel, ScrapeModel, SimConfig, SimWorkload,
    WorkloadSource,
};
use prefix_router_workload::{trace, Arrival, Request};

use crate::args::SimulateArgs;
use crate::progress::DelayedBar;
use crate::workload_flags::{self, GeneratedFlags};

/// Buckets of the hit-rate-over-time series.
const HIT_RATE_BUCKETS: usize = 50;

/// Runs `simulate`.
pub fn run(args: SimulateArgs) -> Result<()> {
    crate::report_file::check_folders(&[
        ("--json", args.json.as_deref()),
        ("--plot", args.plot.as_deref()),
        ("--write-trace", args.write_trace.as_deref()),
    ])?;
    let workload = load_workload(&args)?;
    if let Some(path) = &args.write_trace {
        return write_trace(path, &workload.requests);
    }
    if !args.load.is_empty() {
        return run_sweep(&args, &workload);
    }
    let config = sim_config(&args, &workload)?;
    let started = Instant::now();
    let mut bar = DelayedBar::new();
    let report = simulate(&workload, &config, &mut |p| bar.update(p));
    bar.finish();
    let report = report?;
    let wall = started.elapsed().as_secs_f64();

    crate::out::print(&table::render(&report))?;
    crate::note!(
        "simulated {} requests x {} in {wall:.1} s",
        workload.requests.len(),
        runs(&config)
    );
    if let Some(path) = &args.json {
        crate::report_file::write_json(path, &report)?;
    }
    if let Some(path) = &args.plot {
        plot::write_svg(&report, path).with_context(|| format!("--plot {}", path.display()))?;
    }
    Ok(())
}

/// `simulate --load`: the sweep's table, JSON and plot.
fn run_sweep(args: &SimulateArgs, workload: &SimWorkload) -> Result<()> {
    let WorkloadSource::Generated { spec } = &workload.source else {
        anyhow::bail!("--load needs a generated workload (--workload NAME), not --trace");
    };
    let config = sim_config(args, workload)?;
    let started = Instant::now();
    let mut bar = DelayedBar::new();
    let sweep = load_sweep(&workload.name, spec, &config, &args.load, &mut |_, p| {
        bar.update(p)
    });
    bar.finish();
    let sweep = sweep?;
    crate::out::print(&format!(
        "Workload: {} ({} requests), {} x {}, loads {:?}\n",
        workload.name,
        workload.requests.len(),
        config.instances,
        config.preset,
        args.load
    ))?;
    crate::out::print(&sweep::render(&sweep))?;
    crate::note!(
        "simulated {} loads x {} (and the capacity run) in {:.1} s",
        args.load.len(),
        runs(&config),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        crate::report_file::write_json(path, &sweep)?;
    }
    if let Some(path) = &args.plot {
        plot::write_load_svg(&sweep, path).with_context(|| format!("--plot {}", path.display()))?;
    }
    Ok(())
}

/// What each load (or the one run) simulated: "4 strategies", "3 strategies and the clairvoyant
/// reference".
fn runs(config: &SimConfig) -> String {
    let n = config.strategies.len();
    let s = if n == 1 { "strategy" } else { "strategies" };
    if config.clairvoyant {
        format!("{n} {s} and the clairvoyant reference")
    } else {
        format!("{n} {s}")
    }
}

/// `--write-trace`: the requests as our JSONL.
fn write_trace(path: &Path, requests: &[Request]) -> Result<()> {
    let file = std::fs::File::create(path)
        .with_context(|| format!("--write-trace: cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    trace::write_jsonl(requests, &mut out)
        .and_then(|()| std::io::Write::flush(&mut out))
        .with_context(|| format!("--write-trace: cannot write {}", path.display()))?;
    crate::note!("wrote {} requests to {}", requests.len(), path.display());
    Ok(())
}

/// The simulator settings the flags ask for.
fn sim_config(args: &SimulateArgs, workload: &SimWorkload) -> Result<SimConfig> {
    let prefix_length = PrefixLength::new(args.prefix_length).context("--prefix-length")?;
    let threshold = args
        .concurrency_threshold
        .map(|t| ConcurrencyThreshold::new(u64::from(t)))
        .transpose()
        .context("--concurrency-threshold")?;
    let strategies = args
        .strategies
        .iter()
        .map(|&kind| {
            let mut s = StrategyConfig::new(kind);
            if let Some(t) = threshold {
                s.concurrency_threshold = t;
            }
            s.overflow = args.overflow.into();
            s.balance_factor = args.balance_factor;
            s
        })
        .collect::<Vec<_>>();
    let mut strategies = strategies;
    crate::args::apply_strategy_params(&mut strategies, &args.strategy_params)?;
    let driver = match (&workload.source, args.concurrency) {
        (_, Some(clients)) => Driver::ClosedLoop { clients },
        (WorkloadSource::Generated { spec }, None) => match spec.arrival {
            Arrival::Closed { clients } => Driver::ClosedLoop { clients },
            Arrival::Poisson { .. } => Driver::OpenLoop,
        },
        (WorkloadSource::Trace { .. }, None) => Driver::OpenLoop,
    };
    Ok(SimConfig {
        preset: args.preset.clone(),
        instances: args.instances,
        strategies,
        prefix_length,
        seed: args.seed,
        driver,
        scale: args.scale.clone().map(|s| s.0).unwrap_or_default(),
        hit_rate_buckets: HIT_RATE_BUCKETS,
        kv_events: KvEventModel {
            delay_s: args.kv_event_delay_ms / 1e3,
            loss: args.kv_event_loss,
        },
        routers: RouterModel {
            replicas: args.replicas,
            scrape: args.engine_queues.then(|| ScrapeModel {
                interval_s: args.scrape_interval_ms / 1e3,
                delay_s: args.scrape_delay_ms / 1e3,
                stale_after_s: args.scrape_stale_ms / 1e3,
            }),
        },
        prewarm: args.prewarm.then(PrewarmConfig::default),
        clairvoyant: args.clairvoyant,
    })
}

/// Generates the named workload or reads the trace, applying `--requests`, `--rate` and
/// `--concurrency` (a trace's arrivals are rescaled to `--rate`, as `bench` sends them).
fn load_workload(args: &SimulateArgs) -> Result<SimWorkload> {
    match &args.trace {
        Some(path) => {
            let mut workload = workload_flags::trace(path, args.requests)?;
            if let Some(rate) = args.rate {
                prefix_router_loadgen::schedule::rescale_arrivals(&mut workload.requests, rate);
            }
            Ok(workload)
        }
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
