//! The HTTP/1.1 wire of upstream connections: the request head written, the response head
//! parsed (httparse), and the response body's framing decoded ([RFC 9112]).
//!
//! Pure functions over buffers, so every rule is tested without a socket; [`crate::pool`] does
//! the I/O. Written for the router rather than taken from hyper's client because hyper's
//! chunked decoder takes the size line and each CRLF one byte at a time (a `Bytes` per byte),
//! and hands each chunk to the request's task through a channel: per streamed token that was
//! the largest part of the router's instructions (BENCHMARKS.md, "A leaner upstream client").
//! Here a size line is read in one pass, a lone chunk's data is a slice of the read buffer,
//! and the whole chunks of one read leave as one copy (`take_joined`).
//!
//! [RFC 9112]: https://www.rfc-editor.org/rfc/rfc9112

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, EXPECT, HOST};
use http::{Method, StatusCode, Version};

use crate::fields::Fields;
use crate::upstream::{is_hop_by_hop, is_router_owned};

/// Largest response head accepted (status line and headers).
pub const MAX_HEAD: usize = 64 * 1024;
/// Most response headers accepted (hyper's client default too). Engines send a dozen.
const MAX_HEADERS: usize = 100;
/// Longest chunk size line (size, extensions, CRLF).
const MAX_LINE: usize = 4 * 1024;
/// Longest trailer section, all its lines together: each line is read past and dropped, so
/// without a bound on the whole a peer could keep a body open with trailer lines forever.
const MAX_TRAILERS: usize = 16 * 1024;
/// Most bytes of a chunked body's data taken as one piece when several chunks are here at once
/// (`take_joined`).
const JOIN_MAX: usize = 16 * 1024;

/// An instance's answer the router cannot read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The status line or a header is not HTTP/1.x.
    #[error("malformed response head: {0}")]
    Head(String),
    /// The head did not end within [`MAX_HEAD`] bytes.
    #[error("response head larger than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// `101 Switching Protocols`: the router relays requests, not upgraded connections.
    #[error("the instance switched protocols (101), which the router does not relay")]
    Upgrade,
    /// More headers than a first, small parse had room for (retried with room for all).
    #[error("too many headers")]
    TooManyHeaders,
    /// A chunked body broke its framing.
    #[error("malformed chunked body: {0}")]
    Chunk(&'static str),
}

