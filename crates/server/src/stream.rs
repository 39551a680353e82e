//! The response body sent to the client: the instance's body passed through frame by frame (no
//! buffering), holding the in-flight guard, enforcing the idle-stream timeout, and reading the
//! engine's usage report as it goes by ([`crate::usage`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;
use crate::guard::InFlightGuard;
use crate::usage::UsageScanner;

/// The instance sent nothing for longer than the idle-stream timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream stream idle for more than {0:?}")]
pub struct IdleTimeout(pub Duration);

/// An upstream body relayed to the client. Dropping it (client gone) drops the upstream body,
/// which closes that upstream connection: the engine sees the disconnect and stops generating.
#[derive(Debug)]
pub struct RelayBody {
    inner: Incoming,
    guard: InFlightGuard,
    idle: Duration,
    /// When the instance last sent something (or the relay started).
    last: Instant,
    /// The idle timer, armed only once the instance makes the relay wait, and moved only when
    /// it fires early: frames that arrive back to back never touch the timer wheel.
    timer: Option<Pin<Box<Sleep>>>,
    /// Looks for `usage` in a successful answer (`None` for an error answer: nothing to learn).
    usage: Option<UsageScanner>,
    done: bool,
}

impl RelayBody {
    /// Relays `inner`, holding `guard` until the end; `scan_usage` looks for the engine's
    /// usage report on the way.
    pub fn new(inner: Incoming, guard: InFlightGuard, idle: Duration, scan_usage: bool) -> Self {
        Self {
            inner,
            guard,
            idle,
            last: Instant::now(),
            timer: None,
            usage: scan_usage.then(UsageScanner::new),
            done: false,
        }
    }

    /// The answer went out completely.
    fn complete(&mut self) {
        let usage = self.usage.as_mut().and_then(UsageScanner::finish);
        self.guard.complete(usage);
    }

    fn error(&mut self, kind: &'static str) {
        self.done = true;
        let id = self.guard.instance().id().to_string();
        self.guard.fail(kind);
        self.guard.metrics().upstream_error(&id, kind);
        self.guard.count_error();
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.guard.first_byte();
                    if let Some(scanner) = this.usage.as_mut() {
                        scanner.feed(data);
                    }
                }
                if this.timer.is_some() {
                    this.last = Instant::now();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.error("stream");
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.done = true;
                this.complete();
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.timer.is_none() {
                    // First wait: from now on, `last` is kept current on every frame.
                    this.last = Instant::now();
                    this.timer = Some(Box::pin(tokio::time::sleep_until(this.last + this.idle)));
                }
                if let Some(timer) = this.timer.as_mut() {
                    loop {
                        if timer.as_mut().poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        // Fired: idle for real, or armed before the latest frame arrived.
                        let deadline = this.last + this.idle;
                        if deadline <= Instant::now() {
                            break;
                        }
                        timer.as_mut().reset(deadline);
                    }
                }
                this.error("idle_timeout");
                Poll::Ready(Some(Err(Box::new(IdleTimeout(this.idle)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for RelayBody {
    fn drop(&mut self) {
        // An empty body may never be polled: it still completed.
        if !self.done && self.inner.is_end_stream() {
            self.complete();
        }
    }
}
