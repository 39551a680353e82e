//! Per-instance counters for the admin API, and each instance's health record.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Counters and health record of one instance (by id); they outlive membership changes.
#[derive(Debug, Default)]
pub struct InstanceStats {
    /// Requests sent to it.
    pub requests: AtomicU64,
    /// Of which overflow decisions.
    pub overflow: AtomicU64,
    /// Upstream errors (connect, timeout, 5xx, broken stream).
    pub errors: AtomicU64,
    /// Connect errors or 5xx answers in a row (passive health; atomic so successes never lock).
    pub passive_failures: std::sync::atomic::AtomicU32,
    /// Health record (consecutive results, ejection).
    pub health: Mutex<HealthRecord>,
}

impl InstanceStats {
    /// Adds one to a counter.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
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
