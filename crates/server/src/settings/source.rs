//! Where settings come from: the file, then flag and environment overrides on top.

use std::path::PathBuf;

use std::net::SocketAddr;

use prefix_router_core::{ConcurrencyThreshold, PrefixLength};

use super::{invalid, InstanceEntry, Settings, SettingsError};

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
    /// `--access-log FILE`.
    pub access_log: Option<PathBuf>,
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
        let mut s = match &self.path {
            Some(path) => parse_file(path)?,
            None => Settings::default(),
        };
        self.overrides.apply(&mut s)?;
        s.validate()
    }
}

impl Overrides {
    /// Puts each given value in place of the file's, checked as the file's would be.
    fn apply(&self, s: &mut Settings) -> Result<(), SettingsError> {
        let addr = |field: &str, v: &str| {
            v.trim()
                .parse::<SocketAddr>()
                .map_err(|_| invalid(field, format!("'{v}' is not an IP:port socket address")))
        };
        if let Some(v) = &self.listen {
            s.listen = addr("listen", v)?;
        }
        if let Some(v) = &self.admin_listen {
            s.admin.listen = Some(addr("admin.listen", v)?);
        }
        if self.admin_token.is_some() {
            s.admin.token.clone_from(&self.admin_token);
        }
        if self.access_log.is_some() {
            s.access_log.path.clone_from(&self.access_log);
        }
        if !self.instances.is_empty() {
            let entries: Vec<InstanceEntry> = self
                .instances
                .iter()
                .map(|url| InstanceEntry {
                    url: url.clone(),
                    ..InstanceEntry::default()
                })
                .collect();
            s.instances = entries.iter().map(super::de::spec_of).collect();
        }
        let strategy = &mut s.routing.strategy;
        if let Some(name) = &self.strategy {
            let kind = name
                .parse()
                .map_err(|e| invalid("routing.strategy", format!("{e}")))?;
            // The file's threshold and overflow stay. Its `[routing.params]` belong to the
            // file's strategy: trying another one by flag must not fail on parameters it
            // does not take (`--strategy-param` below sets the new one's).
            if kind != strategy.kind {
                strategy.params.clear();
            }
            strategy.kind = kind;
        }
        if let Some(n) = self.concurrency_threshold {
            strategy.concurrency_threshold = ConcurrencyThreshold::new(n)
                .map_err(|e| invalid("routing.concurrency_threshold", e.to_string()))?;
        }
        for param in &self.strategy_params {
            let (name, value) = parse_param(param)?;
            strategy.params.insert(name, value);
        }
        if let Some(n) = self.prefix_length {
            s.routing.prefix_length = PrefixLength::new(n)
                .map_err(|e| invalid("routing.prefix_length", e.to_string()))?;
        }
        Ok(())
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

fn parse_file(path: &std::path::Path) -> Result<Settings, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_text(&text, path)
}

/// Reads a configuration file with every field checked by its own decoder, but nothing checked
/// against this machine (TLS files, instance lists against each other): what `analyze
/// --current` needs from a config copied from the host that runs the router.
pub fn read_fields(path: &std::path::Path) -> Result<Settings, SettingsError> {
    parse_file(path)
}

/// Parses a configuration file's text (`path` names it in errors) and validates it: what
/// `serve --config` does once the file is read.
pub fn settings_from_text(text: &str, path: &std::path::Path) -> Result<Settings, SettingsError> {
    parse_text(text, path)?.validate()
}

/// Reads the text into settings. An error is placed at its line, and when that line holds a
/// `key = value` the message names the key's dotted path (`timeouts.connect_ms`,
/// `discovery.dns[1].port`): a field's decoder knows what is wrong but not where it is.
fn parse_text(text: &str, path: &std::path::Path) -> Result<Settings, SettingsError> {
    toml::from_str(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start.min(text.len()));
        // Bytes, not a str slice: a span inside a character must not panic.
        let line = text.as_bytes()[..at]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        let message = e.message().replace('\n', " ");
        let message = match key_at(text, line) {
            Some(key) if !message.starts_with('`') => format!("`{key}`: {message}"),
            _ => message,
        };
        SettingsError::Parse {
            path: path.to_path_buf(),
            line,
            message,
        }
    })
}

/// The dotted path of the key that line `line` (1-based) sets, from the table headers above
/// it (an array of tables counts its entries: `discovery.dns[1]`). `None` for a line that sets
/// no key (a header, a continued array).
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let here = lines.get(line.checked_sub(1)?)?.trim();
    let (key, _) = here.split_once('=')?;
    let key = key.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('#') || key.starts_with('[') {
        return None;
    }
    let header = lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('['));
    let table = match header {
        None => return Some(key.to_string()),
        Some(h) if h.starts_with("[[") => {
            let name = h.trim_start_matches('[').split(']').next()?.trim();
            let index = lines[..line - 1]
                .iter()
                .filter(|l| {
                    let l = l.trim();
                    l.starts_with("[[")
                        && l.trim_start_matches('[').split(']').next().map(str::trim) == Some(name)
                })
                .count()
                .checked_sub(1)?;
            format!("{name}[{index}]")
        }
        Some(h) => h
            .trim_start_matches('[')
            .split(']')
            .next()?
            .trim()
            .to_string(),
    };
    Some(format!("{table}.{key}"))
}
