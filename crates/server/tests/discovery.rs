//! Discovery over loopback: DNS names resolved into instances (the system resolver for
//! `localhost`, a test name server for SRV records and configured servers), models learnt from
//! `/v1/models`.

mod support;

use std::time::Duration;

use http::StatusCode;
use prefix_router_server::settings::{DnsRecord, DnsTarget};
use support::dns::{DnsServer, Entry};
use support::*;

#[tokio::test]
async fn dns_names_become_instances() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let mut s = settings(&[]);
    s.admin = prefix_router_server::settings::Admin::on(([127, 0, 0, 1], 0).into(), "t0ken");
    s.discovery.dns = vec![
        DnsTarget {
            name: "localhost".into(),
            port: a.addr.port(),
            record: DnsRecord::Address,
            server: None,
            interval: Duration::from_millis(50),
            weight: 1,
            models: Vec::new(),
        },
        DnsTarget {
            name: "no-such-host.invalid".into(),
            port: 80,
            record: DnsRecord::Address,
            server: None,
            interval: Duration::from_millis(50),
            weight: 1,
            models: Vec::new(),
        },
    ];
    let r = router(s).await;
    let want = a.url();
    assert!(
        r.state().fleet.snapshot().get(&want).is_some(),
        "localhost resolved to {want} before serving"
    );
    for i in 0..4 {
        let ans = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"{i}"}}"#),
        )
        .await;
        assert_eq!(
            (ans.status, ans.upstream()),
            (StatusCode::OK, "a".to_string())
        );
    }
    // The admin API cannot remove what discovery lists: it says so, and the instance stays.
    let removed = send(
        r.admin_addr().expect("admin listener"),
        request(
            http::Method::POST,
            "/admin/instances/remove",
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer t0ken"),
            ],
            format!(r#"{{"url":"{want}"}}"#),
        ),
    )
    .await;
    assert_eq!(removed.status, StatusCode::CONFLICT, "{:?}", removed.body);
    let text = String::from_utf8_lossy(&removed.body);
    assert!(
        text.contains("discovered_instance") && text.contains("drain it"),
        "{text}"
    );
    assert!(r.state().fleet.snapshot().get(&want).is_some());
    // Re-resolution keeps the same fleet; the failing name adds nothing and breaks nothing.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let snapshot = r.state().fleet.snapshot();
    assert!(snapshot.get(&want).is_some());
    assert!(snapshot
        .instances()
        .iter()
        .all(|i| i.url_port() == a.addr.port()));
    r.shutdown().await;
}

