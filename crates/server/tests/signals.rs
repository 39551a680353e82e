//! Real signals to this test process (its own binary, so no other test sees them): SIGHUP
//! reloads the configuration file, SIGUSR1 only reopens the access log, SIGTERM stops accepting
//! and lets in-flight requests finish (after serving on with health at 503, when delayed).

mod support;

use std::time::Duration;

use http::StatusCode;
use prefix_router_server::run_until_signal;
use prefix_router_server::settings::{ConfigSource, Overrides};
use support::*;

fn signal_self(name: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(std::process::id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name}");
}

/// Runs the router from the file at `path` until it listens on `addr`.
async fn start(
    path: &std::path::Path,
    addr: std::net::SocketAddr,
) -> tokio::task::JoinHandle<Result<(), prefix_router_server::error::ServerError>> {
    let source = ConfigSource {
        path: Some(path.to_path_buf()),
        overrides: Overrides::default(),
    };
    let router = tokio::spawn(run_until_signal(source));
    let up = tokio::time::timeout(WAIT, async {
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(up.is_ok(), "router listening");
    router
}

/// SIGTERM, then waits until `addr` refuses connections.
async fn terminate_and_wait_refused(addr: std::net::SocketAddr) {
    signal_self("TERM");
    let refused = tokio::time::timeout(WAIT, async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(refused.is_ok(), "stopped accepting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_sigterm_drains() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let dir = std::env::temp_dir().join(format!("pr-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("router.toml");
    let log = dir.join("access.jsonl");
    let write = |url: &str| {
        let text = format!(
            "listen = \"{addr}\"\n[health]\nactive = false\n[timeouts]\nshutdown_grace_ms = 5000\n[access_log]\npath = {:?}\n[[instances]]\nurl = \"{url}\"\n",
            log.display().to_string()
        );
        std::fs::write(&path, text).expect("write config");
    };
    write(&a.url());
    let router = start(&path, addr).await;
    assert_eq!(
        post(addr, "/v1/completions", &[], r#"{"prompt":"1"}"#)
            .await
            .upstream(),
        "a"
    );

    write(&b.url());
    signal_self("HUP");
    let moved = tokio::time::timeout(WAIT, async {
        loop {
            if post(addr, "/v1/completions", &[], r#"{"prompt":"2"}"#)
                .await
                .upstream()
                == "b"
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(moved.is_ok(), "SIGHUP applied the new instance list");

    // logrotate: the file moved, then SIGUSR1. The log is reopened; the configuration is not
    // read again (the file now names a, and b stays).
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .count()
    };
    eventually("lines written", || lines(&log) > 0).await;
    write(&a.url());
    let rotated = dir.join("access.jsonl.1");
    std::fs::rename(&log, &rotated).expect("rotate");
    signal_self("USR1");
    let reopened = tokio::time::timeout(WAIT, async {
        loop {
            let served = post(addr, "/v1/completions", &[], r#"{"prompt":"3"}"#).await;
            assert_eq!(
                served.upstream(),
                "b",
                "SIGUSR1 read the configuration again"
            );
            if lines(&log) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(reopened.is_ok(), "SIGUSR1 reopened the access log");

    let held = tokio::spawn(async move {
        post(
            addr,
            "/v1/completions",
            &[("x-test-hold", "1")],
            r#"{"prompt":"h"}"#,
        )
        .await
    });
    b.wait_held(1).await;
    terminate_and_wait_refused(addr).await;
    assert!(!router.is_finished(), "waits for the in-flight request");
    b.release(1);
    assert_eq!(held.await.expect("held").status, StatusCode::OK);
    let ended = tokio::time::timeout(WAIT, router)
        .await
        .expect("router stopped in time");
    assert!(matches!(ended, Ok(Ok(()))));

    // Again (the file names a now), and a second SIGTERM while a request is held: the router
    // stops at once instead of waiting out the grace period.
    let router = start(&path, addr).await;
    let held = tokio::spawn(async move {
        post(
            addr,
            "/v1/completions",
            &[("x-test-hold", "1")],
            r#"{"prompt":"h2"}"#,
        )
        .await
    });
    a.wait_held(1).await;
    terminate_and_wait_refused(addr).await;
    assert!(!router.is_finished(), "waits for the in-flight request");
    signal_self("TERM");
    let ended = tokio::time::timeout(Duration::from_secs(2), router)
        .await
        .expect("a second SIGTERM stops it at once (the grace is 5 s)");
    assert!(matches!(ended, Ok(Ok(()))));
    a.release(1);
    drop(held);

    // With a shutdown delay: on SIGTERM the router serves on, health answering 503, then
    // closes its listener.
    let text = format!(
        "listen = \"{addr}\"\n[health]\nactive = false\n[timeouts]\nshutdown_grace_ms = 5000\nshutdown_delay_ms = 4000\n[[instances]]\nurl = \"{}\"\n",
        a.url()
    );
    std::fs::write(&path, text).expect("write config");
    let router = start(&path, addr).await;
    let get = |p: &'static str| send(addr, request(http::Method::GET, p, &[], ""));
    assert_eq!(get("/health").await.status, StatusCode::OK);
    signal_self("TERM");
    eventually_async("health turns 503", || async {
        get("/health").await.status == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    let ready = get("/ready").await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&ready.body).contains("\"shutting_down\":true"));
    // New connections are still taken and served meanwhile.
    assert_eq!(
        post(addr, "/v1/completions", &[], r#"{"prompt":"4"}"#)
            .await
            .status,
        StatusCode::OK
    );
    assert!(!router.is_finished());
    let refused = tokio::time::timeout(WAIT, async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(refused.is_ok(), "closed its listener after the delay");
    let ended = tokio::time::timeout(WAIT, router)
        .await
        .expect("router stopped in time");
    assert!(matches!(ended, Ok(Ok(()))));
    let _ = std::fs::remove_dir_all(dir);
}
