//! `prefix-router analyze`: what routing buys on a team's own traffic, and the settings to use.
//!
//! From a trace (any format `simulate` replays, the router's access log included) it profiles
//! the traffic itself ([`traffic`]: shared openings, hottest prefixes, the oracle hit rate,
//! reuse distance against the fleet's caches, tenants, and whether `prefix-aware`'s key
//! collapses the traffic onto one bucket), then replays the trace in the simulator over a grid
//! of settings ([`grid`]) at the trace's own arrival times and faster ([`sweep`]), scores each
//! setting on a TTFT percentile over all rates, recommends the best beside today's setting,
//! and shows what one instance more or less would change.
//!
//! The figures are the engine model's ([`TRUST`] says how far that goes); the CLI only parses
//! flags and prints [`render::text`], the JSON of [`Analysis`] or [`plot::write_svg`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod grid;
pub mod input;
pub mod keys;
pub mod observed;
pub mod plot;
pub mod render;
pub mod reuse;
pub mod sweep;
pub mod traffic;

pub use error::AnalyzeError;
pub use grid::Setting;
pub use input::Input;
pub use observed::Observed;
pub use sweep::Outcome;
pub use traffic::Traffic;

use prefix_router_sim::engine_config;

use crate::sweep::{Job, Sweep};

/// How far to trust the figures, printed with every analysis.
pub const TRUST: &str =
    "These figures come from the simulator's engine model, not from your GPUs. \
Its hit rates and TTFT percentiles agreed with real HTTP runs through the router and mock engines \
within 0.6 points and 0.2% at P50 on the demo's workload (README, 'What the demo shows'; CI checks \
5 points and 20% in crates/cli/tests/demo_agreement.rs). Its latencies follow the preset's cost model \
(README, 'How the calibration works'), so trust the ranking of settings and the hit rates more than the absolute \
milliseconds; confirm the choice with `prefix-router bench --trace` against your fleet.";

/// A current setting within this fraction of the best score is kept: a gain smaller than the
/// engine model's error is no reason to change a running router.
pub const KEEP_MARGIN: f64 = 0.02;

/// The fastest rate a sweep tries, as a multiple of the trace's own.
pub const MAX_RATE_FACTOR: f64 = 16.0;

/// Which TTFT percentile the settings are ranked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The median.
    P50,
    /// The 90th percentile (the default: the tail most users feel, steadier than P99).
    P90,
    /// The 99th percentile.
    P99,
}

impl Objective {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Objective::P50 => "p50",
            Objective::P90 => "p90",
            Objective::P99 => "p99",
        }
    }
    /// Its value in an outcome, ms.
    pub fn of(self, o: &Outcome) -> f64 {
        match self {
            Objective::P50 => o.ttft_ms.p50,
            Objective::P90 => o.ttft_ms.p90,
            Objective::P99 => o.ttft_ms.p99,
        }
    }
}

/// What an analysis runs on.
#[derive(Debug, Clone)]
pub struct AnalyzeConfig {
    /// Engine preset of every instance.
    pub preset: String,
    /// Instances in the fleet.
    pub instances: u32,
    /// Today's setting.
    pub current: Setting,
    /// Where today's setting came from (a config file, or serve's defaults).
    pub current_source: String,
    /// Arrival rates to try, as multiples of the trace's own (run in ascending order).
    pub rate_factors: Vec<f64>,
    /// Fleet sizes to try for the recommended setting, as differences from `instances`.
    pub fleet_deltas: Vec<i32>,
    /// The percentile settings are ranked on.
    pub objective: Objective,
    /// Router seed of every simulation.
    pub seed: u64,
    /// Simulations run at once.
    pub threads: usize,
}

