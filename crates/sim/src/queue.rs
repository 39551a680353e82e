//! The event queue: a min-heap on time with a deterministic tie-break.
//!
//! Events at the same instant are ordered by kind first (engine steps, then scale events, then
//! KV-event deliveries, then arrivals: a request finishing at `t` frees its slot before a request arriving at `t` is
//! routed, as in a real router that sees the response end first), then by insertion order. No
//! two entries ever compare equal, so the pop order never depends on the heap's internals.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// What happens at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An engine's current step ends. `generation` lets a rescheduled engine ignore its stale entries.
    EngineStep {
        /// Engine (instance) index.
        engine: usize,
        /// Schedule generation of that engine when this entry was pushed.
        generation: u64,
    },
    /// A scale event of the configuration fires.
    Scale {
        /// Index into the configured scale events.
        index: usize,
    },
    /// A batch of an engine's KV events reaches the router (see [`crate::events`]).
    KvEvents {
        /// The batch's number.
        batch: u64,
    },
    /// The router replicas scrape every engine's queue (see [`crate::routers`]).
    Scrape,
    /// A scrape's readings reach the replicas.
    ScrapeArrives {
        /// The scrape's number.
        scrape: u64,
    },
    /// A warming instance's prewarm budget is spent: it takes its share now.
    PrewarmBudget {
        /// Instance index.
        instance: usize,
    },
    /// A request reaches the router.
    Arrival {
        /// Position of the request in the workload.
        request: usize,
    },
}

impl Event {
    /// Tie-break class at equal times (lower first).
    fn class(&self) -> u8 {
        match self {
            Event::EngineStep { .. } => 0,
            Event::Scale { .. } | Event::PrewarmBudget { .. } => 1,
            Event::KvEvents { .. } | Event::Scrape | Event::ScrapeArrives { .. } => 2,
            Event::Arrival { .. } => 3,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    at: f64,
    seq: u64,
    event: Event,
}

impl Entry {
    /// Ascending order: time, class, insertion sequence.
    fn cmp_ascending(&self, other: &Self) -> Ordering {
        self.at
            .total_cmp(&other.at)
            .then_with(|| self.event.class().cmp(&other.event.class()))
            .then_with(|| self.seq.cmp(&other.seq))
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed, so that `BinaryHeap` (a max-heap) pops the earliest entry.
    fn cmp(&self, other: &Self) -> Ordering {
        other.cmp_ascending(self)
    }
}

/// Min-heap of timed events; equal times pop in a fixed, documented order.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    next_seq: u64,
    /// Scheduled events that only observe the fleet (scrapes and their deliveries).
    observing: usize,
}

impl EventQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Schedules `event` at time `at` (seconds; must not be NaN).
    pub fn push(&mut self, at: f64, event: Event) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.observing += usize::from(observes(&event));
        self.heap.push(Entry { at, seq, event });
    }

    /// Removes and returns the earliest event.
    pub fn pop(&mut self) -> Option<(f64, Event)> {
        let e = self.heap.pop()?;
        self.observing -= usize::from(observes(&e.event));
        Some((e.at, e.event))
    }

    /// Whether everything scheduled only observes the fleet: nothing left can move a request,
    /// so a periodic observation must not schedule its next one (the run would never end).
    pub fn only_observing(&self) -> bool {
        self.heap.len() == self.observing
    }

    /// Number of scheduled events (stale engine entries included).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// Whether `event` only observes the fleet (see [`EventQueue::only_observing`]).
fn observes(event: &Event) -> bool {
    matches!(event, Event::Scrape | Event::ScrapeArrives { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn only_observing_counts_scrapes_apart_from_work() {
        let mut q = EventQueue::new();
        assert!(q.only_observing());
        q.push(1.0, Event::Scrape);
        q.push(2.0, Event::ScrapeArrives { scrape: 0 });
        assert!(q.only_observing());
        q.push(3.0, Event::Arrival { request: 0 });
        assert!(!q.only_observing());
        q.pop();
        assert!(!q.only_observing());
        q.pop();
        q.pop();
        assert!(q.only_observing() && q.is_empty());
    }

    #[test]
    fn equal_times_pop_engine_then_scale_then_arrival_then_fifo() {
        let mut q = EventQueue::new();
        q.push(1.0, Event::Arrival { request: 0 });
        q.push(1.0, Event::Arrival { request: 1 });
        q.push(1.0, Event::Scale { index: 0 });
        q.push(
            1.0,
            Event::EngineStep {
                engine: 3,
                generation: 0,
            },
        );
        q.push(0.5, Event::Arrival { request: 9 });
        let order: Vec<Event> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(
            order,
            vec![
                Event::Arrival { request: 9 },
                Event::EngineStep {
                    engine: 3,
                    generation: 0
                },
                Event::Scale { index: 0 },
                Event::Arrival { request: 0 },
                Event::Arrival { request: 1 },
            ]
        );
    }

    proptest! {
        #[test]
        fn pops_in_non_decreasing_time(times in proptest::collection::vec(0.0f64..1e6, 0..200)) {
            let mut q = EventQueue::new();
            for (i, t) in times.iter().enumerate() {
                q.push(*t, Event::Arrival { request: i });
            }
            prop_assert_eq!(q.len(), times.len());
            let mut last = f64::NEG_INFINITY;
            while let Some((t, _)) = q.pop() {
                prop_assert!(t >= last);
                last = t;
            }
            prop_assert!(q.is_empty());
        }
    }
}
