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
use std::sync::{Arc, OnceLock};

use crate::outcome::Outcome;
use crate::pick::Api;

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
    /// `header_timeout`, `idle`, `per_client_limit`, `write_timeout`. Requests refused:
    /// `in_flight_cap`.
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
    /// HTTP/2 streams whose request the router cancelled while keeping the connection, by
    /// reason (`write_timeout`: the client took nothing of the answer for
    /// `timeouts.client_write_ms`).
    pub streams_reset: Family<ReasonLabels, Counter>,
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
    /// `duration`'s series per API, each looked up once ([`Metrics::observe_duration`]).
    duration_by_api: [OnceLock<Histogram>; Api::ALL.len()],
    /// `decisions`' series per reason, for the strategy that first used it
    /// ([`Metrics::count_decision`]).
    decision_by_reason:
        [OnceLock<(&'static str, Counter)>; prefix_router_core::Reason::LABELS.len()],
    /// One scrape at a time: each clears and refills the scrape-time series, and a concurrent
    /// one must not encode them half refilled.
    pub(crate) scrape: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Every `kind` of `upstream_errors_total`: an attempt's failures, a broken answer's outcome,
/// a 5xx, a fallback the proxy used (epp).
fn error_kinds() -> impl Iterator<Item = &'static str> {
    [
        "timeout",
        "connect",
        "closed",
        "other",
        "status_5xx",
        "fallback_used",
    ]
    .into_iter()
    .chain(Outcome::ALL.into_iter().map(Outcome::label))
}

impl Metrics {
    /// Drops an instance's series that only traffic creates (time to first byte, requests,
    /// upstream errors) once it left the fleet. With discovery, every rescheduled pod is a new
    /// instance id: kept for good, each left some thirty series behind, and a router's page (and
    /// the monitoring's cardinality) grew with the fleet's history. Requests still in flight to
    /// it when it left may count into new series of its id; they are few.
    pub fn forget_instance(&self, series: &InstanceSeries, id: &Arc<str>) {
        series
            .forgotten
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.ttft.remove(&InstanceLabels {
            instance: IdLabel(Arc::clone(id)),
        });
        for api in Api::ALL {
            for outcome in Outcome::ALL {
                self.requests.remove(&RequestLabels {
                    instance: IdLabel(Arc::clone(id)),
                    api: api.label(),
                    outcome: outcome.label(),
                });
            }
        }
        for kind in error_kinds() {
            self.upstream_errors.remove(&ErrorLabels {
                instance: id.to_string(),
                kind,
            });
        }
    }
}

impl InstanceSeries {
    fn is_forgotten(&self) -> bool {
        self.forgotten.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One instance's busiest series, each looked up in its family once. A family lookup hashes
/// the label set (the instance id's text included) under a lock; these are used by every
/// request. Families drop these series only when the instance leaves the fleet
/// ([`Metrics::forget_instance`], after which its stats and their handles are dropped too), so
/// a kept handle stays the exported one.
#[derive(Debug, Default)]
pub struct InstanceSeries {
    /// The instance left the fleet and its series were dropped ([`Metrics::forget_instance`]):
    /// what its requests still in flight count then is not exported (it would make the series
    /// again, for good).
    forgotten: std::sync::atomic::AtomicBool,
    ttft: OnceLock<Histogram>,
    /// `requests{outcome="ok"}` per API.
    ok: [OnceLock<Counter>; Api::ALL.len()],
}

impl Metrics {
    /// Observes a time to first byte in the instance's `ttft_seconds` series.
    pub fn observe_ttft(&self, series: &InstanceSeries, id: &Arc<str>, seconds: f64) {
        if series.is_forgotten() {
            return;
        }
        series
            .ttft
            .get_or_init(|| {
                self.ttft
                    .get_or_create(&InstanceLabels {
                        instance: IdLabel(Arc::clone(id)),
                    })
                    .clone()
            })
            .observe(seconds);
    }

    /// Counts a finished request in `requests` (the instance's own handle for answered ones,
    /// the family for the rarer outcomes).
    pub fn count_request(
        &self,
        series: &InstanceSeries,
        id: &Arc<str>,
        api: Api,
        outcome: Outcome,
    ) {
        if series.is_forgotten() {
            return;
        }
        let labels = || RequestLabels {
            instance: IdLabel(Arc::clone(id)),
            api: api.label(),
            outcome: outcome.label(),
        };
        match series.ok.get(api.index()) {
            Some(slot) if outcome == Outcome::Ok => slot
                .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                .inc(),
            _ => self.requests.get_or_create(&labels()).inc(),
        };
    }

    /// Observes a request's duration in its API's `request_duration_seconds` series.
    pub fn observe_duration(&self, api: Api, seconds: f64) {
        let series = || {
            self.duration
                .get_or_create(&ApiLabels { api: api.label() })
                .clone()
        };
        match self.duration_by_api.get(api.index()) {
            Some(slot) => slot.get_or_init(series).observe(seconds),
            None => series().observe(seconds),
        }
    }

    /// Counts a routing decision in `decisions`. Each reason keeps the series of the strategy
    /// that used it first; after a reload to another strategy, that one's go through the
    /// family.
    pub fn count_decision(&self, strategy: &'static str, reason: &prefix_router_core::Reason) {
        let labels = || DecisionLabels {
            strategy,
            reason: reason.label(),
        };
        if let Some(slot) = self.decision_by_reason.get(reason.index()) {
            let (first, counter) =
                slot.get_or_init(|| (strategy, self.decisions.get_or_create(&labels()).clone()));
            if *first == strategy {
                counter.inc();
                return;
            }
        }
        self.decisions.get_or_create(&labels()).inc();
    }

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
        let streams_reset = Family::<ReasonLabels, Counter>::default();
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
            "client_streams_reset",
            "HTTP/2 streams whose request the router cancelled, keeping the connection, by reason",
            streams_reset.clone(),
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
            duration_by_api: Default::default(),
            decision_by_reason: Default::default(),
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
            streams_reset,
            shed,
            prewarm_replays,
        }
    }

    /// Counts an upstream error of the instance whose series are `series`.
    pub fn upstream_error(&self, series: &InstanceSeries, instance: &str, kind: &'static str) {
        if series.is_forgotten() {
            return;
        }
        debug_assert!(
            error_kinds().any(|k| k == kind),
            "an upstream error kind forget_instance does not know: {kind}"
        );
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

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_core::{Reason, StrategyConfig, StrategyKind};

    fn page(m: &Metrics) -> String {
        let strategy = StrategyConfig::new(StrategyKind::named("round-robin").unwrap())
            .build()
            .unwrap();
        m.render(&FleetSnapshot::default(), &*strategy)
    }

    /// An instance that left takes its traffic series with it; the others' stay.
    #[test]
    fn a_forgotten_instance_leaves_no_series() {
        let m = Metrics::new();
        let (a, b) = (InstanceSeries::default(), InstanceSeries::default());
        let (ida, idb): (Arc<str>, Arc<str>) = ("http://10.0.0.1:8000".into(), "b".into());
        for (s, id) in [(&a, &ida), (&b, &idb)] {
            m.count_request(s, id, Api::Chat, Outcome::Ok);
            m.count_request(s, id, Api::Completions, Outcome::StreamBroken);
            m.observe_ttft(s, id, 0.2);
            m.upstream_error(s, id, Outcome::StreamBroken.label());
            m.upstream_error(s, id, "status_5xx");
            m.upstream_error(s, id, "connect");
        }
        m.forget_instance(&a, &ida);
        // What its requests still in flight count after it left makes no series again.
        m.count_request(&a, &ida, Api::Chat, Outcome::Cancelled);
        m.upstream_error(&a, &ida, "closed");
        m.observe_ttft(&a, &ida, 0.3);
        let p = page(&m);
        assert!(!p.contains("10.0.0.1"), "{p}");
        for name in [
            "prefix_router_requests_total",
            "prefix_router_upstream_errors_total",
            "prefix_router_ttft_seconds_count",
        ] {
            assert!(
                p.lines()
                    .any(|l| l.starts_with(name) && l.contains("\"b\"")),
                "{name} of b: {p}"
            );
        }
    }

    /// The kept handles count in the exported series, beside what goes through the families.
    #[test]
    fn kept_series_handles_count_in_the_exported_series() {
        let m = Metrics::new();
        let (a, b) = (InstanceSeries::default(), InstanceSeries::default());
        let (ida, idb): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        for _ in 0..3 {
            m.count_request(&a, &ida, Api::Chat, Outcome::Ok);
        }
        m.count_request(&a, &ida, Api::Completions, Outcome::Ok);
        m.count_request(&a, &ida, Api::Chat, Outcome::Cancelled);
        m.count_request(&b, &idb, Api::Chat, Outcome::Ok);
        m.observe_ttft(&a, &ida, 0.2);
        m.observe_ttft(&a, &ida, 0.4);
        m.observe_duration(Api::Chat, 1.0);
        m.observe_duration(Api::Chat, 2.0);
        m.count_decision("cache-aware", &Reason::Preferred);
        m.count_decision("cache-aware", &Reason::Preferred);
        // Another strategy after a reload: its own series, not the first one's.
        m.count_decision("random", &Reason::Preferred);
        let p = page(&m);
        let v = |name, labels: &[(&str, &str)]| crate::prom::value(&p, name, labels);
        let req = |i, api, outcome| {
            v(
                "prefix_router_requests_total",
                &[("instance", i), ("api", api), ("outcome", outcome)],
            )
        };
        assert_eq!(req("a", "chat", "ok"), Some(3.0));
        assert_eq!(req("a", "completions", "ok"), Some(1.0));
        assert_eq!(req("a", "chat", "cancelled"), Some(1.0));
        assert_eq!(req("b", "chat", "ok"), Some(1.0));
        let ttft = v("prefix_router_ttft_seconds_count", &[("instance", "a")]);
        assert_eq!(ttft, Some(2.0));
        let sum = v(
            "prefix_router_request_duration_seconds_sum",
            &[("api", "chat")],
        );
        assert_eq!(sum, Some(3.0));
        let decisions = |s| {
            v(
                "prefix_router_decisions_total",
                &[("strategy", s), ("reason", "preferred")],
            )
        };
        assert_eq!(decisions("cache-aware"), Some(2.0));
        assert_eq!(decisions("random"), Some(1.0));
    }
}
