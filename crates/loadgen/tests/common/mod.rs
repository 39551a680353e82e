//! Tiny OpenAI-style stand-in servers on 127.0.0.1 ephemeral ports, for the load generator's
//! tests. Each answers every request the same configured way and records what it saw.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// How the stand-in answers.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Status of every answer.
    pub status: u16,
    /// Delay before the first content chunk.
    pub first_after: Duration,
    /// Delay (from the request) before the last content chunk.
    pub last_after: Duration,
    /// Content chunks (≥ 1).
    pub chunks: u32,
    /// `(prompt_tokens, completion_tokens, cached_tokens)` of the final usage chunk.
    pub usage: Option<(u64, u64, u64)>,
    /// Extra response headers.
    pub headers: Vec<(&'static str, String)>,
    /// Whether the stream ends with `data: [DONE]`.
    pub done: bool,
    /// Replace every content chunk with this raw event data (for malformed streams).
    pub raw_chunk: Option<&'static str>,
    /// Models listed at `GET /v1/models` (empty: that route answers 404). Not recorded.
    pub models: Vec<&'static str>,
    /// What the stream does after its last event.
    pub after: After,
    /// Ignore `stream: true`: answer one JSON object (`application/json`).
    pub whole: bool,
    /// Send the stream without its `content-type: text/event-stream`.
    pub untyped: bool,
}

/// How a stand-in's stream ends after its last event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Properly (the chunked terminator).
    End,
    /// It stays open for this long, then ends.
    Hang(Duration),
    /// The connection is cut: no terminator.
    Cut,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            status: 200,
            first_after: Duration::ZERO,
            last_after: Duration::ZERO,
            chunks: 3,
            usage: Some((10, 3, 0)),
            headers: Vec::new(),
            done: true,
            raw_chunk: None,
            models: Vec::new(),
            after: After::End,
            whole: false,
            untyped: false,
        }
    }
}

/// What the stand-in saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Requests being answered now.
    pub in_flight: AtomicUsize,
    /// Most requests answered at once.
    pub max_in_flight: AtomicUsize,
    /// Arrival times since the server started, seconds, and request bodies.
    pub requests: Mutex<Vec<(f64, String)>>,
}

impl Seen {
    /// Arrival times, ascending.
    pub fn arrivals(&self) -> Vec<f64> {
        let mut t: Vec<f64> = self
            .requests
            .lock()
            .map(|r| r.iter().map(|x| x.0).collect())
            .unwrap_or_default();
        t.sort_by(f64::total_cmp);
        t
    }

