//! Where settings come from: the file, then flag and environment overrides on top.

use std::path::PathBuf;

use super::{invalid, FileConfig, InstanceFile, Settings, SettingsError};

/// Values given on the command line or in `PREFIX_ROUTER_*` variables; they win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<String>,
    /// `--admin-listen`.
    pub admin_listen: Option<String>,
    /// `--admin-token`.
    pub admin_token: Option<String>,
    /// `--instance` (repeated): replaces the file's instance list when not empty.
    pub instances: Vec<String>,
    /// `--strategy`.
    pub strategy: Option<String>,
    /// `--prefix-length`.
    pub prefix_length: Option<u64>,
    /// `--concurrency-threshold`.
    pub concurrency_threshold: Option<u64>,
    /// `--strategy-param NAME=VALUE` (repeated), each `NAME=VALUE` as given: strategy
    /// parameters, each winning over the same name in `[routing.params]`. Checked here, so a
    /// malformed one is a one-line error naming `--strategy-param` (a comma-separated
    /// `PREFIX_ROUTER_STRATEGY_PARAMS` is for the command line parser to split).
    pub strategy_params: Vec<String>,
}

/// Where settings come from: read again on reload (SIGHUP, admin API).
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// The TOML file, if any.
    pub path: Option<PathBuf>,
    /// Flag and environment overrides.
    pub overrides: Overrides,
}

impl ConfigSource {
    /// Reads the file (if any), applies the overrides and validates.
    pub fn load(&self) -> Result<Settings, SettingsError> {
        let mut file = match &self.path {
            Some(path) => parse_file(path)?,
            None => FileConfig::default(),
        };
        let o = &self.overrides;
        if o.listen.is_some() {
            file.listen.clone_from(&o.listen);
        }
        if o.admin_listen.is_some() {
            file.admin.listen.clone_from(&o.admin_listen);
        }
        if o.admin_token.is_some() {
            file.admin.token.clone_from(&o.admin_token);
        }
        if !o.instances.is_empty() {
            file.instances = o
                .instances
                .iter()
                .map(|url| InstanceFile {
                    url: url.clone(),
                    ..InstanceFile::default()
                })
                .collect();
        }
        if o.strategy.is_some() {
            file.routing.strategy.clone_from(&o.strategy);
        }
        if o.prefix_length.is_some() {
            file.routing.prefix_length = o.prefix_length;
        }
        if o.concurrency_threshold.is_some() {
            file.routing.concurrency_threshold = o.concurrency_threshold;
        }
        for param in &o.strategy_params {
            let (name, value) = parse_param(param)?;
            file.routing.params.insert(name, toml::Value::String(value));
        }
        Settings::from_file(file)
    }
}

/// Splits one `--strategy-param` value, `NAME=VALUE`.
fn parse_param(text: &str) -> Result<(String, String), SettingsError> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(invalid(
            "--strategy-param",
            format!("'{text}' is not NAME=VALUE"),
        )),
    }
}

fn parse_file(path: &PathBuf) -> Result<FileConfig, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
        path: path.clone(),
        source,
    })?;
    parse_text(&text, path)
}

/// Parses a configuration file's text (`path` names it in errors) and validates it: what
/// `serve --config` does once the file is read.
pub fn settings_from_text(text: &str, path: &std::path::Path) -> Result<Settings, SettingsError> {
    Settings::from_file(parse_text(text, path)?)
}

fn parse_text(text: &str, path: &std::path::Path) -> Result<FileConfig, SettingsError> {
    toml::from_str(text).map_err(|e| {
        let line = e
            .span()
            // Bytes, not a str slice: a span inside a character must not panic.
            .map(|s| {
                let upto = &text.as_bytes()[..s.start.min(text.len())];
                upto.iter().filter(|&&b| b == b'\n').count() + 1
            })
            .unwrap_or(1);
        SettingsError::Parse {
            path: path.to_path_buf(),
            line,
            message: e.message().replace('\n', " "),
        }
    })
}