/// Writes the head of `parts` (origin form) with `host`, framed by `body_len` bytes of body.
/// What the router does not pass on is left out here, with no copy of the client's headers
/// made first: framing headers (the router frames what it sends), `host` (the instance's),
/// `expect` (the router already holds the whole body), hop-by-hop headers and those the
/// client's `Connection` names.
pub fn encode_request(
    parts: &http::request::Parts,
    host: &HeaderValue,
    body_len: usize,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    // Whether a `Connection` header lists names besides its options, found by a pass over the
    // few headers there are (a lookup by name hashed it: about 100 instructions per request);
    // only then is each header looked for among those names.
    let lists = parts
        .headers
        .iter()
        .any(|(n, v)| n == CONNECTION && lists_names(v.as_bytes()));
    for (name, value) in &parts.headers {
        if name == HOST
            || name == CONTENT_LENGTH
            || name == EXPECT
            || is_hop_by_hop(name.as_str().as_bytes())
            || (lists
                && parts
                    .headers
                    .get_all(CONNECTION)
                    .iter()
                    .any(|v| names(v.as_bytes(), name.as_str().as_bytes())))
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // A body, or a method whose requests carry one: say its length (0 included), as hyper did.
    let has_body_method = !matches!(
        parts.method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::CONNECT
    );
    if body_len > 0 || has_body_method {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// How the body of an answer ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes (`Content-Length`; no body at all is `Length(0)`).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the instance closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    /// Status.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// The end-to-end headers, as the client is to get them.
    pub fields: Fields,
    /// How the body ends.
    pub framing: Framing,
    /// Whether the connection can carry another request once the body ended.
    pub keep_alive: bool,
}

/// Parses the response head at the start of `buf` and takes it from there; `None` (and `buf`
/// untouched) while incomplete. Interim answers (`1xx` but 101) come back as heads too: the
/// caller skips them. `head_request`: the request was `HEAD` (its answer has no body whatever
/// it says). The end-to-end headers are copied once, as lines ([`Fields`]).
pub fn parse_head(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, WireError> {
    // Engines send a handful of headers: room for 16 first (the arrays are set up on every
    // answer), and for all MAX_HEADERS only when that is too few.
    match parse_head_in::<16>(buf, head_request) {
        Err(WireError::TooManyHeaders) => parse_many_headers(buf, head_request),
        other => other,
    }
}

/// The rare head with more than 16 headers. Kept out of line: inlined, its arrays (about 5 KiB)
/// made every answer's parse reserve and probe a stack frame that size.
#[cold]
#[inline(never)]
fn parse_many_headers(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, WireError> {
    parse_head_in::<MAX_HEADERS>(buf, head_request)
}

fn parse_head_in<const N: usize>(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<Head>, WireError> {
    let mut slots = [httparse::EMPTY_HEADER; N];
    let mut resp = httparse::Response::new(&mut slots);
    let len = match resp.parse(&buf[..]) {
        Ok(httparse::Status::Complete(len)) => len,
        Err(httparse::Error::TooManyHeaders) if N < MAX_HEADERS => {
            return Err(WireError::TooManyHeaders)
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(WireError::HeadTooLarge)
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(WireError::Head(e.to_string())),
    };
    if len > MAX_HEAD {
        return Err(WireError::HeadTooLarge);
    }
    let code = resp.code.unwrap_or_default();
    let status =
        StatusCode::from_u16(code).map_err(|_| WireError::Head(format!("status {code}")))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(WireError::Upgrade);
    }
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // The end-to-end headers are copied out as lines, as the instance wrote them; the head then
    // leaves the buffer.
    let headers = &*resp.headers;
    let (mut chunked, mut coded, mut length) = (false, false, None::<u64>);
    let (mut close, mut keep, mut named) = (false, false, false);
    for h in headers {
        let (raw_name, raw_value) = (h.name.as_bytes(), h.value);
        // By length first: most names are none of these, found with one comparison.
        match raw_name.len() {
            17 if raw_name.eq_ignore_ascii_case(b"transfer-encoding") => {
                // Only chunked framing is followed. Any other coding (gzip, say) would reach the
                // client undone under a header it never sees (transfer-encoding is hop-by-hop),
                // as corrupt bytes: refused instead. Engines send none.
                if let Some(other) = tokens(raw_value).find(|t| {
                    !t.eq_ignore_ascii_case(b"chunked") && !t.eq_ignore_ascii_case(b"identity")
                }) {
                    return Err(WireError::Head(format!(
                        "unsupported transfer-coding {:?}",
                        String::from_utf8_lossy(other)
                    )));
                }
                let last = tokens(raw_value).last().unwrap_or_default();
                coded = true;
                chunked = last.eq_ignore_ascii_case(b"chunked");
            }
            14 if raw_name.eq_ignore_ascii_case(b"content-length") => {
                let n = decimal(raw_value)
                    .ok_or_else(|| WireError::Head("content-length is not a number".into()))?;
                if length.is_some_and(|l| l != n) {
                    return Err(WireError::Head("conflicting content-length values".into()));
                }
                length = Some(n);
            }
            10 if raw_name.eq_ignore_ascii_case(b"connection") => {
                for t in tokens(raw_value) {
                    close |= t.eq_ignore_ascii_case(b"close");
                    keep |= t.eq_ignore_ascii_case(b"keep-alive");
                }
                named |= lists_names(raw_value);
            }
            _ => {}
        }
    }
    // Names a `Connection` header lists (besides its own options) are hop-by-hop too.
    let listed = |name: &[u8]| {
        named
            && headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("connection") && names(h.value, name))
    };
    // Room for the routing headers the proxy adds too: growing the lines then was a
    // reallocation per answer.
    let mut fields = Fields::with_capacity(len + 128);
    let head = &buf[..len];
    let at = |s: &[u8]| (s.as_ptr() as usize).wrapping_sub(head.as_ptr() as usize);
    for h in headers {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length")
            || is_hop_by_hop(name)
            || is_router_owned(name)
            || listed(name)
        {
            continue;
        }
        // The line as it came, from the name to the value's end, when the value lies after the
        // name in the head (it does, but an empty value's place is httparse's to choose).
        let (from, to) = (at(name), at(h.value).saturating_add(h.value.len()));
        match head.get(from..to) {
            Some(line) if !h.value.is_empty() && to > from + name.len() => {
                fields.push_line(name, h.value, line)
            }
            _ => fields.push(name, h.value),
        }
    }
    // With a transfer coding the length is not the body's (RFC 9112 6.3): not declared on,
    // or hyper's fronts (HTTP/2, TLS) would frame the answer by it.
    fields.set_content_length(if coded { None } else { length });
    buf.advance(len);
    let bodiless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if bodiless {
        Framing::Length(0)
    } else if coded {
        if chunked {
            Framing::Chunked
        } else {
            Framing::Close
        }
    } else {
        length.map_or(Framing::Close, Framing::Length)
    };
    let keep_alive = framing != Framing::Close && !close && (version == Version::HTTP_11 || keep);
    Ok(Some(Head {
        status,
        version,
        fields,
        framing,
        keep_alive,
    }))
}

/// A decimal number (a `content-length`, a usage count): digits, ASCII whitespace around them
/// allowed (a proxy in front may not read Unicode spaces as ours), at most `u64::MAX`. Read
/// without a string check and `parse`, which were about 60 instructions of each head.
pub(crate) fn decimal(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Whether a `Connection` value lists header names besides its own options (`close`,
/// `keep-alive`): those headers are hop-by-hop too (RFC 9110 section 7.6.1).
fn lists_names(value: &[u8]) -> bool {
    tokens(value)
        .any(|t| !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"keep-alive"))
}

/// Whether a `Connection` value names the header `name`.
fn names(value: &[u8], name: &[u8]) -> bool {
    tokens(value).any(|t| t.eq_ignore_ascii_case(name))
}

/// The comma-separated tokens of a header value, trimmed.
pub(crate) fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// What a body decoder made of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes, taken from the buffer.
    Data(Bytes),
    /// The buffer holds no more of the body: read more.
    More,
    /// The body ended; what the buffer still holds follows it.
    End,
}

/// Decodes one answer's body out of the connection's read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyDecoder {
    /// Bytes still to come.
    Length(u64),
    /// Within a chunked body.
    Chunked(ChunkState),
    /// Until the connection closes.
    Close,
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// Expecting a size line.
    Size,
    /// Within a chunk's data: bytes left.
    Data(u64),
    /// After a chunk's data: expecting its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines until an empty one; bytes of them still allowed.
    Trailers(usize),
    /// The body ended.
    Done,
}

impl BodyDecoder {
    /// The decoder for `framing`.
    pub fn new(framing: Framing) -> Self {
        match framing {
            Framing::Length(n) => BodyDecoder::Length(n),
            Framing::Chunked => BodyDecoder::Chunked(ChunkState::Size),
            Framing::Close => BodyDecoder::Close,
        }
    }

    /// Whether the body ended.
    pub fn is_end(&self) -> bool {
        matches!(
            self,
            BodyDecoder::Length(0) | BodyDecoder::Chunked(ChunkState::Done)
        )
    }

    /// Takes the next piece of body from `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        match self {
            BodyDecoder::Length(0) => Ok(Decoded::End),
            BodyDecoder::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                *left -= n as u64;
                Ok(Decoded::Data(buf.split_to(n).freeze()))
            }
            BodyDecoder::Close if buf.is_empty() => Ok(Decoded::More),
            BodyDecoder::Close => Ok(Decoded::Data(buf.split().freeze())),
            BodyDecoder::Chunked(state) => decode_chunked(state, buf),
        }
    }
}

