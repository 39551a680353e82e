use super::*;
use proptest::prelude::*;

fn head(text: &str) -> Result<Option<Head>, WireError> {
    parse_head(&mut BytesMut::from(text.as_bytes()), false)
}

fn framing(text: &str) -> (Framing, bool) {
    let h = head(text).expect("parses").expect("complete");
    (h.framing, h.keep_alive)
}

/// The request head `encode_request` writes for `parts`, to `host`, with `body_len` bytes.
fn written(parts: &http::request::Parts, host: &'static str, body_len: usize) -> String {
    let mut out = Vec::new();
    encode_request(parts, &HeaderValue::from_static(host), body_len, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes all of `wire` fed in pieces cut at `cuts`; the body and what follows it.
fn decode_in_pieces(
    mut d: BodyDecoder,
    wire: &[u8],
    cuts: &[usize],
) -> Result<(Vec<u8>, Vec<u8>), WireError> {
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut fed = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(wire.len())).collect();
    cuts.sort_unstable();
    cuts.push(wire.len());
    for cut in cuts {
        buf.extend_from_slice(&wire[fed..cut.max(fed)]);
        fed = cut.max(fed);
        loop {
            match d.decode(&mut buf)? {
                Decoded::Data(b) => {
                    assert!(!b.is_empty(), "no empty data pieces");
                    body.extend_from_slice(&b)
                }
                Decoded::More => break,
                Decoded::End => {
                    buf.extend_from_slice(&wire[fed..]);
                    return Ok((body, buf.to_vec()));
                }
            }
        }
    }
    Err(WireError::Chunk("ended early"))
}

fn chunked(pieces: &[&[u8]], upper: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        let size = if upper {
            format!("{:X}\r\n", p.len())
        } else {
            format!("{:x}\r\n", p.len())
        };
        out.extend_from_slice(size.as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[test]
fn a_request_head_is_framed_by_the_router() {
    let req = http::Request::post("/v1/chat/completions?x=1")
        .header("content-type", "application/json")
        .header("content-length", "999")
        .header("transfer-encoding", "chunked")
        .header("host", "client.example")
        .body(())
        .expect("request");
    let (parts, ()) = req.into_parts();
    assert_eq!(
        written(&parts, "127.0.0.1:9", 12),
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:9\r\n\
         content-type: application/json\r\ncontent-length: 12\r\n\r\n"
    );
    let (get, ()) = http::Request::get("/health")
        .body(())
        .expect("get")
        .into_parts();
    assert_eq!(
        written(&get, "h", 0),
        "GET /health HTTP/1.1\r\nhost: h\r\n\r\n"
    );
    let (post, ()) = http::Request::post("/x")
        .body(())
        .expect("post")
        .into_parts();
    assert!(written(&post, "h", 0).ends_with("content-length: 0\r\n\r\n"));
    for n in [0usize, 7, 10, 1234567890, usize::MAX] {
        let text = written(&post, "h", n);
        assert!(
            text.ends_with(&format!("content-length: {n}\r\n\r\n")),
            "{text}"
        );
    }
}

/// The client's request as an instance gets it: what belongs to the client's connection, or
/// to the router, is left out (RFC 9110 section 7.6.1).
#[test]
fn a_request_head_leaves_out_hop_by_hop_headers_and_what_connection_names() {
    let (mut parts, ()) = http::Request::post("http://client.example/v1/chat/completions?x=1")
        .header("host", "client.example")
        .header("content-length", "2")
        .header("expect", "100-continue")
        .header("connection", "keep-alive, X-Secret")
        .header("x-secret", "1")
        .header("keep-alive", "timeout=5")
        .header("proxy-connection", "keep-alive")
        .header("transfer-encoding", "chunked")
        .header("te", "trailers")
        .header("trailer", "x-t")
        .header("upgrade", "h2c")
        .header("proxy-authorization", "Basic eA==")
        .header("content-type", "application/json")
        .header("authorization", "Bearer k")
        .header("x-a", "1")
        .header("x-a", "2")
        .body(())
        .expect("request")
        .into_parts();
    parts.version = http::Version::HTTP_2;
    assert_eq!(
        written(&parts, "h:1", 2),
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: h:1\r\ncontent-type: application/json\r\n\
         authorization: Bearer k\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 2\r\n\r\n"
    );
    // Without `Connection`, no header is taken for a name it lists.
    let (parts, ()) = http::Request::post("/x")
        .header("connection", "close")
        .header("x-secret", "1")
        .body(())
        .expect("request")
        .into_parts();
    assert_eq!(
        written(&parts, "h", 0),
        "POST /x HTTP/1.1\r\nhost: h\r\nx-secret: 1\r\ncontent-length: 0\r\n\r\n"
    );
}

#[test]
fn heads_parse_only_when_complete() {
    let text = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nabc";
    for end in 0..text.len() - 3 {
        let mut partial = BytesMut::from(&text.as_bytes()[..end]);
        assert!(
            parse_head(&mut partial, false).expect("no error").is_none(),
            "{end}"
        );
        assert_eq!(partial.len(), end, "an incomplete head stays in the buffer");
    }
    let mut buf = BytesMut::from(text.as_bytes());
    let h = parse_head(&mut buf, false)
        .expect("parses")
        .expect("complete");
    assert_eq!(
        &buf[..],
        b"abc",
        "what follows the head stays in the buffer"
    );
    assert_eq!(h.status, StatusCode::OK);
    assert_eq!(h.version, Version::HTTP_11);
    // Framing headers are the front's to write: only the end-to-end ones are kept.
    assert_eq!(h.fields.lines(), b"content-type: text/event-stream\r\n");
    assert!(h.fields.is_event_stream());
    assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, true));
}

#[test]
fn hop_by_hop_headers_and_those_connection_names_are_left_out() {
    let h = head(
        "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nX-Trace: 1\r\nConnection: keep-alive, X-Trace\r\n\
         Server: vllm\r\nContent-Length: 2\r\nTE: trailers\r\nProxy-Connection: x\r\n\
         Upgrade: h2c\r\nDate: Sat, 05 Dec 2026 02:00:00 GMT\r\nX-Empty:\r\nX-Spaced:  v w \r\n\r\n",
    )
    .expect("parses")
    .expect("complete");
    assert_eq!(
        String::from_utf8_lossy(h.fields.lines()),
        "Server: vllm\r\nDate: Sat, 05 Dec 2026 02:00:00 GMT\r\nX-Empty: \r\nX-Spaced:  v w\r\n",
        "each line as the instance spelled it; an empty value written out"
    );
    assert!(h.fields.has_date());
    assert_eq!(h.fields.content_length(), Some(2));
    assert_eq!((h.framing, h.keep_alive), (Framing::Length(2), true));
    // An instance's own routing headers (another router in front of it) give way to ours.
    let h = head(
        "HTTP/1.1 200 OK\r\nX-Prefix-Router-Instance: inner\r\nx-prefix-router-decision: cold\r\n\
         x-prefix-router-group: t\r\n\r\n",
    )
    .expect("parses")
    .expect("complete");
    assert_eq!(h.fields.lines(), b"x-prefix-router-group: t\r\n");
    // Without a name listed in `Connection`, a header of that name stays.
    let h = head("HTTP/1.1 204 No Content\r\nConnection: close\r\nX-Trace: 1\r\n\r\n")
        .expect("parses")
        .expect("complete");
    assert_eq!(h.fields.lines(), b"X-Trace: 1\r\n");
    assert!(!h.keep_alive);
}

#[test]
fn framing_follows_rfc_9112() {
    let ok = "HTTP/1.1 200 OK\r\n";
    assert_eq!(
        framing(&format!("{ok}content-length: 5\r\n\r\n")),
        (Framing::Length(5), true)
    );
    // Transfer-Encoding wins over Content-Length, which is then not declared on.
    let both = head(&format!(
        "{ok}content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"
    ))
    .expect("parses")
    .expect("complete");
    assert_eq!((both.framing, both.keep_alive), (Framing::Chunked, true));
    assert_eq!(both.fields.content_length(), None);
    // A coding the router would pass on undone, under a header the client never sees: refused.
    for coded in ["gzip, chunked", "chunked, gzip", "deflate"] {
        let e = head(&format!("{ok}transfer-encoding: {coded}\r\n\r\n")).err();
        assert!(
            matches!(&e, Some(WireError::Head(m)) if m.contains("transfer-coding")),
            "{coded}: {e:?}"
        );
    }
    assert_eq!(
        framing(&format!("{ok}transfer-encoding: identity, chunked\r\n\r\n")),
        (Framing::Chunked, true)
    );
    assert_eq!(framing(&format!("{ok}\r\n")), (Framing::Close, false));
    assert_eq!(
        framing(&format!(
            "{ok}content-length: 7\r\ncontent-length: 7\r\n\r\n"
        )),
        (Framing::Length(7), true)
    );
    assert_eq!(
        framing(&format!(
            "{ok}content-length: 7\r\nconnection: Close\r\n\r\n"
        )),
        (Framing::Length(7), false)
    );
    assert_eq!(
        framing("HTTP/1.0 200 OK\r\ncontent-length: 7\r\n\r\n"),
        (Framing::Length(7), false)
    );
    assert_eq!(
        framing("HTTP/1.0 200 OK\r\ncontent-length: 7\r\nconnection: keep-alive\r\n\r\n"),
        (Framing::Length(7), true)
    );
    for bodiless in ["204 No Content", "304 Not Modified", "100 Continue"] {
        assert_eq!(
            framing(&format!("HTTP/1.1 {bodiless}\r\ncontent-length: 9\r\n\r\n")),
            (Framing::Length(0), true)
        );
    }
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n"[..]);
    let h = parse_head(&mut buf, true)
        .expect("parses")
        .expect("complete");
    assert_eq!(
        h.framing,
        Framing::Length(0),
        "the answer to HEAD has no body"
    );
}

#[test]
fn bad_heads_are_errors_that_say_what() {
    let conflicting = head("HTTP/1.1 200 OK\r\ncontent-length: 7\r\ncontent-length: 8\r\n\r\n");
    assert!(matches!(conflicting, Err(WireError::Head(m)) if m.contains("conflicting")));
    for bad in ["-1", "7a", "", "1 2"] {
        let text = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
        assert!(matches!(head(&text), Err(WireError::Head(_))), "{bad:?}");
    }
    assert!(matches!(
        head("HTTP/2 200 OK\r\n\r\n"),
        Err(WireError::Head(_))
    ));
    assert!(matches!(
        head("SMTP ready\r\n\r\n"),
        Err(WireError::Head(_))
    ));
    assert_eq!(
        head("HTTP/1.1 101 Switching Protocols\r\n\r\n").err(),
        Some(WireError::Upgrade)
    );
    let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD + 1));
    assert_eq!(head(&huge).err(), Some(WireError::HeadTooLarge));
}

