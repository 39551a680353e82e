//! `prefix-router analyze TRACE`: reads the flags and today's config, runs the analysis, prints
//! it and writes the JSON and SVG asked for.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use prefix_router_analyze::{
    analyze, plot, render, AnalyzeConfig, Input, Objective, Setting, MAX_RATE_FACTOR,
};
use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_server::settings::{read_fields, DEFAULT_STRATEGY};

use crate::progress::DelayedBar;

/// The percentile settings are ranked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObjectiveArg {
    /// Median TTFT.
    P50,
    /// 90th-percentile TTFT.
    P90,
    /// 99th-percentile TTFT.
    P99,
}

/// Flags of `analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// The trace: our JSONL, serve's --access-log, Mooncake's JSONL, ShareGPT, or a JSONL of
    /// OpenAI request bodies (one a line, optional `timestamp` in seconds and
    /// `prompt_cache_key`). The format is detected.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// Today's router config (serve's TOML): its strategy, prefix length and instance count are
    /// "today's setting". Without it, serve's defaults.
    #[arg(long, value_name = "FILE")]
    pub current: Option<PathBuf>,

    /// Instances in the fleet (default: --current's instance list, else 7).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub instances: Option<u32>,

    /// Engine preset of every instance (see `prefix-router presets`).
    #[arg(long, value_name = "P", default_value = crate::args::DEFAULT_PRESET)]
    pub preset: String,

    /// Arrival rates to sweep, as multiples of the trace's own (or --rate's), comma-separated,
    /// each within (0, 16].
    #[arg(
        long,
        value_name = "a,b,...",
        value_delimiter = ',',
        default_value = "1,1.5,2",
        value_parser = parse_factor
    )]
    pub rates: Vec<f64>,

    /// Replay the trace at a mean of R requests per second (timestamps rescaled, their shape
    /// kept) instead of its own: for traces without timestamps (OpenAI bodies arrive one a
    /// second) or to ask about another load.
    #[arg(long, value_name = "R", value_parser = crate::args::parse_rate)]
    pub rate: Option<f64>,

    /// The TTFT percentile settings are ranked on (geometric mean over the rates).
    #[arg(long, value_enum, default_value = "p90")]
    pub objective: ObjectiveArg,

    /// Use the first N requests of the trace (by arrival).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: Option<u64>,

    /// Seed of the router's random choices in every simulation.
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub seed: u64,

    /// Simulations run at once (default: one per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,

    /// Write the whole analysis as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write the sweep and the TTFT CDFs as an SVG to this file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

/// Runs `analyze`.
pub fn run(args: AnalyzeArgs) -> Result<()> {
    let started = Instant::now();
    crate::report_file::check_folders(&[
        ("--json", args.json.as_deref()),
        ("--plot", args.plot.as_deref()),
    ])?;
    let mut input = Input::load(&args.trace)?;
    if let Some(n) = args.requests {
        input.truncate(usize::try_from(n).unwrap_or(usize::MAX));
    }
    if let Some(rate) = args.rate {
        prefix_router_loadgen::schedule::rescale_arrivals(&mut input.requests, rate);
    }
    let (current, source, listed) = current_setting(&args)?;
    let instances = args
        .instances
        .or(listed)
        .unwrap_or(crate::args::DEFAULT_INSTANCES);
    let mut config = AnalyzeConfig::new(args.preset.clone(), instances, current);
    config.current_source = source;
    config.rate_factors = args.rates.clone();
    config.objective = match args.objective {
        ObjectiveArg::P50 => Objective::P50,
        ObjectiveArg::P90 => Objective::P90,
        ObjectiveArg::P99 => Objective::P99,
    };
    config.seed = args.seed;
    if let Some(t) = args.threads {
        config.threads = t as usize;
    }
    let mut bar = DelayedBar::new();
    let analysis = analyze(&input, &config, &mut |s| {
        bar.update_raw(s.done as u64, s.total as u64, s.setting)
    });
    bar.finish();
    let analysis = analysis?;
    crate::out::print(&render::text(&analysis))?;
    crate::note!(
        "analyzed {} requests: {} simulations in {:.1} s",
        input.requests.len(),
        analysis.outcomes.len() + analysis.fleet_sizes.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        crate::report_file::write_json(path, &analysis)?;
    }
    if let Some(path) = &args.plot {
        plot::write_svg(&analysis, path).with_context(|| format!("--plot {}", path.display()))?;
    }
    Ok(())
}

fn parse_factor(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= MAX_RATE_FACTOR => Ok(f),
        _ => Err(format!(
            "each rate is a multiple of the trace's rate within (0, {MAX_RATE_FACTOR}], got '{s}'"
        )),
    }
}

/// Today's setting, where it came from, and the config's instance count (if it lists any).
fn current_setting(args: &AnalyzeArgs) -> Result<(Setting, String, Option<u32>)> {
    let Some(path) = &args.current else {
        let kind = StrategyKind::named(DEFAULT_STRATEGY).with_context(|| {
            format!("the default strategy {DEFAULT_STRATEGY} is not registered")
        })?;
        return Ok((
            Setting::new(StrategyConfig::new(kind), PrefixLength::default()),
            "serve's defaults".into(),
            None,
        ));
    };
    let settings = read_fields(path).with_context(|| format!("--current {}", path.display()))?;
    settings
        .routing
        .strategy
        .build()
        .with_context(|| format!("--current {}: routing", path.display()))?;
    let listed = u32::try_from(settings.instances.len())
        .ok()
        .filter(|n| *n > 0);
    Ok((
        Setting::new(settings.routing.strategy, settings.routing.prefix_length),
        path.display().to_string(),
        listed,
    ))
}
