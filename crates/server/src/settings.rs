//! Configuration: a TOML file read straight into [`Settings`] (one shape: the sections in
//! `sections`, each field's decoder in `de`), flag and environment overrides on top, and
//! [`Settings::validate`] for what needs more than one field. Every error is one line that
//! names the field.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use prefix_router_core::{ConfigError, InstanceSpec};
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
    /// The file is not valid TOML, has unknown or mistyped fields, or a value its field
    /// cannot hold.
    #[error("config file {path}, line {line}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// What is wrong, naming the field when the line shows it.
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

mod de;
mod discovery;
mod sections;
mod source;
#[cfg(test)]
mod tests;

pub use discovery::{Discovery, DnsRecord, DnsTarget, KubernetesTarget};
pub use sections::{
    AccessLogSettings, Admin, AdminSettings, EngineMetrics, HealthSettings, InstanceEntry,
    KvEventsEndpoint, KvEventsSettings, KvEventsTokenizer, Limits, PrewarmSettings, Retries,
    Routing, Timeouts,
};
pub use source::{read_fields, settings_from_text, ConfigSource, Overrides};

/// Default data-plane address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The strategy `serve` runs when none is configured: no prefix length to tune, and no collapse
/// onto one instance when every request opens with the same long text.
pub const DEFAULT_STRATEGY: &str = "cache-aware";
/// Default admin address (loopback only).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";

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

impl From<ConfigError> for SettingsError {
    /// A strategy configuration error, named by its settings field.
    fn from(e: ConfigError) -> Self {
        invalid(config_field(&e), e.to_string())
    }
}

/// The router's settings: the configuration file's shape (every section and field optional,
/// unknown ones refused; `router.example.toml` shows each with its default), checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Data-plane address.
    #[serde(deserialize_with = "de::addr")]
    pub listen: SocketAddr,
    /// Admin API (on with a token).
    pub admin: Admin,
    /// Strategy and key length.
    pub routing: Routing,
    /// Limits.
    pub limits: Limits,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Retries.
    pub retries: Retries,
    /// Health checking.
    pub health: HealthSettings,
    /// Discovery of instances (DNS) and of the models they serve.
    pub discovery: Discovery,
    /// Scraping the engines' own metrics.
    pub engine_metrics: EngineMetrics,
    /// The access log.
    pub access_log: AccessLogSettings,
    /// Subscribing to the engines' KV-cache events.
    pub kv_events: KvEventsSettings,
    /// Prewarming instances that join.
    pub prewarm: PrewarmSettings,
    /// TLS on the data-plane listener, when configured.
    #[serde(deserialize_with = "de::listener_tls")]
    pub tls: Option<crate::tls::TlsFiles>,
    /// TLS to `https://` instances.
    #[serde(deserialize_with = "de::upstream_tls")]
    pub upstream_tls: crate::tls::UpstreamTls,
    /// Static instances (checked by [`Settings::validate`]).
    #[serde(deserialize_with = "de::instances")]
    pub instances: Vec<InstanceSpec>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin: Admin::default(),
            routing: Routing::default(),
            limits: Limits::default(),
            timeouts: Default::default(),
            retries: Retries::default(),
            health: HealthSettings::default(),
            discovery: Discovery::default(),
            engine_metrics: EngineMetrics::default(),
            access_log: AccessLogSettings::default(),
            kv_events: KvEventsSettings::default(),
            prewarm: PrewarmSettings::default(),
            tls: None,
            upstream_tls: Default::default(),
            instances: Vec::new(),
        }
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

/// Checks instance entries (URL shape, no duplicate, weight at least 1, no empty model name)
/// into specs.
pub fn validate_instances(entries: &[InstanceEntry]) -> Result<Vec<InstanceSpec>, SettingsError> {
    let specs: Vec<InstanceSpec> = entries.iter().map(de::spec_of).collect();
    check_instances(specs)
}

