//! The client-side HTTP/1.1 wire over real sockets (the router's own front, `front.rs`):
//! pipelining, chunked request bodies, `Expect: 100-continue`, HTTP/1.0, `HEAD`, framing a
//! proxy must refuse, and the limits, each answered in the OpenAI shape where it is an error.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{
    chat, complete_answer, content_length, echo_router, endless_engine, raw, total_in_flight,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn post(body: &str, extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The answers in `text`, each as (head, body), read by content-length.
fn answers(mut text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some(end) = text.find("\r\n\r\n") {
        let head = text[..end].to_ascii_lowercase();
        let len = content_length(&head);
        let body_end = (end + 4 + len).min(text.len());
        out.push((head, text[end + 4..body_end].to_string()));
        text = &text[body_end..];
    }
    out
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (_up, r) = echo_router(|_| {}).await;
    let mut all = String::new();
    for i in 0..3 {
        all.push_str(&post(&chat(&format!("question {i}")), ""));
    }
    all.push_str("GET /health HTTP/1.1\r\nhost: r\r\n\r\n");
    let (text, _) = raw(r.local_addr(), all.as_bytes(), |t| {
        answers(t).len() == 4 && complete_answer(t.rsplit_once("HTTP/1.1 ").map_or("", |(_, l)| l))
    })
    .await;
    let got = answers(&text);
    assert_eq!(got.len(), 4, "{text}");
    for (i, (head, body)) in got[..3].iter().enumerate() {
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(
            body.contains(&format!("question {i}")),
            "answer {i} out of order: {body}"
        );
    }
    assert!(got[3].1.contains("ok"), "{:?}", got[3]);
    assert_eq!(total_in_flight(&r), 0);
    r.shutdown().await;
}

#[tokio::test]
async fn a_chunked_request_body_is_read_whole_and_forwarded() {
    let (_up, r) = echo_router(|_| {}).await;
    let body = chat("a body sent in chunks");
    let (a, b) = body.split_at(10);
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\ntrailer: x\r\n\r\n",
        a.len(),
        b.len()
    );
    let (text, _) = raw(r.local_addr(), req.as_bytes(), complete_answer).await;
    let got = answers(&text);
    assert!(got[0].0.starts_with("http/1.1 200"), "{text}");
    assert!(got[0].1.contains("a body sent in chunks"), "{text}");
    r.shutdown().await;
}

#[tokio::test]
async fn expect_100_continue_gets_its_interim_answer_before_the_body_is_sent() {
    let (_up, r) = echo_router(|_| {}).await;
    let body = chat("sent after 100");
    let mut s = TcpStream::connect(r.local_addr()).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("a 100 Continue in time")
        .expect("read");
    assert_eq!(&buf[..n], b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(body.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            got.extend_from_slice(&buf[..n]);
            if n == 0 || complete_answer(&String::from_utf8_lossy(&got)) {
                break;
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("sent after 100"), "{text}");
    r.shutdown().await;
}

#[tokio::test]
async fn framing_a_proxy_could_misread_is_refused_and_the_connection_closed() {
    let (up, r) = echo_router(|_| {}).await;
    let malformed = (400, "malformed_request");
    let cases: [(&str, &str, (u16, &str)); 4] = [
        (
            "POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            "both content-length and transfer-encoding",
            malformed,
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!",
            "conflicting content-length",
            malformed,
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: gzip\r\n\r\nxx",
            "only the chunked transfer-coding",
            (501, "unsupported_transfer_coding"),
        ),
        (
            "POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-length: -1\r\n\r\n",
            "content-length is not a number",
            malformed,
        ),
    ];
    for (req, says, (status, code)) in cases {
        let (text, closed) = raw(r.local_addr(), req.as_bytes(), |_| false).await;
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status}")),
            "{req:?}: {text}"
        );
        assert!(text.contains(&format!("\"code\":\"{code}\"")), "{text}");
        assert!(text.contains(says), "{req:?} should say {says:?}: {text}");
        assert!(closed, "{req:?}: the connection stays open");
    }
    assert_eq!(up.hits(), 0, "a refused request reached an engine");
    r.shutdown().await;
}

#[tokio::test]
async fn http_1_0_closes_unless_asked_to_keep_the_connection() {
    let (_up, r) = echo_router(|_| {}).await;
    let once = "GET /health HTTP/1.0\r\n\r\n";
    let (text, closed) = raw(r.local_addr(), once.as_bytes(), |_| false).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(closed);
    let twice =
        "GET /health HTTP/1.0\r\nconnection: keep-alive\r\n\r\nGET /health HTTP/1.0\r\n\r\n";
    let (text, closed) = raw(r.local_addr(), twice.as_bytes(), |_| false).await;
    let got = answers(&text);
    assert_eq!(got.len(), 2, "{text}");
    assert!(got[0].0.contains("connection: keep-alive"), "{text}");
    assert!(got[1].0.contains("connection: close"), "{text}");
    assert!(closed);
    r.shutdown().await;
}

