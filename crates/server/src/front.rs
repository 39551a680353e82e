//! The router's own HTTP/1.1 front for plaintext client connections: one task per connection
//! reads a request into a buffer that the connection keeps, hands it to the handler, and
//! writes the answer from a second kept buffer. hyper still serves HTTP/2 (told by its
//! preface) and TLS.
//!
//! Why not hyper here too: under callgrind's cache simulation the router walked 6-8 times
//! HAProxy's level-1 data misses per request (BENCHMARKS.md, "The memory a request walks"),
//! much of it hyper's server side: a fresh 8 KiB read buffer per request (a request's body
//! held a slice of the last one), a channel carrying the body to the service, a watchdog
//! task's select per request, and poll frames of 7-16 KiB. Here the body is a slice of the
//! kept buffer, read before the handler runs, which the buffer reclaims once the answer ends;
//! the timeouts are deadlines on the reads themselves.
//!
//! Rules, as the hyper path kept them ([`crate::conn`]):
//! - a head must arrive within `timeouts.client_header` of its first byte, else the
//!   connection closes with no answer (`header_timeout`);
//! - with no request under way, a connection quiet for `timeouts.client_idle` closes (`idle`);
//!   one quiet for the shortest client timeout gives its buffers back until its next request
//!   ([`await_request`]);
//! - empty lines before a request line are skipped, and start no head;
//! - a body must arrive within `timeouts.client_body` (408) and be at most
//!   `limits.max_body_bytes` (413); a head over `limits.max_header_bytes` is a 431, a
//!   malformed one a 400, each in the OpenAI shape, and the connection closes after it;
//! - a client that closes while its request is under way cancels it;
//! - on shutdown, an idle connection closes at once and a busy one after its answer.

mod answer;
mod request;
mod response;
mod rewind;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

pub use request::{parse as parse_request, BodyFraming, HeadError, RequestHead};
pub use response::{chunk_start, encode_head, OutFraming, Persist};
pub use rewind::Rewind;

use crate::body::{ProxyBody, RequestBody};
use crate::conn::H2_PREFACE;
use crate::error::ApiError;
use crate::h1::{BodyDecoder, Decoded, Framing};
use crate::handler;
use crate::server::count_close;
use crate::settings::Timeouts;
use crate::state::AppState;
use answer::write_answer;

/// The read buffer a connection keeps: a request's head and a small body fit in one read.
const READ_BUF: usize = 8 * 1024;
/// Below this much room, the read buffer is made `READ_BUF` large again before a read (which
/// takes back its own allocation once nothing holds a slice of it).
const READ_MIN: usize = 2 * 1024;
/// The read buffer of a connection that gave its buffers back while quiet ([`await_request`]):
/// what its next request's first read takes (the read after makes it `READ_BUF` large).
const WAKE_READ: usize = 1024;
/// An answer's data of at least this many bytes is written beside the buffered head or chunk
/// line (one vectored write) instead of being copied after it.
const WRITE_DIRECT: usize = 4 * 1024;
/// Buffered answer bytes written out once they reach this many, even while more is ready.
const WRITE_MAX: usize = 64 * 1024;
/// After an error answer, how long and how much of what the client still sends is read and
/// dropped before the connection closes (a "lingering close", as nginx and HAProxy do).
/// Closing with unread bytes makes the kernel reset the connection, and a reset can destroy
/// the answer before the client reads it: a 413 to an upload in progress would arrive as
/// "connection reset". Beyond either bound the connection closes anyway.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_MAX: usize = 4 * 1024 * 1024;