impl AnalyzeConfig {
    /// The defaults around `current`: the trace's rate, 1.5x and 2x; N-2..N+2; P90.
    pub fn new(preset: impl Into<String>, instances: u32, current: Setting) -> Self {
        AnalyzeConfig {
            preset: preset.into(),
            instances,
            current,
            current_source: "serve's defaults".into(),
            rate_factors: vec![1.0, 1.5, 2.0],
            fleet_deltas: vec![-2, -1, 1, 2],
            objective: Objective::P90,
            seed: 1,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Where the fleet's engines stand.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fleet {
    /// Engine preset.
    pub preset: String,
    /// Instances.
    pub instances: u32,
    /// Tokens a KV block.
    pub block_tokens: u32,
    /// One instance's prefix cache, tokens.
    pub cache_tokens: u64,
}

/// The whole analysis.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Analysis {
    /// Where the trace came from.
    pub trace: String,
    /// The format it was read as.
    pub format: String,
    /// The fleet simulated.
    pub fleet: Fleet,
    /// The traffic itself.
    pub traffic: Traffic,
    /// What the router saw, when the trace is its access log.
    pub observed: Option<Observed>,
    /// Every setting tried (outcomes index them).
    pub settings: Vec<Setting>,
    /// Rates tried, as multiples of the trace's own.
    pub rate_factors: Vec<f64>,
    /// Every setting at every rate on the fleet as it is.
    pub outcomes: Vec<Outcome>,
    /// The recommended setting on other fleet sizes, at every rate.
    pub fleet_sizes: Vec<Outcome>,
    /// What settings are ranked on.
    pub objective: Objective,
    /// Each setting's score: the geometric mean over the rates of its objective, ms.
    pub scores: Vec<f64>,
    /// The recommended setting.
    pub recommended: usize,
    /// Today's setting.
    pub current: usize,
    /// Where today's setting came from.
    pub current_source: String,
    /// Why the recommendation is what it is.
    pub reason: String,
    /// How far to trust the figures.
    pub trust: &'static str,
}

impl Analysis {
    /// The outcome of `setting` at the rate of index `rate` on the fleet as it is.
    pub fn outcome(&self, setting: usize, rate: usize) -> Option<&Outcome> {
        let factor = *self.rate_factors.get(rate)?;
        self.outcomes
            .iter()
            .find(|o| o.setting == setting && o.rate_factor == factor)
    }
}

/// Where an analysis is: `done` of `total` simulations, the last one's setting.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    /// Simulations finished.
    pub done: usize,
    /// Simulations in all.
    pub total: usize,
    /// The setting just simulated.
    pub setting: &'a str,
}

