//! Runs the settings through the simulator: every setting at every rate, in parallel over the
//! machine's cores. Each run is one strategy on a fresh simulated fleet, seeded, so the result
//! does not depend on how many threads ran it or in what order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use prefix_router_core::{KeyHash, PrefixLength};
use prefix_router_sim::run::Chains;
use prefix_router_sim::stats::LatencySummary;
use prefix_router_sim::{
    routing_keys, simulate_keyed, Driver, Prepared, SimConfig, SimWorkload, WorkloadSource,
};
use prefix_router_workload::Request;

use crate::grid::Setting;
use crate::{AnalyzeError, Input};

/// One simulation to run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// Index of the setting.
    pub setting: usize,
    /// Index of the arrival rate (into the sweep's rate factors).
    pub rate: usize,
    /// Instances in the fleet.
    pub instances: u32,
}

/// What one simulation gave.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Outcome {
    /// Index of the setting.
    pub setting: usize,
    /// The rate as a multiple of the trace's own.
    pub rate_factor: f64,
    /// Requests per second that is.
    pub rate_rps: f64,
    /// Instances.
    pub instances: u32,
    /// Prompt tokens served from the engines' caches over all prompt tokens.
    pub hit_rate: f64,
    /// Time to first token, ms.
    pub ttft_ms: LatencySummary,
    /// The busiest instance's share of requests.
    pub max_share: f64,
    /// Requests sent away from their preferred instance because it was busy.
    pub overflow_rate: f64,
    /// Completed requests per second.
    pub throughput_rps: f64,
    /// TTFT percentiles 0..=100, ms (a CDF).
    pub ttft_percentiles_ms: Vec<f64>,
    /// The fleet completed under [`OVERLOADED_BELOW`] of the offered rate: a queue grew for the
    /// whole run, so its TTFT measures how long the trace is, not a level the fleet holds.
    pub overloaded: bool,
}

/// Completed over offered requests per second under which a run is [overloaded](Outcome): the
/// backlog took longer to drain than the arrivals took to come (a fleet that keeps up
/// completes at the offered rate, less the last requests' own time).
pub const OVERLOADED_BELOW: f64 = 0.5;

/// What every run shares.
pub struct Sweep<'a> {
    /// The settings (jobs index them).
    pub settings: &'a [Setting],
    /// The trace's requests at each rate factor.
    pub workloads: Vec<(f64, SimWorkload)>,
    /// The trace's own rate, requests per second.
    pub base_rate_rps: f64,
    /// Engine preset.
    pub preset: &'a str,
    /// Router seed.
    pub seed: u64,
    /// The trace's oracle hit rate, once the traffic profile has it (each run's report then
    /// takes it instead of computing it again).
    pub oracle_hit_rate: Option<f64>,
    keys: HashMap<usize, Vec<KeyHash>>,
    chains: Vec<Chains>,
}

impl<'a> Sweep<'a> {
    /// Prepares the workloads at `rate_factors` (arrival times divided by each) and the routing
    /// keys at every prefix length the settings use (derived once, shared by every run).
    pub fn new(
        input: &Input,
        settings: &'a [Setting],
        rate_factors: &[f64],
        preset: &'a str,
        seed: u64,
    ) -> Result<Self, AnalyzeError> {
        let (requests, label) = (&input.requests, &input.label);
        let format = input.format.map_or("in memory", |f| f.name());
        let workloads = rate_factors
            .iter()
            .map(|&f| {
                let requests = requests
                    .iter()
                    .map(|r| Request {
                        arrival_s: r.arrival_s / f,
                        ..r.clone()
                    })
                    .collect();
                let workload = SimWorkload {
                    name: format!("{label} at {f}x"),
                    requests,
                    source: WorkloadSource::Trace {
                        path: label.to_string(),
                        format: format.to_string(),
                    },
                };
                (f, workload)
            })
            .collect::<Vec<_>>();
        let mut keys = HashMap::new();
        for s in settings {
            if keys.contains_key(&s.prefix_length) {
                continue;
            }
            let config = sim_config(s, 1, preset, seed)?;
            let k = routing_keys(requests, &config).map_err(|source| AnalyzeError::Sim {
                setting: s.label(),
                source,
            })?;
            keys.insert(s.prefix_length, k);
        }
        // Chains are cut once per spec (all `cache-aware` variants share one unless a setting
        // changes `block-chars` or `max-chars`).
        let mut chains: Vec<Chains> = Vec::new();
        for s in settings {
            // Built here only to report a setting that does not build, by its label.
            s.config.build().map_err(|e| AnalyzeError::InvalidConfig {
                field: "current",
                why: format!("{}: {e}", s.label()),
            })?;
            let Some(spec) = s.chain_spec else { continue };
            if chains.iter().any(|c| c.spec == spec) {
                continue;
            }
            chains.push(
                Chains::derive(requests, spec).map_err(|source| AnalyzeError::Sim {
                    setting: s.label(),
                    source,
                })?,
            );
        }
        Ok(Sweep {
            chains,
            settings,
            workloads,
            base_rate_rps: input.rate_rps(),
            preset,
            seed,
            oracle_hit_rate: None,
            keys,
        })
    }