/// `name ":" value` with a valid field name (no whitespace before the colon). Trailers are
/// rare, so the name check is `http`'s own rather than a copy of it.
fn is_field_line(line: &[u8]) -> bool {
    line.iter()
        .position(|&b| b == b':')
        .is_some_and(|colon| http::HeaderName::from_bytes(&line[..colon]).is_ok())
}

fn decode_chunked(state: &mut ChunkState, buf: &mut BytesMut) -> Result<Decoded, WireError> {
    loop {
        match *state {
            ChunkState::Size => {
                let Some((size, len)) = size_line(buf)? else {
                    return Ok(Decoded::More);
                };
                buf.advance(len);
                *state = if size == 0 {
                    ChunkState::Trailers(MAX_TRAILERS)
                } else {
                    ChunkState::Data(size)
                };
            }
            ChunkState::Data(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::More);
                }
                let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let rest = left - n as u64;
                if rest > 0 {
                    *state = ChunkState::Data(rest);
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                *state = ChunkState::DataEnd;
                return Ok(Decoded::Data(take_joined(buf, n)));
            }
            ChunkState::DataEnd => {
                match buf.get(..2) {
                    None if buf.first().is_none_or(|&b| b == b'\r') => return Ok(Decoded::More),
                    Some(b"\r\n") => buf.advance(2),
                    _ => return Err(WireError::Chunk("chunk data not followed by CRLF")),
                }
                *state = ChunkState::Size;
            }
            ChunkState::Trailers(left) => {
                let Some(nl) = line_end(buf, left, "trailers too long")? else {
                    return Ok(Decoded::More);
                };
                // Every line ends in CRLF (RFC 9112 section 7.1). A bare LF ending the body
                // would let what follows be read as the next pipelined request, where a proxy
                // in front that does not end a line at LF saw it as part of this one.
                if nl == 0 || buf[nl - 1] != b'\r' {
                    return Err(WireError::Chunk("trailer line not ended by CRLF"));
                }
                let empty = nl == 1;
                if !empty && !is_field_line(&buf[..nl - 1]) {
                    return Err(WireError::Chunk("trailer line is not a field"));
                }
                // Trailers are read past and dropped: engines send none that a client needs.
                buf.advance(nl + 1);
                *state = if empty {
                    ChunkState::Done
                } else {
                    ChunkState::Trailers(left.saturating_sub(nl + 1))
                };
            }
            ChunkState::Done => return Ok(Decoded::End),
        }
    }
}

