//! Operations over real sockets: health ejection and recovery, drain, admin API, metrics,
//! reload under load, graceful shutdown.

mod support;

use std::time::Duration;

use http::{Method, StatusCode};
use prefix_router_core::{InstanceState, StrategyKind};
use prefix_router_server::reload;
use prefix_router_server::settings::{Admin, ConfigSource, Overrides};
use prefix_router_server::Router;
use support::*;

fn state_of(r: &prefix_router_server::RunningRouter, url: &str) -> Option<InstanceState> {
    r.state().fleet.snapshot().get(url).map(|(_, i)| i.state())
}

#[tokio::test]
async fn active_checks_eject_and_recover() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let mut s = settings(&[a.url(), b.url()]);
    // Round-robin, so that "a takes requests again" is about health, not about the costs
    // cache-aware learned from a few loopback timings.
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        StrategyKind::named("round-robin").expect("registered"),
    );
    s.health.active = true;
    s.health.unhealthy_threshold = 2;
    s.health.healthy_threshold = 2;
    s.health.timeout = Duration::from_millis(500);
    let r = router(s).await;
    eventually("probes reach the instances", || {
        a.health_checks() >= 2 && b.health_checks() >= 2
    })
    .await;
    a.set_healthy(false);
    eventually("a ejected", || {
        state_of(&r, &a.url()) == Some(InstanceState::Ejected)
    })
    .await;
    for i in 0..10 {
        let ans = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"e{i}"}}"#),
        )
        .await;
        assert_eq!(ans.upstream(), "b", "ejected instance gets nothing");
    }
    a.set_healthy(true);
    eventually("a recovered", || {
        state_of(&r, &a.url()) == Some(InstanceState::Healthy)
    })
    .await;
    let mut reached_a = false;
    for i in 0..24 {
        let ans = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"r{i}"}}"#),
        )
        .await;
        reached_a |= ans.upstream() == "a";
    }
    assert!(reached_a, "keys come back to a recovered instance");
    r.shutdown().await;
}

#[tokio::test]
async fn repeated_5xx_eject_passively_and_backoff_ends() {
    let a = Upstream::start("a", Mode::Status(500), &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let mut s = settings(&[a.url(), b.url()]);
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        StrategyKind::named("round-robin").expect("registered"),
    );
    s.health.passive_failures = 2;
    // Long enough that the requests below all run inside it, even on a loaded machine.
    s.health.eject_backoff = Duration::from_millis(500);
    s.health.max_eject_backoff = Duration::from_millis(1000);
    let r = router(s).await;
    let mut failures = 0;
    for i in 0..8 {
        let ans = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"{i}"}}"#),
        )
        .await;
        if ans.status == StatusCode::INTERNAL_SERVER_ERROR {
            failures += 1;
        }
    }
    assert_eq!(failures, 2, "ejected after exactly passive_failures errors");
    assert_eq!(state_of(&r, &a.url()), Some(InstanceState::Ejected));
    a.set_mode(Mode::Echo);
    eventually("a back after its backoff", || {
        state_of(&r, &a.url()) == Some(InstanceState::Healthy)
    })
    .await;
    let before = a.hits();
    for i in 0..4 {
        post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"x{i}"}}"#),
        )
        .await;
    }
    assert!(a.hits() > before, "recovered instance serves again");
    r.shutdown().await;
}

