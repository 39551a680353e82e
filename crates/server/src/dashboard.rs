//! The live page on the admin listener: `GET /dashboard` is one self-contained HTML file (no
//! script, style or font from anywhere else), which polls `GET /admin/dashboard.json?window=S`
//! (behind the admin token, like the rest of the admin API) every two seconds.
//!
//! The JSON holds each instance's cumulative counters now and as they were about `S` seconds
//! ago, from a ring of snapshots a background task takes every [`EVERY`] (kept for
//! [`KEEP`]); the page shows the differences: shares, hit rates, TTFT quantiles from bucket
//! counts, the decision mix. A page opened after a burst of traffic still shows it, and the
//! request path does nothing for the page but count (a few relaxed atomic additions).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prefix_router_core::Reason;
use serde::Serialize;
use serde_json::{json, Value};

use crate::state::AppState;
use crate::stats::TTFT_BOUNDS;

/// The page.
pub const PAGE: &str = include_str!("dashboard.html");

/// How often the ring takes a snapshot.
pub const EVERY: Duration = Duration::from_secs(5);
/// How long snapshots are kept (the page's longest window, and one more).
pub const KEEP: Duration = Duration::from_secs(305);

/// One instance's counters at one time.
#[derive(Debug, Clone, Serialize)]
struct Counters {
    id: Arc<str>,
    url: String,
    state: &'static str,
    in_flight: u32,
    requests: u64,
    overflow: u64,
    errors: u64,
    reasons: Vec<u64>,
    prompt_units: u64,
    predicted_cached_units: u64,
    usage_prompt_tokens: u64,
    usage_cached_tokens: u64,
    ttft: Vec<u64>,
}

/// Snapshots of every instance's counters, oldest first.
#[derive(Debug, Default)]
pub struct History {
    ring: Mutex<VecDeque<(Instant, Vec<Counters>)>>,
}

fn counts(c: &[AtomicU64]) -> Vec<u64> {
    c.iter().map(|c| c.load(Ordering::Relaxed)).collect()
}

fn snapshot(state: &AppState) -> Vec<Counters> {
    state
        .fleet
        .snapshot()
        .instances()
        .iter()
        .map(|i| {
            let s = state.stats.get(i);
            let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
            Counters {
                id: Arc::clone(&i.id().0),
                url: i.spec().url.clone(),
                state: i.state().label(),
                in_flight: i.in_flight(),
                requests: n(&s.requests),
                overflow: n(&s.overflow),
                errors: n(&s.errors),
                reasons: counts(&s.reasons),
                prompt_units: n(&s.prompt_units),
                predicted_cached_units: n(&s.predicted_cached_units),
                usage_prompt_tokens: n(&s.usage_prompt_tokens),
                usage_cached_tokens: n(&s.usage_cached_tokens),
                ttft: counts(&s.ttft),
            }
        })
        .collect()
}

impl History {
    fn ring(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, Vec<Counters>)>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a snapshot now and forgets those older than [`KEEP`].
    pub fn record(&self, state: &AppState) {
        let now = Instant::now();
        let snap = snapshot(state);
        let mut ring = self.ring();
        ring.push_back((now, snap));
        while ring
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > KEEP)
        {
            ring.pop_front();
        }
    }
}

/// Takes a snapshot every [`EVERY`] until aborted.
pub async fn run(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        state.dashboard.record(&state);
    }
}

/// What the page polls: the counters now, and the oldest snapshot no older than `window`
/// (`then`: null when there is none yet, and the page shows totals since start).
pub fn data(state: &AppState, window: Duration) -> Value {
    let now = snapshot(state);
    let at = Instant::now();
    let then = state
        .dashboard
        .ring()
        .iter()
        .find(|(t, _)| at.duration_since(*t) <= window)
        .map(|(t, s)| (at.duration_since(*t).as_secs_f64(), s.clone()));
    json!({
        "strategy": state.routing.load().strategy.name(),
        "reasons": Reason::LABELS,
        "ttft_bounds_s": TTFT_BOUNDS,
        "now": now,
        "then": then.as_ref().map(|(_, s)| s),
        "window_s": then.map(|(age, _)| age),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_fetches_nothing_from_elsewhere() {
        let page = super::PAGE;
        for outside in ["http://", "https://", "//cdn", "@import", "<link", "src=\""] {
            assert!(!page.contains(outside), "the page refers to {outside}");
        }
        assert!(page.contains("/admin/dashboard.json"));
    }
}