    /// Request bodies as JSON, in arrival order.
    pub fn bodies(&self) -> Vec<serde_json::Value> {
        self.requests
            .lock()
            .map(|r| {
                r.iter()
                    .map(|x| serde_json::from_str(&x.1).unwrap_or(serde_json::Value::Null))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A running stand-in: its base URL and what it saw. It stops when the test's runtime ends.
pub struct StandIn {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Observations.
    pub seen: Arc<Seen>,
}

/// Starts a stand-in answering with `behaviour`.
pub async fn start(behaviour: Behaviour) -> StandIn {
    start_on("127.0.0.1:0", behaviour).await
}

/// Starts a stand-in on `addr`.
pub async fn start_on(addr: &str, behaviour: Behaviour) -> StandIn {
    let listener = TcpListener::bind(addr).await.expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let seen = Arc::new(Seen::default());
    let (b, s) = (Arc::new(behaviour), Arc::clone(&seen));
    let started = Instant::now();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (b, s) = (Arc::clone(&b), Arc::clone(&s));
            tokio::spawn(async move {
                let service =
                    service_fn(move |req| answer(req, Arc::clone(&b), Arc::clone(&s), started));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    StandIn {
        url: format!("http://{addr}"),
        seen,
    }
}

/// An address on 127.0.0.1 where nothing listens, for as long as the test binary runs: the port
/// stays bound to a socket that never listens. Bound and released, it could go to a server of a
/// test running beside this one (the server crate's tests met exactly that).
pub async fn refused_url() -> String {
    let (url, socket) = reserved_url();
    // Held, never listened on, until the process ends.
    std::mem::forget(socket);
    url
}

/// An address on 127.0.0.1 where nothing listens while the returned socket (bound, never
/// listening) is held: drop it just before a server of the test's own binds the address.
pub fn reserved_url() -> (String, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let addr = socket.local_addr().expect("addr");
    (format!("http://{addr}"), socket)
}

/// A response body fed from a channel; an empty chunk cuts the connection (the body fails, so
/// the server ends it without its terminator).
pub struct ChanBody(mpsc::Receiver<Bytes>);

impl Body for ChanBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx).map(|o| {
            o.map(|b| {
                if b.is_empty() {
                    Err(std::io::Error::other("cut"))
                } else {
                    Ok(Frame::data(b))
                }
            })
        })
    }
}

fn event(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

async fn answer(
    req: Request<Incoming>,
    b: Arc<Behaviour>,
    seen: Arc<Seen>,
    started: Instant,
) -> Result<Response<ChanBody>, Infallible> {
    let arrived = Instant::now();
    if req.uri().path() == "/v1/models" {
        let (tx, rx) = mpsc::channel(1);
        let data: Vec<_> = b
            .models
            .iter()
            .map(|m| serde_json::json!({"id": m}))
            .collect();
        let _ = tx
            .send(Bytes::from(
                serde_json::json!({"object": "list", "data": data}).to_string(),
            ))
            .await;
        let status = if b.models.is_empty() { 404 } else { 200 };
        return Ok(Response::builder()
            .status(status)
            .body(ChanBody(rx))
            .expect("response"));
    }
    let body = match req.into_body().collect().await {
        Ok(c) => String::from_utf8_lossy(&c.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    if let Ok(mut r) = seen.requests.lock() {
        r.push((started.elapsed().as_secs_f64(), body));
    }
    let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel(64);
    if b.whole && b.status == 200 {
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        tokio::time::sleep_until((arrived + b.last_after).into()).await;
        let _ = tx
            .send(Bytes::from_static(
                br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}"#,
            ))
            .await;
        drop(tx);
        return Ok(Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(ChanBody(rx))
            .expect("response"));
    }
    let mut resp = Response::builder().status(b.status);
    if !b.untyped {
        resp = resp.header("content-type", "text/event-stream");
    }
    for (k, v) in &b.headers {
        resp = resp.header(*k, v.as_str());
    }
    let resp = resp.body(ChanBody(rx)).expect("response");
    tokio::spawn(async move {
        if b.status != 200 {
            seen.in_flight.fetch_sub(1, Ordering::SeqCst);
            let _ = tx
                .send(Bytes::from_static(b"{\"error\":{\"message\":\"no\"}}"))
                .await;
            return;
        }
        let _ = tx
            .send(event(
                r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            ))
            .await;
        let chunks = b.chunks.max(1);
        for i in 0..chunks {
            let at = if chunks == 1 {
                b.first_after
            } else {
                b.first_after + (b.last_after.saturating_sub(b.first_after)) * i / (chunks - 1)
            };
            tokio::time::sleep_until((arrived + at).into()).await;
            let data = b.raw_chunk.map(str::to_string).unwrap_or_else(|| {
                format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"w{i} "}}}}]}}"#)
            });
            let _ = tx.send(event(&data)).await;
        }
        // Count the request done before its last bytes go out, so the client can never send
        // its next request while this one still counts as in flight.
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut tail = String::new();
        if let Some((p, c, cached)) = b.usage {
            tail.push_str(&format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c},\"total_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}}}}}\n\n",
                p + c
            ));
        }
        if b.done {
            tail.push_str("data: [DONE]\n\n");
        }
        if !tail.is_empty() {
            let _ = tx.send(Bytes::from(tail)).await;
        }
        match b.after {
            After::End => {}
            After::Hang(d) => tokio::time::sleep(d).await,
            After::Cut => {
                // Once the tail is out: hyper drops what it has not written when a body fails.
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(Bytes::new()).await;
            }
        }
    });
    Ok(resp)
}
