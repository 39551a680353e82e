//! `deploy/grafana/prefix-router.json` queries only what `/metrics` exposes: every
//! `prefix_router_*` name in every panel's query is a series a running router (the default
//! strategy, engine metrics on) declares, with the suffix its type gives it (`_total` for
//! counters, `_bucket`/`_sum`/`_count` for histograms). A renamed metric fails here, not on an
//! operator's empty panel.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use support::*;

/// Every sample name the exposition can hold, from its `# TYPE` lines.
fn exposed(page: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in page.lines() {
        let mut words = line.split_whitespace();
        if (words.next(), words.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
            }
            _ => {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The `prefix_router_*` names a PromQL expression reads.
fn names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("prefix_router_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_exists() {
    let up = Upstream::start("a", Mode::Echo, &[]).await;
    let mut s = settings(&[up.url()]);
    s.engine_metrics.scrape = true;
    let r = router(s).await;
    let ans = complete(r.local_addr(), "hello").await;
    assert_eq!(ans.status, http::StatusCode::OK);
    let page = metrics_text(r.local_addr()).await;
    let have = exposed(&page);
    assert!(have.contains("prefix_router_requests_total"), "{page}");

    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/prefix-router.json");
    let text = std::fs::read_to_string(&file).expect("the dashboard");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut queried = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(p["id"].as_i64().expect("panel id")),
            "{title}: duplicate id"
        );
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            let names = names_in(expr);
            assert!(
                !names.is_empty(),
                "{title}: {expr} reads no prefix_router metric"
            );
            for n in names {
                assert!(
                    have.contains(&n),
                    "{title}: {n} is not in /metrics ({expr})"
                );
                queried.insert(n);
            }
        }
    }
    // The overflow panel counts what the router, bench and simulate count as overflow.
    let overflow = format!(
        "reason=~\\\"{}\\\"",
        prefix_router_core::Reason::OVERFLOW_LABELS.join("|")
    );
    assert!(
        text.contains(&overflow),
        "no query reads the overflow decisions as {overflow}"
    );
    // What the issue asks to see: hit rate, TTFT quantiles, shares, overflow, retries,
    // ejections, decision latency.
    for must in [
        "prefix_router_engine_prefix_cache_hit_ratio",
        "prefix_router_ttft_seconds_bucket",
        "prefix_router_requests_total",
        "prefix_router_decisions_total",
        "prefix_router_retries_total",
        "prefix_router_instance_healthy",
        "prefix_router_routing_decision_seconds_bucket",
    ] {
        assert!(queried.contains(must), "the dashboard does not show {must}");
    }
    r.shutdown().await;
}
