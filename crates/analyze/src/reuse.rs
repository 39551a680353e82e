//! Reuse distance: how many distinct prompt tokens pass between two uses of a prefix. An LRU
//! prefix cache keeps a prefix exactly when fewer distinct tokens than it holds were touched in
//! between (Mattson's stack distance), so the distribution, set against one instance's cache and
//! the fleet's, says what any router can hope to keep.
//!
//! Each block reference is one step of a clock; a Fenwick tree over the clock marks where every
//! block was last touched, so the distinct blocks touched since a block's previous use are the
//! marks after that use: O(log n) a reference.

use std::collections::HashMap;

use prefix_router_sim::stats::nearest_rank;
use prefix_router_workload::Request;

/// Block references above which every `stride`-th block of each chain stands for its
/// neighbours ([`stride_for`]): 16 Mi references is 64 MiB of tree.
const MAX_REFERENCES: u64 = 16 << 20;

/// Reuse distances of a trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Reuse {
    /// Requests that reuse a prefix seen before (their distance is that of the end of the
    /// shared opening).
    pub reuses: u64,
    /// Median distance, tokens.
    pub p50_tokens: u64,
    /// 90th percentile, tokens.
    pub p90_tokens: u64,
    /// One instance's prefix cache, tokens (from the engine model).
    pub instance_cache_tokens: u64,
    /// Every instance's together.
    pub fleet_cache_tokens: u64,
    /// Reuses that come back within one instance's cache (the traffic in between and the
    /// opening itself fit in it): kept even by a cache-blind balancer if the instance sees all
    /// the traffic, and by any router.
    pub within_instance: f64,
    /// Reuses within the fleet's cache but not one instance's: kept only by a router that
    /// partitions prefixes over instances.
    pub within_fleet_only: f64,
    /// Reuses beyond the fleet's cache: no router keeps them (more instances or a larger cache
    /// would).
    pub beyond_fleet: f64,
    /// Blocks of a chain standing for one (1 unless the trace is very long).
    pub stride: u32,
}

struct Fenwick(Vec<u32>);

