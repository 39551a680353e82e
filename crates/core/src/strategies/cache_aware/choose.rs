//! The choice among scored candidates: the share bound, ties, the rendezvous that names what a
//! tie is about, the footprint rule for new content, and the reason (see the module
//! documentation of [`super`]).

use super::super::common::no_instance;
use super::super::prefix_aware::rendezvous_mix;
use super::load::Cost;
use super::CacheAwareConfig;
use crate::{FleetSnapshot, KeyHash, Reason, RouteError, RouteRequest};

/// Requests above the mean the share bound always allows.
const SHARE_SLACK: f64 = 8.0;

/// Below this fraction of the share bound an instance has room for a prefix to grow.
const HEADROOM: f64 = 0.8;

/// One candidate during a decision.
#[derive(Debug, Clone, Copy)]
pub(super) struct Candidate {
    pub(super) index: usize,
    /// The match the choice counts, in units (a shared opening counted for every candidate,
    /// see `super::shared_opening`); [`Candidate::blocks`] in whole blocks.
    pub(super) matched_units: u32,
    /// The prefix it really holds (the prediction the engine's `cached_tokens` is checked on).
    pub(super) cached_units: u32,
    /// Whether its match is its engine's report (kv-aware), not the index's guess.
    pub(super) reported: bool,
    /// How far its offloaded copy reaches, in units from the prompt's start (kv-aware).
    pub(super) reach_units: u32,
    /// What its time to first token is priced on: the cost fit, the prefill ahead and the
    /// requests decoding beside.
    pub(super) cost: Cost,
    pub(super) queued_units: f64,
    pub(super) decoding: f64,
    pub(super) expected_s: f64,
    /// What the whole prompt's prefill costs there (the scale of a meaningful difference).
    pub(super) full_prefill_s: f64,
    /// Blocks it probably holds (cache pressure).
    pub(super) footprint: u32,
    /// Requests sent there recently.
    pub(super) recent: f64,
}

impl Candidate {
    /// Its match in whole blocks of `block` units.
    pub(super) fn blocks(&self, block: u32) -> u32 {
        self.matched_units / block.max(1)
    }
}

