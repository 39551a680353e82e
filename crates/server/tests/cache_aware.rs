//! `cache-aware` over real sockets: a shared prefix stays on the instance that has it, usage
//! reports come back to the strategy, its learned state shows in /metrics, survives routing
//! changes that leave it alone, and is forgotten when an instance leaves.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, StatusCode};
use prefix_router_server::settings::{ConfigSource, Overrides};
use prefix_router_server::{Router, RunningRouter};
use support::*;

const TOKEN: &str = "t0ken";

/// A chat body: a long system prompt shared by `doc`, then a question of its own.
fn ask(doc: usize, question: &str) -> String {
    let mut system = format!("Document {doc}. ");
    while system.len() < 6000 {
        system.push_str("The tenant shall keep the premises in good repair. ");
    }
    serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    })
    .to_string()
}

async fn start(ups: &[Upstream]) -> RunningRouter {
    let source = ConfigSource {
        path: None,
        overrides: Overrides {
            listen: Some("127.0.0.1:0".into()),
            admin_listen: Some("127.0.0.1:0".into()),
            admin_token: Some(TOKEN.into()),
            instances: ups.iter().map(Upstream::url).collect(),
            strategy: Some("cache-aware".into()),
            // No share bound: these tests send one or two documents only, which the bound
            // would spread over the instances (tested in core).
            strategy_params: vec!["block-chars=64".into(), "max-share=0".into()],
            ..Overrides::default()
        },
    };
    let mut settings = source.load().expect("valid settings");
    settings.health.active = false;
    Router::start(settings, Some(source))
        .await
        .expect("router starts")
}

async fn admin(r: &RunningRouter, method: Method, path: &str, body: &str) -> Answer {
    let addr = r.admin_addr().expect("admin listener");
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", auth.as_str()),
    ];
    send(addr, request(method, path, &headers, body.to_string())).await
}

