//! One HTTP request as Envoy's ext_proc filter shows it to the picker: its headers, then its
//! whole body (Envoy buffers it), on which the request is routed exactly as `serve` routes it;
//! then the response's headers and body chunks, which report the request's outcome to the
//! strategy through the same in-flight guard `serve` uses (first token, usage with
//! `cached_tokens`, failures, cancellation when the stream ends early).

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request as Message, HttpBody, HttpHeaders, ProcessingRequest,
    ProcessingResponse,
};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use prefix_router_core::strategies::no_instance;
use prefix_router_core::{FleetSnapshot, Instance};
use prefix_router_server::error::ApiError;
use prefix_router_server::health;
use prefix_router_server::outcome::Outcome;
use prefix_router_server::pick::{candidates, Api, Prepared, Routed};
use prefix_router_server::proxy::{DECISION_HEADER, INSTANCE_HEADER};
use prefix_router_server::state::AppState;
use prefix_router_server::usage::UsageScanner;

use crate::wire::{self, Phase};

/// How the picker answers (from `prefix-router epp`'s flags).
#[derive(Debug, Clone)]
pub struct PickerOptions {
    /// Endpoints named after the primary, in order, for a proxy that tries them on failure
    /// (Envoy's override-host load balancing policy does; an ORIGINAL_DST cluster reads only
    /// one address, so the default is none).
    pub fallbacks: usize,
    /// How often the picker pings a proxy's connection (HTTP/2 PING), and how long it waits
    /// for the answer before closing it. A proxy that vanished without closing (its node
    /// died, a partition) otherwise left every request it had open counted in flight for
    /// good: phantom load for the strategies, and lasting 429s under an in-flight cap.
    pub keepalive: std::time::Duration,
}

impl Default for PickerOptions {
    fn default() -> Self {
        Self {
            fallbacks: 0,
            keepalive: std::time::Duration::from_secs(20),
        }
    }
}

/// Where the request stands.
enum Stage {
    /// Headers seen, body awaited.
    Head {
        api: Api,
        headers: HeaderMap,
        subset: Option<Vec<String>>,
        body: BytesMut,
        /// The path, for a request routed without a body to read (`/v1/responses/{id}` goes
        /// where that response is stored).
        path: Option<String>,
    },
    /// Routed; its answer is awaited or streaming.
    Routed(Box<Answering>),
    /// Answered directly (an error), or finished.
    Over,
}

struct Answering {
    routed: Routed,
    /// Where the request was sent, primary first: endpoint and instance.
    endpoints: Vec<(String, Arc<Instance>)>,
    prepared: Prepared,
    usage: Option<UsageScanner>,
    /// The response's head came back (a stream that ends after it, with no body message, as
    /// `response_body_mode: NONE` ends, is a finished request).
    answered: bool,
    /// A response body message came.
    body_seen: bool,
}

/// One request's exchange with Envoy.
pub struct Exchange {
    state: Arc<AppState>,
    options: PickerOptions,
    received: Instant,
    stage: Stage,
    /// The request's and the response's body modes (`BodySendMode`), when Envoy said
    /// (`protocol_config`, with the first message).
    request_mode: Option<i32>,
    response_mode: Option<i32>,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Envoy's `BodySendMode`: NONE (the body is not sent to the picker).
const NONE: i32 = 0;
/// STREAMED (the headers go upstream before the body is seen).
const STREAMED: i32 = 1;
/// BUFFERED: the whole body in one message, also when trailers end it (its `end_of_stream` is
/// then false).
const BUFFERED: i32 = 2;
/// BUFFERED_PARTIAL: the body may be cut at the buffer's limit.
const BUFFERED_PARTIAL: i32 = 3;
/// FULL_DUPLEX_STREAMED.
const FULL_DUPLEX_STREAMED: i32 = 4;

/// What the picker says of a request body mode it cannot route under.
const NEEDS_WHOLE_BODY: &str = "the endpoint picker needs the whole request body before the request goes upstream: set the ext_proc filter's processing_mode.request_body_mode to BUFFERED or FULL_DUPLEX_STREAMED";
/// The largest body chunk handed back in one message (Envoy recommends at most 64 KiB).
const DUPLEX_CHUNK: usize = 64 * 1024;

/// `host:port` of an instance's URL (the default port of its scheme when it names none): what
/// the proxy connects to.
pub fn endpoint_of(instance: &Instance) -> String {
    let url = &instance.spec().url;
    match url.parse::<http::Uri>() {
        Ok(uri) => {
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let host = uri.host().unwrap_or_default();
            format!("{host}:{port}")
        }
        Err(_) => url.clone(),
    }
}

fn error_answer(e: &ApiError) -> ProcessingResponse {
    let body = serde_json::to_vec(&e.to_json()).unwrap_or_default();
    wire::immediate(e.status.as_u16(), body, e.code)
}

impl Exchange {
    /// A new request's exchange.
    pub fn new(state: Arc<AppState>, options: PickerOptions) -> Self {
        Self {
            state,
            options,
            received: Instant::now(),
            stage: Stage::Over,
            request_mode: None,
            response_mode: None,
        }
    }

