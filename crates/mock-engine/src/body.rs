//! Response bodies: a whole buffer, or an SSE stream produced as the engine generates.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::stream::SseStream;

/// A stream cut on purpose (`close_stream_after_tokens`); hyper closes the connection without
/// ending the chunked body, as a crashed engine would.
#[derive(Debug, thiserror::Error)]
#[error("stream closed on purpose after {0} tokens")]
pub(crate) struct StreamCut(pub u32);

/// The body of every response.
#[derive(Debug)]
pub(crate) enum ResponseBody {
    /// A complete body (possibly empty), sent once.
    Full(Option<Bytes>),
    /// Server-sent events.
    Sse(Box<SseStream>),
}

impl ResponseBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        ResponseBody::Full(Some(bytes.into()))
    }

    /// An empty body.
    pub fn empty() -> Self {
        ResponseBody::Full(None)
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = StreamCut;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StreamCut>>> {
        match self.get_mut() {
            ResponseBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Sse(s) => s.poll_next(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ResponseBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
            ResponseBody::Sse(_) => SizeHint::default(),
        }
    }
}
