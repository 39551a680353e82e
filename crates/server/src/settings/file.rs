//! The configuration file's shape: every section and field optional, unknown fields refused.

use std::collections::BTreeMap;

use serde::Deserialize;

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
    /// TLS on the data-plane listener.
    pub tls: TlsFile,
    /// TLS to `https://` instances.
    pub upstream_tls: UpstreamTlsFile,
    /// Static instances.
    pub instances: Vec<InstanceFile>,
}

/// `[tls]`: the listener serves TLS when both files are given.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsFile {
    /// PEM certificate chain, leaf first.
    pub cert_file: Option<String>,
    /// PEM private key.
    pub key_file: Option<String>,
}

/// `[upstream_tls]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsFile {
    /// PEM bundle of the CAs instances' certificates chain to (default: the system's roots).
    pub ca_file: Option<String>,
    /// Client certificate for mutual TLS (with `key_file`).
    pub cert_file: Option<String>,
    /// Its private key.
    pub key_file: Option<String>,
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
    /// Name to resolve (e.g. a Kubernetes headless Service, or an SRV name).
    pub name: String,
    /// Port of the instances (A/AAAA records; SRV records carry their own).
    #[serde(default)]
    pub port: Option<u16>,
    /// `"a"` (default: A/AAAA records, the port from `port`) or `"srv"` (host and port from
    /// SRV records).
    #[serde(default)]
    pub record: Option<String>,
    /// A name server to ask (`ip:port`, e.g. Consul's `127.0.0.1:8600`) instead of the
    /// system's resolver.
    #[serde(default)]
    pub server: Option<String>,
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
    /// `[routing.params]`: the strategy's own parameters (`index-blocks = 65536`, ...), each a
    /// string or a number; the strategy checks names and values.
    pub params: BTreeMap<String, toml::Value>,
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
    /// Most connections open at once from one client address (0: no per-address limit).
    pub max_connections_per_client: Option<u64>,
    /// Most requests in flight on one instance before the router answers 429 (0: no cap).
    pub max_in_flight_per_instance: Option<u64>,
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
    /// Receiving a request head, from its first byte.
    pub client_header_ms: Option<u64>,
    /// A client connection with no request open and no traffic is closed after this.
    pub client_idle_ms: Option<u64>,
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
    /// With active probes, whether a new instance waits for its first passed probe before it
    /// takes requests (default true; false routes to it at once).
    pub wait_for_first_check: Option<bool>,
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