/// Normalizes and checks specs read from the file or given in code.
fn check_instances(specs: Vec<InstanceSpec>) -> Result<Vec<InstanceSpec>, SettingsError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(specs.len());
    for (i, spec) in specs.into_iter().enumerate() {
        let field = format!("instances[{i}].url");
        let url = normalize_instance_url(&spec.url).map_err(|m| invalid(&field, m))?;
        if !seen.insert(url.clone()) {
            return Err(invalid(field, format!("duplicate instance URL '{url}'")));
        }
        if spec.weight == 0 {
            return Err(invalid(
                format!("instances[{i}].weight"),
                "must be at least 1",
            ));
        }
        if spec.models.iter().any(|m| m.trim().is_empty()) {
            return Err(invalid(
                format!("instances[{i}].models"),
                "model names must not be empty",
            ));
        }
        out.push(InstanceSpec {
            id: url.clone(),
            url,
            ..spec
        });
    }
    Ok(out)
}

impl Settings {
    /// Checks what one field's decoder cannot: pairs of fields, lists, the strategy's own
    /// parameters and the TLS files. Normalizes instance URLs (ids are URLs).
    pub fn validate(mut self) -> Result<Self, SettingsError> {
        // A token read from a secret file or variable often ends in a newline; a client can
        // never send one in a header, so the surrounding whitespace is not part of it.
        if let Some(t) = &mut self.admin.token {
            let trimmed = t.trim();
            if trimmed.len() != t.len() {
                *t = trimmed.to_owned();
            }
        }
        match (&self.admin.token, self.admin.listen) {
            (Some(t), _) if t.is_empty() => {
                return Err(invalid("admin.token", "must not be empty"))
            }
            (Some(t), _) if t.bytes().any(|b| !b.is_ascii_graphic()) => {
                return Err(invalid(
                    "admin.token",
                    "must be printable ASCII without spaces (it is sent as `Authorization: Bearer <token>`)",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "admin.token",
                    "required when admin.listen is set (the admin API needs a bearer token)",
                ))
            }
            _ => {}
        }
        // Built once here only to check it (building is cheap: no strategy allocates up front).
        self.routing.strategy.build()?;
        if self.health.max_eject_backoff < self.health.eject_backoff {
            return Err(invalid(
                "health.max_eject_backoff_ms",
                "must be at least health.eject_backoff_ms",
            ));
        }
        self.instances = check_instances(std::mem::take(&mut self.instances))?;
        check_dns(&mut self.discovery.dns)?;
        if let Some(k) = self.discovery.kubernetes.as_mut() {
            check_kubernetes(k)?;
        }
        check_kv_endpoints(&mut self.kv_events.endpoints)?;
        check_kv_tokenizers(&self.kv_events.tokenizers)?;
        if self.engine_metrics.stale_after < self.engine_metrics.interval {
            return Err(invalid(
                "engine_metrics.stale_after_ms",
                "must be at least engine_metrics.interval_ms (or every queue is stale before the next scrape)",
            ));
        }
        if let Some(files) = &self.tls {
            // Checked now, so that a bad file stops `serve` with the field named.
            crate::tls::server_config(files)?;
        }
        if self.upstream_tls != crate::tls::UpstreamTls::default() {
            crate::tls::ClientTls::new(&self.upstream_tls)?;
        }
        Ok(self)
    }

    /// Defaults with these instance URLs (tests and quick starts).
    pub fn with_instances<I: IntoIterator<Item = S>, S: Into<String>>(
        urls: I,
    ) -> Result<Self, SettingsError> {
        let entries: Vec<InstanceEntry> = urls
            .into_iter()
            .map(|u| InstanceEntry {
                url: u.into(),
                ..InstanceEntry::default()
            })
            .collect();
        Settings {
            instances: entries.iter().map(de::spec_of).collect(),
            ..Settings::default()
        }
        .validate()
    }
}

/// Checks a ZeroMQ TCP endpoint: `tcp://host:port`.
fn check_tcp_endpoint(field: String, e: &str) -> Result<(), SettingsError> {
    let ok = e.strip_prefix("tcp://").is_some_and(|rest| {
        rest.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        })
    });
    if ok {
        Ok(())
    } else {
        Err(invalid(field, format!("'{e}' is not tcp://host:port")))
    }
}

