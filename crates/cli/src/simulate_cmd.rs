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

/// Workload used when neither `--workload` nor `--trace` is given: the published experiment.
pub const DEFAULT_WORKLOAD: &str = "long-context";

/// Buckets of the hit-rate-over-time series.
const HIT_RATE_BUCKETS: usize = 50;

/// Runs `simulate`.
pub fn run(args: SimulateArgs) -> Result<()> {
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
    eprintln!(
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
    eprintln!(
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
    eprintln!("wrote {} requests to {}", requests.len(), path.display());
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
/// `--concurrency`.
fn load_workload(args: &SimulateArgs) -> Result<SimWorkload> {
    if let Some(path) = &args.trace {
        return load_trace(args, path);
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
    Ok(SimWorkload {
        name: name.to_string(),
        source: WorkloadSource::Generated { spec },
        requests,
    })
}

fn load_trace(args: &SimulateArgs, path: &Path) -> Result<SimWorkload> {
    let (format, mut requests) =
        trace::load_trace_as(path).with_context(|| format!("--trace {}", path.display()))?;
    let format = format.name();
    if let Some(n) = args.requests {
        requests.truncate(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(rate) = args.rate {
        rescale_arrivals(&mut requests, rate);
    }
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(SimWorkload {
        name,
        source: WorkloadSource::Trace {
            path: path.display().to_string(),
            format: format.into(),
        },
        requests,
    })
}

/// Stretches or squeezes arrival times (keeping their shape) so the mean rate becomes `rate`:
/// the load generator's own open-loop schedule, so `simulate` and `bench` replay a trace at the
/// same times.
pub(crate) fn rescale_arrivals(requests: &mut [Request], rate: f64) {
    // A single request, or one instant for all, has no rate to set: left as it is.
    let (Some(first), Some(last)) = (requests.first(), requests.last()) else {
        return;
    };
    if last.arrival_s <= first.arrival_s {
        return;
    }
    let offsets = prefix_router_loadgen::schedule::send_offsets(requests, Some(rate));
    for (r, at) in requests.iter_mut().zip(offsets) {
        r.arrival_s = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(times: &[f64]) -> Vec<Request> {
        times
            .iter()
            .enumerate()
            .map(|(i, &t)| Request {
                id: i as u64,
                arrival_s: t,
                group: None,
                model: None,
                messages: Vec::new(),
                output_tokens: 1,
            })
            .collect()
    }

    #[test]
    fn rescaling_keeps_the_shape_and_sets_the_mean_rate() {
        let mut r = at(&[10.0, 11.0, 13.0, 14.0]);
        rescale_arrivals(&mut r, 1.0);
        let t: Vec<f64> = r.iter().map(|r| r.arrival_s).collect();
        // 3 gaps over 4 s become 3 gaps over 3 s (mean 1 per second), same proportions.
        assert_eq!(t, vec![0.0, 0.75, 2.25, 3.0]);
    }

    #[test]
    fn rescaling_leaves_degenerate_traces_alone() {
        let mut one = at(&[5.0]);
        rescale_arrivals(&mut one, 2.0);
        assert_eq!(one[0].arrival_s, 5.0);
        let mut same = at(&[2.0, 2.0]);
        rescale_arrivals(&mut same, 2.0);
        assert_eq!((same[0].arrival_s, same[1].arrival_s), (2.0, 2.0));
    }
}
