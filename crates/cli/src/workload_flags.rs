//! The workload flags `simulate`, `bench` and `demo` share, applied in one place so the three
//! commands build the same requests from the same flags.

use std::str::FromStr;

use std::path::Path;

use anyhow::{Context, Result};
use prefix_router_sim::{SimWorkload, WorkloadSource};
use prefix_router_workload::{generators, trace, Arrival, Request, WorkloadKind, WorkloadSpec};

/// Workload used when neither `--workload` nor `--trace` is given: the published experiment.
pub const DEFAULT_WORKLOAD: &str = "long-context";

/// A built-in workload and the flags that change its documented defaults.
pub struct GeneratedFlags<'a> {
    /// `--workload`.
    pub name: &'a str,
    /// `--seed`.
    pub seed: u64,
    /// `--requests`.
    pub requests: Option<u64>,
    /// `--rate` (open loop).
    pub rate: Option<f64>,
    /// `--concurrency` (closed loop; wins over `--rate`).
    pub concurrency: Option<u32>,
    /// `--groups`.
    pub groups: Option<u32>,
    /// `--param KEY=VALUE`, in order.
    pub params: &'a [String],
}

/// The workload's defaults with the flags on top, validated, and its requests.
pub fn generate(flags: &GeneratedFlags<'_>) -> Result<(WorkloadSpec, Vec<Request>)> {
    let name = flags.name;
    let kind = WorkloadKind::from_str(name).with_context(|| format!("--workload {name}"))?;
    let mut spec = WorkloadSpec::default_for(kind);
    spec.seed = flags.seed;
    if let Some(n) = flags.requests {
        spec.requests = n;
    }
    if let Some(rate) = flags.rate {
        spec.arrival = Arrival::Poisson { rate };
    }
    if let Some(clients) = flags.concurrency {
        spec.arrival = Arrival::Closed { clients };
    }
    if let Some(groups) = flags.groups {
        spec.groups = Some(groups);
    }
    for assignment in flags.params {
        spec.params
            .apply_override(assignment)
            .with_context(|| format!("--param {assignment}"))?;
    }
    spec.validate().context("--workload")?;
    let requests = generators::generate(&spec).collect();
    Ok((spec, requests))
}

/// The built-in workload `flags` name, generated, as the simulator and the replays take it.
pub fn generated(flags: &GeneratedFlags<'_>) -> Result<SimWorkload> {
    let (spec, requests) = generate(flags)?;
    Ok(SimWorkload {
        name: flags.name.to_string(),
        source: WorkloadSource::Generated { spec },
        requests,
    })
}

/// The trace at `path` (any format `trace::load_trace_as` reads), its first `requests` when
/// given, named by its file name.
pub fn trace(path: &Path, requests: Option<u64>) -> Result<SimWorkload> {
    let (format, mut loaded) =
        trace::load_trace_as(path).with_context(|| format!("--trace {}", path.display()))?;
    if let Some(n) = requests {
        loaded.truncate(usize::try_from(n).unwrap_or(usize::MAX));
    }
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(SimWorkload {
        name,
        source: WorkloadSource::Trace {
            path: path.display().to_string(),
            format: format.name().into(),
        },
        requests: loaded,
    })
}
