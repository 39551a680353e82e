//! Writing a command's report to the file `--json` names (simulate, bench and demo alike).

use std::path::Path;

use anyhow::{Context, Result};

/// Pretty JSON with a final newline; errors name the flag and the path.
pub fn write_json<T: serde::Serialize>(path: &Path, report: &T) -> Result<()> {
    let mut json = serde_json::to_string_pretty(report).context("serializing the report")?;
    json.push('\n');
    std::fs::write(path, json).with_context(|| format!("--json: cannot write {}", path.display()))
}
