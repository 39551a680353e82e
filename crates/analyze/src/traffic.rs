//! The traffic itself, before any simulation: how much of it shares openings and how long
//! they are, which prefixes are hottest, what a perfect router could save, tenants, and how the
//! routing key of `prefix-aware` buckets the requests at each prefix length.

use std::collections::HashMap;

use prefix_router_sim::stats::nearest_rank;
use prefix_router_workload::Request;

use crate::keys::{key_buckets, KeyBuckets};
use crate::reuse::{self, reuse_distances_at, Reuse};
use crate::Input;

/// Hottest prefixes listed.
pub const HOTTEST: usize = 5;
/// Tenants listed.
pub const TOP_TENANTS: usize = 5;

/// Bounds (tokens, exclusive upper) of the shared-opening histogram after the "none" bucket.
const OPENING_BOUNDS: [u64; 5] = [256, 1024, 4096, 16384, u64::MAX];

/// Percentiles of a token count.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct TokenStats {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl TokenStats {
    fn of(mut v: Vec<u64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_unstable();
        let at = |p: f64| nearest_rank(&v, p).unwrap_or(0);
        TokenStats {
            mean: v.iter().sum::<u64>() as f64 / v.len() as f64,
            p50: at(50.0),
            p90: at(90.0),
            p99: at(99.0),
            max: at(100.0),
        }
    }
}

/// Requests whose shared opening (the leading tokens they share with some earlier request, in
/// whole blocks) falls in one range.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpeningBucket {
    /// Shortest opening in the bucket, tokens.
    pub from_tokens: u64,
    /// Longest, exclusive (`None`: no bound).
    pub to_tokens: Option<u64>,
    /// Fraction of requests.
    pub share: f64,
}

/// A prefix where sharing ends: every request through it shares it, and no longer prefix is
/// shared by all of them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HotPrefix {
    /// Requests that start with it.
    pub requests: u64,
    /// Their fraction of all requests.
    pub share: f64,
    /// Its length in tokens (whole blocks).
    pub tokens: u64,
    /// The first request (0-based, in arrival order) that has it, to look it up in the trace.
    pub first_request: u64,
}

/// Routing groups (`prompt_cache_key`) in the trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Tenants {
    /// Distinct groups.
    pub groups: u64,
    /// Fraction of requests that name one.
    pub grouped_share: f64,
    /// The largest groups: (group, fraction of requests).
    pub largest: Vec<(String, f64)>,
}

/// When one opening covers most of the traffic at the configured prefix length, `prefix-aware`
/// sends most of it to one instance.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Collapse {
    /// The prefix length it was found at (characters).
    pub prefix_length: usize,
    /// The largest key bucket's share there.
    pub largest_share: f64,
    /// The shortest longer prefix length at which the largest bucket holds at most half the
    /// requests (`None`: none up to 65,536).
    pub splits_at: Option<usize>,
    /// The largest share at `splits_at`.
    pub split_share: Option<f64>,
}

/// The traffic profile.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Traffic {
    /// Requests.
    pub requests: u64,
    /// First to last arrival, seconds.
    pub span_s: f64,
    /// Mean arrival rate, requests per second.
    pub rate_rps: f64,
    /// Prompt lengths, tokens.
    pub prompt_tokens: TokenStats,
    /// Output lengths, tokens.
    pub output_tokens: TokenStats,
    /// Tokens a block (the engine model's, at which prefix caches share).
    pub block_tokens: u32,
    /// How long the shared openings are.
    pub openings: Vec<OpeningBucket>,
    /// The hottest prefixes, by requests.
    pub hottest: Vec<HotPrefix>,
    /// Fraction of prompt tokens one unbounded cache seeing every request would serve.
    pub oracle_hit_rate: f64,
    /// Prompt tokens in the trace.
    pub total_prompt_tokens: u64,
    /// Prefill tokens a perfect router (unbounded caches) would not recompute.
    pub oracle_saved_tokens: u64,
    /// Reuse distances against the fleet's caches.
    pub reuse: Reuse,
    /// Tenants.
    pub tenants: Tenants,
    /// The routing key's buckets at each prefix length.
    pub keys: Vec<KeyBuckets>,
    /// Set when one opening covers over half of the traffic at the configured prefix length.
    pub collapse: Option<Collapse>,
}

struct Node {
    requests: u32,
    tokens: u64,
    largest_child: u32,
    first: u32,
    /// The block before it (chained hashes: one parent whatever the request).
    parent: Option<u64>,
}

