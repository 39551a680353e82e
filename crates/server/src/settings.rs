//! Configuration: a TOML file, flag/environment overrides, and one validation pass that turns
//! them into [`Settings`] or a one-line error naming the field.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{
    ConcurrencyThreshold, InstanceSpec, PrefixLength, StrategyConfig, StrategyKind,
};
use serde::Deserialize;

/// Invalid configuration. Displayed as one line that names the file or field.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown or mistyped fields.
    #[error("config file {path}, line {line}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid `{field}`: {message}")]
    Invalid {
        /// Dotted field name, e.g. `routing.prefix_length`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The file's shape. Every section and field is optional; defaults are documented in
/// `router.example.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// Data-plane listen address.
    pub listen: Option<String>,
    /// Admin API.
    pub admin: AdminFile,
    /// Routing strategy and key.
    pub routing: RoutingFile,
    /// Size and connection limits.
    pub limits: LimitsFile,
    /// Timeouts in milliseconds.
    pub timeouts: TimeoutsFile,
    /// Retries.
    pub retries: RetriesFile,
    /// Health checking.
    pub health: HealthFile,
    /// Discovery of instances (DNS) and of the models they serve.
    pub discovery: DiscoveryFile,
    /// Scraping the engines' own metrics.
    pub engine_metrics: EngineMetricsFile,
    /// Static instances.
    pub instances: Vec<InstanceFile>,
}

/// `[engine_metrics]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineMetricsFile {
    /// Scrape each instance's Prometheus endpoint.
    pub scrape: Option<bool>,
    /// Path scraped.
    pub path: Option<String>,
    /// Time between scrapes.
    pub interval_ms: Option<u64>,
}

/// Scraping the engines' metrics, when on.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetrics {
    /// Path scraped.
    pub path: String,
    /// Time between scrapes.
    pub interval: Duration,
}

/// `[discovery]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryFile {
    /// Ask each instance's `/v1/models` what it serves (LoRA adapters included).
    pub models: Option<bool>,
    /// Time between two rounds of model discovery.
    pub models_interval_ms: Option<u64>,
    /// DNS names whose A/AAAA records are instances.
    pub dns: Vec<DnsFile>,
}

/// One `[[discovery.dns]]` entry.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsFile {
    /// Host name to resolve (e.g. a Kubernetes headless Service).
    pub name: String,
    /// Port of the instances.
    pub port: u16,
    /// Time between two resolutions (default 10 s).
    #[serde(default)]
    pub interval_ms: Option<u64>,
    /// Weight of each instance found (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Models each instance found serves (default: any).
    #[serde(default)]
    pub models: Vec<String>,
}

/// `[admin]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminFile {
    /// Listen address (default 127.0.0.1:8081).
    pub listen: Option<String>,
    /// Bearer token; the admin API is off without one.
    pub token: Option<String>,
}

/// `[routing]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingFile {
    /// Strategy name.
    pub strategy: Option<String>,
    /// Key length (bytes for the native API, characters for OpenAI APIs).
    pub prefix_length: Option<u64>,
    /// In-flight count at which prefix-aware routing overflows.
    pub concurrency_threshold: Option<u64>,
    /// Where overflow goes.
    pub overflow: Option<String>,
    /// Optional bounded-load factor (> 1).
    pub balance_factor: Option<f64>,
}

/// `[limits]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsFile {
    /// Largest request body in bytes.
    pub max_body_bytes: Option<u64>,
    /// Largest request head (HTTP/1 buffer, HTTP/2 header list) in bytes.
    pub max_header_bytes: Option<u64>,
    /// Most client connections open at once.
    pub max_connections: Option<u64>,
}

/// `[timeouts]`, all in milliseconds.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsFile {
    /// Connecting to an instance.
    pub connect_ms: Option<u64>,
    /// From sending a request to the instance's response head.
    pub first_byte_ms: Option<u64>,
    /// Longest pause between two chunks of a response.
    pub idle_stream_ms: Option<u64>,
    /// Reading the client's request body.
    pub client_body_ms: Option<u64>,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace_ms: Option<u64>,
}

