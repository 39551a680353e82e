//! Faults, slow clients and bad input, over real sockets on 127.0.0.1: each answer is in the
//! OpenAI error shape, says what was wrong, and leaves the router serving.

mod support;

use std::time::Duration;

use http::{Method, StatusCode};
use prefix_router_core::InstanceState;
use support::*;
use tokio::io::AsyncWriteExt;

fn state_of(r: &prefix_router_server::RunningRouter, url: &str) -> Option<InstanceState> {
    let snap = r.state().fleet.snapshot();
    snap.get(url).map(|(_, i)| i.state())
}

#[tokio::test]
async fn a_slow_request_head_is_cut_and_others_are_still_served() {
    let (_up, r) = echo_router(|s| {
        s.timeouts.client_header = Duration::from_millis(150);
        s.limits.max_connections = 4;
    })
    .await;
    let addr = r.local_addr();
    // Four slowloris connections fill max_connections; each is cut after the header timeout,
    // so a real client gets in.
    let slow = (0..4).map(|_| {
        raw(
            addr,
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n",
            |_| false,
        )
    });
    let cut = futures_util::future::join_all(slow).await;
    assert!(
        cut.iter().all(|(text, closed)| *closed && text.is_empty()),
        "{cut:?}"
    );
    let a = post(addr, "/v1/completions", &[], r#"{"prompt":"after"}"#).await;
    assert_eq!(a.status, StatusCode::OK);
    let page = metrics_text(addr).await;
    assert!(
        metric(
            &page,
            "prefix_router_client_connections_closed_total",
            &[("reason", "header_timeout")]
        ) >= 4.0,
        "{page}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_long_stream_is_not() {
    let (up, r) = echo_router(|s| {
        s.timeouts.client_header = Duration::from_millis(100);
        s.timeouts.client_idle = Duration::from_millis(150);
    })
    .await;
    let addr = r.local_addr();

    // One request, then nothing: the connection is closed once idle.
    let body = r#"{"prompt":"x"}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let started = std::time::Instant::now();
    let (text, closed) = raw(addr, req.as_bytes(), |_| false).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(closed, "closed when idle");
    assert!(started.elapsed() < Duration::from_secs(3));

    // A stream that pauses for longer than both limits is relayed whole.
    let mut sender = connect(addr).await;
    let req = request(
        Method::POST,
        "/v1/completions",
        &[("x-test-stream", "1"), ("x-test-chunks", "3")],
        r#"{"prompt":"long","stream":true}"#,
    );
    let resp = sender.send_request(req).await.expect("head");
    tokio::time::sleep(Duration::from_millis(400)).await;
    up.open_gate(1);
    let whole = tokio::time::timeout(WAIT, http_body_util::BodyExt::collect(resp.into_body()))
        .await
        .expect("in time")
        .expect("not cut")
        .to_bytes();
    assert_eq!(
        whole.iter().filter(|&&b| b == b'\n').count(),
        6,
        "three events"
    );
    r.shutdown().await;
}

/// An empty line before a request line is no request's start (RFC 9112, section 2.2: a server
/// should ignore at least one; some clients end a POST body with one). It started the head's
/// timer: a keep-alive connection that sent one after its body was cut as a slow head
/// (`header_timeout`) instead of waiting out `client_idle` for its next request.
#[tokio::test]
async fn an_empty_line_between_requests_is_not_a_slow_head() {
    use tokio::io::AsyncReadExt;
    let (_up, r) = echo_router(|s| {
        s.timeouts.client_header = Duration::from_millis(150);
        s.timeouts.client_idle = Duration::from_secs(5);
    })
    .await;
    let addr = r.local_addr();
    let body = r#"{"prompt":"x"}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // Read one whole answer off `conn`.
    async fn answer(conn: &mut tokio::net::TcpStream) -> String {
        let mut got = Vec::new();
        let read = tokio::time::timeout(WAIT, async {
            while !complete_answer(&String::from_utf8_lossy(&got)) {
                let mut chunk = [0u8; 4096];
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        assert!(read.is_ok(), "answered in time");
        String::from_utf8_lossy(&got).into_owned()
    }
    // The empty line comes with the body, then in a write of its own after the answer; each
    // time the client stays quiet past the head's timeout, then sends its next request.
    conn.write_all(format!("{req}\r\n").as_bytes())
        .await
        .expect("write");
    let first = answer(&mut conn).await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    conn.write_all(req.as_bytes()).await.expect("write");
    let second = answer(&mut conn).await;
    assert!(second.starts_with("HTTP/1.1 200"), "kept open: {second:?}");
    conn.write_all(b"\r\n").await.expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    conn.write_all(req.as_bytes()).await.expect("write");
    let third = answer(&mut conn).await;
    assert!(third.starts_with("HTTP/1.1 200"), "kept open: {third:?}");
    let page = metrics_text(addr).await;
    assert_eq!(
        metric(
            &page,
            "prefix_router_client_connections_closed_total",
            &[("reason", "header_timeout")]
        ),
        0.0,
        "{page}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn one_address_gets_no_more_than_its_connections() {
    let (_up, r) = echo_router(|s| {
        s.limits.max_connections_per_client = Some(2);
    })
    .await;
    let addr = r.local_addr();
    let a = tokio::net::TcpStream::connect(addr).await.expect("first");
    let b = tokio::net::TcpStream::connect(addr).await.expect("second");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let req = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";
    let (text, _) = raw(addr, req, complete_answer).await;
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    assert_eq!(raw_json(&text)["error"]["code"], "too_many_connections");
    drop((a, b));
    eventually_async("a slot is free again", || async {
        raw(addr, req, complete_answer)
            .await
            .0
            .starts_with("HTTP/1.1 200")
    })
    .await;
    r.shutdown().await;
}

#[tokio::test]
async fn an_outage_is_a_503_to_retry_and_an_unknown_model_a_404() {
    let a = Upstream::start("a", Mode::Echo, &["m"]).await;
    let b = Upstream::start("b", Mode::Echo, &["m"]).await;
    let mut s = settings(&[a.url(), b.url()]);
    for (spec, _) in s.instances.iter_mut().zip(0..) {
        spec.models = vec!["m".into()];
    }
    let r = router(s).await;
    let addr = r.local_addr();
    assert_eq!(
        post(addr, "/v1/chat/completions", &[], chat("x"))
            .await
            .status,
        StatusCode::OK
    );
    r.state().fleet.set_state(&a.url(), InstanceState::Ejected);
    r.state().fleet.set_state(&b.url(), InstanceState::Draining);
    let down = post(addr, "/v1/chat/completions", &[], chat("x")).await;
    assert_eq!(
        (down.status, down.error_code(), down.header("retry-after")),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "model_unavailable".into(),
            "5".into()
        )
    );
    let other =
        serde_json::json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]});
    let unknown = post(addr, "/v1/chat/completions", &[], other.to_string()).await;
    assert_eq!(
        (
            unknown.status,
            unknown.error_code(),
            unknown.header("retry-after")
        ),
        (
            StatusCode::NOT_FOUND,
            "model_not_found".into(),
            String::new()
        )
    );
    let v = unknown.json();
    assert_eq!(v["error"]["param"], "model");
    r.state().fleet.set_state(&a.url(), InstanceState::Healthy);
    assert_eq!(
        post(addr, "/v1/chat/completions", &[], chat("x"))
            .await
            .status,
        StatusCode::OK
    );
    r.shutdown().await;
}

#[tokio::test]
async fn instances_take_requests_only_after_a_passed_check_and_ready_follows() {
    let up = Upstream::start("up", Mode::Echo, &[]).await;
    let late = Upstream::start("late", Mode::Echo, &[]).await;
    late.set_healthy(false);
    let mut s = settings(&[up.url(), late.url()]);
    s.health.active = true;
    s.health.interval = Duration::from_millis(50);
    s.health.timeout = Duration::from_millis(500);
    let r = router(s).await;
    let addr = r.local_addr();
    // Checked once before listening: the one that is up takes requests at once.
    assert_eq!(state_of(&r, &up.url()), Some(InstanceState::Healthy));
    assert_eq!(state_of(&r, &late.url()), Some(InstanceState::Unknown));
    let ready = send(addr, request(Method::GET, "/ready", &[], "")).await;
    assert_eq!(
        (ready.status, ready.json()["healthy_instances"].as_u64()),
        (StatusCode::OK, Some(1))
    );
    for i in 0..12 {
        let a = post(
            addr,
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"p{i}"}}"#),
        )
        .await;
        assert_eq!((a.status, a.upstream()), (StatusCode::OK, "up".to_string()));
    }
    assert_eq!(
        late.hits(),
        0,
        "never sent to an instance that has not passed a check"
    );
    late.set_healthy(true);
    eventually("the late instance passes its first check", || {
        state_of(&r, &late.url()) == Some(InstanceState::Healthy)
    })
    .await;
    r.shutdown().await;

    // A router started before any of its engines: not ready, and a 503 to retry (not a 502
    // from refused connections, not ejections).
    let mut s = settings(&[dead_url().await, dead_url().await]);
    s.health.active = true;
    s.health.interval = Duration::from_millis(50);
    let r = router(s).await;
    let addr = r.local_addr();
    let ready = send(addr, request(Method::GET, "/ready", &[], "")).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    let a = post(addr, "/v1/completions", &[], r#"{"prompt":"x"}"#).await;
    assert_eq!(
        (a.status, a.error_code(), a.header("retry-after")),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no_healthy_instance".into(),
            "5".into()
        )
    );
    let page = metrics_text(addr).await;
    assert_eq!(
        metric(&page, "prefix_router_upstream_errors_total", &[]),
        0.0,
        "{page}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn paths_that_escape_v1_are_refused_before_any_engine() {
    let (up, r) = echo_router(|_| {}).await;
    let addr = r.local_addr();
    for path in [
        "/v1/../admin/instances",
        "/v1/%2e%2e/admin/instances",
        "/v1/..%2fadmin/instances",
        "/v1/./models",
    ] {
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        let (text, _) = raw(addr, req.as_bytes(), complete_answer).await;
        assert!(text.starts_with("HTTP/1.1 400"), "{path}: {text}");
        assert_eq!(raw_json(&text)["error"]["code"], "invalid_path", "{path}");
    }
    assert_eq!(up.hits(), 0);
    assert_eq!(
        post(addr, "/v1/completions", &[], r#"{"prompt":"x"}"#)
            .await
            .status,
        StatusCode::OK
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_group_id_sent_twice_is_refused_and_a_405_says_what_is_allowed() {
    let (_up, r) = echo_router(|_| {}).await;
    let addr = r.local_addr();
    let body = r#"{"inputs":"x"}"#;
    for heads in [
        "x-prefix-aware-id: a\r\nx-prefix-aware-id: b\r\n",
        "x-prefix-aware-id: a\r\nx-amzn-sagemaker-prefix-aware-id: a\r\n",
    ] {
        let req = format!(
            "POST /invocations HTTP/1.1\r\nhost: x\r\n{heads}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (text, _) = raw(addr, req.as_bytes(), complete_answer).await;
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        let v = raw_json(&text);
        assert_eq!(v["error"]["code"], "invalid_group_id");
        assert_eq!(v["error"]["param"], "x-prefix-aware-id");
    }
    let once = post(addr, "/invocations", &[("x-prefix-aware-id", "a")], body).await;
    assert_eq!(once.status, StatusCode::OK);
    let get = send(addr, request(Method::GET, "/v1/chat/completions", &[], "")).await;
    assert_eq!(
        (get.status, get.header("allow"), get.error_code()),
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "POST".into(),
            "method_not_allowed".into()
        )
    );
    let del = send(addr, request(Method::DELETE, "/metrics", &[], "")).await;
    assert_eq!(
        (del.status, del.header("allow")),
        (StatusCode::METHOD_NOT_ALLOWED, "GET, HEAD".into())
    );
    r.shutdown().await;
}

/// An engine that answers an event stream framed by a length (200 bytes), sends 100 of them
/// and closes.
async fn short_sse_engine() -> String {
    raw_engine(|mut s| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 65536];
        let _ = s.read(&mut buf).await;
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 200\r\n\r\n";
        let mut answer = head.as_bytes().to_vec();
        answer.extend_from_slice(b"data: ");
        answer.extend(std::iter::repeat_n(b'x', 94));
        let _ = s.write_all(&answer).await;
    })
    .await
}

#[tokio::test]
async fn a_length_framed_event_stream_that_breaks_is_cut_not_ended_with_a_clipped_event() {
    let r = router(settings(&[short_sse_engine().await])).await;
    let body = r#"{"prompt":"x","stream":true}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let (text, closed) = raw(r.local_addr(), req.as_bytes(), |_| false).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let got = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    // Short of its length, and closed: the client can tell the answer is incomplete. An error
    // event clipped to the 100 bytes left would have made it look whole.
    assert_eq!(got.len(), 100, "{text}");
    assert!(!got.contains("event: error"), "{text}");
    assert!(closed, "{text}");
    eventually("released", || total_in_flight(&r) == 0).await;
    r.shutdown().await;
}

#[tokio::test]
async fn an_engine_dying_mid_stream_ends_the_stream_with_an_error_event() {
    let (_up, r) = echo_router(|_| {}).await;
    let addr = r.local_addr();
    let a = post(
        addr,
        "/v1/completions",
        &[("x-test-abort", "1")],
        r#"{"prompt":"x","stream":true}"#,
    )
    .await;
    let text = String::from_utf8_lossy(&a.body).to_string();
    assert_eq!(a.status, StatusCode::OK, "{text}");
    // The first event, the half event ended, then the error event, then a clean end.
    assert!(text.starts_with("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choi\n\nevent: error\ndata: {\"error\":"), "{text}");
    assert!(
        text.contains("\"code\":\"upstream_stream_error\""),
        "{text}"
    );
    assert!(text.ends_with("}\n\n"), "{text}");
    eventually("released", || total_in_flight(&r) == 0).await;
    let page = metrics_text(addr).await;
    assert_eq!(
        metric(&page, "prefix_router_stream_error_events_total", &[]),
        1.0,
        "{page}"
    );
    assert_eq!(
        post(addr, "/v1/completions", &[], r#"{"prompt":"x"}"#)
            .await
            .status,
        StatusCode::OK
    );
    r.shutdown().await;
}

/// An engine that reads a request and closes the connection without answering (it crashed on
/// the request).
async fn crashing_engine() -> String {
    raw_engine(|mut s| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 65536];
        let _ = s.read(&mut buf).await;
        let _ = s.shutdown().await;
    })
    .await
}

#[tokio::test]
async fn a_request_that_crashes_an_engine_is_a_502_that_says_so_and_is_not_retried() {
    let crash = crashing_engine().await;
    let other = Upstream::start("other", Mode::Echo, &[]).await;
    let mut s = settings(std::slice::from_ref(&crash));
    s.health.passive_failures = 1000;
    let r = router(s).await;
    let addr = r.local_addr();
    reload_members(&r, &[crash.clone(), other.url()]).await;
    // Keys until one goes to the crashing engine.
    let (mut seen, mut ok) = (false, 0);
    for i in 0..40 {
        let a = post(
            addr,
            "/v1/completions",
            &[],
            format!(r#"{{"prompt":"k{i}"}}"#),
        )
        .await;
        if a.status == StatusCode::BAD_GATEWAY {
            assert_eq!(a.error_code(), "upstream_closed");
            let msg = a.json()["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            assert!(
                msg.contains("closed the connection before answering"),
                "{msg}"
            );
            seen = true;
        } else {
            assert_eq!(a.status, StatusCode::OK);
            ok += 1;
        }
    }
    assert!(seen, "some key went to the crashing engine");
    assert_eq!(
        other.hits(),
        ok,
        "no crashing request was retried on the other engine"
    );
    r.shutdown().await;
}

async fn reload_members(r: &prefix_router_server::RunningRouter, urls: &[String]) {
    let specs = urls
        .iter()
        .map(|u| prefix_router_core::InstanceSpec::from_url(u.as_str()))
        .collect();
    prefix_router_server::reload::set_members(r.state(), specs).await;
}

#[tokio::test]
async fn errors_hyper_writes_itself_are_in_the_openai_shape() {
    let (_up, r) = echo_router(|s| {
        s.limits.max_header_bytes = 8192;
    })
    .await;
    let addr = r.local_addr();
    let big = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    let (text, _) = raw(addr, big.as_bytes(), complete_answer).await;
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    assert_eq!(
        raw_json(&text)["error"]["code"],
        "header_too_large",
        "{text}"
    );
    for garbage in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET /health HTTP/1.1\r\nbad header\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
    ] {
        let (text, _) = raw(addr, garbage, complete_answer).await;
        assert!(text.starts_with("HTTP/1.1 400"), "{text}");
        assert_eq!(
            raw_json(&text)["error"]["code"],
            "malformed_request",
            "{text}"
        );
    }
    assert_eq!(
        send(addr, request(Method::GET, "/health", &[], ""))
            .await
            .status,
        StatusCode::OK
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_full_fleet_sheds_with_429_instead_of_queueing() {
    let (up, r) = echo_router(|s| {
        s.limits.max_in_flight_per_instance = Some(1);
    })
    .await;
    let addr = r.local_addr();
    let held = post_held(addr, r#"{"prompt":"a"}"#);
    up.wait_held(1).await;
    let shed = post(addr, "/v1/completions", &[], r#"{"prompt":"b"}"#).await;
    assert_eq!(
        (shed.status, shed.error_code(), shed.header("retry-after")),
        (
            StatusCode::TOO_MANY_REQUESTS,
            "instances_at_capacity".into(),
            "1".into()
        )
    );
    up.release(1);
    assert_eq!(held.await.expect("held").status, StatusCode::OK);
    assert_eq!(
        post(addr, "/v1/completions", &[], r#"{"prompt":"c"}"#)
            .await
            .status,
        StatusCode::OK
    );
    let page = metrics_text(addr).await;
    assert_eq!(
        metric(
            &page,
            "prefix_router_requests_shed_total",
            &[("reason", "in_flight_cap")]
        ),
        1.0,
        "{page}"
    );
    r.shutdown().await;
}

/// Under admission control, a model whose only instance is at its cap and then unhealthy (an
/// engine that hung) is an outage to retry, not a model the fleet does not serve: the cap's
/// filter left only other models' instances, and the answer was a 404 that no client retries.
#[tokio::test]
async fn a_full_and_unhealthy_models_instance_is_a_503_not_a_404() {
    let a = Upstream::start("a", Mode::Echo, &["m"]).await;
    let b = Upstream::start("b", Mode::Echo, &["n"]).await;
    let mut s = settings(&[a.url(), b.url()]);
    s.instances[0].models = vec!["m".into()];
    s.instances[1].models = vec!["n".into()];
    s.limits.max_in_flight_per_instance = Some(1);
    let r = router(s).await;
    let addr = r.local_addr();
    let held = post_held(addr, r#"{"model":"m","prompt":"a"}"#);
    a.wait_held(1).await;
    r.state().fleet.set_state(&a.url(), InstanceState::Ejected);
    let ask = |body: &'static str| post(addr, "/v1/completions", &[], body);
    let down = ask(r#"{"model":"m","prompt":"b"}"#).await;
    assert_eq!(
        (down.status, down.error_code()),
        (StatusCode::SERVICE_UNAVAILABLE, "model_unavailable".into())
    );
    // The other model's instance is not at its cap: served.
    let other = ask(r#"{"model":"n","prompt":"c"}"#).await;
    assert_eq!(other.status, StatusCode::OK);
    a.release(1);
    assert_eq!(held.await.expect("held").status, StatusCode::OK);
    r.shutdown().await;
}

/// An `https://` instance that accepts the connection and never answers the TLS handshake is a
/// connect error within the connect timeout (twice it: TCP, then the handshake), not a request
/// held until `first_byte` (10 minutes by default).
#[tokio::test]
async fn an_unanswered_tls_handshake_is_a_connect_error_within_the_connect_timeout() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!("https://{}", silent.local_addr().expect("addr"));
    // Accepts and holds every connection without a byte.
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    let mut s = settings(&[url]);
    s.timeouts.connect = Duration::from_millis(100);
    let r = router(s).await;
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        WAIT,
        post(r.local_addr(), "/v1/completions", &[], r#"{"prompt":"a"}"#),
    )
    .await
    .expect("answered within the wait, not held until first_byte");
    let took = started.elapsed();
    assert_eq!(
        (answer.status, answer.error_code()),
        (StatusCode::BAD_GATEWAY, "upstream_connect_error".into()),
        "{:?}",
        answer.body
    );
    assert!(took < Duration::from_secs(2), "answered after {took:?}");
    r.shutdown().await;
    held.abort();
}

#[tokio::test]
async fn the_admin_token_is_checked_once_for_every_path_and_the_scheme_in_any_case() {
    let (_up, r) = echo_router(|s| {
        s.admin = prefix_router_server::settings::Admin::on(
            "127.0.0.1:0".parse().expect("addr"),
            "s3cret",
        )
    })
    .await;
    let admin = r.admin_addr().expect("admin listens");
    let call = |path: &'static str, auth: Option<&'static str>| async move {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        send(admin, request(Method::GET, path, &headers, "")).await
    };
    for auth in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"] {
        assert_eq!(
            call("/admin/instances", Some(auth)).await.status,
            StatusCode::OK,
            "{auth}"
        );
    }
    for (path, auth) in [
        ("/admin/instances", None),
        ("/admin/instances", Some("Bearer wrong")),
        ("/admin/instances", Some("Basic s3cret")),
        ("/admin/nothing-here", None),
    ] {
        let a = call(path, auth).await;
        assert_eq!(
            (a.status, a.error_code(), a.header("www-authenticate")),
            (
                StatusCode::UNAUTHORIZED,
                "unauthorized".into(),
                "Bearer".into()
            ),
            "{path} {auth:?}"
        );
    }
    let a = call("/admin/nothing-here", Some("Bearer s3cret")).await;
    assert_eq!(
        (a.status, a.error_code()),
        (StatusCode::NOT_FOUND, "unknown_route".into())
    );
    r.shutdown().await;
}
