//! Configuration: a TOML file, flag/environment overrides, and one validation pass that turns
//! them into [`Settings`] or a one-line error naming the field.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{
    ConcurrencyThreshold, ConfigError, InstanceSpec, PrefixLength, StrategyConfig, StrategyKind,
};

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

mod file;
mod source;
#[cfg(test)]
mod tests;

pub use file::{
    AdminFile, DiscoveryFile, DnsFile, EngineMetricsFile, FileConfig, HealthFile, InstanceFile,
    LimitsFile, RetriesFile, RoutingFile, TimeoutsFile, TlsFile, UpstreamTlsFile,
};
pub use source::{settings_from_text, ConfigSource, Overrides};

/// Scraping the engines' metrics, when on.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetrics {
    /// Path scraped.
    pub path: String,
    /// Time between scrapes.
    pub interval: Duration,
}

/// The dotted settings field a strategy configuration error is about.
pub fn config_field(e: &ConfigError) -> String {
    match e {
        ConfigError::PrefixLength(_) => "routing.prefix_length".into(),
        ConfigError::ConcurrencyThreshold(_) => "routing.concurrency_threshold".into(),
        ConfigError::BalanceFactor(_) => "routing.balance_factor".into(),
        ConfigError::UnknownStrategy { .. } => "routing.strategy".into(),
        ConfigError::UnknownName { field, .. } => format!("routing.{field}"),
        ConfigError::Param { param, .. } => format!("routing.params.{param}"),
    }
}

/// `[routing.params]` as text, as strategies read them.
fn param_texts(
    params: &BTreeMap<String, toml::Value>,
) -> Result<BTreeMap<String, String>, SettingsError> {
    params
        .iter()
        .map(|(name, value)| {
            let text = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(x) => x.to_string(),
                other => {
                    return Err(invalid(
                        format!("routing.params.{name}"),
                        format!("must be a string or a number, got a {}", other.type_str()),
                    ))
                }
            };
            Ok((name.clone(), text))
        })
        .collect()
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
    /// Most connections at once from one client address (None: no per-address limit).
    pub max_connections_per_client: Option<usize>,
    /// Most requests in flight on one instance; past it, 429 (None: no cap).
    pub max_in_flight_per_instance: Option<u32>,
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
    /// Receiving a request head, from its first byte (slow clients are cut after it).
    pub client_header: Duration,
    /// A client connection idle (no request open, no traffic) for this long is closed.
    pub client_idle: Duration,
    /// Shutdown's wait for in-flight requests.
    pub shutdown_grace: Duration,
}

impl HealthSettings {
    /// The state a new instance starts in: unknown until its first passed probe when probes
    /// run and must pass first, else healthy (nothing would ever check it).
    pub fn joins_as(&self) -> prefix_router_core::InstanceState {
        if self.active && self.wait_for_first_check {
            prefix_router_core::InstanceState::Unknown
        } else {
            prefix_router_core::InstanceState::Healthy
        }
    }
}

/// Health checking.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthSettings {
    /// Probe actively.
    pub active: bool,
    /// With active probes, new instances start unknown and take requests only after their
    /// first passed probe.
    pub wait_for_first_check: bool,
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

/// Which records of a DNS name are instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DnsRecord {
    /// A/AAAA: every address, at the target's port.
    #[default]
    Address,
    /// SRV: every target host's addresses, at the record's port (Kubernetes publishes these
    /// for a Service's named ports, Consul for every service).
    Srv,
}

/// A DNS name resolved on an interval into instances `http://<address>:<port>`.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsTarget {
    /// Host name.
    pub name: String,
    /// Port (A/AAAA records; 0 for SRV, whose records carry it).
    pub port: u16,
    /// Which records to ask for.
    pub record: DnsRecord,
    /// The name server to ask; `None`: the system's (`/etc/hosts` and the C library's resolver
    /// for A/AAAA, `/etc/resolv.conf` for SRV).
    pub server: Option<SocketAddr>,
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
    /// TLS on the data-plane listener, when configured.
    pub tls: Option<crate::tls::TlsFiles>,
    /// TLS to `https://` instances.
    pub upstream_tls: crate::tls::UpstreamTls,
    /// Static instances.
    pub instances: Vec<InstanceSpec>,
}

/// A pair of certificate and key files given together, or neither.
fn tls_pair(
    section: &'static str,
    cert: &Option<String>,
    key: &Option<String>,
) -> Result<Option<crate::tls::TlsFiles>, SettingsError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(c), Some(k)) => Ok(Some(crate::tls::TlsFiles {
            cert_file: c.into(),
            key_file: k.into(),
            section,
        })),
        (Some(_), None) => Err(invalid(
            format!("{section}.key_file"),
            "required with cert_file",
        )),
        (None, Some(_)) => Err(invalid(
            format!("{section}.cert_file"),
            "required with key_file",
        )),
    }
}

/// Default data-plane address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The strategy `serve` runs when none is configured: no prefix length to tune, and no collapse
/// onto one instance when every request opens with the same long text.
pub const DEFAULT_STRATEGY: &str = "cache-aware";
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

