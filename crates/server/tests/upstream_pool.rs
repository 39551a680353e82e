//! Upstream connections (crates/server/src/pool.rs): kept alive and reused, driven by the
//! request that uses them, and a connection the instance closed while idle is replaced without
//! an error, a retry or a failure counted against the instance.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const BODY: &str = r#"{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

/// A minimal HTTP/1.1 engine on a raw socket, so that what it does with its connections is
/// exactly what the test says: it counts the connections it accepts, answers every request
/// with [`BODY`] (keep-alive, no `Connection: close`), and with `close_after_one` closes each
/// connection 20 ms after its first answer, as an engine's idle timeout would.
async fn engine(close_after_one: bool) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (accepted, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, n) = (Arc::clone(&accepted), Arc::clone(&answered));
    let url = raw_engine(move |s| {
        a.fetch_add(1, Ordering::SeqCst);
        let closes = if close_after_one {
            Closes::AfterFirstAnswer
        } else {
            Closes::Never
        };
        serve(s, closes, Arc::clone(&n))
    })
    .await;
    (url, accepted, answered)
}

/// When [`serve`] closes its connection.
#[derive(Clone, Copy, PartialEq)]
enum Closes {
    Never,
    /// 20 ms after its first answer, as an engine's idle timeout would.
    AfterFirstAnswer,
    /// When the second request has arrived, without a byte of an answer: an idle timeout that
    /// fired just as that request went out.
    OnSecondRequest,
}

async fn serve(mut s: TcpStream, closes: Closes, answered: Arc<AtomicUsize>) {
    let mut buf = Vec::new();
    let mut requests = 0;
    loop {
        // A request: the head, then Content-Length bytes of body.
        if read_request(&mut s, &mut buf).await.is_none() {
            return;
        }
        requests += 1;
        if closes == Closes::OnSecondRequest && requests == 2 {
            return;
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
            BODY.len()
        );
        if s.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        answered.fetch_add(1, Ordering::SeqCst);
        if closes == Closes::AfterFirstAnswer {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = s.shutdown().await;
            return;
        }
    }
}

