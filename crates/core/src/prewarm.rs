//! Prewarming an instance that joins: it starts with an empty cache, so every prefix that moves
//! to it misses until traffic warms it. With prewarming on, the router first replays to it, at
//! most once each, the hottest recent prefixes that will move to it (answers cut to one token),
//! and only then lets it take its share; until then those prefixes stay on their old homes.
//!
//! This module holds what the server and the simulator share: [`HotPrefixes`], the recent
//! prefixes by decayed request count with one example request each, and [`plan`], which picks
//! the ones the strategy would send to the new instance once it takes requests. How a replay is
//! sent (HTTP with `max_tokens: 1`, or a one-token request to a simulated engine) is theirs.

use std::collections::HashMap;
use std::sync::Arc;

use crate::{
    FleetSnapshot, Instance, InstanceId, InstanceState, KeyHash, RouteRequest, RouteRng, Strategy,
};

/// Settings of prewarming.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrewarmConfig {
    /// Prefixes replayed to one joining instance, at most.
    pub max_prefixes: usize,
    /// Replays in flight at once.
    pub concurrency: usize,
    /// Seconds the instance may spend warming before it takes its share regardless.
    pub budget_s: f64,
    /// Prefixes tracked (the hottest are kept).
    pub tracked: usize,
    /// Half-life of a prefix's request count, seconds: what "recent" means.
    pub half_life_s: f64,
    /// Bytes of examples kept, at most (the server keeps request bodies): past it the colder
    /// half is dropped, and an example larger than all of it is not kept.
    pub max_bytes: usize,
}

impl Default for PrewarmConfig {
    fn default() -> Self {
        Self {
            max_prefixes: 64,
            concurrency: 4,
            budget_s: 30.0,
            tracked: 1024,
            half_life_s: 120.0,
            max_bytes: 64 << 20,
        }
    }
}

/// `score` counted at `at`, as it stands at `now`: halved every `half_life` seconds.
fn decay(score: f64, at: f64, now: f64, half_life: f64) -> f64 {
    score * 0.5f64.powf(((now - at) / half_life).max(0.0))
}

#[derive(Debug, Clone)]
struct Hot<T> {
    score: f64,
    at: f64,
    example: T,
    /// The example's size, counted against the byte budget.
    size: usize,
}

/// Recent prefixes (by routing key), each with a decayed request count and its latest request
/// as the example to replay. Bounded in prefixes and in the examples' bytes: when either is
/// full, the colder half is dropped in one pass, so a request costs O(1) amortized.
#[derive(Debug, Clone)]
pub struct HotPrefixes<T> {
    capacity: usize,
    half_life_s: f64,
    entries: HashMap<u64, Hot<T>>,
    max_bytes: usize,
    bytes: usize,
}

impl<T> HotPrefixes<T> {
    /// Tracks up to `capacity` prefixes (at least 2) whose counts halve every `half_life_s`,
    /// their examples' sizes adding up to at most `max_bytes`.
    pub fn new(capacity: usize, half_life_s: f64, max_bytes: usize) -> Self {
        Self {
            capacity: capacity.max(2),
            half_life_s: if half_life_s > 0.0 { half_life_s } else { 1.0 },
            entries: HashMap::new(),
            max_bytes,
            bytes: 0,
        }
    }

    fn decayed(&self, h: &Hot<T>, now: f64) -> f64 {
        decay(h.score, h.at, now, self.half_life_s)
    }

    /// Counts a request with routing `key` at `now`; `example` (of `size` bytes) becomes the
    /// prefix's example. One larger than the whole byte budget is not kept: a prefix already
    /// tracked is counted and keeps its older example, a new one is not tracked at all.
    pub fn record(&mut self, key: KeyHash, now: f64, example: T, size: usize) {
        let k = key.0;
        let half_life = self.half_life_s;
        let fits = size <= self.max_bytes;
        if let Some(h) = self.entries.get_mut(&k) {
            h.score = decay(h.score, h.at, now, half_life) + 1.0;
            h.at = now;
            if fits {
                self.bytes = self.bytes - h.size + size;
                h.example = example;
                h.size = size;
            }
        } else {
            if !fits {
                return;
            }
            if self.entries.len() >= self.capacity {
                self.drop_colder_half(now);
            }
            self.bytes += size;
            self.entries.insert(
                k,
                Hot {
                    score: 1.0,
                    at: now,
                    example,
                    size,
                },
            );
        }
        // Each pass halves the entries; one left fits (only examples within the budget are kept).
        while self.bytes > self.max_bytes {
            if self.entries.len() <= 1 {
                self.entries.clear();
                self.bytes = 0;
                break;
            }
            self.drop_colder_half(now);
        }
    }

