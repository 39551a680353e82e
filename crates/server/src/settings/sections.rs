//! The file's sections, as the router uses them: each is what serde reads (unknown fields
//! refused, every field optional with the default its `Default` gives, which
//! `router.example.toml` documents), and each field's decoder refuses what it cannot hold.
//! What needs more than one field to check is in [`super::Settings::validate`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{ConcurrencyThreshold, PrefixLength, StrategyConfig, StrategyKind};
use serde::{Deserialize, Deserializer};

use super::de;
use super::DEFAULT_STRATEGY;

/// `[admin]`: the API is on when a token is set.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// Listen address (default [`super::DEFAULT_ADMIN_LISTEN`]).
    #[serde(deserialize_with = "de::opt_addr")]
    pub listen: Option<SocketAddr>,
    /// Bearer token.
    pub token: Option<String>,
}

/// The admin API, when on.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminSettings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token.
    pub token: String,
}

impl Admin {
    /// On, listening at `listen` with `token`.
    pub fn on(listen: SocketAddr, token: impl Into<String>) -> Self {
        Admin {
            listen: Some(listen),
            token: Some(token.into()),
        }
    }
    /// The API's address and token, when it is on.
    pub fn api(&self) -> Option<AdminSettings> {
        let token = self.token.clone()?;
        let listen = self.listen.unwrap_or_else(|| {
            super::DEFAULT_ADMIN_LISTEN
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8081)))
        });
        Some(AdminSettings { listen, token })
    }
}

/// `[routing]`: the strategy and the key length.
#[derive(Debug, Clone)]
pub struct Routing {
    /// The strategy with its settings.
    pub strategy: StrategyConfig,
    /// Key length (bytes for the native API, characters for OpenAI APIs).
    pub prefix_length: PrefixLength,
}

impl Default for Routing {
    fn default() -> Self {
        // A registered name (a unit test builds the default settings).
        let kind = StrategyKind::named(DEFAULT_STRATEGY)
            .or_else(|| StrategyKind::all().next())
            .expect("a strategy is registered");
        Routing {
            strategy: StrategyConfig::new(kind),
            prefix_length: PrefixLength::default(),
        }
    }
}

impl<'de> Deserialize<'de> for Routing {
    /// The section's fields are the strategy's: read together, built into one
    /// [`StrategyConfig`] (which `validate` then builds once to check its parameters).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize, Default)]
        #[serde(deny_unknown_fields, default)]
        struct Fields {
            strategy: Option<String>,
            prefix_length: Option<u64>,
            concurrency_threshold: Option<u64>,
            overflow: Option<String>,
            balance_factor: Option<f64>,
            params: BTreeMap<String, toml::Value>,
        }
        let f = Fields::deserialize(d)?;
        let mut r = Routing::default();
        if let Some(name) = &f.strategy {
            r.strategy = StrategyConfig::new(
                name.parse::<StrategyKind>()
                    .map_err(|e| D::Error::custom(format!("`routing.strategy`: {e}")))?,
            );
        }
        if let Some(t) = f.concurrency_threshold {
            r.strategy.concurrency_threshold = ConcurrencyThreshold::new(t)
                .map_err(|e| D::Error::custom(format!("`routing.concurrency_threshold`: {e}")))?;
        }
        if let Some(o) = &f.overflow {
            r.strategy.overflow = o
                .parse::<OverflowPolicy>()
                .map_err(|e| D::Error::custom(format!("`routing.overflow`: {e}")))?;
        }
        r.strategy.balance_factor = f.balance_factor;
        // Strategies read their parameters as text; they check names and values.
        for (name, v) in f.params {
            let text = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(x) => x.to_string(),
                other => {
                    return Err(D::Error::custom(format!(
                        "`routing.params.{name}` must be a string or a number, got a {}",
                        other.type_str()
                    )))
                }
            };
            r.strategy.params.insert(name, text);
        }
        if let Some(n) = f.prefix_length {
            r.prefix_length = PrefixLength::new(n)
                .map_err(|e| D::Error::custom(format!("`routing.prefix_length`: {e}")))?;
        }
        Ok(r)
    }
}