    /// The request body comes FULL_DUPLEX_STREAMED: the picker holds the headers' answer until
    /// the body is in, then answers headers and body (which it sends back) in order.
    fn duplex(&self) -> bool {
        self.request_mode == Some(FULL_DUPLEX_STREAMED)
    }

    /// Whether nothing more is expected (Envoy may close the stream).
    pub fn is_over(&self) -> bool {
        matches!(self.stage, Stage::Over)
    }

    /// The answers to one message from Envoy, in order (none for a message answered later).
    pub async fn on(&mut self, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        if let Some(pc) = &msg.protocol_config {
            self.request_mode = Some(pc.request_body_mode);
            self.response_mode = Some(pc.response_body_mode);
        }
        let meta = msg.metadata_context;
        let attributes = msg.attributes;
        let Some(request) = msg.request else {
            return Vec::new();
        };
        match request {
            Message::RequestHeaders(h) => self.request_headers(h, meta.as_ref()).await,
            Message::RequestBody(b) => self.request_body(b).await,
            Message::RequestTrailers(_)
                if self.duplex() && matches!(self.stage, Stage::Head { .. }) =>
            {
                // The body ended with trailers: the whole request is in.
                self.decide_duplex(true).await
            }
            Message::RequestTrailers(_) => vec![wire::answer(
                Phase::RequestTrailers,
                wire::common(Vec::new()),
                None,
            )],
            Message::ResponseHeaders(h) => {
                let served =
                    wire::metadata_strings(meta.as_ref(), wire::LB_NAMESPACE, wire::SERVED)
                        .or_else(|| {
                            wire::attribute_strings(
                                &attributes,
                                wire::ATTRIBUTES_NAMESPACE,
                                wire::UPSTREAM_ADDRESS,
                            )
                        })
                        .and_then(|v| v.into_iter().next());
                vec![self.response_headers(h, served)]
            }
            Message::ResponseBody(b) => vec![self.response_body(b)],
            Message::ResponseTrailers(_) => {
                self.finish();
                vec![wire::answer(
                    Phase::ResponseTrailers,
                    wire::common(Vec::new()),
                    None,
                )]
            }
        }
    }

    async fn request_headers(
        &mut self,
        h: HttpHeaders,
        meta: Option<&Metadata>,
    ) -> Vec<ProcessingResponse> {
        self.received = Instant::now();
        let path = wire::find(h.headers.as_ref(), ":path").unwrap_or(b"/");
        let path = String::from_utf8_lossy(path);
        let path = path.split('?').next().unwrap_or("/");
        // Every request the proxy sends to the pool needs an endpoint: paths serve does not
        // proxy go where `/v1/*` paths without a prompt go.
        let method = wire::find(h.headers.as_ref(), ":method").unwrap_or(b"POST");
        // A keyed path with another method (`GET /v1/responses`) has no body to route on: the
        // engine answers it.
        let api = match Api::of_path(path) {
            Some(Api::Other) | None => Api::Other,
            Some(_) if method != b"POST" => Api::Other,
            Some(api) => api,
        };
        // Only the native API reads a request header (its group id); the others route on the
        // body alone, so their headers are not copied.
        let mut headers = HeaderMap::new();
        if let (Api::Invocations, Some(all)) = (api, h.headers.as_ref()) {
            for hv in all.headers.iter().filter(|h| !h.key.starts_with(':')) {
                if let (Ok(k), Ok(v)) = (
                    HeaderName::from_bytes(hv.key.as_bytes()),
                    HeaderValue::from_bytes(wire::header_value(hv)),
                ) {
                    headers.append(k, v);
                }
            }
        }
        // Only from the proxy's metadata, as the protocol defines it: a client's header of the
        // same name would let any client pick its endpoint.
        let subset = wire::metadata_strings(meta, wire::SUBSET_NAMESPACE, wire::SUBSET);
        self.stage = Stage::Head {
            api,
            headers,
            subset,
            body: BytesMut::new(),
            path: (api == Api::Other).then(|| path.to_owned()),
        };
        if h.end_of_stream {
            return vec![self.decide(Phase::RequestHeaders).await];
        }
        // Under STREAMED the headers go upstream once answered, before the body: a destination
        // set with the body's answer would come after the proxy chose the host, and change
        // nothing. Refused by the mode, not by how the body happens to be cut (a small prompt
        // comes in one chunk that ends the stream).
        if matches!(self.request_mode, Some(STREAMED | BUFFERED_PARTIAL)) {
            self.stage = Stage::Over;
            return vec![error_answer(&ApiError::internal(NEEDS_WHOLE_BODY))];
        }
        if self.duplex() {
            // Answered with the body, once it is all in.
            return Vec::new();
        }
        // The body comes next, whole (the filter's request_body_mode is BUFFERED); the
        // decision goes with the answer to it, while Envoy still holds the headers.
        vec![wire::answer(
            Phase::RequestHeaders,
            wire::common(Vec::new()),
            None,
        )]
    }

