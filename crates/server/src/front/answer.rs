//! Writing an answer to the client: its head, then its body as it comes.

use std::io::IoSlice;
use std::task::Poll;

use http::Response;
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::response::{self, chunk_start, declared_length, encode_head, OutFraming, Persist};
use super::{read_some, Conn, Deadlines, WRITE_DIRECT, WRITE_MAX};
use crate::body::ProxyBody;

/// Writes `resp` to the client: its head, then its body as it comes, written out whenever the
/// body has nothing more ready. Returns whether the connection can carry another request.
/// Each write must be taken by the client within `timeouts.client_write` ([`Deadlines::write`]),
/// or the connection closes (`TimedOut`) and the answer's body is dropped, which cancels it.
pub(super) async fn write_answer<S: AsyncRead + AsyncWrite + Unpin>(
    (io, out, buf, max): Conn<'_, S>,
    clock: &mut Deadlines,
    resp: Response<ProxyBody>,
    head_request: bool,
    http11: bool,
    keep: bool,
) -> std::io::Result<bool> {
    let (parts, mut body) = resp.into_parts();
    // A relayed answer's own headers travel as wire lines beside the (then router-only) map.
    let fields = body.take_fields();
    let framing = OutFraming::choose(
        head_request,
        http11,
        parts.status,
        fields
            .content_length()
            .or_else(|| declared_length(&parts.headers)),
        &body.size_hint(),
    );
    let asked_close = parts
        .headers
        .get(http::header::CONNECTION)
        .is_some_and(|v| crate::h1::tokens(v.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"close")));
    let keep = keep && !asked_close && framing != OutFraming::Close;
    let persist = match (keep, http11) {
        (false, _) => Persist::Close,
        (true, true) => Persist::Default,
        (true, false) => Persist::KeepAlive,
    };
    out.clear();
    encode_head(parts.status, &parts.headers, &fields, framing, persist, out);
    drop(parts);
    if let OutFraming::Empty(_) = framing {
        drop(body);
        put(io, clock, out).await?;
        return Ok(keep);
    }
    let declared = match framing {
        OutFraming::Length(n) => Some(n),
        _ => None,
    };
    let chunked = framing == OutFraming::Chunked;
    let mut sent = 0u64;
    loop {
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut body).poll_frame(cx)))
                .await;
        let frame = match polled {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                // Nothing more ready: what is buffered goes out before waiting.
                put(io, clock, out).await?;
                out.clear();
                // The client is watched while the answer waits (an engine queueing or
                // prefilling, for minutes perhaps, or between tokens): one that leaves cancels
                // the request now, not at the next write (hyper watched too).
                loop {
                    tokio::select! {
                        biased;
                        frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)) => break frame,
                        read = read_some(io, buf), if buf.len() <= max => match read {
                            Ok(n) if n > 0 => {}
                            _ => return Err(std::io::ErrorKind::ConnectionAborted.into()),
                        },
                    }
                }
            }
        };
        let data = match frame {
            None => break,
            // The answer broke off: the client sees the connection close before its end.
            Some(Err(e)) => {
                tracing::debug!(error = %e, "answer body failed; closing the client connection");
                put(io, clock, out).await?;
                return Ok(false);
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if !data.is_empty() => data,
                _ => continue,
            },
        };
        let mut data = &data[..];
        if let Some(n) = declared {
            // Never more than the announced length: the rest would be read as a next answer.
            let room = usize::try_from(n - sent).unwrap_or(usize::MAX);
            data = &data[..data.len().min(room)];
        }
        sent += data.len() as u64;
        if chunked {
            chunk_start(data.len(), out);
        }
        if data.len() >= WRITE_DIRECT {
            clock.write(write_two(io, out, data)).await?;
            out.clear();
        } else {
            out.extend_from_slice(data);
        }
        if chunked {
            out.extend_from_slice(response::CHUNK_END);
        }
        if out.len() >= WRITE_MAX {
            put(io, clock, out).await?;
            out.clear();
        }
        if body.is_end_stream() || declared == Some(sent) {
            break;
        }
    }
    // Ended before its last bytes go out: a relayed answer counts as finished when its body
    // is dropped at its end, and a client that has the answer may look at once.
    drop(body);
    if chunked {
        out.extend_from_slice(response::LAST_CHUNK);
    }
    put(io, clock, out).await?;
    // A body shorter than its announced length leaves the client waiting for the rest: only
    // closing tells it.
    Ok(keep && declared.is_none_or(|n| n == sent))
}

/// Writes `bytes` out and flushes, within the connection's write deadline.
async fn put<S: AsyncWrite + Unpin>(
    io: &mut S,
    clock: &mut Deadlines,
    bytes: &[u8],
) -> std::io::Result<()> {
    clock
        .write(async {
            io.write_all(bytes).await?;
            io.flush().await
        })
        .await
}

/// Writes `a` then `b`, vectored.
async fn write_two<S: AsyncWrite + Unpin>(io: &mut S, a: &[u8], b: &[u8]) -> std::io::Result<()> {
    let (mut a, mut b) = (a, b);
    while !a.is_empty() {
        let n = io
            .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if n >= a.len() {
            b = &b[n - a.len()..];
            a = &[];
        } else {
            a = &a[n..];
        }
    }
    io.write_all(b).await
}