/// `[limits]`: what clients may send.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body (bytes).
    #[serde(deserialize_with = "de::within::<1, { u64::MAX }, _, _>")]
    pub max_body_bytes: u64,
    /// Largest request head (HTTP/1 buffer, HTTP/2 header list), bytes.
    #[serde(deserialize_with = "de::within::<8192, 16777216, _, _>")]
    pub max_header_bytes: usize,
    /// Most client connections at once.
    #[serde(deserialize_with = "de::within::<1, 1000000, _, _>")]
    pub max_connections: usize,
    /// Most connections at once from one client address (0 in the file, `None`: no limit).
    #[serde(deserialize_with = "de::zero_off::<1000000, _, _>")]
    pub max_connections_per_client: Option<usize>,
    /// Most requests in flight on one instance; past it, 429 (0 in the file, `None`: no cap).
    #[serde(deserialize_with = "de::zero_off::<1000000, _, _>")]
    pub max_in_flight_per_instance: Option<u32>,
    /// Threads serving client connections, each connection on one of them for its whole life
    /// ([`crate::io_threads`]); 0: connections share the runtime that runs everything else.
    /// Default: one per CPU.
    #[serde(deserialize_with = "de::within::<0, 1024, _, _>")]
    pub io_threads: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            max_connections: 10_000,
            max_connections_per_client: Some(1024),
            max_in_flight_per_instance: None,
            io_threads: crate::io_threads::auto(),
        }
    }
}

/// `[timeouts]`, each `<name>_ms` in the file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Connecting to an instance.
    #[serde(rename = "connect_ms", deserialize_with = "de::millis")]
    pub connect: Duration,
    /// Request sent to response head received (prefill can take minutes: generous default),
    /// and head to first data for an answer whose head comes at once (vLLM's and SGLang's
    /// streams): until then the idle-stream timeout does not cut it.
    #[serde(rename = "first_byte_ms", deserialize_with = "de::millis")]
    pub first_byte: Duration,
    /// Longest pause between two response chunks.
    #[serde(rename = "idle_stream_ms", deserialize_with = "de::millis")]
    pub idle_stream: Duration,
    /// Reading the client's body.
    #[serde(rename = "client_body_ms", deserialize_with = "de::millis")]
    pub client_body: Duration,
    /// Receiving a request head, from its first byte (slow clients are cut after it).
    #[serde(rename = "client_header_ms", deserialize_with = "de::millis")]
    pub client_header: Duration,
    /// A client that takes nothing of its answer for this long (it stopped reading) is
    /// disconnected, and its request cancelled; over HTTP/2 a stream the client stopped reading
    /// is reset and its request cancelled, and the connection kept ([`crate::conn`]).
    #[serde(rename = "client_write_ms", deserialize_with = "de::millis")]
    pub client_write: Duration,
    /// A client connection idle (no request open, no traffic) for this long is closed.
    #[serde(rename = "client_idle_ms", deserialize_with = "de::millis")]
    pub client_idle: Duration,
    /// Shutdown's wait for in-flight requests.
    #[serde(rename = "shutdown_grace_ms", deserialize_with = "de::millis")]
    pub shutdown_grace: Duration,
    /// On SIGTERM, how long the router goes on serving, with `/health` and `/ready` answering
    /// 503, before it closes its listener and drains (0: at once). For load balancers that
    /// learn a backend is leaving only from its health checks; Kubernetes has the preStop
    /// pause instead.
    #[serde(rename = "shutdown_delay_ms", deserialize_with = "de::millis_or_zero")]
    pub shutdown_delay: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        let ms = Duration::from_millis;
        Timeouts {
            connect: ms(2_000),
            first_byte: ms(600_000),
            idle_stream: ms(300_000),
            client_body: ms(30_000),
            client_header: ms(10_000),
            client_write: ms(60_000),
            client_idle: ms(60_000),
            shutdown_grace: ms(30_000),
            shutdown_delay: ms(0),
        }
    }
}

/// `[retries]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retries {
    /// Further attempts after the first on refused connections, 503 and 429.
    #[serde(deserialize_with = "de::within::<0, 10, _, _>")]
    pub max_retries: u32,
}

impl Default for Retries {
    fn default() -> Self {
        Retries { max_retries: 2 }
    }
}

