//! `cache-aware`: route by expected time to first token, from what each instance probably
//! caches and what the router knows it has queued. No prefix length to tune.
//!
//! For each eligible candidate `i`:
//!
//! ```text
//! expected_ttft(i) = base(i) + per_unit(i) × (queued(i) + uncached(i)) + per_decoding(i) × decoding(i)
//! ```
//!
//! - `uncached(i)`: the request's prompt units (characters; bytes for the native API) minus the
//!   longest prefix of its block chain that the [index](index) says `i` still holds (for
//!   `kv-aware`, that its engine reports holding on its GPU; blocks after those that it reports
//!   offloaded to CPU memory count `offload-credit` of theirs as saved: loading them costs a
//!   transfer, not a prefill);
//! - `queued(i)`: the uncached units of requests sent to `i` that have not produced a first
//!   token (the prefill work ahead of this one), less each one's progress (its units times the
//!   time since it was sent over the time to first token expected for it), never below
//!   `progress-floor` of the whole queue (see [`load`]: one sent a moment ago shares the
//!   engine's next steps with this request, one sent its expected time ago is finishing); a
//!   request whose client asked for its answer whole shows no first token, so it leaves the
//!   queue when its first token was expected ([`whole`]);
//! - `decoding(i)`: requests on `i` past their first token (they share every engine step with
//!   the prefill, so each one slows it);
//! - where the engines' queues are scraped, both also count what other routers sent: the
//!   engine's waiting requests beyond this router's own add the mean uncached size of this
//!   router's requests each to `queued(i)`, its running ones add to `decoding(i)` (see
//!   [`crate::reported`]; a stale scrape adds nothing, it does not claim an idle engine);
//! - `base(i)`, `per_unit(i)`, `per_decoding(i)`: learned per instance from observed first
//!   tokens ([`load`]), starting from the configured priors (`prefill-us-per-char`, and
//!   `decode-chars` times it).
//!
//! The minimum wins. Candidates within `tie_tolerance` times the whole prompt's prefill cost of
//! it count as tied (`cold_tie_tolerance`, wider, where nobody holds any of the prompt, so that
//! router replicas with different views of the queues place a new prefix alike); among those the
//! longest match wins (locality when it costs nothing), then the highest rendezvous score of the
//! last block they hold (a cooled hot prefix goes back to one home) or, if they hold none, of
//! the first block nobody holds, so a never-seen prefix on an idle fleet goes to a
//! deterministic, evenly spread instance: router replicas agree without talking, and no
//! instance is "the first". Instances with room under the share bound come first (a prefix
//! placed near the bound soon spills). With the engines' reports (kv-aware), a short opening
//! most of them hold counts as held by all (`shared_opening`). A hot prefix gains homes as its
//! home's queue grows (another instance becomes cheaper even recomputing it) and gives them up
//! as it cools (the home is cheapest again, and the spare copies age out). An overloaded instance only loses its own
//! requests: nothing switches cache routing off for the fleet.
//!
//! Feedback: an engine's `cached_tokens` that contradicts a prediction corrects the estimate of
//! that instance's cache size (see [`index`] on residency); one that confirms it raises it.

mod choose;
mod config;
pub mod index;
pub mod load;
pub mod table;
#[cfg(test)]
mod tests;
pub mod whole;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use self::choose::Candidate;
pub use self::config::CacheAwareConfig;
pub(crate) use self::config::PARAMS;
use self::index::{BlockIndex, Keys, Slots};
use self::load::{Fades, InstanceLoad, Pool};
use crate::strategy::{Feedback, MembershipChange, Note, StrategyEntry, StrategyStats};
use crate::{
    ChainSpec, Decision, FleetSnapshot, Instance, InstanceId, RouteError, RouteRequest, RouteRng,
    Strategy, TicketInfo,
};

/// Registry entry.
pub const ENTRY: StrategyEntry = StrategyEntry {
    name: "cache-aware",
    about: "expected time to first token from a learned block index and each instance's queue",
    params: PARAMS,
    build: |c| {
        Ok(Arc::new(CacheAware::new(CacheAwareConfig::from_strategy(
            c,
        )?)))
    },
};

