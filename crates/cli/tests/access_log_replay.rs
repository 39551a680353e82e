//! The access log end to end, as a user runs it: `serve --access-log` in front of two
//! `mock-engine` processes, `bench` through it, then the log read back: one line per request
//! bench sent, the same prompt, cached and output tokens (so the same hit rate), and
//! `simulate --trace` replays the file, and `analyze` reports the same figures from it.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::*;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prefix-router"))
}

#[test]
fn the_log_agrees_with_bench_and_simulate_replays_it() {
    let dir = std::env::temp_dir().join(format!("pr-access-replay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let log = dir.join("access.jsonl");
    let engines: Vec<Engine> = (0..2).map(|_| Engine::start(free_port())).collect();
    let port = free_port();
    let mut serve = bin()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(
            engines
                .iter()
                .flat_map(|e| ["--instance".to_string(), e.url()]),
        )
        .arg("--access-log")
        .arg(&log)
        // Its log to a file, where colours would be escape codes in the text.
        .stdout(Stdio::from(
            std::fs::File::create(dir.join("serve.log")).unwrap_or_else(|e| panic!("{e}")),
        ))
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start serve: {e}"));
    wait_until("serve to be ready", Duration::from_secs(10), || {
        http(port, "GET", "/ready", "")
            .1
            .contains("\"healthy_instances\":2")
    });
    let report = dir.join("bench.json");
    let bench = bin()
        .args(["bench", "--target", &format!("http://127.0.0.1:{port}")])
        .args([
            "--workload",
            "rag",
            "--requests",
            "60",
            "--concurrency",
            "4",
            "--json",
        ])
        .arg(&report)
        .output()
        .unwrap_or_else(|e| panic!("cannot run bench: {e}"));
    assert!(
        bench.status.success(),
        "bench: {}",
        String::from_utf8_lossy(&bench.stderr)
    );
    // SIGTERM: serve drains in-flight requests and the log's queue, then exits.
    assert!(signal_pid(serve.id(), "TERM"));
    let status = serve.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "serve exited with {status}");
    let serve_log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    assert!(serve_log.contains("INFO"), "serve logged: {serve_log}");
    assert!(
        !serve_log.contains('\x1b'),
        "colour codes in a log written to a file: {serve_log}"
    );

    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let json: Value = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let result = &json["results"][0];
    assert_eq!(
        Some(lines.len() as u64),
        result["requests"].as_u64(),
        "one line per request"
    );
    let sum = |k: &str| lines.iter().filter_map(|l| l[k].as_u64()).sum::<u64>();
    for k in ["prompt_tokens", "cached_tokens", "output_tokens"] {
        assert_eq!(
            Some(sum(k)),
            result[k].as_u64(),
            "{k}: the log and bench agree"
        );
    }
    let log_hit = sum("cached_tokens") as f64 / sum("prompt_tokens").max(1) as f64;
    let bench_hit = result["kv_hit_rate"].as_f64().unwrap_or(-1.0);
    assert!(
        (log_hit - bench_hit).abs() <= 0.02,
        "hit rate: log {log_hit}, bench {bench_hit}"
    );
    assert!(lines
        .iter()
        .all(|l| l["status"] == 200 && l["outcome"] == "ok"));
    assert!(lines
        .iter()
        .any(|l| l["chain"].as_array().is_some_and(|c| c.len() > 4)));

    let sim = bin()
        .args(["simulate", "--trace"])
        .arg(&log)
        .args(["--instances", "2", "--strategies", "cache-aware,random"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run simulate: {e}"));
    let out = String::from_utf8_lossy(&sim.stdout);
    assert!(
        sim.status.success(),
        "simulate: {}{out}",
        String::from_utf8_lossy(&sim.stderr)
    );
    assert!(out.contains("access-log") && out.contains("60"), "{out}");

    // analyze reads the log: what it says was served agrees with bench (same requests, hit
    // rate within 2 points), and its sweep runs on it.
    let analysis = dir.join("analysis.json");
    let an = bin()
        .arg("analyze")
        .arg(&log)
        .args(["--instances", "2", "--rates", "1", "--json"])
        .arg(&analysis)
        .output()
        .unwrap_or_else(|e| panic!("cannot run analyze: {e}"));
    let text = String::from_utf8_lossy(&an.stdout);
    assert!(
        an.status.success(),
        "analyze: {}{text}",
        String::from_utf8_lossy(&an.stderr)
    );
    assert!(
        text.contains("As served (the access log): 60 requests, 60 ok")
            && text.contains("Recommendation: "),
        "{text}"
    );
    let a: Value = std::fs::read_to_string(&analysis)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    assert_eq!(
        a["observed"]["requests"].as_u64(),
        result["requests"].as_u64()
    );
    assert_eq!(a["traffic"]["requests"].as_u64(), Some(60));
    let served_hit = a["observed"]["hit_rate"].as_f64().unwrap_or(-1.0);
    assert!(
        (served_hit - bench_hit).abs() <= 0.02,
        "hit rate: analyze {served_hit}, bench {bench_hit}"
    );
    drop(engines);
    let _ = std::fs::remove_dir_all(&dir);
}
