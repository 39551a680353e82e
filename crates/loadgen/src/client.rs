//! Sending one request and reading its streamed answer.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE};
use http::{HeaderMap, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::record::{Failure, RequestRecord};
use crate::sse::{parse_chunk, Chunk, SseParser};
use crate::{FailureKind, Target};

/// The headers prefix-router answers with: where it sent the request, and why.
pub use prefix_router_core::wire::{DECISION_HEADER, INSTANCE_HEADER};

/// Largest non-streamed response body read.
const MAX_JSON_BODY: usize = 64 << 20;

/// Largest error body read for a failed request's detail.
const MAX_ERROR_BODY: usize = 4096;

/// Largest `/v1/models` answer read.
const MAX_MODELS_BODY: usize = 1 << 20;

/// How long the target may take to list its models.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle pooled connections are closed after this long.
const POOL_IDLE: Duration = Duration::from_secs(30);

/// How long the rest of a stream is read after `data: [DONE]`: the chunked terminator follows at
/// once from a server that behaves, and reading it leaves the connection reusable; a server that
/// keeps the stream open after it, or cuts it, has still answered completely.
const AFTER_DONE: Duration = Duration::from_millis(100);

/// A pooled HTTP/1.1 client bound to one chat-completions endpoint. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ChatClient {
    client: Client<HttpConnector, Full<Bytes>>,
    endpoint: Uri,
    models: Uri,
    timeout: Duration,
}

/// What a target says at `/v1/models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// The model ids it lists.
    Models(Vec<String>),
    /// Not listening yet, or 503 (a router whose engines are not up yet).
    NotUp,
    /// No list it can say (no such route, another error, not the OpenAI list shape, too slow).
    Nothing,
}

/// What a request is and when it was due, for [`ChatClient::send`].
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    /// Position in the run's request list.
    pub index: usize,
    /// The workload's request id.
    pub id: u64,
    /// When it was due, seconds since the run's start.
    pub due_s: f64,
    /// Sent with `stream: false`.
    pub whole: bool,
}

impl ChatClient {
    /// A client for `target` whose requests each end after at most `timeout`.
    pub fn new(target: &Target, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        ChatClient {
            client,
            endpoint: target.endpoint.clone(),
            models: target.models.clone(),
            timeout,
        }
    }

    /// What the target lists at `/v1/models`.
    pub async fn served_models(&self) -> Listing {
        let Ok(req) = http::Request::get(self.models.clone()).body(Full::new(Bytes::new())) else {
            return Listing::Nothing;
        };
        let answer = async {
            let resp = match self.client.request(req).await {
                Ok(resp) => resp,
                Err(e) if e.is_connect() => return Listing::NotUp,
                Err(_) => return Listing::Nothing,
            };
            if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE {
                return Listing::NotUp;
            }
            if !resp.status().is_success() {
                return Listing::Nothing;
            }
            let Ok(body) = http_body_util::Limited::new(resp.into_body(), MAX_MODELS_BODY)
                .collect()
                .await
            else {
                return Listing::Nothing;
            };
            let ids: Option<Vec<String>> =
                serde_json::from_slice::<serde_json::Value>(&body.to_bytes())
                    .ok()
                    .and_then(|v| {
                        Some(
                            v.get("data")?
                                .as_array()?
                                .iter()
                                .filter_map(|m| m.get("id")?.as_str().map(str::to_string))
                                .collect(),
                        )
                    });
            match ids {
                Some(ids) if !ids.is_empty() => Listing::Models(ids),
                _ => Listing::Nothing,
            }
        };
        tokio::time::timeout(MODELS_TIMEOUT, answer)
            .await
            .unwrap_or(Listing::Nothing)
    }

    /// Sends `body` now and reads the whole answer; `clock` is the run's start. Never fails:
    /// a failure is recorded in the returned record.
    pub async fn send(&self, slot: Slot, body: String, clock: Instant) -> RequestRecord {
        let mut rec = RequestRecord {
            index: slot.index,
            id: slot.id,
            due_s: slot.due_s,
            sent_s: secs(clock),
            first_content_s: None,
            finished_s: 0.0,
            status: None,
            usage: None,
            content_chunks: 0,
            streamed: false,
            asked_whole: slot.whole,
            instance: None,
            decision: None,
            failure: None,
        };
        let result = tokio::time::timeout(self.timeout, self.exchange(body, &mut rec, clock)).await;
        let finished = secs(clock);
        rec.failure = match result {
            Ok(Ok(done_s)) => {
                rec.finished_s = done_s.unwrap_or(finished);
                None
            }
            // `[DONE]` came (read_stream set the end) and only the wait for the stream's own end
            // ran out: the answer is complete.
            Err(_) if rec.finished_s > 0.0 => None,
            Ok(Err(f)) => {
                rec.finished_s = finished;
                Some(f)
            }
            Err(_) => {
                rec.finished_s = finished;
                Some(Failure {
                    kind: FailureKind::Timeout,
                    detail: format!("no complete answer within {:?}", self.timeout),
                })
            }
        };
        rec
    }

