//! The subscribers' series on `/metrics`: per instance, events applied, replays, the view's
//! size and the subscription's health.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::metrics::InstanceLabels;

/// `instance, result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// Instance id.
    pub instance: String,
    /// `stored`/`removed` (blocks), `recovered`/`lost` (replays), `gpu`/`offloaded` (view).
    pub kind: &'static str,
}

/// The metrics of the subscribers (registered beside the router's own).
#[derive(Debug)]
pub struct KvEventMetrics {
    pub(super) batches: Family<InstanceLabels, Counter>,
    pub(super) blocks: Family<ResultLabels, Counter>,
    pub(super) gaps: Family<InstanceLabels, Counter>,
    pub(super) replays: Family<ResultLabels, Counter>,
    pub(super) malformed: Family<InstanceLabels, Counter>,
    pub(super) unknown: Family<InstanceLabels, Counter>,
    pub(super) lag: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    pub(super) view_blocks: Family<ResultLabels, Gauge>,
    pub(super) view_partial: Family<InstanceLabels, Gauge>,
    pub(super) connected: Family<InstanceLabels, Gauge>,
    pub(super) recovery: Histogram,
    pub(super) tokenize_skipped: Counter,
}

/// Seconds from a gap's detection to the end of its replay: 0.1 ms to about 50 s.
fn recovery_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 2.0, 20))
}

impl Default for KvEventMetrics {
    fn default() -> Self {
        Self {
            batches: Family::default(),
            blocks: Family::default(),
            gaps: Family::default(),
            replays: Family::default(),
            malformed: Family::default(),
            unknown: Family::default(),
            lag: Family::default(),
            view_blocks: Family::default(),
            view_partial: Family::default(),
            connected: Family::default(),
            recovery: recovery_histogram(),
            tokenize_skipped: Counter::default(),
        }
    }
}

impl KvEventMetrics {
    /// Registers every series under `registry` (prefixed `prefix_router_`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "kv_event_batches",
            "KV-event batches applied, per instance",
            self.batches.clone(),
        );
        r.register(
            "kv_event_blocks",
            "Blocks named by applied KV events, per instance and kind (stored, removed)",
            self.blocks.clone(),
        );
        r.register(
            "kv_event_gaps",
            "Sequence gaps in an instance's KV events (lost messages, or joining mid-stream)",
            self.gaps.clone(),
        );
        r.register(
            "kv_event_replays",
            "Gaps filled from the replay socket (recovered) or given up (lost)",
            self.replays.clone(),
        );
        r.register(
            "kv_event_malformed",
            "KV-event messages or payloads that could not be decoded",
            self.malformed.clone(),
        );
        r.register(
            "kv_event_unknown_events",
            "KV events of a type the router does not know, skipped (an engine newer than the router: the view may miss what they did)",
            self.unknown.clone(),
        );
        r.register(
            "kv_event_lag_seconds",
            "Now minus the engine's timestamp of the last applied batch",
            self.lag.clone(),
        );
        r.register(
            "kv_view_blocks",
            "Blocks the router's view of an engine lists (gpu: resident; offloaded)",
            self.view_blocks.clone(),
        );
        r.register(
            "kv_view_partial",
            "1 while an instance's view misses batches it could not replay",
            self.view_partial.clone(),
        );
        r.register(
            "kv_events_connected",
            "1 while subscribed to the instance's KV events",
            self.connected.clone(),
        );
        r.register(
            "kv_tokenize_skipped",
            "Requests routed without their token blocks because too many waited to be tokenized (kv-aware inferred their match instead)",
            self.tokenize_skipped.clone(),
        );
        r.register(
            "kv_event_recovery_seconds",
            "From a gap's detection to the end of its replay: how long a view was not trusted for routing (cache-aware's inference stood in)",
            self.recovery.clone(),
        );
    }

    pub(super) fn forget(&self, instance: &str) {
        let i = InstanceLabels {
            instance: instance.into(),
        };
        let k = |kind| ResultLabels {
            instance: instance.to_string(),
            kind,
        };
        for f in [&self.batches, &self.gaps, &self.malformed, &self.unknown] {
            f.remove(&i);
        }
        self.lag.remove(&i);
        self.view_partial.remove(&i);
        self.connected.remove(&i);
        for kind in ["stored", "removed"] {
            self.blocks.remove(&k(kind));
        }
        for kind in ["recovered", "lost"] {
            self.replays.remove(&k(kind));
        }
        for kind in ["gpu", "offloaded"] {
            self.view_blocks.remove(&k(kind));
        }
    }
}
