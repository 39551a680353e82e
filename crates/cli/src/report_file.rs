//! Writing a command's report to the file `--json` names (simulate, bench and demo alike), and
//! checking before a run that its output files can be written where named.

use std::path::Path;

use anyhow::{Context, Result};

/// Pretty JSON with a final newline; errors name the flag and the path.
pub fn write_json<T: serde::Serialize>(path: &Path, report: &T) -> Result<()> {
    let mut json = serde_json::to_string_pretty(report).context("serializing the report")?;
    json.push('\n');
    std::fs::write(path, json).with_context(|| format!("--json: cannot write {}", path.display()))
}

/// Fails, naming the flag, when an output path's folder does not exist: a typo in `--json` or
/// `--plot` should not wait for the end of a long run (a default demo takes over a minute).
pub fn check_folders(outputs: &[(&str, Option<&Path>)]) -> Result<()> {
    for (flag, path) in outputs {
        if let Some(dir) = path.and_then(Path::parent) {
            if !dir.as_os_str().is_empty() && !dir.is_dir() {
                anyhow::bail!("{flag}: the folder {} does not exist", dir.display());
            }
        }
    }
    Ok(())
}