#[tokio::test]
async fn one_kept_alive_connection_carries_sequential_requests() {
    let (url, accepted, answered) = engine(false).await;
    let mut s = settings(std::slice::from_ref(&url));
    // Idle connections are kept per I/O thread: one thread, one list.
    s.limits.io_threads = 1;
    let r = router(s).await;
    let addr = r.local_addr();
    for i in 0..20 {
        let a = complete(addr, &format!("prompt {i}")).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
        assert_eq!(a.json()["choices"][0]["text"], "ok");
    }
    assert_eq!(answered.load(Ordering::SeqCst), 20);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "every request after the first reuses the connection"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn each_io_thread_keeps_its_own_connections_and_reuses_them() {
    let (url, accepted, answered) = engine(false).await;
    let mut s = settings(std::slice::from_ref(&url));
    s.limits.io_threads = 3;
    let r = router(s).await;
    let addr = r.local_addr();
    // Each request on a new client connection: the router hands them to its threads in turn.
    for i in 0..21 {
        let a = complete(addr, &format!("prompt {i}")).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    assert_eq!(answered.load(Ordering::SeqCst), 21);
    let opened = accepted.load(Ordering::SeqCst);
    assert!(
        (1..=3).contains(&opened),
        "{opened} upstream connections for 21 sequential requests on 3 threads"
    );
    // And with the shared runtime only (io_threads = 0), one connection as before.
    let (url, accepted, _) = engine(false).await;
    let mut s = settings(std::slice::from_ref(&url));
    s.limits.io_threads = 0;
    let r0 = router(s).await;
    for i in 0..10 {
        let a = complete(r0.local_addr(), &format!("prompt {i}")).await;
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    r.shutdown().await;
    r0.shutdown().await;
}

#[tokio::test]
async fn a_connection_the_instance_closed_while_idle_is_replaced_without_an_error() {
    let (url, accepted, answered) = engine(true).await;
    let mut s = settings(std::slice::from_ref(&url));
    // One failure would eject: a closed idle connection must not count as one.
    s.health.passive_failures = 1;
    let r = router(s).await;
    let addr = r.local_addr();
    for i in 0..8 {
        let a = complete(addr, &format!("prompt {i}")).await;
        assert_eq!(a.status, 200, "request {i}: {:?}", a.body);
        // Longer than the engine keeps a connection: the router's idle one is closed by now.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert_eq!(answered.load(Ordering::SeqCst), 8);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        8,
        "a new connection each time"
    );
    let page = metrics_text(addr).await;
    for name in [
        "prefix_router_upstream_errors_total",
        "prefix_router_retries_total",
    ] {
        assert_eq!(metric(&page, name, &[]), 0.0, "{name}\n{page}");
    }
    r.shutdown().await;
}

/// Idle connections are kept per I/O thread (a request never waits on another thread's
/// connection), so the bound is one connection per concurrent request on each thread: with
/// `io_threads = 0` (the shared runtime) or 1 that is 4 here, with 2 threads up to 8.
#[tokio::test]
async fn concurrent_requests_open_connections_that_are_then_reused() {
    for (io_threads, most) in [(0, 4), (1, 4), (2, 8)] {
        let (url, accepted, answered) = engine(false).await;
        let mut s = settings(std::slice::from_ref(&url));
        s.limits.io_threads = io_threads;
        let r = router(s).await;
        let addr = r.local_addr();
        for round in 0..3 {
            let batch: Vec<_> = (0..4)
                .map(|i| {
                    tokio::spawn(async move { complete(addr, &format!("p {round} {i}")).await })
                })
                .collect();
            for b in batch {
                assert_eq!(b.await.expect("request task").status, 200);
            }
        }
        assert_eq!(answered.load(Ordering::SeqCst), 12);
        let opened = accepted.load(Ordering::SeqCst);
        assert!(
            (1..=most).contains(&opened),
            "io_threads = {io_threads}: at most one connection per concurrent request and \
             thread, reused across rounds; opened {opened}"
        );
        r.shutdown().await;
    }
}

/// The keep-alive race: the instance closes a reused connection just after the request went
/// out, with no byte of an answer. The request goes out again, once, on a new connection: an
/// answer, no upstream error, no failure counted toward ejection (it was a 502 that did).
#[tokio::test]
async fn a_reused_connection_closed_as_the_request_went_out_is_sent_again_on_a_new_one() {
    let accepted = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let (a, n) = (Arc::clone(&accepted), Arc::clone(&answered));
    let url = raw_engine(move |s| {
        let first = a.fetch_add(1, Ordering::SeqCst) == 0;
        let n = Arc::clone(&n);
        async move {
            if first {
                serve(s, Closes::OnSecondRequest, n).await;
            } else {
                serve(s, Closes::Never, n).await;
            }
        }
    })
    .await;
    let mut s = settings(std::slice::from_ref(&url));
    s.limits.io_threads = 1;
    s.health.passive_failures = 1;
    let r = router(s).await;
    let addr = r.local_addr();
    for i in 0..3 {
        let a = complete(addr, &format!("prompt {i}")).await;
        assert_eq!(a.status, 200, "request {i}: {:?}", a.body);
    }
    assert_eq!(answered.load(Ordering::SeqCst), 3);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let page = metrics_text(addr).await;
    assert_eq!(
        metric(&page, "prefix_router_upstream_errors_total", &[]),
        0.0,
        "{page}"
    );
    r.shutdown().await;
}

/// The same close, from an instance that is then gone (its new connection refused): the
/// request may be what brought it down, so it is not handed to another instance.
#[tokio::test]
async fn a_request_whose_instance_closed_on_it_and_went_away_is_not_sent_elsewhere() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let answered = Arc::new(AtomicUsize::new(0));
    let n = Arc::clone(&answered);
    tokio::spawn(async move {
        if let Ok((s, _)) = listener.accept().await {
            // Nothing listens any more: the next connection is refused.
            drop(listener);
            serve(s, Closes::OnSecondRequest, n).await;
        }
    });
    let other = Upstream::start("other", Mode::Echo, &[]).await;
    let mut s = settings(&[url.clone(), other.url()]);
    s.limits.io_threads = 1;
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named("round-robin").expect("registered"),
    );
    let r = router(s).await;
    let addr = r.local_addr();
    // Round-robin: the first and third requests go to the closing instance.
    let mut statuses = Vec::new();
    for i in 0..3 {
        statuses.push(complete(addr, &format!("prompt {i}")).await.status);
    }
    assert_eq!(answered.load(Ordering::SeqCst), 1);
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(other.hits(), 1, "the closed-on request went nowhere else");
    r.shutdown().await;
}
