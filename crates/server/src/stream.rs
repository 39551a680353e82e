//! The response body sent to the client: the instance's body passed through frame by frame (no
//! buffering), holding the in-flight guard, enforcing the idle-stream timeout, and reading the
//! engine's usage report as it goes by ([`crate::usage`]).
//!
//! When the instance's stream fails part way (its connection broke, or it went quiet past the
//! idle timeout), a server-sent-events answer ends with an `error` event in the OpenAI error
//! shape and then closes cleanly: OpenAI SDKs raise it, and a client that does not check for
//! `[DONE]` does not take a truncated answer for a complete one. Any other answer, and an event
//! stream whose length was announced (the event would not fit in it), is cut, so that its
//! framing (length or chunks) shows it incomplete.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;
use crate::error::ApiError;
use crate::guard::InFlightGuard;
use crate::outcome::Outcome;
use crate::pool::Leased;
use crate::usage::UsageScanner;

/// The instance sent nothing for longer than the idle-stream timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream stream idle for more than {0:?}")]
pub struct IdleTimeout(pub Duration);

/// The instance sent its head but no data (for a Responses stream, nothing past its opening
/// events) within the first-byte timeout.
#[derive(Debug, thiserror::Error)]
#[error("no answer data (past a Responses stream's opening events) within {0:?} of the response head (the longer of timeouts.first_byte_ms and idle_stream_ms)")]
pub struct FirstDataTimeout(pub Duration);

/// An upstream body relayed to the client. Dropping it (client gone) drops the upstream body,
/// which closes that upstream connection: the engine sees the disconnect and stops generating.
#[derive(Debug)]
pub struct RelayBody {
    inner: Leased,
    guard: InFlightGuard,
    idle: Duration,
    /// Until the first data frame, the wait may last this long from the head. Engines behind
    /// uvicorn (vLLM, SGLang) send a stream's head at once, before queueing and prefill: the
    /// idle timeout alone would cut a request that waited its turn for 5 minutes.
    first_data: Duration,
    /// When the relay started (the head came).
    started: Instant,
    /// A data frame went by.
    seen_data: bool,
    /// When the instance last sent something (or the relay started).
    last: Instant,
    /// The idle timer, armed only once the instance makes the relay wait, and moved only when
    /// it fires early: frames that arrive back to back never touch the timer wheel.
    timer: Option<Pin<Box<Sleep>>>,
    /// Looks for `usage` in a successful answer (`None` for an error answer: nothing to learn).
    usage: Option<UsageScanner>,
    /// A server-sent-events answer (ends with an `error` event when the upstream fails).
    sse: bool,
    /// The last two bytes relayed, to end a half-sent event before the error event.
    last_two: [u8; 2],
    done: bool,
}

impl RelayBody {
    /// Relays `inner`, holding `guard` until the end; `scan_usage` looks for the engine's
    /// usage report on the way.
    /// `sse` says the answer is a server-sent-events stream that may end a failure with an
    /// `error` event (not one framed by a length).
    pub fn new(
        inner: Leased,
        guard: InFlightGuard,
        idle: Duration,
        first_data: Duration,
        scan_usage: bool,
        sse: bool,
    ) -> Self {
        let now = Instant::now();
        Self {
            inner,
            guard,
            idle,
            first_data,
            started: now,
            seen_data: false,
            last: now,
            timer: None,
            usage: scan_usage.then(UsageScanner::new),
            sse,
            last_two: *b"\n\n",
            done: false,
        }
    }

    /// When waiting becomes a timeout: `idle` after the last frame, and before the first data
    /// no sooner than `first_data` after the head.
    fn deadline(&self) -> Instant {
        let idle_at = self.last + self.idle;
        if self.seen_data {
            idle_at
        } else {
            idle_at.max(self.started + self.first_data)
        }
    }

    /// The answer went out completely.
    fn complete(&mut self) {
        let usage = self.usage.as_mut().and_then(UsageScanner::finish);
        if let Some(n) = self
            .usage
            .as_ref()
            .and_then(UsageScanner::completion_tokens)
        {
            self.guard.output_tokens(n);
        }
        self.guard.complete(usage);
    }