/// Profiles the trace's requests for a fleet of `instances` engines caching
/// `instance_cache_tokens` each in `block_tokens`-token blocks, with `prefix_length` the
/// prefix length configured today.
pub fn profile(
    input: &Input,
    block_tokens: u32,
    instance_cache_tokens: u64,
    instances: u32,
    prefix_length: usize,
) -> Traffic {
    let requests = &input.requests[..];
    let n = requests.len() as u64;
    let stride = reuse::stride_for(requests, block_tokens);
    // Tokens up to and including the `depth`-th sampled block.
    let tokens_at = |depth: usize| (depth * stride + 1) as u64 * u64::from(block_tokens);
    let mut nodes: HashMap<u64, Node> = HashMap::new();
    let mut openings = vec![0u64; OPENING_BOUNDS.len() + 1];
    let mut total = 0u64;
    let mut hashes = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        total += u64::from(r.prompt_tokens());
        reuse::sampled_hashes(r, block_tokens, stride, &mut hashes);
        let leading = hashes.iter().take_while(|h| nodes.contains_key(h)).count();
        let shared = leading.checked_sub(1).map_or(0, tokens_at);
        let bucket = if shared == 0 {
            0
        } else {
            1 + OPENING_BOUNDS.iter().take_while(|b| shared >= **b).count()
        };
        openings[bucket.min(OPENING_BOUNDS.len())] += 1;
        for (depth, h) in hashes.iter().enumerate() {
            let node = nodes.entry(*h).or_insert(Node {
                requests: 0,
                tokens: tokens_at(depth),
                largest_child: 0,
                first: i as u32,
                parent: depth.checked_sub(1).map(|d| hashes[d]),
            });
            node.requests += 1;
        }
    }
    // A prefix is where sharing ends when no child carries all of its requests.
    let links: Vec<(u64, u32)> = nodes
        .values()
        .filter_map(|c| c.parent.map(|p| (p, c.requests)))
        .collect();
    for (parent, requests) in links {
        if let Some(p) = nodes.get_mut(&parent) {
            p.largest_child = p.largest_child.max(requests);
        }
    }
    let mut hottest: Vec<&Node> = nodes
        .values()
        .filter(|n| n.requests >= 2 && n.largest_child < n.requests)
        .collect();
    hottest.sort_by(|a, b| {
        b.requests
            .cmp(&a.requests)
            .then(b.tokens.cmp(&a.tokens))
            .then(a.first.cmp(&b.first))
    });
    let hottest = hottest
        .into_iter()
        .take(HOTTEST)
        .map(|node| HotPrefix {
            requests: u64::from(node.requests),
            share: f64::from(node.requests) / n.max(1) as f64,
            tokens: node.tokens,
            first_request: u64::from(node.first),
        })
        .collect();
    let openings = openings
        .iter()
        .enumerate()
        .map(|(i, &count)| {
            let (from_tokens, to_tokens) = match i {
                0 => (0, Some(1)),
                1 => (1, Some(OPENING_BOUNDS[0])),
                _ => (
                    OPENING_BOUNDS[i - 2],
                    Some(OPENING_BOUNDS[i - 1]).filter(|b| *b != u64::MAX),
                ),
            };
            OpeningBucket {
                from_tokens,
                to_tokens,
                share: count as f64 / n.max(1) as f64,
            }
        })
        .collect();
    // The simulator's own ceiling (exact, whatever the stride).
    let oracle = prefix_router_workload::trace::oracle_hit_rate(requests, block_tokens);
    let keys = key_buckets(requests);
    let collapse = collapse_at(&keys, prefix_length);
    Traffic {
        requests: n,
        span_s: input.span_s(),
        rate_rps: input.rate_rps(),
        prompt_tokens: TokenStats::of(
            requests
                .iter()
                .map(|r| u64::from(r.prompt_tokens()))
                .collect(),
        ),
        output_tokens: TokenStats::of(
            requests
                .iter()
                .map(|r| u64::from(r.output_tokens))
                .collect(),
        ),
        block_tokens,
        openings,
        hottest,
        oracle_hit_rate: oracle,
        total_prompt_tokens: total,
        oracle_saved_tokens: (oracle * total as f64).round() as u64,
        reuse: reuse_distances_at(
            requests,
            block_tokens,
            stride,
            instance_cache_tokens,
            instances,
        ),
        tenants: tenants(requests),
        keys,
        collapse,
    }
}

fn tenants(requests: &[Request]) -> Tenants {
    let mut counts: HashMap<&str, u64> = HashMap::new();
    for r in requests {
        if let Some(g) = &r.group {
            *counts.entry(g.as_str()).or_insert(0) += 1;
        }
    }
    let n = requests.len().max(1) as f64;
    let grouped: u64 = counts.values().sum();
    let mut largest: Vec<(String, f64)> = counts
        .iter()
        .map(|(g, c)| (g.to_string(), *c as f64 / n))
        .collect();
    largest.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    largest.truncate(TOP_TENANTS);
    Tenants {
        groups: counts.len() as u64,
        grouped_share: grouped as f64 / n,
        largest,
    }
}

/// Over half the traffic in one key bucket at `prefix_length` (or the nearest measured length
/// at or above it) is a collapse; where it splits is the first longer length below half.
fn collapse_at(keys: &[KeyBuckets], prefix_length: usize) -> Option<Collapse> {
    let at = keys.iter().find(|k| k.prefix_length >= prefix_length)?;
    if at.largest_share <= 0.5 {
        return None;
    }
    let split = keys
        .iter()
        .find(|k| k.prefix_length > at.prefix_length && k.largest_share <= 0.5);
    Some(Collapse {
        prefix_length: at.prefix_length,
        largest_share: at.largest_share,
        splits_at: split.map(|k| k.prefix_length),
        split_share: split.map(|k| k.largest_share),
    })
}
