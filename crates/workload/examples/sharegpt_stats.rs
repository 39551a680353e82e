//! Prints what a ShareGPT V3 file yields: `cargo run --release -p prefix-router-workload
//! --example sharegpt_stats -- FILE`.

use prefix_router_workload::sharegpt::{load_sharegpt, ReplayOptions};
use prefix_router_workload::trace::oracle_hit_rate;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: sharegpt_stats FILE")?;
    let r = load_sharegpt(&path, &ReplayOptions::default())?;
    let tokens: u64 = r
        .requests
        .iter()
        .map(|q| u64::from(q.prompt_tokens()))
        .sum();
    let n = r.requests.len().max(1) as f64;
    println!(
        "conversations {} (truncated: {}), without request {}, skipped messages {}",
        r.conversations, r.truncated, r.conversations_without_request, r.skipped_messages
    );
    println!(
        "requests {}, mean prompt {:.0} words, oracle hit rate (16-token blocks) {:.3}",
        r.requests.len(),
        tokens as f64 / n,
        oracle_hit_rate(&r.requests, 16)
    );
    Ok(())
}
