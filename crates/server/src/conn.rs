//! Client connections: how many one address may hold, and when the router closes one.
//!
//! The watchdog below serves the connections hyper answers (TLS and HTTP/2); plaintext HTTP/1.1
//! connections keep the same rules as deadlines on their own reads ([`crate::front`]).
//! Each connection's socket is wrapped ([`TrackedIo`]) to note when bytes last moved and when
//! the head of a request began to arrive; the service counts the requests whose answer has not
//! finished ([`Tracked`] bodies, released on drop). A watchdog beside the connection reads those
//! notes when its next deadline comes (one timer per connection, re-armed only when it fires):
//!
//! - a head that takes longer than `timeouts.client_header` from its first byte (slowloris)
//!   gets the connection closed at once (HTTP/1; an HTTP/2 connection's frames are not heads);
//! - a connection with no request open and nothing sent either way for `timeouts.client_idle`
//!   is shut down gracefully (HTTP/1 closes, HTTP/2 sends GOAWAY);
//! - a client that takes nothing for `timeouts.client_write` while a write to its socket waits
//!   is cut (the connection closed, its requests cancelled); over HTTP/2, a stream whose window
//!   the client keeps shut that long has its request cancelled, and the connection is kept
//!   unless the client still keeps it shut `client_write` later ([`answers`]).
//!
//! A stream being relayed holds its request open, so the first two rules never cut an answer.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod answers;

use answers::Answers;
pub use answers::{OpenRequest, StoppedReading, Tracked};

/// No time noted.
const NONE: u64 = u64::MAX;

/// The HTTP/2 client preface starts with this.
pub(crate) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// What one connection has been doing, shared by its socket, its service and its watchdog.
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    /// Milliseconds since `epoch` when bytes last moved either way.
    last_ms: AtomicU64,
    /// When the first byte of a request head arrived with no request open (`NONE`: no head
    /// is arriving).
    head_ms: AtomicU64,
    /// Requests received whose answer has not finished.
    open: AtomicU32,
    /// Since when a write to the socket has been waiting for the client to take bytes
    /// (`NONE`: none waits).
    blocked_ms: AtomicU64,
    /// The answers being written.
    answers: Answers,
    /// The first bytes were the HTTP/2 preface.
    h2: AtomicBool,
    /// Nothing read yet.
    fresh: AtomicBool,
}

/// What the watchdog decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Look again after this long.
    Wait(Duration),
    /// A request head is taking too long: close now.
    HeaderTimeout,
    /// Idle too long: shut down gracefully.
    Idle,
    /// The client took nothing of what it was sent for too long: close now.
    WriteTimeout,
    /// Some HTTP/2 streams took nothing for too long: cancel the answers waiting since this
    /// ([`Activity::cancel_waiting`]), and keep the connection.
    StreamsStalled(u64),
}

impl Activity {
    /// A connection accepted now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            head_ms: AtomicU64::new(NONE),
            open: AtomicU32::new(0),
            blocked_ms: AtomicU64::new(NONE),
            answers: Answers::default(),
            h2: AtomicBool::new(false),
            fresh: AtomicBool::new(true),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn read(&self, data: &[u8]) {
        let now = self.now_ms();
        self.last_ms.store(now, Ordering::Relaxed);
        // Only the first read can hold the preface; later reads pay one load, not a swap.
        if self.fresh.load(Ordering::Relaxed) {
            self.fresh.store(false, Ordering::Relaxed);
            self.h2
                .store(data.starts_with(H2_PREFACE), Ordering::Relaxed);
        }
        if self.open.load(Ordering::Relaxed) == 0 && self.head_ms.load(Ordering::Relaxed) == NONE {
            self.head_ms.store(now, Ordering::Relaxed);
        }
    }

    fn wrote(&self) {
        self.touched();
        self.unblocked();
    }