/// Learned state, behind one lock (decisions are microseconds; contention is short).
#[derive(Debug)]
struct State {
    index: BlockIndex,
    slots: Slots,
    slot_of: crate::prehashed::PreHashedMap<u16>,
    /// Per slot, the instance (id hash) it is mapped to.
    holder_of: Vec<u64>,
    /// Slots of removed instances, oldest removal first, each once, for the next new instance
    /// to reuse (one that comes back first takes its slot out again): with discovery, every
    /// rescheduled pod is a new id, and slots kept for good would grow every per-slot vector
    /// and each decision's pass over them with the fleet's history, not its size.
    removed: VecDeque<u16>,
    loads: Vec<InstanceLoad>,
    /// The fleet's cost fit, which each instance's is blended with.
    pool: Pool,
    /// Each instance's fading weight by gap, remembered (see [`Fades`]).
    fades: Fades,
    /// Per slot, the insertion counter at which each request still waiting for its first
    /// token started: blocks stamped after one of these may not be computed yet.
    pending: Vec<VecDeque<u32>>,
    matched: Vec<u32>,
    /// Per slot, requests sent there recently (exponentially decayed over about
    /// [`SHARE_WINDOW`] requests per instance).
    recent: Vec<f64>,
    /// Scratch for the candidates of a decision.
    cands: Vec<Candidate>,
    /// Scratch for their matches.
    scratch: Vec<u32>,
    /// Uncached units of the requests this router sends, exponentially averaged: what each
    /// request another router queued on an instance is taken to cost there.
    mean_uncached: f64,
    stats: StrategyStats,
}

/// Weight of each request in [`State::mean_uncached`].
const MEAN_WEIGHT: f64 = 0.02;

/// What a request sent to an instance `now` finds there, as the router knows it: its own
/// requests (see [`InstanceLoad::queued_at`]), plus what the engine reports other routers sent
/// while that report is fresh (each of their waiting requests taken at the mean uncached size
/// of ours; their running ones as decoding). Without a report, only its own: unknown is never
/// zero.
struct Ahead {
    /// Prefill units still ahead of it (its own requests' progress taken off).
    queued: u64,
    /// All the prefill units queued there (what the cost is learned on).
    found: u64,
    /// Requests decoding there.
    decoding: u32,
}

fn ahead(
    load: &InstanceLoad,
    inst: &Instance,
    now: f64,
    mean_uncached: f64,
    progress_floor: f64,
) -> Ahead {
    let others = inst.others(now).unwrap_or_default();
    let others_units = (f64::from(others.waiting) * mean_uncached) as u64;
    Ahead {
        queued: load.queued_at(now, progress_floor) as u64 + others_units,
        found: load.queued_units + others_units,
        decoding: load.decoding.saturating_add(others.running),
    }
}

/// A prefix that more than half of the candidates hold and that is less than half of the
/// prompt (a system prompt every request opens with, followed by a new document) is counted as
/// held by all of them: the others pay for it once and hold it from then on. Counted only where
/// it is held, it keeps new content off the instances that lack it for as long as their queues
/// are short (at light load, forever: on `rag` with exact reports, one of seven instances took
/// nothing, and the six others' caches held more documents each). Cache-aware's index does the
/// same for an opening sent to more instances than it lists (crowded blocks), so only the
/// engines' reports (kv-aware) count here. The decision's prediction stays what each instance
/// really holds.
fn shared_opening(cands: &mut [Candidate], units: &mut Vec<u32>, prompt_units: u32) {
    let n = cands.len();
    if n < 3 {
        return;
    }
    // The longest prefix more than half hold: the (n/2+1)-th largest match.
    units.clear();
    units.extend(
        cands
            .iter()
            .map(|c| if c.reported { c.matched_units } else { 0 }),
    );
    let (_, &mut shared, _) = units.select_nth_unstable_by(n / 2, |a, b| b.cmp(a));
    if shared == 0 || 2 * u64::from(shared) >= u64::from(prompt_units) {
        return;
    }
    for c in cands.iter_mut().filter(|c| c.matched_units < shared) {
        c.matched_units = shared;
    }
}

/// Requests per instance over which the share bound looks (the decay of `recent`).
const SHARE_WINDOW: f64 = 256.0;

/// The strategy; see the module documentation.
#[derive(Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
    state: Mutex<State>,
}

/// Buckets of the match-length histogram: 0, 1, 2-3, 4-7, ..., ≥ 2^12 blocks.
const MATCH_BUCKETS: usize = 14;

fn bucket(blocks: u32) -> usize {
    if blocks == 0 {
        0
    } else {
        ((32 - blocks.leading_zeros()) as usize).min(MATCH_BUCKETS - 1)
    }
}

