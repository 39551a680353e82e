//! Runs the built `prefix-router` binary on small simulations.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prefix-router"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary starts")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prefix-router-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const SMALL: &[&str] = &[
    "simulate",
    "--preset",
    "small",
    "--requests",
    "300",
    "--instances",
    "4",
];

fn small_run(extra: &[&str], json: &Path) -> Output {
    let json_s = json.to_str().expect("utf-8 temp path");
    let mut args: Vec<&str> = SMALL.to_vec();
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--json", json_s]);
    run(&args)
}

/// The run exited 0 (else its stderr is the failure message).
fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("json written");
    serde_json::from_str(&text).expect("valid json")
}

#[test]
fn json_has_the_contract_fields() {
    let json = tmp("fields.json");
    let out = small_run(&["--workload", "long-context"], &json);
    assert_ok(&out);
    let v = read_json(&json);
    assert!(v["workload"].is_object());
    assert!(v["fleet"].is_object());
    assert!(v["oracle_hit_rate"].is_f64());
    let results = v["results"].as_array().expect("results array");
    let names: Vec<&str> = results
        .iter()
        .filter_map(|r| r["strategy"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "random",
            "round-robin",
            "least-outstanding",
            "prefix-aware",
            "cache-aware"
        ]
    );
    for r in results {
        assert_eq!(r["requests"].as_u64(), Some(300));
        for lat in ["ttft_ms", "e2e_ms"] {
            for k in ["p50", "p90", "p99", "mean"] {
                assert!(r[lat][k].is_f64(), "{lat}.{k} missing in {r}");
            }
        }
        for k in [
            "kv_hit_rate",
            "throughput_rps",
            "output_tokens_per_s",
            "overflow_rate",
        ] {
            assert!(r[k].is_f64(), "{k} missing");
        }
        for k in ["kv_hit_rate", "overflow_rate"] {
            let x = r[k].as_f64().unwrap_or(-1.0);
            assert!((0.0..=1.0).contains(&x), "{k} = {x}");
        }
        let shares = r["instance_share"]
            .as_array()
            .expect("instance_share array");
        assert_eq!(shares.len(), 4);
        let sum: f64 = shares.iter().filter_map(|s| s.as_f64()).sum();
        assert!((sum - 1.0).abs() < 1e-9);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("prefix-aware vs random"), "{stdout}");
    assert!(stdout.contains("Oracle hit rate"), "{stdout}");
}

#[test]
fn same_seed_same_bytes() {
    let (a, b) = (tmp("det-a.json"), tmp("det-b.json"));
    let args = ["--workload", "sharegpt", "--seed", "9"];
    assert!(small_run(&args, &a).status.success());
    assert!(small_run(&args, &b).status.success());
    let (ta, tb) = (std::fs::read(&a).expect("a"), std::fs::read(&b).expect("b"));
    assert_eq!(ta, tb);
}