/// `[retries]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetriesFile {
    /// Further attempts after the first (0..=10).
    pub max_retries: Option<u32>,
}

/// `[health]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthFile {
    /// Whether to probe instances actively.
    pub active: Option<bool>,
    /// Path probed with GET.
    pub path: Option<String>,
    /// Time between probes.
    pub interval_ms: Option<u64>,
    /// Probe timeout.
    pub timeout_ms: Option<u64>,
    /// Consecutive failed probes that eject an instance.
    pub unhealthy_threshold: Option<u32>,
    /// Consecutive good probes that bring an ejected instance back.
    pub healthy_threshold: Option<u32>,
    /// Consecutive connect errors or 5xx answers that eject an instance.
    pub passive_failures: Option<u32>,
    /// First ejection time; doubles on each repeated ejection.
    pub eject_backoff_ms: Option<u64>,
    /// Longest ejection time.
    pub max_eject_backoff_ms: Option<u64>,
}

/// One `[[instances]]` entry.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceFile {
    /// Base URL, `http://host:port`.
    pub url: String,
    /// Relative capacity (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Models and adapters served; empty means any.
    #[serde(default)]
    pub models: Vec<String>,
}

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
        Settings::from_file(file)
    }
}

fn parse_file(path: &PathBuf) -> Result<FileConfig, SettingsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SettingsError::Read {
        path: path.clone(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
            .unwrap_or(1);
        SettingsError::Parse {
            path: path.clone(),
            line,
            message: e.message().replace('\n', " "),
        }
    })
}

/// Admin API settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminSettings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token.
    pub token: String,
}

/// Limits on what clients may send.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest request body.
    pub max_body_bytes: u64,
    /// Largest request head.
    pub max_header_bytes: usize,
    /// Most client connections at once.
    pub max_connections: usize,
}

/// Timeouts.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeouts {
    /// Connecting to an instance.
    pub connect: Duration,
    /// Request sent to response head received (prefill can take minutes: generous default).
    pub first_byte: Duration,
    /// Longest pause between two response chunks.
    pub idle_stream: Duration,
    /// Reading the client's body.
    pub client_body: Duration,
    /// Shutdown's wait for in-flight requests.
    pub shutdown_grace: Duration,
}

/// Health checking.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// Probe actively.
    pub active: bool,
    /// Probed path.
    pub path: String,
    /// Between probes (also the tick that ends passive ejections).
    pub interval: Duration,
    /// Probe timeout.
    pub timeout: Duration,
    /// Failed probes in a row that eject.
    pub unhealthy_threshold: u32,
    /// Good probes in a row that bring back.
    pub healthy_threshold: u32,
    /// Connect errors or 5xx in a row that eject.
    pub passive_failures: u32,
    /// First ejection time.
    pub eject_backoff: Duration,
    /// Longest ejection time.
    pub max_eject_backoff: Duration,
}

/// A DNS name resolved on an interval into instances `http://<address>:<port>`.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsTarget {
    /// Host name.
    pub name: String,
    /// Port.
    pub port: u16,
    /// Re-resolution interval.
    pub interval: Duration,
    /// Weight of each instance.
    pub weight: u32,
    /// Models of each instance (empty: any).
    pub models: Vec<String>,
}

/// Discovery settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Discovery {
    /// Interval of model discovery through `/v1/models`, when on.
    pub models_interval: Option<Duration>,
    /// DNS targets.
    pub dns: Vec<DnsTarget>,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Data-plane address.
    pub listen: SocketAddr,
    /// Admin API, when a token is configured.
    pub admin: Option<AdminSettings>,
    /// Strategy configuration.
    pub strategy: StrategyConfig,
    /// Key length.
    pub prefix_length: PrefixLength,
    /// Limits.
    pub limits: Limits,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Further attempts after the first on refused connections, 503 and 429.
    pub max_retries: u32,
    /// Health checking.
    pub health: HealthSettings,
    /// Discovery.
    pub discovery: Discovery,
    /// Engine metrics scraping, when on.
    pub engine_metrics: Option<EngineMetrics>,
    /// Static instances.
    pub instances: Vec<InstanceSpec>,
}

