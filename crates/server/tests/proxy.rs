//! Proxy behaviour over real sockets: streaming, cancellation, retries, bad inputs, HTTP/2.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use support::*;

#[tokio::test]
async fn streaming_is_incremental_and_byte_exact() {
    let up = Upstream::start("s", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let mut sender = connect(r.local_addr()).await;
    let req = request(
        Method::POST,
        "/v1/chat/completions",
        &[("x-test-stream", "1"), ("x-test-chunks", "6")],
        r#"{"messages":[{"role":"user","content":"stream"}],"stream":true}"#,
    );
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("head in time")
        .expect("head");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"text/event-stream"[..])
    );
    let mut body = resp.into_body();
    // The upstream sends chunk 0 and then waits for the gate: it arrives before the upstream is done.
    let first = tokio::time::timeout(WAIT, body.frame())
        .await
        .expect("first chunk in time");
    let first = first
        .expect("a frame")
        .expect("no error")
        .into_data()
        .expect("data");
    assert_eq!(first, sse_chunk(0));
    assert_eq!(in_flight(&r, &up.url()), 1, "held while streaming");
    up.open_gate(1);
    let rest = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("rest in time")
        .expect("rest")
        .to_bytes();
    let mut want = Vec::new();
    for i in 1..6 {
        want.extend_from_slice(&sse_chunk(i));
    }
    assert_eq!(rest, Bytes::from(want), "byte-exact");
    eventually("in-flight released", || in_flight(&r, &up.url()) == 0).await;
    r.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_and_releases_in_flight() {
    let up = Upstream::start("s", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    {
        let mut sender = connect(r.local_addr()).await;
        let req = request(
            Method::POST,
            "/v1/completions",
            &[("x-test-stream", "1"), ("x-test-chunks", "1000")],
            r#"{"prompt":"long stream","stream":true}"#,
        );
        let resp = sender.send_request(req).await.expect("head");
        let mut body = resp.into_body();
        let first = body
            .frame()
            .await
            .expect("frame")
            .expect("ok")
            .into_data()
            .expect("data");
        assert_eq!(first, sse_chunk(0));
        assert_eq!(in_flight(&r, &up.url()), 1);
        up.open_gate(1);
        // Dropping the body and the sender closes the client connection mid-stream.
    }
    eventually("upstream saw the cancellation", || up.cancelled() == 1).await;
    eventually("in-flight back to zero", || in_flight(&r, &up.url()) == 0).await;

    // Disconnect while the instance has not answered yet (request held upstream).
    {
        let mut sender = connect(r.local_addr()).await;
        let req = request(
            Method::POST,
            "/v1/completions",
            &[("x-test-hold", "1")],
            r#"{"prompt":"held"}"#,
        );
        let pending = tokio::spawn(async move { sender.send_request(req).await.map(|_| ()) });
        up.wait_held(1).await;
        assert_eq!(in_flight(&r, &up.url()), 1);
        pending.abort();
    }
    eventually("in-flight released after an early disconnect", || {
        in_flight(&r, &up.url()) == 0
    })
    .await;
    eventually("the held upstream request was cancelled too", || {
        up.cancelled() == 2
    })
    .await;
    up.release(1);
    r.shutdown().await;
}

/// A client that leaves while its stream waits on the engine (nothing more to write) cancels
/// the request then, not when the next token would have been written.
#[tokio::test]
async fn a_client_leaving_while_its_stream_waits_is_noticed_before_the_next_token() {
    let up = Upstream::start("s", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    {
        let mut sender = connect(r.local_addr()).await;
        let req = request(
            Method::POST,
            "/v1/completions",
            &[("x-test-stream", "1"), ("x-test-chunks", "1000")],
            r#"{"prompt":"waiting stream","stream":true}"#,
        );
        let resp = sender.send_request(req).await.expect("head");
        let mut body = resp.into_body();
        let first = body.frame().await.expect("frame").expect("ok");
        assert_eq!(first.into_data().ok(), Some(sse_chunk(0)));
        assert_eq!(in_flight(&r, &up.url()), 1);
        // The gate stays shut: no further token comes while the client leaves.
    }
    // The stand-in notices only when it next writes; the router's count shows the release.
    eventually("in-flight back to zero", || in_flight(&r, &up.url()) == 0).await;
    up.open_gate(1);
    r.shutdown().await;
}

#[tokio::test]
async fn dead_instance_is_retried_elsewhere_without_client_error() {
    let dead = dead_url().await;
    let up = Upstream::start("alive", Mode::Echo, &[]).await;
    let mut s = settings(&[dead.clone(), up.url()]);
    s.health.passive_failures = 1000; // keep it in the fleet: every request may try it first
    let r = router(s).await;
    for i in 0..12 {
        let a = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"p{i}"}}"#),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "request {i}");
        assert_eq!(a.upstream(), "alive");
    }
    let metrics = send(r.local_addr(), request(Method::GET, "/metrics", &[], "")).await;
    let text = String::from_utf8_lossy(&metrics.body).to_string();
    assert!(
        text.contains("prefix_router_retries_total{reason=\"connect\"}"),
        "{text}"
    );
    assert_eq!(total_in_flight(&r), 0);
    r.shutdown().await;
}

