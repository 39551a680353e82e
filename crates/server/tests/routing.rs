//! Placement over real sockets: key affinity, overflow at the threshold, groups, models.

mod support;

use std::collections::HashSet;

use http::{Method, StatusCode};
use prefix_router_core::{ConcurrencyThreshold, StrategyConfig, StrategyKind};
use prefix_router_server::settings::Settings;
use support::storing::storing_engine;
use support::*;

/// These tests are about prefix-aware's placement; `serve`'s default is cache-aware.
fn settings(urls: &[String]) -> Settings {
    let mut s = support::settings(urls);
    s.routing.strategy =
        StrategyConfig::new(StrategyKind::named("prefix-aware").expect("registered"));
    s
}

async fn fleet(n: usize) -> Vec<Upstream> {
    let mut ups = Vec::new();
    for i in 0..n {
        ups.push(Upstream::start(&format!("u{i}"), Mode::Echo, &[]).await);
    }
    ups
}

fn urls(ups: &[Upstream]) -> Vec<String> {
    ups.iter().map(Upstream::url).collect()
}

#[tokio::test]
async fn same_key_goes_to_the_same_instance_and_keys_spread() {
    let ups = fleet(3).await;
    let r = router(settings(&urls(&ups))).await;
    let body = chat("You are a helpful assistant. Summarise the policy document.");
    let first = post(r.local_addr(), "/v1/chat/completions", &[], body.clone()).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body,
        body.as_bytes(),
        "body forwarded unchanged and echoed"
    );
    assert_eq!(first.header("x-prefix-router-decision"), "preferred");
    let home = first.upstream();
    assert_eq!(
        first.header("x-prefix-router-instance"),
        ups.iter()
            .find(|u| u.name == home)
            .map(Upstream::url)
            .unwrap_or_default()
    );
    for _ in 0..10 {
        let a = post(r.local_addr(), "/v1/chat/completions", &[], body.clone()).await;
        assert_eq!(a.upstream(), home);
    }
    let mut seen = HashSet::new();
    for i in 0..24 {
        let a = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"document {i}"}}"#),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
        seen.insert(a.upstream());
    }
    assert!(
        seen.len() >= 2,
        "distinct keys spread over the fleet: {seen:?}"
    );
    assert_eq!(total_in_flight(&r), 0);
    r.shutdown().await;
}

#[tokio::test]
async fn overflow_happens_exactly_at_the_threshold() {
    let ups = fleet(2).await;
    let mut s = settings(&urls(&ups));
    s.routing.strategy.concurrency_threshold = ConcurrencyThreshold::new(2).expect("threshold");
    let r = router(s).await;
    let addr = r.local_addr();
    let body = chat("shared prefix for overflow");
    let probe = post(addr, "/v1/chat/completions", &[], body.clone()).await;
    let home_name = probe.upstream();
    let home = ups.iter().find(|u| u.name == home_name).expect("home");
    let other = ups.iter().find(|u| u.name != home_name).expect("other");

    // One held request: still below the threshold of 2.
    let b = body.clone();
    let h1 = tokio::spawn(async move {
        post(addr, "/v1/chat/completions", &[("x-test-hold", "1")], b).await
    });
    home.wait_held(1).await;
    let a = post(addr, "/v1/chat/completions", &[], body.clone()).await;
    assert_eq!(
        (a.upstream(), a.header("x-prefix-router-decision")),
        (home_name.clone(), "preferred".into())
    );

    // Two held: the preferred instance is at its threshold, so the next one overflows.
    let b = body.clone();
    let h2 = tokio::spawn(async move {
        post(addr, "/v1/chat/completions", &[("x-test-hold", "1")], b).await
    });
    home.wait_held(2).await;
    assert_eq!(in_flight(&r, &home.url()), 2);
    let a = post(addr, "/v1/chat/completions", &[], body.clone()).await;
    assert_eq!(a.upstream(), other.name);
    assert_eq!(a.header("x-prefix-router-decision"), "overflow");

    home.release(2);
    for h in [h1, h2] {
        let a = h.await.expect("held request");
        assert_eq!(
            (a.status, a.upstream()),
            (StatusCode::OK, home_name.clone())
        );
    }
    eventually("in-flight back to zero", || total_in_flight(&r) == 0).await;
    let a = post(addr, "/v1/chat/completions", &[], body).await;
    assert_eq!(a.header("x-prefix-router-decision"), "preferred");
    r.shutdown().await;
}