#[test]
fn chunked_bodies_decode_with_extensions_and_trailers() {
    let wire =
        b"5;name=value\r\nhello\r\n1 \r\n!\r\nA\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
    let (body, rest) = decode_in_pieces(BodyDecoder::new(Framing::Chunked), wire, &[]).expect("ok");
    assert_eq!(body, b"hello!0123456789");
    assert_eq!(rest, b"NEXT", "what follows the body stays in the buffer");
}

#[test]
fn broken_chunked_bodies_are_errors() {
    let cases: [(&[u8], &str); 9] = [
        // A bare LF ending the body: what follows must not be read as the next request.
        (
            b"2\r\nab\r\n0\r\n\nGET / HTTP/1.1\r\n\r\n",
            "trailer line not ended by CRLF",
        ),
        (
            b"2\r\nab\r\n0\r\nx-t: 1\n\r\n",
            "trailer line not ended by CRLF",
        ),
        (
            b"2\r\nab\r\n0\r\nno colon\r\n\r\n",
            "trailer line is not a field",
        ),
        (b"zz\r\nab\r\n0\r\n\r\n", "size line without a size"),
        (b"2x\r\nab\r\n0\r\n\r\n", "invalid character in a size line"),
        (b"2\r\nabXY0\r\n\r\n", "chunk data not followed by CRLF"),
        (b"2\nab\r\n0\r\n\r\n", "size line not ended by CRLF"),
        (b"ffffffffffffffff\r\n", "chunk size too large"),
        (b"\r\n", "size line without a size"),
    ];
    for (wire, why) in cases {
        assert_eq!(
            decode_in_pieces(BodyDecoder::new(Framing::Chunked), wire, &[]).err(),
            Some(WireError::Chunk(why)),
            "{}",
            String::from_utf8_lossy(wire)
        );
    }
    let long = vec![b'1'; MAX_LINE + 1];
    assert_eq!(
        decode_in_pieces(BodyDecoder::new(Framing::Chunked), &long, &[]).err(),
        Some(WireError::Chunk("size line too long"))
    );
}