/// Takes the chunk data at the start of `buf` (`n` bytes, the end of a chunk) together with
/// the data of the whole chunks right behind it, up to about [`JOIN_MAX`] bytes, and leaves
/// `buf` at the CRLF after the last one taken. An engine's streamed tokens arrive one chunk
/// each, often many in one read: taken one by one, each cost a `Bytes` of its own, a frame and a
/// poll through the relay (about 550 instructions per token under callgrind, most of what a
/// streamed answer added to the router's count). Joined, they are moved back over the framing
/// between them, inside the read buffer the kernel just wrote: no allocation, and no fresh
/// memory to fill (a new buffer per join: 4.7 allocations per `sharegpt` answer in
/// bench/instructions.sh). Only chunks wholly in the buffer are joined; anything else (a chunk
/// still arriving, the last chunk, a malformed size line) is left for the next
/// [`BodyDecoder::decode`], which decodes or refuses it as before.
fn take_joined(buf: &mut BytesMut, n: usize) -> Bytes {
    // The joined data is `buf[..len]`; the wire is read up to `pos`.
    let (mut len, mut pos) = (n, n);
    while len < JOIN_MAX {
        let Some((start, size)) = buf.get(pos..).and_then(whole_chunk) else {
            break;
        };
        let from = pos + start;
        buf.copy_within(from..from + size, len);
        len += size;
        pos = from + size;
    }
    let joined = buf.split_to(len).freeze();
    buf.advance(pos - len);
    joined
}