/// Checks an instance base URL: `http://host:port` or `https://host:port` with no path, query
/// or user info. Returns it without a trailing slash.
pub fn normalize_instance_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("'{url}' is not a URL: {e}"))?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s,
        Some(other) => {
            return Err(format!(
                "'{url}': scheme '{other}' is not supported (http or https)"
            ))
        }
        None => return Err(format!("'{url}' has no scheme (expected http://host:port)")),
    };
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
    Ok(format!("{scheme}://{authority}"))
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
            .unwrap_or(DEFAULT_STRATEGY)
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
        strategy.params = param_texts(&r.params)?;
        // Built once here only to check it (building is cheap: no strategy allocates up front).
        strategy
            .build()
            .map_err(|e| invalid(config_field(&e), e.to_string()))?;
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
        let per_client = l.max_connections_per_client.unwrap_or(1024);
        if per_client > 1_000_000 {
            return Err(invalid(
                "limits.max_connections_per_client",
                format!("must be within 0..=1000000 (0: no limit), got {per_client}"),
            ));
        }
        let in_flight_cap = l.max_in_flight_per_instance.unwrap_or(0);
        if in_flight_cap > 1_000_000 {
            return Err(invalid(
                "limits.max_in_flight_per_instance",
                format!("must be within 0..=1000000 (0: no cap), got {in_flight_cap}"),
            ));
        }
        let t = &f.timeouts;
        let timeouts = Timeouts {
            connect: ms("timeouts.connect_ms", t.connect_ms, 2_000)?,
            first_byte: ms("timeouts.first_byte_ms", t.first_byte_ms, 600_000)?,
            idle_stream: ms("timeouts.idle_stream_ms", t.idle_stream_ms, 300_000)?,
            client_body: ms("timeouts.client_body_ms", t.client_body_ms, 30_000)?,
            client_header: ms("timeouts.client_header_ms", t.client_header_ms, 10_000)?,
            client_idle: ms("timeouts.client_idle_ms", t.client_idle_ms, 60_000)?,
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
            wait_for_first_check: h.wait_for_first_check.unwrap_or(true),
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
        let tls = tls_pair("tls", &f.tls.cert_file, &f.tls.key_file)?;
        if let Some(files) = &tls {
            // Checked now, so that a bad file stops `serve` with the field named.
            crate::tls::server_config(files)?;
        }
        let upstream_tls = crate::tls::UpstreamTls {
            ca_file: f.upstream_tls.ca_file.as_ref().map(Into::into),
            client: tls_pair(
                "upstream_tls",
                &f.upstream_tls.cert_file,
                &f.upstream_tls.key_file,
            )?,
        };
        if upstream_tls != crate::tls::UpstreamTls::default() {
            crate::tls::client_config(&upstream_tls)?;
        }
        Ok(Settings {
            tls,
            upstream_tls,
            listen,
            admin,
            strategy,
            prefix_length,
            limits: Limits {
                max_body_bytes,
                max_header_bytes: max_header_bytes as usize,
                max_connections: max_connections as usize,
                max_connections_per_client: (per_client > 0).then_some(per_client as usize),
                max_in_flight_per_instance: (in_flight_cap > 0).then_some(in_flight_cap as u32),
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
        let record = match t.record.as_deref().map(str::trim) {
            None | Some("a") | Some("A") => DnsRecord::Address,
            Some("srv") | Some("SRV") => DnsRecord::Srv,
            Some(other) => {
                return Err(invalid(
                    format!("discovery.dns[{i}].record"),
                    format!("'{other}' is not a record kind; expected \"a\" or \"srv\""),
                ))
            }
        };
        let port = match (record, t.port) {
            (DnsRecord::Address, None) => {
                return Err(invalid(
                    format!("discovery.dns[{i}].port"),
                    "needed for A/AAAA records (or set record = \"srv\")",
                ))
            }
            (DnsRecord::Address, Some(0)) => {
                return Err(invalid(
                    format!("discovery.dns[{i}].port"),
                    "must be within 1..=65535",
                ))
            }
            (DnsRecord::Address, Some(p)) => p,
            (DnsRecord::Srv, None) => 0,
            (DnsRecord::Srv, Some(_)) => {
                return Err(invalid(
                    format!("discovery.dns[{i}].port"),
                    "SRV records carry their own ports; leave port out",
                ))
            }
        };
        let server = match t.server.as_deref().map(str::trim) {
            None => None,
            Some(text) => Some(text.parse::<SocketAddr>().map_err(|_| {
                invalid(
                    format!("discovery.dns[{i}].server"),
                    format!("'{text}' is not ip:port (e.g. \"127.0.0.1:8600\")"),
                )
            })?),
        };
        let weight = t.weight.unwrap_or(1);
        if weight == 0 {
            return Err(invalid(
                format!("discovery.dns[{i}].weight"),
                "must be at least 1",
            ));
        }
        if dns.iter().any(|x: &DnsTarget| {
            x.name == name && x.port == port && x.record == record && x.server == server
        }) {
            return Err(invalid(
                format!("discovery.dns[{i}].name"),
                format!("duplicate DNS target '{name}:{port}'"),
            ));
        }
        dns.push(DnsTarget {
            name: name.to_string(),
            port,
            record,
            server,
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