#[test]
fn a_trailer_section_is_bounded_as_a_whole_not_only_line_by_line() {
    // Short lines, each far under the bound: only their sum can exceed it.
    let line = b"x-t: 0123456789abcdef0123456789abcdef\r\n";
    let fits = MAX_TRAILERS / line.len() - 1;
    let wire = |lines: usize| {
        let mut w = b"2\r\nab\r\n0\r\n".to_vec();
        for _ in 0..lines {
            w.extend_from_slice(line);
        }
        w.extend_from_slice(b"\r\nNEXT");
        w
    };
    // Fed a line at a time, as a peer trickling them would.
    let cuts = |w: &[u8]| (0..w.len()).step_by(line.len()).collect::<Vec<_>>();
    let ok = wire(fits);
    let (body, rest) =
        decode_in_pieces(BodyDecoder::new(Framing::Chunked), &ok, &cuts(&ok)).expect("fits");
    assert_eq!(
        (body.as_slice(), rest.as_slice()),
        (&b"ab"[..], &b"NEXT"[..])
    );
    let endless = wire(fits * 4);
    assert_eq!(
        decode_in_pieces(
            BodyDecoder::new(Framing::Chunked),
            &endless,
            &cuts(&endless)
        )
        .err(),
        Some(WireError::Chunk("trailers too long"))
    );
}