/// `[health]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSettings {
    /// Probe actively.
    pub active: bool,
    /// With active probes, new instances start unknown and take requests only after their
    /// first passed probe.
    pub wait_for_first_check: bool,
    /// Probed path.
    #[serde(deserialize_with = "de::abs_path")]
    pub path: String,
    /// Between probes (also the tick that ends passive ejections).
    #[serde(rename = "interval_ms", deserialize_with = "de::millis")]
    pub interval: Duration,
    /// Probe timeout.
    #[serde(rename = "timeout_ms", deserialize_with = "de::millis")]
    pub timeout: Duration,
    /// Failed probes in a row that eject.
    #[serde(deserialize_with = "de::at_least_one")]
    pub unhealthy_threshold: u32,
    /// Good probes in a row that bring back.
    #[serde(deserialize_with = "de::at_least_one")]
    pub healthy_threshold: u32,
    /// Connect errors or 5xx in a row that eject.
    #[serde(deserialize_with = "de::at_least_one")]
    pub passive_failures: u32,
    /// First ejection time; doubles on each repeated ejection.
    #[serde(rename = "eject_backoff_ms", deserialize_with = "de::millis")]
    pub eject_backoff: Duration,
    /// Longest ejection time.
    #[serde(rename = "max_eject_backoff_ms", deserialize_with = "de::millis")]
    pub max_eject_backoff: Duration,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            active: true,
            wait_for_first_check: true,
            path: "/health".into(),
            interval: Duration::from_millis(5_000),
            timeout: Duration::from_millis(2_000),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            passive_failures: 3,
            eject_backoff: Duration::from_millis(5_000),
            max_eject_backoff: Duration::from_millis(60_000),
        }
    }
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

/// `[engine_metrics]`: scraping each instance's own Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineMetrics {
    /// On or off (default off).
    pub scrape: bool,
    /// Path scraped.
    #[serde(deserialize_with = "de::abs_path")]
    pub path: String,
    /// Time between scrapes.
    #[serde(rename = "interval_ms", deserialize_with = "de::millis")]
    pub interval: Duration,
    /// Whether the engines' queues count in routing (on by default while scraping): each
    /// engine's running and waiting requests beyond this router's own are the traffic of
    /// other router replicas or clients, and load-aware strategies count them.
    pub route_on_queues: bool,
    /// How long a scraped queue is trusted, from when its scrape was sent. Past it the queue
    /// is unknown (counted as nothing beyond this router's own), never zero.
    #[serde(rename = "stale_after_ms", deserialize_with = "de::millis")]
    pub stale_after: Duration,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        EngineMetrics {
            scrape: false,
            path: "/metrics".into(),
            interval: Duration::from_millis(1_000),
            route_on_queues: true,
            stale_after: Duration::from_millis(3_000),
        }
    }
}

/// `[access_log]`: one JSON line per request (hashes and lengths, never prompt text or group
/// ids), written off the request path.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogSettings {
    /// The file (appended to; reopened on SIGHUP, so that logrotate can move it). Off when
    /// not set.
    pub path: Option<std::path::PathBuf>,
    /// Lines waiting for the writer; past it, lines are dropped and counted, and no request
    /// waits.
    #[serde(deserialize_with = "de::within::<1, 16777216, _, _>")]
    pub queue: usize,
}

impl Default for AccessLogSettings {
    fn default() -> Self {
        AccessLogSettings {
            path: None,
            queue: 65_536,
        }
    }
}

/// One `[[instances]]` entry, and the body of the admin API's add.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceEntry {
    /// Base URL, `http://host:port`.
    pub url: String,
    /// Relative capacity (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// Models and adapters served; empty means any.
    #[serde(default)]
    pub models: Vec<String>,
}

/// `[kv_events]`: subscribing to each instance's KV-cache events (vLLM's ZeroMQ publisher,
/// `--kv-events-config`), so the router knows what every engine's cache holds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsSettings {
    /// On or off (default off).
    pub subscribe: bool,
    /// The publisher's port on each instance's host, where `endpoints` names none (vLLM's
    /// examples use 5557).
    #[serde(deserialize_with = "de::within::<1, 65535, _, _>")]
    pub port: u16,
    /// The replay socket's port on each instance's host (5558 in vLLM's examples); 0: no
    /// replay, so a lost batch leaves that instance's view incomplete.
    #[serde(deserialize_with = "de::within::<0, 65535, _, _>")]
    pub replay_port: u16,
    /// The topic subscribed to (a prefix of the first frame; empty: every message).
    pub topic: String,
    /// How long to wait for each reply of a replay before the loss is accepted.
    #[serde(rename = "replay_timeout_ms", deserialize_with = "de::millis")]
    pub replay_timeout: Duration,
    /// Instances whose publisher is not on their host at `port`.
    pub endpoints: Vec<KvEventsEndpoint>,
    /// The model's `tokenizer.json` (its `tokenizer_config.json` beside it gives the chat
    /// template): `kv-aware` tokenizes requests with it to match them to the engines' blocks.
    /// `builtin:words`: the mock engine's one token per word.
    pub tokenizer: Option<std::path::PathBuf>,
    /// A chat template file to use instead of the one in `tokenizer_config.json`.
    pub chat_template: Option<std::path::PathBuf>,
    /// A tokenizer per model (`[[kv_events.tokenizers]]`), for requests naming that model;
    /// `tokenizer` above stays the one for every other model and for requests naming none.
    pub tokenizers: Vec<KvEventsTokenizer>,
}

