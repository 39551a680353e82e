//! Discovery over loopback: DNS names resolved into instances, models learnt from `/v1/models`.

mod support;

use std::time::Duration;

use http::StatusCode;
use prefix_router_server::settings::DnsTarget;
use support::*;

#[tokio::test]
async fn dns_names_become_instances() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let mut s = settings(&[]);
    s.discovery.dns = vec![
        DnsTarget {
            name: "localhost".into(),
            port: a.addr.port(),
            interval: Duration::from_millis(50),
            weight: 1,
            models: Vec::new(),
        },
        DnsTarget {
            name: "no-such-host.invalid".into(),
            port: 80,
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

trait Port {
    fn url_port(&self) -> u16;
}

impl Port for std::sync::Arc<prefix_router_core::Instance> {
    fn url_port(&self) -> u16 {
        self.spec()
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }
}

#[tokio::test]
async fn models_are_learnt_from_the_instances() {
    let a = Upstream::start("a", Mode::Echo, &["base", "lora-x"]).await;
    let b = Upstream::start("b", Mode::Echo, &["base"]).await;
    let mut s = settings(&[a.url(), b.url()]);
    s.discovery.models_interval = Some(Duration::from_millis(20));
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