/// Serves HTTP/1.1 on `io` until the client leaves, a rule above closes it, or shutdown.
/// Returns the connection, its first bytes put back, when they are HTTP/2's preface: hyper
/// serves it then.
pub async fn serve<S>(
    mut io: S,
    state: &Arc<AppState>,
    stop: &mut watch::Receiver<bool>,
) -> Option<Rewind<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limits = &state.settings.limits;
    let timeouts = &state.settings.timeouts;
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let mut out = Vec::with_capacity(READ_BUF);
    let mut clock = Deadlines::new(timeouts);
    let mut first = true;
    loop {
        skip_empty_lines(&mut buf);
        if buf.is_empty() {
            if *stop.borrow() {
                return None;
            }
            let waited = await_request(&mut io, &mut buf, &mut out, &mut clock, stop).await;
            match waited {
                Waited::Bytes => {}
                Waited::Gone => return None,
                Waited::Idle => {
                    count_close(state, "idle");
                    return None;
                }
            }
        }
        let header_due = Instant::now() + timeouts.client_header;
        if first {
            first = false;
            match preface(&mut io, &mut buf, &mut clock, header_due).await {
                Preface::Http1 => {}
                Preface::Http2 => return Some(Rewind::new(buf.freeze(), io)),
                Preface::Gone => return None,
                Preface::Timeout => {
                    count_close(state, "header_timeout");
                    return None;
                }
            }
        }
        // Parsed again only when the new bytes could end the head: a head trickled in byte by
        // byte is not scanned whole on every read.
        let mut scanned = 0;
        let head = loop {
            let parsed = if could_end(&buf, scanned) {
                request::parse(&mut buf, limits.max_header_bytes)
            } else if buf.len() > limits.max_header_bytes {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            };
            scanned = buf.len();
            match parsed {
                Ok(Some(head)) => break head,
                Ok(None) => {}
                Err(e) => {
                    let e = e.to_api(limits.max_header_bytes);
                    let _ = answer_error(&mut io, &mut out, &mut clock, e).await;
                    return None;
                }
            }
            match clock.by(header_due, read_some(&mut io, &mut buf)).await {
                Some(Ok(n)) if n > 0 => {}
                Some(_) => return None,
                None => {
                    count_close(state, "header_timeout");
                    tracing::debug!("client too slow sending a request head; connection closed");
                    return None;
                }
            }
        };
        let body = match read_body(&mut io, &mut buf, &mut clock, &head, state).await {
            Ok(body) => body,
            Err(BodyFailure::Answer(e)) => {
                let _ = answer_error(&mut io, &mut out, &mut clock, e).await;
                return None;
            }
            Err(BodyFailure::Gone) => return None,
        };
        let RequestHead {
            parts, keep_alive, ..
        } = head;
        let head_request = parts.method == Method::HEAD;
        let http11 = parts.version == Version::HTTP_11;
        let req = Request::from_parts(parts, RequestBody::Read(body));
        // None: the client left while its request was under way.
        let resp = answer_unless_gone(&mut io, &mut buf, state, req).await?;
        let keep = keep_alive && !*stop.borrow();
        let written = write_answer(
            (&mut io, &mut out, &mut buf, limits.max_header_bytes),
            &mut clock,
            resp,
            head_request,
            http11,
            keep,
        );
        match written.await {
            Ok(true) => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                count_close(state, "write_timeout");
                tracing::debug!("client stopped reading its answer; connection closed");
                return None;
            }
            Ok(false) | Err(_) => return None,
        }
    }
}

/// What waiting for a request on a connection with nothing buffered came to.
enum Waited {
    /// Its first bytes are in the buffer.
    Bytes,
    /// The client closed, the read failed, or the router is shutting down.
    Gone,
    /// Quiet for `timeouts.client_idle`.
    Idle,
}

/// Waits for the next request's first bytes. A connection quiet for the clock's step (the
/// shortest client timeout: 10 s by default) gives its buffers back first and waits on a small
/// one, as a client pool's idle connections are: each then holds its future (about 4 KiB) and
/// [`WAKE_READ`] bytes instead of two 8 KiB buffers (21 KiB of RSS by bench/conn-rss.sh). A
/// busy connection keeps them, so requests that come often allocate nothing for them.
async fn await_request<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    clock: &mut Deadlines,
    stop: &mut watch::Receiver<bool>,
) -> Waited {
    let start = Instant::now();
    let idle = start + clock.idle;
    let release = (start + clock.step).min(idle);
    let mut released = false;
    loop {
        let due = if released { idle } else { release };
        let read = async {
            if released {
                buf.reserve(WAKE_READ);
                io.read_buf(buf).await
            } else {
                read_some(io, buf).await
            }
        };
        tokio::select! {
            biased;
            r = clock.by(due, read) => match r {
                Some(Ok(n)) if n > 0 => {
                    skip_empty_lines(buf);
                    if buf.is_empty() {
                        // Only empty lines: still waiting, on the same deadlines.
                        continue;
                    }
                    if released {
                        out.reserve(READ_BUF);
                    }
                    return Waited::Bytes;
                }
                Some(_) => return Waited::Gone,
                None if due == idle => return Waited::Idle,
                None => {
                    *buf = BytesMut::new();
                    *out = Vec::new();
                    released = true;
                }
            },
            _ = stop.changed() => return Waited::Gone,
        }
    }
}

/// Drops the empty lines at the start of `buf`: a server should ignore at least one before a
/// request line (RFC 9112, section 2.2), and some clients end a POST body with one. Left there,
/// they started the head's timer, and a keep-alive connection that sent one was cut as a slow
/// head (`header_timeout`) instead of waiting out `client_idle` for its next request.
fn skip_empty_lines(buf: &mut BytesMut) {
    if matches!(buf.first(), Some(b'\r' | b'\n')) {
        let n = buf
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
        bytes::Buf::advance(buf, n);
    }
}

