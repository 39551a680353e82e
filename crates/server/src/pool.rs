//! Upstream connections, read and written by the request that uses them.
//!
//! hyper-util's pooled client ran every upstream connection as a task of its own and handed a
//! response body to the request's task through a one-frame channel: each streamed token went
//! connection task -> wake -> relay task -> wake, often across the runtime's two threads. Then
//! hyper's own client connection, driven from the relaying task, still passed each chunk
//! through that channel and decoded chunked framing a byte at a time. Here a [`Link`] is a
//! socket and a read buffer: the request head is written with [`crate::h1::encode_request`],
//! the answer's head parsed with [`crate::h1::parse_head`], and its body decoded by
//! [`crate::h1::BodyDecoder`] straight out of the read buffer by the task that relays it.
//!
//! A link is checked out for one request, read while its head and then its body are awaited
//! ([`Leased`]), and put back when the body ended with the connection still good for another
//! request. Idle links are not polled: one that the instance closed in the meantime is found
//! closed at checkout and dropped, and a request that a reused link could not write (the
//! instance closed it just then) goes out again on a new connection, since the instance never
//! saw it. So does, once, a request written on a reused link that then closed with no byte of
//! an answer (the instance's idle close crossed it); if that new connection is refused, the
//! request fails as closed, since it may be what brought the instance down.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderValue, Method, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tower_service::Service;

use crate::body::BoxError;
use crate::fields::Fields;
use crate::h1::{self, BodyDecoder, Decoded, WireError};
use prefix_router_core::prehashed::PreHashed;

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
type Io = TokioIo<hyper_rustls::MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>>;

/// How long an unused connection is kept: less than the engines keep one. vLLM and SGLang serve
/// through uvicorn, which closes a connection idle for 5 s (`--timeout-keep-alive`). A request
/// written on a link just as the engine closes it is lost unread; the router then reads a
/// reset with no answer, a 502 that also counts toward ejecting a healthy instance. A link
/// whose close has already arrived is dropped at checkout; this keeps a request off one whose
/// close is on its way. A new connection costs one handshake; a lost request, a failure.
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Most unused connections kept per instance (beyond them, a finished connection is closed).
const MAX_IDLE_PER_INSTANCE: usize = 256;
/// How often the whole pool is swept of expired connections (on the way of a check-in).
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// What one read of an upstream connection asks for. Engine answers are SSE events and JSON of
/// a few KiB: 16 KiB reads them in one go. A buffer is grown further only for a response head
/// that does not fit ([`h1::MAX_HEAD`] at most), so idle connections hold little.
const READ_BUF: usize = 16 * 1024;
/// Below this much room, the read buffer is given [`READ_BUF`] more before a read.
const MIN_ROOM: usize = 2 * 1024;

/// Why an exchange with an instance failed.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection: refused, unreachable, connect timeout, failed TLS handshake.
    #[error("cannot connect: {0}")]
    Connect(BoxError),
    /// The connection failed while writing the request or reading the answer.
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// The instance closed the connection before the answer was complete.
    #[error("the instance closed the connection before the answer was complete")]
    Closed,
    /// The answer broke HTTP/1.1.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The request could not be built (an instance URL the router cannot send to).
    #[error("{0}")]
    Request(String),
}

/// The upstream connections of every instance, by base URL.
pub struct Upstreams {
    connector: Connector,
    /// The bound on a whole connect, TLS handshake included (see [`Upstreams::new`]).
    connect_limit: Duration,
    /// Idle connections, one list per thread that serves requests: index 0 for the shared
    /// runtime, `i` for I/O thread `i` ([`crate::io_threads`]). A connection is registered
    /// with the reactor of the thread that opened it, so it is only reused there: its
    /// readiness then wakes the thread that waits for it, and the lists share no lock.
    idle: Box<[Mutex<Idle>]>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams").finish_non_exhaustive()
    }
}

struct Idle {
    /// Keyed by instance URL, hashed by `PreHashed`'s fold rather than SipHash: the URLs are
    /// the router's configuration, not a peer's choice, and SipHash over one was 2 x 200
    /// instructions of every request (checkout and check-in).
    by_base: HashMap<Box<str>, Vec<(Link, Instant)>, PreHashed>,
    swept: Instant,
}

/// One HTTP/1.1 connection to an instance.
pub struct Link {
    /// Boxed: a TLS connection's state is kilobytes, and a link moves on every checkout and
    /// check-in (the copies showed under callgrind).
    io: Box<Io>,
    /// What the instance sent that was not handed on yet.
    buf: BytesMut,
    base: Box<str>,
    /// The idle list it goes back to: the thread that opened it.
    shard: usize,
    /// The instance's `Host` (its URL's authority), sent with every request on this link.
    host: HeaderValue,
    reused: bool,
    /// The last request head written (its allocation is reused for the next).
    head: Vec<u8>,
}