    /// Bytes of examples kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn drop_colder_half(&mut self, now: f64) {
        let mut scores: Vec<f64> = self
            .entries
            .values()
            .map(|h| self.decayed(h, now))
            .collect();
        let mid = scores.len() / 2;
        scores.select_nth_unstable_by(mid, f64::total_cmp);
        let cut = scores[mid];
        let mut kept = 0usize;
        let keep_at_most = self.capacity - self.capacity / 2;
        let keep_at_most = keep_at_most.min(self.entries.len() - self.entries.len() / 2);
        let half_life = self.half_life_s;
        let mut bytes = 0;
        self.entries.retain(|_, h| {
            let s = decay(h.score, h.at, now, half_life);
            // Ties with the median are kept while there is room: with all scores equal (prompts
            // seen once, at once), a strict cut would empty the table.
            let keep = s >= cut && kept < keep_at_most;
            kept += usize::from(keep);
            bytes += if keep { h.size } else { 0 };
            keep
        });
        self.bytes = bytes;
    }

    /// Prefixes tracked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every tracked prefix's example, hottest first (ties by key, so the order is the same on
    /// every run).
    pub fn hottest(&self, now: f64) -> Vec<(f64, &T)> {
        let mut all: Vec<(f64, u64, &T)> = self
            .entries
            .iter()
            .map(|(k, h)| (self.decayed(h, now), *k, &h.example))
            .collect();
        all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        all.into_iter().map(|(s, _, e)| (s, e)).collect()
    }
}

/// The fleet as it will be once `joining` takes requests: `fleet` with `joining` in it, healthy.
/// A fresh instance with the same id stands in for it (rendezvous scores and learned state are
/// keyed by id), so the real one stays out of routing meanwhile.
pub fn after_join(fleet: &FleetSnapshot, joining: &InstanceId) -> FleetSnapshot {
    FleetSnapshot::new(
        fleet
            .instances()
            .iter()
            .map(|i| {
                if i.id() == joining {
                    let stand_in = Instance::new(i.spec().clone());
                    stand_in.set_state(InstanceState::Healthy);
                    Arc::new(stand_in)
                } else {
                    Arc::clone(i)
                }
            })
            .collect(),
    )
}