    /// Sends and reads; returns when `[DONE]` arrived, if it did.
    async fn exchange(
        &self,
        body: String,
        rec: &mut RequestRecord,
        clock: Instant,
    ) -> Result<Option<f64>, Failure> {
        let req = http::Request::post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| failure(FailureKind::Request, e.to_string()))?;
        rec.sent_s = secs(clock);
        let resp = self.client.request(req).await.map_err(|e| {
            let kind = if e.is_connect() {
                FailureKind::Connect
            } else {
                FailureKind::Request
            };
            failure(kind, chain(&e))
        })?;
        let status = resp.status();
        rec.status = Some(status.as_u16());
        rec.instance = header(resp.headers(), INSTANCE_HEADER);
        rec.decision = header(resp.headers(), DECISION_HEADER);
        if !status.is_success() {
            let said = error_text(resp.into_body()).await;
            let detail = match said {
                Some(text) => format!("HTTP {status}: {text}"),
                None => format!("HTTP {status}"),
            };
            return Err(failure(FailureKind::from_status(status.as_u16()), detail));
        }
        let streamed = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("text/event-stream"));
        let body = resp.into_body();
        rec.streamed = streamed;
        if streamed {
            read_stream(body, rec, clock).await
        } else {
            read_whole(body, rec, clock).await.map(|()| None)
        }
    }
}

/// Reads an SSE body chunk by chunk; returns when `[DONE]` arrived.
async fn read_stream(
    mut body: Incoming,
    rec: &mut RequestRecord,
    clock: Instant,
) -> Result<Option<f64>, Failure> {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut done_s = None;
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return Err(failure(FailureKind::StreamError, chain(&e))),
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        parser.push(&data, &mut events).map_err(malformed)?;
        handle_events(&mut events, rec, &mut done_s, secs(clock))?;
        if let Some(t) = done_s {
            // Anything after [DONE] is not part of the answer, and neither is how the stream
            // ends: a stream held open or cut after it has answered completely.
            rec.finished_s = t;
            let rest = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(AFTER_DONE, rest).await;
            return Ok(Some(t));
        }
    }
    parser.finish(&mut events).map_err(malformed)?;
    handle_events(&mut events, rec, &mut done_s, secs(clock))?;
    match done_s {
        Some(t) => Ok(Some(t)),
        None => Err(failure(
            FailureKind::MalformedStream,
            "stream ended without data: [DONE]".into(),
        )),
    }
}

fn handle_events(
    events: &mut Vec<String>,
    rec: &mut RequestRecord,
    done_s: &mut Option<f64>,
    now_s: f64,
) -> Result<(), Failure> {
    for data in events.drain(..) {
        if done_s.is_some() {
            continue; // anything after [DONE] is not part of the answer
        }
        match parse_chunk(&data).map_err(malformed)? {
            Chunk::Done => *done_s = Some(now_s),
            Chunk::Data {
                content,
                usage,
                error,
            } => {
                if let Some(message) = error {
                    return Err(failure(FailureKind::StreamError, message));
                }
                if content {
                    rec.content_chunks += 1;
                    rec.first_content_s.get_or_insert(now_s);
                }
                if usage.is_some() {
                    rec.usage = usage;
                }
            }
        }
    }
    Ok(())
}

/// Reads a non-streamed JSON answer (a server that ignored `stream: true`).
async fn read_whole(
    mut body: Incoming,
    rec: &mut RequestRecord,
    clock: Instant,
) -> Result<(), Failure> {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| failure(FailureKind::StreamError, chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > MAX_JSON_BODY {
                return Err(failure(
                    FailureKind::MalformedStream,
                    format!("response body over {MAX_JSON_BODY} bytes"),
                ));
            }
            bytes.extend_from_slice(&data);
        }
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| failure(FailureKind::MalformedStream, "body is not UTF-8".into()))?;
    if text.trim_start().starts_with("data:") {
        return Err(failure(
            FailureKind::MalformedStream,
            "the target sent an event stream without `content-type: text/event-stream`, the header bench reads streams by".into(),
        ));
    }
    match parse_chunk(text).map_err(malformed)? {
        Chunk::Done => Err(failure(
            FailureKind::MalformedStream,
            "a bare [DONE] is no answer".into(),
        )),
        Chunk::Data {
            content,
            usage,
            error,
        } => {
            if let Some(message) = error {
                return Err(failure(FailureKind::StreamError, message));
            }
            if content {
                rec.content_chunks = 1;
                rec.first_content_s = Some(secs(clock));
            }
            rec.usage = usage;
            Ok(())
        }
    }
}

/// What a failed answer's body says: the `error.message` of an OpenAI-shaped error (with its
/// `code`), else the start of the body as text.
async fn error_text(body: Incoming) -> Option<String> {
    let bytes = http_body_util::Limited::new(body, MAX_ERROR_BODY)
        .collect()
        .await
        .ok()?
        .to_bytes();
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        let e = v.get("error").unwrap_or(&v);
        let message = e
            .get("message")
            .and_then(|m| m.as_str())
            .or_else(|| e.as_str());
        if let Some(m) = message {
            return Some(match e.get("code").and_then(|c| c.as_str()) {
                Some(code) => format!("{m} ({code})"),
                None => m.to_string(),
            });
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let text: String = text.trim().chars().take(300).collect();
    (!text.is_empty()).then_some(text)
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn failure(kind: FailureKind, detail: String) -> Failure {
    Failure { kind, detail }
}

fn malformed(e: crate::sse::StreamError) -> Failure {
    failure(FailureKind::MalformedStream, e.to_string())
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Seconds since `clock`.
pub(crate) fn secs(clock: Instant) -> f64 {
    clock.elapsed().as_secs_f64()
}
