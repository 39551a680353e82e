//! The answers a hyper-served connection is writing (TLS, HTTP/2), as its watchdog sees them.
//!
//! hyper asks an answer's body for its next frame only when it has room to send it: while an
//! HTTP/2 client keeps a stream's flow-control window shut, that body is not polled, so no timer
//! of the relay's ever runs and the request would hold its engine slot until the connection
//! died. Each body therefore notes when it handed hyper a frame and was not asked for the next
//! one since; the connection's watchdog reads those notes ([`Answers::oldest`]) and, past
//! `timeouts.client_write`, drops the stalled stream's relay ([`Answers::cancel_waiting`]): its
//! request is cancelled and the engine's answer let go, as on plaintext HTTP/1
//! ([`crate::front`]). hyper resets the stream when it next asks the body for more, which is
//! only once the client opens the window again: a cancelled stream hyper still holds another
//! `client_write` later is a client that takes nothing, and the connection is closed.
//!
//! HTTP/1 needs none of this: hyper stops asking for more there only while it flushes what it
//! holds to a socket the client is slow to read, which the socket's own rule times by progress
//! (a client reading slowly but steadily is not cut).

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
    /// When the watchdog dropped its body ([`NONE`]: it has not).
    fn cancelled_at(&self) -> u64;
    /// Drops the body if it has been waiting since `due` or earlier, noting `now` as when;
    /// whether it did.
    fn cancel_if_waiting(&self, due: u64, now: u64) -> bool;
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

    /// The answers hyper still holds. Upgraded under the lock, used and dropped after it: the
    /// last reference to an answer hyper just let go may be one of these, and dropping a relay
    /// records its request.
    fn held(&self) -> Vec<Arc<dyn Waiting>> {
        let mut list = self.lock();
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// The earliest time a held answer has been waiting since, and the earliest a held one was
    /// cancelled ([`NONE`] for none).
    pub(super) fn oldest(&self) -> (u64, u64) {
        self.held().iter().fold((NONE, NONE), |(w, c), a| {
            (w.min(a.waiting_since()), c.min(a.cancelled_at()))
        })
    }

    /// Drops the bodies of the answers waiting since `due` or earlier, noting `now`; how many.
    pub(super) fn cancel_waiting(&self, due: u64, now: u64) -> usize {
        self.held()
            .iter()
            .filter(|a| a.cancel_if_waiting(due, now))
            .count()
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
    /// See [`Waiting::cancelled_at`].
    cancelled_ms: AtomicU64,
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
    fn cancelled_at(&self) -> u64 {
        self.cancelled_ms.load(Ordering::Relaxed)
    }
    fn cancel_if_waiting(&self, due: u64, now: u64) -> bool {
        let mut body = self.lock();
        if body.is_none() || self.waiting_ms.load(Ordering::Relaxed) > due {
            return false;
        }
        let dropped = body.take();
        // Not waiting any more: the watchdog must not cancel it again, only see whether hyper
        // lets it go.
        self.waiting_ms.store(NONE, Ordering::Relaxed);
        self.cancelled_ms.store(now, Ordering::Relaxed);
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
            cancelled_ms: AtomicU64::new(NONE),
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
        // The end of an answer is traffic: the idle time counts from here. (Nothing was
        // written, so a write waiting for the client still waits.)
        self.0.touched();
    }
}
