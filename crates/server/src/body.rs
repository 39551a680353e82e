//! Body types: what the router answers with, and reading a client's request body once, bounded.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};

use crate::error::ApiError;

/// Error type of streamed response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the router sends: a fixed buffer or an upstream stream.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A fixed body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
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
    let limited = Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match tokio::time::timeout(timeout, limited.collect()).await {
        Err(_) => Err(ApiError::body_timeout()),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ApiError::too_large(limit))
        }
        Ok(Err(e)) => Err(ApiError::body_read(e)),
    }
}