/// Default data-plane address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default admin address (loopback only).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";

fn ms(field: &str, v: Option<u64>, default: u64) -> Result<Duration, SettingsError> {
    match v.unwrap_or(default) {
        0 => Err(invalid(field, "must be greater than 0")),
        n => Ok(Duration::from_millis(n)),
    }
}

fn addr(field: &str, v: &str) -> Result<SocketAddr, SettingsError> {
    v.parse()
        .map_err(|_| invalid(field, format!("'{v}' is not an IP:port socket address")))
}

fn positive(field: &str, v: Option<u32>, default: u32) -> Result<u32, SettingsError> {
    match v.unwrap_or(default) {
        0 => Err(invalid(field, "must be at least 1")),
        n => Ok(n),
    }
}

/// Checks an instance base URL: `http://host:port` with no path, query or user info. Returns it
/// without a trailing slash.
pub fn normalize_instance_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("'{url}' is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "'{url}': scheme '{other}' is not supported (only http)"
            ))
        }
        None => return Err(format!("'{url}' has no scheme (expected http://host:port)")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("'{url}' has no host"))?;
    if authority.as_str().contains('@') {
        return Err(format!("'{url}' must not carry user info"));
    }
    if authority.host().is_empty() {
        return Err(format!("'{url}' has no host"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("'{url}' must be a base URL without path or query"));
    }
    Ok(format!("http://{authority}"))
}