impl Default for KvEventsSettings {
    fn default() -> Self {
        KvEventsSettings {
            subscribe: false,
            port: prefix_router_kv_events::wire::DEFAULT_PORT,
            replay_port: prefix_router_kv_events::wire::DEFAULT_REPLAY_PORT,
            topic: String::new(),
            replay_timeout: Duration::from_millis(1_000),
            endpoints: Vec::new(),
            tokenizer: None,
            chat_template: None,
            tokenizers: Vec::new(),
        }
    }
}

/// One `[[kv_events.tokenizers]]` entry: the tokenizer of requests naming `model`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsTokenizer {
    /// The model name, as requests give it in `model` (and instances list it in `models`).
    pub model: String,
    /// Its `tokenizer.json` (or `builtin:words`), as `[kv_events] tokenizer`.
    pub tokenizer: std::path::PathBuf,
    /// A chat template file to use instead of the one in its `tokenizer_config.json`.
    #[serde(default)]
    pub chat_template: Option<std::path::PathBuf>,
}

/// One `[[kv_events.endpoints]]` entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsEndpoint {
    /// The instance's URL, as in `[[instances]]`.
    pub instance: String,
    /// `tcp://host:port` of its PUB socket.
    pub publisher: String,
    /// `tcp://host:port` of its replay socket, if it has one.
    #[serde(default)]
    pub replay: Option<String>,
}

/// `[prewarm]`: an instance that joins (admin API, DNS, Kubernetes) first gets, at most once
/// each, the hottest recent prompts that will move to it, with `max_tokens: 1`, and takes its
/// share only then ([`prefix_router_core::prewarm`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrewarmSettings {
    /// Off by default: it keeps recent prompt bodies in memory (`tracked` of them, within
    /// `max_bytes`).
    pub enabled: bool,
    /// Prompts replayed to one joining instance, at most.
    #[serde(deserialize_with = "de::within::<1, 4096, _, _>")]
    pub max_prefixes: usize,
    /// Replays in flight at once.
    #[serde(deserialize_with = "de::within::<1, 256, _, _>")]
    pub concurrency: usize,
    /// How long a joining instance may warm before it takes its share regardless.
    #[serde(rename = "budget_ms", deserialize_with = "de::millis")]
    pub budget: Duration,
    /// Prompts tracked (the hottest are kept, with their bodies).
    #[serde(deserialize_with = "de::within::<2, 65536, _, _>")]
    pub tracked: usize,
    /// Half-life of a prompt's request count: what "recent" means.
    #[serde(rename = "half_life_ms", deserialize_with = "de::millis")]
    pub half_life: Duration,
    /// Bytes of prompt bodies kept, at most: past it the colder half is let go, and a body
    /// larger than all of it is not kept. At least 1 KiB (0 would keep nothing to replay).
    #[serde(deserialize_with = "de::within::<1024, { u64::MAX }, _, _>")]
    pub max_bytes: usize,
}

impl Default for PrewarmSettings {
    fn default() -> Self {
        let d = prefix_router_core::prewarm::PrewarmConfig::default();
        Self {
            enabled: false,
            max_prefixes: d.max_prefixes,
            concurrency: d.concurrency,
            budget: Duration::from_secs_f64(d.budget_s),
            tracked: d.tracked,
            half_life: Duration::from_secs_f64(d.half_life_s),
            max_bytes: d.max_bytes,
        }
    }
}

impl PrewarmSettings {
    /// What the shared planner reads.
    pub fn config(&self) -> prefix_router_core::prewarm::PrewarmConfig {
        prefix_router_core::prewarm::PrewarmConfig {
            max_prefixes: self.max_prefixes,
            concurrency: self.concurrency,
            budget_s: self.budget.as_secs_f64(),
            tracked: self.tracked,
            half_life_s: self.half_life.as_secs_f64(),
            max_bytes: self.max_bytes,
        }
    }
}