impl CacheAware {
    /// Builds the strategy with an empty index.
    pub fn new(config: CacheAwareConfig) -> Self {
        let state = State {
            index: BlockIndex::new(config.index_blocks),
            slots: Slots::default(),
            slot_of: Default::default(),
            holder_of: Vec::new(),
            removed: VecDeque::new(),
            loads: Vec::new(),
            pool: Pool::new(config.prior),
            fades: Fades::default(),
            pending: Vec::new(),
            matched: Vec::new(),
            recent: Vec::new(),
            cands: Vec::new(),
            scratch: Vec::new(),
            mean_uncached: 0.0,
            stats: StrategyStats {
                index_budget_blocks: config.index_blocks as u64,
                match_blocks_histogram: vec![0; MATCH_BUCKETS],
                ..StrategyStats::default()
            },
        };
        Self {
            config,
            state: Mutex::new(state),
        }
    }

    /// Its settings.
    pub fn config(&self) -> &CacheAwareConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state unsafe to read (every update is
        // a plain field write), so a poisoned lock is used as is rather than failing routing.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Slots an index entry can name: a holder is tagged slot + 1 in a `u16`, 0 meaning none.
const MAX_SLOTS: usize = u16::MAX as usize;

impl State {
    /// The slot of instance `id_hash`, sent a request decided at `now`: its own, else a removed
    /// instance's (reset: nothing it held or queued carries over), else a new one. `None` past
    /// [`MAX_SLOTS`] live instances: the instance is then routed to but not tracked.
    fn slot(&mut self, id_hash: u64, config: &CacheAwareConfig, now: f64) -> Option<usize> {
        if let Some(&s) = self.slot_of.get(&id_hash) {
            return Some(usize::from(s));
        }
        if let Some(s) = self.removed.pop_front() {
            let slot = usize::from(s);
            self.slot_of.remove(&self.holder_of[slot]);
            self.slot_of.insert(id_hash, s);
            self.holder_of[slot] = id_hash;
            // Its stamps were forgotten when it was removed; the estimate of the cache size
            // was the old engine's.
            self.slots.forget(slot);
            self.slots.capacity[slot] = config.cache_blocks;
            // Tickets sent before now belong to instances that used the slot before.
            self.loads[slot] = InstanceLoad::since(config.prior, now);
            self.pending[slot].clear();
            self.recent[slot] = 0.0;
            return Some(slot);
        }
        let s = self.loads.len();
        if s >= MAX_SLOTS {
            return None;
        }
        self.slot_of.insert(id_hash, s as u16);
        self.holder_of.push(id_hash);
        // From now: tickets sent before (to an instance that had this id before its removal,
        // whose slot went to another) belong to no load of this one.
        self.loads.push(InstanceLoad::since(config.prior, now));
        self.pending.push(VecDeque::new());
        self.slots.ensure(s, config.cache_blocks);
        self.matched.push(0);
        self.recent.push(0.0);
        Some(s)
    }
}

impl Strategy for CacheAware {
    fn name(&self) -> &'static str {
        ENTRY.name
    }

    fn chain_spec(&self) -> Option<ChainSpec> {
        Some(self.config.chain)
    }

    fn reads_usage(&self) -> bool {
        true
    }

    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        _rng: &mut RouteRng,
    ) -> Result<Decision, RouteError> {
        let cfg = &self.config;
        // The model's mix is a hash: taken before the lock, which other requests wait on.
        let keys = Keys::new(req.chain, req.model);
        let mut st = self.lock();
        let st = &mut *st;
        st.matched.iter_mut().for_each(|m| *m = 0);
        st.index.longest_matches(keys, &st.slots, &mut st.matched);
        let idle = InstanceLoad::new(cfg.prior);
        let instances = st.loads.len();
        let block = cfg.chain.block_units;
        // The previous decision's buffer: no allocation per decision.
        let mut cands = std::mem::take(&mut st.cands);
        cands.clear();
        for (index, inst) in fleet.eligible(req.model) {
            let slot = st.slot_of.get(&inst.id_hash()).map(|&s| usize::from(s));
            // Whole answers whose first token was due leave the queue ([`whole`]).
            if let Some(s) = slot {
                st.loads[s].retire_whole(req.now);
            }
            // What the engine reports holding, where it does (kv-aware), else the index's guess:
            // the units it holds on its GPU, and those after them it can load from an
            // offloaded copy.
            let report = req.tokens.and_then(|t| {
                t.residency.report(inst, t.chain, t.adapter).map(|r| {
                    let hit = t.units(r.matched_blocks, req.prompt_units);
                    let reach = r.matched_blocks.saturating_add(r.offloaded_blocks);
                    let loadable = t.units(reach, req.prompt_units).saturating_sub(hit);
                    (hit, loadable)
                })
            });
            let (matched_units, loadable_units) = match report {
                Some((units, loadable)) => (units, loadable),
                None => {
                    let b = slot.map_or(0, |s| st.matched[s]);
                    (b.saturating_mul(block).min(req.prompt_units), 0)
                }
            };
            let load = slot.map_or(&idle, |s| &st.loads[s]);
            let Ahead {
                queued, decoding, ..
            } = ahead(load, inst, req.now, st.mean_uncached, cfg.progress_floor);
            cands.push(Candidate {
                index,
                matched_units,
                cached_units: matched_units,
                reported: report.is_some(),
                reach_units: matched_units.saturating_add(loadable_units),
                cost: load.cost_with(&st.pool, |gap| st.fades.factor(gap, instances)),
                queued_units: queued as f64,
                decoding: f64::from(decoding),
                expected_s: 0.0,
                full_prefill_s: 0.0,
                footprint: slot.map_or(0, |s| st.slots.footprint(s)),
                recent: slot.map_or(0.0, |s| st.recent[s]),
            });
        }
        shared_opening(&mut cands, &mut st.scratch, req.prompt_units);
        for c in cands.iter_mut() {
            // A block loaded from CPU memory costs a transfer, not a prefill: it saves
            // `offload_credit` of its computation.
            let loadable = c.reach_units.saturating_sub(c.matched_units);
            let uncached = f64::from(req.prompt_units - c.matched_units)
                - cfg.offload_credit * f64::from(loadable);
            c.expected_s = c.cost.ttft(c.queued_units + uncached, c.decoding);
            c.full_prefill_s = c.cost.per_unit_s * f64::from(req.prompt_units);
        }
        // How full each cache is, for the rule that keeps new content off the fullest, is what
        // this router sent there (`footprint`), also for kv-aware: taken from the engines'
        // reports instead (the same for every replica), it cost 2-6 points of hit rate on
        // sharegpt over HTTP (7 runs at 51.5-57.2% against 56.6-58.0% with the router's own;
        // cache-aware 56.7-58.5%), and the simulator showed no gain from it.
        // A prompt this router never sent (its first block unlisted): a new prefix, placed
        // with the wide tie so that replicas agree. One it sent before and that nobody holds
        // any more was evicted: placed by load, as any other.
        // (Looked up only when no candidate matched anything: the only case it decides.)
        let unseen = cands.iter().all(|c| c.blocks(block) == 0)
            && !keys.first().is_some_and(|h| st.index.contains(h));
        let chosen = choose::choose(&mut cands, cfg, req, fleet, unseen);
        st.cands = cands;
        let (chosen, reason) = chosen?;
        Ok(Decision {
            index: chosen.index,
            reason,
            predicted_cached_units: chosen.cached_units,
        })
    }

