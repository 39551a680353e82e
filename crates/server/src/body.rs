//! Body types: what the router answers with, and reading a client's request body once, bounded.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

use crate::error::ApiError;
use crate::fields::Fields;

/// Error type of streamed response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the router sends: a fixed buffer or an upstream stream. A
/// relayed answer also carries the instance's header lines ([`Fields`]) to the front that
/// writes its head: here rather than in the response's extensions, whose map was allocated
/// and hashed for each answer (about 500 instructions under callgrind).
#[derive(Debug)]
pub struct ProxyBody {
    body: UnsyncBoxBody<Bytes, BoxError>,
    fields: Fields,
}

impl ProxyBody {
    /// A relayed answer's body, with its instance's header lines.
    pub fn relayed<B>(body: B, fields: Fields) -> Self
    where
        B: http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        Self {
            body: body.boxed_unsync(),
            fields,
        }
    }

    /// The instance's header lines, taken once (none for the router's own answers).
    pub fn take_fields(&mut self) -> Fields {
        std::mem::take(&mut self.fields)
    }
}

impl http_body::Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A fixed body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    ProxyBody {
        body: Full::new(bytes.into())
            .map_err(|never| match never {})
            .boxed_unsync(),
        fields: Fields::default(),
    }
}

/// A client's request body, as the handler takes it.
#[derive(Debug)]
pub enum RequestBody {
    /// Read whole already, within the limits, by the router's own HTTP/1.1 front
    /// ([`crate::front`]): a slice of the connection's read buffer when it fit there.
    Read(Bytes),
    /// Still arriving through hyper (HTTP/2, TLS).
    Incoming(hyper::body::Incoming),
}

impl RequestBody {
    /// The whole body: at most `limit` bytes (else 413), within `timeout` (else 408).
    pub async fn read(self, limit: u64, timeout: Duration) -> Result<Bytes, ApiError> {
        match self {
            RequestBody::Read(bytes) => Ok(bytes),
            RequestBody::Incoming(body) => read_body(body, limit, timeout).await,
        }
    }
}

/// Reads a whole request body: at most `limit` bytes (else 413), within `timeout` (else 408).
/// The body is read once and later forwarded unchanged, so a retry can resend it.
pub async fn read_body<B>(body: B, limit: u64, timeout: Duration) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    // A declared length over the limit is refused before reading anything.
    if let Some(declared) = body.size_hint().exact() {
        if declared > limit {
            return Err(ApiError::too_large(limit));
        }
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    match tokio::time::timeout(timeout, collect(body, limit)).await {
        Err(_) => Err(ApiError::body_timeout()),
        Ok(r) => r,
    }
}

/// Collects the data frames of `body` (trailers are not forwarded). A body that arrives in one
/// piece is kept as it is; one in several pieces is copied once into a buffer sized from its
/// declared length.
async fn collect<B>(body: B, limit: usize) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let hint = usize::try_from(body.size_hint().lower()).unwrap_or(limit);
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::body_read(e.into()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        len = len.saturating_add(data.len());
        if len > limit {
            return Err(ApiError::too_large(limit as u64));
        }
        if let Some(buf) = joined.as_mut() {
            buf.extend_from_slice(&data);
        } else if let Some(head) = first.take() {
            let mut buf = BytesMut::with_capacity(hint.clamp(len, limit));
            buf.extend_from_slice(&head);
            buf.extend_from_slice(&data);
            joined = Some(buf);
        } else {
            first = Some(data);
        }
    }
    Ok(match (joined, first) {
        (Some(buf), _) => buf.freeze(),
        (None, Some(one)) => one,
        (None, None) => Bytes::new(),
    })
}
