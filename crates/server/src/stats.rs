//! Per-instance counters for the admin API, and each instance's health record.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Upper bounds, in seconds, of the per-instance TTFT buckets the live page reads (one more,
/// open bucket follows). Cumulative counts: the page takes differences over its own window.
pub const TTFT_BOUNDS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
];

/// Counters and health record of one instance (by id); they outlive membership changes.
#[derive(Debug, Default)]
pub struct InstanceStats {
    /// Requests sent to it.
    pub requests: AtomicU64,
    /// Of which overflow decisions.
    pub overflow: AtomicU64,
    /// Decisions for it, by reason ([`prefix_router_core::Reason::index`]).
    pub reasons: [AtomicU64; prefix_router_core::Reason::LABELS.len()],
    /// Prompt length (chain units: characters or bytes) of the requests sent to it.
    pub prompt_units: AtomicU64,
    /// Of which the strategy expected it to hold cached.
    pub predicted_cached_units: AtomicU64,
    /// Prompt tokens of its answers that reported `cached_tokens`.
    pub usage_prompt_tokens: AtomicU64,
    /// The `cached_tokens` those answers reported.
    pub usage_cached_tokens: AtomicU64,
    /// Times to first byte, counted in [`TTFT_BOUNDS`] buckets.
    pub ttft: [AtomicU64; TTFT_BOUNDS.len() + 1],
    /// Upstream errors (connect, timeout, 5xx, broken stream).
    pub errors: AtomicU64,
    /// Connect errors or 5xx answers in a row (passive health; atomic so successes never lock).
    pub passive_failures: std::sync::atomic::AtomicU32,
    /// Health record (consecutive results, ejection).
    pub health: Mutex<HealthRecord>,
    /// Its series of the exported metrics, looked up once instead of per request.
    pub series: crate::metrics::InstanceSeries,
}

impl InstanceStats {
    /// Adds one to a counter.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a time to first byte.
    pub fn observe_ttft(&self, seconds: f64) {
        let i = TTFT_BOUNDS.partition_point(|b| *b < seconds);
        if let Some(c) = self.ttft.get(i) {
            Self::bump(c);
        }
    }

    /// Locks the health record (a poisoned lock still holds valid counters).
    pub fn health(&self) -> std::sync::MutexGuard<'_, HealthRecord> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Consecutive results and ejection of one instance.
#[derive(Debug, Default, Clone)]
pub struct HealthRecord {
    /// Failed probes in a row.
    pub probe_failures: u32,
    /// Good probes in a row.
    pub probe_successes: u32,
    /// Ejected until then (passive ejection backoff).
    pub ejected_until: Option<Instant>,
    /// Length of the next passive ejection.
    pub next_backoff: Option<Duration>,
}

/// Stats of every instance the router has seen, by id.
#[derive(Debug, Default)]
pub struct StatsTable {
    map: RwLock<HashMap<String, Arc<InstanceStats>>>,
}

impl StatsTable {
    /// The stats of `id`, created on first use.
    pub fn get(&self, id: &str) -> Arc<InstanceStats> {
        if let Some(s) = self.map.read().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Arc::clone(s);
        }
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        Arc::clone(map.entry(id.to_string()).or_default())
    }

    /// Forgets instances no longer in the fleet.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| keep(id));
    }
}