    async fn request_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        let limit = self.state.settings.limits.max_body_bytes;
        let Stage::Head { body, .. } = &mut self.stage else {
            return vec![wire::answer(
                Phase::RequestBody,
                wire::common(Vec::new()),
                None,
            )];
        };
        body.extend_from_slice(&b.body);
        if body.len() as u64 > limit {
            self.stage = Stage::Over;
            return vec![error_answer(&ApiError::too_large(limit))];
        }
        if self.duplex() {
            if !b.end_of_stream {
                // More chunks (or trailers) follow: collected, answered at the end.
                return Vec::new();
            }
            return self.decide_duplex(false).await;
        }
        // BUFFERED sends the whole body in one message, with `end_of_stream` false when
        // trailers end the request. Without the mode (an older Envoy), a body that does not end
        // the stream is taken for STREAMED or BUFFERED_PARTIAL: the headers went upstream
        // already, or the body is cut, and neither can be routed on the prompt.
        if !b.end_of_stream && self.request_mode != Some(BUFFERED) {
            self.stage = Stage::Over;
            return vec![error_answer(&ApiError::internal(NEEDS_WHOLE_BODY))];
        }
        vec![self.decide(Phase::RequestBody).await]
    }

    /// FULL_DUPLEX_STREAMED: the whole request is in. Routes it and answers, in order, the
    /// headers (with the destination), the body handed back in chunks of at most 64 KiB (the
    /// picker holds it in this mode), and the trailers when they ended it.
    async fn decide_duplex(&mut self, trailers: bool) -> Vec<ProcessingResponse> {
        let (head, body) = self.decide_on_body(Phase::RequestHeaders).await;
        if !matches!(self.stage, Stage::Routed(_)) {
            return vec![head]; // an immediate answer: nothing goes upstream
        }
        let mut out = vec![head];
        let mut chunks = body.chunks(DUPLEX_CHUNK).peekable();
        if chunks.peek().is_none() {
            out.push(wire::streamed_body(Phase::RequestBody, &[], !trailers));
        }
        while let Some(c) = chunks.next() {
            out.push(wire::streamed_body(
                Phase::RequestBody,
                c,
                !trailers && chunks.peek().is_none(),
            ));
        }
        if trailers {
            out.push(wire::answer(
                Phase::RequestTrailers,
                wire::common(Vec::new()),
                None,
            ));
        }
        out
    }

    /// Routes the request (its whole body is in): the destination header and metadata, or
    /// an immediate error (400 for a bad body, 503 when no endpoint is eligible, 429 when
    /// admission control sheds).
    async fn decide(&mut self, phase: Phase) -> ProcessingResponse {
        self.decide_on_body(phase).await.0
    }

