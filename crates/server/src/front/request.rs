//! A client's request head: parsed (httparse) out of the connection's read buffer into the
//! `http` types the handler takes, with how its body is framed ([RFC 9112] section 6).
//!
//! Pure over a buffer, so every rule is tested without a socket. The framing rules are strict
//! where a proxy must be: a request whose length two hops could read differently (both
//! `Content-Length` and `Transfer-Encoding`, differing lengths, a coding other than chunked
//! last) is refused, never guessed at, since the router forwards what it read to an engine.
//!
//! [RFC 9112]: https://www.rfc-editor.org/rfc/rfc9112

use bytes::BytesMut;
use http::header::{
    HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING,
};
use http::{HeaderMap, Method, Uri, Version};

use crate::error::ApiError;
use crate::h1::tokens;

/// Most request headers accepted (hyper's server default too).
const MAX_HEADERS: usize = 100;

/// How a request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// Exactly this many bytes (no body at all is `Length(0)`).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub struct RequestHead {
    /// Method, URI, version and headers, as the handler takes them.
    pub parts: http::request::Parts,
    /// How the body is framed.
    pub framing: BodyFraming,
    /// Whether the client keeps the connection for another request.
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for a `100 Continue` before sending its body.
    pub expect_continue: bool,
}

/// Why a head is refused: each becomes an OpenAI-shaped 4xx and the connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadError {
    /// Not HTTP/1.x, or a framing a proxy must not guess at: 400.
    Malformed(&'static str),
    /// A transfer-coding other than one `chunked`: 501 (RFC 9112 section 6.1).
    Unsupported(&'static str),
    /// Over `limits.max_header_bytes`, or more than 100 headers: 431.
    TooLarge,
    /// More headers than the first parse had room for: parsed again with room for 100 (never
    /// returned by [`parse`]).
    ManyHeaders,
}

impl HeadError {
    /// The answer to send before closing.
    pub fn to_api(&self, max_header_bytes: usize) -> ApiError {
        match self {
            HeadError::Malformed(what) => crate::canned::malformed(what),
            HeadError::Unsupported(what) => crate::canned::not_implemented(what),
            HeadError::TooLarge | HeadError::ManyHeaders => {
                crate::canned::head_too_large(max_header_bytes)
            }
        }
    }
}

/// Parses the request head at the start of `buf` and takes it from there; `None` (and `buf`
/// untouched) while incomplete. `max_head`: the most bytes a head may take. Header values and
/// the URI share the head's bytes instead of each being copied.
pub fn parse(buf: &mut BytesMut, max_head: usize) -> Result<Option<RequestHead>, HeadError> {
    // Clients send a handful of headers: room for 24 first (the arrays are set up on every
    // request), and for all MAX_HEADERS only when that is too few.
    match parse_in::<24>(buf, max_head) {
        Err(HeadError::ManyHeaders) => parse_many(buf, max_head),
        other => other,
    }
}

/// The rare head with more than 24 headers, out of line so that its arrays do not make every
/// request's parse reserve a frame their size (as in [`crate::h1::parse_head`]).
#[cold]
#[inline(never)]
fn parse_many(buf: &mut BytesMut, max_head: usize) -> Result<Option<RequestHead>, HeadError> {
    parse_in::<MAX_HEADERS>(buf, max_head)
}

/// Where a name or value lies in the head (offset, length): the head is split off the buffer
/// (frozen) once httparse's borrow ends, and values become slices of it.
type Span = (u32, u32);

fn parse_in<const N: usize>(
    buf: &mut BytesMut,
    max_head: usize,
) -> Result<Option<RequestHead>, HeadError> {
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut req = httparse::Request::new(&mut slots);
    let len = match req.parse(&buf[..]) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() > max_head => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) if N < MAX_HEADERS => {
            return Err(HeadError::ManyHeaders)
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => {
            return Err(HeadError::Malformed(
                "the request line or a header could not be parsed",
            ))
        }
    };
    if len > max_head {
        return Err(HeadError::TooLarge);
    }
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Malformed("the method is not a valid token"))?;
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let base = buf.as_ptr() as usize;
    let at = |s: &[u8]| ((s.as_ptr() as usize - base) as u32, s.len() as u32);
    let path = at(req.path.unwrap_or_default().as_bytes());
    let mut spans = [((0u32, 0u32), (0u32, 0u32)); N];
    let count = req.headers.len();
    for (span, h) in spans.iter_mut().zip(req.headers.iter()) {
        *span = (at(h.name.as_bytes()), at(h.value));
    }
    let head = buf.split_to(len).freeze();
    let slice = |(s, l): Span| head.slice(s as usize..(s + l) as usize);
    let uri = Uri::from_maybe_shared(slice(path))
        .map_err(|_| HeadError::Malformed("the URI could not be parsed"))?;
    let mut headers = HeaderMap::with_capacity(count);
    let mut length = None::<u64>;
    // Codings accumulate over repeated headers. Only one `chunked` is followed: a request body
    // under another coding (gzip, say) would reach the engine undone under a header it never
    // sees (transfer-encoding is hop-by-hop), as bytes that do not parse.
    let (mut coded, mut chunked, mut other) = (false, 0u32, false);
    let (mut close, mut keep, mut expect_continue) = (false, false, false);
    for &(name, value) in &spans[..count] {
        let raw_value = slice(value);
        let name = HeaderName::from_bytes(&head[name.0 as usize..(name.0 + name.1) as usize])
            .map_err(|_| HeadError::Malformed("a header name is invalid"))?;
        if name == CONTENT_LENGTH {
            let n = crate::h1::decimal(&raw_value)
                .ok_or(HeadError::Malformed("content-length is not a number"))?;
            if length.is_some_and(|l| l != n) {
                return Err(HeadError::Malformed("conflicting content-length values"));
            }
            length = Some(n);
        } else if name == TRANSFER_ENCODING {
            for t in tokens(&raw_value) {
                if t.eq_ignore_ascii_case(b"chunked") {
                    chunked += 1;
                } else {
                    other = true;
                }
            }
            coded = true;
        } else if name == CONNECTION {
            for t in tokens(&raw_value) {
                close |= t.eq_ignore_ascii_case(b"close");
                keep |= t.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == EXPECT {
            expect_continue |= raw_value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        }
        let value = HeaderValue::from_maybe_shared(raw_value)
            .map_err(|_| HeadError::Malformed("a header value is invalid"))?;
        headers.append(name, value);
    }
    let framing = match (coded, length) {
        (false, n) => BodyFraming::Length(n.unwrap_or(0)),
        (true, Some(_)) => {
            return Err(HeadError::Malformed(
                "both content-length and transfer-encoding are set",
            ))
        }
        (true, None) if version == Version::HTTP_10 => {
            return Err(HeadError::Malformed(
                "transfer-encoding in an HTTP/1.0 request",
            ))
        }
        (true, None) if other => {
            return Err(HeadError::Unsupported(
                "only the chunked transfer-coding is supported",
            ))
        }
        (true, None) if chunked != 1 => {
            return Err(HeadError::Malformed(
                "the transfer-encoding is not chunked once",
            ))
        }
        (true, None) => BodyFraming::Chunked,
    };
    let keep_alive = !close && (version == Version::HTTP_11 || keep);
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(RequestHead {
        parts,
        framing,
        keep_alive,
        expect_continue: expect_continue && version == Version::HTTP_11,
    }))
}
