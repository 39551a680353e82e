//! The front's pure parts: request heads in, answer heads out.

use bytes::BytesMut;
use http::{HeaderMap, HeaderValue, StatusCode, Version};
use http_body::SizeHint;

use super::request::{parse, BodyFraming, HeadError};
use super::response::{chunk_start, declared_length, encode_head, OutFraming, Persist};
use crate::fields::Fields;

fn parsed(text: &str) -> Result<Option<super::RequestHead>, HeadError> {
    parse(&mut BytesMut::from(text.as_bytes()), 64 * 1024)
}

#[test]
fn a_head_is_taken_from_the_buffer_and_what_follows_stays() {
    let mut buf = BytesMut::from(
        &b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: r\r\nContent-Length: 4\r\nX-A: b\r\n\r\nbodyGET"[..],
    );
    let head = parse(&mut buf, 1024)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no head"));
    assert_eq!(&buf[..], b"bodyGET");
    assert_eq!(head.parts.method, http::Method::POST);
    assert_eq!(head.parts.uri.path(), "/v1/completions");
    assert_eq!(head.parts.uri.query(), Some("x=1"));
    assert_eq!(head.parts.version, Version::HTTP_11);
    assert_eq!(
        head.parts.headers.get("x-a").map(HeaderValue::as_bytes),
        Some(&b"b"[..])
    );
    assert_eq!(head.framing, BodyFraming::Length(4));
    assert!(head.keep_alive && !head.expect_continue);
}

#[test]
fn an_incomplete_head_leaves_the_buffer_untouched_until_it_is_too_large() {
    let mut buf = BytesMut::from(&b"POST /v1/completions HTTP/1.1\r\nhost: r\r\n"[..]);
    assert!(matches!(parse(&mut buf, 1024), Ok(None)));
    assert_eq!(buf.len(), 40);
    assert_eq!(parse(&mut buf, 39).err(), Some(HeadError::TooLarge));
    // Complete, but over the limit all the same.
    assert_eq!(
        parse(
            &mut BytesMut::from(&b"GET / HTTP/1.1\r\nhost: r\r\n\r\n"[..]),
            10
        )
        .err(),
        Some(HeadError::TooLarge)
    );
}

#[test]
fn up_to_a_hundred_headers_parse_and_more_is_a_431() {
    let head = |n: usize| {
        let mut t = String::from("GET / HTTP/1.1\r\n");
        for i in 0..n {
            t.push_str(&format!("x-h{i}: {i}\r\n"));
        }
        t + "\r\n"
    };
    let many = parsed(&head(100))
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("100 headers"));
    assert_eq!(many.parts.headers.len(), 100);
    assert!(parsed(&head(24)).is_ok_and(|h| h.is_some()));
    assert_eq!(parsed(&head(101)).err(), Some(HeadError::TooLarge));
}

#[test]
fn connection_and_expect_say_what_the_client_wants() {
    let flags = |t: &str| {
        parsed(t)
            .ok()
            .flatten()
            .map(|h| (h.keep_alive, h.expect_continue))
    };
    assert_eq!(
        flags("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n"),
        Some((false, false))
    );
    assert_eq!(flags("GET / HTTP/1.0\r\n\r\n"), Some((false, false)));
    assert_eq!(
        flags("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"),
        Some((true, false))
    );
    assert_eq!(
        flags("POST / HTTP/1.1\r\nexpect: 100-Continue\r\n\r\n"),
        Some((true, true))
    );
    // HTTP/1.0 clients know no 100 Continue.
    assert_eq!(
        flags("POST / HTTP/1.0\r\nexpect: 100-continue\r\n\r\n"),
        Some((false, false))
    );
}