    /// As [`Exchange::decide`], also giving back the body it routed on (full duplex hands it
    /// back to Envoy).
    async fn decide_on_body(&mut self, phase: Phase) -> (ProcessingResponse, bytes::Bytes) {
        let Stage::Head {
            api,
            headers,
            subset,
            body,
            path,
        } = std::mem::replace(&mut self.stage, Stage::Over)
        else {
            let nothing = wire::answer(phase, wire::common(Vec::new()), None);
            return (nothing, bytes::Bytes::new());
        };
        let body = body.freeze();
        match self
            .route(api, &headers, subset.as_deref(), &body, path.as_deref())
            .await
        {
            Ok(answering) => {
                let value = answering
                    .endpoints
                    .iter()
                    .map(|(e, _)| e.as_str())
                    .collect::<Vec<_>>()
                    .join(",");
                let set = vec![wire::set_header(wire::DESTINATION, &value)];
                let out = wire::answer(
                    phase,
                    wire::common(set),
                    Some(wire::destination_metadata(&value)),
                );
                self.stage = Stage::Routed(Box::new(answering));
                (out, body)
            }
            Err(e) => (error_answer(&e), body),
        }
    }

    async fn route(
        &self,
        api: Api,
        headers: &HeaderMap,
        subset: Option<&[String]>,
        body: &bytes::Bytes,
        path: Option<&str>,
    ) -> Result<Answering, ApiError> {
        let state = &self.state;
        let prepared = Prepared::prepare(state, api, headers, body, self.received)
            .await?
            .for_path(path.unwrap_or_default());
        if let Some(p) = &state.prewarm {
            p.record(api, prepared.key, state.now_s(), body);
        }
        let snapshot = state.fleet.snapshot();
        // The proxy's subset: only those endpoints, and 503 when none of them is eligible.
        let snapshot = match subset {
            None => snapshot,
            Some(allowed) => Arc::new(FleetSnapshot::new(
                snapshot
                    .instances()
                    .iter()
                    .filter(|i| allowed.contains(&endpoint_of(i)))
                    .cloned()
                    .collect(),
            )),
        };
        let view = candidates(state, &snapshot, &[], prepared.model.as_deref())?;
        let fleet = view.as_ref().unwrap_or(&snapshot);
        let mut routed = match prepared.route(state, fleet) {
            // Whether the model is served at all is the fleet's to say, not the subset's:
            // served outside it, the subset has an outage (503, which SDKs retry), not a model
            // nobody serves (404).
            Err(e) if subset.is_some() && e.code == "model_not_found" => {
                let fleet = state.fleet.snapshot();
                return Err(no_instance(&fleet, prepared.model.as_deref()).into());
            }
            r => r?,
        };
        if state.access_log.is_some() {
            let line = prepared.log_entry(&routed, 0);
            routed.guard.log_as(line);
        }
        let mut endpoints = vec![(endpoint_of(&routed.instance), Arc::clone(&routed.instance))];
        // A stored response lives on its instance only: any other would answer 404, hiding
        // why that one did not answer.
        if self.options.fallbacks > 0 && !routed.is_pinned() {
            for i in prepared.fallbacks(state, fleet, &routed.instance, self.options.fallbacks) {
                endpoints.push((endpoint_of(&i), i));
            }
        }
        Ok(Answering {
            routed,
            endpoints,
            prepared,
            usage: None,
            answered: false,
            body_seen: false,
        })
    }

