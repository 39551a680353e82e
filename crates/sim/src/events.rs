//! The engines' KV-cache events, as `kv-aware` reads them in a simulation.
//!
//! An engine model records every block its prefix cache stores and evicts; after each engine
//! step, what changed is one batch, delivered to the router's view of that instance
//! [`KvEventModel::delay_s`] later (the publisher, the socket and the subscriber). A batch is
//! lost with probability [`KvEventModel::loss`]. The router cannot see a loss until the next
//! batch of that instance arrives with a sequence gap: until then its view is stale and still
//! trusted, exactly as the server's is. The next batch then replays the lost ones (the server's
//! replay takes about 2 ms on loopback, left out here) and applies itself. The view is keyed by
//! the workload's block hashes, which name token blocks the way the router's names from the
//! events' token ids do; the strategy reads it through [`Residency`], the same trait the
//! server's event feeds answer.

use std::collections::{HashMap, HashSet};

use prefix_router_core::{Instance, Report, Residency, RouteRng};
use prefix_router_engine_model::CacheChange;
use rand::{Rng, SeedableRng};

/// How the simulated events travel.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct KvEventModel {
    /// From an engine step to the router's view applying what it changed, seconds.
    pub delay_s: f64,
    /// Share (0..1) of batches lost on the way (recovered at the instance's next batch).
    pub loss: f64,
}

impl Default for KvEventModel {
    fn default() -> Self {
        Self {
            delay_s: DEFAULT_DELAY_S,
            loss: 0.0,
        }
    }
}

/// Default delivery delay: vLLM publishes a step's events as the step ends; the socket and the
/// subscriber add well under a millisecond on one host (measured on loopback: 2 ms for a whole
/// replay). 10 ms leaves room for a busy router and a network hop.
pub const DEFAULT_DELAY_S: f64 = 0.010;

#[derive(Debug, Default)]
struct View {
    held: HashSet<u64>,
    /// Batches lost since the last delivered one, in order.
    lost: Vec<Vec<CacheChange>>,
}

impl View {
    fn apply(&mut self, batch: &[CacheChange]) {
        for c in batch {
            match *c {
                CacheChange::Stored(h) => {
                    self.held.insert(h);
                }
                CacheChange::Evicted(h) => {
                    self.held.remove(&h);
                }
            }
        }
    }
}

/// The router's views of every instance, fed by delayed (and maybe lost) batches.
#[derive(Debug)]
pub struct SimViews {
    model: KvEventModel,
    views: Vec<View>,
    by_hash: HashMap<u64, usize>,
    /// Batches on their way, by number.
    in_transit: HashMap<u64, (usize, Vec<CacheChange>)>,
    next: u64,
    rng: RouteRng,
}

impl SimViews {
    /// No views yet; losses drawn from `seed`.
    pub fn new(model: KvEventModel, seed: u64) -> Self {
        Self {
            model,
            views: Vec::new(),
            by_hash: HashMap::new(),
            in_transit: HashMap::new(),
            next: 0,
            rng: RouteRng::seed_from_u64(seed ^ 0x6b76_6576_656e_7473),
        }
    }

    /// The delivery delay.
    pub fn delay_s(&self) -> f64 {
        self.model.delay_s
    }

    /// Starts a view of instance `index`, whose router-side instance is `instance`.
    pub fn track(&mut self, index: usize, instance: &Instance) {
        if self.views.len() <= index {
            self.views.resize_with(index + 1, View::default);
        }
        self.by_hash.insert(instance.id_hash(), index);
    }

    /// Sends what instance `index` changed; returns the batch's number to deliver later, or
    /// `None` when nothing changed.
    pub fn send(&mut self, index: usize, batch: Vec<CacheChange>) -> Option<u64> {
        if batch.is_empty() {
            return None;
        }
        let n = self.next;
        self.next += 1;
        self.in_transit.insert(n, (index, batch));
        Some(n)
    }

    /// Batch `n` reaches the router: lost, or applied after the ones lost before it.
    pub fn deliver(&mut self, n: u64) {
        let Some((index, batch)) = self.in_transit.remove(&n) else {
            return;
        };
        let lose = self.model.loss > 0.0 && self.rng.gen::<f64>() < self.model.loss;
        let Some(view) = self.views.get_mut(index) else {
            return;
        };
        if lose {
            view.lost.push(batch);
            return;
        }
        // The gap shows: what was lost is replayed, then this batch applies.
        for lost in std::mem::take(&mut view.lost) {
            view.apply(&lost);
        }
        view.apply(&batch);
    }
}

impl Residency for SimViews {
    /// The simulated engines key no block by an adapter (a trace's `model` names no LoRA
    /// adapter to them), so every request is the base model's: `adapter` is 0.
    fn report(&self, instance: &Instance, chain: &[u64], _adapter: u64) -> Option<Report> {
        let view = self.views.get(*self.by_hash.get(&instance.id_hash())?)?;
        let n = chain.iter().take_while(|h| view.held.contains(h)).count();
        Some(Report {
            matched_blocks: u32::try_from(n).unwrap_or(u32::MAX),
            // The engine model keeps no offloaded tier.
            offloaded_blocks: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_core::InstanceSpec;

    #[test]
    fn a_lost_batch_leaves_the_view_stale_until_the_next_one_replays_it() {
        let inst = Instance::new(InstanceSpec::from_url("sim://a"));
        let mut v = SimViews::new(
            KvEventModel {
                delay_s: 0.0,
                loss: 0.0,
            },
            1,
        );
        v.track(0, &inst);
        let a = v.send(0, vec![CacheChange::Stored(1), CacheChange::Stored(2)]);
        assert_eq!(v.send(0, Vec::new()), None);
        v.deliver(a.unwrap_or(u64::MAX));
        assert_eq!(
            v.report(&inst, &[1, 2, 3], 0).map(|r| r.matched_blocks),
            Some(2)
        );
        // Every batch lost from now on, then one gets through.
        v.model.loss = 1.0;
        let b = v.send(0, vec![CacheChange::Evicted(2), CacheChange::Stored(3)]);
        v.deliver(b.unwrap_or(u64::MAX));
        assert_eq!(
            v.report(&inst, &[1, 2], 0).map(|r| r.matched_blocks),
            Some(2),
            "stale, still trusted"
        );
        v.model.loss = 0.0;
        let c = v.send(0, vec![CacheChange::Stored(2)]);
        v.deliver(c.unwrap_or(u64::MAX));
        assert_eq!(
            v.report(&inst, &[1, 2, 3], 0).map(|r| r.matched_blocks),
            Some(3),
            "replayed in order"
        );
        let other = Instance::new(InstanceSpec::from_url("sim://b"));
        assert_eq!(
            v.report(&other, &[1], 0).map(|r| r.matched_blocks),
            None,
            "no view: unknown"
        );
    }
}
