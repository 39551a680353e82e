//! The endpoint picker over real gRPC on 127.0.0.1, driven as Envoy's ext_proc filter drives
//! it, in front of instant mock engines: placement identical to `serve`'s, the header and the
//! metadata, the response path's feedback, subsets, fallbacks, 503/429/400, cancellation and
//! gRPC health. (`tests/envoy.rs` runs a real Envoy.)

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request as Msg, processing_response::Response as Ans, HttpBody,
    HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct};
use prefix_router_epp::wire;
use prefix_router_epp::RunningPicker;
use prefix_router_server::settings::Settings;
use prefix_router_server::Router;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

mod support;
use support::{
    chat, engines, in_flight, metric, metrics, requests_with, settings, until_released, Serve, WAIT,
};

async fn picker(settings: Settings, fallbacks: usize) -> RunningPicker {
    support::start_picker(settings, fallbacks).await
}

async fn client(p: &RunningPicker) -> ExternalProcessorClient<Channel> {
    ExternalProcessorClient::connect(format!("http://{}", p.router.local_addr()))
        .await
        .expect("connects")
}

/// One ext_proc stream: what Envoy sends, and what the picker answers.
struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
}

impl Stream {
    async fn open(c: &mut ExternalProcessorClient<Channel>) -> Self {
        let (tx, rx) = mpsc::channel(8);
        let rx = c
            .process(ReceiverStream::new(rx))
            .await
            .expect("stream opens")
            .into_inner();
        Self { tx, rx }
    }

    async fn send(&mut self, msg: Msg, meta: Option<Metadata>) -> ProcessingResponse {
        self.push(ProcessingRequest {
            request: Some(msg),
            metadata_context: meta,
            ..ProcessingRequest::default()
        })
        .await;
        self.next().await
    }

    /// Sends a message without waiting for an answer (it may get none yet).
    async fn push(&mut self, msg: ProcessingRequest) {
        self.tx.send(msg).await.expect("sent");
    }

    /// The next answer.
    async fn next(&mut self) -> ProcessingResponse {
        tokio::time::timeout(WAIT, self.rx.message())
            .await
            .expect("answered in time")
            .expect("no gRPC error")
            .expect("an answer")
    }
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: (*k).into(),
                    raw_value: v.as_bytes().to_vec(),
                    ..HeaderValue::default()
                })
                .collect(),
        }),
        end_of_stream,
        ..HttpHeaders::default()
    }
}

fn request_head() -> Msg {
    Msg::RequestHeaders(headers(
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
        ],
        false,
    ))
}

fn body(bytes: &[u8], end_of_stream: bool) -> HttpBody {
    HttpBody {
        body: bytes.to_vec(),
        end_of_stream,
        ..HttpBody::default()
    }
}

/// The header the picker set in a request-phase answer, and the same value's metadata.
fn destination(a: &ProcessingResponse) -> (String, String) {
    let common = match a.response.as_ref() {
        Some(Ans::RequestBody(b)) => b.response.clone(),
        Some(Ans::RequestHeaders(h)) => h.response.clone(),
        other => panic!("not a routed answer: {other:?}"),
    }
    .expect("common response");
    let set = common
        .header_mutation
        .expect("a header mutation")
        .set_headers;
    let h = set
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == wire::DESTINATION)
        .expect("destination header");
    let header = String::from_utf8(h.raw_value.clone()).expect("utf8");
    let meta = a.dynamic_metadata.as_ref().expect("dynamic metadata");
    let inner = match meta
        .fields
        .get(wire::LB_NAMESPACE)
        .and_then(|v| v.kind.as_ref())
    {
        Some(Kind::StructValue(s)) => s.clone(),
        other => panic!("envoy.lb: {other:?}"),
    };
    let value = match inner
        .fields
        .get(wire::DESTINATION)
        .and_then(|v| v.kind.as_ref())
    {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("metadata value: {other:?}"),
    };
    (header, value)
}

fn immediate_status(a: &ProcessingResponse) -> (u16, String) {
    match a.response.as_ref() {
        Some(Ans::ImmediateResponse(r)) => (
            r.status.as_ref().map_or(0, |s| s.code as u16),
            String::from_utf8_lossy(&r.body).into_owned(),
        ),
        other => panic!("not an immediate response: {other:?}"),
    }
}

