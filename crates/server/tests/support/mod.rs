//! Test support: in-test engine stand-ins (tiny hyper servers), a router on an ephemeral port,
//! and a small HTTP client. Loopback only.
#![allow(dead_code)]

pub mod chat_body;
pub mod dns;
pub mod kube_api;
pub mod storing;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prefix_router_server::settings::Settings;
use prefix_router_server::{Router, RunningRouter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify, Semaphore};

/// Bound on every wait in the tests.
pub const WAIT: Duration = Duration::from_secs(5);

/// What a stand-in answers to ordinary requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 200, echoing the request body.
    Echo,
    /// This status with an OpenAI-style error body.
    Status(u16),
}

/// A stand-in engine. Request headers steer it:
/// - `x-test-hold: 1`: wait until the test releases it ([`Upstream::release`]);
/// - `x-test-stream: 1`: stream SSE chunks: one at once, the rest after [`Upstream::open_gate`],
///   then every 10 ms until `x-test-chunks` chunks went out (or the reader is gone); with
///   `x-test-queued: 1` the head goes at once and the first chunk too waits for the gate (an
///   engine's queue and prefill, as vLLM streams);
/// - `x-test-abort: 1`: stream one and a half SSE events, then break the connection;
/// - `x-test-usage: P,C`: report usage (`prompt_tokens` P, `cached_tokens` C, which may be
///   `null`): the whole answer when not streaming, an SSE chunk and `[DONE]` after the others
///   when streaming.
pub struct Upstream {
    /// Its address.
    pub addr: SocketAddr,
    /// Its name (sent back in `x-upstream`).
    pub name: String,
    scheme: &'static str,
    shared: Arc<UpShared>,
    task: tokio::task::JoinHandle<()>,
}

struct UpShared {
    name: String,
    mode: Mutex<Mode>,
    models: Vec<String>,
    healthy: AtomicBool,
    hits: AtomicUsize,
    held: AtomicUsize,
    held_changed: Notify,
    release: Semaphore,
    gate: Semaphore,
    cancelled: AtomicUsize,
    finished_streams: AtomicUsize,
    health_checks: AtomicUsize,
    metrics_page: Mutex<String>,
}

/// Un-counts a held request when it ends; counts a cancellation when it was dropped while held.
struct HoldWatch {
    shared: Arc<UpShared>,
    done: bool,
}

impl Drop for HoldWatch {
    fn drop(&mut self) {
        self.shared.held.fetch_sub(1, Ordering::SeqCst);
        if !self.done {
            self.shared.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A body fed from a channel.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

type UpBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn boxed<B: Body<Data = Bytes, Error = Infallible> + Send + Sync + 'static>(b: B) -> UpBody {
    b.map_err(|never| match never {}).boxed()
}

/// One SSE chunk, a pause (so that it goes out), then a broken body (the engine died
/// mid-stream): hyper aborts the connection.
struct AbortBody(bool, Pin<Box<tokio::time::Sleep>>);

impl Body for AbortBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.0 {
            std::task::ready!(self.1.as_mut().poll(cx));
            return Poll::Ready(Some(Err(std::io::Error::other("engine died"))));
        }
        self.0 = true;
        // Half an event: the router must end it before its error event.
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            b"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choi",
        )))))
    }
}

/// An OpenAI-style usage object for `x-test-usage: P,C`.
pub fn usage_json(spec: &str) -> String {
    let (p, c) = spec.split_once(',').unwrap_or((spec, "null"));
    format!(
        r#"{{"prompt_tokens":{p},"completion_tokens":1,"total_tokens":{p},"prompt_tokens_details":{{"cached_tokens":{c}}}}}"#
    )
}

/// The bytes of SSE chunk `i`.
pub fn sse_chunk(i: usize) -> Bytes {
    Bytes::from(format!("data: {{\"chunk\":{i}}}\n\n"))
}