#[tokio::test]
async fn group_ids_separate_placement() {
    let ups = fleet(3).await;
    let r = router(settings(&urls(&ups))).await;
    let addr = r.local_addr();
    let body = "the very same native payload";
    let mut by_group = HashSet::new();
    for g in 0..16 {
        let group = format!("tenant-{g}");
        let a = post(addr, "/invocations", &[("x-prefix-aware-id", &group)], body).await;
        assert_eq!(a.status, StatusCode::OK);
        let again = post(
            addr,
            "/invocations",
            &[("X-Amzn-SageMaker-Prefix-Aware-Id", &group)],
            body,
        )
        .await;
        assert_eq!(
            a.upstream(),
            again.upstream(),
            "both header names carry the group"
        );
        by_group.insert(a.upstream());
    }
    assert!(by_group.len() >= 2, "groups spread: {by_group:?}");
    let mut by_key = HashSet::new();
    for g in 0..16 {
        let b = format!(
            r#"{{"messages":[{{"role":"user","content":"same"}}],"prompt_cache_key":"t{g}"}}"#
        );
        by_key.insert(post(addr, "/v1/chat/completions", &[], b).await.upstream());
    }
    assert!(by_key.len() >= 2, "prompt_cache_key separates: {by_key:?}");
    r.shutdown().await;
}