#[test]
fn framing_two_hops_could_read_differently_is_malformed() {
    for (text, framing) in [
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n",
            Some(BodyFraming::Chunked),
        ),
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
            None,
        ),
        (
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            None,
        ),
        (
            "POST / HTTP/1.1\r\ncontent-length: 7\r\ncontent-length: 7\r\n\r\n",
            Some(BodyFraming::Length(7)),
        ),
        ("POST / HTTP/1.1\r\n\r\n", Some(BodyFraming::Length(0))),
        (
            "POST / HTTP/1.1\r\ncontent-length: 7\r\ntransfer-encoding: chunked\r\n\r\n",
            None,
        ),
        (
            "POST / HTTP/1.1\r\ncontent-length: 7\r\ncontent-length: 8\r\n\r\n",
            None,
        ),
        ("POST / HTTP/1.1\r\ncontent-length: 0x10\r\n\r\n", None),
        ("POST / HTTP/1.1\r\ncontent-length: +5\r\n\r\n", None),
        ("POST / HTTP/1.1\r\ncontent-length: 5\u{a0}\r\n\r\n", None),
        (
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            None,
        ),
        ("POST / HTTP/2.0\r\n\r\n", None),
        ("PO ST / HTTP/1.1\r\n\r\n", None),
    ] {
        match (parsed(text), framing) {
            (Ok(Some(h)), Some(f)) => assert_eq!(h.framing, f, "{text:?}"),
            (Err(HeadError::Malformed(_)), None) => {}
            (other, _) => panic!("{text:?}: {other:?}"),
        }
    }
    // A coding the router does not undo: 501, whatever comes with it (it reached the engine
    // as gzip bytes under no header saying so).
    for te in ["gzip, chunked", "chunked, gzip", "gzip"] {
        let text = format!("POST / HTTP/1.1\r\ntransfer-encoding: {te}\r\n\r\n");
        match parsed(&text) {
            Err(e @ HeadError::Unsupported(_)) => {
                assert_eq!(e.to_api(1024).status, http::StatusCode::NOT_IMPLEMENTED)
            }
            other => panic!("{te}: {other:?}"),
        }
    }
}

#[test]
fn the_framing_follows_the_body_the_status_and_the_method() {
    let none = None;
    let mut headers = HeaderMap::new();
    assert_eq!(declared_length(&headers), None);
    headers.insert("content-length", HeaderValue::from_static(" 12"));
    let declared = declared_length(&headers);
    assert_eq!(declared, Some(12));
    let exact = SizeHint::with_exact(5);
    let open = SizeHint::new();
    let ok = StatusCode::OK;
    assert_eq!(
        OutFraming::choose(false, true, ok, none, &exact),
        OutFraming::Length(5)
    );
    assert_eq!(
        OutFraming::choose(false, true, ok, declared, &open),
        OutFraming::Chunked
    );
    assert_eq!(
        OutFraming::choose(false, true, ok, none, &open),
        OutFraming::Chunked
    );
    assert_eq!(
        OutFraming::choose(false, false, ok, none, &open),
        OutFraming::Close
    );
    assert_eq!(
        OutFraming::choose(true, true, ok, declared, &exact),
        OutFraming::Empty(Some(12))
    );
    assert_eq!(
        OutFraming::choose(true, true, ok, none, &exact),
        OutFraming::Empty(Some(5))
    );
    let no_content = StatusCode::NO_CONTENT;
    assert_eq!(
        OutFraming::choose(false, true, no_content, declared, &exact),
        OutFraming::Empty(None)
    );
}

#[test]
fn an_answer_head_carries_the_routers_framing_instead_of_the_relayed_one() {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("content-length", HeaderValue::from_static("999"));
    headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
    headers.insert("connection", HeaderValue::from_static("keep-alive"));
    let mut out = Vec::new();
    encode_head(
        StatusCode::NOT_FOUND,
        &headers,
        &Fields::default(),
        OutFraming::Length(3),
        Persist::Close,
        &mut out,
    );
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text}");
    assert!(
        text.contains("\r\ncontent-type: application/json\r\n"),
        "{text}"
    );
    assert!(text.contains("\r\ncontent-length: 3\r\n"), "{text}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");
    assert!(
        !text.contains("999") && !text.contains("chunked") && !text.contains("keep-alive"),
        "{text}"
    );
    let date = text
        .split("\r\ndate: ")
        .nth(1)
        .and_then(|d| d.split("\r\n").next());
    assert_eq!(date.map(str::len), Some(29), "{text}");
    assert!(text.ends_with("\r\n\r\n"));

    out.clear();
    headers.clear();
    headers.insert(
        "date",
        HeaderValue::from_static("Sat, 05 Dec 2026 02:00:00 GMT"),
    );
    encode_head(
        StatusCode::OK,
        &headers,
        &Fields::default(),
        OutFraming::Chunked,
        Persist::Default,
        &mut out,
    );
    let text = String::from_utf8_lossy(&out);
    assert_eq!(
        text,
        "HTTP/1.1 200 OK\r\ndate: Sat, 05 Dec 2026 02:00:00 GMT\r\ntransfer-encoding: chunked\r\n\r\n"
    );

    // A relayed answer's lines come first, as they are; its `date` is kept, not added twice.
    out.clear();
    let mut fields = Fields::default();
    fields.push(b"Content-Type", b"text/event-stream");
    fields.push(b"Date", b"Sat, 05 Dec 2026 02:00:00 GMT");
    let mut router = HeaderMap::new();
    router.insert("x-extra", HeaderValue::from_static("1"));
    encode_head(
        StatusCode::OK,
        &router,
        &fields,
        OutFraming::Chunked,
        Persist::KeepAlive,
        &mut out,
    );
    assert_eq!(
        String::from_utf8_lossy(&out),
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nDate: Sat, 05 Dec 2026 02:00:00 GMT\r\n\
         x-extra: 1\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
    );
}

