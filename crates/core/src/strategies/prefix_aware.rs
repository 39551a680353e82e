//! `prefix-aware`: weighted rendezvous (highest-random-weight) hashing of the routing key with
//! overflow, the reference behaviour.
//!
//! Score of instance `i` for key `k`:
//! - `m = fmix64(k ^ id_hash(i))`, MurmurHash3's 64-bit finaliser (a bijection with full
//!   avalanche, so scores of one key over different instances behave as independent draws);
//! - `u = ((m >> 11) + 0.5) / 2^53`, uniform in the open interval (0, 1);
//! - `score = -weight / ln(u)`; the highest score wins (weighted rendezvous: an instance of
//!   weight w is preferred by a share w / Σw of keys).
//!
//! When every instance of the snapshot has the same weight, `-w / ln(u)` is increasing in `u`, so
//! the order is that of `m` itself and no logarithm is computed. Ties (equal scores) are broken
//! by the larger `m`, then the larger `id_hash`; they are astronomically rare.
//!
//! Because the score depends only on the key and the instance id, adding an instance moves only
//! the keys it now wins (about 1/(N+1) of them), removing one moves only its own keys, and two
//! routers with the same member ids agree without talking to each other.
//!
//! Load: if the preferred instance holds `concurrency_threshold` requests (or, with a balance
//! factor `c`, at least `ceil(c * (total in flight + 1) / n)`, whichever is lower), the request
//! overflows: to the next instance in the key's rendezvous order that has room
//! ([`OverflowPolicy::NextInOrder`], a stable second home for a hot prefix), or to the least busy
//! instance with room ([`OverflowPolicy::LeastOutstanding`]). If nobody has room, the least busy
//! instance overall takes it. Load is [`Instance::load`]: this router's requests in flight, plus,
//! where the engines' queues are scraped, the requests other routers sent (so the bound holds
//! across replicas, not just within each). Selection never allocates: the overflow target is found by a
//! second scan for the best score among instances with room rather than by sorting.

use super::common::{least_outstanding, no_instance};
use crate::strategy::OverflowPolicy;
use crate::{
    ConcurrencyThreshold, ConfigError, Decision, FleetSnapshot, Instance, KeyHash, Reason,
    RouteError, RouteRequest, RouteRng, Strategy,
};
use std::cmp::Ordering;

/// MurmurHash3's 64-bit finaliser (public domain algorithm by Austin Appleby).
#[inline]
pub fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// The integer rendezvous draw of `key` on an instance: `fmix64(key ^ id_hash)`.
#[inline]
pub fn rendezvous_mix(key: KeyHash, id_hash: u64) -> u64 {
    fmix64(key.0 ^ id_hash)
}

/// The weighted rendezvous score `-weight / ln(u)` with `u = ((mix >> 11) + 0.5) / 2^53`.
#[inline]
pub fn rendezvous_score(key: KeyHash, id_hash: u64, weight: u32) -> f64 {
    let mix = rendezvous_mix(key, id_hash);
    let u = ((mix >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
    -(weight.max(1) as f64) / u.ln()
}

/// A comparable score: the weighted float score (0 when weights are uniform) then the mix, then
/// the id hash.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score {
    weighted: f64,
    mix: u64,
    id_hash: u64,
}

impl Score {
    #[inline]
    fn of(key: KeyHash, inst: &Instance, uniform: bool) -> Self {
        let mix = rendezvous_mix(key, inst.id_hash());
        let weighted = if uniform {
            0.0
        } else {
            rendezvous_score(key, inst.id_hash(), inst.weight())
        };
        Score {
            weighted,
            mix,
            id_hash: inst.id_hash(),
        }
    }

    #[inline]
    fn beats(&self, other: &Score) -> bool {
        // Scores are finite and positive (u is strictly inside (0, 1)), so partial_cmp is total.
        match self
            .weighted
            .partial_cmp(&other.weighted)
            .unwrap_or(Ordering::Equal)
        {
            Ordering::Greater => true,
            Ordering::Less => false,
            Ordering::Equal => (self.mix, self.id_hash) > (other.mix, other.id_hash),
        }
    }
}

/// Prefix-aware routing; see the module documentation for the exact rule.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixAware {
    threshold: u32,
    overflow: OverflowPolicy,
    balance_factor: Option<f64>,
}

impl PrefixAware {
    /// Builds the strategy; `balance_factor`, when given, must be finite and greater than 1.
    pub fn new(
        threshold: ConcurrencyThreshold,
        overflow: OverflowPolicy,
        balance_factor: Option<f64>,
    ) -> Result<Self, ConfigError> {
        if let Some(c) = balance_factor {
            if !(c.is_finite() && c > 1.0) {
                return Err(ConfigError::BalanceFactor(c));
            }
        }
        Ok(Self {
            threshold: threshold.get(),
            overflow,
            balance_factor,
        })
    }

