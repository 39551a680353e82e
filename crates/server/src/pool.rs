//! Upstream connections driven by the request that uses them.
//!
//! hyper-util's pooled client runs every upstream connection as a task of its own, and hands a
//! response body over to the request's task through a channel that holds one frame: each
//! streamed token went connection task → wake → relay task → wake, and then one `writev` to the
//! client per token, often across the runtime's two threads (bench/peers.sh measured 460 µs of
//! router CPU per streamed 16-token answer at one connection, against 100-160 µs for HAProxy).
//! Here the connection is polled by the task that relays its answer: reading the upstream
//! socket, decoding a chunk and writing it to the client happen in one task, with no hand-off.
//!
//! A [`Link`] is one HTTP/1.1 connection (the `SendRequest` half and the connection future). It
//! is checked out for one request, driven while its head and then its body are awaited
//! ([`Leased`]), and put back when the body ended with the connection still open. Idle links
//! are not polled: one that the instance closed in the meantime is found closed at checkout and
//! dropped, and a request that a reused link could not send (the instance closed it just then)
//! goes out again on a new connection, since the instance never saw it.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tower_service::Service;

use crate::body::BoxError;

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
type Io = hyper_rustls::MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>;
type Conn = http1::Connection<Io, Full<Bytes>>;

/// How long an unused connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Most unused connections kept per instance (beyond them, a finished connection is closed).
const MAX_IDLE_PER_INSTANCE: usize = 256;
/// How often the whole pool is swept of expired connections (on the way of a check-in).
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// Largest read buffer of one upstream connection. Each connection keeps the largest buffer it
/// ever grew (hyper's default cap is 408 KiB): over a long run the pool's connections crept
/// towards it, which a heap profile of a soak showed as the router's only growth. Engine
/// answers are SSE events and JSON of a few KiB: 16 KiB reads them in one go.
const READ_BUF: usize = 16 * 1024;

/// Why an upstream request got no response head.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection: refused, unreachable, connect timeout, failed TLS handshake.
    #[error("cannot connect: {0}")]
    Connect(BoxError),
    /// Connected; the exchange failed (closed before an answer, a malformed answer).
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The request could not be built (an instance URL hyper cannot send to).
    #[error("{0}")]
    Request(String),
}

/// The upstream connections of every instance, by base URL.
pub struct Upstreams {
    connector: Connector,
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
    by_base: HashMap<Box<str>, Vec<(Link, Instant)>>,
    swept: Instant,
}

/// One HTTP/1.1 connection to an instance.
pub struct Link {
    sender: http1::SendRequest<Full<Bytes>>,
    /// `None` once the connection future finished (closed or failed): never polled again.
    conn: Option<Pin<Box<Conn>>>,
    base: Box<str>,
    /// The idle list it goes back to: the thread that opened it.
    shard: usize,
    /// The instance's `Host` (its URL's authority), set on every request sent on this link.
    host: HeaderValue,
    reused: bool,
}

impl Link {
    /// Polls the connection once: it reads, decodes and writes whatever its socket allows.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(conn) = self.conn.as_mut() {
            if conn.as_mut().poll(cx).is_ready() {
                // Closed or failed: a response or body awaited on it learns why from hyper.
                self.conn = None;
            }
        }
    }

    /// Whether an idle link can carry another request, polled without a waker.
    fn usable(&mut self) -> bool {
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        self.drive(&mut cx);
        self.conn.is_some()
            && !self.sender.is_closed()
            && matches!(self.sender.poll_ready(&mut cx), Poll::Ready(Ok(())))
    }
}

impl Upstreams {
    /// Connections through `connector` (which sets the connect timeout, TCP_NODELAY and TLS),
    /// for the shared runtime and `io_threads` I/O threads.
    pub fn new(connector: Connector, io_threads: usize) -> Self {
        Upstreams {
            connector,
            idle: (0..=io_threads)
                .map(|_| {
                    Mutex::new(Idle {
                        by_base: HashMap::new(),
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

    /// Sends `req` (origin form: its URI is the path) to the instance at `base` and waits for
    /// the response head, driving the connection meanwhile. The body that comes back drives it further and
    /// puts it back for the next request when it ends.
    pub async fn send(
        self: &std::sync::Arc<Self>,
        base: &str,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Leased>, SendError> {
        let mut req = req;
        loop {
            let mut link = match self.checkout(base) {
                Some(link) => link,
                None => self.connect(base).await?,
            };
            match exchange(&mut link, req).await {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    let leased = Leased {
                        body,
                        link: Some(link),
                        pool: std::sync::Arc::clone(self),
                    };
                    return Ok(Response::from_parts(parts, leased));
                }
                // The instance closed a reused connection before it read the request: it never
                // saw it, so it goes out again, on a new connection.
                Err(mut e) if link.reused => match e.take_message() {
                    Some(again) => req = again,
                    None => return Err(SendError::Http(e.into_error())),
                },
                Err(e) => return Err(SendError::Http(e.into_error())),
            }
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
        let io = connector.call(uri).await.map_err(SendError::Connect)?;
        let (sender, conn) = http1::Builder::new()
            .max_buf_size(READ_BUF)
            .handshake(io)
            .await?;
        Ok(Link {
            sender,
            conn: Some(Box::pin(conn)),
            base: base.into(),
            shard: self.here().0,
            host,
            reused: false,
        })
    }

    /// Keeps `link` for the next request to its instance, when it is still open. One more turn
    /// lets the connection settle into keep-alive after the answer it just carried; whether it
    /// is ready for the next request is asked at checkout.
    fn put(&self, mut link: Link) {
        link.drive(&mut Context::from_waker(
            futures_util::task::noop_waker_ref(),
        ));
        if link.conn.is_none() || link.sender.is_closed() {
            return;
        }
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

/// Sends `req` on `link` and awaits the head, polling the connection in the same task.
async fn exchange(
    link: &mut Link,
    mut req: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Full<Bytes>>>> {
    req.headers_mut()
        .insert(http::header::HOST, link.host.clone());
    let mut sending = std::pin::pin!(link.sender.try_send_request(req));
    poll_fn(|cx| {
        // The connection first: it writes the request and reads the answer; the head is then
        // ready in the same poll.
        link.drive(cx);
        sending.as_mut().poll(cx)
    })
    .await
}

/// A response body read through the connection it arrives on: each poll drives the connection
/// first, and the end of the body returns the connection to the pool.
pub struct Leased {
    body: Incoming,
    /// `None` once returned to the pool (or dropped with the body).
    link: Option<Link>,
    pool: std::sync::Arc<Upstreams>,
}

impl std::fmt::Debug for Leased {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leased").finish_non_exhaustive()
    }
}

impl Leased {
    /// The body ended: the connection goes back to the pool if it can take another request.
    fn release(&mut self) {
        if let Some(link) = self.link.take() {
            self.pool.put(link);
        }
    }
}

impl Body for Leased {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(link) = this.link.as_mut() {
            link.drive(cx);
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // `put` gives the connection the turn it needs to settle into keep-alive.
            this.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Leased {
    fn drop(&mut self) {
        // A body that ended without being polled to its end (empty, or read by length) still
        // leaves a reusable connection; one dropped part way closes it (the instance sees the
        // disconnect and stops generating).
        if self.body.is_end_stream() {
            self.release();
        }
    }
}