    fn dispatched(&self, req: &RouteRequest<'_>, decision: &Decision, instance: &Instance) -> Note {
        let cfg = &self.config;
        let keys = Keys::new(req.chain, req.model);
        let mut st = self.lock();
        let st = &mut *st;
        let Some(slot) = st.slot(instance.id_hash(), cfg, req.now) else {
            return Note::default();
        };
        // Decided before the instance was removed (its load reset since): it is not a member
        // any more, so nothing is learned of it, and this request must not join the queue
        // its feedback will never leave (see `feedback`).
        if req.now < st.loads[slot].since {
            return Note::default();
        }
        st.loads[slot].retire_whole(req.now);
        let predicted_blocks = (decision.predicted_cached_units / cfg.chain.block_units) as usize;
        let start = st.slots.counter[slot];
        // Blocks past the prediction that the index has sent there but takes for evicted (if
        // the engine reports them cached, the cache is at least as large as their distance), and
        // the deepest predicted block's stamp, both as they were before this request.
        let before = st.index.touch(keys, slot, &mut st.slots, predicted_blocks);
        // How many blocks the instance cached since the deepest predicted block was last used:
        // feedback compares it with the estimated cache size. Unknown (`u32::MAX`) when that
        // block was sent after a request that has no first token yet started: it may still be
        // being computed, and an engine does not share a prefix it has not finished, so a miss
        // then says nothing about evictions.
        let distance = before
            .last_predicted
            .map(|stamp| start.wrapping_sub(stamp))
            .filter(|&d| st.pending[slot].iter().all(|&p| d >= start.wrapping_sub(p)))
            .unwrap_or(u32::MAX);
        let (beyond, beyond_distance) = (before.beyond, before.beyond_distance);
        let keep = 1.0 - 1.0 / (SHARE_WINDOW * st.recent.len() as f64);
        st.recent.iter_mut().for_each(|r| *r *= keep);
        st.recent[slot] += 1.0;
        st.pending[slot].push_back(start);
        let uncached =
            u64::from(req.prompt_units - decision.predicted_cached_units.min(req.prompt_units));
        // The cost is learned on the whole queue the request found (`found`), not on the part
        // of it the decision counted as still ahead (`queued`). Learned on that part, a cold
        // start moved documents off their busy first homes (`crates/sim/tests/cold_start.rs`,
        // seed 2: 3-6 documents per instance against the issue's 4-5), though at a floor of 0.5
        // the Mooncake trace's P90 was lower (929 against 975 ms; BENCHMARKS.md).
        let Ahead {
            queued,
            found,
            decoding,
        } = ahead(
            &st.loads[slot],
            instance,
            req.now,
            st.mean_uncached,
            cfg.progress_floor,
        );
        st.mean_uncached += MEAN_WEIGHT * (uncached as f64 - st.mean_uncached);
        // Its expected time to first token, on the queue estimate and cost the decision used:
        // what its progress is counted over. For kv-aware, where the decision also counted a
        // shared opening or offloaded blocks as saved, this prices the request's whole uncached
        // prefix, so its progress is counted a little more slowly than the decision priced it.
        let instances = st.loads.len();
        // A whole answer's is needed even on the prior: it says when the request leaves.
        let learned = st.pool.learned();
        let estimate = if learned || req.whole_answer {
            st.loads[slot]
                .cost(&st.pool, instances)
                .ttft((queued + uncached) as f64, f64::from(decoding))
        } else {
            f64::NAN
        };
        let expected_s = if learned { estimate } else { f64::NAN };
        let load = &mut st.loads[slot];
        // What it waits behind, the two variables its time to first token is learned on: the
        // queued prefill (low 40 bits) and the requests decoding beside it (the rest).
        let ahead = found.min((1 << 40) - 1) | (u64::from(decoding.min((1 << 24) - 1)) << 40);
        let rate = load.join_queue(uncached, req.now, expected_s);
        if req.whole_answer {
            // Its first token will not be seen: it leaves the queue when it was expected, on
            // the prior's estimate until costs are learned.
            load.expect_whole(uncached, req.now, rate, start, estimate);
        }
        st.stats.match_blocks_histogram[bucket(predicted_blocks as u32)] += 1;
        [
            ahead,
            (u64::from(distance) << 32) | u64::from(start),
            (u64::from(beyond) << 32) | u64::from(beyond_distance),
            rate.to_bits(),
        ]
    }