impl Settings {
    /// Validates a parsed file (after overrides).
    pub fn from_file(f: FileConfig) -> Result<Self, SettingsError> {
        let listen = addr("listen", f.listen.as_deref().unwrap_or(DEFAULT_LISTEN))?;
        let admin = match f.admin.token {
            Some(token) if token.trim().is_empty() => {
                return Err(invalid("admin.token", "must not be empty"))
            }
            Some(token) => Some(AdminSettings {
                listen: addr(
                    "admin.listen",
                    f.admin.listen.as_deref().unwrap_or(DEFAULT_ADMIN_LISTEN),
                )?,
                token,
            }),
            None if f.admin.listen.is_some() => {
                return Err(invalid(
                    "admin.token",
                    "required when admin.listen is set (the admin API needs a bearer token)",
                ))
            }
            None => None,
        };
        let r = &f.routing;
        let kind: StrategyKind = r
            .strategy
            .as_deref()
            .unwrap_or("prefix-aware")
            .parse()
            .map_err(|e| invalid("routing.strategy", format!("{e}")))?;
        let mut strategy = StrategyConfig::new(kind);
        if let Some(t) = r.concurrency_threshold {
            strategy.concurrency_threshold = ConcurrencyThreshold::new(t)
                .map_err(|e| invalid("routing.concurrency_threshold", e.to_string()))?;
        }
        if let Some(o) = &r.overflow {
            strategy.overflow = o
                .parse::<OverflowPolicy>()
                .map_err(|e| invalid("routing.overflow", e.to_string()))?;
        }
        strategy.balance_factor = r.balance_factor;
        strategy
            .build()
            .map_err(|e| invalid("routing.balance_factor", e.to_string()))?;
        let prefix_length = PrefixLength::new(r.prefix_length.unwrap_or(1024))
            .map_err(|e| invalid("routing.prefix_length", e.to_string()))?;

        let l = &f.limits;
        let max_body_bytes = l.max_body_bytes.unwrap_or(32 * 1024 * 1024);
        if max_body_bytes == 0 {
            return Err(invalid("limits.max_body_bytes", "must be greater than 0"));
        }
        let max_header_bytes = l.max_header_bytes.unwrap_or(64 * 1024);
        if !(8192..=16 * 1024 * 1024).contains(&max_header_bytes) {
            return Err(invalid(
                "limits.max_header_bytes",
                format!("must be within 8192..=16777216, got {max_header_bytes}"),
            ));
        }
        let max_connections = l.max_connections.unwrap_or(10_000);
        if !(1..=1_000_000).contains(&max_connections) {
            return Err(invalid(
                "limits.max_connections",
                format!("must be within 1..=1000000, got {max_connections}"),
            ));
        }
        let t = &f.timeouts;
        let timeouts = Timeouts {
            connect: ms("timeouts.connect_ms", t.connect_ms, 2_000)?,
            first_byte: ms("timeouts.first_byte_ms", t.first_byte_ms, 600_000)?,
            idle_stream: ms("timeouts.idle_stream_ms", t.idle_stream_ms, 300_000)?,
            client_body: ms("timeouts.client_body_ms", t.client_body_ms, 30_000)?,
            shutdown_grace: ms("timeouts.shutdown_grace_ms", t.shutdown_grace_ms, 30_000)?,
        };
        let max_retries = f.retries.max_retries.unwrap_or(2);
        if max_retries > 10 {
            return Err(invalid(
                "retries.max_retries",
                format!("must be within 0..=10, got {max_retries}"),
            ));
        }
        let h = &f.health;
        let path = h.path.clone().unwrap_or_else(|| "/health".into());
        if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(invalid(
                "health.path",
                format!("'{path}' is not an absolute path"),
            ));
        }
        let health = HealthSettings {
            active: h.active.unwrap_or(true),
            path,
            interval: ms("health.interval_ms", h.interval_ms, 5_000)?,
            timeout: ms("health.timeout_ms", h.timeout_ms, 2_000)?,
            unhealthy_threshold: positive("health.unhealthy_threshold", h.unhealthy_threshold, 3)?,
            healthy_threshold: positive("health.healthy_threshold", h.healthy_threshold, 2)?,
            passive_failures: positive("health.passive_failures", h.passive_failures, 3)?,
            eject_backoff: ms("health.eject_backoff_ms", h.eject_backoff_ms, 5_000)?,
            max_eject_backoff: ms(
                "health.max_eject_backoff_ms",
                h.max_eject_backoff_ms,
                60_000,
            )?,
        };
        if health.max_eject_backoff < health.eject_backoff {
            return Err(invalid(
                "health.max_eject_backoff_ms",
                "must be at least health.eject_backoff_ms",
            ));
        }
        let instances = validate_instances(&f.instances)?;
        let discovery = validate_discovery(&f.discovery)?;
        let engine_metrics = if f.engine_metrics.scrape.unwrap_or(false) {
            let path = f
                .engine_metrics
                .path
                .clone()
                .unwrap_or_else(|| "/metrics".into());
            if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
                return Err(invalid(
                    "engine_metrics.path",
                    format!("'{path}' is not an absolute path"),
                ));
            }
            Some(EngineMetrics {
                path,
                interval: ms(
                    "engine_metrics.interval_ms",
                    f.engine_metrics.interval_ms,
                    15_000,
                )?,
            })
        } else {
            None
        };
        Ok(Settings {
            listen,
            admin,
            strategy,
            prefix_length,
            limits: Limits {
                max_body_bytes,
                max_header_bytes: max_header_bytes as usize,
                max_connections: max_connections as usize,
            },
            timeouts,
            max_retries,
            health,
            discovery,
            engine_metrics,
            instances,
        })
    }

    /// Defaults with these instance URLs (tests and quick starts).
    pub fn with_instances<I: IntoIterator<Item = S>, S: Into<String>>(
        urls: I,
    ) -> Result<Self, SettingsError> {
        Self::from_file(FileConfig {
            instances: urls
                .into_iter()
                .map(|u| InstanceFile {
                    url: u.into(),
                    ..InstanceFile::default()
                })
                .collect(),
            ..FileConfig::default()
        })
    }
}

