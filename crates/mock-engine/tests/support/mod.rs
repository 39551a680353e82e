//! A tiny HTTP/1 client and engine setups for the integration tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use prefix_router_engine_model::{CostModel, EngineConfig};
use prefix_router_mock_engine::{MockEngine, MockEngineConfig};
use serde_json::Value;
use tokio::net::TcpStream;

/// Every test gives up after this long instead of hanging.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(20);

/// An engine with round numbers: 10 ms per decode step whatever the batch, prefill 0.1 ms per
/// uncached token, no frontend latency.
pub fn engine(capacity_blocks: u32) -> EngineConfig {
    EngineConfig {
        block_tokens: 16,
        kv_capacity_blocks: capacity_blocks,
        max_num_seqs: 16,
        max_batched_tokens: 4096,
        cost: CostModel {
            step_overhead_s: 0.001,
            per_seq_s: 0.0,
            weight_read_s: 0.009,
            linear_s_per_token: 1e-4,
            attention_s_per_pair: 0.0,
            kv_read_s_per_token: 0.0,
            request_overhead_s: 0.0,
        },
    }
}

/// A mock engine on an ephemeral loopback port.
pub async fn start(config: MockEngineConfig) -> MockEngine {
    MockEngine::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config)
        .await
        .expect("start mock engine")
}

/// The default test engine: 1,000 blocks, time scale `scale`.
pub async fn start_default(scale: f64) -> MockEngine {
    start(MockEngineConfig::new(engine(1000)).with_time_scale(scale)).await
}

/// `n` distinct words salted by `salt`.
pub fn words(n: usize, salt: &str) -> String {
    (0..n)
        .map(|i| format!("{salt}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A chat body.
pub fn chat_body(model: &str, text: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": if stream { serde_json::json!({"include_usage": true}) } else { Value::Null },
    })
    .to_string()
}

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: String,
) -> hyper::Response<hyper::body::Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    sender.send_request(req).await.expect("send")
}

/// A whole response: status and body.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: String,
) -> (StatusCode, Bytes) {
    let resp = send(addr, method, path, body).await;
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, body)
}

/// POST and parse the JSON answer.
pub async fn post_json(addr: SocketAddr, path: &str, body: String) -> (StatusCode, Value) {
    let (s, b) = request(addr, "POST", path, body).await;
    let v = serde_json::from_slice(&b).unwrap_or_else(|e| panic!("not JSON ({e}): {b:?}"));
    (s, v)
}

/// GET as text.
pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let (s, b) = request(addr, "GET", path, String::new()).await;
    (s, String::from_utf8_lossy(&b).into_owned())
}

/// A streamed response: SSE `data:` payloads with their arrival times, and whether the body
/// ended cleanly.
pub struct Streamed {
    pub status: StatusCode,
    pub content_type: String,
    pub events: Vec<(Instant, String)>,
    pub clean_end: bool,
}

/// POST and read the SSE stream event by event as it arrives.
pub async fn post_stream(addr: SocketAddr, path: &str, body: String) -> Streamed {
    let resp = send(addr, "POST", path, body).await;
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut body = resp.into_body();
    let mut buf = String::new();
    let mut events = Vec::new();
    let mut clean_end = true;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(_) => {
                clean_end = false;
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let at = Instant::now();
        buf.push_str(std::str::from_utf8(&data).expect("utf-8"));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            // An `event:` line may come first (the Responses API's).
            let payload = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("not an SSE data line: {event:?}"));
            events.push((at, payload.to_owned()));
        }
    }
    assert!(buf.is_empty() || !clean_end, "trailing bytes: {buf:?}");
    Streamed {
        status,
        content_type,
        events,
        clean_end,
    }
}

/// The value of a sample (`name{labels} value`) in a Prometheus text page.
pub fn metric(text: &str, name: &str) -> f64 {
    prefix_router_server::prom::samples(text)
        .find(|s| s.name == name && !s.labels.is_empty())
        .map(|s| s.value)
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

/// `usage.prompt_tokens_details.cached_tokens` of a response.
pub fn cached_tokens(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {v}"))
}
