//! `prefix-router presets`: what `--preset` and `--workload` accept.

use prefix_router_engine_model::PRESETS;

use prefix_router_workload::WorkloadKind;

/// Prints every engine preset (with its derived KV capacity and latencies, so a user can see what
/// a preset means before trusting a run on it) and every built-in workload.
pub fn run() -> anyhow::Result<()> {
    let width = PRESETS
        .iter()
        .map(|p| p.name.len())
        .chain(WorkloadKind::ALL.iter().map(|w| w.name().len()))
        .max()
        .unwrap_or(0);
    println!("Engine presets (--preset):");
    for p in PRESETS {
        println!("  {:<width$}  {}", p.name, p.description);
        println!("  {:<width$}  {}", "", (p.config)().summary());
    }
    println!();
    println!("Workloads (--workload):");
    for kind in WorkloadKind::ALL {
        println!("  {:<width$}  {}", kind.name(), kind.description());
    }
    Ok(())
}