fn validate_discovery(d: &DiscoveryFile) -> Result<Discovery, SettingsError> {
    let models_interval = if d.models.unwrap_or(false) {
        Some(ms(
            "discovery.models_interval_ms",
            d.models_interval_ms,
            30_000,
        )?)
    } else {
        None
    };
    let mut dns = Vec::with_capacity(d.dns.len());
    for (i, t) in d.dns.iter().enumerate() {
        let name = t.name.trim();
        if name.is_empty() || name.contains(['/', ':', ' ', '@']) {
            return Err(invalid(
                format!("discovery.dns[{i}].name"),
                format!("'{}' is not a host name", t.name),
            ));
        }
        if t.port == 0 {
            return Err(invalid(
                format!("discovery.dns[{i}].port"),
                "must be within 1..=65535",
            ));
        }
        let weight = t.weight.unwrap_or(1);
        if weight == 0 {
            return Err(invalid(
                format!("discovery.dns[{i}].weight"),
                "must be at least 1",
            ));
        }
        if dns
            .iter()
            .any(|x: &DnsTarget| x.name == name && x.port == t.port)
        {
            return Err(invalid(
                format!("discovery.dns[{i}].name"),
                format!("duplicate DNS target '{name}:{}'", t.port),
            ));
        }
        dns.push(DnsTarget {
            name: name.to_string(),
            port: t.port,
            interval: ms(
                &format!("discovery.dns[{i}].interval_ms"),
                t.interval_ms,
                10_000,
            )?,
            weight,
            models: t.models.clone(),
        });
    }
    Ok(Discovery {
        models_interval,
        dns,
    })
}

