//! The answers a hyper-served connection is writing (TLS, HTTP/2), as its watchdog sees them.
//!
//! hyper asks an answer's body for its next frame only when it has room to send it: while a
//! client takes nothing (a full socket over HTTP/1, a closed flow-control window over HTTP/2),
//! the body is not polled, so no timer of the relay's ever runs and the request would hold its
//! engine slot until the connection died. Each body therefore notes when it handed hyper a
//! frame and was not asked for the next one since; the connection's watchdog reads those notes
//! ([`Answers::oldest_waiting`]) and, past `timeouts.client_write`, closes an HTTP/1 connection
//! or drops the stalled HTTP/2 stream's relay ([`Answers::cancel_waiting`]): its request is
//! cancelled and the engine's answer let go, as on plaintext HTTP/1 ([`crate::front`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};

use super::{Activity, NONE};

/// What the watchdog needs of one answer, whatever its body type.
trait Waiting: Send + Sync {
    /// When it handed out its last frame without being asked for the next one since (ms of
    /// the connection's clock; [`NONE`]: it is being asked, or has handed out nothing).
    fn waiting_since(&self) -> u64;
    /// Drops the body if it has been waiting since `due` or earlier; whether it did.
    fn cancel_if_waiting(&self, due: u64) -> bool;
}

/// The answers of one connection. Dead entries (answers finished) are pruned as the list grows,
/// so it stays within about twice the answers open.
#[derive(Default)]
pub(super) struct Answers {
    list: Mutex<Vec<Weak<dyn Waiting>>>,
}

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answers").finish_non_exhaustive()
    }
}

impl Answers {
    fn lock(&self) -> MutexGuard<'_, Vec<Weak<dyn Waiting>>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, answer: Weak<dyn Waiting>) {
        let mut list = self.lock();
        // Amortised: a prune is paid for by the pushes since the last one.
        if list.len() >= 16 && list.len().is_power_of_two() {
            list.retain(|w| w.strong_count() > 0);
        }
        list.push(answer);
    }

    /// The earliest time an open answer has been waiting since ([`NONE`]: none waits).
    pub(super) fn oldest_waiting(&self) -> u64 {
        let mut list = self.lock();
        list.retain(|w| w.strong_count() > 0);
        list.iter()
            .filter_map(Weak::upgrade)
            .map(|a| a.waiting_since())
            .min()
            .unwrap_or(NONE)
    }

    /// Drops the bodies of the answers waiting since `due` or earlier; how many.
    pub(super) fn cancel_waiting(&self, due: u64) -> usize {
        // Upgraded outside the lock, and dropped (a relay's drop records its request) after it.
        let open: Vec<Arc<dyn Waiting>> = self.lock().iter().filter_map(Weak::upgrade).collect();
        open.iter().filter(|a| a.cancel_if_waiting(due)).count()
    }
}

/// An answer's body, shared by hyper (through [`Tracked`]) and the watchdog.
struct Shared<B> {
    /// None once the watchdog dropped it: the request is then no longer open either, so the
    /// connection's idle rule applies again to a client that never reads on.
    body: Mutex<Option<(B, OpenRequest)>>,
    /// See [`Waiting::waiting_since`]. Written with `body` locked, so the watchdog's check and
    /// its drop see the same poll.
    waiting_ms: AtomicU64,
}

impl<B> Shared<B> {
    fn lock(&self) -> MutexGuard<'_, Option<(B, OpenRequest)>> {
        self.body.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: Send> Waiting for Shared<B> {
    fn waiting_since(&self) -> u64 {
        self.waiting_ms.load(Ordering::Relaxed)
    }
    fn cancel_if_waiting(&self, due: u64) -> bool {
        let mut body = self.lock();
        if body.is_none() || self.waiting_ms.load(Ordering::Relaxed) > due {
            return false;
        }
        let dropped = body.take();
        // Not waiting any more: the watchdog must not find it again.
        self.waiting_ms.store(NONE, Ordering::Relaxed);
        drop(body);
        drop(dropped);
        true
    }
}

/// The error a stalled answer ends with when hyper asks for it again (an HTTP/2 stream is
/// reset: the client must not take a cut answer for a whole one).
#[derive(Debug, thiserror::Error)]
#[error("the client took nothing of this answer for too long; it was cancelled")]
pub struct StoppedReading;

/// A response body that holds its request open until it ends or is dropped, and that the
/// connection's watchdog can cancel while hyper waits for the client (module documentation).
pub struct Tracked<B> {
    shared: Arc<Shared<B>>,
    /// The connection's, for its clock.
    activity: Arc<Activity>,
}

impl<B> std::fmt::Debug for Tracked<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracked").finish_non_exhaustive()
    }
}

impl<B: Send + 'static> Tracked<B> {
    /// Holds `open` for as long as `inner` lives, and shows `inner` to the connection's
    /// watchdog.
    pub fn new(inner: B, open: OpenRequest) -> Self {
        let activity = Arc::clone(&open.0);
        let shared = Arc::new(Shared {
            body: Mutex::new(Some((inner, open))),
            waiting_ms: AtomicU64::new(NONE),
        });
        let watched: Arc<dyn Waiting> = shared.clone();
        activity.answers.add(Arc::downgrade(&watched));
        Self { shared, activity }
    }
}

impl<B> Body for Tracked<B>
where
    B: Body + Unpin + Send,
    B::Error: From<StoppedReading>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let mut body = this.shared.lock();
        let Some((inner, _)) = body.as_mut() else {
            return Poll::Ready(Some(Err(StoppedReading.into())));
        };
        let polled = Pin::new(inner).poll_frame(cx);
        let waiting = match &polled {
            Poll::Ready(Some(Ok(_))) => this.activity.now_ms(),
            _ => NONE,
        };
        this.shared.waiting_ms.store(waiting, Ordering::Relaxed);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.shared
            .lock()
            .as_ref()
            .is_some_and(|(b, _)| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.shared
            .lock()
            .as_ref()
            .map_or_else(SizeHint::default, |(b, _)| b.size_hint())
    }
}

/// One request whose answer has not finished; dropping it ends it.
#[derive(Debug)]
pub struct OpenRequest(pub(super) Arc<Activity>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        // The end of an answer is traffic: the idle time counts from here.
        self.0.wrote();
    }
}
