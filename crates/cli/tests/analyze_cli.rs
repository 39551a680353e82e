//! `analyze` as a user runs it: a trace written by `simulate --write-trace`, today's setting
//! from a config file, the table, JSON and SVG; and the one-line errors of bad inputs.

use std::process::Command;

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prefix-router"))
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = bin()
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run prefix-router: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn analyze_reads_todays_config_and_writes_json_and_svg() {
    let dir = std::env::temp_dir().join(format!("pr-analyze-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let p = |name: &str| dir.join(name).display().to_string();
    let (ok, _, err) = run(&[
        "simulate",
        "--workload",
        "rag",
        "--requests",
        "150",
        "--rate",
        "5",
        "--write-trace",
        &p("rag.jsonl"),
    ]);
    assert!(ok && err.contains("wrote 150 requests"), "{err}");
    std::fs::write(
        p("router.toml"),
        "[routing]\nstrategy = \"prefix-aware\"\nprefix_length = 2048\nconcurrency_threshold = 16\n\n\
         [[instances]]\nurl = \"http://127.0.0.1:9001\"\n\n[[instances]]\nurl = \"http://127.0.0.1:9002\"\n\n\
         [[instances]]\nurl = \"http://127.0.0.1:9003\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (ok, out, err) = run(&[
        "analyze",
        &p("rag.jsonl"),
        "--current",
        &p("router.toml"),
        "--preset",
        "small",
        "--rates",
        "1,2",
        "--json",
        &p("a.json"),
        "--plot",
        &p("a.svg"),
    ]);
    assert!(ok, "{err}{out}");
    assert!(
        out.contains("Trace: ") && out.contains("(jsonl), 150 requests"),
        "{out}"
    );
    assert!(
        out.contains("on 3 x small"),
        "the config lists 3 instances: {out}"
    );
    assert!(
        out.contains("prefix-aware len=2048 t=16"),
        "today's setting is in the sweep: {out}"
    );
    assert!(out.contains("How far to trust this"), "{out}");
    let a: Value = std::fs::read_to_string(p("a.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let current = a["current"].as_u64().unwrap_or(u64::MAX) as usize;
    assert_eq!(a["settings"][current]["prefix_length"], 2048);
    assert_eq!(a["settings"][current]["concurrency_threshold"], 16);
    assert_eq!(
        a["current_source"].as_str(),
        Some(p("router.toml").as_str())
    );
    assert_eq!(a["rate_factors"], serde_json::json!([1.0, 2.0]));
    let svg = std::fs::read_to_string(p("a.svg")).unwrap_or_default();
    assert!(
        svg.starts_with("<svg") && svg.contains("The sweep"),
        "an SVG"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_get_one_line_errors() {
    let (ok, _, err) = run(&["analyze", "/nonexistent/trace.jsonl"]);
    assert!(!ok && err.contains("/nonexistent/trace.jsonl"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let (ok, _, err) = run(&["analyze", "/nonexistent/t.jsonl", "--rates", "1,x"]);
    assert!(!ok && err.contains("--rates"), "{err}");
}
