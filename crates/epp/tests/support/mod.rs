//! Shared by the picker's tests: instant mock engines, settings, request bodies and a tiny
//! HTTP/1.1 client. Loopback only.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

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

/// One HTTP/1.1 exchange (`connection: close`): status line and headers, then the raw body.
pub async fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: pool\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("answered in time")
        .expect("read");
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
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
        header(&head, "x-prefix-router-instance")
            .expect("instance header")
            .to_string()
    }
}