async fn serve_upstream(shared: Arc<UpShared>, req: Request<Incoming>) -> Response<UpBody> {
    let path = req.uri().path().to_string();
    if path == "/health" {
        shared.health_checks.fetch_add(1, Ordering::SeqCst);
        let status = if shared.healthy.load(Ordering::SeqCst) {
            200
        } else {
            503
        };
        let mut r = Response::new(boxed(Full::new(Bytes::from_static(b"{}"))));
        *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        return r;
    }
    if path == "/metrics" {
        let page = shared
            .metrics_page
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        return Response::new(boxed(Full::new(Bytes::from(page))));
    }
    if path == "/v1/models" {
        let data: Vec<_> = shared
            .models
            .iter()
            .map(|m| serde_json::json!({"id": m, "object": "model"}))
            .collect();
        let body = serde_json::json!({"object": "list", "data": data}).to_string();
        return Response::new(boxed(Full::new(Bytes::from(body))));
    }
    shared.hits.fetch_add(1, Ordering::SeqCst);
    let headers = req.headers().clone();
    let usage = headers
        .get("x-test-usage")
        .and_then(|v| v.to_str().ok())
        .map(usage_json);
    let hold = headers.contains_key("x-test-hold");
    let stream = headers.contains_key("x-test-stream");
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    if hold {
        shared.held.fetch_add(1, Ordering::SeqCst);
        shared.held_changed.notify_waiters();
        // Counts a cancellation when the router drops this request while it is held.
        let mut watch = HoldWatch {
            shared: Arc::clone(&shared),
            done: false,
        };
        if let Ok(p) = shared.release.acquire().await {
            p.forget();
        }
        watch.done = true;
    }
    let mode = *shared.mode.lock().unwrap_or_else(|p| p.into_inner());
    if let Mode::Status(code) = mode {
        let mut r = Response::new(boxed(Full::new(Bytes::from(format!(
            "{{\"error\":{{\"message\":\"status {code} from {}\"}}}}",
            shared.name
        )))));
        *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        r.headers_mut().insert(
            "x-upstream",
            shared
                .name
                .parse()
                .unwrap_or(http::HeaderValue::from_static("?")),
        );
        return r;
    }
    let mut resp = if headers.contains_key("x-test-abort") {
        let mut r = Response::new(
            AbortBody(
                false,
                Box::pin(tokio::time::sleep(Duration::from_millis(50))),
            )
            .boxed(),
        );
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("text/event-stream"),
        );
        r
    } else if stream {
        let chunks: usize = headers
            .get("x-test-chunks")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        let queued = headers.contains_key("x-test-queued");
        let (tx, rx) = mpsc::channel(1);
        let s = Arc::clone(&shared);
        tokio::spawn(async move {
            if queued {
                if let Ok(p) = s.gate.acquire().await {
                    p.forget();
                }
            }
            if tx.send(sse_chunk(0)).await.is_err() {
                s.cancelled.fetch_add(1, Ordering::SeqCst);
                return;
            }
            if let Ok(p) = s.gate.acquire().await {
                p.forget();
            }
            for i in 1..chunks {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if tx.send(sse_chunk(i)).await.is_err() {
                    s.cancelled.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
            if let Some(u) = usage {
                let last = format!("data: {{\"choices\":[],\"usage\":{u}}}\n\ndata: [DONE]\n\n");
                if tx.send(Bytes::from(last)).await.is_err() {
                    s.cancelled.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
            s.finished_streams.fetch_add(1, Ordering::SeqCst);
        });
        let mut r = Response::new(boxed(ChannelBody(rx)));
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("text/event-stream"),
        );
        r
    } else if let Some(u) = usage {
        let answer = format!(r#"{{"id":"cmpl-1","choices":[],"usage":{u}}}"#);
        Response::new(boxed(Full::new(Bytes::from(answer))))
    } else {
        Response::new(boxed(Full::new(body)))
    };
    let names: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
    if let Ok(v) = http::HeaderValue::from_str(&names.join(",")) {
        resp.headers_mut().insert("x-received-headers", v);
    }
    resp.headers_mut().insert(
        "x-upstream",
        shared
            .name
            .parse()
            .unwrap_or(http::HeaderValue::from_static("?")),
    );
    resp
}

impl Upstream {
    /// Starts a stand-in on 127.0.0.1 (ephemeral port).
    pub async fn start(name: &str, mode: Mode, models: &[&str]) -> Upstream {
        Self::start_with(name, mode, models, None).await
    }

    /// Starts a stand-in that speaks TLS through `acceptor` (its URL is `https://`).
    pub async fn start_tls(
        name: &str,
        mode: Mode,
        acceptor: tokio_rustls::TlsAcceptor,
    ) -> Upstream {
        Self::start_with(name, mode, &[], Some(acceptor)).await
    }

    async fn start_with(
        name: &str,
        mode: Mode,
        models: &[&str],
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let shared = Arc::new(UpShared {
            name: name.to_string(),
            mode: Mutex::new(mode),
            models: models.iter().map(|m| m.to_string()).collect(),
            healthy: AtomicBool::new(true),
            hits: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            held_changed: Notify::new(),
            release: Semaphore::new(0),
            gate: Semaphore::new(0),
            cancelled: AtomicUsize::new(0),
            finished_streams: AtomicUsize::new(0),
            health_checks: AtomicUsize::new(0),
            metrics_page: Mutex::new(String::new()),
        });
        let scheme = if tls.is_some() { "https" } else { "http" };
        let s = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let s = Arc::clone(&s);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let s = Arc::clone(&s);
                        async move { Ok::<_, Infallible>(serve_upstream(s, req).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            name: name.to_string(),
            scheme,
            shared,
            task,
        }
    }

    /// Base URL.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }
    /// Requests served (excluding health checks and model lists).
    pub fn hits(&self) -> usize {
        self.shared.hits.load(Ordering::SeqCst)
    }
    /// Requests currently held.
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }
    /// Waits until `n` requests are held.
    pub async fn wait_held(&self, n: usize) {
        tokio::time::timeout(WAIT, async {
            loop {
                let notified = self.shared.held_changed.notified();
                if self.held() >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("requests held in time");
    }
    /// Lets `n` held requests answer.
    pub fn release(&self, n: usize) {
        self.shared.release.add_permits(n);
    }
    /// Lets streams go past their first chunk.
    pub fn open_gate(&self, n: usize) {
        self.shared.gate.add_permits(n);
    }
    /// Streams that noticed their reader was gone.
    pub fn cancelled(&self) -> usize {
        self.shared.cancelled.load(Ordering::SeqCst)
    }
    /// Changes how it answers.
    pub fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap_or_else(|p| p.into_inner()) = mode;
    }
    /// Changes what `/health` answers.
    pub fn set_healthy(&self, healthy: bool) {
        self.shared.healthy.store(healthy, Ordering::SeqCst);
    }
    /// Sets the Prometheus page served at `/metrics`.
    pub fn set_metrics(&self, page: &str) {
        *self
            .shared
            .metrics_page
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = page.to_string();
    }
    /// Health checks received.
    pub fn health_checks(&self) -> usize {
        self.shared.health_checks.load(Ordering::SeqCst)
    }
    /// Stops accepting (existing connections keep going until they end).
    pub fn stop(&self) {
        self.task.abort();
    }
}

/// Reads one HTTP/1.1 request from `s` through `buf` (what was read past it stays there, for
/// the next request on a kept connection): its head as sent, and its `content-length` bytes of
/// body. `None` when the peer closes (or the read fails) first.
pub async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Some((head, body))
}

/// An engine on a raw socket, so that a test says exactly what goes on the wire: `serve` runs
/// for each connection it accepts, on a task of its own. Returns its URL.
pub async fn raw_engine<F, Fut>(serve: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(serve(s));
        }
    });
    format!("http://{addr}")
}

/// An engine that streams without end once asked (64 KiB chunks), and says so in `gone` when
/// its connection breaks: the router let go of the answer.
pub async fn endless_engine(gone: Arc<AtomicBool>, asked: Arc<AtomicBool>) -> String {
    raw_engine(move |mut s| {
        let (gone, asked) = (Arc::clone(&gone), Arc::clone(&asked));
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            asked.store(true, Ordering::SeqCst);
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let mut piece = b"10000\r\n".to_vec();
            piece.extend(std::iter::repeat_n(b'x', 0x10000));
            piece.extend_from_slice(b"\r\n");
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            // Bounded: 1 GiB at most, far beyond any socket buffer.
            for _ in 0..16 * 1024 {
                if s.write_all(&piece).await.is_err() {
                    gone.store(true, Ordering::SeqCst);
                    return;
                }
            }
        }
    })
    .await
}