#[tokio::test]
async fn a_repeat_ejection_backs_off_longer_after_a_recovery_by_probes() {
    // An instance that passes its health checks but fails real requests: every recovery by
    // probes is followed by another passive ejection, each longer than the last.
    let a = Upstream::start("a", Mode::Status(500), &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let mut s = settings(&[a.url(), b.url()]);
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        StrategyKind::named("round-robin").expect("registered"),
    );
    s.health.active = true;
    s.health.healthy_threshold = 1;
    s.health.passive_failures = 2;
    s.health.eject_backoff = Duration::from_millis(200);
    s.health.max_eject_backoff = Duration::from_secs(30);
    let r = router(s).await;
    let next_backoff = || {
        let snapshot = r.state().fleet.snapshot();
        let (_, inst) = snapshot.get(&a.url()).expect("a member");
        let stats = r.state().stats.get(inst);
        let next = stats.health().next_backoff;
        next
    };
    let mut i = 0;
    for round in 1..=2u32 {
        eventually("a takes requests", || {
            state_of(&r, &a.url()) == Some(InstanceState::Healthy)
        })
        .await;
        while state_of(&r, &a.url()) == Some(InstanceState::Healthy) {
            post(
                r.local_addr(),
                "/v1/completions",
                &[],
                format!(r#"{{"prompt":"{i}"}}"#),
            )
            .await;
            i += 1;
            assert!(i < 200, "a was never ejected");
        }
        // 200 ms, then 400: the next one doubles again.
        assert_eq!(
            next_backoff(),
            Some(Duration::from_millis(200 << round)),
            "round {round}"
        );
    }
    r.shutdown().await;
}

#[tokio::test]
async fn connect_errors_eject_a_dead_instance() {
    let dead = dead_url().await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let mut s = settings(&[dead.clone(), b.url()]);
    s.health.passive_failures = 1;
    s.health.eject_backoff = Duration::from_secs(30);
    s.health.max_eject_backoff = Duration::from_secs(30);
    let r = router(s).await;
    for i in 0..8 {
        let ans = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"{i}"}}"#),
        )
        .await;
        assert_eq!(ans.status, StatusCode::OK);
    }
    assert_eq!(state_of(&r, &dead), Some(InstanceState::Ejected));
    r.shutdown().await;
}

/// With active checks, ending a drain does not make an instance routable by itself: it must
/// pass a probe first, as a joining one does (it may have been drained for failing, and the
/// checker leaves a draining instance alone). One that never comes up stays out.
#[tokio::test]
async fn an_activated_instance_must_pass_a_probe_first() {
    let good = Upstream::start("good", Mode::Echo, &[]).await;
    let dead = dead_url().await;
    let mut s = settings(&[good.url(), dead.clone()]);
    s.health.active = true;
    s.admin = Admin::on("127.0.0.1:0".parse().expect("addr"), "s3cret");
    let r = router(s).await;
    let admin = r.admin_addr().expect("admin listener");
    let t = Some("s3cret");
    let target = format!(r#"{{"url":"{dead}"}}"#);
    let drained = admin_call(admin, Method::POST, "/admin/instances/drain", t, &target).await;
    assert_eq!(drained.status, StatusCode::OK);
    let activated = admin_call(admin, Method::POST, "/admin/instances/activate", t, &target).await;
    assert_eq!(activated.status, StatusCode::OK);
    // Several health rounds later it has still passed none: never routable.
    for _ in 0..10 {
        assert_ne!(state_of(&r, &dead), Some(InstanceState::Healthy));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..5 {
        let ans = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"p{i}"}}"#),
        )
        .await;
        assert_eq!(ans.upstream(), "good");
    }
    r.shutdown().await;
}