async fn chat_at(addr: SocketAddr, body: &str, usage: &str) -> Answer {
    let a = post(
        addr,
        "/v1/chat/completions",
        &[("x-test-usage", usage)],
        body.to_string(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    a
}

async fn metrics(addr: SocketAddr) -> String {
    let m = send(addr, request(Method::GET, "/metrics", &[], "")).await;
    String::from_utf8_lossy(&m.body).to_string()
}

/// The value of cache-aware's series `name` in a scrape.
fn value(text: &str, name: &str) -> Option<f64> {
    prefix_router_server::prom::value(text, name, &[("strategy", "cache-aware")])
}

/// Polls /metrics until `series` satisfies `ok` (feedback lands when the relay ends, which can
/// be just after the client read the last byte).
async fn metric_until(addr: SocketAddr, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let found = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(v) = value(&metrics(addr).await, series).filter(|v| ok(*v)) {
                return v;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    match found {
        Ok(v) => v,
        Err(_) => panic!("{series} never as expected in\n{}", metrics(addr).await),
    }
}

#[tokio::test]
async fn a_shared_prefix_stays_where_it_is_cached_and_the_index_shows() {
    let ups = vec![
        Upstream::start("a", Mode::Echo, &[]).await,
        Upstream::start("b", Mode::Echo, &[]).await,
        Upstream::start("c", Mode::Echo, &[]).await,
    ];
    let r = start(&ups).await;
    let addr = r.local_addr();

    let first = chat_at(addr, &ask(1, "What is the rent?"), "1600,0").await;
    assert_eq!(first.header("x-prefix-router-decision"), "cold");
    let home = first.upstream();
    for q in [
        "Who repairs the roof?",
        "When does it end?",
        "Can I sublet?",
    ] {
        let a = chat_at(addr, &ask(1, q), "1600,1536").await;
        assert_eq!(a.header("x-prefix-router-decision"), "cache_hit", "{q}");
        assert_eq!(a.upstream(), home, "{q}");
    }
    // A streamed answer's usage chunk is read on the way, and every byte still goes through.
    for u in &ups {
        u.open_gate(1);
    }
    let streamed = post(
        addr,
        "/v1/chat/completions",
        &[
            ("x-test-stream", "1"),
            ("x-test-chunks", "2"),
            ("x-test-usage", "1600,1536"),
        ],
        ask(1, "Is there a deposit?"),
    )
    .await;
    assert_eq!(streamed.upstream(), home);
    let text = String::from_utf8_lossy(&streamed.body).to_string();
    assert!(
        text.starts_with("data: {\"chunk\":0}") && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );

    let blocks = metric_until(addr, "prefix_router_index_blocks", |v| v > 0.0).await;
    assert!(blocks > 0.0);
    let reported = metric_until(addr, "prefix_router_reported_cached_tokens_total", |v| {
        v >= 4.0 * 1536.0
    })
    .await;
    assert_eq!(reported, 4.0 * 1536.0, "each hit's cached_tokens, once");
    let text = metrics(addr).await;
    let predicted = value(&text, "prefix_router_predicted_cached_tokens_total").unwrap_or_default();
    assert!(predicted > 0.0, "{text}");
    assert!(
        value(&text, "prefix_router_cache_prediction_ratio").is_some(),
        "{text}"
    );
    assert!(
        text.contains(
            "prefix_router_decisions_total{strategy=\"cache-aware\",reason=\"cache_hit\"} 4"
        ),
        "{text}"
    );
    // Another document is new to every instance.
    let other = chat_at(addr, &ask(2, "What is the rent?"), "1600,0").await;
    assert_eq!(other.header("x-prefix-router-decision"), "cold");
    r.shutdown().await;
}

/// The Responses API is routed on its text as chat is: a long `instructions` shared by every
/// request keeps them where it is cached, though the OpenAI SDK writes `input` first. It went
/// to least-outstanding, keyless, and every instance prefilled the instructions again.
#[tokio::test]
async fn responses_requests_stay_where_their_instructions_are_cached() {
    let ups = vec![
        Upstream::start("a", Mode::Echo, &[]).await,
        Upstream::start("b", Mode::Echo, &[]).await,
        Upstream::start("c", Mode::Echo, &[]).await,
    ];
    let r = start(&ups).await;
    let addr = r.local_addr();
    let mut instructions = String::from("You review leases. ");
    while instructions.len() < 6000 {
        instructions.push_str("The tenant shall keep the premises in good repair. ");
    }
    let ask = |q: &str| {
        format!(
            "{{\"input\":{},\"model\":\"m\",\"instructions\":{}}}",
            serde_json::json!(q),
            serde_json::json!(instructions)
        )
    };
    let responses = |body: String| async move {
        let a = post(addr, "/v1/responses", &[], body).await;
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
        a
    };
    let first = responses(ask("What is the rent?")).await;
    assert_eq!(first.header("x-prefix-router-decision"), "cold");
    for q in [
        "Who repairs the roof?",
        "When does it end?",
        "Can I sublet?",
    ] {
        let a = responses(ask(q)).await;
        assert_eq!(a.header("x-prefix-router-decision"), "cache_hit", "{q}");
        assert_eq!(a.upstream(), first.upstream(), "{q}");
    }
    let text = metrics(addr).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("prefix_router_requests_total{")
                && l.contains("api=\"responses\"")),
        "{text}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn routing_changes_keep_or_rebuild_the_learned_state_and_leaving_forgets_it() {
    let ups = vec![
        Upstream::start("a", Mode::Echo, &[]).await,
        Upstream::start("b", Mode::Echo, &[]).await,
    ];
    let r = start(&ups).await;
    let addr = r.local_addr();
    let body = ask(7, "Summarise.");
    let home = chat_at(addr, &body, "1600,0").await.upstream();
    let learned = Arc::clone(&r.state().routing.load().strategy);

    // Changes that leave the strategy's configuration alone keep the strategy and its index.
    for change in [r#"{"strategy":"cache-aware"}"#, r#"{"prefix_length":2048}"#] {
        let a = admin(&r, Method::PUT, "/admin/routing", change).await;
        assert_eq!(a.status, StatusCode::OK, "{change}: {:?}", a.body);
        assert!(
            Arc::ptr_eq(&learned, &r.state().routing.load().strategy),
            "{change}"
        );
    }
    prefix_router_server::reload::reload(r.state())
        .await
        .expect("reload");
    assert!(Arc::ptr_eq(&learned, &r.state().routing.load().strategy));
    let a = chat_at(addr, &body, "1600,1536").await;
    assert_eq!(
        (a.header("x-prefix-router-decision"), a.upstream()),
        ("cache_hit".to_string(), home.clone())
    );

    // A bad parameter is refused naming it; the strategy in force stays.
    let bad = admin(
        &r,
        Method::PUT,
        "/admin/routing",
        r#"{"params":{"block-chars":64,"index-blocks":0}}"#,
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json()["error"]["param"], "params.index-blocks");
    assert!(Arc::ptr_eq(&learned, &r.state().routing.load().strategy));

    // New parameters build a new strategy, which has learned nothing yet.
    let changed = admin(
        &r,
        Method::PUT,
        "/admin/routing",
        r#"{"params":{"block-chars":64,"index-blocks":"5000"}}"#,
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK, "{:?}", changed.body);
    assert_eq!(changed.json()["params"]["index-blocks"], "5000");
    assert!(!Arc::ptr_eq(&learned, &r.state().routing.load().strategy));
    let home = chat_at(addr, &body, "1600,0").await;
    assert_eq!(home.header("x-prefix-router-decision"), "cold");
    let home_url_now = ups
        .iter()
        .find(|u| u.name == home.upstream())
        .map(Upstream::url)
        .unwrap_or_default();
    assert_eq!(
        chat_at(addr, &body, "1600,1536")
            .await
            .header("x-prefix-router-decision"),
        "cache_hit"
    );

    // Removing the instance and adding it back: the strategy was told, and forgot its cache.
    let target = format!(r#"{{"url":"{home_url_now}"}}"#);
    let removed = admin(&r, Method::POST, "/admin/instances/remove", &target).await;
    assert_eq!(removed.status, StatusCode::OK);
    let added = admin(&r, Method::POST, "/admin/instances", &target).await;
    assert_eq!(added.status, StatusCode::CREATED);
    assert_eq!(
        chat_at(addr, &body, "1600,0")
            .await
            .header("x-prefix-router-decision"),
        "cold"
    );
    r.shutdown().await;
}