/// Analyzes `input` on `config`'s fleet; `progress` sees each finished simulation.
pub fn analyze(
    input: &Input,
    config: &AnalyzeConfig,
    progress: &mut dyn FnMut(Step<'_>),
) -> Result<Analysis, AnalyzeError> {
    let invalid = |field, why: String| AnalyzeError::InvalidConfig { field, why };
    if config.instances == 0 {
        return Err(invalid("instances", "must be at least 1".into()));
    }
    if let Some(bad) = config
        .rate_factors
        .iter()
        .find(|f| !(f.is_finite() && **f > 0.0 && **f <= MAX_RATE_FACTOR))
    {
        return Err(invalid(
            "rates",
            format!("each must be within (0, {MAX_RATE_FACTOR}] times the trace's rate, got {bad}"),
        ));
    }
    if config.rate_factors.is_empty() {
        return Err(invalid("rates", "at least one is needed".into()));
    }
    // Ascending, each once: the first is the one the plot's CDFs and "today" rows lead with.
    let mut rate_factors = config.rate_factors.clone();
    rate_factors.sort_by(f64::total_cmp);
    rate_factors.dedup();
    let rate_factors = &rate_factors;
    if input.requests.len() < 2 || input.span_s() <= 0.0 {
        return Err(invalid(
            "trace",
            format!(
                "{} holds {} request(s) over {:.3} s: a rate needs at least two requests at different times",
                input.label,
                input.requests.len(),
                input.span_s()
            ),
        ));
    }
    let engine = engine_config(&config.preset).map_err(|source| AnalyzeError::Sim {
        setting: "the engine preset".into(),
        source,
    })?;
    let cache_tokens = u64::from(engine.kv_capacity_blocks) * u64::from(engine.block_tokens);
    let settings = grid::grid(&config.current);
    let current = settings
        .iter()
        .position(|s| s.same_as(&config.current))
        .unwrap_or(settings.len() - 1);
    let format = input.format.map_or("in memory", |f| f.name());
    // The profile and the sweep's keys and chains each read the whole trace once: side by side.
    let (traffic, sweep) = std::thread::scope(|scope| {
        let profile = scope.spawn(|| {
            traffic::profile(
                input,
                engine.block_tokens,
                cache_tokens,
                config.instances,
                config.current.prefix_length,
            )
        });
        let sweep = Sweep::new(input, &settings, rate_factors, &config.preset, config.seed);
        (profile.join(), sweep)
    });
    let traffic = traffic.map_err(|_| invalid("trace", "profiling the traffic panicked".into()))?;
    let mut sweep = sweep?;
    sweep.oracle_hit_rate = Some(traffic.oracle_hit_rate);
    let fleet_sizes: Vec<u32> = config
        .fleet_deltas
        .iter()
        .filter_map(|d| u32::try_from(i64::from(config.instances) + i64::from(*d)).ok())
        .filter(|n| *n >= 1 && *n != config.instances)
        .collect();
    let mut jobs: Vec<Job> = (0..rate_factors.len())
        .flat_map(|rate| {
            (0..settings.len()).map(move |setting| Job {
                setting,
                rate,
                instances: config.instances,
            })
        })
        .collect();
    // Longest first, so no thread idles at the end behind one slow run: strategies that read
    // chains cost the most.
    jobs.sort_by_key(|j| std::cmp::Reverse(settings[j.setting].reads_chains()));
    let total = jobs.len() + fleet_sizes.len() * rate_factors.len();
    let outcomes = sweep.run(&jobs, config.threads, &mut |done, _, setting| {
        progress(Step {
            done,
            total,
            setting,
        })
    })?;

    let scores: Vec<f64> = (0..settings.len())
        .map(|s| {
            let values: Vec<f64> = outcomes
                .iter()
                .filter(|o| o.setting == s)
                .map(|o| config.objective.of(o).max(1e-6))
                .collect();
            (values.iter().map(|v| v.ln()).sum::<f64>() / values.len().max(1) as f64).exp()
        })
        .collect();
    let best = (0..settings.len())
        .min_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)))
        .unwrap_or(current);
    let (recommended, reason) = if best == current {
        (
            current,
            "today's setting is the best of the sweep".to_string(),
        )
    } else if scores[current] <= scores[best] * (1.0 + KEEP_MARGIN) {
        (
            current,
            format!(
                "today's setting is within {:.0}% of the best ({}): not worth a change",
                KEEP_MARGIN * 100.0,
                settings[best].label()
            ),
        )
    } else {
        (
            best,
            format!(
                "lowest TTFT {} over {} rates (geometric mean {:.1} ms against today's {:.1} ms)",
                config.objective.name(),
                rate_factors.len(),
                scores[best],
                scores[current]
            ),
        )
    };

    let fleet_jobs: Vec<Job> = fleet_sizes
        .iter()
        .flat_map(|&instances| {
            (0..rate_factors.len()).map(move |rate| Job {
                setting: recommended,
                rate,
                instances,
            })
        })
        .collect();
    let offset = jobs.len();
    let fleet_outcomes = sweep.run(&fleet_jobs, config.threads, &mut |done, _, setting| {
        progress(Step {
            done: offset + done,
            total,
            setting,
        })
    })?;

    Ok(Analysis {
        trace: input.label.clone(),
        format: format.to_string(),
        fleet: Fleet {
            preset: config.preset.clone(),
            instances: config.instances,
            block_tokens: engine.block_tokens,
            cache_tokens,
        },
        traffic,
        observed: input.observed(),
        settings,
        rate_factors: rate_factors.clone(),
        outcomes,
        fleet_sizes: fleet_outcomes,
        objective: config.objective,
        scores,
        recommended,
        current,
        current_source: config.current_source.clone(),
        reason,
        trust: TRUST,
    })
}