/// The deadlines of one connection's reads and writes, on one timer re-armed only when it
/// fires. Each
/// wait arming a timer of its own cost a write to the runtime's eventfd per request (tokio
/// wakes its driver when a timer is due sooner than anything it waits for): under strace, one
/// `write` per request that hyper's path, with its one watchdog timer, did not make.
struct Deadlines {
    timer: Pin<Box<Sleep>>,
    /// The shortest of the connection's timeouts: the timer is never armed further ahead, so
    /// no deadline can fall before it.
    step: Duration,
    /// How long one write may wait for the client to take it (`timeouts.client_write`).
    write_limit: Duration,
    /// How long a connection may wait for a request (`timeouts.client_idle`).
    idle: Duration,
}

impl Deadlines {
    fn new(timeouts: &Timeouts) -> Self {
        let step = timeouts
            .client_header
            .min(timeouts.client_idle)
            .min(timeouts.client_body)
            .min(timeouts.client_write);
        Self {
            timer: Box::pin(tokio::time::sleep(step)),
            step,
            write_limit: timeouts.client_write,
            idle: timeouts.client_idle,
        }
    }

    /// Runs the write `fut`, or fails with `TimedOut` when the client has not taken it within
    /// the write limit (it stopped reading: its socket buffer and ours are full). A write that
    /// completes at once never polls the timer.
    async fn write<F>(&mut self, fut: F) -> std::io::Result<()>
    where
        F: Future<Output = std::io::Result<()>>,
    {
        let due = Instant::now() + self.write_limit;
        self.by(due, fut)
            .await
            .unwrap_or_else(|| Err(std::io::ErrorKind::TimedOut.into()))
    }

    /// `fut`'s output, or `None` once `due` passed first.
    async fn by<F: Future>(&mut self, due: Instant, fut: F) -> Option<F::Output> {
        tokio::pin!(fut);
        // A deadline nearer than the step (the error path's linger) re-arms the timer for it:
        // otherwise it was only seen when the timer next fired, up to a step (10 s) late.
        if due < self.timer.deadline() {
            self.timer.as_mut().reset(due);
        }
        loop {
            tokio::select! {
                biased;
                out = &mut fut => return Some(out),
                () = &mut self.timer => {
                    let now = Instant::now();
                    self.timer.as_mut().reset(due.min(now + self.step).max(now));
                    if now >= due {
                        return None;
                    }
                }
            }
        }
    }
}

/// A connection's socket, write buffer, read buffer and the most a client may send ahead.
type Conn<'a, S> = (&'a mut S, &'a mut Vec<u8>, &'a mut BytesMut, usize);

/// Whether the bytes of `buf` from `scanned` on (with the 3 before, where a line end may have
/// begun) could end a head: a blank line.
fn could_end(buf: &[u8], scanned: usize) -> bool {
    let new = &buf[scanned.saturating_sub(3).min(buf.len())..];
    // One pass that stops at the first blank line: the end of a head, usually followed by a
    // body that need not be scanned. Line ends found with memchr: byte by byte, this was 1,350
    // instructions of a 1 KiB request's 45,000 (callgrind, bench/peers.sh count mode).
    memchr::memchr_iter(b'\n', new)
        .any(|i| matches!(new.get(i + 1..), Some([b'\n', ..] | [b'\r', b'\n', ..])))
}

/// What the first bytes of a connection say.
enum Preface {
    Http1,
    Http2,
    Gone,
    Timeout,
}

/// Reads until the first bytes either are HTTP/2's preface or cannot be.
async fn preface<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    clock: &mut Deadlines,
    due: Instant,
) -> Preface {
    loop {
        let n = buf.len().min(H2_PREFACE.len());
        if buf[..n] != H2_PREFACE[..n] {
            return Preface::Http1;
        }
        if n == H2_PREFACE.len() {
            return Preface::Http2;
        }
        match clock.by(due, read_some(io, buf)).await {
            Some(Ok(n)) if n > 0 => {}
            Some(_) => return Preface::Gone,
            None => return Preface::Timeout,
        }
    }
}

/// One read into `buf`, made room for first.
async fn read_some<S: AsyncRead + Unpin>(io: &mut S, buf: &mut BytesMut) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < READ_MIN {
        buf.reserve(READ_BUF);
    }
    io.read_buf(buf).await
}

/// Why a body was not read.
enum BodyFailure {
    /// Answer this, then close.
    Answer(ApiError),
    /// The client left.
    Gone,
}

