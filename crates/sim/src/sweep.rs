//! The load sweep: the same generated workload at open-loop rates that are fractions of the
//! fleet's measured capacity, every strategy at each.
//!
//! Capacity is measured, not assumed: the workload's requests are replayed closed loop with
//! [`CAPACITY_CLIENTS_PER_INSTANCE`] clients per instance (enough to keep every engine's batch
//! full) through `least-outstanding`, a cache-blind balancer, and the completed requests per
//! second of that run is the capacity. A load of 0.8 is then Poisson arrivals at 0.8 times that
//! rate. Cache-aware strategies can exceed a load of 1 of this capacity (hits make requests
//! cheaper); that is the point of measuring it without them.

use prefix_router_core::{StrategyConfig, StrategyKind};
use prefix_router_workload::{generators, Arrival, WorkloadSpec};

use crate::clairvoyant::CLAIRVOYANT_NOTE;
use crate::{simulate, Driver, Progress, Report, SimConfig, SimError, SimWorkload, WorkloadSource};

/// Closed-loop clients per instance of the capacity run.
pub const CAPACITY_CLIENTS_PER_INSTANCE: u32 = 64;

/// One load of the sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadPoint {
    /// Fraction of the measured capacity.
    pub load: f64,
    /// The open-loop rate that is, requests per second.
    pub rate_rps: f64,
    /// Every strategy at that rate.
    pub report: Report,
}

/// The whole sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadSweep {
    /// Measured capacity, requests per second.
    pub capacity_rps: f64,
    /// How it was measured.
    pub capacity_method: String,
    /// One entry per load, in the order asked.
    pub points: Vec<LoadPoint>,
}

/// Runs the sweep of `spec` (its arrival process is replaced) on `config`'s fleet and
/// strategies (its driver is replaced). `progress` sees each simulation; `load` says which
/// (`None` while capacity is measured).
pub fn load_sweep(
    name: &str,
    spec: &WorkloadSpec,
    config: &SimConfig,
    loads: &[f64],
    progress: &mut dyn FnMut(Option<f64>, Progress<'_>),
) -> Result<LoadSweep, SimError> {
    if let Some(bad) = loads
        .iter()
        .find(|l| !(l.is_finite() && **l > 0.0 && **l <= 4.0))
    {
        return Err(SimError::InvalidConfig {
            field: "load",
            why: format!("each load must be within (0, 4] of capacity, got {bad}"),
        });
    }
    let workload = |arrival: Arrival| {
        let mut spec = spec.clone();
        spec.arrival = arrival;
        SimWorkload {
            name: name.to_string(),
            requests: generators::generate(&spec).collect(),
            source: WorkloadSource::Generated { spec },
        }
    };
    let clients = config
        .instances
        .saturating_mul(CAPACITY_CLIENTS_PER_INSTANCE);
    let blind = StrategyKind::named("least-outstanding").ok_or(SimError::InvalidConfig {
        field: "load",
        why: "least-outstanding is not registered".into(),
    })?;
    let capacity_config = SimConfig {
        strategies: vec![StrategyConfig::new(blind)],
        driver: Driver::ClosedLoop { clients },
        clairvoyant: false,
        ..config.clone()
    };
    let capacity = simulate(
        &workload(Arrival::Closed { clients }),
        &capacity_config,
        &mut |p| progress(None, p),
    )?;
    let capacity_rps = capacity
        .results
        .first()
        .map(|r| r.throughput_rps)
        .filter(|r| r.is_finite() && *r > 0.0)
        .ok_or(SimError::InvalidConfig {
            field: "load",
            why: "the capacity run completed nothing".into(),
        })?;
    let open = SimConfig {
        driver: Driver::OpenLoop,
        ..config.clone()
    };
    let mut points = Vec::with_capacity(loads.len());
    for &load in loads {
        let rate_rps = load * capacity_rps;
        let report = simulate(
            &workload(Arrival::Poisson { rate: rate_rps }),
            &open,
            &mut |p| progress(Some(load), p),
        )?;
        points.push(LoadPoint {
            load,
            rate_rps,
            report,
        });
    }
    Ok(LoadSweep {
        capacity_rps,
        capacity_method: format!(
            "requests per second completed by least-outstanding, closed loop with {clients} clients ({CAPACITY_CLIENTS_PER_INSTANCE} per instance), same requests and fleet"
        ),
        points,
    })
}

/// The sweep as a table: one row per load and strategy.
pub fn render(sweep: &LoadSweep) -> String {
    let mut out = format!(
        "Capacity: {:.2} req/s ({})\n\n{:<6} {:>8}  {:<18} {:>11} {:>11} {:>11} {:>9} {:>10}\n",
        sweep.capacity_rps,
        sweep.capacity_method,
        "load",
        "req/s",
        "strategy",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TTFT p99 ms",
        "hit rate",
        "max share"
    );
    for p in &sweep.points {
        if let Some(floor) = &p.report.ttft_floor_ms {
            out.push_str(&format!(
                "{:<6} {:>8.2}  {:<18} {:>11.1} {:>11.1} {:>11.1}\n",
                p.load, p.rate_rps, "floor (any router)", floor.p50, floor.p90, floor.p99
            ));
        }
        for r in &p.report.results {
            let max_share = r.instance_share.iter().copied().fold(0.0, f64::max);
            out.push_str(&format!(
                "{:<6} {:>8.2}  {:<18} {:>11.1} {:>11.1} {:>11.1} {:>8.1}% {:>9.1}%\n",
                p.load,
                p.rate_rps,
                r.strategy,
                r.ttft_ms.p50,
                r.ttft_ms.p90,
                r.ttft_ms.p99,
                100.0 * r.kv_hit_rate,
                100.0 * max_share
            ));
        }
    }
    if sweep
        .points
        .iter()
        .any(|p| crate::table::has_clairvoyant(&p.report.results))
    {
        out.push_str(CLAIRVOYANT_NOTE);
        out.push('\n');
        for p in &sweep.points {
            let prefix = format!("at {}: ", p.load);
            crate::table::placement_lines(&p.report.results, &prefix, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::config;
    use prefix_router_workload::WorkloadKind;

    #[test]
    fn higher_load_means_higher_rate_and_no_faster_answers() {
        let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
        spec.requests = 300;
        let mut p = prefix_router_workload::generators::WorkloadParams::default_for(
            WorkloadKind::LongContext,
        );
        p.apply_override("documents=20").expect("valid");
        p.apply_override("doc_tokens=400").expect("valid");
        spec.params = p;
        let kind = StrategyKind::named("least-outstanding").expect("registered");
        let c = config(3, &[kind]);
        let sweep = load_sweep("t", &spec, &c, &[0.3, 0.9], &mut |_, _| {}).expect("runs");
        assert!(sweep.capacity_rps > 0.0);
        let [lo, hi] = &sweep.points[..] else {
            panic!("two points")
        };
        assert!((hi.rate_rps / lo.rate_rps - 3.0).abs() < 1e-9);
        let p90 = |pt: &LoadPoint| pt.report.results[0].ttft_ms.p90;
        assert!(p90(hi) >= p90(lo), "{} < {}", p90(hi), p90(lo));
        let text = render(&sweep);
        assert!(text.contains("Capacity:") && text.contains("least-outstanding"));
        assert!(load_sweep("t", &spec, &c, &[0.0], &mut |_, _| {}).is_err());
    }
}
