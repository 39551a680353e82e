//! Three router replicas in front of one fleet, the load dealt among them (each client on one),
//! over real HTTP (`demo --replicas 3`): with `kv-aware` and the engines' KV events, with and
//! without the scraped queues, ≥ 95% of each prefix's requests stay on one instance (as with
//! one router) and no instance takes more than 1.25x the mean; `cache-aware`, whose replicas
//! each learn only from their own traffic, scatters more. 7 engines of the default preset,
//! long-context's 600 documents of 8,000 tokens, 1,800 requests (three a document, so most
//! second requests arrive while the first is still being computed), 32 clients.

use std::path::Path;
use std::process::Command;

fn demo(strategy: &str, queues: bool, json: &Path) -> serde_json::Value {
    let dir = json.parent().unwrap_or(Path::new("."));
    let plot = dir.join(format!("{strategy}.svg"));
    let out = Command::new(env!("CARGO_BIN_EXE_prefix-router"))
        .args(["demo", "--strategies", strategy, "--replicas", "3"])
        .arg("--kv-events")
        .args(queues.then_some("--engine-queues"))
        .args(["--requests", "1800", "--json"])
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
    // Timing-sensitive on two shared cores (a busy moment delays the engines' events): one
    // more try before calling a miss.
    let mut report = String::new();
    for attempt in 0..2 {
        let kv = demo("kv-aware", true, &dir.join("kv.json"));
        let alone = demo("kv-aware", false, &dir.join("kv-alone.json"));
        let ca = demo("cache-aware", true, &dir.join("ca.json"));
        let (kv_home, kv_max) = affinity(&kv);
        let (alone_home, alone_max) = affinity(&alone);
        let (ca_home, _) = affinity(&ca);
        report = format!(
            "try {attempt}: kv-aware {kv_home:.3} on home, busiest {kv_max:.2}x (queues not \
             scraped: {alone_home:.3}, {alone_max:.2}x); cache-aware {ca_home:.3}"
        );
        eprintln!("{report}");
        for run in [&kv, &alone] {
            let runs = &run["runs"][0];
            assert_eq!(runs["replicas"], 3, "{runs}");
            assert!(
                runs["kv_events"]["batches"].as_f64().unwrap_or(0.0) > 0.0,
                "{runs}"
            );
            assert_eq!(runs["kv_events"]["lost"].as_f64(), Some(0.0), "{runs}");
        }
        assert_eq!(kv["runs"][0]["engine_queues"], true);
        assert_eq!(alone["runs"][0]["engine_queues"], false);
        if kv_home >= 0.95
            && alone_home >= 0.95
            && kv_max <= 1.25
            && alone_max <= 1.25
            && kv_home > ca_home + 0.05
        {
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    }
    panic!("{report}");
}
