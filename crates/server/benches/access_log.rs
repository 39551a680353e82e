//! What the access log costs the request path: building a request's entry (the copies the
//! proxy makes: its block chain, the instance id, the model; the wall clock) and handing it to
//! the writer, timed call by call while the writer task appends to a file on another thread.
//! Reports p50/p99/p99.9 per call, and how many lines the writer dropped (none at these rates).
//!
//! Run: `cargo bench -p prefix-router-server --bench access_log`
//! Knobs: `BENCH_LINES` (default 200,000), `BENCH_BLOCKS` (chain length, default 128: a
//! 16 Ki-character prompt), `BENCH_BURST` (lines between 1 ms pauses, default 50: about 50,000
//! lines/s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_router_server::access_log::{unix_now, AccessLog, Entry};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

fn main() {
    let lines = env("BENCH_LINES", 200_000) as usize;
    let blocks = env("BENCH_BLOCKS", 128);
    let burst = env("BENCH_BURST", 50).max(1) as usize;
    let dir = std::env::temp_dir().join(format!("pr-bench-access-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("access.jsonl");
    let _ = std::fs::remove_file(&path);
    let log = Arc::new(AccessLog::open(&path, 65_536).unwrap_or_else(|e| panic!("{e}")));
    let writer = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let task = writer.spawn(log.writer().unwrap_or_else(|| panic!("a writer")));
    let chain: Vec<u64> = (0..blocks)
        .map(|b| b.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let id = String::from("http://10.0.0.5:8000");
    let model: Option<String> = Some("llama-3.1-8b".into());
    let received = Instant::now();
    let mut samples = Vec::with_capacity(lines);
    for i in 0..lines {
        let start = Instant::now();
        // What proxy.rs does per request when the log is on.
        let entry = Entry {
            t: unix_now() - received.elapsed().as_secs_f64(),
            api: "chat",
            model: model.as_deref().map(Into::into),
            group: Some(0xabcd),
            prompt_units: (blocks * 128) as u32,
            block_units: 128,
            chain: chain.as_slice().into(),
            instance: id.as_str().into(),
            reason: "cache_hit",
            attempt: 0,
            status: 200,
            outcome: "ok",
            ttft_s: Some(0.25),
            duration_s: 1.5,
            prompt_tokens: Some(4096),
            cached_tokens: Some(3072),
            output_tokens: Some(200),
        };
        log.log(entry);
        samples.push(start.elapsed().as_nanos() as u64);
        if i % burst == burst - 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    log.close();
    let _ = writer.block_on(task);
    samples.sort_unstable();
    let written = std::fs::read_to_string(&path)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    println!(
        "access log, {lines} lines of a {blocks}-block chain: per call p50 {:.2} µs, p99 {:.2} µs, p99.9 {:.2} µs; written {written}, dropped {}",
        pct(&samples, 0.5) as f64 / 1000.0,
        pct(&samples, 0.99) as f64 / 1000.0,
        pct(&samples, 0.999) as f64 / 1000.0,
        log.dropped.get()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