#[tokio::test]
async fn status_503_and_429_are_retried_then_passed_through() {
    let busy = Upstream::start("busy", Mode::Status(503), &[]).await;
    let ok = Upstream::start("ok", Mode::Echo, &[]).await;
    let mut s = settings(&[busy.url(), ok.url()]);
    s.health.passive_failures = 1000;
    let r = router(s).await;
    for i in 0..8 {
        let a = post(
            r.local_addr(),
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"q{i}"}}"#),
        )
        .await;
        assert_eq!((a.status, a.upstream()), (StatusCode::OK, "ok".to_string()));
    }
    ok.set_mode(Mode::Status(429));
    let a = post(r.local_addr(), "/v1/completions", &[], r#"{"prompt":"x"}"#).await;
    assert!(
        a.status == StatusCode::SERVICE_UNAVAILABLE || a.status == StatusCode::TOO_MANY_REQUESTS
    );
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("status"),
        "the instance's own answer"
    );
    assert_eq!(total_in_flight(&r), 0);
    r.shutdown().await;
}

#[tokio::test]
async fn bad_inputs_get_openai_errors_naming_the_problem() {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let mut s = settings(&[up.url()]);
    s.limits.max_body_bytes = 4096;
    let r = router(s).await;
    let addr = r.local_addr();
    let chat = "/v1/chat/completions";
    let long_group = "a".repeat(65);
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<u8>,
        StatusCode,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            chat,
            vec![],
            b"{not json".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "JSON",
        ),
        (
            chat,
            vec![],
            br#"{"messages":"hi"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_type",
            "messages",
        ),
        (
            chat,
            vec![],
            br#"{"messages":[{"role":1,"content":"x"}]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_type",
            "role",
        ),
        (
            chat,
            vec![],
            br#"{"model":3,"messages":[]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_type",
            "model",
        ),
        (
            chat,
            vec![],
            br#"{"model":"m"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "missing_field",
            "messages",
        ),
        (
            "/v1/completions",
            vec![],
            br#"{"model":"m"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "missing_field",
            "prompt",
        ),
        (
            chat,
            vec![],
            b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "JSON",
        ),
        (
            chat,
            vec![],
            br#"{"messages":[],"prompt_cache_key":""}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_group_id",
            "group",
        ),
        (
            "/invocations",
            vec![("x-prefix-aware-id", "")],
            b"x".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_group_id",
            "x-prefix-aware-id",
        ),
        (
            "/invocations",
            vec![("x-prefix-aware-id", &long_group)],
            b"x".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_group_id",
            "64",
        ),
        (
            "/invocations",
            vec![("x-prefix-aware-id", "t\tab")],
            b"x".to_vec(),
            StatusCode::BAD_REQUEST,
            "invalid_group_id",
            "printable",
        ),
        (
            chat,
            vec![],
            vec![b' '; 5000],
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "4096",
        ),
        (
            "/nope",
            vec![],
            b"{}".to_vec(),
            StatusCode::NOT_FOUND,
            "unknown_route",
            "/nope",
        ),
    ];
    for (path, headers, body, status, code, mention) in cases {
        let a = post(addr, path, &headers, body.clone()).await;
        assert_eq!(
            a.status,
            status,
            "{path} {}",
            String::from_utf8_lossy(&body[..body.len().min(60)])
        );
        assert_eq!(a.error_code(), code, "{path}");
        let msg = a.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains(mention),
            "message '{msg}' should mention '{mention}'"
        );
    }
    // Non-ASCII group header bytes (obs-text).
    let mut req = request(Method::POST, "/invocations", &[], "x");
    req.headers_mut().insert(
        "x-prefix-aware-id",
        http::HeaderValue::from_bytes(b"caf\xe9").expect("obs-text"),
    );
    let a = send(addr, req).await;
    assert_eq!(
        (a.status, a.error_code()),
        (StatusCode::BAD_REQUEST, "invalid_group_id".into())
    );
    for (method, path) in [
        (Method::GET, "/v1/chat/completions"),
        (Method::PUT, "/invocations"),
        (Method::POST, "/health"),
        (Method::DELETE, "/v1/models"),
    ] {
        let a = send(addr, request(method.clone(), path, &[], "")).await;
        assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(a.error_code(), "method_not_allowed");
    }
    // A large declared body streamed slowly is still refused once it passes the limit.
    let big = Full::new(Bytes::from(vec![b'x'; 10_000]));
    let mut req = request(Method::POST, "/invocations", &[], "");
    *req.body_mut() = big;
    assert_eq!(send(addr, req).await.status, StatusCode::PAYLOAD_TOO_LARGE);
    // The router keeps serving everyone else.
    let ok = post(
        addr,
        chat,
        &[],
        r#"{"messages":[{"role":"user","content":"fine"}]}"#,
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(up.hits(), 1, "no bad request reached the instance");
    r.shutdown().await;
}