/// Routes `doc` through a fresh stream; returns the destination header value.
async fn pick(c: &mut ExternalProcessorClient<Channel>, doc: usize) -> (Stream, String) {
    let mut s = Stream::open(c).await;
    let a = s.send(request_head(), None).await;
    assert!(matches!(a.response, Some(Ans::RequestHeaders(_))), "{a:?}");
    let a = s
        .send(Msg::RequestBody(body(chat(doc).as_bytes(), true)), None)
        .await;
    let (header, meta) = destination(&a);
    assert_eq!(header, meta, "the header and the metadata must agree");
    (s, header)
}

/// Finishes a routed request as Envoy would relay a streamed answer with usage.
/// Sends a 200 response head of `content_type`; returns the picker's answer to it.
async fn response_head(s: &mut Stream, content_type: &str) -> ProcessingResponse {
    s.send(
        Msg::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", content_type)],
            false,
        )),
        None,
    )
    .await
}

/// A header the picker set on the response in its answer `a` (to the response's head).
fn set_on_response(a: &ProcessingResponse, name: &str) -> Option<String> {
    let Some(Ans::ResponseHeaders(h)) = &a.response else {
        panic!("{a:?}")
    };
    let set = &h.response.as_ref()?.header_mutation.as_ref()?.set_headers;
    set.iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
}