/// A URL on which nothing listens (connection refused), for as long as the test binary runs.
/// The port stays bound to a socket that never listens: a port bound and then released went
/// back to the pool, and a test running beside this one once got it for its own server, so the
/// "dead" instance answered (CI, 2026-12-06: `dead_instance_is_retried_elsewhere_without_client_error`
/// counted no connect retry). A bound port is neither handed out again nor listening.
pub async fn dead_url() -> String {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let addr = socket.local_addr().expect("addr");
    // Held, never listened on, until the process ends.
    std::mem::forget(socket);
    format!("http://{addr}")
}

/// `n` mock engines of the `small` preset running at `time_scale` (wall seconds per engine
/// second), on ephemeral loopback ports.
pub async fn mock_engines(n: usize, time_scale: f64) -> Vec<prefix_router_mock_engine::MockEngine> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let c = prefix_router_mock_engine::MockEngineConfig::from_preset("small")
            .expect("preset")
            .with_time_scale(time_scale);
        out.push(
            prefix_router_mock_engine::MockEngine::bind("127.0.0.1:0".parse().expect("addr"), c)
                .await
                .expect("mock engine starts"),
        );
    }
    out
}

/// Settings for tests: ephemeral loopback port, no active health checks, given instances.
pub fn settings(urls: &[String]) -> Settings {
    let mut s = Settings::with_instances(urls.iter().cloned()).expect("valid settings");
    s.listen = "127.0.0.1:0".parse().expect("addr");
    s.health.active = false;
    s.health.interval = Duration::from_millis(20);
    s.timeouts.shutdown_grace = Duration::from_secs(2);
    s
}

