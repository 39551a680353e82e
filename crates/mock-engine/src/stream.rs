//! A streaming response: SSE chunks built from the engine's progress as it arrives.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Sleep;

use crate::body::StreamCut;
use crate::driver::Progress;
use crate::request::ApiKind;
use crate::response::{Meta, DONE};
use crate::responses;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the engine.
    Running,
    /// Cut on purpose (or the engine went away): error out once `pending` is sent.
    Cut,
    /// Everything queued is the rest of the stream.
    Ended,
}

/// How long a cut stream waits before failing, so the chunks before the cut leave the socket
/// (hyper drops unflushed output when a body fails).
const CUT_GRACE: Duration = Duration::from_millis(20);

/// The SSE body of one streaming request.
#[derive(Debug)]
pub(crate) struct SseStream {
    meta: Meta,
    progress: mpsc::UnboundedReceiver<Progress>,
    output_tokens: u32,
    /// Tokens sent in chunks so far.
    sent: u32,
    cached_tokens: Option<u32>,
    /// Cut the stream after this many tokens (fault injection).
    cut_after: Option<u32>,
    pending: VecDeque<Bytes>,
    state: State,
    /// Runs while a cut stream lets its last chunks flush.
    grace: Option<Pin<Box<Sleep>>>,
    /// The next event's `sequence_number` (a Responses stream).
    sequence: u32,
}

impl SseStream {
    /// A stream of `output_tokens` tokens fed by `progress`.
    pub fn new(
        meta: Meta,
        progress: mpsc::UnboundedReceiver<Progress>,
        output_tokens: u32,
        cut_after: Option<u32>,
    ) -> Self {
        let mut sequence = 0;
        let mut pending = VecDeque::new();
        // As vLLM: the opening events go at once, before queueing and prefill.
        if meta.kind == ApiKind::Responses {
            pending.push_back(responses::opening(&meta, &mut sequence));
        }
        SseStream {
            meta,
            progress,
            output_tokens,
            sent: 0,
            cached_tokens: None,
            cut_after: cut_after.filter(|&n| n < output_tokens),
            pending,
            state: State::Running,
            grace: None,
            sequence,
        }
    }

    /// The next piece of the body.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, StreamCut>>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(b)));
            }
            match self.state {
                State::Ended => return Poll::Ready(None),
                State::Cut => {
                    let grace = self
                        .grace
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(CUT_GRACE)));
                    ready!(grace.as_mut().poll(cx));
                    self.state = State::Ended;
                    return Poll::Ready(Some(Err(StreamCut(self.sent))));
                }
                State::Running => {}
            }
            match ready!(self.progress.poll_recv(cx)) {
                Some(Progress::Started { cached_tokens }) => self.cached_tokens = cached_tokens,
                Some(Progress::Generated(total)) => self.tokens(total),
                Some(Progress::Finished) => {
                    self.tokens(self.output_tokens);
                    if self.state == State::Running && self.meta.kind == ApiKind::Responses {
                        self.pending.push_back(responses::closing(
                            &self.meta,
                            self.sent,
                            self.cached_tokens,
                            &mut self.sequence,
                        ));
                        self.state = State::Ended;
                    }
                    if self.state == State::Running {
                        if self.meta.include_usage {
                            self.pending
                                .push_back(self.meta.usage_chunk(self.sent, self.cached_tokens));
                        }
                        self.pending.push_back(Bytes::from_static(DONE));
                        self.state = State::Ended;
                    }
                }
                // The engine stopped (shutdown): the stream ends abnormally.
                None => self.state = State::Cut,
            }
        }
    }

    /// Queues a chunk for the tokens up to `total`, stopping at the cut point.
    fn tokens(&mut self, total: u32) {
        let mut to = total.min(self.output_tokens);
        let cut = self.cut_after.is_some_and(|n| to >= n);
        if let Some(n) = self.cut_after.filter(|_| cut) {
            to = n;
        }
        if to > self.sent {
            let chunk = match self.meta.kind {
                ApiKind::Responses => {
                    responses::delta(&self.meta, self.sent, to, &mut self.sequence)
                }
                _ => self.meta.chunk(self.sent, to, to == self.output_tokens),
            };
            self.pending.push_back(chunk);
            self.sent = to;
        }
        if cut {
            self.state = State::Cut;
        }
    }
}
