//! The ceiling: one infinite prefix cache that sees every request in order.

use std::collections::HashSet;

use prefix_router_workload::Request;

/// Fraction of prompt tokens one infinite cache would serve: for each request, the tokens of its
/// leading full blocks already seen by any earlier request (no eviction, no routing).
pub fn oracle_hit_rate(requests: &[Request], block_tokens: u32) -> f64 {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut cached: u64 = 0;
    let mut prompt: u64 = 0;
    for req in requests {
        let hashes = req.block_hashes(block_tokens);
        let hit_blocks = hashes.iter().take_while(|h| seen.contains(h)).count() as u64;
        cached += hit_blocks * u64::from(block_tokens);
        prompt += u64::from(req.prompt_tokens());
        seen.extend(hashes);
    }
    if prompt == 0 {
        0.0
    } else {
        cached as f64 / prompt as f64
    }
}
