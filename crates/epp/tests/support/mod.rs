//! Shared by the picker's tests: instant mock engines, settings, request bodies and a tiny
//! HTTP/1.1 client. Loopback only.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use prefix_router_epp::RunningPicker;
use prefix_router_mock_engine::{MockEngine, MockEngineConfig, DEFAULT_MODEL};
use prefix_router_server::settings::Settings;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound on every wait.
pub const WAIT: Duration = Duration::from_secs(10);

/// `n` mock engines answering at once.
pub async fn engines(n: usize) -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..n {
        let mut c = MockEngineConfig::from_preset("small").expect("preset");
        c.instant = true;
        out.push(
            MockEngine::bind("127.0.0.1:0".parse().expect("addr"), c)
                .await
                .expect("engine starts"),
        );
    }
    out
}

/// Settings for `engines` with `strategy`, on an ephemeral port.
pub fn settings(engines: &[MockEngine], strategy: &str) -> Settings {
    let urls: Vec<String> = engines
        .iter()
        .map(|e| format!("http://{}", e.local_addr()))
        .collect();
    let mut s = Settings::with_instances(urls).expect("settings");
    s.listen = "127.0.0.1:0".parse().expect("addr");
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named(strategy).expect("registered"),
    );
    s.timeouts.shutdown_grace = Duration::from_secs(1);
    s
}

/// A chat body about document `doc` (1,500 words of it, then a question).
pub fn chat(doc: usize) -> String {
    let context: String = (0..300).map(|w| format!("doc{doc}word{w} ")).collect();
    serde_json::json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": format!("{context} question?")}],
        "max_tokens": 4
    })
    .to_string()
}

/// A chat body as [`chat`], streamed.
pub fn chat_stream(doc: usize) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&chat(doc)).expect("json");
    v["stream"] = serde_json::Value::Bool(true);
    v.to_string()
}

/// Sends `raw` (a whole HTTP/1.1 request with `connection: close`) and reads the answer:
/// status, head (lower case) and raw body. `None` when the connection is refused.
pub async fn exchange(addr: SocketAddr, raw: &str) -> Option<(u16, String, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(raw.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Some((status, head.to_ascii_lowercase(), body.to_string()))
}

/// `POST path` with a JSON body.
pub async fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String, String) {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nhost: pool\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange(addr, &raw).await.expect("the server answers")
}

/// `GET path`; `None` when the connection is refused.
pub async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String, String)> {
    exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
    )
    .await
}

/// The picker's `/metrics` page.
pub async fn metrics(p: &RunningPicker) -> String {
    let addr = p.ops.expect("ops listener");
    get(addr, "/metrics")
        .await
        .expect("the ops listener answers")
        .2
}

/// The sum of a metric's samples whose labels include `labels` (0 when none), read with the
/// project's one Prometheus parser.
pub fn metric(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    prefix_router_server::prom::value(page, name, labels).unwrap_or(0.0)
}

/// Requests the picker counted with `outcome`, over every instance.
pub fn requests_with(page: &str, outcome: &str) -> f64 {
    metric(
        page,
        "prefix_router_requests_total",
        &[("outcome", outcome)],
    )
}

/// Starts a picker on ephemeral loopback ports (gRPC and operations) with `settings`.
pub async fn start_picker(settings: Settings, fallbacks: usize) -> RunningPicker {
    start_picker_with(
        settings,
        prefix_router_epp::PickerOptions {
            fallbacks,
            ..Default::default()
        },
    )
    .await
}

/// [`start_picker`] with its options.
pub async fn start_picker_with(
    settings: Settings,
    options: prefix_router_epp::PickerOptions,
) -> RunningPicker {
    prefix_router_epp::start(
        settings,
        None,
        prefix_router_epp::Listeners {
            grpc: "127.0.0.1:0".parse().expect("addr"),
            ops: Some("127.0.0.1:0".parse().expect("addr")),
        },
        options,
    )
    .await
    .expect("picker starts")
}

/// Waits until the picker holds nothing in flight, or panics saying `what`.
pub async fn until_released(p: &RunningPicker, what: &str) {
    let t = std::time::Instant::now();
    while in_flight(p) != 0 {
        assert!(t.elapsed() < WAIT, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Requests the picker holds in flight, over every instance.
pub fn in_flight(p: &RunningPicker) -> u32 {
    p.router
        .state()
        .fleet
        .snapshot()
        .instances()
        .iter()
        .map(|i| i.in_flight())
        .sum()
}

/// A response header's value (`head` as [`post`] returns it).
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// `serve` at an address: the instance it sends a chat body to.
pub struct Serve(pub SocketAddr);

impl Serve {
    /// Sends `body` and returns the instance that answered (`x-prefix-router-instance`).
    pub async fn chat(&self, body: &str) -> String {
        let (status, head, text) = post(self.0, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{head}{text}");
        header(&head, prefix_router_server::proxy::INSTANCE_HEADER)
            .expect("instance header")
            .to_string()
    }
}