/// Starts a router.
pub async fn router(settings: Settings) -> RunningRouter {
    Router::start(settings, None).await.expect("router starts")
}

/// A finished HTTP exchange.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Whole body.
    pub body: Bytes,
}

impl Answer {
    /// The serving instance's name (`x-upstream`).
    pub fn upstream(&self) -> String {
        self.header("x-upstream")
    }
    /// A header as text ("" when absent).
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    /// `error.code` of an OpenAI-shaped error.
    pub fn error_code(&self) -> String {
        let v = self.json();
        assert!(v["error"]["message"].is_string(), "error shape: {v}");
        assert!(v["error"]["type"].is_string(), "error shape: {v}");
        assert!(v["error"].get("param").is_some(), "error shape: {v}");
        v["error"]["code"].as_str().unwrap_or_default().to_string()
    }
}

/// Opens an HTTP/1.1 connection; returns the request sender.
pub async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect to router");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// Builds a request.
pub fn request(
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    let mut req = Request::new(Full::new(body.into()));
    *req.method_mut() = method;
    *req.uri_mut() = path.parse().expect("path");
    req.headers_mut()
        .insert("host", http::HeaderValue::from_static("router.test"));
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            http::HeaderValue::from_bytes(v.as_bytes()).expect("header value"),
        );
    }
    req
}

/// Sends one request on a fresh connection and reads the whole answer.
pub async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Answer {
    tokio::time::timeout(WAIT, async {
        let mut sender = connect(addr).await;
        let resp = sender.send_request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    })
    .await
    .expect("answer in time")
}

/// POSTs a JSON body.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    send(addr, request(Method::POST, path, headers, body)).await
}

/// A completion request for `prompt` (no extra headers).
pub async fn complete(addr: SocketAddr, prompt: &str) -> Answer {
    let body = serde_json::json!({ "prompt": prompt }).to_string();
    post(addr, "/v1/completions", &[], body).await
}

/// POSTs `body` to `/v1/completions` with `x-test-hold` on its own task: the stand-in holds it
/// until the test releases it ([`Upstream::release`]).
pub fn post_held(addr: SocketAddr, body: &'static str) -> tokio::task::JoinHandle<Answer> {
    tokio::spawn(async move { post(addr, "/v1/completions", &[("x-test-hold", "1")], body).await })
}

/// One echoing stand-in named `u` and a router in front of it with `tweak`ed test settings.
pub async fn echo_router(tweak: impl FnOnce(&mut Settings)) -> (Upstream, RunningRouter) {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let mut s = settings(&[up.url()]);
    tweak(&mut s);
    let r = router(s).await;
    (up, r)
}