impl Link {
    /// Whether an idle link can carry another request: nothing unread, and a read that would
    /// wait (polled without a waker). The instance closing it, or sending unasked, retires it.
    fn usable(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let mut probe = [0u8; 1];
        let mut probe = ReadBuf::new(&mut probe);
        Pin::new(&mut self.io)
            .poll_read(&mut cx, &mut probe)
            .is_pending()
    }

    /// Reads what the socket has into the buffer: the bytes read (0 when the instance closed).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < MIN_ROOM {
            self.buf.reserve(READ_BUF);
        }
        std::pin::pin!(self.io.read_buf(&mut self.buf)).poll(cx)
    }

    /// Writes the head and body of one request.
    async fn write(&mut self, body: &Bytes) -> std::io::Result<()> {
        let mut out = Buf::chain(&self.head[..], &body[..]);
        self.io.write_all_buf(&mut out).await?;
        self.io.flush().await
    }

    /// Reads the answer's head (past interim `1xx` ones).
    async fn read_head(&mut self, head_request: bool) -> Result<h1::Head, SendError> {
        loop {
            if !self.buf.is_empty() {
                if let Some(head) = h1::parse_head(&mut self.buf, head_request)? {
                    if head.status.is_informational() {
                        continue;
                    }
                    return Ok(head);
                }
            }
            if poll_fn(|cx| self.poll_fill(cx)).await? == 0 {
                return Err(SendError::Closed);
            }
        }
    }
}

impl Upstreams {
    /// Connections through `connector` (which sets the TCP connect timeout, TCP_NODELAY and
    /// TLS), for the shared runtime and `io_threads` I/O threads. `connect` bounds the TCP
    /// connect (the connector's own timeout) and then the TLS handshake again: the connector
    /// bounds only the first, so an `https://` instance that accepted and never answered the
    /// handshake held each request until `first_byte` (10 min by default), as a 504 that
    /// nothing retried, though nothing had been sent.
    pub fn new(connector: Connector, connect: Duration, io_threads: usize) -> Self {
        Upstreams {
            connector,
            connect_limit: connect.saturating_mul(2),
            idle: (0..=io_threads)
                .map(|_| {
                    Mutex::new(Idle {
                        by_base: HashMap::with_hasher(PreHashed),
                        swept: Instant::now(),
                    })
                })
                .collect(),
        }
    }

    /// The idle list of the thread running the caller (and its index).
    fn here(&self) -> (usize, &Mutex<Idle>) {
        let i = crate::io_threads::current();
        match self.idle.get(i) {
            Some(idle) => (i, idle),
            // An I/O thread of another router in the same process (tests): the shared list.
            None => (0, &self.idle[0]),
        }
    }