/// Picks among `cands` (every eligible instance, scored) and says why; `unseen`: the router
/// never sent this prompt's first block anywhere.
pub(super) fn choose(
    cands: &mut Vec<Candidate>,
    cfg: &CacheAwareConfig,
    req: &RouteRequest<'_>,
    fleet: &FleetSnapshot,
    unseen: bool,
) -> Result<(Candidate, Reason), RouteError> {
    let block = cfg.chain.block_units;
    // The longest match among all, for the reasons, before the bound takes any out.
    let longest = cands.iter().max_by_key(|c| c.blocks(block)).copied();
    // Bounded load: an instance that would take more than `max_share` times the mean of the
    // recent requests is out of this decision (its holders' prefix then gains a home
    // elsewhere). At least `SHARE_SLACK` requests above the mean are always allowed, so that
    // while few requests have been seen (a cold start) chance does not scatter prefixes.
    // The least loaded always stays in.
    let mean = (cands.iter().map(|c| c.recent).sum::<f64>() + 1.0) / cands.len().max(1) as f64;
    let bound = (cfg.max_share * mean).max(mean + SHARE_SLACK);
    if cfg.max_share > 0.0 {
        // A request that one instance alone holds most of stays there up to `hold_share`:
        // sent elsewhere it is a miss and a second copy, while the requests with a choice
        // (a prefix with several homes, new content) are the ones to move.
        let sole = {
            let mut most = cands
                .iter()
                .filter(|c| 2 * u64::from(c.matched_units) >= u64::from(req.prompt_units));
            match (most.next(), most.next()) {
                (Some(c), None) if c.matched_units > 0 => Some(c.index),
                _ => None,
            }
        };
        let hold = (cfg.hold_share * mean).max(mean + SHARE_SLACK).max(bound);
        cands.retain(|c| {
            c.recent + 1.0 <= bound
                || (cfg.hold_share > 0.0 && Some(c.index) == sole && c.recent + 1.0 <= hold)
        });
    }
    let Some(best) = cands
        .iter()
        .min_by(|a, b| a.expected_s.total_cmp(&b.expected_s))
        .copied()
    else {
        return Err(no_instance(fleet, req.model));
    };
    let max_blocks = longest.map_or(0, |c| c.blocks(block));
    // Tied: within `tie_tolerance` of the whole prompt's prefill of the best. Measured
    // against that rather than against the best's own (maybe tiny) cost, so that noise in
    // the learned costs of two instances that both hold a prefix does not flip it between
    // them on every request.
    // Where nobody holds any of a prompt this router never sent, a wider tie
    // (`cold-tie-tolerance`): the new prefix then goes by rendezvous among every instance not
    // clearly busier than the best. Router replicas each see their own queues, so a narrow tie
    // makes each place it by its own view; a wide one makes them agree (the load still counts:
    // an instance busier by more than that is out), and the requests that follow before the
    // engines report the first one's blocks land with it. A prompt sent before and evicted
    // since is placed by load: on caches that evict often, the wide tie kept sending
    // documents back to the cache that had just dropped them (5 points of hit rate).
    let tolerance = if max_blocks == 0 && unseen {
        cfg.tie_tolerance.max(cfg.cold_tie_tolerance)
    } else {
        cfg.tie_tolerance
    };
    let limit = best.expected_s + tolerance * best.full_prefill_s;
    let tied = || cands.iter().filter(|c| c.expected_s <= limit);
    let max_units = longest.map_or(0, |c| c.matched_units);
    // Among the tied, a match counts by what it saves: those within the same tolerance of
    // the longest match compete (a shared opening that is a small part of the prompt does
    // not make its holders the only candidates for every new document behind it).
    let held = tied().map(|c| c.blocks(block)).max().unwrap_or(0);
    let held_units = held.saturating_mul(block).min(req.prompt_units);
    let slack = (cfg.tie_tolerance * f64::from(req.prompt_units)) as u32;
    let floor = held_units.saturating_sub(slack);
    let competing = || tied().filter(|c| c.matched_units >= floor);
    // They compete by a rendezvous score of a block that names what the choice is about.
    // When the held prefix is most of the prompt, its last block (so a cooled hot prefix
    // goes back to one home, the same one every time). Otherwise the new content after it:
    // the first block past the longest match (so new documents behind a shared opening,
    // or on an idle fleet, spread out deterministically and router replicas agree).
    let new_content = 2 * u64::from(held_units) < u64::from(req.prompt_units) || held == 0;
    let at = if new_content { held } else { held - 1 };
    let tie_key = req
        .chain
        .get(at as usize)
        .or(req.chain.last())
        .copied()
        .or(req.key.map(|k| k.0))
        .unwrap_or(0);
    // New content adds to a cache: not to one already well above the competing
    // candidates' mean (rendezvous alone leaves some instances with twice the prefixes of
    // others, and the fullest then evicts what it was sent).
    let (n, sum) = competing().fold((0u64, 0u64), |(n, sum), c| {
        (n + 1, sum + u64::from(c.footprint))
    });
    let roomy = |c: &&Candidate| !new_content || u64::from(c.footprint) * 10 * n <= sum * 11;
    // Among those, ones with room under the share bound first: a prefix whose home is near
    // its bound soon spills (its next request finds the home full and goes elsewhere, a miss
    // and a second copy), while an equally good instance with room keeps it. In the simulator
    // (seed 1) agent went 92.5 -> 92.9% for cache-aware and 92.1 -> 93.1% for kv-aware, its
    // busiest instance 1.13 -> 1.06x the mean; hot-prefix 64.1 -> 65.5% for kv-aware (64.9 ->
    // 64.8% for cache-aware); see BENCHMARKS.md.
    let room = |c: &&Candidate| cfg.max_share <= 0.0 || c.recent + 1.0 <= HEADROOM * bound;
    let pick = |with_room: bool| {
        competing()
            .filter(roomy)
            .filter(|c| !with_room || room(c))
            .max_by_key(|c| rendezvous_mix(KeyHash(tie_key), fleet.instances()[c.index].id_hash()))
            .copied()
    };
    let chosen = pick(true)
        .or_else(|| pick(false))
        .ok_or_else(|| no_instance(fleet, req.model))?;
    let from = || {
        longest
            .map(|c| fleet.instances()[c.index].id().clone())
            .unwrap_or_else(|| fleet.instances()[chosen.index].id().clone())
    };
    // Reasons by the same measure: a match within the tolerance of nothing is no holder.
    let reason = if max_blocks == 0 || max_units <= slack {
        Reason::Cold
    } else if chosen.matched_units + slack >= max_units {
        Reason::CacheHit
    } else if chosen.blocks(block) > 0 {
        Reason::HotReplica { from: from() }
    } else {
        Reason::Load { from: from() }
    };
    Ok((chosen, reason))
}