impl Fenwick {
    fn add(&mut self, pos: usize, delta: i32) {
        let mut i = pos + 1;
        while i <= self.0.len() {
            self.0[i - 1] = self.0[i - 1].wrapping_add_signed(delta);
            i += i & i.wrapping_neg();
        }
    }
    /// Sum of positions `0..end`.
    fn prefix(&self, end: usize) -> u64 {
        let mut i = end.min(self.0.len());
        let mut s = 0u64;
        while i > 0 {
            s += u64::from(self.0[i - 1]);
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// Every `stride`-th block of each chain stands for its neighbours once the trace holds more
/// than [`MAX_REFERENCES`] blocks, so the reuse tree here and the traffic profile's prefix trie
/// stay bounded on long prompts (distances and lengths then count in steps of the stride).
pub fn stride_for(requests: &[Request], block_tokens: u32) -> usize {
    stride_within(requests, block_tokens, MAX_REFERENCES)
}

fn stride_within(requests: &[Request], block_tokens: u32, max_references: u64) -> usize {
    let total: u64 = requests
        .iter()
        .map(|r| u64::from(r.prompt_tokens() / block_tokens.max(1)))
        .sum();
    total.div_ceil(max_references.max(1)).max(1) as usize
}

/// The block hashes of `r` that stand for the chain at `stride` ([`stride_for`]): every
/// `stride`-th, from the first, into `out` (no copy when the stride is 1).
pub fn sampled_hashes(r: &Request, block_tokens: u32, stride: usize, out: &mut Vec<u64>) {
    r.block_hashes_into(block_tokens, out);
    if stride > 1 {
        let mut i = 0usize;
        out.retain(|_| {
            i += 1;
            (i - 1).is_multiple_of(stride)
        });
    }
}

/// Reuse distances of `requests` (in arrival order) with `block_tokens`-token blocks, against
/// caches of `instance_cache_tokens` each over `instances` instances.
pub fn reuse_distances(
    requests: &[Request],
    block_tokens: u32,
    instance_cache_tokens: u64,
    instances: u32,
) -> Reuse {
    let stride = stride_for(requests, block_tokens);
    reuse_distances_at(
        requests,
        block_tokens,
        stride,
        instance_cache_tokens,
        instances,
    )
}

/// [`reuse_distances`] at a stride the caller already has.
pub fn reuse_distances_at(
    requests: &[Request],
    block_tokens: u32,
    stride: usize,
    instance_cache_tokens: u64,
    instances: u32,
) -> Reuse {
    let stride = stride.max(1);
    let references: usize = requests
        .iter()
        .map(|r| ((r.prompt_tokens() / block_tokens.max(1)) as usize).div_ceil(stride))
        .sum();
    let mut tree = Fenwick(vec![0; references + 1]);
    let mut last: HashMap<u64, usize> = HashMap::new();
    let mut clock = 0usize;
    let mut distances = Vec::new();
    let mut needs = Vec::new();
    let mut sampled = Vec::new();
    for r in requests {
        sampled_hashes(r, block_tokens, stride, &mut sampled);
        let leading = sampled.iter().take_while(|h| last.contains_key(*h)).count();
        // The opening's deepest block, measured before this request touches anything. An
        // engine releases a request's blocks tail first, so the opening is the most recently
        // used part of the request that last had it: the opening's shallower blocks were
        // touched after its deepest one, and they are the prefix itself, not traffic between.
        let deepest = leading
            .checked_sub(1)
            .and_then(|i| last.get(&sampled[i]).copied())
            .map(|prev| {
                (tree.prefix(clock) - tree.prefix(prev + 1)).saturating_sub(leading as u64 - 1)
            });
        for h in sampled.iter().rev() {
            if clock >= tree.0.len() {
                break;
            }
            if let Some(prev) = last.insert(*h, clock) {
                tree.add(prev, -1);
            }
            tree.add(clock, 1);
            clock += 1;
        }
        if let Some(d) = deepest {
            let tokens = stride as u64 * u64::from(block_tokens);
            distances.push(d * tokens);
            // What a cache must hold to still have the opening: the traffic in between and
            // the opening itself. Set against the traffic alone, two copies of a 100k-token
            // prompt read as kept by a 65k-token cache.
            needs.push((d + leading as u64) * tokens);
        }
    }
    distances.sort_unstable();
    let n = distances.len();
    let pct = |p: f64| nearest_rank(&distances, p).unwrap_or(0);
    let fleet = instance_cache_tokens.saturating_mul(u64::from(instances.max(1)));
    let share = |f: &dyn Fn(u64) -> bool| {
        if n == 0 {
            0.0
        } else {
            needs.iter().filter(|d| f(**d)).count() as f64 / n as f64
        }
    };
    Reuse {
        reuses: n as u64,
        p50_tokens: pct(50.0),
        p90_tokens: pct(90.0),
        instance_cache_tokens,
        fleet_cache_tokens: fleet,
        within_instance: share(&|d| d <= instance_cache_tokens),
        within_fleet_only: share(&|d| d > instance_cache_tokens && d <= fleet),
        beyond_fleet: share(&|d| d > fleet),
        stride: stride as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_workload::{Message, Role, Segment};

    fn req(id: u64, segs: &[(u64, u32)]) -> Request {
        Request {
            id,
            arrival_s: id as f64,
            group: None,
            model: None,
            messages: vec![Message::new(
                Role::User,
                segs.iter()
                    .map(|&(id, tokens)| Segment { id, tokens })
                    .collect(),
            )],
            output_tokens: 1,
        }
    }

    #[test]
    fn distance_counts_distinct_tokens_in_between() {
        // A (64 tokens = 4 blocks), then B and C (unique, 160 tokens = 10 blocks each), then A
        // again: 20 distinct blocks of others (320 tokens) passed, whatever B's repeats.
        let a = req(0, &[(1, 64)]);
        let b = req(1, &[(2, 160)]);
        let c = req(2, &[(3, 160)]);
        let again = req(3, &[(1, 64), (9, 16)]);
        let r = reuse_distances(&[a, b.clone(), c, b, again], 16, 400, 2);
        assert_eq!(r.reuses, 2, "B's repeat and A's");
        // B's repeat: C's 10 blocks in between; A's: B and C, 20 blocks.
        assert_eq!(r.p90_tokens, 320);
        assert_eq!(r.p50_tokens, 160);
        assert_eq!(r.within_instance, 1.0);
        let small = reuse_distances(
            &[
                req(0, &[(1, 64)]),
                req(1, &[(2, 160)]),
                req(2, &[(3, 160)]),
                req(3, &[(1, 64)]),
            ],
            16,
            200,
            2,
        );
        assert_eq!(small.reuses, 1);
        assert_eq!((small.within_instance, small.within_fleet_only), (0.0, 1.0));
        assert_eq!(small.stride, 1);
    }

    #[test]
    fn a_stride_keeps_every_reuse_and_scales_distances() {
        // 5 requests of 4..=10 blocks (34 in all) bounded to 16 references: stride 3, and the
        // tree must hold each request's rounded-up share, or the last reuse is lost.
        let reqs = [
            req(0, &[(1, 64)]),
            req(1, &[(2, 160)]),
            req(2, &[(3, 160)]),
            req(3, &[(2, 160)]),
            req(4, &[(1, 64)]),
        ];
        let r = reuse_distances_at(&reqs, 16, stride_within(&reqs, 16, 16), 10_000, 1);
        assert_eq!(r.stride, 3);
        assert_eq!(r.reuses, 2, "both repeats are still seen");
        let exact = reuse_distances(&reqs, 16, 10_000, 1);
        assert_eq!(exact.reuses, 2);
        // Sampled distances count sampled blocks times the stride: near the exact ones.
        assert!(
            r.p90_tokens.abs_diff(exact.p90_tokens) <= 3 * 16 * 2,
            "{r:?} vs {exact:?}"
        );
    }

    #[test]
    fn a_reuse_is_kept_only_if_the_opening_itself_fits_too() {
        // Nothing in between, but the prompt (160 tokens) is larger than the cache (100).
        let r = reuse_distances(&[req(0, &[(1, 160)]), req(1, &[(1, 160)])], 16, 100, 1);
        assert_eq!((r.reuses, r.p50_tokens), (1, 0));
        assert_eq!((r.within_instance, r.beyond_fleet), (0.0, 1.0));
        // Exactly the cache's size: kept.
        let r = reuse_distances(&[req(0, &[(1, 160)]), req(1, &[(1, 160)])], 16, 160, 1);
        assert_eq!(r.within_instance, 1.0);
    }

    #[test]
    fn no_reuse_gives_zeros() {
        let r = reuse_distances(&[req(0, &[(1, 64)]), req(1, &[(2, 64)])], 16, 100, 1);
        assert_eq!((r.reuses, r.p50_tokens, r.beyond_fleet), (0, 0, 0.0));
    }
}