#[test]
fn length_and_close_bodies_take_what_is_theirs() {
    let (body, rest) =
        decode_in_pieces(BodyDecoder::new(Framing::Length(5)), b"helloNEXT", &[2]).expect("ok");
    assert_eq!(
        (body.as_slice(), rest.as_slice()),
        (&b"hello"[..], &b"NEXT"[..])
    );
    let mut empty = BodyDecoder::new(Framing::Length(0));
    assert!(empty.is_end());
    assert_eq!(
        empty.decode(&mut BytesMut::from(&b"x"[..])),
        Ok(Decoded::End)
    );
    let mut close = BodyDecoder::new(Framing::Close);
    let mut buf = BytesMut::from(&b"all of it"[..]);
    assert_eq!(close.decode(&mut buf), data(b"all of it"));
    assert_eq!(close.decode(&mut buf), Ok(Decoded::More));
    assert!(!close.is_end());
}

/// A data piece as `decode` returns it.
fn data(bytes: &'static [u8]) -> Result<Decoded, WireError> {
    Ok(Decoded::Data(Bytes::from_static(bytes)))
}

/// Every `decode` result of `wire` in one buffer, until `More`, `End` or an error.
fn decode_all_at_once(wire: &[u8]) -> Vec<Result<Decoded, WireError>> {
    let mut d = BodyDecoder::new(Framing::Chunked);
    let mut buf = BytesMut::from(wire);
    let mut out = Vec::new();
    loop {
        let r = d.decode(&mut buf);
        let last = !matches!(r, Ok(Decoded::Data(_)));
        out.push(r);
        if last {
            return out;
        }
    }
}