#[tokio::test]
async fn models_select_eligible_instances() {
    let a = Upstream::start("a", Mode::Echo, &["base", "lora-a"]).await;
    let b = Upstream::start("b", Mode::Echo, &["base", "lora-b"]).await;
    let mut s = settings(&[a.url(), b.url()]);
    s.instances[0].models = vec!["base".into(), "lora-a".into()];
    s.instances[1].models = vec!["base".into(), "lora-b".into(), "lora-c".into()];
    let r = router(s).await;
    let addr = r.local_addr();
    for i in 0..8 {
        let body =
            format!(r#"{{"model":"lora-b","messages":[{{"role":"user","content":"q{i}"}}]}}"#);
        assert_eq!(
            post(addr, "/v1/chat/completions", &[], body)
                .await
                .upstream(),
            "b"
        );
        let body = format!(r#"{{"model":"lora-a","prompt":"q{i}"}}"#);
        assert_eq!(
            post(addr, "/v1/completions", &[], body).await.upstream(),
            "a"
        );
    }
    for i in 0..4 {
        let body = format!(r#"{{"model":"lora-b","input":"e{i}"}}"#);
        assert_eq!(
            post(addr, "/v1/embeddings", &[], body).await.upstream(),
            "b"
        );
    }
    let missing = post(
        addr,
        "/v1/chat/completions",
        &[],
        r#"{"model":"gpt-9","messages":[]}"#,
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.error_code(), "model_not_found");
    assert!(missing.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("gpt-9"));

    let models = send(addr, request(Method::GET, "/v1/models", &[], "")).await;
    assert_eq!(models.status, StatusCode::OK);
    let ids: HashSet<String> = models.json()["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let want: HashSet<String> = ["base", "lora-a", "lora-b", "lora-c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(ids, want, "union of listed and configured models");
    r.shutdown().await;
}

#[tokio::test]
async fn other_v1_routes_are_forwarded() {
    let ups = fleet(2).await;
    let r = router(settings(&urls(&ups))).await;
    let a = post(
        r.local_addr(),
        "/v1/embeddings?x=1",
        &[
            ("expect", "100-continue"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
        ],
        r#"{"input":"hi"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("x-prefix-router-decision"), "least_outstanding");
    assert_eq!(a.body.as_ref(), br#"{"input":"hi"}"#);
    let received = a.header("x-received-headers");
    assert!(
        received.contains("content-type") || received.contains("host"),
        "{received}"
    );
    for hop in ["expect", "x-hop", "connection"] {
        assert!(
            !received.split(',').any(|h| h == hop),
            "{hop} forwarded: {received}"
        );
    }
    r.shutdown().await;
}

#[tokio::test]
async fn prefix_aware_replicas_place_every_key_alike_without_talking() {
    // Three replicas with the same configuration, the fleet listed in a different order on
    // each (as discovery may return it): every key lands on the same instance through any of
    // them, and the keys still spread.
    let ups = fleet(5).await;
    let mut order = urls(&ups);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(router(settings(&order)).await);
        order.rotate_left(2);
    }
    let mut homes = HashSet::new();
    for doc in 0..30 {
        let body = format!(
            r#"{{"prompt":"policy document {doc}: {}"}}"#,
            "text ".repeat(300)
        );
        let placed: Vec<String> = futures_util::future::join_all(
            replicas
                .iter()
                .map(|r| post(r.local_addr(), "/v1/completions", &[], body.clone())),
        )
        .await
        .iter()
        .map(|a| a.upstream().to_string())
        .collect();
        assert!(
            placed.iter().all(|p| *p == placed[0]),
            "doc {doc}: {placed:?}"
        );
        homes.insert(placed[0].clone());
    }
    assert!(homes.len() >= 3, "30 keys on {homes:?} only");
    for r in replicas {
        r.shutdown().await;
    }
}

/// A conversation on the Responses API's stored state (`previous_response_id`) goes where each
/// response is stored: on any other instance the engine answers 404. Requests for a stored
/// response by its path go there too. It was routed as any request, and failed about two
/// turns in three on three instances.
#[tokio::test]
async fn a_stored_response_is_continued_where_it_lives() {
    let engines = vec![
        storing_engine("a").await,
        storing_engine("b").await,
        storing_engine("c").await,
    ];
    let r = router(settings(&engines)).await;
    let addr = r.local_addr();
    let turn = |previous: Option<String>, stream: bool, n: usize| async move {
        let body = serde_json::json!({
            "model": "m",
            "input": format!("turn {n}: {}", "words ".repeat(n * 40)),
            "previous_response_id": previous,
            "stream": stream,
        });
        post(addr, "/v1/responses", &[], body.to_string()).await
    };
    let first = turn(None, false, 0).await;
    assert_eq!(first.status, StatusCode::OK);
    let home = first.header("x-prefix-router-instance");
    let id_of = |a: &Answer| {
        let text = String::from_utf8_lossy(&a.body).to_string();
        let at = text.find("resp_").unwrap_or(0);
        text[at..].split('"').next().unwrap_or_default().to_string()
    };
    let mut last = id_of(&first);
    for n in 1..=6 {
        // Every other turn streamed: its id comes in the `response.created` event.
        let a = turn(Some(last.clone()), n % 2 == 0, n).await;
        assert_eq!(a.status, StatusCode::OK, "turn {n}: {:?}", a.body);
        assert_eq!(
            a.header("x-prefix-router-decision"),
            "stored_response",
            "turn {n}"
        );
        assert_eq!(a.header("x-prefix-router-instance"), home, "turn {n}");
        last = id_of(&a);
    }
    let get = send(
        addr,
        request(Method::GET, &format!("/v1/responses/{last}"), &[], ""),
    )
    .await;
    assert_eq!(get.status, StatusCode::OK, "{:?}", get.body);
    assert_eq!(get.header("x-prefix-router-decision"), "stored_response");
    let cancel = post(addr, &format!("/v1/responses/{last}/cancel"), &[], "").await;
    assert_eq!(cancel.status, StatusCode::OK, "{:?}", cancel.body);
    // A response the router never saw is routed as any other request (and the engine says).
    let unknown = turn(Some("resp_elsewhere".into()), false, 7).await;
    assert_ne!(
        unknown.header("x-prefix-router-decision"),
        "stored_response"
    );
    // The home answering 503 is the client's answer: another instance would say 404, hiding
    // it. Draining, the home still takes the conversation (nowhere else holds it).
    let failing = post(
        addr,
        "/v1/responses",
        &[],
        serde_json::json!({"input": "FAIL", "previous_response_id": last}).to_string(),
    )
    .await;
    assert_eq!(
        failing.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        failing.body
    );
    assert_eq!(failing.header("x-prefix-router-instance"), home);
    let snap = r.state().fleet.snapshot();
    let (_, inst) = snap.get(&home).expect("home is a member");
    inst.set_state(prefix_router_core::InstanceState::Draining);
    let a = turn(Some(last.clone()), false, 8).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!(a.header("x-prefix-router-instance"), home);
    inst.set_state(prefix_router_core::InstanceState::Healthy);
    // With `store: false` the engine keeps nothing, and neither does the router.
    let unstored = post(
        addr,
        "/v1/responses",
        &[],
        serde_json::json!({"input": "x", "store": false}).to_string(),
    )
    .await;
    assert!(r.state().response_homes.home(&id_of(&unstored)).is_none());
    assert!(r.state().response_homes.home(&id_of(&a)).is_some());
    let page = metrics_text(addr).await;
    assert!(page.contains("reason=\"stored_response\""), "{page}");
    r.shutdown().await;
}
