//! The response body sent to the client: the instance's body passed through frame by frame (no
//! buffering), holding the in-flight guard and enforcing the idle-stream timeout.

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
    timer: Pin<Box<Sleep>>,
    done: bool,
}

impl RelayBody {
    /// Relays `inner`, holding `guard` until the end.
    pub fn new(inner: Incoming, guard: InFlightGuard, idle: Duration) -> Self {
        Self {
            inner,
            guard,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            done: false,
        }
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
                if frame.is_data() {
                    this.guard.first_byte();
                }
                let deadline = Instant::now() + this.idle;
                this.timer.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.error("stream");
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.done = true;
                this.guard.complete();
                Poll::Ready(None)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.error("idle_timeout");
                    Poll::Ready(Some(Err(Box::new(IdleTimeout(this.idle)))))
                }
                Poll::Pending => Poll::Pending,
            },
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
            self.guard.complete();
        }
    }
}