    /// Sends a request (`parts`: method, path and headers; `body`) to the instance at `base`
    /// over HTTP/1.1, less what a proxy does not pass on ([`h1::encode_request`]), and waits
    /// for the response head. The body that comes back reads the connection further and puts
    /// it back for the next request when it ends.
    pub async fn send(
        self: &std::sync::Arc<Self>,
        base: &str,
        parts: &http::request::Parts,
        body: &Bytes,
    ) -> Result<Response<Leased>, SendError> {
        let head_request = parts.method == Method::HEAD;
        let mut resent = false;
        loop {
            let pooled = if resent { None } else { self.checkout(base) };
            let mut link = match pooled {
                Some(link) => link,
                // Sent again after a close, and the instance is gone: the request may be what
                // brought it down, so it fails as the close it was (not retried elsewhere),
                // not as a refused connection (which another instance would be given).
                None if resent => self.connect(base).await.map_err(|_| SendError::Closed)?,
                None => self.connect(base).await?,
            };
            link.head.clear();
            h1::encode_request(parts, &link.host, body.len(), &mut link.head);
            if let Err(e) = link.write(body).await {
                // The instance closed a reused connection before it read the request: it never
                // saw it, so it goes out again, on a new connection.
                if link.reused {
                    continue;
                }
                return Err(e.into());
            }
            let head = match link.read_head(head_request).await {
                Ok(head) => head,
                // A reused connection closed or reset with no byte of an answer: most likely
                // the instance closed it while idle just as the request went out (the
                // keep-alive race of RFC 9112 section 9.3.1; browsers send again here too).
                // Once, on a new connection: an engine that really died refuses that one.
                Err(SendError::Closed | SendError::Io(_))
                    if link.reused && link.buf.is_empty() && !resent =>
                {
                    resent = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let leased = Leased {
                fields: head.fields,
                decoder: BodyDecoder::new(head.framing),
                keep_alive: head.keep_alive,
                head_request,
                link: Some(link),
                pool: std::sync::Arc::clone(self),
            };
            let mut resp = Response::new(leased);
            *resp.status_mut() = head.status;
            *resp.version_mut() = head.version;
            return Ok(resp);
        }
    }

    /// An idle, still open connection to `base`, most recently used first.
    fn checkout(&self, base: &str) -> Option<Link> {
        let mut idle = self.here().1.lock().unwrap_or_else(|p| p.into_inner());
        let links = idle.by_base.get_mut(base)?;
        while let Some((mut link, since)) = links.pop() {
            if since.elapsed() < IDLE_TIMEOUT && link.usable() {
                link.reused = true;
                return Some(link);
            }
        }
        None
    }

    /// A new connection to `base`.
    async fn connect(&self, base: &str) -> Result<Link, SendError> {
        let uri: Uri = base
            .parse()
            .map_err(|e| SendError::Request(format!("instance URL {base}: {e}")))?;
        let host = uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .ok_or_else(|| SendError::Request(format!("instance URL {base} has no host")))?;
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(SendError::Connect)?;
        let io = tokio::time::timeout(self.connect_limit, connector.call(uri))
            .await
            .map_err(|_| {
                SendError::Connect(
                    format!(
                        "no connection to {base} within {} ms (TLS handshake unanswered?)",
                        self.connect_limit.as_millis()
                    )
                    .into(),
                )
            })?
            .map_err(SendError::Connect)?;
        Ok(Link {
            io: Box::new(TokioIo::new(io)),
            buf: BytesMut::new(),
            base: base.into(),
            shard: self.here().0,
            host,
            reused: false,
            head: Vec::new(),
        })
    }

    /// Keeps `link` for the next request to its instance.
    fn put(&self, link: Link) {
        let now = Instant::now();
        let Some(idle) = self.idle.get(link.shard) else {
            return;
        };
        let mut idle = idle.lock().unwrap_or_else(|p| p.into_inner());
        if now.duration_since(idle.swept) >= SWEEP_EVERY {
            idle.swept = now;
            // Expired connections of instances no longer used would otherwise stay open.
            idle.by_base.retain(|_, links| {
                links.retain(|(_, since)| now.duration_since(*since) < IDLE_TIMEOUT);
                !links.is_empty()
            });
        }
        // One lookup by `&str` on the common path; the key is allocated only on first use.
        let links = match idle.by_base.get_mut(&*link.base) {
            Some(links) => links,
            None => idle.by_base.entry(link.base.clone()).or_default(),
        };
        if links.len() < MAX_IDLE_PER_INSTANCE {
            links.push((link, now));
        }
    }
}

/// A response body read from the connection it arrives on by the task that polls it; the end
/// of the body returns the connection to the pool.
pub struct Leased {
    /// `None` once the body ended (the link returned to the pool or closed) or failed: nothing
    /// more comes.
    link: Option<Link>,
    decoder: BodyDecoder,
    /// Whether the connection can carry another request after this answer.
    keep_alive: bool,
    /// The answer to a `HEAD`: no body on the wire, whatever length the resource has (that
    /// length is the `content-length` header's to say, if the instance sent one).
    head_request: bool,
    pool: std::sync::Arc<Upstreams>,
    /// The answer's end-to-end headers, until the proxy takes them ([`Leased::take_fields`]).
    /// They travel here rather than in the response's `HeaderMap`: see [`crate::fields`].
    fields: Fields,
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased")
            .field("decoder", &self.decoder)
            .field("ended", &self.link.is_none())
            .finish_non_exhaustive()
    }
}

impl Leased {
    /// The answer's end-to-end headers (hop-by-hop and framing ones left out), taken once:
    /// the response itself carries none.
    pub fn take_fields(&mut self) -> Fields {
        std::mem::take(&mut self.fields)
    }

    /// The body ended: the connection goes back to the pool if it can take another request
    /// (kept alive, and nothing unasked after the body).
    fn release(&mut self) {
        if let Some(link) = self.link.take() {
            if self.keep_alive && self.decoder.is_end() && link.buf.is_empty() {
                self.pool.put(link);
            }
        }
    }

    fn fail(&mut self, e: SendError) -> Poll<Option<Result<Frame<Bytes>, SendError>>> {
        self.link = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl Body for Leased {
    type Data = Bytes;
    type Error = SendError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, SendError>>> {
        let this = self.get_mut();
        loop {
            let Some(link) = this.link.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.decode(&mut link.buf) {
                Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(Decoded::End) => {
                    this.release();
                    return Poll::Ready(None);
                }
                Ok(Decoded::More) => {}
                Err(e) => return this.fail(e.into()),
            }
            match link.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if this.decoder == BodyDecoder::Close => {
                    // The body that ends with the connection ended.
                    this.link = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => return this.fail(SendError::Closed),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return this.fail(e.into()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.link.is_none() || self.decoder.is_end()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder {
            // Zero bytes follow a HEAD's answer, but the resource is not empty: telling the
            // client `content-length: 0` would say it is.
            BodyDecoder::Length(n) if !self.head_request => SizeHint::with_exact(n),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for Leased {
    fn drop(&mut self) {
        // A body that ended without being polled to its end (empty, or read by length) still
        // leaves a reusable connection; one dropped part way closes it (the instance sees the
        // disconnect and stops generating).
        if self.decoder.is_end() {
            self.release();
        }
    }
}