    /// The in-flight count at which an instance counts as full, given `n` eligible instances
    /// holding `total` requests: the threshold, lowered to `ceil(c * (total + 1) / n)` when a
    /// balance factor `c` is set.
    pub fn capacity(&self, n: usize, total: u64) -> u32 {
        match self.balance_factor {
            Some(c) if n > 0 => {
                let bound = (c * (total as f64 + 1.0) / n as f64).ceil();
                // bound >= 1 because c > 1 and total + 1 >= 1; clamp before the cast.
                (bound.min(self.threshold as f64) as u32).max(1)
            }
            _ => self.threshold,
        }
    }

    /// The key's preferred instance among eligible healthy ones, ignoring load.
    pub fn preferred(
        &self,
        key: KeyHash,
        fleet: &FleetSnapshot,
        model: Option<&str>,
    ) -> Option<usize> {
        best_by_score(key, fleet, model, |_| true)
    }

    /// The key's full rendezvous order over eligible healthy instances (best first). Allocates:
    /// meant for tests, tooling and the simulator's reports, not the routing hot path.
    pub fn rendezvous_order(
        &self,
        key: KeyHash,
        fleet: &FleetSnapshot,
        model: Option<&str>,
    ) -> Vec<usize> {
        let uniform = fleet.uniform_weight();
        let mut scored: Vec<(usize, Score)> = fleet
            .eligible(model)
            .map(|(i, inst)| (i, Score::of(key, inst, uniform)))
            .collect();
        scored.sort_by(|a, b| {
            if a.1.beats(&b.1) {
                Ordering::Less
            } else if b.1.beats(&a.1) {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        });
        scored.into_iter().map(|(i, _)| i).collect()
    }
}

/// Index of the best-scoring eligible instance accepted by `accept`.
fn best_by_score(
    key: KeyHash,
    fleet: &FleetSnapshot,
    model: Option<&str>,
    mut accept: impl FnMut(&Instance) -> bool,
) -> Option<usize> {
    let uniform = fleet.uniform_weight();
    let mut best: Option<(usize, Score)> = None;
    for (i, inst) in fleet.eligible(model) {
        if !accept(inst) {
            continue;
        }
        let s = Score::of(key, inst, uniform);
        if best.as_ref().is_none_or(|(_, b)| s.beats(b)) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| i)
}

/// Registry entry: its settings are the `concurrency_threshold`, `overflow` and `balance_factor`
/// fields every [`crate::StrategyConfig`] carries (the reference service's names).
pub const ENTRY: crate::strategy::StrategyEntry = crate::strategy::StrategyEntry {
    name: "prefix-aware",
    about: "rendezvous hash of a fixed-length prefix, threshold overflow (the reference design)",
    params: &[],
    build: |c| {
        Ok(std::sync::Arc::new(PrefixAware::new(
            c.concurrency_threshold,
            c.overflow,
            c.balance_factor,
        )?))
    },
};

impl Strategy for PrefixAware {
    fn name(&self) -> &'static str {
        "prefix-aware"
    }

    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        rng: &mut RouteRng,
    ) -> Result<Decision, RouteError> {
        let model = req.model;
        let Some(key) = req.key else {
            return least_outstanding(fleet, model, req.now, rng, |_| true)
                .map(|index| Decision::new(index, Reason::NoKey))
                .ok_or_else(|| no_instance(fleet, model));
        };

        // Pass 1: preferred instance, number of eligible instances and their total load.
        let uniform = fleet.uniform_weight();
        let mut n = 0usize;
        let mut total = 0u64;
        let mut best: Option<(usize, Score, u32)> = None;
        for (i, inst) in fleet.eligible(model) {
            let load = inst.load(req.now);
            n += 1;
            total += u64::from(load);
            let s = Score::of(key, inst, uniform);
            if best.as_ref().is_none_or(|(_, b, _)| s.beats(b)) {
                best = Some((i, s, load));
            }
        }
        let Some((pref, _, pref_load)) = best else {
            return Err(no_instance(fleet, model));
        };
        let cap = self.capacity(n, total);
        if pref_load < cap {
            return Ok(Decision::new(pref, Reason::Preferred));
        }

        // Overflow: the preferred instance is full.
        let pref_inst = &fleet.instances()[pref];
        let has_room =
            |inst: &Instance| !std::ptr::eq(inst, &**pref_inst) && inst.load(req.now) < cap;
        let target = match self.overflow {
            OverflowPolicy::NextInOrder => best_by_score(key, fleet, model, has_room),
            OverflowPolicy::LeastOutstanding => {
                least_outstanding(fleet, model, req.now, rng, has_room)
            }
        };
        let from = pref_inst.id().clone();
        if let Some(index) = target {
            return Ok(Decision::new(index, Reason::Overflow { from }));
        }
        least_outstanding(fleet, model, req.now, rng, |_| true)
            .map(|index| Decision::new(index, Reason::AllBusy { from }))
            .ok_or_else(|| no_instance(fleet, model))
    }
}
