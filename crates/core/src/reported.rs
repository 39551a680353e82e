//! What each engine reports of its own queue, beside what this router sent it.
//!
//! A router replica counts only its own requests in flight; an engine behind several replicas
//! (or also called directly) is busier than that. The server scrapes each engine's Prometheus
//! page (vLLM `num_requests_running` / `num_requests_waiting`, SGLang's and llama.cpp's
//! equivalents) and stores here the requests on it that this router did not send, with the
//! time past which that reading is too old to trust. Strategies read it with the caller's clock
//! ([`Instance::others`](crate::Instance::others)): a stale or missing reading is *unknown*
//! (`None`), never zero, so a scrape that stopped answering does not make an instance look idle.
//!
//! Core stays pure: the server writes readings from its scrapes, the simulator from its engine
//! models after a configurable delay.

use std::sync::atomic::{AtomicU64, Ordering};

/// Requests an engine holds that this router did not send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineQueue {
    /// Queued, not yet scheduled (their prefill is ahead of anything sent now).
    pub waiting: u32,
    /// Scheduled: prefilling or decoding (each shares every engine step).
    pub running: u32,
}

impl EngineQueue {
    /// Others' share of an engine's reported `running` and `waiting`, when this router has
    /// `own` requests in flight there. Which of the engine's requests are ours is not known,
    /// so the others are split between waiting and running in the engine's own proportion.
    pub fn others(running: f64, waiting: f64, own: u32) -> Self {
        let clamp = |v: f64| if v.is_finite() { v.max(0.0) } else { 0.0 };
        let (running, waiting) = (clamp(running), clamp(waiting));
        let total = running + waiting;
        let others = (total - f64::from(own)).max(0.0);
        if total <= 0.0 || others <= 0.0 {
            return Self::default();
        }
        let w = (others * waiting / total).round();
        let r = (others - w).round();
        let cap = |v: f64| v.min(f64::from(u32::MAX >> 1)) as u32;
        Self {
            waiting: cap(w),
            running: cap(r),
        }
    }
    /// Both together.
    pub fn total(&self) -> u32 {
        self.waiting.saturating_add(self.running)
    }
}

/// The latest reading of an instance, shared by every snapshot that holds the instance.
#[derive(Debug)]
pub(crate) struct Reported {
    /// `waiting` in the high half, `running` in the low half.
    counts: AtomicU64,
    /// `f64` bits of the caller-clock time past which the reading is unknown (0: none).
    valid_until: AtomicU64,
}

impl Default for Reported {
    fn default() -> Self {
        Self {
            counts: AtomicU64::new(0),
            valid_until: AtomicU64::new(0f64.to_bits()),
        }
    }
}

impl Reported {
    pub(crate) fn set(&self, q: EngineQueue, valid_until: f64) {
        // Counts first: a reader that sees the new deadline with the old counts reads a
        // reading one scrape old, which the deadline allowed anyway.
        let packed = (u64::from(q.waiting) << 32) | u64::from(q.running);
        self.counts.store(packed, Ordering::Relaxed);
        self.valid_until
            .store(valid_until.to_bits(), Ordering::Release);
    }
    pub(crate) fn get(&self, now: f64) -> Option<EngineQueue> {
        let until = f64::from_bits(self.valid_until.load(Ordering::Acquire));
        // NaN on either side: unknown too.
        if now.partial_cmp(&until) != Some(std::cmp::Ordering::Less) {
            return None;
        }
        let packed = self.counts.load(Ordering::Relaxed);
        Some(EngineQueue {
            waiting: (packed >> 32) as u32,
            running: packed as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_are_what_the_engine_holds_beyond_our_own() {
        // 6 running and 3 waiting, 3 of them ours: 6 others, split 2 waiting to 4 running.
        assert_eq!(
            EngineQueue::others(6.0, 3.0, 3),
            EngineQueue {
                waiting: 2,
                running: 4
            }
        );
        // Only ours there (or fewer reported than we count: the scrape raced a request).
        assert_eq!(EngineQueue::others(2.0, 1.0, 3), EngineQueue::default());
        assert_eq!(EngineQueue::others(0.0, 0.0, 0), EngineQueue::default());
        // Nonsense readings count as nothing, never as a huge queue.
        assert_eq!(
            EngineQueue::others(f64::NAN, -4.0, 0),
            EngineQueue::default()
        );
        assert_eq!(EngineQueue::others(f64::INFINITY, 1.0, 0).total(), 1);
        assert_eq!(EngineQueue::others(0.0, 5.0, 1).waiting, 4);
    }

    #[test]
    fn a_reading_is_unknown_once_stale_and_before_the_first() {
        let r = Reported::default();
        assert_eq!(r.get(0.0), None, "never scraped");
        let q = EngineQueue {
            waiting: 3,
            running: 7,
        };
        r.set(q, 10.0);
        assert_eq!(r.get(9.9), Some(q));
        assert_eq!(r.get(10.0), None, "stale is unknown, not zero");
    }
}