/// `[[kv_events.endpoints]]`: an instance URL (normalized as in `[[instances]]`) and TCP
/// endpoints, no instance twice.
fn check_kv_endpoints(entries: &mut [KvEventsEndpoint]) -> Result<(), SettingsError> {
    for i in 0..entries.len() {
        let field = |f: &str| format!("kv_events.endpoints[{i}].{f}");
        let url = normalize_instance_url(&entries[i].instance)
            .map_err(|m| invalid(field("instance"), m))?;
        if entries[..i].iter().any(|e| e.instance == url) {
            return Err(invalid(
                field("instance"),
                format!("'{url}' is listed twice"),
            ));
        }
        entries[i].instance = url;
        check_tcp_endpoint(field("publisher"), &entries[i].publisher)?;
        if let Some(r) = &entries[i].replay {
            check_tcp_endpoint(field("replay"), r)?;
        }
    }
    Ok(())
}

/// `[[kv_events.tokenizers]]`: a model name and a tokenizer, no model twice.
fn check_kv_tokenizers(entries: &[KvEventsTokenizer]) -> Result<(), SettingsError> {
    for (i, e) in entries.iter().enumerate() {
        let field = |f: &str| format!("kv_events.tokenizers[{i}].{f}");
        if e.model.trim().is_empty() {
            return Err(invalid(field("model"), "must not be empty"));
        }
        if entries[..i].iter().any(|x| x.model == e.model) {
            return Err(invalid(
                field("model"),
                format!("model '{}' is listed twice", e.model),
            ));
        }
        if e.tokenizer.as_os_str().is_empty() {
            return Err(invalid(field("tokenizer"), "must not be empty"));
        }
    }
    Ok(())
}

/// A DNS-1123 label (names of Services, namespaces, ports): lower-case letters, digits and `-`.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The Kubernetes target: names Kubernetes would accept, a known scheme, an API server URL.
fn check_kubernetes(k: &mut KubernetesTarget) -> Result<(), SettingsError> {
    let field = |f: &str| format!("discovery.kubernetes.{f}");
    k.service = k.service.trim().to_string();
    if !is_label(&k.service) {
        return Err(invalid(
            field("service"),
            format!(
                "'{}' is not a Service name (lower-case letters, digits and '-')",
                k.service
            ),
        ));
    }
    if let Some(ns) = &k.namespace {
        if !is_label(ns) {
            return Err(invalid(
                field("namespace"),
                format!("'{ns}' is not a namespace name"),
            ));
        }
    }
    // Empty: the Service's only port, which Kubernetes lets a single-port Service leave unnamed.
    if !k.port.is_empty() && !is_label(&k.port) {
        return Err(invalid(
            field("port"),
            format!(
                "'{}' is not a port name: give the name of the Service's port (its `name:`), not its number, or \"\" for a Service's only, unnamed port",
                k.port
            ),
        ));
    }
    if k.scheme != "http" && k.scheme != "https" {
        return Err(invalid(
            field("scheme"),
            format!("'{}': expected \"http\" or \"https\"", k.scheme),
        ));
    }
    if let Some(url) = &k.api_server {
        let ok = url.parse::<http::Uri>().ok().is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
        });
        if !ok {
            return Err(invalid(
                field("api_server"),
                format!("'{url}' is not an http(s) URL"),
            ));
        }
    }
    Ok(())
}

/// DNS targets: a host name, a port where the record kind needs one, no target twice.
fn check_dns(dns: &mut [DnsTarget]) -> Result<(), SettingsError> {
    for i in 0..dns.len() {
        let t = &mut dns[i];
        t.name = t.name.trim().to_string();
        if t.name.is_empty() || t.name.contains(['/', ':', ' ', '@']) {
            return Err(invalid(
                format!("discovery.dns[{i}].name"),
                format!("'{}' is not a host name", t.name),
            ));
        }
        match (t.record, t.port) {
            (DnsRecord::Address, 0) => {
                return Err(invalid(
                    format!("discovery.dns[{i}].port"),
                    "needed for A/AAAA records, within 1..=65535 (or set record = \"srv\")",
                ))
            }
            (DnsRecord::Srv, p) if p != 0 => {
                return Err(invalid(
                    format!("discovery.dns[{i}].port"),
                    "SRV records carry their own ports; leave port out",
                ))
            }
            _ => {}
        }
        let t = &dns[i];
        if dns[..i].iter().any(|x| {
            x.name == t.name && x.port == t.port && x.record == t.record && x.server == t.server
        }) {
            return Err(invalid(
                format!("discovery.dns[{i}].name"),
                format!("duplicate DNS target '{}:{}'", t.name, t.port),
            ));
        }
    }
    Ok(())
}