/// Where the data of the next chunk lies (offset and length) when `bytes`, which follows a
/// chunk's data, holds all of it: its CRLF, a size line, the data. `None` otherwise, and for
/// the last chunk (size 0).
fn whole_chunk(bytes: &[u8]) -> Option<(usize, usize)> {
    let after = bytes.strip_prefix(b"\r\n")?;
    let (size, len) = size_line(after).ok()??;
    let size = usize::try_from(size).ok().filter(|&s| s > 0)?;
    let start = 2 + len;
    (bytes.len() >= start.checked_add(size)?).then_some((start, size))
}

/// The chunk size line at the start of `buf`: the size and the line's length with its CRLF;
/// `None` while it has not all arrived.
fn size_line(buf: &[u8]) -> Result<Option<(u64, usize)>, WireError> {
    if let Some(plain) = plain_size_line(buf) {
        return Ok(Some(plain));
    }
    let Some(nl) = line_end(buf, MAX_LINE, "size line too long")? else {
        return Ok(None);
    };
    let line = buf
        .get(..nl)
        .and_then(|l| l.strip_suffix(b"\r"))
        .ok_or(WireError::Chunk("size line not ended by CRLF"))?;
    Ok(Some((chunk_size(line)?, nl + 1)))
}

/// A size line that is hex digits and CRLF alone, as engines send them, read in one pass (no
/// search for its end, no second pass over the digits): `None` for any other (extensions, more
/// than 15 digits, not all here yet), which [`size_line`] reads the general way.
fn plain_size_line(buf: &[u8]) -> Option<(u64, usize)> {
    let mut size = 0u64;
    let mut i = 0;
    // A digit's value from a table: the range tests took about 80 instructions per size line,
    // one per streamed token.
    while let Some(&b) = buf.get(i).filter(|_| i < 16) {
        let d = HEX[usize::from(b)];
        if d == NOT_HEX {
            let crlf = i > 0 && b == b'\r' && buf.get(i + 1) == Some(&b'\n');
            return crlf.then_some((size, i + 2));
        }
        size = size << 4 | u64::from(d);
        i += 1;
    }
    None
}

/// [`HEX`]'s mark for a byte that is no hex digit.
const NOT_HEX: u8 = 0xff;

/// Each byte's value as a hex digit ([`hex_value`]), or [`NOT_HEX`].
static HEX: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut b = 0;
    while b < 256 {
        if let Some(d) = hex_value(b as u8) {
            t[b] = d;
        }
        b += 1;
    }
    t
};

/// The value of one hex digit.
const fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Where the line at the start of `buf` ends (its `\n`), `None` while it has not arrived; a
/// line longer than `max` is refused whether or not its end is buffered yet, so the outcome
/// does not depend on how reads cut it.
fn line_end(buf: &[u8], max: usize, too_long: &'static str) -> Result<Option<usize>, WireError> {
    match memchr::memchr(b'\n', buf) {
        Some(nl) if nl <= max => Ok(Some(nl)),
        None if buf.len() <= max => Ok(None),
        _ => Err(WireError::Chunk(too_long)),
    }
}

/// The size of a chunk from its size line (hex digits, then optional whitespace and
/// extensions, which are ignored).
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let digits = line
        .iter()
        .position(|&b| hex_value(b).is_none())
        .unwrap_or(line.len());
    if digits == 0 {
        return Err(WireError::Chunk("size line without a size"));
    }
    if digits > 15 {
        return Err(WireError::Chunk("chunk size too large"));
    }
    let rest = &line[digits..];
    if !rest.is_empty() && !matches!(rest[0], b';' | b' ' | b'\t') {
        return Err(WireError::Chunk("invalid character in a size line"));
    }
    // Digits already checked, at most 15: no overflow. By hand rather than
    // `u64::from_str_radix` over `str::from_utf8`: this runs once per streamed token, and that
    // version counted 6% more instructions per streamed request in bench/instructions.sh.
    Ok(line[..digits]
        .iter()
        .filter_map(|&b| hex_value(b))
        .fold(0u64, |size, d| size * 16 + u64::from(d)))
}

#[cfg(test)]
mod tests;
