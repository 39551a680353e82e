//! Per-instance counters for the admin API, and each instance's health record.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use prefix_router_core::prehashed::PreHashedMap;
use prefix_router_core::Instance;

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
    /// It has reported `cached_tokens`: its engine sends prompt token details, so an answer
    /// with usage and without them had none cached (vLLM leaves them out when the count is 0).
    pub reports_cached: std::sync::atomic::AtomicBool,
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
    /// When it last came back from an ejection: a passive ejection within
    /// `health.max_eject_backoff` of it is a repeat (its backoff doubles), a later one a new
    /// incident (the backoff starts again from `health.eject_backoff`).
    pub recovered_at: Option<Instant>,
}

/// Stats of every instance the router has seen, by its id's hash ([`Instance::id_hash`]: the
/// identity the strategies key their learned state by too). Read once per request without a
/// lock or a string hash: the map is replaced whole when an instance first shows up or leaves
/// (rare) and read through an `ArcSwap`.
#[derive(Debug, Default)]
pub struct StatsTable {
    map: ArcSwap<PreHashedMap<Arc<InstanceStats>>>,
}

impl StatsTable {
    /// The stats of `inst`, created on first use.
    pub fn get(&self, inst: &Instance) -> Arc<InstanceStats> {
        let key = inst.id_hash();
        loop {
            if let Some(s) = self.map.load().get(&key) {
                return Arc::clone(s);
            }
            // Two threads adding the same instance at once: the second's copy finds the first's.
            self.map.rcu(|m| {
                let mut m = PreHashedMap::clone(m);
                m.entry(key).or_default();
                m
            });
        }
    }

    /// Forgets instances no longer in the fleet (`keep`: whether the instance with this id
    /// hash stays).
    pub fn retain(&self, keep: impl Fn(u64) -> bool) {
        self.map.rcu(|m| {
            let mut m = PreHashedMap::clone(m);
            m.retain(|&key, _| keep(key));
            m
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_core::InstanceSpec;

    fn inst(url: &str) -> Instance {
        Instance::new(InstanceSpec::from_url(url.to_string()))
    }

    #[test]
    fn one_record_per_instance_kept_until_it_leaves() {
        let table = StatsTable::default();
        let (a, b) = (inst("http://127.0.0.1:9001"), inst("http://127.0.0.1:9002"));
        let first = table.get(&a);
        InstanceStats::bump(&first.requests);
        // The same instance rebuilt (a spec change keeps its id) finds the same record.
        let again = table.get(&inst("http://127.0.0.1:9001"));
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(again.requests.load(Ordering::Relaxed), 1);
        assert!(!Arc::ptr_eq(&first, &table.get(&b)));
        table.retain(|key| key == b.id_hash());
        assert_eq!(
            table.get(&a).requests.load(Ordering::Relaxed),
            0,
            "a left: a fresh record"
        );
        assert!(Arc::ptr_eq(&table.get(&b), &table.get(&b)));
    }

    #[test]
    fn threads_adding_the_same_instance_share_one_record() {
        let table = Arc::new(StatsTable::default());
        let got: Vec<Arc<InstanceStats>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let table = Arc::clone(&table);
                    s.spawn(move || table.get(&inst("http://127.0.0.1:9003")))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("joins"))
                .collect()
        });
        assert!(got.iter().all(|s| Arc::ptr_eq(s, &got[0])));
    }
}