#[tokio::test]
async fn admin_api_lists_adds_drains_removes_and_changes_routing() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let mut s = settings(&[a.url()]);
    s.instances[0].models = vec!["x".into()];
    s.admin = Admin::on("127.0.0.1:0".parse().expect("addr"), "s3cret");
    let r = router(s).await;
    let admin = r.admin_addr().expect("admin listener");
    let t = Some("s3cret");

    assert_eq!(
        admin_call(admin, Method::GET, "/admin/instances", None, "")
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        admin_call(admin, Method::GET, "/admin/instances", Some("nope"), "")
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    // Not on the data plane.
    assert_eq!(
        admin_call(r.local_addr(), Method::GET, "/admin/instances", t, "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let body = format!(r#"{{"url":"{}","models":["m"]}}"#, b.url());
    assert_eq!(
        admin_call(admin, Method::POST, "/admin/instances", t, &body)
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        admin_call(admin, Method::POST, "/admin/instances", t, &body)
            .await
            .status,
        StatusCode::CONFLICT
    );
    let bad = admin_call(
        admin,
        Method::POST,
        "/admin/instances",
        t,
        r#"{"url":"ftp://x"}"#,
    )
    .await;
    assert_eq!(
        (bad.status, bad.error_code()),
        (StatusCode::BAD_REQUEST, "invalid_instance".into())
    );
    let ans = post(
        r.local_addr(),
        "/v1/completions",
        &[],
        r#"{"model":"m","prompt":"p"}"#,
    )
    .await;
    assert_eq!(ans.upstream(), "b", "added instance serves");

    // Drain a: held request on a finishes; new requests avoid a.
    let addr = r.local_addr();
    let held = post_held(addr, r#"{"model":"x","prompt":"h"}"#);
    a.wait_held(1).await;
    let drained = admin_call(
        admin,
        Method::POST,
        "/admin/instances/drain",
        t,
        &format!(r#"{{"url":"{}"}}"#, a.url()),
    )
    .await;
    assert_eq!(drained.status, StatusCode::OK);
    assert_eq!(drained.json()["in_flight"], 1);
    for i in 0..6 {
        assert_eq!(
            post(
                addr,
                "/v1/completions",
                &[],
                format!(r#"{{"prompt":"d{i}"}}"#)
            )
            .await
            .upstream(),
            "b"
        );
    }
    a.release(1);
    assert_eq!(held.await.expect("held").status, StatusCode::OK);

    let list = admin_call(admin, Method::GET, "/admin/instances", t, "").await;
    let instances = list.json()["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(instances.len(), 2);
    let a_row = instances
        .iter()
        .find(|i| i["url"] == a.url())
        .cloned()
        .unwrap_or_default();
    assert_eq!(a_row["state"], "draining");
    assert_eq!(a_row["in_flight"], 0);
    assert_eq!(a_row["requests"], 1);
    let b_row = instances
        .iter()
        .find(|i| i["url"] == b.url())
        .cloned()
        .unwrap_or_default();
    assert_eq!(b_row["requests"], 7);
    assert_eq!(b_row["errors"], 0);

    let target = format!(r#"{{"url":"{}"}}"#, a.url());
    let activated = admin_call(admin, Method::POST, "/admin/instances/activate", t, &target).await;
    assert_eq!(activated.status, StatusCode::OK);
    assert_eq!(state_of(&r, &a.url()), Some(InstanceState::Healthy));
    let again = admin_call(admin, Method::POST, "/admin/instances/activate", t, &target).await;
    assert_eq!(
        (again.status, again.error_code()),
        (StatusCode::CONFLICT, "not_draining".into())
    );
    let ans = post(
        r.local_addr(),
        "/v1/completions",
        &[],
        r#"{"model":"x","prompt":"back"}"#,
    )
    .await;
    assert_eq!(ans.upstream(), "a", "active again");

    let removed = admin_call(
        admin,
        Method::POST,
        "/admin/instances/remove",
        t,
        &format!(r#"{{"url":"{}"}}"#, a.url()),
    )
    .await;
    assert_eq!(removed.status, StatusCode::OK);
    let missing = admin_call(
        admin,
        Method::POST,
        "/admin/instances/remove",
        t,
        &format!(r#"{{"url":"{}"}}"#, a.url()),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    let changed = admin_call(
        admin,
        Method::PUT,
        "/admin/routing",
        t,
        r#"{"strategy":"round-robin","concurrency_threshold":7}"#,
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK);
    assert_eq!(changed.json()["strategy"], "round-robin");
    assert_eq!(changed.json()["concurrency_threshold"], 7);
    assert!(changed.json().get("warning").is_none());
    // kv-aware without the engines' KV events (read at start only): accepted, and the answer
    // says it runs as cache-aware.
    let blind = admin_call(
        admin,
        Method::PUT,
        "/admin/routing",
        t,
        r#"{"strategy":"kv-aware"}"#,
    )
    .await;
    assert_eq!(blind.status, StatusCode::OK);
    assert!(
        blind.json()["warning"]
            .as_str()
            .is_some_and(|w| w.contains("runs as cache-aware")),
        "{:?}",
        blind.json()
    );
    let back = admin_call(
        admin,
        Method::PUT,
        "/admin/routing",
        t,
        r#"{"strategy":"round-robin"}"#,
    )
    .await;
    assert_eq!(back.status, StatusCode::OK);
    let refused = admin_call(
        admin,
        Method::PUT,
        "/admin/routing",
        t,
        r#"{"prefix_length":5}"#,
    )
    .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("prefix_length"));
    let ans = post(r.local_addr(), "/v1/completions", &[], r#"{"prompt":"rr"}"#).await;
    assert_eq!(ans.header("x-prefix-router-decision"), "round_robin");
    r.shutdown().await;
}

#[tokio::test]
async fn metrics_are_exported_with_the_prefix() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let r = router(settings(&[a.url()])).await;
    let addr = r.local_addr();
    post(addr, "/v1/chat/completions", &[], chat("metrics")).await;
    post(addr, "/v1/chat/completions", &[], "{bad").await;
    let m = send(addr, request(Method::GET, "/metrics", &[], "")).await;
    assert_eq!(m.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&m.body).to_string();
    let inst = a.url();
    for want in [
        format!(
            "prefix_router_requests_total{{instance=\"{inst}\",api=\"chat\",outcome=\"ok\"}} 1"
        ),
        "prefix_router_requests_total{instance=\"none\",api=\"chat\",outcome=\"client_error\"} 1"
            .to_string(),
        // The default strategy; the first request of a prefix is a cold placement.
        "prefix_router_decisions_total{strategy=\"cache-aware\",reason=\"cold\"} 1".to_string(),
        format!("prefix_router_in_flight{{instance=\"{inst}\"}} 0"),
        format!("prefix_router_instance_healthy{{instance=\"{inst}\"}} 1"),
        format!("prefix_router_ttft_seconds_count{{instance=\"{inst}\"}} 1"),
        "prefix_router_request_duration_seconds_count{api=\"chat\"} 1".to_string(),
        "prefix_router_routing_decision_seconds_count 1".to_string(),
    ] {
        assert!(text.contains(&want), "missing {want} in\n{text}");
    }
    r.shutdown().await;
}

#[tokio::test]
async fn reload_under_load_drops_no_request() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let c = Upstream::start("c", Mode::Echo, &[]).await;
    let dir = std::env::temp_dir().join(format!("pr-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("router.toml");
    let write = |urls: &[String]| {
        // Round-robin: whether the new member takes requests must not hang on what a learning
        // strategy makes of a few loopback timings (cache-aware may rightly keep a short
        // prompt on the instance it has measured fastest).
        let mut text = String::from(
            "listen = \"127.0.0.1:0\"\n[routing]\nstrategy = \"round-robin\"\n[health]\nactive = false\n",
        );
        for u in urls {
            text.push_str(&format!("[[instances]]\nurl = \"{u}\"\n"));
        }
        std::fs::write(&path, text).expect("write config");
    };
    write(&[a.url(), b.url()]);
    let source = ConfigSource {
        path: Some(path.clone()),
        overrides: Overrides::default(),
    };
    let r = Router::start(source.load().expect("valid"), Some(source))
        .await
        .expect("start");
    let addr = r.local_addr();
    // A request held on a, which the reload removes: it must still finish.
    let held = tokio::spawn(async move {
        // The rotation over [a, b]: the request after one that reached b reaches a.
        let body = r#"{"prompt":"held"}"#.to_string();
        loop {
            let probe = post(addr, "/v1/completions", &[], body.clone()).await;
            if probe.upstream() == "b" {
                return post(addr, "/v1/completions", &[("x-test-hold", "1")], body).await;
            }
        }
    });
    a.wait_held(1).await;
    let load = tokio::spawn(async move {
        let mut statuses = Vec::new();
        for i in 0..60 {
            statuses.push(
                post(
                    addr,
                    "/v1/completions",
                    &[],
                    format!(r#"{{"prompt":"load {i}"}}"#),
                )
                .await
                .status,
            );
        }
        statuses
    });
    write(&[b.url(), c.url()]);
    let summary = reload::reload(r.state()).await.expect("reload");
    assert_eq!(summary.instances, 2);
    a.release(1);
    let held = held.await.expect("held");
    assert_eq!(
        (held.status, held.upstream()),
        (StatusCode::OK, "a".to_string())
    );
    let statuses = load.await.expect("load");
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    eventually("counts settle", || total_in_flight(&r) == 0).await;
    let mut reached_c = false;
    for i in 0..24 {
        let ans = post(
            addr,
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"after {i}"}}"#),
        )
        .await;
        assert_ne!(ans.upstream(), "a", "removed instance gets nothing new");
        reached_c |= ans.upstream() == "c";
    }
    assert!(reached_c);
    // A broken file keeps the current configuration.
    std::fs::write(&path, "[routing]\nprefix_length = 3\n").expect("write");
    assert!(reload::reload(r.state()).await.is_err());
    assert_eq!(r.state().fleet.snapshot().len(), 2);
    r.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn shutdown_lets_in_flight_requests_finish() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let r = router(settings(&[a.url()])).await;
    let addr = r.local_addr();
    let held = post_held(addr, r#"{"prompt":"h"}"#);
    a.wait_held(1).await;
    let stopping = tokio::spawn(r.shutdown());
    let closed = tokio::time::timeout(WAIT, async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "no longer accepting");
    assert!(!stopping.is_finished(), "waits for the in-flight request");
    a.release(1);
    assert_eq!(held.await.expect("held").status, StatusCode::OK);
    tokio::time::timeout(WAIT, stopping)
        .await
        .expect("stopped in time")
        .expect("join");
}

#[tokio::test]
async fn engine_metrics_are_scraped() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    a.set_metrics(
        "# TYPE vllm:prefix_cache_hits_total counter\n\
         vllm:prefix_cache_hits_total{model_name=\"m\"} 10\n\
         vllm:prefix_cache_queries_total{model_name=\"m\"} 100\n\
         vllm:num_requests_running{model_name=\"m\"} 2\n\
         vllm:num_requests_waiting{model_name=\"m\"} 1\n\
         vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n",
    );
    let mut s = settings(&[a.url()]);
    s.engine_metrics = prefix_router_server::settings::EngineMetrics {
        scrape: true,
        interval: Duration::from_millis(20),
        ..Default::default()
    };
    let r = router(s).await;
    let inst = a.url();
    let running = format!("prefix_router_engine_requests_running{{instance=\"{inst}\"}} 2");
    let waiting = format!("prefix_router_engine_requests_waiting{{instance=\"{inst}\"}} 1");
    let usage = format!("prefix_router_engine_kv_cache_usage{{instance=\"{inst}\"}} 0.25");
    // Nothing of ours in flight: all three are someone else's.
    let others = format!("prefix_router_engine_requests_others{{instance=\"{inst}\"}} 3");
    let addr = r.local_addr();
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            let text = metrics_text(addr).await;
            if [&running, &waiting, &usage, &others]
                .iter()
                .all(|s| text.contains(s.as_str()))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(seen.is_ok(), "engine gauges: {}", metrics_text(addr).await);
    // 60 more hits out of 100 more queries: 0.6 over the interval.
    a.set_metrics(
        "vllm:prefix_cache_hits_total{model_name=\"m\"} 70\n\
         vllm:prefix_cache_queries_total{model_name=\"m\"} 200\n",
    );
    let ratio = format!("prefix_router_engine_prefix_cache_hit_ratio{{instance=\"{inst}\"}} 0.6");
    let seen = tokio::time::timeout(WAIT, async {
        loop {
            if metrics_text(addr).await.contains(&ratio) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(seen.is_ok(), "hit ratio: {}", metrics_text(addr).await);
    // No new queries: the ratio stands.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(metrics_text(addr).await.contains(&ratio));
    r.shutdown().await;
}

#[tokio::test]
async fn scraped_queues_steer_load_aware_routing_until_they_go_stale() {
    // Two engines; another router keeps `a` busy (its page says so); ours has sent nothing.
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let busy = "vllm:num_requests_running{model_name=\"m\"} 8\n\
                vllm:num_requests_waiting{model_name=\"m\"} 4\n";
    let idle = "vllm:num_requests_running{model_name=\"m\"} 0\n\
                vllm:num_requests_waiting{model_name=\"m\"} 0\n";
    a.set_metrics(busy);
    b.set_metrics(idle);
    let mut s = settings(&[a.url(), b.url()]);
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        StrategyKind::named("least-outstanding").expect("registered"),
    );
    s.engine_metrics = prefix_router_server::settings::EngineMetrics {
        scrape: true,
        interval: Duration::from_millis(20),
        stale_after: Duration::from_millis(200),
        ..Default::default()
    };
    let r = router(s).await;
    let others = format!(
        "prefix_router_engine_requests_others{{instance=\"{}\"}} 12",
        a.url()
    );
    let addr = r.local_addr();
    let seen = tokio::time::timeout(WAIT, async {
        while !metrics_text(addr).await.contains(&others) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(seen.is_ok(), "a's queue: {}", metrics_text(addr).await);
    for i in 0..20 {
        let ans = post(
            addr,
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"q{i}"}}"#),
        )
        .await;
        assert_eq!(ans.upstream(), "b", "request {i} went to the busy engine");
    }
    // a's page stops saying: once its last reading is stale, its queue is unknown, not
    // "still 12" (and not a claim that it is idle); both take requests again.
    a.set_metrics("");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut reached_a = false;
    for i in 0..20 {
        let ans = post(
            addr,
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"s{i}"}}"#),
        )
        .await;
        reached_a |= ans.upstream() == "a";
    }
    assert!(reached_a, "a stale queue still kept a out");
    r.shutdown().await;
}
