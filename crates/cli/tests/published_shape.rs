//! The headline claim of the README, checked on the built binary: on the default long-context
//! workload (the published experiment's shape) prefix-aware routing beats random routing the way
//! the published figures say. Nothing here is tuned per test: the run is exactly what
//! `prefix-router simulate` does with no flags, restricted to the two strategies compared.

use std::process::Command;

fn run_default(seed: u64) -> serde_json::Value {
    let dir =
        std::env::temp_dir().join(format!("prefix-router-shape-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_prefix-router"))
        .args([
            "simulate",
            "--strategies",
            "random,prefix-aware",
            "--seed",
            &seed.to_string(),
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run prefix-router");
    assert!(
        out.status.success(),
        "simulate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&json).expect("report written");
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::from_str(&text).expect("report is JSON")
}

fn f(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path:?} is not a number in {v}"))
}

#[test]
fn default_long_context_reproduces_the_published_shape() {
    let report = run_default(1);
    let results = report["results"].as_array().expect("results");
    let by = |name: &str| {
        results
            .iter()
            .find(|r| r["strategy"] == name)
            .unwrap_or_else(|| panic!("no {name} result"))
    };
    let (random, aware) = (by("random"), by("prefix-aware"));

    // Hit rates: random about 25%, prefix-aware at least 80%.
    let random_hit = f(random, &["kv_hit_rate"]);
    let aware_hit = f(aware, &["kv_hit_rate"]);
    assert!(
        (0.18..=0.32).contains(&random_hit),
        "random hit rate {random_hit}"
    );
    assert!(aware_hit >= 0.80, "prefix-aware hit rate {aware_hit}");
    assert!(
        aware_hit <= f(&report, &["oracle_hit_rate"]) + 1e-9,
        "no router beats the oracle"
    );

    // P50 TTFT at least 70% lower; P90 lower; throughput higher.
    let p50 = f(aware, &["ttft_ms", "p50"]) / f(random, &["ttft_ms", "p50"]);
    assert!(p50 <= 0.30, "P50 TTFT ratio {p50}");
    assert!(f(aware, &["ttft_ms", "p90"]) < f(random, &["ttft_ms", "p90"]));
    assert!(f(aware, &["throughput_rps"]) > f(random, &["throughput_rps"]));

    // Every instance's share between 12% and 17%.
    for share in aware["instance_share"].as_array().expect("shares") {
        let s = share.as_f64().expect("share");
        assert!(
            (0.12..=0.17).contains(&s),
            "prefix-aware instance share {s}"
        );
    }
}
