//! `demo` (real HTTP: load generator -> router -> mock engines) against `simulate` (the
//! discrete-event model) on the same workload and settings: per strategy, hit rates within 5
//! points (8 for random, whose unseeded draws in the demo spread it) and TTFT P50 within 20%.
//!
//! The workload keeps the long-context regime at a tenth of its size: 270 requests over 30
//! shared 8,000-token documents (9 per document, as the default), 32 closed-loop clients, on 7
//! instances of the `small` preset, whose 65,536-token cache holds the same share of the
//! document pool (30 x 8,000 / 65,536 = 3.7 caches' worth) as the 70B preset's holds of the
//! default 600 documents. Engines in real time (1 wall second per engine second): about 50 s of
//! wall time, mostly waiting. Real time, because the demo removes the HTTP path's cost with its
//! per-strategy mean, and at faster scales the error of that correction on a busy machine (a
//! skewed path cost) reached the 20% bound against this preset's ~19 ms cached TTFT.

use std::path::Path;
use std::process::Command;

const SETTINGS: &[&str] = &[
    "--instances",
    "7",
    "--preset",
    "small",
    "--strategies",
    "random,prefix-aware",
    "--workload",
    "long-context",
    "--requests",
    "270",
    "--param",
    "documents=30",
    "--seed",
    "3",
];

fn run(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_prefix-router"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run prefix-router: {e}"));
    assert!(
        out.status.success(),
        "prefix-router {args:?} failed:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = args
        .iter()
        .position(|a| *a == "--json")
        .and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("no --json in {args:?}"));
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn figures(report: &serde_json::Value, strategy: &str) -> (f64, f64) {
    let r = report["results"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["strategy"] == strategy))
        .unwrap_or_else(|| panic!("no {strategy} in {report}"));
    let hit = r["kv_hit_rate"].as_f64().unwrap_or(f64::NAN);
    let p50 = r["ttft_ms"]["p50"].as_f64().unwrap_or(f64::NAN);
    (hit, p50)
}

// In a debug build the HTTP path costs several wall milliseconds with a long tail; the demo
// counts its *mean* at real speed, which over-corrects the P50 of a workload whose cached TTFT
// is ~19 ms (measured: -26%). Release builds (`cargo test --release`) run it: +2% / +2%.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "needs a release build: run `cargo test --release -p prefix-router --test demo_agreement`"
)]
fn demo_agrees_with_simulate() {
    let dir = tempfile_dir();
    let demo_json = dir.join("demo.json");
    let sim_json = dir.join("sim.json");
    let plot = dir.join("demo.svg");
    let demo_json_s = demo_json.to_string_lossy().into_owned();
    let sim_json_s = sim_json.to_string_lossy().into_owned();
    let plot_s = plot.to_string_lossy().into_owned();

    let mut demo_args = vec![
        "demo",
        "--time-scale",
        "1",
        "--json",
        &demo_json_s,
        "--plot",
        &plot_s,
    ];
    demo_args.extend_from_slice(SETTINGS);
    let mut sim_args = vec!["simulate", "--json", &sim_json_s];
    sim_args.extend_from_slice(SETTINGS);
    let sim = run(&sim_args);
    assert_eq!(sim["workload"]["requests"], 270);

    // Real engines on the wall clock, on two cores shared with everything else: a busy moment
    // can push one run past the bounds (seen once in CI: prefix-aware hit 0.829 against 0.879,
    // P50 +20.6%, while the runs around it read gaps under 0.01 and +5-10%). One more demo run
    // before calling it a disagreement; both attempts are printed.
    let mut report = String::new();
    let mut attempt = 0;
    let (demo, ok) = loop {
        attempt += 1;
        let demo = run(&demo_args);
        assert!(plot.exists(), "the demo writes its SVG");
        assert_eq!(demo["workload"]["requests"], 270);
        report.push_str(&format!("attempt {attempt}:\n"));
        let mut ok = true;
        for strategy in ["random", "prefix-aware"] {
            let (hit_d, p50_d) = figures(&demo, strategy);
            let (hit_s, p50_s) = figures(&sim, strategy);
            let hit_gap = (hit_d - hit_s).abs();
            let p50_ratio = p50_d / p50_s - 1.0;
            report.push_str(&format!(
                "{strategy}: hit demo {hit_d:.3} sim {hit_s:.3} (gap {hit_gap:.3}); TTFT P50 demo {p50_d:.1} ms sim {p50_s:.1} ms ({:+.1}%)\n",
                p50_ratio * 100.0
            ));
            // Random's hit rate depends on its draws, and the demo's router is unseeded (a
            // real server): six demo runs of this setting read 21.1-28.4% (2026-12-02)
            // against the simulator's seeded 21.9%, so its bound is wider than a
            // deterministic strategy's.
            let hit_bound = if strategy == "random" { 0.08 } else { 0.05 };
            ok &= hit_gap <= hit_bound && p50_ratio.abs() <= 0.20;
        }
        if ok || attempt == 2 {
            break (demo, ok);
        }
    };
    eprint!("{report}");
    assert!(ok, "demo and simulate disagree:\n{report}");
    // The story itself: prefix-aware far ahead of random on hit rate and P50 TTFT.
    let (hit_r, p50_r) = figures(&demo, "random");
    let (hit_p, p50_p) = figures(&demo, "prefix-aware");
    assert!(hit_p > hit_r + 0.2, "{report}");
    assert!(p50_p < p50_r * 0.5, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("demo-agreement-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}