    fn feedback(&self, t: &TicketInfo, event: &Feedback, now: f64) {
        let mut st = self.lock();
        let st = &mut *st;
        let Some(&slot) = st.slot_of.get(&t.instance_hash) else {
            return;
        };
        let slot = usize::from(slot);
        // Sent before the instance was removed (and its load reset): counting it out of the
        // new load would take another request's place there (and the queue's progress sums,
        // which it never joined, would drift).
        if t.sent_at < st.loads[slot].since {
            return;
        }
        let uncached = u64::from(t.prompt_units - t.predicted_cached_units.min(t.prompt_units));
        let load = &mut st.loads[slot];
        let before_first = t.first_token_at.is_none();
        let waiting_ends = matches!(event, Feedback::FirstToken)
            || (before_first && matches!(event, Feedback::Failed | Feedback::Cancelled));
        let start = t.note[1] as u32;
        // A request answered whole that already left the queue at its expected first token
        // ([`whole`]): it counts as decoding. Its start stays pending until now.
        let retired = waiting_ends && t.whole_answer && !load.take_whole(t.sent_at, start);
        if waiting_ends {
            let pending = &mut st.pending[slot];
            if let Some(at) = pending.iter().position(|&p| p == start) {
                pending.remove(at);
            }
        }
        match event {
            Feedback::FirstToken => {
                if !retired {
                    load.leave_queue(uncached, t.sent_at, f64::from_bits(t.note[3]));
                    load.decoding += 1;
                }
                // An unstreamed answer's time includes its decode: learning from it would
                // make prefill look that slow.
                if t.streamed {
                    let queued = t.note[0] & ((1 << 40) - 1);
                    let decoding = t.note[0] >> 40;
                    load.observe(
                        &mut st.pool,
                        (queued + uncached) as f64,
                        decoding as f64,
                        now - t.sent_at,
                    );
                }
            }
            Feedback::Finished { usage } => {
                load.decoding = load.decoding.saturating_sub(1);
                if let Some(u) = usage {
                    self.correct(st, slot, t, u.prompt_tokens, u.cached_tokens);
                }
            }
            Feedback::Failed | Feedback::Cancelled => {
                if before_first && !retired {
                    load.leave_queue(uncached, t.sent_at, f64::from_bits(t.note[3]));
                } else {
                    load.decoding = load.decoding.saturating_sub(1);
                }
            }
        }
    }