async fn answer(s: &mut Stream, cached: u32) {
    let a = response_head(s, "text/event-stream").await;
    assert!(
        set_on_response(&a, "x-prefix-router-instance").is_some(),
        "{a:?}"
    );
    s.send(
        Msg::ResponseBody(body(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            false,
        )),
        None,
    )
    .await;
    let usage = format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":900,\"completion_tokens\":4,\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}}}}}\n\ndata: [DONE]\n\n"
    );
    s.send(Msg::ResponseBody(body(usage.as_bytes(), true)), None)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_places_requests_where_serve_would() {
    let engines = engines(3).await;
    let p = picker(settings(&engines, "prefix-aware"), 0).await;
    let serve = Router::start(settings(&engines, "prefix-aware"), None)
        .await
        .expect("serve");
    let http = Serve(serve.local_addr());
    let mut c = client(&p).await;
    let mut seen = std::collections::BTreeSet::new();
    for doc in 0..12 {
        let (mut s, endpoint) = pick(&mut c, doc).await;
        let served_by = http.chat(&chat(doc)).await;
        assert_eq!(
            format!("http://{endpoint}"),
            served_by,
            "doc {doc}: the picker and serve disagree"
        );
        seen.insert(endpoint);
        answer(&mut s, 0).await;
    }
    assert!(
        seen.len() >= 2,
        "12 documents all on one instance: {seen:?}"
    );
    assert_eq!(in_flight(&p), 0, "every finished request released its slot");
    let m = metrics(&p).await;
    assert_eq!(requests_with(&m, "ok"), 12.0, "{m}");
    let ttft_count = metric(&m, "prefix_router_ttft_seconds_count", &[]);
    assert_eq!(
        ttft_count, 12.0,
        "TTFT recorded from the response path: {m}"
    );
    serve.shutdown().await;
    p.router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_learns_from_the_response_path_and_a_dropped_stream_is_cancelled() {
    let engines = engines(3).await;
    let p = picker(settings(&engines, "cache-aware"), 0).await;
    let mut c = client(&p).await;
    // The same document twice: the second goes where the first was answered.
    let (mut s, first) = pick(&mut c, 7).await;
    answer(&mut s, 0).await;
    let (mut s, second) = pick(&mut c, 7).await;
    assert_eq!(first, second, "a seen prefix goes back to its instance");
    answer(&mut s, 896).await;
    let m = metrics(&p).await;
    assert!(
        metric(
            &m,
            "prefix_router_decisions_total",
            &[("reason", "cache_hit")]
        ) > 0.0,
        "{m}"
    );
    // Envoy abandons a routed request (the client went away): the slot comes back.
    let (s, _) = pick(&mut c, 8).await;
    assert_eq!(in_flight(&p), 1);
    drop(s);
    until_released(&p, "the slot of an abandoned stream was not released").await;
    let m = metrics(&p).await;
    assert_eq!(requests_with(&m, "cancelled"), 1.0, "{m}");
    p.router.shutdown().await;
}

fn subset_meta(endpoints: &[&str]) -> Metadata {
    let mut meta = Metadata::default();
    meta.filter_metadata.insert(
        wire::SUBSET_NAMESPACE.into(),
        Struct {
            fields: [(wire::SUBSET.to_string(), wire::list(endpoints))]
                .into_iter()
                .collect(),
        },
    );
    meta
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subsets_fallbacks_and_refusals() {
    let engines = engines(3).await;
    let addrs: Vec<String> = engines.iter().map(|e| e.local_addr().to_string()).collect();
    let p = picker(settings(&engines, "prefix-aware"), 2).await;
    let mut c = client(&p).await;

    // Fallbacks: three distinct endpoints, the first where the request goes.
    let (mut s, value) = pick(&mut c, 1).await;
    let list: Vec<&str> = value.split(',').collect();
    assert_eq!(list.len(), 3, "{value}");
    let distinct: std::collections::BTreeSet<&str> = list.iter().copied().collect();
    assert_eq!(distinct.len(), 3, "{value}");
    assert!(
        list.iter().all(|e| addrs.iter().any(|a| a == e)),
        "{value} vs {addrs:?}"
    );
    answer(&mut s, 0).await;

    // The proxy's subset: every pick stays in it.
    for doc in 0..6 {
        let mut s = Stream::open(&mut c).await;
        s.send(request_head(), Some(subset_meta(&[&addrs[2]])))
            .await;
        let a = s
            .send(Msg::RequestBody(body(chat(doc).as_bytes(), true)), None)
            .await;
        let (header, _) = destination(&a);
        assert_eq!(
            header.split(',').next(),
            Some(addrs[2].as_str()),
            "doc {doc}"
        );
    }
    // A subset with no known endpoint: 503.
    let mut s = Stream::open(&mut c).await;
    s.send(request_head(), Some(subset_meta(&["10.9.9.9:80"])))
        .await;
    let a = s
        .send(Msg::RequestBody(body(chat(1).as_bytes(), true)), None)
        .await;
    let (status, text) = immediate_status(&a);
    assert_eq!(status, 503, "{text}");

    // A body that is not JSON: 400 in the OpenAI error shape.
    let mut s = Stream::open(&mut c).await;
    s.send(request_head(), None).await;
    let a = s
        .send(Msg::RequestBody(body(b"{not json", true)), None)
        .await;
    let (status, text) = immediate_status(&a);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("\"error\""), "{text}");

    // A body Envoy streams instead of buffering: refused with the setting to change.
    let mut s = Stream::open(&mut c).await;
    s.send(request_head(), None).await;
    let a = s
        .send(Msg::RequestBody(body(b"{\"model\":", false)), None)
        .await;
    let (status, text) = immediate_status(&a);
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("BUFFERED"), "{text}");
    p.router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_control_sheds_with_429_and_health_answers() {
    let engines = engines(1).await;
    let mut s = settings(&engines, "prefix-aware");
    s.limits.max_in_flight_per_instance = Some(1);
    let p = picker(s, 0).await;
    let mut c = client(&p).await;
    let (held, _) = pick(&mut c, 1).await;
    let mut s = Stream::open(&mut c).await;
    s.send(request_head(), None).await;
    let a = s
        .send(Msg::RequestBody(body(chat(2).as_bytes(), true)), None)
        .await;
    let (status, text) = immediate_status(&a);
    assert_eq!(status, 429, "{text}");
    drop(held);

    // gRPC health, under the names Envoy and Kubernetes probe.
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let channel = Channel::from_shared(format!("http://{}", p.router.local_addr()))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut h = HealthClient::new(channel);
    for service in [
        "",
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{service}: {e}"))
            .into_inner();
        assert_eq!(r.status, 1, "{service}: SERVING");
    }
    p.router.shutdown().await;
}

/// response_body_mode: NONE: the picker sees the response's head, then the stream ends. Envoy
/// closes it, or closes and resets it at once (the reset may come first; here the connection
/// is cut): either way the request is finished, not cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_whose_body_is_not_sent_finishes_when_envoy_ends_the_stream() {
    let engines = engines(1).await;
    let p = picker(settings(&engines, "cache-aware"), 0).await;
    // (body modes Envoy announced, reset rather than closed, then ok and cancelled so far).
    // Without a protocol_config (an older Envoy), a reset after the head may be a client gone
    // from a streamed answer: cancelled.
    let cases = [
        (None, false, 1.0, 0.0),
        (Some((2, 0)), true, 2.0, 0.0),
        (None, true, 2.0, 1.0),
    ];
    for (modes, reset, ok, cancelled) in cases {
        // Each on a connection of its own, through a relay that can cut it: dropping a stream's
        // two halves at once could end its requests' half first (END_STREAM, a clean close)
        // rather than reset it, and the picker then rightly counted the request finished.
        let (relay, cut) = cuttable_relay(p.router.local_addr()).await;
        let mut c = ExternalProcessorClient::connect(format!("http://{relay}"))
            .await
            .expect("connects");
        let mut s = Stream::open(&mut c).await;
        match modes {
            Some((request, response)) => {
                s.push(with_modes(request_head(), request, response)).await;
                let a = s.next().await;
                assert!(matches!(a.response, Some(Ans::RequestHeaders(_))), "{a:?}");
            }
            None => {
                s.send(request_head(), None).await;
            }
        }
        s.send(Msg::RequestBody(body(chat(4).as_bytes(), true)), None)
            .await;
        let a = s
            .send(
                Msg::ResponseHeaders(headers(&[(":status", "200")], false)),
                None,
            )
            .await;
        assert!(matches!(a.response, Some(Ans::ResponseHeaders(_))), "{a:?}");
        if reset {
            // The connection goes: its streams end without a close.
            cut.notify_one();
        } else {
            let Stream { tx, mut rx } = s;
            drop(tx);
            let end = tokio::time::timeout(WAIT, rx.message())
                .await
                .expect("the picker ends the stream");
            assert!(matches!(end, Ok(None)), "{end:?}");
        }
        until_released(&p, "the slot was not released").await;
        let m = metrics(&p).await;
        assert_eq!(
            (requests_with(&m, "ok"), requests_with(&m, "cancelled")),
            (ok, cancelled),
            "modes {modes:?}, reset {reset}: {m}"
        );
    }
    p.router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_bodies_are_collected_then_answered_headers_first_and_handed_back() {
    use envoy_types::pb::envoy::service::ext_proc::v3::{body_mutation, ProtocolConfiguration};
    let engines = engines(2).await;
    let p = picker(settings(&engines, "prefix-aware"), 0).await;
    let mut c = client(&p).await;
    let mut s = Stream::open(&mut c).await;
    // Envoy says the mode with the first message: FULL_DUPLEX_STREAMED (4) for the request.
    s.push(ProcessingRequest {
        request: Some(request_head()),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: 4,
            response_body_mode: 1,
            ..ProtocolConfiguration::default()
        }),
        ..ProcessingRequest::default()
    })
    .await;
    // The body in three chunks (the first two get no answer), then trailers end it.
    let whole = chat(3).into_bytes();
    let third = whole.len() / 3;
    for (i, part) in [
        &whole[..third],
        &whole[third..2 * third],
        &whole[2 * third..],
    ]
    .into_iter()
    .enumerate()
    {
        s.push(ProcessingRequest {
            request: Some(Msg::RequestBody(body(part, false))),
            ..ProcessingRequest::default()
        })
        .await;
        if i < 2 {
            let none = tokio::time::timeout(Duration::from_millis(100), s.rx.message()).await;
            assert!(
                none.is_err(),
                "a chunk before the end was answered: {none:?}"
            );
        }
    }
    s.push(ProcessingRequest {
        request: Some(Msg::RequestTrailers(Default::default())),
        ..ProcessingRequest::default()
    })
    .await;
    // Headers first, with the destination; then the body handed back whole; then trailers.
    let head = s.next().await;
    assert!(
        matches!(head.response, Some(Ans::RequestHeaders(_))),
        "{head:?}"
    );
    let (header, meta) = destination(&head);
    assert_eq!(header, meta);
    let mut back = Vec::new();
    loop {
        let a = s.next().await;
        match a.response {
            Some(Ans::RequestBody(b)) => {
                let m = b
                    .response
                    .and_then(|c| c.body_mutation)
                    .and_then(|m| m.mutation);
                let Some(body_mutation::Mutation::StreamedResponse(chunk)) = m else {
                    panic!("not a streamed body: {m:?}");
                };
                back.extend_from_slice(&chunk.body);
                assert!(
                    !chunk.end_of_stream,
                    "trailers end this body, not its last chunk"
                );
            }
            Some(Ans::RequestTrailers(_)) => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(back, whole, "the body comes back as it was sent");
    p.router.shutdown().await;
}

/// The first message of a stream, with the filter's body modes.
fn with_modes(msg: Msg, request_body_mode: i32, response_body_mode: i32) -> ProcessingRequest {
    use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
    ProcessingRequest {
        request: Some(msg),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode,
            response_body_mode,
            ..ProtocolConfiguration::default()
        }),
        ..ProcessingRequest::default()
    }
}