    /// Runs `jobs` on `threads` threads; `progress(done, total, label)` is called on the calling
    /// thread after each. Outcomes come back in the order of `jobs`.
    pub fn run(
        &self,
        jobs: &[Job],
        threads: usize,
        progress: &mut dyn FnMut(usize, usize, &str),
    ) -> Result<Vec<Outcome>, AnalyzeError> {
        let next = AtomicUsize::new(0);
        let mut results: Vec<Option<Result<Outcome, AnalyzeError>>> =
            (0..jobs.len()).map(|_| None).collect();
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            for _ in 0..threads.clamp(1, jobs.len().max(1)) {
                let (tx, next) = (tx.clone(), &next);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    if tx.send((i, self.run_one(*job))).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            // Outcomes are gathered here, on the calling thread, which also reports progress.
            for (done, (i, outcome)) in rx.iter().enumerate() {
                let label = jobs
                    .get(i)
                    .and_then(|j| self.settings.get(j.setting))
                    .map(Setting::label)
                    .unwrap_or_default();
                progress(done + 1, jobs.len(), &label);
                results[i] = Some(outcome);
            }
        });
        // A worker that panicked takes the scope (and this call) with it, so every slot is set.
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or(Err(AnalyzeError::InvalidConfig {
                    field: "threads",
                    why: "a simulation did not finish".into(),
                }))
            })
            .collect()
    }

    fn run_one(&self, job: Job) -> Result<Outcome, AnalyzeError> {
        let setting = self
            .settings
            .get(job.setting)
            .ok_or(AnalyzeError::InvalidConfig {
                field: "setting",
                why: format!("no setting {}", job.setting),
            })?;
        let (factor, workload) =
            self.workloads
                .get(job.rate)
                .ok_or(AnalyzeError::InvalidConfig {
                    field: "rates",
                    why: format!("no rate {}", job.rate),
                })?;
        let keys = self
            .keys
            .get(&setting.prefix_length)
            .ok_or(AnalyzeError::InvalidConfig {
                field: "prefix_length",
                why: format!("no keys at {}", setting.prefix_length),
            })?;
        let sim_err = |source| AnalyzeError::Sim {
            setting: format!(
                "{} on {} instances at {factor}x",
                setting.label(),
                job.instances
            ),
            source,
        };
        let config = sim_config(setting, job.instances, self.preset, self.seed)?;
        let chains = self
            .chains
            .iter()
            .find(|c| Some(c.spec) == setting.chain_spec);
        let prepared = Prepared {
            keys,
            chains,
            oracle_hit_rate: self.oracle_hit_rate,
        };
        let report = simulate_keyed(workload, &config, prepared, &mut |_| {}).map_err(sim_err)?;
        let r = report.results.first().ok_or(AnalyzeError::InvalidConfig {
            field: "setting",
            why: "the simulation returned no result".into(),
        })?;
        Ok(Outcome {
            setting: job.setting,
            rate_factor: *factor,
            rate_rps: self.base_rate_rps * factor,
            instances: job.instances,
            hit_rate: r.kv_hit_rate,
            ttft_ms: r.ttft_ms,
            max_share: r.instance_share.iter().copied().fold(0.0, f64::max),
            overflow_rate: r.overflow_rate,
            throughput_rps: r.throughput_rps,
            ttft_percentiles_ms: r.ttft_percentiles_ms.clone(),
            overloaded: r.throughput_rps < OVERLOADED_BELOW * self.base_rate_rps * factor,
        })
    }
}

fn sim_config(
    setting: &Setting,
    instances: u32,
    preset: &str,
    seed: u64,
) -> Result<SimConfig, AnalyzeError> {
    let prefix_length = PrefixLength::new(setting.prefix_length as u64).map_err(|e| {
        AnalyzeError::InvalidConfig {
            field: "prefix_length",
            why: e.to_string(),
        }
    })?;
    Ok(SimConfig {
        preset: preset.to_string(),
        instances,
        strategies: vec![setting.config.clone()],
        prefix_length,
        seed,
        driver: Driver::OpenLoop,
        scale: Vec::new(),
        hit_rate_buckets: 1,
        kv_events: Default::default(),
        routers: Default::default(),
        prewarm: None,
        clairvoyant: false,
    })
}
