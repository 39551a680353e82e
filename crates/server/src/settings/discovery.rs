//! `[discovery]`: where instances come from besides the file's list (DNS names, Kubernetes
//! endpoints), and model discovery. Read as the other sections are (see [`super::sections`]).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::de;

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

impl<'de> Deserialize<'de> for DnsRecord {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.trim().to_ascii_lowercase().as_str() {
            "a" => Ok(DnsRecord::Address),
            "srv" => Ok(DnsRecord::Srv),
            _ => Err(serde::de::Error::custom(format!(
                "'{text}' is not a record kind; expected \"a\" or \"srv\""
            ))),
        }
    }
}

/// One `[[discovery.dns]]` entry: a name resolved on an interval into instances
/// `http://<address>:<port>`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsTarget {
    /// Name to resolve (a Kubernetes headless Service, an SRV name).
    pub name: String,
    /// Port (A/AAAA records; 0, left out, for SRV, whose records carry it).
    #[serde(default)]
    pub port: u16,
    /// Which records to ask for.
    #[serde(default)]
    pub record: DnsRecord,
    /// The name server to ask (`ip:port`); `None`: the system's (`/etc/hosts` and the C
    /// library's resolver for A/AAAA, `/etc/resolv.conf` for SRV).
    #[serde(default, deserialize_with = "de::opt_addr")]
    pub server: Option<SocketAddr>,
    /// Re-resolution interval.
    #[serde(
        rename = "interval_ms",
        default = "dns_interval",
        deserialize_with = "de::millis"
    )]
    pub interval: Duration,
    /// Weight of each instance; with SRV records, times each record's own weight (0 counting
    /// as 1).
    #[serde(default = "one", deserialize_with = "de::at_least_one")]
    pub weight: u32,
    /// Models of each instance (empty: any).
    #[serde(default)]
    pub models: Vec<String>,
}

fn dns_interval() -> Duration {
    Duration::from_millis(10_000)
}

fn one() -> u32 {
    1
}

/// `[discovery]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Discovery {
    /// Ask each instance's `/v1/models` what it serves (LoRA adapters included).
    pub models: bool,
    /// Time between two rounds of model discovery.
    #[serde(rename = "models_interval_ms", deserialize_with = "de::millis")]
    pub models_interval: Duration,
    /// DNS targets.
    pub dns: Vec<DnsTarget>,
    /// A Service's EndpointSlices, watched through the Kubernetes API.
    pub kubernetes: Option<KubernetesTarget>,
}

/// `[discovery.kubernetes]`: the instances are the endpoints of one Service, read from its
/// EndpointSlices (list, then watch) through the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesTarget {
    /// The Service (its EndpointSlices carry `kubernetes.io/service-name: <service>`).
    pub service: String,
    /// Its namespace; default: the router's own (from its service account), else `default`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The name of the Service port the engines serve on (each slice says which number it is);
    /// `""` for a Service whose only port is unnamed.
    pub port: String,
    /// `http` or `https` for the instance URLs.
    #[serde(default = "http_scheme")]
    pub scheme: String,
    /// A label of the EndpointSlices (Kubernetes copies the Service's labels onto them) whose
    /// value names the model the endpoints serve; unset: any model (or `[discovery] models`).
    #[serde(default)]
    pub model_label: Option<String>,
    /// The API server's URL, instead of the in-cluster configuration or `~/.kube/config`
    /// (`kubectl proxy` at `http://127.0.0.1:8001`, tests).
    #[serde(default)]
    pub api_server: Option<String>,
    /// Weight of each instance.
    #[serde(default = "one", deserialize_with = "de::at_least_one")]
    pub weight: u32,
    /// How long the router waits for the first list before it serves (with what else it has).
    #[serde(
        rename = "first_list_timeout_ms",
        default = "first_list_timeout",
        deserialize_with = "de::millis"
    )]
    pub first_list_timeout: Duration,
    /// How long an endpoint that stops being ready (and is not terminating: a readiness probe
    /// failing, an engine restarting in place) stays a member, draining, with what the router
    /// knows of its cache and its requests in flight; ready again within it, it takes requests
    /// at once. Past it, it leaves (0: at once), and comes back as a new instance.
    #[serde(
        rename = "unready_keep_ms",
        default = "unready_keep",
        deserialize_with = "de::millis_or_zero"
    )]
    pub unready_keep: Duration,
    /// How long after the watch's last failure it still counts as failing, so that no unready
    /// member runs out of time: kube-runtime's watcher waits up to 30 s between tries, and its
    /// jitter can add as much again. Not a setting (tests shorten it).
    #[serde(skip, default = "watch_retry_max")]
    pub watch_retry_max: Duration,
}

fn watch_retry_max() -> Duration {
    Duration::from_secs(60)
}

fn first_list_timeout() -> Duration {
    Duration::from_millis(10_000)
}

fn unready_keep() -> Duration {
    Duration::from_millis(60_000)
}

fn http_scheme() -> String {
    "http".into()
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            models: false,
            models_interval: Duration::from_millis(30_000),
            dns: Vec::new(),
            kubernetes: None,
        }
    }
}

impl Discovery {
    /// Model discovery's interval, when it is on.
    pub fn models_every(&self) -> Option<Duration> {
        self.models.then_some(self.models_interval)
    }
}