fn urls(r: &prefix_router_server::RunningRouter) -> Vec<String> {
    let mut u: Vec<String> = r
        .state()
        .fleet
        .snapshot()
        .instances()
        .iter()
        .map(|i| i.spec().url.clone())
        .collect();
    u.sort();
    u
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn target(name: String, port: u16, record: DnsRecord, server: &DnsServer) -> DnsTarget {
    DnsTarget {
        name,
        port,
        record,
        server: Some(server.addr),
        interval: Duration::from_millis(40),
        weight: 1,
        models: Vec::new(),
    }
}

#[tokio::test]
async fn srv_records_follow_scale_out_and_in_and_a_failing_server_keeps_the_fleet() {
    let ups: Vec<Upstream> = [
        Upstream::start("a", Mode::Echo, &[]).await,
        Upstream::start("b", Mode::Echo, &[]).await,
        Upstream::start("c", Mode::Echo, &[]).await,
    ]
    .into();
    let entry =
        |i: usize| Entry::local(&format!("{}.fleet.test.", ups[i].name), ups[i].addr.port());
    let dns = DnsServer::start("_http._tcp.fleet.test.", &[entry(0), entry(1)]);
    let mut s = settings(&[]);
    // Round-robin: every member takes requests, so "c takes requests" is about membership.
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named("round-robin").expect("registered"),
    );
    s.discovery.dns = vec![target(dns.srv_name(), 0, DnsRecord::Srv, &dns)];
    let r = router(s).await;
    assert_eq!(
        urls(&r),
        sorted(vec![ups[0].url(), ups[1].url()]),
        "resolved before serving"
    );
    // Scale out: c joins and takes requests.
    dns.set(&[entry(0), entry(1), entry(2)]);
    eventually("c joins", || urls(&r).len() == 3).await;
    let mut reached = std::collections::HashSet::new();
    for i in 0..6 {
        let ans = complete(r.local_addr(), &format!("{i}")).await;
        assert_eq!(ans.status, StatusCode::OK);
        reached.insert(ans.upstream());
    }
    assert!(reached.contains("c"), "{reached:?}");
    // Scale in: the member holding a request leaves; that request still finishes.
    let held = post_held(r.local_addr(), r#"{"prompt":"h"}"#);
    eventually("a request held", || ups.iter().any(|u| u.held() == 1)).await;
    let holder = ups.iter().position(|u| u.held() == 1).expect("a holder");
    let rest: Vec<Entry> = (0..3).filter(|&i| i != holder).map(entry).collect();
    dns.set(&rest);
    eventually("the first member leaves", || urls(&r).len() == 2).await;
    ups[holder].release(1);
    let held = held.await.expect("held");
    assert_eq!(
        (held.status, held.upstream()),
        (StatusCode::OK, ups[holder].name.clone())
    );
    for i in 0..6 {
        let ans = complete(r.local_addr(), &format!("x{i}")).await;
        assert_ne!(
            ans.upstream(),
            ups[holder].name,
            "a removed member gets nothing new"
        );
    }
    // A failing name server: the fleet stays as it was.
    let kept = urls(&r);
    dns.set_failing(true);
    let asked = dns.queries();
    eventually("the router asks again", || dns.queries() >= asked + 3).await;
    assert_eq!(urls(&r), kept);
    dns.set_failing(false);
    r.shutdown().await;
}

#[tokio::test]
async fn a_records_from_a_configured_server() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let dns = DnsServer::start(
        "_unused._tcp.fleet.test.",
        &[Entry::local("engines.fleet.test.", 0)],
    );
    let mut s = settings(&[]);
    s.discovery.dns = vec![target(
        "engines.fleet.test.".into(),
        a.addr.port(),
        DnsRecord::Address,
        &dns,
    )];
    let r = router(s).await;
    assert_eq!(urls(&r), vec![a.url()]);
    let ans = post(r.local_addr(), "/v1/completions", &[], r#"{"prompt":"p"}"#).await;
    assert_eq!(
        (ans.status, ans.upstream()),
        (StatusCode::OK, "a".to_string())
    );
    r.shutdown().await;
}

#[tokio::test]
async fn models_are_learnt_from_the_instances() {
    let a = Upstream::start("a", Mode::Echo, &["base", "lora-x"]).await;
    let b = Upstream::start("b", Mode::Echo, &["base"]).await;
    let mut s = settings(&[a.url(), b.url()]);
    s.discovery.models = true;
    s.discovery.models_interval = Duration::from_millis(20);
    let r = router(s).await;
    eventually("models discovered", || {
        r.state()
            .fleet
            .snapshot()
            .get(&a.url())
            .is_some_and(|(_, i)| i.spec().models.iter().any(|m| m == "lora-x"))
    })
    .await;
    for i in 0..8 {
        let body = format!(r#"{{"model":"lora-x","prompt":"q{i}"}}"#);
        assert_eq!(
            post(r.local_addr(), "/v1/completions", &[], body)
                .await
                .upstream(),
            "a"
        );
    }
    let missing = post(
        r.local_addr(),
        "/v1/completions",
        &[],
        r#"{"model":"lora-y","prompt":"q"}"#,
    )
    .await;
    assert_eq!(
        (missing.status, missing.error_code()),
        (StatusCode::NOT_FOUND, "model_not_found".into())
    );
    let mut seen = std::collections::HashSet::new();
    for i in 0..24 {
        let body = format!(r#"{{"model":"base","prompt":"b{i}"}}"#);
        seen.insert(
            post(r.local_addr(), "/v1/completions", &[], body)
                .await
                .upstream(),
        );
    }
    assert_eq!(seen.len(), 2, "both serve the base model");
    r.shutdown().await;
}

/// An SRV record of a higher priority value is a backup (another site): it takes requests only
/// when none of the first choice's records answers.
#[tokio::test]
async fn srv_backups_take_over_only_when_the_first_choice_is_gone() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let first = Entry::local("a.fleet.test.", a.addr.port());
    let backup = Entry {
        priority: 10,
        ..Entry::local("b.fleet.test.", b.addr.port())
    };
    let dns = DnsServer::start("_http._tcp.fleet.test.", &[first.clone(), backup.clone()]);
    let mut s = settings(&[]);
    s.discovery.dns = vec![target(dns.srv_name(), 0, DnsRecord::Srv, &dns)];
    let r = router(s).await;
    assert_eq!(urls(&r), vec![a.url()], "the backup is not a member");
    dns.set(std::slice::from_ref(&backup));
    eventually("the backup takes over", || urls(&r) == vec![b.url()]).await;
    dns.set(&[first, backup]);
    eventually("the first choice is back", || urls(&r) == vec![a.url()]).await;
    r.shutdown().await;
}

/// SRV records' weights are the instances' shares (RFC 2782), times the target's `weight`; a
/// weight of 0 counts as 1. They were not read: every instance took the target's weight, and a
/// record published at three times another's share took the same.
#[tokio::test]
async fn srv_weights_become_the_instances_weights() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let heavy = Entry {
        weight: 3,
        ..Entry::local("a.fleet.test.", a.addr.port())
    };
    let light = Entry {
        weight: 0,
        ..Entry::local("b.fleet.test.", b.addr.port())
    };
    let dns = DnsServer::start("_http._tcp.fleet.test.", &[heavy.clone(), light]);
    let mut s = settings(&[]);
    let mut t = target(dns.srv_name(), 0, DnsRecord::Srv, &dns);
    t.weight = 2;
    s.discovery.dns = vec![t];
    let r = router(s).await;
    let weights = |r: &prefix_router_server::RunningRouter| {
        let mut w: Vec<(String, u32)> = r
            .state()
            .fleet
            .snapshot()
            .instances()
            .iter()
            .map(|i| (i.spec().url.clone(), i.weight()))
            .collect();
        w.sort();
        w
    };
    let sorted = |mut v: Vec<(String, u32)>| {
        v.sort();
        v
    };
    assert_eq!(weights(&r), sorted(vec![(a.url(), 6), (b.url(), 2)]));
    // A new weight published is a changed fleet.
    dns.set(&[
        Entry { weight: 1, ..heavy },
        Entry::local("b.fleet.test.", b.addr.port()),
    ]);
    eventually("the new weight is taken", || {
        weights(&r) == sorted(vec![(a.url(), 2), (b.url(), 2)])
    })
    .await;
    r.shutdown().await;
}