/// Validates instance entries: URL shape, no duplicate, weight at least 1, no empty model name.
pub fn validate_instances(entries: &[InstanceFile]) -> Result<Vec<InstanceSpec>, SettingsError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let field = format!("instances[{i}].url");
        let url = normalize_instance_url(&e.url).map_err(|m| invalid(&field, m))?;
        if !seen.insert(url.clone()) {
            return Err(invalid(field, format!("duplicate instance URL '{url}'")));
        }
        let weight = e.weight.unwrap_or(1);
        if weight == 0 {
            return Err(invalid(
                format!("instances[{i}].weight"),
                "must be at least 1",
            ));
        }
        if e.models.iter().any(|m| m.trim().is_empty()) {
            return Err(invalid(
                format!("instances[{i}].models"),
                "model names must not be empty",
            ));
        }
        out.push(InstanceSpec {
            id: url.clone(),
            url,
            weight,
            models: e.models.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Settings, SettingsError> {
        let f: FileConfig = toml::from_str(text).map_err(|e| invalid("toml", e.to_string()))?;
        Settings::from_file(f)
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn example_file_is_valid_and_shows_the_defaults() {
        let text = include_str!("../../../router.example.toml");
        let s = parse(text).unwrap_or_else(|e| panic!("{e}"));
        let d = parse("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.listen, d.listen);
        assert_eq!(s.strategy, d.strategy);
        assert_eq!(s.prefix_length, d.prefix_length);
        assert_eq!(s.limits, d.limits);
        assert_eq!(s.timeouts, d.timeouts);
        assert_eq!(s.health, d.health);
        assert_eq!(s.max_retries, d.max_retries);
        assert_eq!(s.instances.len(), 2);
    }

    #[test]
    fn defaults() {
        let s = parse("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.listen.to_string(), DEFAULT_LISTEN);
        assert!(s.admin.is_none());
        assert_eq!(
            s.strategy.kind,
            StrategyKind::named("prefix-aware").expect("registered")
        );
        assert_eq!(s.prefix_length.get(), 1024);
        assert_eq!(s.limits.max_body_bytes, 32 * 1024 * 1024);
        assert_eq!(s.timeouts.first_byte, Duration::from_secs(600));
        assert_eq!(s.max_retries, 2);
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err("[routing]\nprefix_length = 12").contains("routing.prefix_length"));
        assert!(
            err("[routing]\nconcurrency_threshold = 0").contains("routing.concurrency_threshold")
        );
        assert!(err("[routing]\nconcurrency_threshold = 1025").contains("1..=1024"));
        assert!(err("[routing]\nstrategy = \"fastest\"").contains("routing.strategy"));
        assert!(err("[routing]\nbalance_factor = 0.5").contains("routing.balance_factor"));
        assert!(err("listen = \"nowhere\"").contains("`listen`"));
        assert!(err("[admin]\nlisten = \"127.0.0.1:1\"").contains("admin.token"));
        assert!(err("[timeouts]\nconnect_ms = 0").contains("timeouts.connect_ms"));
        assert!(err("[[discovery.dns]]\nname = \"\"\nport = 80").contains("discovery.dns[0].name"));
        assert!(
            err("[[discovery.dns]]\nname = \"svc\"\nport = 0").contains("discovery.dns[0].port")
        );
        assert!(err("[discovery]\nmodels = true\nmodels_interval_ms = 0")
            .contains("discovery.models_interval_ms"));
        let dup = "[[instances]]\nurl = \"http://127.0.0.1:1\"\n[[instances]]\nurl = \"http://127.0.0.1:1/\"";
        let e = err(dup);
        assert!(
            e.contains("instances[1].url") && e.contains("duplicate"),
            "{e}"
        );
        assert!(err("[[instances]]\nurl = \"https://x:1\"").contains("scheme"));
        assert!(err("[[instances]]\nurl = \"http://x:1/v1\"").contains("without path"));
        assert!(err("[[instances]]\nurl = \"not a url\"").contains("instances[0].url"));
        assert!(
            err("[[instances]]\nurl = \"http://x:1\"\nweight = 0").contains("instances[0].weight")
        );
        for e in [
            err("[routing]\nprefix_length = 12"),
            err("[[instances]]\nurl = \"x\""),
        ] {
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn file_errors_are_one_line_with_the_line_number() {
        let dir = std::env::temp_dir().join(format!("pr-settings-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("bad.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:1\"\n[routing]\nprefix_lenght = 2048\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let src = ConfigSource {
            path: Some(path.clone()),
            overrides: Overrides::default(),
        };
        let e = src.load().map(|_| ()).map_err(|e| e.to_string());
        let e = e.err().unwrap_or_default();
        assert!(e.contains("line 3") && e.contains("prefix_lenght"), "{e}");
        assert!(!e.contains('\n'));
        let missing = ConfigSource {
            path: Some(dir.join("absent.toml")),
            overrides: Overrides::default(),
        };
        assert!(matches!(missing.load(), Err(SettingsError::Read { .. })));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn overrides_win_over_the_file() {
        let dir = std::env::temp_dir().join(format!("pr-settings-o-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("ok.toml");
        std::fs::write(
            &path,
            "[routing]\nprefix_length = 2048\nconcurrency_threshold = 4\n[[instances]]\nurl = \"http://127.0.0.1:9\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut src = ConfigSource {
            path: Some(path.clone()),
            overrides: Overrides::default(),
        };
        let s = src.load().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.prefix_length.get(), 2048);
        assert_eq!(s.instances.len(), 1);
        src.overrides = Overrides {
            instances: vec!["http://127.0.0.1:10".into(), "http://127.0.0.1:11".into()],
            concurrency_threshold: Some(8),
            strategy: Some("round-robin".into()),
            ..Overrides::default()
        };
        let s = src.load().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.instances.len(), 2);
        assert_eq!(s.strategy.concurrency_threshold.get(), 8);
        assert_eq!(
            s.strategy.kind,
            StrategyKind::named("round-robin").expect("registered")
        );
        assert_eq!(s.prefix_length.get(), 2048);
        let _ = std::fs::remove_file(path);
    }
}