#[test]
fn chunk_size_lines_are_hex() {
    for (n, line) in [
        (0, "0\r\n"),
        (1, "1\r\n"),
        (255, "ff\r\n"),
        (16384, "4000\r\n"),
    ] {
        let mut out = Vec::new();
        chunk_start(n, &mut out);
        assert_eq!(out, line.as_bytes());
    }
}

proptest::proptest! {
    /// `could_end` finds a blank line (`\n\n` or `\n\r\n`) in what was not scanned yet, and the
    /// 3 bytes before it, exactly where a byte-by-byte scan does.
    #[test]
    fn could_end_finds_a_blank_line_where_a_byte_scan_does(
        buf in proptest::collection::vec(proptest::sample::select(b"\r\nab:".to_vec()), 0..64),
        scanned in 0usize..70,
    ) {
        let new = &buf[scanned.saturating_sub(3).min(buf.len())..];
        let want = (0..new.len()).any(|i| {
            new[i] == b'\n' && (new.get(i + 1) == Some(&b'\n') || new.get(i + 1..i + 3) == Some(&b"\r\n"[..]))
        });
        proptest::prop_assert_eq!(super::could_end(&buf, scanned), want);
    }
}

/// A connection's future is allocated for as long as the connection lives, idle or not, so its
/// size is memory per open connection. An 8 KiB array in the error path's lingering read once
/// made it 17.8 KiB (4.2 KiB without): 39 against 25 KiB of RSS per open connection.
#[tokio::test]
async fn a_connection_future_stays_small() {
    let settings = crate::settings::Settings::with_instances(["http://127.0.0.1:1"])
        .unwrap_or_else(|e| panic!("{e}"));
    let state = std::sync::Arc::new(
        crate::state::AppState::new(settings, None).unwrap_or_else(|e| panic!("{e}")),
    );
    let (io, _peer) = tokio::io::duplex(64);
    let (_tx, mut stop) = tokio::sync::watch::channel(false);
    let serving = super::serve(io, &state, &mut stop);
    let size = std::mem::size_of_val(&serving);
    assert!(size <= 8 * 1024, "front::serve's future is {size} bytes");
}

/// Waits for a request with `await_request` on a connection whose client writes after
/// `after`; the shortest timeout is 100 ms. Returns the read and write buffers' capacities then.
async fn capacities_after_waiting(after: std::time::Duration) -> (usize, usize) {
    let timeouts = crate::settings::Timeouts {
        client_body: std::time::Duration::from_millis(100),
        ..Default::default()
    };
    let mut clock = super::Deadlines::new(&timeouts);
    let (mut io, mut client) = tokio::io::duplex(4096);
    let (_tx, mut stop) = tokio::sync::watch::channel(false);
    let (mut buf, mut out) = (
        BytesMut::with_capacity(super::READ_BUF),
        Vec::with_capacity(super::READ_BUF),
    );
    let writer = tokio::spawn(async move {
        tokio::time::sleep(after).await;
        tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\n\r\n")
            .await
            .ok();
        client
    });
    let waited = super::await_request(&mut io, &mut buf, &mut out, &mut clock, &mut stop).await;
    assert!(matches!(waited, super::Waited::Bytes));
    assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n\r\n");
    drop(writer.await);
    (buf.capacity(), out.capacity())
}

#[tokio::test]
async fn a_quiet_connection_gives_its_buffers_back_and_a_busy_one_keeps_them() {
    let (read, write) = capacities_after_waiting(std::time::Duration::ZERO).await;
    assert!(
        read >= super::READ_BUF && write >= super::READ_BUF,
        "{read} {write}"
    );
    // Quiet past the 100 ms: the request is read into the small buffer, and the write buffer
    // is made ready for its answer again.
    let (read, write) = capacities_after_waiting(std::time::Duration::from_millis(300)).await;
    assert!(read <= 2 * super::WAKE_READ, "read buffer {read}");
    assert!(write >= super::READ_BUF, "write buffer {write}");
}