/// The body a streamed body answer hands back, and its end of stream.
fn handed_back(a: &ProcessingResponse) -> (Vec<u8>, bool) {
    use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation;
    let common = match a.response.as_ref() {
        Some(Ans::RequestBody(b) | Ans::ResponseBody(b)) => b.response.clone(),
        other => panic!("not a body answer: {other:?}"),
    };
    match common
        .and_then(|c| c.body_mutation)
        .and_then(|m| m.mutation)
    {
        Some(body_mutation::Mutation::StreamedResponse(r)) => (r.body, r.end_of_stream),
        other => panic!("not a streamed body: {other:?}"),
    }
}

/// Each body mode as Envoy runs it:
/// - BUFFERED (2) with trailers: the whole body comes with `end_of_stream` false, then the
///   trailers; it is routed on the body (it was refused as if cut);
/// - STREAMED (1): refused at the headers, whatever the body's chunks (a one-chunk body was
///   routed, its destination set after the proxy had chosen the host);
/// - a response body in FULL_DUPLEX_STREAMED (4): each chunk handed back as it came (a plain
///   body answer is a protocol error in that mode, and Envoy keeps no copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_body_mode_is_answered_as_envoy_expects() {
    let engines = engines(2).await;
    let p = picker(settings(&engines, "cache-aware"), 0).await;
    let mut c = client(&p).await;

    let mut s = Stream::open(&mut c).await;
    s.push(with_modes(request_head(), 2, 4)).await;
    let a = s.next().await;
    assert!(matches!(a.response, Some(Ans::RequestHeaders(_))), "{a:?}");
    let routed = s
        .send(Msg::RequestBody(body(chat(1).as_bytes(), false)), None)
        .await;
    let (header, _) = destination(&routed);
    assert!(header.starts_with("127.0.0.1:"), "{header}");
    let t = s.send(Msg::RequestTrailers(Default::default()), None).await;
    assert!(matches!(t.response, Some(Ans::RequestTrailers(_))), "{t:?}");
    let h = s
        .send(
            Msg::ResponseHeaders(headers(&[(":status", "200")], false)),
            None,
        )
        .await;
    assert!(matches!(h.response, Some(Ans::ResponseHeaders(_))), "{h:?}");
    for (chunk, end) in [
        (&b"data: {}\n\n"[..], false),
        (&b"data: [DONE]\n\n"[..], true),
    ] {
        let a = s.send(Msg::ResponseBody(body(chunk, end)), None).await;
        assert_eq!(handed_back(&a), (chunk.to_vec(), end));
    }

    let mut s = Stream::open(&mut c).await;
    s.push(with_modes(request_head(), 1, 1)).await;
    let (status, text) = immediate_status(&s.next().await);
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("BUFFERED or FULL_DUPLEX_STREAMED"), "{text}");
    p.router.shutdown().await;
}