/// `HEAD path`, then on the same connection a `GET /health` the router answers itself, which
/// must start right after the HEAD answer's head: everything read, the HEAD answer's head
/// (lower case) and what follows it.
async fn head_then_get(
    r: &prefix_router_server::RunningRouter,
    path: &str,
) -> (String, String, String) {
    let req =
        format!("HEAD {path} HTTP/1.1\r\nhost: r\r\n\r\nGET /health HTTP/1.1\r\nhost: r\r\n\r\n");
    let (text, _) = raw(r.local_addr(), req.as_bytes(), |t| {
        t.matches("HTTP/1.1 200").count() == 2
            && complete_answer(t.rsplit_once("HTTP/1.1 ").map_or("", |(_, l)| l))
    })
    .await;
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or_default();
    let (head, rest) = (head.to_ascii_lowercase(), rest.to_string());
    (text, head, rest)
}

#[tokio::test]
async fn head_answers_carry_the_length_and_no_body() {
    let (_up, r) = echo_router(|_| {}).await;
    let (text, head, rest) = head_then_get(&r, "/health").await;
    assert!(head.contains("content-length: "), "{text}");
    assert!(head.contains("date: "), "{text}");
    assert!(
        rest.starts_with("HTTP/1.1 200"),
        "the HEAD answer had a body: {text}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn bodies_over_the_limit_are_refused_whichever_their_framing() {
    let (up, r) = echo_router(|s| s.limits.max_body_bytes = 64).await;
    let big = "x".repeat(100);
    let declared = post(&big, "");
    let (text, closed) = raw(r.local_addr(), declared.as_bytes(), |_| false).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(closed);
    let chunked = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\n\r\n32\r\n{}\r\n32\r\n{}\r\n0\r\n\r\n",
        &big[..50],
        &big[50..]
    );
    let (text, closed) = raw(r.local_addr(), chunked.as_bytes(), |_| false).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(
        text.contains("max_body_bytes") || text.contains("64"),
        "{text}"
    );
    assert!(closed);
    assert_eq!(up.hits(), 0);
    r.shutdown().await;
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_a_408() {
    let (_up, r) = echo_router(|s| s.timeouts.client_body = Duration::from_millis(200)).await;
    // Announces 100 bytes, sends 10, then waits.
    let req =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-length: 100\r\n\r\n0123456789";
    let (text, closed) = raw(r.local_addr(), req.as_bytes(), |_| false).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(closed);
    r.shutdown().await;
}

#[tokio::test]
async fn a_body_larger_than_the_read_buffer_arrives_whole() {
    let (_up, r) = echo_router(|_| {}).await;
    let long = "word ".repeat(20_000);
    let req = post(&chat(&long), "");
    let (text, _) = raw(r.local_addr(), req.as_bytes(), complete_answer).await;
    let got = answers(&text);
    assert!(
        got[0].0.starts_with("http/1.1 200"),
        "{}",
        &text[..text.len().min(300)]
    );
    assert!(got[0].1.contains(&long), "the body came back cut");
    r.shutdown().await;
}

/// An engine that answers every request `HEAD`-style with a chunked head and no length: what
/// the resource's length is, it does not say.
async fn chunked_head_engine() -> String {
    support::raw_engine(|mut s| async move {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..i + 4);
                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_relayed_head_answer_of_unknown_length_announces_no_length() {
    let url = chunked_head_engine().await;
    let r = support::router(support::settings(&[url])).await;
    let (text, head, rest) = head_then_get(&r, "/v1/files").await;
    assert!(head.starts_with("http/1.1 200"), "{text}");
    // Saying `content-length: 0` would tell the client the resource is empty.
    assert!(!head.contains("content-length"), "{text}");
    assert!(
        rest.starts_with("HTTP/1.1 200"),
        "the HEAD answer had a body: {text}"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn a_client_that_stops_reading_its_answer_is_disconnected_and_its_request_cancelled() {
    let (gone, asked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let url = endless_engine(Arc::clone(&gone), Arc::clone(&asked)).await;
    let mut s = support::settings(&[url]);
    s.timeouts.client_write = Duration::from_millis(300);
    let r = support::router(s).await;
    let mut client = TcpStream::connect(r.local_addr()).await.expect("connect");
    client
        .write_all(post(&chat("a long answer"), "").as_bytes())
        .await
        .expect("send");
    // The client never reads: the answer fills its socket, then the router's.
    support::eventually("the engine was asked", || asked.load(Ordering::SeqCst)).await;
    support::eventually("the router let go of the engine's answer", || {
        gone.load(Ordering::SeqCst)
    })
    .await;
    support::eventually("no request left in flight", || total_in_flight(&r) == 0).await;
    let page = support::metrics_text(r.local_addr()).await;
    assert_eq!(
        support::metric(
            &page,
            "prefix_router_client_connections_closed_total",
            &[("reason", "write_timeout")]
        ),
        1.0,
        "{page}"
    );
    drop(client);
    r.shutdown().await;
}

#[tokio::test]
async fn a_refusal_reaches_a_client_still_sending_its_body() {
    // The router refuses at the head (too large) while the body is still on its way: closing
    // with those bytes unread would reset the connection, and a reset can destroy the 413
    // before the client reads it.
    let (up, r) = echo_router(|s| s.limits.max_body_bytes = 1024).await;
    for _ in 0..3 {
        let body = "x".repeat(512 * 1024);
        let req = post(&body, "");
        let mut client = TcpStream::connect(r.local_addr()).await.expect("connect");
        // All of it, before reading anything (a client uploading a file does the same).
        let sent =
            tokio::time::timeout(Duration::from_secs(5), client.write_all(req.as_bytes())).await;
        assert!(
            matches!(sent, Ok(Ok(()))),
            "the router stopped taking the body: {sent:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut got)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            matches!(read, Ok(Ok(_))) && text.starts_with("HTTP/1.1 413"),
            "{read:?}: {text}"
        );
    }
    assert_eq!(up.hits(), 0);
    r.shutdown().await;
}

/// After an error answer the router reads what the client still sends for its linger (2 s),
/// then closes, whatever the client does: before, the linger ended only when the connection's
/// timer next fired, up to the shortest client timeout (10 s) later.
#[tokio::test]
async fn the_linger_after_a_refusal_ends_on_time_for_a_client_that_keeps_sending() {
    let (_up, r) = echo_router(|s| s.limits.max_body_bytes = 1024).await;
    let mut client = TcpStream::connect(r.local_addr()).await.expect("connect");
    // A head announcing too large a body, then the body a byte at a time, for ever.
    let head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n";
    client.write_all(head.as_bytes()).await.expect("writes");
    let started = std::time::Instant::now();
    let (mut rd, mut wr) = client.into_split();
    // Until the router closes the connection: the writes then fail (a reset).
    let sender = tokio::spawn(async move {
        while wr.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        started.elapsed()
    });
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut got)).await;
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 413"),
        "{read:?}: {}",
        String::from_utf8_lossy(&got)
    );
    let took = tokio::time::timeout(Duration::from_secs(20), sender)
        .await
        .expect("the router closed the connection within 20 s")
        .expect("the sender ran");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "closed {took:?} after the refusal (the linger is 2 s)"
    );
    r.shutdown().await;
}

/// Reads from `conn` until `text` holds `n` complete answers (at most 5 s).
async fn read_answers(conn: &mut TcpStream, text: &mut String, n: usize) {
    let done = |t: &str| {
        let got = answers(t);
        got.len() >= n && got.iter().all(|(h, b)| b.len() == content_length(h))
    };
    let mut chunk = vec![0u8; 64 * 1024];
    while !done(text) {
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut chunk)).await;
        match read {
            Ok(Ok(n)) if n > 0 => text.push_str(&String::from_utf8_lossy(&chunk[..n])),
            other => panic!("connection ended or stalled ({other:?}); so far: {text}"),
        }
    }
}