    fn membership(&self, instance: &InstanceId, change: MembershipChange, now: f64) {
        let hash = Instance::hash_of(instance.as_str());
        let mut st = self.lock();
        let Some(&slot) = st.slot_of.get(&hash) else {
            return;
        };
        let slot = usize::from(slot);
        match change {
            // It may come back restarted, with an empty cache: forget what it held.
            MembershipChange::Ejected | MembershipChange::Removed => {
                st.slots.forget(slot);
                if change == MembershipChange::Removed {
                    st.loads[slot] = InstanceLoad::since(self.config.prior, now);
                    st.pending[slot].clear();
                    if !st.removed.contains(&(slot as u16)) {
                        st.removed.push_back(slot as u16);
                    }
                }
            }
            // Back before its slot went to another: it keeps it.
            MembershipChange::Added | MembershipChange::Healthy => {
                st.removed.retain(|&s| usize::from(s) != slot);
            }
            MembershipChange::Draining => {}
        }
    }

    fn stats(&self) -> Option<StrategyStats> {
        let st = self.lock();
        let mut s = st.stats.clone();
        s.index_blocks = st.index.len() as u64;
        s.index_bytes = st.index.bytes() as u64;
        Some(s)
    }
}

impl CacheAware {
    /// Compares the engine's cached tokens with the prediction and adjusts the estimate of the
    /// instance's cache size.
    fn correct(
        &self,
        st: &mut State,
        slot: usize,
        t: &TicketInfo,
        prompt_tokens: u32,
        cached: Option<u32>,
    ) {
        let (Some(cached), true) = (cached, prompt_tokens > 0 && t.prompt_units > 0) else {
            return;
        };
        let per_token = f64::from(t.prompt_units) / f64::from(prompt_tokens);
        let reported_units = (f64::from(cached) * per_token).min(f64::from(t.prompt_units));
        let predicted_units = f64::from(t.predicted_cached_units);
        st.stats.predicted_cached_tokens += (predicted_units / per_token).round() as u64;
        st.stats.reported_cached_tokens += u64::from(cached);
        let block = f64::from(self.config.chain.block_units);
        let cap = &mut st.slots.capacity[slot];
        let distance = t.note[1] >> 32;
        if reported_units + block < predicted_units {
            // Predicted a hit the engine did not have: its cache is smaller than we thought, at
            // most about `distance` blocks.
            if distance < u64::from(u32::MAX) && distance < u64::from(*cap) {
                let d = distance as f64;
                *cap = if *cap == u32::MAX {
                    distance.max(1) as u32
                } else {
                    (f64::from(*cap) * 0.7 + d * 0.3).max(1.0) as u32
                };
            }
        } else if reported_units > predicted_units + block && *cap != u32::MAX {
            // The engine held more than we thought resident. If it held every block the index
            // had sent there past the prediction, its cache is at least their oldest distance.
            // (A surplus the index never sent there, a prefix with more holders than the index
            // keeps or sent by another router, says nothing about its size.)
            let beyond_units = f64::from((t.note[2] >> 32) as u32) * block;
            let beyond_distance = t.note[2] as u32;
            let all_beyond = (predicted_units + beyond_units).min(f64::from(t.prompt_units));
            if beyond_units > 0.0 && reported_units + block >= all_beyond {
                *cap = (*cap)
                    .max(beyond_distance.saturating_add(1))
                    .min(u32::MAX - 1);
            }
        }
    }
}