/// Reads the body `head` announces, within the limits; a body that fits the read buffer stays
/// a slice of it.
async fn read_body<S>(
    io: &mut S,
    buf: &mut BytesMut,
    clock: &mut Deadlines,
    head: &RequestHead,
    state: &AppState,
) -> Result<Bytes, BodyFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let limit = state.settings.limits.max_body_bytes;
    let due = Instant::now() + state.settings.timeouts.client_body;
    let len = match head.framing {
        BodyFraming::Length(0) => return Ok(Bytes::new()),
        BodyFraming::Length(n) if n > limit => {
            return Err(BodyFailure::Answer(ApiError::too_large(limit)))
        }
        BodyFraming::Length(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        BodyFraming::Chunked => None,
    };
    if head.expect_continue && len.is_none_or(|n| buf.len() < n) {
        io.write_all(response::CONTINUE)
            .await
            .map_err(|_| BodyFailure::Gone)?;
    }
    let timed = async {
        match len {
            Some(n) => read_length(io, buf, n).await,
            None => read_chunked(io, buf, limit).await,
        }
    };
    match clock.by(due, timed).await {
        Some(r) => r,
        None => Err(BodyFailure::Answer(ApiError::body_timeout())),
    }
}

async fn read_length<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    n: usize,
) -> Result<Bytes, BodyFailure> {
    if n <= buf.capacity() {
        // It fits: read on into the kept buffer (a read may take a pipelined request's first
        // bytes too; they stay behind the body).
        while buf.len() < n {
            match io.read_buf(buf).await {
                Ok(read) if read > 0 => {}
                _ => return Err(BodyFailure::Gone),
            }
        }
        return Ok(buf.split_to(n).freeze());
    }
    // Larger than the kept buffer: a buffer of its own, read into no further than its end, so
    // that the kept one does not grow to the largest body a connection ever sent.
    let mut body = BytesMut::with_capacity(n);
    body.extend_from_slice(buf);
    buf.clear();
    while body.len() < n {
        match io.read_buf(&mut body).await {
            Ok(read) if read > 0 => {}
            _ => return Err(BodyFailure::Gone),
        }
    }
    Ok(body.freeze())
}

async fn read_chunked<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    limit: u64,
) -> Result<Bytes, BodyFailure> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut decoder = BodyDecoder::new(Framing::Chunked);
    let mut body = BytesMut::new();
    loop {
        match decoder.decode(buf) {
            Ok(Decoded::Data(data)) => {
                if body.len() + data.len() > limit {
                    return Err(BodyFailure::Answer(ApiError::too_large(limit as u64)));
                }
                body.extend_from_slice(&data);
            }
            Ok(Decoded::End) => return Ok(body.freeze()),
            Ok(Decoded::More) => match read_some(io, buf).await {
                Ok(read) if read > 0 => {}
                _ => return Err(BodyFailure::Gone),
            },
            Err(e) => {
                return Err(BodyFailure::Answer(crate::canned::malformed(
                    &e.to_string(),
                )));
            }
        }
    }
}

/// Runs the handler, reading on meanwhile: a client that closes its connection cancels its
/// request (the handler's future is dropped). Bytes a client sends ahead (a pipelined request)
/// wait in `buf`. `None`: the client left.
async fn answer_unless_gone<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    state: &Arc<AppState>,
    req: Request<RequestBody>,
) -> Option<Response<ProxyBody>> {
    let max = state.settings.limits.max_header_bytes;
    let handle = handler::handle(Arc::clone(state), req);
    tokio::pin!(handle);
    loop {
        tokio::select! {
            biased;
            resp = &mut handle => return resp.ok(),
            read = read_some(io, buf), if buf.len() <= max => match read {
                Ok(n) if n > 0 => {}
                _ => return None,
            },
        }
    }
}

/// Writes an error answer and closes, reading what the client still sends for a while
/// ([`LINGER`]) so that the answer is not lost to a reset.
async fn answer_error<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    out: &mut Vec<u8>,
    clock: &mut Deadlines,
    e: ApiError,
) -> std::io::Result<()> {
    let mut buf = BytesMut::new();
    write_answer(
        (io, out, &mut buf, 0),
        clock,
        e.into_response(),
        false,
        true,
        false,
    )
    .await?;
    // The answer is out: say so with a FIN, then drop what arrives until the client closes.
    io.shutdown().await?;
    // On the heap, and only on this path: as an array, its 8 KiB sat in the future of every
    // connection for as long as it lived (17.8 KiB against 4.2 without; front::tests).
    let drain = async {
        let mut sink = vec![0u8; 8 * 1024];
        let mut read = 0;
        while read < LINGER_MAX {
            match io.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    clock.by(Instant::now() + LINGER, drain).await;
    Ok(())
}
