//! What the strategy hears about each request it routed, over real sockets: the first token and
//! the engine's usage for an answer, a failure for an error status or a retried instance, a
//! cancellation for a client that went away.

mod support;

use std::sync::Arc;

use http::{Method, StatusCode};
use http_body_util::BodyExt;
use prefix_router_core::strategies::recording::{Call, Pick, Recording};
use prefix_router_server::routing::Routing;
use prefix_router_server::RunningRouter;
use support::*;

/// What the recorder heard about requests, as `{event:?}` and how long after its send each was
/// told (never before it).
fn heard(recorder: &Recording) -> Vec<(String, f64)> {
    recorder
        .take()
        .into_iter()
        .filter_map(|c| match c {
            Call::Feedback {
                event,
                now,
                sent_at,
                ..
            } => {
                assert!(now >= sent_at, "{now} before {sent_at}");
                Some((format!("{event:?}"), now - sent_at))
            }
            _ => None,
        })
        .collect()
}

fn install(r: &RunningRouter) -> Arc<Recording> {
    let recorder = Arc::new(Recording::new(Pick::First));
    let current = r.state().routing.load_full();
    r.state().routing.store(Arc::new(Routing {
        config: current.config.clone(),
        prefix_length: current.prefix_length,
        strategy: recorder.clone(),
    }));
    recorder
}