    fn response_headers(&mut self, h: HttpHeaders, served: Option<String>) -> ProcessingResponse {
        let Stage::Routed(a) = &mut self.stage else {
            return wire::answer(Phase::ResponseHeaders, wire::common(Vec::new()), None);
        };
        // The proxy went to a fallback: the primary failed this request, and the slot and
        // the strategy's feedback move to the endpoint that answered. That is one the picker
        // named, or, once the proxy's own fallback policy took over past the list (Envoy's
        // override-host `fallback_policy`), any member of the fleet.
        // Past the list, the primary may never have been tried (Envoy falls back too while
        // it does not know the host yet, as during a scale-up): no failure is charged to it.
        if let Some(served) = served {
            if served != a.endpoints[0].0 {
                let named = a.endpoints.iter().position(|(e, _)| *e == served);
                let inst = match named {
                    Some(i) => Some(Arc::clone(&a.endpoints[i].1)),
                    None => {
                        let fleet = self.state.fleet.snapshot();
                        let found = fleet.instances().iter().find(|i| endpoint_of(i) == served);
                        found.cloned()
                    }
                };
                if let Some(inst) = inst {
                    let mut moved = a.prepared.moved_to(&self.state, &a.routed.instance, inst);
                    if self.state.access_log.is_some() {
                        let attempt = named.unwrap_or(a.endpoints.len());
                        let line = a.prepared.log_entry(&moved, attempt as u32);
                        moved.guard.log_as(line);
                    }
                    let mut old = std::mem::replace(&mut a.routed, moved);
                    // One line per request, the served attempt's (as serve writes it).
                    let _ = old.guard.take_log();
                    old.guard.fail(Outcome::Retried);
                    if named.is_some() {
                        // The proxy could not get an answer from it: as serve counts a
                        // connection it could not make.
                        old.guard.upstream_error("fallback_used");
                        health::passive_failure(&self.state, &old.instance, old.guard.stats());
                    }
                }
            }
        }
        let status = wire::find(h.headers.as_ref(), ":status")
            .and_then(|s| std::str::from_utf8(s).ok())
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::BAD_GATEWAY);
        a.answered = true;
        let routed = &mut a.routed;
        // The first body byte is a sample of the time to first token only when the answer
        // streams and Envoy passes its chunks on as they come: a JSON answer's, or a buffered
        // one's, arrives after the whole decode (cache-aware would learn that as prefill).
        let event_stream = wire::find(h.headers.as_ref(), "content-type")
            .is_some_and(prefix_router_server::fields::is_event_stream);
        if !event_stream || matches!(self.response_mode, Some(BUFFERED | BUFFERED_PARTIAL)) {
            routed.guard.unstreamed();
        }
        routed.guard.set_outcome(Outcome::of_status(status));
        routed.guard.set_status(status.as_u16());
        if status.is_server_error() {
            routed.guard.upstream_error("status_5xx");
            health::passive_failure(&self.state, &routed.instance, routed.guard.stats());
        } else {
            health::passive_success(routed.guard.stats());
        }
        if status.is_success()
            && (a.prepared.strategy.reads_usage() || self.state.access_log.is_some())
        {
            a.usage = Some(UsageScanner::new());
        }
        let set = vec![
            wire::set_header(INSTANCE_HEADER, routed.id()),
            wire::set_header(DECISION_HEADER, routed.reason),
        ];
        if h.end_of_stream {
            self.finish();
        }
        wire::answer(Phase::ResponseHeaders, wire::common(set), None)
    }

    fn response_body(&mut self, b: HttpBody) -> ProcessingResponse {
        if let Stage::Routed(a) = &mut self.stage {
            a.body_seen = true;
            if !b.body.is_empty() {
                a.routed.guard.body_data(&b.body);
                if let Some(s) = a.usage.as_mut() {
                    s.feed(&b.body);
                }
            }
            if b.end_of_stream {
                self.finish();
            }
        }
        if self.response_mode == Some(FULL_DUPLEX_STREAMED) {
            // Envoy holds none of it in this mode: every chunk goes back as it came.
            return wire::streamed_body(Phase::ResponseBody, &b.body, b.end_of_stream);
        }
        wire::answer(Phase::ResponseBody, wire::common(Vec::new()), None)
    }

    /// Envoy closed the stream, or it ended otherwise (the exchange is dropped). After the
    /// response's head (the body not sent to the picker), the request is finished; before it,
    /// the guard's drop counts it cancelled.
    pub fn closed(&mut self) {
        // Where the body is sent to the picker, a stream closed before its end is a client gone.
        if self.response_mode.is_some_and(|m| m != NONE) {
            return;
        }
        if let Stage::Routed(a) = &mut self.stage {
            if !a.answered || a.body_seen {
                return;
            }
            // The body went by unseen: this is its end, no sample of the first token's time.
            a.routed.guard.unstreamed();
            a.routed.guard.first_byte();
        }
        self.finish();
    }

    /// The response ended: the guard records it (dropping it releases the slot).
    fn finish(&mut self) {
        if let Stage::Routed(mut a) = std::mem::replace(&mut self.stage, Stage::Over) {
            let usage = a.usage.as_mut().and_then(UsageScanner::finish);
            if let Some(n) = a.usage.as_ref().and_then(UsageScanner::completion_tokens) {
                a.routed.guard.output_tokens(n);
            }
            a.routed.guard.complete(usage);
        }
    }
}

impl Drop for Exchange {
    /// Envoy ends a stream whose last answer it has (`response_body_mode: NONE` after the
    /// response's head) by closing its side and resetting the stream at once: the reset may
    /// come before the close is read, and the stream is then dropped, not closed. It is the
    /// same end.
    fn drop(&mut self) {
        // Only where Envoy said it sends no body: without its protocol_config (an older
        // Envoy), a stream reset after the head may be a client gone from a streamed answer.
        if self.response_mode == Some(NONE) {
            self.closed();
        }
    }
}