/// The examples to replay to `joining`: of `hottest` (hottest first, as
/// [`HotPrefixes::hottest`] lists them), the first `max` that will go there once it takes
/// requests. For a strategy that places by hashing (prefix-aware), those its `select` sends there
/// on [`after_join`]'s fleet; for one that places by residency (it reads block chains), the
/// hottest, which gain the new instance as a home as their load spreads. `request` gives the
/// strategy's view of an example.
pub fn plan<'t, T: 't>(
    hottest: impl IntoIterator<Item = &'t T>,
    max: usize,
    strategy: &Arc<dyn Strategy>,
    fleet: &FleetSnapshot,
    joining: &InstanceId,
    rng: &mut RouteRng,
    mut request: impl FnMut(&'t T) -> Option<RouteRequest<'t>>,
) -> Vec<&'t T> {
    let after = after_join(fleet, joining);
    // A strategy that places by what the instances hold (it reads block chains: cache-aware,
    // kv-aware) moves no cached prefix to an empty instance; its new instance's traffic is the
    // hot prefixes gaining homes as load spreads, and new prefixes. The hottest are what will
    // be sent there, so they are replayed whatever `select` says today.
    let by_residency = strategy.chain_spec().is_some();
    // Only prompts for a model it serves: another model's would be answered 404 by its engine,
    // and fill the plan and the warm-up's time with nothing.
    let joins = after
        .instances()
        .iter()
        .find(|i| i.id() == joining)
        .cloned();
    let mut out = Vec::new();
    for example in hottest {
        if out.len() >= max {
            break;
        }
        let Some(req) = request(example) else {
            continue;
        };
        if !joins.as_ref().is_some_and(|i| i.serves(req.model)) {
            continue;
        }
        let moves = strategy
            .select(&req, &after, rng)
            .ok()
            .and_then(|d| after.instances().get(d.index))
            .is_some_and(|i| i.id() == joining);
        if moves || by_residency {
            out.push(example);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InstanceSpec, StrategyConfig, StrategyKind};
    use rand::SeedableRng;

    #[test]
    fn the_hottest_are_kept_and_counts_decay() {
        let mut hot: HotPrefixes<u32> = HotPrefixes::new(8, 10.0, usize::MAX);
        for i in 0..8u64 {
            for _ in 0..=i {
                hot.record(KeyHash(i), 0.0, i as u32, 1);
            }
        }
        // Full: a new key drops the colder half first.
        hot.record(KeyHash(100), 0.0, 100, 1);
        let order: Vec<u32> = hot.hottest(0.0).iter().map(|(_, e)| **e).collect();
        assert_eq!(order, [7, 6, 5, 4, 100], "the colder half went");
        // Twenty seconds later (two half-lives): key 7's 8 are worth 2, key 100's 1 + 1 + 0.25.
        hot.record(KeyHash(100), 20.0, 101, 1);
        hot.record(KeyHash(100), 20.0, 102, 1);
        let (score, top) = hot.hottest(20.0)[0];
        assert_eq!(*top, 102, "the latest request is the example");
        assert!((score - 2.25).abs() < 1e-9, "{score}");
    }

    #[test]
    fn the_examples_stay_within_the_byte_budget() {
        // 100 bytes: ten examples of 10, at most.
        let mut hot: HotPrefixes<u32> = HotPrefixes::new(1024, 10.0, 100);
        for i in 0..10u64 {
            for _ in 0..=i {
                hot.record(KeyHash(i), 0.0, i as u32, 10);
            }
        }
        assert_eq!((hot.len(), hot.bytes()), (10, 100));
        // One more byte drops the colder half (those below the median of 11), the newcomer
        // (the coldest) among them.
        hot.record(KeyHash(50), 0.0, 50, 1);
        let order: Vec<u32> = hot.hottest(0.0).iter().map(|(_, e)| **e).collect();
        assert_eq!(order, [9, 8, 7, 6, 5, 4], "the colder half went");
        assert_eq!(hot.bytes(), 60);
        // A larger example replaces a smaller one within the budget; passing it, the colder
        // ones go until it fits.
        hot.record(KeyHash(9), 0.0, 90, 80);
        assert!(hot.bytes() <= 100, "{}", hot.bytes());
        assert_eq!(hot.hottest(0.0)[0].1, &90);
        // Larger than the whole budget: counted, not kept; a tracked prefix keeps its example.
        hot.record(KeyHash(9), 0.0, 91, 101);
        assert_eq!(hot.hottest(0.0)[0].1, &90);
        hot.record(KeyHash(77), 0.0, 77, 101);
        assert!(hot.hottest(0.0).iter().all(|(_, e)| **e != 77));
        assert!(hot.bytes() <= 100);
        let sum: usize = hot.entries.values().map(|h| h.size).sum();
        assert_eq!(sum, hot.bytes(), "the count matches the entries");
    }

    #[test]
    fn the_plan_holds_the_prefixes_rendezvous_moves_to_the_new_instance() {
        let specs: Vec<InstanceSpec> = (0..4)
            .map(|i| InstanceSpec::from_url(format!("http://10.0.0.{i}:8000")))
            .collect();
        let fleet = crate::Fleet::new(specs.clone());
        let mut joined = specs.clone();
        joined.push(InstanceSpec::from_url("http://10.0.0.9:8000"));
        fleet.set_members(joined);
        let new = InstanceId(Arc::from("http://10.0.0.9:8000"));
        assert!(fleet.set_state("http://10.0.0.9:8000", InstanceState::Warming));
        let snap = fleet.snapshot();
        let strategy =
            StrategyConfig::new(StrategyKind::named("prefix-aware").expect("registered"))
                .build()
                .expect("builds");
        let mut hot: HotPrefixes<KeyHash> = HotPrefixes::new(1024, 60.0, usize::MAX);
        for k in 0..500u64 {
            hot.record(
                KeyHash(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                0.0,
                KeyHash(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                0,
            );
        }
        let mut rng = RouteRng::seed_from_u64(1);
        let hottest: Vec<&KeyHash> = hot.hottest(0.0).into_iter().map(|(_, k)| k).collect();
        let picked = plan(
            hottest.iter().copied(),
            1000,
            &strategy,
            &snap,
            &new,
            &mut rng,
            |k| Some(RouteRequest::keyed(Some(*k), None)),
        );
        // About one key in five moves to the fifth instance; every one of them is planned.
        assert!((60..=140).contains(&picked.len()), "{}", picked.len());
        let after = after_join(&snap, &new);
        for k in &picked {
            let d = strategy
                .select(&RouteRequest::keyed(Some(**k), None), &after, &mut rng)
                .expect("routes");
            assert_eq!(after.instances()[d.index].id(), &new);
        }
        // The real instance is still warming: nothing is routed to it.
        let d = strategy
            .select(
                &RouteRequest::keyed(Some(*picked[0]), None),
                &snap,
                &mut rng,
            )
            .expect("routes");
        assert_ne!(snap.instances()[d.index].id(), &new);
        // At most `max`.
        let few = plan(
            hottest.iter().copied(),
            3,
            &strategy,
            &snap,
            &new,
            &mut rng,
            |k| Some(RouteRequest::keyed(Some(*k), None)),
        );
        assert_eq!(few.len(), 3);
    }
}

/// A joining instance that serves one model is replayed only that model's prompts, also by a
/// strategy that plans by residency (which plans the hottest whatever `select` says).
#[cfg(test)]
mod models {
    use super::*;
    use crate::{InstanceSpec, StrategyConfig, StrategyKind};
    use rand::SeedableRng;

    #[test]
    fn only_prompts_for_a_model_the_new_instance_serves_are_planned() {
        let spec = |i: u32, model: &str| InstanceSpec {
            models: vec![model.to_string()],
            ..InstanceSpec::from_url(format!("http://10.0.0.{i}:8000"))
        };
        let fleet = crate::Fleet::new(vec![spec(0, "a"), spec(1, "b")]);
        fleet.set_members(vec![spec(0, "a"), spec(1, "b"), spec(9, "a")]);
        let new = InstanceId(Arc::from("http://10.0.0.9:8000"));
        let snap = fleet.snapshot();
        let strategy = StrategyConfig::new(StrategyKind::named("cache-aware").expect("registered"))
            .build()
            .expect("builds");
        let chain = [1u64, 2, 3];
        // Hot prompts alternately for models a and b.
        let examples: Vec<(u64, &str)> = (0..20u64)
            .map(|k| (k, if k % 2 == 0 { "a" } else { "b" }))
            .collect();
        let mut rng = RouteRng::seed_from_u64(1);
        let picked = plan(
            examples.iter(),
            64,
            &strategy,
            &snap,
            &new,
            &mut rng,
            |(k, m)| {
                Some(RouteRequest {
                    key: Some(KeyHash(*k)),
                    chain: &chain,
                    prompt_units: 384,
                    model: Some(m),
                    now: 0.0,
                    tokens: None,
                    whole_answer: false,
                })
            },
        );
        assert_eq!(picked.len(), 10, "{picked:?}");
        assert!(picked.iter().all(|(_, m)| *m == "a"), "{picked:?}");
    }
}

#[cfg(test)]
mod ties {
    use super::*;

    #[test]
    fn equal_scores_keep_half_the_table() {
        let mut hot: HotPrefixes<u64> = HotPrefixes::new(64, 10.0, usize::MAX);
        for k in 0..65u64 {
            hot.record(KeyHash(k), 0.0, k, 0);
        }
        assert_eq!(hot.len(), 33, "32 kept of the first 64, then the new one");
    }
}
