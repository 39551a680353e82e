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
    let mut text = String::from("Engine presets (--preset):\n");
    for p in PRESETS {
        text += &format!("  {:<width$}  {}\n", p.name, p.description);
        text += &format!("  {:<width$}  {}\n", "", (p.config)().summary());
    }
    text += "\nWorkloads (--workload):\n";
    for kind in WorkloadKind::ALL {
        text += &format!("  {:<width$}  {}\n", kind.name(), kind.description());
    }
    crate::out::print(&text)
}
