//! The workload flags `simulate`, `bench` and `demo` share, applied in one place so the three
//! commands build the same requests from the same flags.

use std::str::FromStr;

use anyhow::{Context, Result};
use prefix_router_workload::{generators, Arrival, Request, WorkloadKind, WorkloadSpec};

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