#[tokio::test]
async fn a_connection_that_gave_its_buffers_back_while_quiet_serves_on() {
    // The shortest client timeout (here the body's, 150 ms) is how long a connection keeps its
    // buffers while quiet; it stays open until the idle timeout.
    let (_up, r) = echo_router(|s| {
        s.timeouts.client_body = Duration::from_millis(150);
        s.timeouts.client_idle = Duration::from_secs(10);
    })
    .await;
    let mut conn = TcpStream::connect(r.local_addr()).await.expect("connect");
    let mut text = String::new();
    conn.write_all(post(&chat("first"), "").as_bytes())
        .await
        .expect("write");
    read_answers(&mut conn, &mut text, 1).await;
    // Quiet past the release: the next request is larger than the small buffer it waits on,
    // and two more follow it pipelined.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let long = "word ".repeat(2_000);
    let mut next = post(&chat(&long), "");
    next.push_str(&post(&chat("third"), ""));
    next.push_str(&post(&chat("fourth"), ""));
    conn.write_all(next.as_bytes()).await.expect("write");
    read_answers(&mut conn, &mut text, 4).await;
    let got = answers(&text);
    for (i, want) in ["first", &long, "third", "fourth"].iter().enumerate() {
        assert!(
            got[i].0.starts_with("http/1.1 200"),
            "answer {i}: {}",
            got[i].0
        );
        assert!(got[i].1.contains(*want), "answer {i} lacks its question");
    }
    // Quiet again, then one more: released twice, still the same connection.
    tokio::time::sleep(Duration::from_millis(500)).await;
    conn.write_all(post(&chat("fifth"), "").as_bytes())
        .await
        .expect("write");
    read_answers(&mut conn, &mut text, 5).await;
    assert!(answers(&text)[4].1.contains("fifth"));
    assert_eq!(total_in_flight(&r), 0);
    r.shutdown().await;
}
