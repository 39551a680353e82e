//! How `prefix-aware`'s routing key buckets the traffic at each prefix length: the collapse a
//! shared opening longer than the key causes shows here as one bucket holding most requests.

use std::collections::HashMap;

use prefix_router_core::{KeyOptions, PrefixLength};
use prefix_router_sim::run::route_info;
use prefix_router_workload::Request;

/// Prefix lengths measured: every power of two `serve` accepts.
pub const LENGTHS: [usize; 7] = [1024, 2048, 4096, 8192, 16384, 32768, 65536];

/// Requests sampled (evenly over the trace) for the table: a key of 65,536 characters costs
/// about 0.2 ms to derive, and bucket shares settle long before 100,000 requests.
pub const SAMPLE: usize = 2000;

/// The key's buckets at one prefix length.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeyBuckets {
    /// Characters of the key.
    pub prefix_length: usize,
    /// Requests sampled.
    pub sampled: u64,
    /// Distinct keys among them.
    pub distinct: u64,
    /// The largest bucket's fraction of the sample.
    pub largest_share: f64,
}

/// The buckets at every length of [`LENGTHS`], over a sample of at most [`SAMPLE`] requests.
/// A request whose key cannot be derived (it has no text) counts in a bucket of its own.
pub fn key_buckets(requests: &[Request]) -> Vec<KeyBuckets> {
    let step = requests.len().div_ceil(SAMPLE).max(1);
    let sample: Vec<&Request> = requests.iter().step_by(step).collect();
    LENGTHS
        .iter()
        .filter_map(|&len| {
            let opts = KeyOptions::key_only(PrefixLength::new(len as u64).ok()?);
            let mut counts: HashMap<u64, u64> = HashMap::new();
            for (i, r) in sample.iter().enumerate() {
                let key = route_info(r, &opts).map_or(u64::MAX - i as u64, |info| info.key.0);
                *counts.entry(key).or_insert(0) += 1;
            }
            let largest = counts.values().copied().max().unwrap_or(0);
            Some(KeyBuckets {
                prefix_length: len,
                sampled: sample.len() as u64,
                distinct: counts.len() as u64,
                largest_share: largest as f64 / sample.len().max(1) as f64,
            })
        })
        .collect()
}
