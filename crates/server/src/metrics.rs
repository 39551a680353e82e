//! Prometheus metrics on an explicit registry, names prefixed `prefix_router_`.

pub mod learned;

use prefix_router_core::{FleetSnapshot, InstanceState, Strategy};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// `instance, api, outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Instance id, or `none` when the router answered itself (shared with the instance's
    /// own id: a label built per request allocates nothing).
    pub instance: IdLabel,
    /// `chat`, `completions`, `invocations`, `other`.
    pub api: &'static str,
    /// `ok`, `upstream_4xx`, `upstream_5xx`, `client_error`, `cancelled`, `stream_error`, ...
    pub outcome: &'static str,
}

/// An instance id as a label value, sharing the id's own string: the labels built for every
/// request allocate nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct IdLabel(pub Arc<str>);

impl EncodeLabelValue for IdLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&&*self.0, encoder)
    }
}

impl std::fmt::Display for IdLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for IdLabel {
    fn from(s: &str) -> Self {
        Self(s.into())
    }
}

impl From<String> for IdLabel {
    fn from(s: String) -> Self {
        Self(s.into())
    }
}

/// `strategy, reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// Strategy name.
    pub strategy: &'static str,
    /// Reason label (`preferred`, `overflow`, ...).
    pub reason: &'static str,
}

/// `instance`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabels {
    /// Instance id (shared, as above).
    pub instance: IdLabel,
}

/// `instance, kind`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Instance id.
    pub instance: String,
    /// `connect`, `timeout`, `status_5xx`, `status_429`, `stream`, `idle_timeout`, `other`.
    pub kind: &'static str,
}

/// `api`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// API label.
    pub api: &'static str,
}

/// `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Retries: `connect`, `status_503`, `status_429`. Connections closed by the router:
    /// `header_timeout`, `idle`, `per_client_limit`. Requests refused: `in_flight_cap`.
    pub reason: &'static str,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~9 min: TTFT and request durations of LLM calls span that range.
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

fn decision_histogram() -> Histogram {
    // 0.5 µs .. 1 ms: routing decisions are microseconds. Closer bounds than doubling around
    // 10 µs, the decision budget (issue 12), so that its quantiles can be read against it.
    // Written in seconds: bounds computed as µs × 1e-6 print as 0.0000049999999999999999.
    const BOUNDS: [f64; 16] = [
        5e-7, 1e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6, 8e-6, 1e-5, 1.5e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4,
        1e-3,
    ];
    Histogram::new(BOUNDS)
}

