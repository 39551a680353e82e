//! Three router replicas in front of one fleet, the load dealt among them (each client on one),
//! over real HTTP (`demo --replicas 3`): with `kv-aware` and the engines' KV events and scraped
//! queues, each prefix's requests stay together and no instance is overloaded; `cache-aware`,
//! whose replicas each learn only from their own traffic, scatters them. 7 engines of the
//! default preset, 60 documents of 8,000 tokens, 540 requests, 32 clients, engines at twice
//! real time.

use std::path::Path;
use std::process::Command;

fn demo(strategy: &str, json: &Path) -> serde_json::Value {
    let dir = json.parent().unwrap_or(Path::new("."));
    let plot = dir.join(format!("{strategy}.svg"));
    let out = Command::new(env!("CARGO_BIN_EXE_prefix-router"))
        .args(["demo", "--strategies", strategy, "--replicas", "3"])
        .args(["--kv-events", "--engine-queues"])
        .args([
            "--requests",
            "540",
            "--param",
            "documents=60",
            "--seed",
            "5",
        ])
        .args(["--time-scale", "0.5", "--json"])
        .arg(json)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap_or_else(|e| panic!("cannot run prefix-router: {e}"));
    assert!(
        out.status.success(),
        "demo failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(json).unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"))
}

fn affinity(report: &serde_json::Value) -> (f64, f64) {
    let a = &report["runs"][0]["affinity"];
    (
        a["on_home"].as_f64().unwrap_or(f64::NAN),
        a["max_share_over_mean"].as_f64().unwrap_or(f64::NAN),
    )
}

// Timing-sensitive (real servers, engines on the wall clock): release builds only, as
// `.ci/run` runs it.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "needs a release build: run `cargo test --release -p prefix-router --test replicas`"
)]
fn replicas_keep_prefixes_together_with_the_engines_signals() {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("replicas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let kv = demo("kv-aware", &dir.join("kv.json"));
    let ca = demo("cache-aware", &dir.join("ca.json"));
    let (kv_home, kv_max) = affinity(&kv);
    let (ca_home, _) = affinity(&ca);
    let report =
        format!("kv-aware: {kv_home:.3} on home, busiest {kv_max:.2}x; cache-aware: {ca_home:.3}");
    eprintln!("{report}");
    let runs = &kv["runs"][0];
    assert_eq!(runs["replicas"], 3, "{runs}");
    assert!(
        runs["kv_events"]["batches"].as_f64().unwrap_or(0.0) > 0.0,
        "{runs}"
    );
    assert_eq!(runs["kv_events"]["lost"].as_f64(), Some(0.0), "{runs}");
    assert!(kv_home >= 0.85, "{report}");
    assert!(kv_max <= 1.25, "{report}");
    assert!(kv_home > ca_home + 0.1, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