#[test]
fn whole_chunks_in_one_read_come_out_as_one_piece() {
    let tokens: Vec<Vec<u8>> = (0..16)
        .map(|i| format!("data: {{\"token\":{i}}}\n\n").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = tokens.iter().map(Vec::as_slice).collect();
    assert_eq!(
        decode_all_at_once(&chunked(&refs, false)),
        vec![
            Ok(Decoded::Data(Bytes::from(tokens.concat()))),
            Ok(Decoded::End)
        ]
    );
    // A lone chunk goes out as it is.
    assert_eq!(
        decode_all_at_once(&chunked(&[b"one"], false)),
        vec![data(b"one"), Ok(Decoded::End)]
    );
}

#[test]
fn joined_chunks_stay_in_the_read_buffer_without_a_copy() {
    // Three chunks and the start of a fourth in one read: the joined data is a slice of the
    // buffer the socket filled (moved back over the framing), not a new allocation, and what
    // follows it is still decoded right.
    let wire = b"3\r\nabc\r\n2\r\nde\r\n4\r\nfghi\r\n5\r\njk";
    let mut buf = BytesMut::from(&wire[..]);
    let range = buf.as_ptr_range();
    let mut d = BodyDecoder::new(Framing::Chunked);
    let Ok(Decoded::Data(joined)) = d.decode(&mut buf) else {
        panic!("data first");
    };
    assert_eq!(&joined[..], b"abcdefghi");
    assert!(
        range.contains(&joined.as_ptr()),
        "the joined chunks were copied out of the read buffer"
    );
    assert_eq!(d.decode(&mut buf), data(b"jk"));
    buf.extend_from_slice(b"lmn\r\n0\r\n\r\n");
    assert_eq!(d.decode(&mut buf), data(b"lmn"));
    assert_eq!(d.decode(&mut buf), Ok(Decoded::End));
}

#[test]
fn joining_stops_at_a_chunk_still_arriving_and_at_the_size_bound() {
    // The third chunk's data is cut short: the first two come out joined, then the third's
    // part, then the decoder waits for the rest.
    let wire = b"3\r\nabc\r\n2\r\nde\r\n5\r\nfg";
    assert_eq!(
        decode_all_at_once(wire),
        vec![data(b"abcde"), data(b"fg"), Ok(Decoded::More)]
    );
    // Forty 1 KiB chunks: pieces of at least JOIN_MAX bytes, at most one chunk more.
    let big = vec![b'x'; 1024];
    let refs: Vec<&[u8]> = (0..40).map(|_| big.as_slice()).collect();
    let pieces = decode_all_at_once(&chunked(&refs, true));
    let sizes: Vec<usize> = pieces
        .iter()
        .filter_map(|p| match p {
            Ok(Decoded::Data(b)) => Some(b.len()),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, vec![JOIN_MAX, JOIN_MAX, 40 * 1024 - 2 * JOIN_MAX]);
}

#[test]
fn a_malformed_chunk_after_good_ones_is_refused_after_their_data() {
    // A bad size line, then data not followed by CRLF: the joined data stops before each, then
    // the error.
    for (wire, error) in [
        (
            &b"3\r\nabc\r\n2\r\nde\r\nzz\r\nfg\r\n0\r\n\r\n"[..],
            "size line without a size",
        ),
        (
            &b"3\r\nabc\r\n2\r\ndeXX"[..],
            "chunk data not followed by CRLF",
        ),
    ] {
        assert_eq!(
            decode_all_at_once(wire),
            vec![data(b"abcde"), Err(WireError::Chunk(error))]
        );
    }
}

proptest! {
    /// However the wire is cut into reads, a chunked body decodes to the same bytes and leaves
    /// what follows it untouched.
    #[test]
    fn chunked_decoding_does_not_depend_on_how_reads_split_the_wire(
        pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 0..8),
        cuts in proptest::collection::vec(0usize..3000, 0..12),
        upper in any::<bool>(),
    ) {
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        let mut wire = chunked(&refs, upper);
        wire.extend_from_slice(b"HTTP/1.1");
        let (body, rest) = decode_in_pieces(BodyDecoder::new(Framing::Chunked), &wire, &cuts)
            .expect("decodes");
        prop_assert_eq!(body, pieces.concat());
        prop_assert_eq!(rest, b"HTTP/1.1".to_vec());
    }

    /// The one-pass read of a plain size line agrees with the general one wherever it answers.
    #[test]
    fn the_plain_size_line_reads_as_the_general_one(
        digits in "[0-9a-fA-F]{0,17}",
        end in prop::sample::select(vec!["\r\n", "\r", "", ";x=1\r\n", " \r\n", "\n", "\rx"]),
    ) {
        let line = format!("{digits}{end}");
        if let Some((size, len)) = plain_size_line(line.as_bytes()) {
            let nl = line_end(line.as_bytes(), MAX_LINE, "long").expect("ends").expect("here");
            let general = chunk_size(&line.as_bytes()[..nl - 1]).expect("valid");
            prop_assert_eq!((size, len), (general, nl + 1));
            prop_assert_eq!(end, "\r\n");
        } else {
            prop_assert!(end != "\r\n" || digits.is_empty() || digits.len() > 15);
        }
    }

    /// Whatever the instance sends, the decoders return an answer or an error, never panic,
    /// and never hand out more body than was fed.
    #[test]
    fn arbitrary_bytes_never_panic(wire in proptest::collection::vec(any::<u8>(), 0..600),
                                   cuts in proptest::collection::vec(0usize..600, 0..6)) {
        let _ = parse_head(&mut BytesMut::from(&wire[..]), false);
        if let Ok((body, _)) = decode_in_pieces(BodyDecoder::new(Framing::Chunked), &wire, &cuts) {
            prop_assert!(body.len() <= wire.len());
        }
    }
}

#[test]
fn a_head_with_many_headers_parses_and_too_many_is_an_error() {
    let many: String = (0..40).map(|i| format!("x-h{i}: v{i}\r\n")).collect();
    let h = head(&format!(
        "HTTP/1.1 200 OK\r\n{many}content-length: 2\r\n\r\n"
    ))
    .expect("parses")
    .expect("complete");
    assert_eq!(h.fields.lines(), many.as_bytes());
    assert_eq!(h.fields.content_length(), Some(2));
    assert_eq!(h.framing, Framing::Length(2));
    let too_many: String = (0..101).map(|i| format!("x-h{i}: v\r\n")).collect();
    let err = head(&format!("HTTP/1.1 200 OK\r\n{too_many}\r\n")).err();
    assert!(
        matches!(&err, Some(WireError::Head(m)) if m.contains("too many headers")),
        "{err:?}"
    );
}

proptest! {
    /// `decimal` reads what the string check and `parse::<u64>` of ASCII-trimmed
    /// digits read, and refuses what they refused.
    #[test]
    fn content_length_agrees_with_parse(v in proptest::collection::vec(
        proptest::sample::select(b"0123456789 \t+-a\xa0".to_vec()), 0..24,
    )) {
        let want = std::str::from_utf8(v.trim_ascii())
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok());
        prop_assert_eq!(decimal(&v), want);
    }
}

#[test]
fn content_length_reads_up_to_u64_max() {
    assert_eq!(decimal(b" 18446744073709551615\t"), Some(u64::MAX));
    assert_eq!(decimal(b"18446744073709551616"), None);
    assert_eq!(decimal(b"007"), Some(7));
    assert_eq!(decimal(b""), None);
    assert_eq!(decimal(b" "), None);
}