/// Every metric the router exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Prompts replayed to joining instances (`[prewarm]`), by result.
    pub prewarm_replays: Family<ReasonLabels, Counter>,
    /// Requests finished, by instance, API and outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// Routing decisions, by strategy and reason.
    pub decisions: Family<DecisionLabels, Counter>,
    /// Requests in flight per instance (set at scrape time from the fleet).
    pub in_flight: Family<InstanceLabels, Gauge>,
    /// 1 when the instance takes new requests, else 0 (set at scrape time).
    pub healthy: Family<InstanceLabels, Gauge>,
    /// Request received to first response body byte, per instance.
    pub ttft: Family<InstanceLabels, Histogram>,
    /// Request received to response finished, per API.
    pub duration: Family<ApiLabels, Histogram>,
    /// Time spent routing a request (the strategy's choice and its bookkeeping).
    pub decision_latency: Histogram,
    /// Upstream errors by instance and kind.
    pub upstream_errors: Family<ErrorLabels, Counter>,
    /// Retries by reason.
    pub retries: Family<ReasonLabels, Counter>,
    /// Streams whose upstream failed part way, ended with an SSE `error` event.
    pub stream_error_events: Counter,
    /// Client connections the router closed or refused, by reason.
    pub connections_closed: Family<ReasonLabels, Counter>,
    /// Requests refused before routing by admission control, by reason.
    pub shed: Family<ReasonLabels, Counter>,
    /// Engines' prefix-cache hit ratio over the last scrape interval (scraped).
    pub engine_hit_ratio: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    /// Requests the engine runs (scraped).
    pub engine_running: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    /// Requests waiting in the engine's queue (scraped).
    pub engine_waiting: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    /// Engine KV-cache usage, 0..1 (scraped).
    pub engine_kv_usage: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    /// Requests on the engine this router did not send (scraped; what routing counts).
    pub engine_others: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    /// The strategy's learned state (set at scrape time).
    pub learned: learned::Learned,
    /// One scrape at a time: each clears and refills the scrape-time series, and a concurrent
    /// one must not encode them half refilled.
    scrape: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers the access log's counters (its own: metrics beside their component).
    pub fn register_access_log(&mut self, log: &crate::access_log::AccessLog) {
        self.registry.register(
            "access_log_lines",
            "Access log lines written",
            log.written.clone(),
        );
        self.registry.register(
            "access_log_dropped",
            "Access log lines dropped because the writer was behind (no request waits for it)",
            log.dropped.clone(),
        );
    }

    /// Registers the KV-event subscribers' metrics (theirs, beside them).
    pub fn register_kv_events(&mut self, feeds: &crate::kv_events::KvFeeds) {
        feeds.metrics.register(&mut self.registry);
    }

    /// Creates the metrics and registers them.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("prefix_router");
        let requests = Family::<RequestLabels, Counter>::default();
        let decisions = Family::<DecisionLabels, Counter>::default();
        let in_flight = Family::<InstanceLabels, Gauge>::default();
        let healthy = Family::<InstanceLabels, Gauge>::default();
        let ttft = Family::<InstanceLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let duration = Family::<ApiLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let decision_latency = decision_histogram();
        let upstream_errors = Family::<ErrorLabels, Counter>::default();
        let retries = Family::<ReasonLabels, Counter>::default();
        let stream_error_events = Counter::default();
        let connections_closed = Family::<ReasonLabels, Counter>::default();
        let shed = Family::<ReasonLabels, Counter>::default();
        let prewarm_replays = Family::<ReasonLabels, Counter>::default();
        let engine_hit_ratio = Family::<InstanceLabels, Gauge<f64, AtomicU64>>::default();
        let engine_running = Family::<InstanceLabels, Gauge<f64, AtomicU64>>::default();
        let engine_waiting = Family::<InstanceLabels, Gauge<f64, AtomicU64>>::default();
        let engine_kv_usage = Family::<InstanceLabels, Gauge<f64, AtomicU64>>::default();
        let engine_others = Family::<InstanceLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "requests",
            "Requests finished by instance, API and outcome",
            requests.clone(),
        );
        registry.register(
            "decisions",
            "Routing decisions by strategy and reason",
            decisions.clone(),
        );
        registry.register(
            "in_flight",
            "Requests in flight per instance",
            in_flight.clone(),
        );
        registry.register(
            "instance_healthy",
            "1 when the instance takes new requests",
            healthy.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Request received to first response body byte, per instance",
            ttft.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Request received to response finished, per API",
            duration.clone(),
        );
        registry.register(
            "routing_decision_seconds",
            "Time spent routing a request: the strategy's choice and what it records of it",
            decision_latency.clone(),
        );
        registry.register(
            "upstream_errors",
            "Upstream errors by instance and kind",
            upstream_errors.clone(),
        );
        registry.register(
            "retries",
            "Retries on another instance, by reason",
            retries.clone(),
        );
        registry.register(
            "stream_error_events",
            "Streams whose upstream failed part way, ended with an SSE error event",
            stream_error_events.clone(),
        );
        registry.register(
            "client_connections_closed",
            "Client connections the router closed or refused, by reason",
            connections_closed.clone(),
        );
        registry.register(
            "requests_shed",
            "Requests refused with 429 by admission control, by reason",
            shed.clone(),
        );
        registry.register(
            "prewarm_replays",
            "Prompts replayed to joining instances before they took requests, by result (ok, failed)",
            prewarm_replays.clone(),
        );
        registry.register(
            "engine_prefix_cache_hit_ratio",
            "Engine prefix-cache hit ratio over the last scrape interval (engine metrics)",
            engine_hit_ratio.clone(),
        );
        registry.register(
            "engine_requests_running",
            "Requests the engine runs (engine metrics)",
            engine_running.clone(),
        );
        registry.register(
            "engine_requests_waiting",
            "Requests waiting in the engine's queue (engine metrics)",
            engine_waiting.clone(),
        );
        registry.register(
            "engine_kv_cache_usage",
            "Engine KV-cache usage, 0 to 1 (engine metrics)",
            engine_kv_usage.clone(),
        );
        registry.register(
            "engine_requests_others",
            "Requests on the engine that this router did not send: its running and waiting beyond this router's in flight (other replicas' or clients'), as routing counts them",
            engine_others.clone(),
        );
        let learned = learned::Learned::register(&mut registry);
        Self {
            learned,
            scrape: std::sync::Mutex::new(()),
            registry,
            engine_hit_ratio,
            engine_running,
            engine_waiting,
            engine_kv_usage,
            engine_others,
            requests,
            decisions,
            in_flight,
            healthy,
            ttft,
            duration,
            decision_latency,
            upstream_errors,
            retries,
            stream_error_events,
            connections_closed,
            shed,
            prewarm_replays,
        }
    }

    /// Counts an upstream error.
    pub fn upstream_error(&self, instance: &str, kind: &'static str) {
        self.upstream_errors
            .get_or_create(&ErrorLabels {
                instance: instance.to_string(),
                kind,
            })
            .inc();
    }

    /// Prometheus text for a scrape; refreshes the per-instance gauges from `fleet` and the
    /// learned-state metrics from `strategy` (the one in force) first.
    pub fn render(&self, fleet: &FleetSnapshot, strategy: &dyn Strategy) -> String {
        let _one_scrape = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.learned.refresh(strategy);
        self.in_flight.clear();
        self.healthy.clear();
        for inst in fleet.instances() {
            let labels = InstanceLabels {
                instance: IdLabel(Arc::clone(&inst.id().0)),
            };
            self.in_flight
                .get_or_create(&labels)
                .set(i64::from(inst.in_flight()));
            self.healthy
                .get_or_create(&labels)
                .set(i64::from(inst.state() == InstanceState::Healthy));
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