#[tokio::test]
async fn health_ready_ping_and_no_instance() {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let addr = r.local_addr();
    for path in ["/health", "/ready", "/ping"] {
        assert_eq!(
            send(addr, request(Method::GET, path, &[], "")).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
    r.state().fleet.set_members(Vec::new());
    assert_eq!(
        send(addr, request(Method::GET, "/health", &[], ""))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(addr, request(Method::GET, "/ready", &[], ""))
            .await
            .status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let a = post(addr, "/v1/completions", &[], r#"{"prompt":"x"}"#).await;
    assert_eq!(
        (a.status, a.error_code()),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no_healthy_instance".into()
        )
    );
    r.shutdown().await;
}

/// An HTTP/2 (prior knowledge) connection to `addr`.
async fn h2_client(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(executor(), hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    sender
}

/// A router in front of an engine that streams without end, with a 300 ms write limit, and an
/// HTTP/2 connection to it whose first stream's answer is never read: the stream's window
/// closes, so hyper stops asking the relay for more while the connection stays healthy.
/// Returns once the router let go of the engine's answer.
async fn stalled_h2_stream() -> (
    prefix_router_server::RunningRouter,
    hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    hyper::body::Incoming,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let (gone, asked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let url = endless_engine(Arc::clone(&gone), Arc::clone(&asked)).await;
    let mut s = settings(&[url]);
    s.timeouts.client_write = Duration::from_millis(300);
    let r = router(s).await;
    let mut sender = h2_client(r.local_addr()).await;
    let mut req = request(
        Method::POST,
        "http://router.test/v1/chat/completions",
        &[],
        chat("a long answer"),
    );
    req.headers_mut().remove("host");
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("in time")
        .expect("response");
    eventually("the engine was asked", || asked.load(Ordering::SeqCst)).await;
    eventually("the router let go of the engine's answer", || {
        gone.load(Ordering::SeqCst)
    })
    .await;
    eventually("no request left in flight", || total_in_flight(&r) == 0).await;
    (r, sender, resp.into_body())
}

fn write_timeouts(page: &str) -> (f64, f64) {
    let reason = [("reason", "write_timeout")];
    (
        metric(page, "prefix_router_client_streams_reset_total", &reason),
        metric(
            page,
            "prefix_router_client_connections_closed_total",
            &reason,
        ),
    )
}

#[tokio::test]
async fn an_http2_stream_the_client_stops_reading_is_cancelled_and_its_connection_kept() {
    let (r, mut sender, mut stalled) = stalled_h2_stream().await;
    // The connection still serves.
    let mut health = request(Method::GET, "http://router.test/health", &[], "");
    health.headers_mut().remove("host");
    let ok = tokio::time::timeout(WAIT, sender.send_request(health))
        .await
        .expect("in time")
        .expect("the connection was kept");
    assert_eq!(ok.status(), StatusCode::OK);
    // Read again (the window opens): the stalled stream ends in an error (a reset), never
    // as a whole answer.
    let rest = tokio::time::timeout(WAIT, async {
        loop {
            match stalled.frame().await {
                Some(Ok(_)) => continue,
                Some(Err(_)) => return true,
                None => return false,
            }
        }
    })
    .await
    .expect("the stalled stream ends");
    assert!(rest, "the cut answer must not end as a whole one");
    let page = metrics_text(r.local_addr()).await;
    assert_eq!(write_timeouts(&page), (1.0, 0.0), "{page}");
    r.shutdown().await;
}

#[tokio::test]
async fn an_http2_client_that_never_reads_its_cancelled_stream_loses_the_connection() {
    let (r, mut sender, stalled) = stalled_h2_stream().await;
    // hyper can only reset the stream once the client opens its window: a client that never
    // does would hold the stream, and the connection, for good.
    let addr = r.local_addr();
    let mut page = String::new();
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            page = metrics_text(addr).await;
            if write_timeouts(&page).1 >= 1.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection was not closed: {page}");
    assert_eq!(write_timeouts(&page), (1.0, 1.0), "{page}");
    let mut health = request(Method::GET, "http://router.test/health", &[], "");
    health.headers_mut().remove("host");
    assert!(sender.send_request(health).await.is_err());
    drop(stalled);
    r.shutdown().await;
}

#[tokio::test]
async fn http2_clients_are_served() {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let mut sender = h2_client(r.local_addr()).await;
    let mut req = request(
        Method::POST,
        "http://router.test/v1/completions",
        &[],
        r#"{"prompt":"over h2"}"#,
    );
    req.headers_mut().remove("host");
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    // The instance's headers reach an HTTP/2 client as a map (they travel as HTTP/1 lines
    // inside the router), with the routing headers.
    let h = resp.headers();
    assert_eq!(h["x-upstream"], "u");
    assert!(h.contains_key("x-prefix-router-instance"), "{h:?}");
    assert!(h.contains_key("x-prefix-router-decision"), "{h:?}");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body.as_ref(), br#"{"prompt":"over h2"}"#);
    r.shutdown().await;
}

#[tokio::test]
async fn idle_upstream_stream_is_cut_and_released() {
    let up = Upstream::start("s", Mode::Echo, &[]).await;
    let mut s = settings(&[up.url()]);
    s.timeouts.idle_stream = Duration::from_millis(100);
    let r = router(s).await;
    let mut sender = connect(r.local_addr()).await;
    let req = request(
        Method::POST,
        "/v1/completions",
        &[("x-test-stream", "1")],
        r#"{"prompt":"idle","stream":true}"#,
    );
    let resp = sender.send_request(req).await.expect("head");
    let mut body = resp.into_body();
    let _first = body.frame().await.expect("frame").expect("ok");
    // The gate stays closed: the stream goes idle and the router ends it with an error event
    // (an SSE client raises it; one that reads to the end does not mistake it for an answer).
    let end = tokio::time::timeout(WAIT, body.collect())
        .await
        .expect("ended in time")
        .expect("a clean end after the error event")
        .to_bytes();
    let text = String::from_utf8_lossy(&end);
    assert!(
        text.starts_with("event: error\ndata: {\"error\":"),
        "{text}"
    );
    assert!(text.contains("\"code\":\"upstream_timeout\""), "{text}");
    assert!(text.ends_with("}\n\n"), "{text}");
    eventually("in-flight released", || in_flight(&r, &up.url()) == 0).await;
    r.shutdown().await;
}

/// vLLM sends a stream's head at once, then queues and prefills: the wait for the first data is
/// bounded by `first_byte`, not by the idle timeout (which cut a request queued 5 minutes).
#[tokio::test]
async fn a_stream_queued_before_its_first_data_waits_first_byte_not_idle() {
    let up = Upstream::start("s", Mode::Echo, &[]).await;
    let mut s = settings(&[up.url()]);
    s.timeouts.idle_stream = Duration::from_millis(100);
    s.timeouts.first_byte = Duration::from_millis(1_500);
    let r = router(s).await;
    let queued = |r: &prefix_router_server::RunningRouter| {
        let addr = r.local_addr();
        async move {
            let mut sender = connect(addr).await;
            let req = request(
                Method::POST,
                "/v1/completions",
                &[
                    ("x-test-stream", "1"),
                    ("x-test-queued", "1"),
                    ("x-test-chunks", "2"),
                ],
                r#"{"prompt":"queued","stream":true}"#,
            );
            let resp = sender.send_request(req).await.expect("head");
            let body = tokio::time::timeout(WAIT, resp.into_body().collect())
                .await
                .expect("ended in time")
                .expect("a clean end")
                .to_bytes();
            String::from_utf8_lossy(&body).to_string()
        }
    };
    // Queued 3 idle timeouts long, then answered: the whole answer, no error event.
    let answer = tokio::spawn(queued(&r));
    tokio::time::sleep(Duration::from_millis(300)).await;
    up.open_gate(2);
    let text = answer.await.expect("answer");
    assert!(!text.contains("event: error"), "{text}");
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
    // Never answered: cut at first_byte with the error event.
    let started = std::time::Instant::now();
    let text = queued(&r).await;
    assert!(text.contains("\"code\":\"upstream_timeout\""), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(1_400),
        "{:?}",
        started.elapsed()
    );
    eventually("in-flight released", || in_flight(&r, &up.url()) == 0).await;
    r.shutdown().await;
}

#[tokio::test]
async fn timeouts_and_dead_fleets_answer_in_the_openai_shape() {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let mut s = settings(&[up.url()]);
    s.timeouts.client_body = Duration::from_millis(100);
    s.timeouts.first_byte = Duration::from_millis(100);
    let r = router(s).await;

    // A client that announces 100 bytes and sends 10: 408.
    let (text, _) = raw(
        r.local_addr(),
        b"POST /v1/completions HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{\"prompt\":",
        |t| t.contains("\r\n\r\n") && t.ends_with("}}"),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"body_timeout\""), "{text}");

    // An instance that does not answer within the first-byte timeout: 504, slot released.
    let a = post(
        r.local_addr(),
        "/v1/completions",
        &[("x-test-hold", "1")],
        r#"{"prompt":"slow"}"#,
    )
    .await;
    assert_eq!(
        (a.status, a.error_code()),
        (StatusCode::GATEWAY_TIMEOUT, "upstream_timeout".into())
    );
    eventually("released after the timeout", || {
        in_flight(&r, &up.url()) == 0
    })
    .await;
    up.release(1);
    r.shutdown().await;

    // Nothing listening anywhere: 502 after the retries.
    let mut s = settings(&[dead_url().await, dead_url().await]);
    s.health.passive_failures = 1000;
    let r = router(s).await;
    let a = post(r.local_addr(), "/v1/completions", &[], r#"{"prompt":"x"}"#).await;
    assert_eq!(
        (a.status, a.error_code()),
        (StatusCode::BAD_GATEWAY, "upstream_connect_error".into())
    );
    assert_eq!(total_in_flight(&r), 0);
    r.shutdown().await;
}

#[tokio::test]
async fn unpaired_surrogates_are_refused_naming_the_field() {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let a = post(
        r.local_addr(),
        "/v1/chat/completions",
        &[],
        r#"{"messages":[{"role":"user","content":"bad \ud800 text"}]}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let msg = a.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("content"), "{msg}");
    r.shutdown().await;
}

#[tokio::test]
async fn http2_streams_are_relayed_incrementally() {
    let up = Upstream::start("s", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let mut sender = h2_client(r.local_addr()).await;
    let mut req = request(
        Method::POST,
        "http://router.test/v1/chat/completions",
        &[("x-test-stream", "1"), ("x-test-chunks", "3")],
        r#"{"messages":[{"role":"user","content":"h2 stream"}],"stream":true}"#,
    );
    req.headers_mut().remove("host");
    let resp = tokio::time::timeout(WAIT, sender.send_request(req))
        .await
        .expect("in time")
        .expect("response");
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(WAIT, body.frame())
        .await
        .expect("first chunk in time")
        .expect("frame")
        .expect("ok")
        .into_data()
        .expect("data");
    assert_eq!(
        first,
        sse_chunk(0),
        "first chunk before the upstream finished"
    );
    up.open_gate(1);
    let rest = body.collect().await.expect("rest").to_bytes();
    assert_eq!(rest, [sse_chunk(1), sse_chunk(2)].concat());
    eventually("released", || in_flight(&r, &up.url()) == 0).await;
    r.shutdown().await;
}

/// An engine that answers every request with a stream of `events` SSE chunks, sent in two
/// writes with a pause between (the first `split` chunks, then the rest with the last chunk).
async fn burst_engine(events: &'static [&'static str], split: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw_engine(move |mut s| async move {
        let mut buf = vec![0u8; 65536];
        let _ = s.read(&mut buf).await;
        let chunk = |e: &str| format!("{:x}\r\n{e}\r\n", e.len());
        let mut first = String::from(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
             transfer-encoding: chunked\r\n\r\n",
        );
        events[..split].iter().for_each(|e| first += &chunk(e));
        let _ = s.write_all(first.as_bytes()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut rest: String = events[split..].iter().map(|e| chunk(e)).collect();
        rest += "0\r\n\r\n";
        let _ = s.write_all(rest.as_bytes()).await;
        let _ = s.read(&mut buf).await;
    })
    .await
}

/// The chunks of a chunked HTTP/1.1 answer read whole from `raw` (head, then chunks).
fn chunks_of(raw: &[u8]) -> Vec<Vec<u8>> {
    let text = raw;
    let head_end = text
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head")
        + 4;
    let (mut rest, mut out) = (&text[head_end..], Vec::new());
    loop {
        let line = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("size line");
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line]).expect("ascii"), 16)
            .expect("hex size");
        if size == 0 {
            return out;
        }
        out.push(rest[line + 2..line + 2 + size].to_vec());
        rest = &rest[line + 2 + size + 2..];
    }
}

#[tokio::test]
async fn stream_chunks_that_arrive_together_leave_together_byte_exact() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const EVENTS: &[&str] = &[
        "data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
        "data: {\"choices\":[{\"text\":\"b\"}]}\n\n",
        "data: {\"choices\":[{\"text\":\"c\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\
         \"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n",
        "data: [DONE]\n\n",
    ];
    let up = burst_engine(EVENTS, 3).await;
    let r = router(settings(&[up])).await;
    let body = r#"{"prompt":"x","stream":true}"#;
    let mut s = tokio::net::TcpStream::connect(r.local_addr())
        .await
        .expect("connect");
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .expect("read");
    let chunks = chunks_of(&raw);
    assert_eq!(chunks.concat(), EVENTS.concat().as_bytes(), "byte exact");
    // Five chunks came in two bursts: each burst went out as one chunk (two, or one if the
    // router was slow enough to read both bursts at once), not five.
    assert!(
        (1..=2).contains(&chunks.len()),
        "{} chunks: {:?}",
        chunks.len(),
        chunks
            .iter()
            .map(|c| String::from_utf8_lossy(c).to_string())
            .collect::<Vec<_>>()
    );
    // The usage in the joined chunks was read: the engine's cached tokens reached the strategy.
    eventually("released", || total_in_flight(&r) == 0).await;
    let labels = [("strategy", "cache-aware")];
    let reported = tokio::time::timeout(WAIT, async {
        loop {
            let page = metrics_text(r.local_addr()).await;
            let v = metric(&page, "prefix_router_reported_cached_tokens_total", &labels);
            if v > 0.0 {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("usage read in time");
    assert_eq!(reported, 2.0);
    r.shutdown().await;
}
