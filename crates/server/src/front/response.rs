//! An answer's head and body framing on the client's HTTP/1.1 connection ([RFC 9112]).
//!
//! Pure functions over a buffer, as [`super::request`] is. The router frames every answer
//! itself: framing headers a relayed answer carried (`content-length`, `transfer-encoding`,
//! `connection`) are replaced by its own, chosen from what the body says of its length.
//!
//! [RFC 9112]: https://www.rfc-editor.org/rfc/rfc9112

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, StatusCode};
use http_body::SizeHint;

use crate::fields::Fields;

/// How an answer's body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutFraming {
    /// No body bytes at all (`HEAD`, `204`, `304`); `Some` length is still announced.
    Empty(Option<u64>),
    /// `content-length`: exactly this many bytes.
    Length(u64),
    /// `transfer-encoding: chunked` (an HTTP/1.1 client, length unknown up front).
    Chunked,
    /// Until the router closes the connection (an HTTP/1.0 client, length unknown).
    Close,
}

impl OutFraming {
    /// The framing for an answer: `head` (the request was `HEAD`), `http11` (the client
    /// speaks HTTP/1.1), the answer's status, the `content-length` its headers declare and what
    /// its body says of its length.
    pub fn choose(
        head: bool,
        http11: bool,
        status: StatusCode,
        declared: Option<u64>,
        hint: &SizeHint,
    ) -> Self {
        if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return OutFraming::Empty(None);
        }
        if head {
            return OutFraming::Empty(declared.or(hint.exact()));
        }
        // The body's own length only: a relayed answer may carry a content-length beside a
        // chunked framing of its own, which the router does not follow.
        match hint.exact() {
            Some(n) => OutFraming::Length(n),
            None if http11 => OutFraming::Chunked,
            None => OutFraming::Close,
        }
    }
}

/// The `content-length` that `headers` declare, if a number.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// What the `connection` header says, beside the framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// HTTP/1.1 and the connection stays: nothing to say.
    Default,
    /// An HTTP/1.0 client that asked to keep the connection.
    KeepAlive,
    /// The router closes the connection after this answer.
    Close,
}

/// Writes the head of an answer to `out`: status line, a relayed answer's own header lines
/// (`fields`), its headers but the framing ones, then the router's framing, `connection` and
/// (when the answer has none) `date`.
pub fn encode_head(
    status: StatusCode,
    headers: &HeaderMap,
    fields: &Fields,
    framing: OutFraming,
    persist: Persist,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(fields.lines());
    for (name, value) in headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING || name == CONNECTION {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        OutFraming::Length(n) | OutFraming::Empty(Some(n)) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        OutFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        OutFraming::Empty(None) | OutFraming::Close => {}
    }
    match persist {
        Persist::Default => {}
        Persist::KeepAlive => out.extend_from_slice(b"connection: keep-alive\r\n"),
        Persist::Close => out.extend_from_slice(b"connection: close\r\n"),
    }
    if !fields.has_date() && !headers.contains_key(DATE) {
        out.extend_from_slice(b"date: ");
        with_date(|d| out.extend_from_slice(d));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes a chunk's size line (hex, CRLF) for `len` bytes of data.
pub fn chunk_start(len: usize, out: &mut Vec<u8>) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut n = len;
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// The end of a chunk's data.
pub const CHUNK_END: &[u8] = b"\r\n";
/// The last chunk of a chunked body, with no trailers.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

thread_local! {
    /// The `date` value of the current second, formatted once per second per thread.
    static DATE_NOW: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Calls `f` with the current time as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn with_date(f: impl FnOnce(&[u8])) {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE_NOW.with_borrow_mut(|(at, text)| {
        if *at != secs {
            let formatted = httpdate::fmt_http_date(now);
            if formatted.len() == text.len() {
                text.copy_from_slice(formatted.as_bytes());
                *at = secs;
            }
        }
        f(&text[..]);
    });
}