    /// Something happened on the connection (the idle clock starts over).
    fn touched(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// The connection speaks HTTP/2 (hyper parsed a request as such). The preface in the first
    /// read says so too, but a first read over TLS may hold less of it.
    pub fn speaks_h2(&self) {
        if !self.h2.load(Ordering::Relaxed) {
            self.h2.store(true, Ordering::Relaxed);
        }
    }

    /// Nothing waits to be written any more.
    fn unblocked(&self) {
        if self.blocked_ms.load(Ordering::Relaxed) != NONE {
            self.blocked_ms.store(NONE, Ordering::Relaxed);
        }
    }

    /// A write found the client's socket full.
    fn blocked(&self) {
        if self.blocked_ms.load(Ordering::Relaxed) == NONE {
            self.blocked_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// Notes what a write, flush or shutdown of the socket came to: one that waits is the
    /// client taking nothing; one done ends such a wait.
    fn noted<T>(&self, polled: &Poll<std::io::Result<T>>) {
        match polled {
            Poll::Pending => self.blocked(),
            Poll::Ready(Ok(_)) => self.unblocked(),
            Poll::Ready(Err(_)) => {}
        }
    }

    /// Drops the relays of the answers waiting since `due` (a [`Verdict::StreamsStalled`]);
    /// how many.
    pub fn cancel_waiting(&self, due: u64) -> usize {
        self.answers.cancel_waiting(due, self.now_ms())
    }

    /// A request's head has arrived and its answer is under way; the returned guard ends it.
    pub fn request(self: &Arc<Self>) -> OpenRequest {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.head_ms.store(NONE, Ordering::Relaxed);
        OpenRequest(Arc::clone(self))
    }

    /// Decides, given the three limits. A wait is never longer than `header` or `write`: a
    /// head may start to arrive, or a write start to wait, at any moment, and its deadline is
    /// only known once the watchdog looks.
    pub fn verdict(&self, header: Duration, idle: Duration, write: Duration) -> Verdict {
        let now = self.now_ms();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(NONE - 1).max(1);
        let after_write = |since: u64| since.saturating_add(ms(write));
        // A write waiting for the client: due `write` after it began.
        let blocked_due = after_write(self.blocked_ms.load(Ordering::Relaxed));
        if now >= blocked_due {
            return Verdict::WriteTimeout;
        }
        // HTTP/2 streams the client keeps shut ([`answers`]): one waiting for `write` is
        // cancelled; one cancelled `write` ago and still held by hyper closes the connection.
        let (waiting_due, cancelled_due) = if self.h2.load(Ordering::Relaxed) {
            let (waiting, cancelled) = self.answers.oldest();
            (after_write(waiting), after_write(cancelled))
        } else {
            (NONE, NONE)
        };
        if now >= cancelled_due {
            return Verdict::WriteTimeout;
        }
        if now >= waiting_due {
            return Verdict::StreamsStalled(now - ms(write));
        }
        let write_due = blocked_due.min(waiting_due).min(cancelled_due);
        let look_again = |due: u64| {
            Verdict::Wait(Duration::from_millis(
                (due.min(write_due) - now).min(ms(header)).min(ms(write)),
            ))
        };
        if self.open.load(Ordering::Relaxed) > 0 {
            // An answer is under way: nothing else to time until it ends.
            return look_again(now.saturating_add(ms(idle)));
        }
        let head = self.head_ms.load(Ordering::Relaxed);
        if head != NONE && !self.h2.load(Ordering::Relaxed) {
            let due = head.saturating_add(ms(header));
            if now >= due {
                return Verdict::HeaderTimeout;
            }
            return look_again(due);
        }
        let due = self
            .last_ms
            .load(Ordering::Relaxed)
            .saturating_add(ms(idle));
        if now >= due {
            return Verdict::Idle;
        }
        look_again(due)
    }
}

/// A socket that notes its traffic in an [`Activity`], and swaps hyper's canned error answers
/// for OpenAI-shaped ones ([`crate::canned`]).
#[derive(Debug)]
pub struct TrackedIo<T> {
    inner: T,
    activity: Arc<Activity>,
    max_header_bytes: usize,
    /// A replacement answer not yet written out (hyper was told it was).
    pending: Vec<u8>,
    written: usize,
}

impl<T> TrackedIo<T> {
    /// Wraps `inner`; `max_header_bytes` is the limit named in a 431 answer.
    pub fn new(inner: T, activity: Arc<Activity>, max_header_bytes: usize) -> Self {
        Self {
            inner,
            activity,
            max_header_bytes,
            pending: Vec::new(),
            written: 0,
        }
    }
}

impl<T: AsyncWrite + Unpin> TrackedIo<T> {
    /// One write: the pending replacement first, then `data` (`whole`, when it is one buffer)
    /// replaced if it is a canned answer, else written by `write`; traffic is noted either way.
    fn write(
        &mut self,
        cx: &mut Context<'_>,
        whole: Option<&[u8]>,
        write: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        ready!(self.drain(cx))?;
        if let Some(data) = whole.filter(|d| self.replace_canned(d)) {
            self.activity.wrote();
            // Written as far as hyper knows; flush and shutdown write the replacement out.
            let _ = self.drain(cx)?;
            return Poll::Ready(Ok(data.len()));
        }
        let polled = write(Pin::new(&mut self.inner), cx);
        self.activity.noted(&polled);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touched();
        }
        polled
    }

    /// Writes out the pending replacement, if any.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.pending.len() {
            let polled = Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]);
            self.activity.noted(&polled);
            let n = ready!(polled)?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Whether `data` is a canned answer of hyper's: then it is replaced, and counted as
    /// written.
    fn replace_canned(&mut self, data: &[u8]) -> bool {
        if self.activity.open.load(Ordering::Relaxed) != 0 || !data.starts_with(b"HTTP/1.1 4") {
            return false;
        }
        match crate::canned::replace(data, self.max_header_bytes) {
            Some(answer) => {
                self.pending = answer;
                self.written = 0;
                true
            }
            None => false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TrackedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TrackedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut()
            .write(cx, Some(data), |io, cx| io.poll_write(cx, data))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        // hyper writes a canned head as one buffer.
        let single = match bufs {
            [one] => Some(&one[..]),
            _ => None,
        };
        self.get_mut()
            .write(cx, single, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        // A TLS stream's flush writes out what it buffered: waiting there is the client too.
        // (Not traffic for the idle clock: a flush may have had nothing to write.)
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.activity.noted(&polled);
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        // A TLS stream's close_notify waits on the client like any write.
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.activity.noted(&polled);
        polled
    }
}

/// Open connections per client address, under a limit.
#[derive(Debug)]
pub struct PerClient {
    limit: Option<usize>,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection counted against its address; dropping it uncounts it.
#[derive(Debug)]
pub struct ClientSlot {
    table: Arc<PerClient>,
    ip: IpAddr,
}

impl PerClient {
    /// A table allowing `limit` connections per address (None: any number).
    pub fn new(limit: Option<usize>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// Counts one more connection from `ip`, or None when it is at the limit (or there is no
    /// limit, which needs no count).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Option<ClientSlot>, usize> {
        let Some(limit) = self.limit else {
            return Ok(None);
        };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= limit {
            return Err(limit);
        }
        *n += 1;
        Ok(Some(ClientSlot {
            table: Arc::clone(self),
            ip,
        }))
    }

    /// Connections counted for `ip`.
    pub fn count(&self, ip: IpAddr) -> usize {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut counts = self.table.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                // Addresses come and go: the table holds only those with a connection open.
                counts.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests;