/// A chat body whose first message is `text` (padded past the key length when `long`).
pub fn chat(text: &str) -> String {
    serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
}

/// Waits until `cond` holds (polling every 5 ms), or panics naming `what`.
/// A call to the admin API on `addr`, with `token` as its bearer token.
pub async fn admin_call(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    send(addr, request(method, path, &headers, body.to_string())).await
}

/// [`eventually`] for a condition that must be awaited (a request).
pub async fn eventually_async<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let ok = tokio::time::timeout(WAIT, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "timed out waiting for: {what}");
}

pub async fn eventually(what: &str, cond: impl FnMut() -> bool) {
    eventually_for(what, WAIT, cond).await;
}

/// [`eventually`], waiting up to `wait`.
pub async fn eventually_for(what: &str, wait: Duration, mut cond: impl FnMut() -> bool) {
    let ok = tokio::time::timeout(wait, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "timed out waiting for: {what}");
}

/// In-flight count the router holds on the instance with this URL.
pub fn in_flight(router: &RunningRouter, url: &str) -> u32 {
    router
        .state()
        .fleet
        .snapshot()
        .get(url)
        .map(|(_, i)| i.in_flight())
        .unwrap_or(u32::MAX)
}

/// Sum of in-flight counts over the fleet.
pub fn total_in_flight(router: &RunningRouter) -> u32 {
    router
        .state()
        .fleet
        .snapshot()
        .instances()
        .iter()
        .map(|i| i.in_flight())
        .sum()
}

/// Keeps the executor type referenced for HTTP/2 tests.
pub fn executor() -> TokioExecutor {
    TokioExecutor::new()
}

/// The router's `/metrics` page.
pub async fn metrics_text(addr: SocketAddr) -> String {
    let m = send(addr, request(Method::GET, "/metrics", &[], "")).await;
    String::from_utf8_lossy(&m.body).to_string()
}

/// The sum of `name`'s samples with these labels in a `/metrics` page (0 when none), read with
/// the router's own Prometheus parser.
pub fn metric(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    prefix_router_server::prom::value(page, name, labels).unwrap_or(0.0)
}

/// Writes `bytes` on a fresh connection and reads until the peer closes, `done` holds for what
/// was read, or [`WAIT`] passes; returns what was read and whether the peer closed. Writing and
/// reading run at once: the router may answer (413, 431) before a large request is all sent,
/// and a write it refuses is expected then. The connection stays open for writing until the
/// end, so the router never sees the client finish early.
pub async fn raw(addr: SocketAddr, bytes: &[u8], done: impl Fn(&str) -> bool) -> (String, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut rd, mut wr) = TcpStream::connect(addr)
        .await
        .expect("connect")
        .into_split();
    let bytes = bytes.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&bytes).await;
        let _ = wr.flush().await;
        wr
    });
    let mut got = Vec::new();
    let mut closed = false;
    let _ = tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 16384];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    closed = true;
                    break;
                }
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if done(&String::from_utf8_lossy(&got)) {
                        break;
                    }
                }
            }
        }
    })
    .await;
    // The write half (and the connection) closes only now.
    writer.abort();
    drop(writer.await);
    (String::from_utf8_lossy(&got).to_string(), closed)
}

/// Whether a raw HTTP/1.1 answer is complete: a head, and a body as long as its
/// `content-length`.
pub fn complete_answer(text: &str) -> bool {
    let Some(end) = text.find("\r\n\r\n") else {
        return false;
    };
    let head = text[..end].to_ascii_lowercase();
    text.len() >= end + 4 + content_length(&head)
}

/// The JSON body of a raw HTTP/1.1 answer (its first `content-length` bytes: a pipelined
/// answer may follow in the same read).
pub fn raw_json(text: &str) -> serde_json::Value {
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return serde_json::Value::Null;
    };
    let len = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
        })
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(body.len());
    let body = body.get(..len.min(body.len())).unwrap_or(body);
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

/// The port of an instance's URL.
pub trait Port {
    /// The port of the instance's URL (0 when it names none).
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

/// The `content-length` a lowercased answer head announces (0 when it announces none).
pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0)
}
