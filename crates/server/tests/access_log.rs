//! The access log over real sockets: one line per request with hashes and lengths (never the
//! prompt or the group id), usage and times filled in, one line for a retried request, and a
//! reopen (SIGHUP's path) that lets logrotate move the file.

mod support;

use std::path::{Path, PathBuf};

use http::StatusCode;
use prefix_router_server::reload;
use serde_json::Value;
use support::*;

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pr-access-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    d
}

const SECRET_PROMPT: &str = "the quarterly figures of tenant zeta, in confidence";

#[tokio::test]
async fn one_line_per_request_with_hashes_not_text_and_reopened_for_logrotate() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let d = dir("main");
    let path = d.join("access.jsonl");
    let mut s = settings(&[a.url()]);
    s.access_log.path = Some(path.clone());
    let r = router(s).await;
    let long = format!("{SECRET_PROMPT} {}", "policy text ".repeat(100));
    let chat = serde_json::json!({
        "model": "m1",
        "prompt_cache_key": "tenant-zeta",
        "messages": [{"role": "user", "content": long}],
    })
    .to_string();
    let ans = post(
        r.local_addr(),
        "/v1/chat/completions",
        &[("x-test-usage", "300,256")],
        chat,
    )
    .await;
    assert_eq!(ans.status, StatusCode::OK);
    let ans = complete(r.local_addr(), "short").await;
    assert_eq!(ans.status, StatusCode::OK);
    // logrotate: move the file, then SIGHUP (reload; this router has no file to reload, so
    // the reload itself fails, and the log is reopened all the same).
    eventually("two lines written", || lines(&path).len() == 2).await;
    let rotated = d.join("access.jsonl.1");
    std::fs::rename(&path, &rotated).expect("rotate");
    assert!(reload::reload(r.state()).await.is_err());
    let ans = complete(r.local_addr(), "after the rotation").await;
    assert_eq!(ans.status, StatusCode::OK);
    r.shutdown().await;

    let old = lines(&rotated);
    let new = lines(&path);
    assert_eq!((old.len(), new.len()), (2, 1), "old {old:?} new {new:?}");
    let text = std::fs::read_to_string(&rotated).unwrap_or_default();
    assert!(
        !text.contains("quarterly") && !text.contains("tenant-zeta"),
        "{text}"
    );

    let first = &old[0];
    assert_eq!(first["api"], "chat");
    assert_eq!(first["model"], "m1");
    assert_eq!(first["instance"], a.url());
    assert_eq!(first["status"], 200);
    assert_eq!(first["outcome"], "ok");
    assert_eq!(first["attempt"], 0);
    assert_eq!(
        (
            &first["prompt_tokens"],
            &first["cached_tokens"],
            &first["output_tokens"]
        ),
        (&Value::from(300), &Value::from(256), &Value::from(1))
    );
    let group = first["group"].as_str().expect("a group hash");
    assert_eq!(group.len(), 16, "{group}");
    let units = first["prompt_units"].as_u64().expect("units");
    let block = first["block_units"].as_u64().expect("block");
    let chain = first["chain"].as_array().expect("chain");
    assert!(units > long.len() as u64 / 2 && block > 0);
    assert_eq!(chain.len() as u64, units / block, "every full block");
    assert!(first["ttft_s"].as_f64().is_some_and(|t| t >= 0.0));
    assert!(first["duration_s"]
        .as_f64()
        .is_some_and(|t| t >= first["ttft_s"].as_f64().unwrap_or(0.0)));
    let now = prefix_router_server::access_log::unix_now();
    assert!(first["t"]
        .as_f64()
        .is_some_and(|t| t <= now && t > now - 60.0));
    let second = &old[1];
    assert_eq!(
        (&second["api"], &second["group"]),
        (&Value::from("completions"), &Value::Null)
    );
    assert_eq!(
        second["chain"].as_array().map(Vec::len),
        Some(0),
        "shorter than a block"
    );
}

#[tokio::test]
async fn a_retried_request_is_one_line_from_the_attempt_that_answered() {
    let bad = Upstream::start("bad", Mode::Status(503), &[]).await;
    let good = Upstream::start("good", Mode::Echo, &[]).await;
    let d = dir("retry");
    let path = d.join("access.jsonl");
    let mut s = settings(&[bad.url(), good.url()]);
    s.access_log.path = Some(path.clone());
    // Round-robin: some requests go to the failing instance first whatever the machine's load
    // (cache-aware's placement of these prompts once sent all six to the good one first).
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named("round-robin").expect("registered"),
    );
    let r = router(s).await;
    for i in 0..6 {
        let ans = complete(r.local_addr(), &format!("retry me {i}")).await;
        assert_eq!(
            (ans.status, ans.upstream()),
            (StatusCode::OK, "good".to_string())
        );
    }
    r.shutdown().await;
    let got = lines(&path);
    assert_eq!(got.len(), 6, "{got:?}");
    assert!(got
        .iter()
        .all(|l| l["instance"] == good.url() && l["status"] == 200));
    assert!(
        got.iter().any(|l| l["attempt"] == 1),
        "some went to the failing one first"
    );
}

/// A request retried and then refused (the only other instance is at its in-flight cap) still
/// writes its line, from the attempt that failed; it wrote none.
#[tokio::test]
async fn a_retried_request_that_finds_no_instance_still_writes_its_line() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let d = dir("retry-refused");
    let path = d.join("access.jsonl");
    let mut s = settings(&[a.url(), b.url()]);
    s.access_log.path = Some(path.clone());
    s.limits.max_in_flight_per_instance = Some(1);
    let r = router(s).await;
    let addr = r.local_addr();
    // One request held fills an instance; the other then answers 503 (retryable).
    let held = post_held(addr, r#"{"prompt":"held"}"#);
    tokio::time::timeout(WAIT, async {
        while a.held() + b.held() < 1 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("held");
    let (full, other) = if a.held() == 1 { (&a, &b) } else { (&b, &a) };
    other.set_mode(Mode::Status(503));
    let refused = complete(addr, "retried, then refused").await;
    assert_ne!(refused.status, StatusCode::OK);
    full.release(1);
    assert_eq!(held.await.expect("held").status, StatusCode::OK);
    r.shutdown().await;
    let got = lines(&path);
    assert_eq!(got.len(), 2, "{got:?}");
    let line = got
        .iter()
        .find(|l| l["instance"] == other.url())
        .unwrap_or_else(|| panic!("no line for the refused request: {got:?}"));
    // The status is what that instance answered (it was retried, so nobody saw it).
    assert_eq!(
        (
            line["outcome"].as_str(),
            line["attempt"].as_u64(),
            line["status"].as_u64()
        ),
        (Some("retried"), Some(0), Some(503)),
        "{line}"
    );
}

#[tokio::test]
async fn a_path_that_cannot_be_opened_stops_start_up_naming_the_field() {
    let mut s = settings(&[]);
    s.access_log.path = Some(PathBuf::from("/nonexistent-dir-for-sure/access.jsonl"));
    let e = prefix_router_server::Router::start(s, None)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string());
    assert!(
        matches!(&e, Err(m) if m.contains("access_log.path")),
        "{e:?}"
    );
}