/// Waits until `n` events were told, then returns them with their times ([`heard`]).
async fn told_at(recorder: &Recording, n: usize) -> Vec<(String, f64)> {
    let mut all = Vec::new();
    let done = tokio::time::timeout(WAIT, async {
        while all.len() < n {
            all.extend(heard(recorder));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(done.is_ok(), "only {all:?}");
    all
}

/// Waits until `n` events were told, then returns them.
async fn told(recorder: &Recording, n: usize) -> Vec<String> {
    told_at(recorder, n)
        .await
        .into_iter()
        .map(|(e, _)| e)
        .collect()
}

#[tokio::test]
async fn answers_failures_and_cancellations_are_reported() {
    let up = Upstream::start("a", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let addr = r.local_addr();
    let recorder = install(&r);

    // The usage the strategy is told for an answer reporting `usage` (x-test-usage).
    let usage_told = |usage: &'static str| {
        let recorder = Arc::clone(&recorder);
        async move {
            let a = post(
                addr,
                "/v1/completions",
                &[("x-test-usage", usage)],
                r#"{"prompt":"p"}"#,
            )
            .await;
            assert_eq!(a.status, StatusCode::OK);
            let told = told(&recorder, 2).await;
            assert_eq!(told[0], "FirstToken");
            told[1].clone()
        }
    };
    // An engine that has never reported cached tokens: their absence says nothing.
    assert_eq!(
        usage_told("12").await,
        "Finished { usage: Some(Usage { prompt_tokens: 12, cached_tokens: None }) }"
    );
    assert_eq!(
        usage_told("12,8").await,
        "Finished { usage: Some(Usage { prompt_tokens: 12, cached_tokens: Some(8) }) }"
    );
    let a = post(addr, "/v1/completions", &[], r#"{"prompt":"no usage"}"#).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        told(&recorder, 2).await,
        ["FirstToken", "Finished { usage: None }"]
    );
    // Usage without cached tokens, from an engine that reported them before: vLLM leaves
    // `prompt_tokens_details` out when nothing was cached, so this is a full miss.
    assert_eq!(
        usage_told("12").await,
        "Finished { usage: Some(Usage { prompt_tokens: 12, cached_tokens: Some(0) }) }"
    );

    // An error status is a failure, and its body is no first token.
    up.set_mode(Mode::Status(400));
    let a = post(addr, "/v1/completions", &[], r#"{"prompt":"bad"}"#).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(told(&recorder, 1).await, ["Failed"]);
    up.set_mode(Mode::Echo);

    // A client gone mid-stream: cancelled, after its first token.
    {
        let mut sender = connect(addr).await;
        let req = request(
            Method::POST,
            "/v1/completions",
            &[("x-test-stream", "1"), ("x-test-chunks", "1000")],
            r#"{"prompt":"long","stream":true}"#,
        );
        let resp = sender.send_request(req).await.expect("head");
        let mut body = resp.into_body();
        let first = body.frame().await.expect("frame").expect("ok");
        assert!(first.is_data());
        up.open_gate(1);
    }
    assert_eq!(told(&recorder, 2).await, ["FirstToken", "Cancelled"]);
    eventually("in-flight released", || in_flight(&r, &up.url()) == 0).await;
    r.shutdown().await;
}

/// An answer that is not an event stream arrives whole, after its decode: the strategy is told
/// it is no sample of the time to first token. An error answer records no TTFT at all (a fast
/// 400 made a failing instance's TTFT the best on the dashboard).
#[tokio::test]
async fn whole_answers_and_error_answers_are_no_ttft_samples() {
    let up = Upstream::start("a", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let addr = r.local_addr();
    let recorder = install(&r);
    let first_token_streamed = |recorder: &Recording| recorder.first_token_streamed();
    let a = post(addr, "/v1/completions", &[], r#"{"prompt":"whole"}"#).await;
    assert_eq!(a.status, StatusCode::OK);
    eventually("told", || in_flight(&r, &up.url()) == 0).await;
    assert_eq!(first_token_streamed(&recorder), Some(false));
    let a = post(
        addr,
        "/v1/completions",
        &[("x-test-stream", "1"), ("x-test-chunks", "2")],
        r#"{"prompt":"streamed","stream":true}"#,
    );
    up.open_gate(1);
    assert_eq!(a.await.status, StatusCode::OK);
    eventually("told", || in_flight(&r, &up.url()) == 0).await;
    assert_eq!(first_token_streamed(&recorder), Some(true));

    let ttft_count = |text: &str| {
        let series = format!(
            "prefix_router_ttft_seconds_count{{instance=\"{}\"}} ",
            up.url()
        );
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()).map(str::to_owned))
            .unwrap_or_default()
    };
    assert_eq!(ttft_count(&metrics_text(addr).await), "2");
    up.set_mode(Mode::Status(400));
    let a = post(addr, "/v1/completions", &[], r#"{"prompt":"bad"}"#).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(ttft_count(&metrics_text(addr).await), "2");
    r.shutdown().await;
}

#[tokio::test]
async fn a_retried_instance_is_told_it_failed() {
    let busy = Upstream::start("busy", Mode::Status(503), &[]).await;
    let ok = Upstream::start("ok", Mode::Echo, &[]).await;
    let r = router(settings(&[busy.url(), ok.url()])).await;
    let recorder = install(&r);
    let a = post(r.local_addr(), "/v1/completions", &[], r#"{"prompt":"p"}"#).await;
    assert_eq!((a.status, a.upstream()), (StatusCode::OK, "ok".into()));
    assert_eq!(
        told(&recorder, 3).await,
        ["Failed", "FirstToken", "Finished { usage: None }"]
    );
    r.shutdown().await;
}

/// The strategy is told which requests asked for their answer whole (`stream` false or absent):
/// those show it no first token, so cache-aware ends their wait itself.
#[tokio::test]
async fn requests_that_ask_for_a_whole_answer_are_told_so() {
    let up = Upstream::start("a", Mode::Echo, &[]).await;
    let r = router(settings(&[up.url()])).await;
    let addr = r.local_addr();
    let recorder = install(&r);
    let cases = [
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
            true,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"stream":false}"#,
            true,
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            false,
        ),
        ("/v1/completions", r#"{"prompt":"p"}"#, true),
        ("/v1/completions", r#"{"prompt":"p","stream":true}"#, false),
        ("/v1/responses", r#"{"input":"p"}"#, true),
        ("/v1/responses", r#"{"input":"p","stream":true}"#, false),
        // The native API does not say: its first response byte stands for the first token.
        ("/invocations", r#"{"inputs":"p"}"#, false),
    ];
    for (path, body, whole) in cases {
        let a = post(addr, path, &[], body).await;
        assert_eq!(a.status, StatusCode::OK, "{path} {body}");
        let told = recorder.take().into_iter().find_map(|c| match c {
            Call::Dispatched { whole_answer, .. } => Some(whole_answer),
            _ => None,
        });
        assert_eq!(told, Some(whole), "{path} {body}");
    }
    r.shutdown().await;
}

/// A Responses API stream opens with `response.created` and `response.in_progress`, sent before
/// queueing and prefill (as vLLM does): its first token is the first event after them. Taken at
/// the first byte, the time to first token was about nothing whatever the prompt, and the idle
/// timeout, which runs from the first data, cut a request still queued.
#[tokio::test]
async fn a_responses_streams_first_token_comes_after_its_opening_events() {
    let engine = raw_engine(|mut s| async move {
        use tokio::io::AsyncWriteExt;
        if read_request(&mut s, &mut Vec::new()).await.is_none() {
            return;
        }
        let piece = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
        let opening = "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\",\"usage\":null},\"type\":\"response.created\"}\n\nevent: response.in_progress\ndata: {\"response\":{\"id\":\"resp_1\"},\"type\":\"response.in_progress\"}\n\n";
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        if s.write_all(format!("{head}{}", piece(opening)).as_bytes()).await.is_err() {
            return;
        }
        // Queued and prefilling: longer than the idle timeout.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let rest = "event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\nevent: response.completed\ndata: {\"response\":{\"id\":\"resp_1\",\"usage\":{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":10},\"output_tokens\":1}},\"type\":\"response.completed\"}\n\n";
        let _ = s
            .write_all(format!("{}0\r\n\r\n", piece(rest)).as_bytes())
            .await;
        let _ = s.shutdown().await;
    })
    .await;
    let mut s = settings(&[engine]);
    s.timeouts.idle_stream = std::time::Duration::from_millis(200);
    let r = router(s).await;
    let recorder = install(&r);
    let a = post(
        r.local_addr(),
        "/v1/responses",
        &[],
        r#"{"input":"hello","stream":true}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let body = String::from_utf8_lossy(&a.body).into_owned();
    assert!(body.contains("response.completed"), "cut: {body}");
    let heard = told_at(&recorder, 2).await;
    let first = heard
        .iter()
        .find(|(e, _)| e == "FirstToken")
        .map(|(_, t)| *t);
    assert!(first.is_some_and(|t| t >= 0.4), "{heard:?}");
    assert!(
        heard
            .iter()
            .any(|(e, _)| e.contains("prompt_tokens: 50") && e.contains("cached_tokens: Some(10)")),
        "{heard:?}"
    );
    r.shutdown().await;
}

/// A request that continues a stored response is counted in flight but teaches the strategy
/// nothing from its usage: the engine's prompt was the stored conversation and then its text,
/// which the router never saw whole (its cached tokens against its short text would skew
/// cache-aware's characters per token and cache size).
#[tokio::test]
async fn a_continued_stored_response_teaches_no_usage() {
    let engine = support::storing::storing_engine("a").await;
    let r = router(settings(&[engine])).await;
    let addr = r.local_addr();
    let recorder = install(&r);
    let first = post(addr, "/v1/responses", &[], r#"{"input":"hello"}"#).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        told(&recorder, 2).await,
        [
            "FirstToken",
            "Finished { usage: Some(Usage { prompt_tokens: 100, cached_tokens: Some(90) }) }"
        ]
    );
    let id = first.json()["id"].as_str().unwrap_or_default().to_string();
    let next = serde_json::json!({"input": "more", "previous_response_id": id}).to_string();
    let a = post(addr, "/v1/responses", &[], next).await;
    assert_eq!(a.header("x-prefix-router-decision"), "stored_response");
    assert_eq!(
        told(&recorder, 2).await,
        ["FirstToken", "Finished { usage: None }"]
    );
    r.shutdown().await;
}