/// Sends a chat body of about `len` bytes as Envoy's BUFFERED mode does (one message) on a new
/// stream; returns the picker's answer to it.
async fn send_buffered(c: &mut ExternalProcessorClient<Channel>, len: usize) -> ProcessingResponse {
    let mut s = Stream::open(c).await;
    s.push(with_modes(request_head(), 2, 0)).await;
    let a = s.next().await;
    assert!(matches!(a.response, Some(Ans::RequestHeaders(_))), "{a:?}");
    let big = serde_json::json!({
        "model": prefix_router_mock_engine::DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "x".repeat(len)}],
    })
    .to_string();
    s.send(Msg::RequestBody(body(big.as_bytes(), true)), None)
        .await
}

/// A BUFFERED body over tonic's default 4 MiB message limit is routed (within
/// `limits.max_body_bytes`, 32 MiB by default): the stream failed, a 500 from Envoy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_body_over_four_mib_is_routed() {
    let engines = engines(2).await;
    let p = picker(settings(&engines, "cache-aware"), 0).await;
    let mut c = client(&p).await;
    let routed = send_buffered(&mut c, 5 << 20).await;
    let (header, _) = destination(&routed);
    assert!(header.starts_with("127.0.0.1:"), "{header}");
    p.router.shutdown().await;
}

