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
//!   is shut down gracefully (HTTP/1 closes, HTTP/2 sends GOAWAY).
//!
//! A stream being relayed holds its request open, so neither rule ever cuts an answer.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
}

impl Activity {
    /// A connection accepted now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            head_ms: AtomicU64::new(NONE),
            open: AtomicU32::new(0),
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
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// A request's head has arrived and its answer is under way; the returned guard ends it.
    pub fn request(self: &Arc<Self>) -> OpenRequest {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.head_ms.store(NONE, Ordering::Relaxed);
        OpenRequest(Arc::clone(self))
    }

    /// Decides, given the two limits. A wait is never longer than `header`: a head may start
    /// to arrive at any moment, and its deadline is only known once the watchdog looks.
    pub fn verdict(&self, header: Duration, idle: Duration) -> Verdict {
        let now = self.now_ms();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(NONE - 1).max(1);
        let look_again =
            |due: u64| Verdict::Wait(Duration::from_millis((due - now).min(ms(header))));
        if self.open.load(Ordering::Relaxed) > 0 {
            // An answer is under way: nothing to time until it ends.
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

/// One request whose answer has not finished; dropping it ends it.
#[derive(Debug)]
pub struct OpenRequest(Arc<Activity>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        // The end of an answer is traffic: the idle time counts from here.
        self.0.wrote();
    }
}

/// A response body that holds its request open until it ends or is dropped.
#[derive(Debug)]
pub struct Tracked<B> {
    inner: B,
    _open: OpenRequest,
}

impl<B> Tracked<B> {
    /// Holds `open` for as long as `inner` lives.
    pub fn new(inner: B, open: OpenRequest) -> Self {
        Self { inner, _open: open }
    }
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }

    /// Writes out the pending replacement, if any.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
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
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
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
mod tests {
    use super::*;

    // Long enough that a busy machine does not reach a deadline between two statements.
    const H: Duration = Duration::from_millis(200);
    const I: Duration = Duration::from_millis(400);

    #[test]
    fn a_slow_head_times_out_and_an_idle_connection_goes_idle() {
        let a = Activity::new();
        assert!(matches!(a.verdict(H, I), Verdict::Wait(_)));
        a.read(b"POST /v1/completions HT");
        std::thread::sleep(H + Duration::from_millis(5));
        assert_eq!(a.verdict(H, I), Verdict::HeaderTimeout);

        let b = Activity::new();
        std::thread::sleep(I + Duration::from_millis(5));
        assert_eq!(b.verdict(H, I), Verdict::Idle);
    }

    #[test]
    fn an_open_request_is_never_timed_and_its_end_restarts_the_idle_clock() {
        let a = Activity::new();
        a.read(b"POST / HTTP/1.1\r\n\r\n");
        let open = a.request();
        // The client sends more (a pipelined request, HTTP/2 window updates) while the answer
        // streams: still no verdict against it.
        a.read(b"GET /");
        std::thread::sleep(I + Duration::from_millis(5));
        assert!(matches!(a.verdict(H, I), Verdict::Wait(_)));
        drop(open);
        assert!(matches!(a.verdict(H, I), Verdict::Wait(_)));
    }

    #[test]
    fn http2_frames_are_not_heads() {
        let a = Activity::new();
        a.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        std::thread::sleep(H + Duration::from_millis(5));
        assert!(matches!(a.verdict(H, I), Verdict::Wait(_)));
        std::thread::sleep(I);
        assert_eq!(a.verdict(H, I), Verdict::Idle);
    }

    #[test]
    fn per_client_slots_are_counted_and_released() {
        let t = PerClient::new(Some(2));
        let ip: IpAddr = [127, 0, 0, 1].into();
        let other: IpAddr = [127, 0, 0, 2].into();
        let s1 = t.admit(ip);
        let s2 = t.admit(ip);
        assert!(matches!((&s1, &s2), (Ok(Some(_)), Ok(Some(_)))));
        assert_eq!(t.admit(ip).err(), Some(2));
        assert!(matches!(t.admit(other), Ok(Some(_))));
        drop(s1);
        assert_eq!(t.count(ip), 1);
        let s3 = t.admit(ip);
        assert!(s3.is_ok());
        drop((s2, s3));
        assert_eq!(t.count(ip), 0);
        assert!(matches!(PerClient::new(None).admit(ip), Ok(None)));
    }
}