#[test]
fn bad_prefix_length_is_one_line_naming_the_flag() {
    let out = run(&["simulate", "--prefix-length", "5"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--prefix-length"), "{err}");
    assert!(
        err.contains("prefix_length must be within 1024..=65536, got 5"),
        "{err}"
    );
}

#[test]
fn bad_values_name_their_flag() {
    for (args, needle) in [
        (
            vec!["simulate", "--strategies", "random,fastest"],
            "--strategies",
        ),
        (
            vec!["simulate", "--concurrency-threshold", "0"],
            "--concurrency-threshold",
        ),
        (vec!["simulate", "--scale", "+1@soon"], "--scale"),
        (
            vec!["simulate", "--param", "docs=4", "--requests", "10"],
            "--param docs=4: unknown parameter 'docs'",
        ),
        (
            vec!["simulate", "--param", "documents=lots", "--requests", "10"],
            "parameter 'documents'",
        ),
        (vec!["simulate", "--instances", "0"], "--instances"),
        (
            vec!["simulate", "--preset", "no-such-gpu", "--requests", "10"],
            "no-such-gpu",
        ),
        (
            vec![
                "simulate",
                "--workload",
                "no-such-workload",
                "--requests",
                "10",
            ],
            "--workload",
        ),
        (
            vec![
                "simulate",
                "--trace",
                "/no/such/file.jsonl",
                "--preset",
                "small",
            ],
            "--trace",
        ),
    ] {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn mooncake_trace_runs() {
    let trace = repo_root().join("data/traces/mooncake_synthetic_trace.jsonl");
    let json = tmp("mooncake.json");
    let out = run(&[
        "simulate",
        "--trace",
        trace.to_str().expect("utf-8 path"),
        "--preset",
        "small",
        "--requests",
        "200",
        "--strategies",
        "random,prefix-aware",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]);
    assert_ok(&out);
    let v = read_json(&json);
    assert_eq!(v["results"][0]["requests"].as_u64(), Some(200));
    assert!(v["oracle_hit_rate"].as_f64().unwrap_or(0.0) > 0.0);
}

#[test]
fn plot_is_an_svg_and_scale_events_show() {
    let plot = tmp("plot.svg");
    let json = tmp("plot.json");
    let out = small_run(
        &[
            "--workload",
            "long-context",
            "--scale",
            "+1@20s",
            "--plot",
            plot.to_str().expect("utf-8"),
        ],
        &json,
    );
    assert_ok(&out);
    let svg = std::fs::read_to_string(&plot).expect("svg written");
    assert!(
        svg.starts_with("<svg") || svg.contains("<svg"),
        "not an svg"
    );
    assert!(svg.contains("Time to first token"));
    let v = read_json(&json);
    assert_eq!(
        v["results"][0]["instance_share"].as_array().map(Vec::len),
        Some(5)
    );
}

#[test]
fn presets_lists_presets_and_workloads() {
    let out = run(&["presets"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["llama-3.1-70b-h100x8", "small", "long-context", "sharegpt"] {
        assert!(text.contains(needle), "{needle} missing from: {text}");
    }
}

#[test]
fn param_overrides_reach_the_workload_and_the_report() {
    let json = tmp("param.json");
    let out = small_run(&["--param", "documents=7", "--groups", "2"], &json);
    assert_ok(&out);
    let v = read_json(&json);
    let spec = &v["workload"];
    let text = spec.to_string();
    assert!(text.contains("\"documents\":7"), "{text}");
    assert!(text.contains("\"groups\":2"), "{text}");
}

#[test]
fn load_sweep_measures_capacity_and_runs_each_load() {
    let json = tmp("sweep.json");
    let svg = tmp("sweep.svg");
    let out = small_run(
        &[
            "--strategies",
            "least-outstanding,cache-aware",
            "--load",
            "0.5,0.9",
            "--plot",
            svg.to_str().expect("utf-8 temp path"),
        ],
        &json,
    );
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Capacity:"), "{text}");
    let v = read_json(&json);
    let cap = v["capacity_rps"].as_f64().expect("capacity");
    assert!(cap > 0.0);
    let points = v["points"].as_array().expect("points");
    assert_eq!(points.len(), 2);
    for (p, load) in points.iter().zip([0.5, 0.9]) {
        assert_eq!(p["load"].as_f64(), Some(load));
        let rate = p["rate_rps"].as_f64().expect("rate");
        assert!((rate - load * cap).abs() < 1e-6 * cap);
        assert_eq!(p["report"]["results"].as_array().map(Vec::len), Some(2));
    }
    let svg = std::fs::read_to_string(&svg).expect("svg written");
    assert!(svg.contains("<svg") && svg.contains("TTFT P90 against load"));
    assert!(
        svg.contains("floor (any router)"),
        "the floor is drawn beside the strategies"
    );
    let bad = run(&["simulate", "--trace", "x.jsonl", "--load", "0.5"]);
    assert!(!bad.status.success());
}

#[test]
fn clairvoyant_adds_a_reference_row_and_reads_each_strategy_against_it() {
    let json = tmp("clairvoyant.json");
    let svg = tmp("clairvoyant.svg");
    let out = small_run(
        &[
            "--strategies",
            "random,cache-aware",
            "--clairvoyant",
            "--plot",
            svg.to_str().expect("utf-8 temp path"),
        ],
        &json,
    );
    assert_ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("clairvoyant: not a router"), "{text}");
    for name in ["random", "cache-aware"] {
        assert!(
            text.contains(&format!("{name} placement: ")),
            "no placement line for {name}: {text}"
        );
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("2 strategies and the clairvoyant reference"),
        "{err}"
    );
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results");
    let names: Vec<&str> = results
        .iter()
        .filter_map(|r| r["strategy"].as_str())
        .collect();
    assert_eq!(names, ["random", "cache-aware", "clairvoyant"]);
    for r in &results[..2] {
        let p = &r["placement"];
        let share = p["at_soonest"].as_f64().expect("placement.at_soonest");
        assert!((0.0..=1.0).contains(&share), "{p}");
        assert!(p["lost_ms"]["p90"].as_f64().expect("lost_ms") >= 0.0);
    }
    assert!(results[2].get("placement").is_none(), "{}", results[2]);
    // Without the flag: no reference row, no placement.
    let plain = small_run(&["--strategies", "random"], &json);
    assert_ok(&plain);
    let v = read_json(&json);
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 1);
    assert!(results[0].get("placement").is_none());
}

#[test]
fn a_reader_that_leaves_early_ends_the_output_quietly() {
    // `prefix-router presets | head -3`: the pipe's reader is gone before the binary writes
    // (it is closed here right after the start), so every write meets a closed pipe. That
    // printed a panic and a backtrace; now the command ends as it would have, its files
    // written.
    let json = tmp("closed-stdout.json");
    let json_s = json.to_str().expect("utf-8 temp path");
    let mut small: Vec<&str> = SMALL.to_vec();
    small.extend_from_slice(&["--json", json_s]);
    for args in [&["presets"][..], &small[..]] {
        let mut child = bin()
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the binary starts");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("it ends");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(out.status.success(), "{args:?}: {err}");
    }
    assert!(
        read_json(&json)["results"].is_array(),
        "the JSON is still written"
    );
}

/// A flag error keeps what clap says beyond its first line where it says more: which argument
/// is missing, the values possible, a did-you-mean tip. Only the first line was printed, so
/// `bench` alone read "the following required arguments were not provided:" and nothing else.
#[test]
fn flag_errors_say_what_is_missing_and_what_to_type() {
    for (args, needles) in [
        (vec!["bench"], vec!["--target"]),
        (
            vec!["simulate", "--overflow", "foo"],
            vec!["--overflow", "possible values", "least-outstanding"],
        ),
        (vec!["simulate", "--requets", "5"], vec!["--requests"]),
        (
            vec![
                "mock-engine",
                "--listen",
                "127.0.0.1:0",
                "--time-scale",
                "0",
            ],
            vec!["--time-scale"],
        ),
        (vec!["simulate", "--load", "0"], vec!["--load", "fraction"]),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
        }
        assert!(!err.contains("Usage:"), "{args:?}: {err}");
    }
}

/// An output file in a folder that does not exist fails before the run, not after it.
#[test]
fn an_output_folder_that_does_not_exist_fails_first() {
    for args in [
        vec!["simulate", "--json", "/nonexistent-dir/x.json"],
        vec!["simulate", "--plot", "/nonexistent-dir/x.svg"],
        vec!["demo", "--json", "/nonexistent-dir/x.json"],
        vec![
            "bench",
            "--target",
            "http://127.0.0.1:9",
            "--json",
            "/nonexistent-dir/x.json",
        ],
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            err.contains("the folder /nonexistent-dir does not exist"),
            "{args:?}: {err}"
        );
        // Nothing ran: no table, no progress.
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// `--scale` may start with a removal (`-2@5s`), as its help's example list does after a
/// comma: clap took the leading `-2` for a flag.
#[test]
fn a_scale_list_may_start_with_a_removal() {
    let json = tmp("scale-down.json");
    let out = small_run(&["--scale", "-2@5s"], &json);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A reader that leaves early (`... 2>&1 | head -1`) closes standard error: the notes written
/// there are dropped and the command finishes (`eprintln!` panicked with exit status 101).
#[test]
fn a_closed_standard_error_does_not_stop_a_command() {
    let trace = tmp("closed-stderr.jsonl");
    let mut child = bin()
        .args([
            "simulate",
            "--workload",
            "sharegpt",
            "--requests",
            "20",
            "--write-trace",
        ])
        .arg(&trace)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary starts");
    // Closed before the child writes its note (it has a 150 MB binary to load first).
    drop(child.stderr.take());
    let status = child.wait().expect("waits");
    assert!(status.success(), "{status}");
    let written = std::fs::read_to_string(&trace).expect("the trace is written");
    assert_eq!(written.lines().count(), 20);
    let _ = std::fs::remove_file(trace);
}
