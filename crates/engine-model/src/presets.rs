//! Engine presets calibrated on public figures; each number cites its source.

use crate::EngineConfig;

/// A named engine configuration.
#[derive(Debug, Clone)]
pub struct Preset {
    /// Name used on the command line.
    pub name: &'static str,
    /// One line for `--help` and reports.
    pub description: &'static str,
    /// Builds the configuration.
    pub config: fn() -> EngineConfig,
}

/// Every preset.
pub const PRESETS: &[Preset] = &[];

/// Looks a preset up by name.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}