    /// The upstream failed part way: records it, and returns what goes to the client, the
    /// closing `error` event of a stream or the error that cuts any other answer.
    fn error(
        &mut self,
        outcome: Outcome,
        err: BoxError,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.done = true;
        self.guard.fail(outcome);
        self.guard.upstream_error(outcome.label());
        if !self.sse {
            return Poll::Ready(Some(Err(err)));
        }
        self.guard.metrics().stream_error_events.inc();
        let id = self.guard.instance().id();
        let api = if matches!(outcome, Outcome::IdleTimeout | Outcome::Timeout) {
            ApiError::gateway_timeout(format!("instance {id}: {err}; the answer is incomplete"))
        } else {
            ApiError::bad_gateway(
                "upstream_stream_error",
                format!("instance {id} broke off the stream ({err}); the answer is incomplete"),
            )
        };
        Poll::Ready(Some(Ok(Frame::data(error_event(self.last_two, &api)))))
    }
}

/// An SSE `error` event carrying `api` in the OpenAI error shape, preceded by what ends the
/// event the upstream left half sent (after `last_two`, the last bytes relayed).
fn error_event(last_two: [u8; 2], api: &ApiError) -> Bytes {
    let close = match last_two {
        [_, b'\n'] if last_two[0] == b'\n' => "",
        [_, b'\n'] => "\n",
        _ => "\n\n",
    };
    Bytes::from(format!("{close}event: error\ndata: {}\n\n", api.to_json()))
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
                let mut first_data = false;
                if let Some(data) = frame.data_ref() {
                    // Until the first token, the longer wait for it applies (a Responses
                    // stream's opening events are sent before it: `crate::opening`).
                    if this.guard.body_data(data) && !this.seen_data {
                        first_data = !data.is_empty();
                        this.seen_data = first_data;
                    }
                    if let Some(scanner) = this.usage.as_mut() {
                        scanner.feed(data);
                    }
                    match data.len() {
                        0 => {}
                        1 => this.last_two = [this.last_two[1], data[0]],
                        n => this.last_two = [data[n - 2], data[n - 1]],
                    }
                }
                if let Some(timer) = this.timer.as_mut() {
                    this.last = Instant::now();
                    // Armed for the first data's longer wait: from here on, the idle one.
                    if first_data {
                        timer.as_mut().reset(this.last + this.idle);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => this.error(Outcome::StreamBroken, Box::new(e)),
            Poll::Ready(None) => {
                this.done = true;
                this.complete();
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.timer.is_none() {
                    // First wait: from now on, `last` is kept current on every frame.
                    this.last = Instant::now();
                    this.timer = Some(Box::pin(tokio::time::sleep_until(this.deadline())));
                }
                if let Some(mut timer) = this.timer.take() {
                    loop {
                        if timer.as_mut().poll(cx).is_pending() {
                            this.timer = Some(timer);
                            return Poll::Pending;
                        }
                        // Fired: for real, or armed before the latest frame arrived.
                        let deadline = this.deadline();
                        if deadline <= Instant::now() {
                            break;
                        }
                        timer.as_mut().reset(deadline);
                    }
                }
                if this.seen_data {
                    let idle = this.idle;
                    this.error(Outcome::IdleTimeout, Box::new(IdleTimeout(idle)))
                } else {
                    let wait = this.first_data.max(this.idle);
                    this.error(Outcome::Timeout, Box::new(FirstDataTimeout(wait)))
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_event_ends_a_half_sent_event_first() {
        let api = ApiError::bad_gateway("upstream_stream_error", "gone");
        let event = |last: &[u8; 2]| String::from_utf8_lossy(&error_event(*last, &api)).to_string();
        let whole = event(b"\n\n");
        assert!(whole.starts_with("event: error\ndata: {"), "{whole}");
        assert!(whole.ends_with("}\n\n"), "{whole}");
        assert!(
            whole.contains("\"code\":\"upstream_stream_error\""),
            "{whole}"
        );
        assert_eq!(event(b"}\n"), format!("\n{whole}"));
        assert_eq!(event(b"ab"), format!("\n\n{whole}"));
    }
}