/// A BUFFERED body over `limits.max_body_bytes` by more than a MiB is answered 413 like a
/// smaller one: Envoy buffers what its own limit allows (32 MiB in `deploy/envoy`), whatever
/// the router's, and a message over the picker's gRPC limit failed the stream (a 500 from
/// Envoy, for a client's fault).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_body_far_over_the_body_limit_is_a_413() {
    let engines = engines(1).await;
    let mut settings = settings(&engines, "cache-aware");
    settings.limits.max_body_bytes = 64 * 1024;
    let p = picker(settings, 0).await;
    let mut c = client(&p).await;
    let a = send_buffered(&mut c, 3 << 20).await;
    let (status, text) = immediate_status(&a);
    assert_eq!(status, 413, "{text}");
    // The picker goes on: the next request on a new stream is routed.
    let (_, header) = pick(&mut c, 1).await;
    assert!(header.starts_with("127.0.0.1:"), "{header}");
    p.router.shutdown().await;
}

/// A request that continues a stored response (`previous_response_id`), or asks for it by its
/// path, goes where that response was given: the picker reads the response's id from the answer
/// Envoy streams to it, as serve does from the one it relays. Elsewhere an engine answers 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_is_continued_where_it_was_given() {
    let engines = engines(3).await;
    let p = picker(settings(&engines, "cache-aware"), 0).await;
    let mut c = client(&p).await;
    let head = |method: &str, path: &str, end: bool| {
        Msg::RequestHeaders(headers(
            &[
                (":method", method),
                (":path", path),
                ("content-type", "application/json"),
            ],
            end,
        ))
    };
    // The decision the picker names in the answer's headers.
    async fn decision(s: &mut Stream) -> String {
        let a = response_head(s, "application/json").await;
        set_on_response(&a, "x-prefix-router-decision").unwrap_or_default()
    }
    let mut s = Stream::open(&mut c).await;
    s.send(head("POST", "/v1/responses", false), None).await;
    let a = s
        .send(
            Msg::RequestBody(body(br#"{"input":"hello there"}"#, true)),
            None,
        )
        .await;
    let (home, _) = destination(&a);
    assert_ne!(decision(&mut s).await, "stored_response");
    s.send(
        Msg::ResponseBody(body(br#"{"id": "resp_abc","object":"response"}"#, true)),
        None,
    )
    .await;
    for turn in 0..5 {
        let mut s = Stream::open(&mut c).await;
        s.send(head("POST", "/v1/responses", false), None).await;
        let next = format!(r#"{{"input":"turn {turn}","previous_response_id":"resp_abc"}}"#);
        let a = s
            .send(Msg::RequestBody(body(next.as_bytes(), true)), None)
            .await;
        assert_eq!(destination(&a).0, home, "turn {turn}");
        assert_eq!(decision(&mut s).await, "stored_response", "turn {turn}");
    }
    // By its path, with no body to read.
    let mut s = Stream::open(&mut c).await;
    let a = s
        .send(head("GET", "/v1/responses/resp_abc", true), None)
        .await;
    assert_eq!(destination(&a).0, home);
    assert_eq!(decision(&mut s).await, "stored_response");
    p.router.shutdown().await;
}

/// The first body byte is a sample of the time to first token only for an event stream whose
/// chunks Envoy passes on as they come: a JSON answer, a buffered one, and one whose body the
/// picker never sees arrive (or end) after their decode, and cache-aware would learn that as
/// prefill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_answers_streamed_to_the_picker_as_they_come_time_the_first_token() {
    use prefix_router_core::strategies::recording::{Pick, Recording};
    use prefix_router_server::routing::Routing;
    use std::sync::Arc;
    let engines = engines(1).await;
    let p = picker(settings(&engines, "cache-aware"), 0).await;
    let recorder = Arc::new(Recording::new(Pick::First));
    let current = p.router.state().routing.load_full();
    p.router.state().routing.store(Arc::new(Routing {
        config: current.config.clone(),
        prefix_length: current.prefix_length,
        strategy: recorder.clone(),
    }));
    let first_token_streamed = || recorder.first_token_streamed();
    let mut c = client(&p).await;
    let sse = [(":status", "200"), ("content-type", "text/event-stream")];

    // An event stream, chunk by chunk: a sample.
    let (mut s, _) = pick(&mut c, 1).await;
    answer(&mut s, 0).await;
    until_released(&p, "streamed").await;
    assert_eq!(first_token_streamed(), Some(true));

    // A JSON answer: whole.
    let (mut s, _) = pick(&mut c, 2).await;
    let json = [(":status", "200"), ("content-type", "application/json")];
    s.send(Msg::ResponseHeaders(headers(&json, false)), None)
        .await;
    s.send(Msg::ResponseBody(body(b"{\"choices\":[]}", true)), None)
        .await;
    until_released(&p, "json").await;
    assert_eq!(first_token_streamed(), Some(false));

    // (request body mode, response body mode): BUFFERED then NONE.
    for (modes, what) in [((2, 2), "buffered"), ((2, 0), "not sent")] {
        let mut s = Stream::open(&mut c).await;
        s.push(with_modes(request_head(), modes.0, modes.1)).await;
        let a = s.next().await;
        assert!(matches!(a.response, Some(Ans::RequestHeaders(_))), "{a:?}");
        s.send(Msg::RequestBody(body(chat(3).as_bytes(), true)), None)
            .await;
        s.send(Msg::ResponseHeaders(headers(&sse, false)), None)
            .await;
        if modes.1 == 2 {
            s.send(Msg::ResponseBody(body(b"data: [DONE]\n\n", true)), None)
                .await;
        } else {
            // Envoy closes its side once the answer has gone by.
            let Stream { tx, mut rx } = s;
            drop(tx);
            let end = tokio::time::timeout(WAIT, rx.message()).await;
            assert!(matches!(end, Ok(Ok(None))), "{end:?}");
        }
        until_released(&p, what).await;
        assert_eq!(first_token_streamed(), Some(false), "{what}");
    }
    p.router.shutdown().await;
}

/// A TCP relay to `to` for one connection, closed at once (both sockets) when `cut` is notified.
async fn cuttable_relay(
    to: std::net::SocketAddr,
) -> (std::net::SocketAddr, std::sync::Arc<tokio::sync::Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cut = std::sync::Arc::new(tokio::sync::Notify::new());
    let cuts = std::sync::Arc::clone(&cut);
    tokio::spawn(async move {
        let Ok((mut client, _)) = listener.accept().await else {
            return;
        };
        let Ok(mut server) = tokio::net::TcpStream::connect(to).await else {
            return;
        };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
            () = cuts.notified() => {}
        }
    });
    (addr, cut)
}

/// A TCP relay to `to` for one connection: it forwards both ways until `frozen`, then holds
/// both sockets open and moves nothing more (a proxy whose node died without closing them).
async fn freezable_relay(
    to: std::net::SocketAddr,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::net::SocketAddr {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((client, _)) = listener.accept().await else {
            return;
        };
        let Ok(server) = tokio::net::TcpStream::connect(to).await else {
            return;
        };
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        let pipe = |mut r: tokio::net::tcp::OwnedReadHalf,
                    mut w: tokio::net::tcp::OwnedWriteHalf,
                    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>| async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match r.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if frozen.load(Ordering::SeqCst) {
                    // Holds both halves, forwards nothing, closes nothing.
                    let _held = (r, w);
                    std::future::pending::<()>().await;
                    return;
                }
                if w.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        };
        let up = tokio::spawn(pipe(cr, sw, std::sync::Arc::clone(&frozen)));
        let down = tokio::spawn(pipe(sr, cw, frozen));
        let _ = tokio::join!(up, down);
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_a_proxy_that_vanished_without_closing_are_released() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let engines = engines(1).await;
    let p = support::start_picker_with(
        settings(&engines, "cache-aware"),
        prefix_router_epp::PickerOptions {
            keepalive: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .await;
    let frozen = Arc::new(AtomicBool::new(false));
    let relay = freezable_relay(p.router.local_addr(), Arc::clone(&frozen)).await;
    let mut c = ExternalProcessorClient::connect(format!("http://{relay}"))
        .await
        .expect("connects");
    let (s, _) = pick(&mut c, 5).await;
    assert_eq!(in_flight(&p), 1);
    // The proxy's node is gone: no FIN, no RST, nothing more either way. Only the picker's
    // own ping, unanswered, tells it.
    frozen.store(true, Ordering::SeqCst);
    until_released(
        &p,
        "the vanished proxy's request is still counted in flight",
    )
    .await;
    let m = metrics(&p).await;
    assert_eq!(requests_with(&m, "cancelled"), 1.0, "{m}");
    drop(s);
    p.router.shutdown().await;
}

/// The access log has a line per request through the picker, as through `serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_a_line_per_request_through_the_picker() {
    let engines = engines(1).await;
    let d = std::env::temp_dir().join(format!("pr-epp-access-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("dir");
    let path = d.join("access.jsonl");
    let mut s = settings(&engines, "cache-aware");
    s.access_log.path = Some(path.clone());
    let p = picker(s, 0).await;
    let mut c = client(&p).await;
    let (mut s, _) = pick(&mut c, 6).await;
    answer(&mut s, 896).await;
    until_released(&p, "answered").await;
    p.router.shutdown().await;
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 1, "{text}");
    let l = &lines[0];
    assert_eq!(
        l["instance"],
        format!("http://{}", engines[0].local_addr()),
        "{text}"
    );
    assert_eq!(
        (&l["status"], &l["outcome"], &l["attempt"]),
        (
            &serde_json::Value::from(200),
            &serde_json::Value::from("ok"),
            &serde_json::Value::from(0)
        ),
        "{text}"
    );
    assert_eq!(
        (
            &l["prompt_tokens"],
            &l["cached_tokens"],
            &l["output_tokens"]
        ),
        (
            &serde_json::Value::from(900),
            &serde_json::Value::from(896),
            &serde_json::Value::from(4)
        ),
        "{text}"
    );
    assert!(l["ttft_s"].as_f64().is_some(), "{text}");
    assert!(
        l["chain"].as_array().is_some_and(|c| !c.is_empty()),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A model the fleet serves only outside the proxy's subset is an outage of the subset (503,
/// which SDKs retry), not a model nobody serves (404); one nobody serves stays a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_served_only_outside_the_subset_is_a_503() {
    let engines = engines(2).await;
    let addrs: Vec<String> = engines.iter().map(|e| e.local_addr().to_string()).collect();
    let mut s = settings(&engines, "prefix-aware");
    s.instances[0].models = vec!["m1".into()];
    s.instances[1].models = vec!["m2".into()];
    let p = picker(s, 0).await;
    let mut c = client(&p).await;
    for (model, want) in [("m2", 503), ("m9", 404), ("m1", 0)] {
        let mut s = Stream::open(&mut c).await;
        s.send(request_head(), Some(subset_meta(&[&addrs[0]])))
            .await;
        let body_text = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "hello"}],
        })
        .to_string();
        let a = s
            .send(Msg::RequestBody(body(body_text.as_bytes(), true)), None)
            .await;
        if want == 0 {
            let (header, _) = destination(&a);
            assert_eq!(header, addrs[0], "{model}");
        } else {
            let (status, text) = immediate_status(&a);
            assert_eq!(status, want, "{model}: {text}");
        }
    }
    p.router.shutdown().await;
}

/// Envoy's override-host policy past the picker's list serves from any host of the cluster
/// (its `fallback_policy`): the slot and the feedback go to the instance that served, found in
/// the fleet, not left on the one that failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_served_past_the_list_takes_the_slot() {
    let engines = engines(2).await;
    let p = picker(settings(&engines, "prefix-aware"), 0).await;
    let mut c = client(&p).await;
    let (mut s, chosen) = pick(&mut c, 3).await;
    let other = engines
        .iter()
        .map(|e| e.local_addr().to_string())
        .find(|a| *a != chosen)
        .expect("another engine");
    let mut meta = Metadata::default();
    meta.filter_metadata.insert(
        wire::LB_NAMESPACE.into(),
        Struct {
            fields: [(wire::SERVED.to_string(), wire::list(&[&other]))]
                .into_iter()
                .collect(),
        },
    );
    s.send(
        Msg::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
        )),
        Some(meta),
    )
    .await;
    let held = |addr: &str| {
        p.router
            .state()
            .fleet
            .snapshot()
            .instances()
            .iter()
            .find(|i| i.spec().url == format!("http://{addr}"))
            .map_or(u32::MAX, |i| i.in_flight())
    };
    assert_eq!((held(&chosen), held(&other)), (0, 1));
    s.send(Msg::ResponseBody(body(b"data: [DONE]\n\n", true)), None)
        .await;
    until_released(&p, "answered").await;
    let m = metrics(&p).await;
    assert_eq!(
        (requests_with(&m, "ok"), requests_with(&m, "retried")),
        (1.0, 1.0),
        "{m}"
    );
    // Envoy also falls back while it does not know the host yet (a scale-up): nothing is
    // charged to the primary, which may never have been tried.
    assert_eq!(
        metric(
            &m,
            "prefix_router_upstream_errors_total",
            &[("kind", "fallback_used")]
        ),
        0.0,
        "{m}"
    );
    p.router.shutdown().await;
}
