//! Typed outcomes of a proxied request: how one attempt at an instance failed before anything
//! reached the client ([`Failure`]: retried, ejected, answered), and how a request that went to
//! an instance ended ([`Outcome`]: the `outcome` label of `prefix_router_requests_total`, and
//! what its ticket tells the strategy). One place decides what each case means, instead of
//! strings compared at every use.

use http::StatusCode;
use prefix_router_core::{End, Usage};

use crate::error::ApiError;

/// How a request that was sent to an instance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with a 1xx-3xx status, relayed completely.
    Ok,
    /// The instance answered 4xx (relayed).
    Upstream4xx,
    /// The instance answered 5xx (relayed).
    Upstream5xx,
    /// Its answer (503, 429) or failure was dropped and the request sent elsewhere.
    Retried,
    /// No response head within the first-byte timeout, or no data of a stream whose head came
    /// at once ([`crate::stream`]).
    Timeout,
    /// No connection could be made.
    ConnectError,
    /// The instance closed the connection before a response head: it probably crashed on
    /// this request.
    UpstreamClosed,
    /// Another transport failure before a response head.
    UpstreamError,
    /// The response body broke off part way.
    StreamBroken,
    /// The response body paused for longer than the idle-stream timeout.
    IdleTimeout,
    /// The client went away first.
    Cancelled,
}

impl Outcome {
    /// Every outcome (each instance's `requests_total` series are one per API and outcome).
    pub const ALL: [Outcome; 11] = [
        Outcome::Ok,
        Outcome::Upstream4xx,
        Outcome::Upstream5xx,
        Outcome::Retried,
        Outcome::Timeout,
        Outcome::ConnectError,
        Outcome::UpstreamClosed,
        Outcome::UpstreamError,
        Outcome::StreamBroken,
        Outcome::IdleTimeout,
        Outcome::Cancelled,
    ];

    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Upstream4xx => "upstream_4xx",
            Outcome::Upstream5xx => "upstream_5xx",
            Outcome::Retried => "retried",
            Outcome::Timeout => "timeout",
            Outcome::ConnectError => "connect_error",
            Outcome::UpstreamClosed => "upstream_closed",
            Outcome::UpstreamError => "upstream_error",
            Outcome::StreamBroken => "stream",
            Outcome::IdleTimeout => "idle_timeout",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// The outcome of relaying an answer with this status, if it completes.
    pub fn of_status(status: StatusCode) -> Self {
        if status.is_server_error() {
            Outcome::Upstream5xx
        } else if status.is_client_error() {
            Outcome::Upstream4xx
        } else {
            Outcome::Ok
        }
    }

    /// What the ticket tells the strategy: only a complete ordinary answer is a finished
    /// request (its usage teaches cache-aware); a client gone is a cancellation; every other
    /// case failed.
    pub fn end(self, usage: Option<Usage>) -> End {
        match self {
            Outcome::Ok => End::Finished { usage },
            Outcome::Cancelled => End::Cancelled,
            _ => End::Failed,
        }
    }
}

/// Why an attempt at an instance got no response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Nothing within the first-byte timeout.
    Timeout,
    /// Could not connect (refused, unreachable, connect timeout, a failed TLS handshake); what
    /// the connector said.
    Connect(String),
    /// Connected and sent, then the connection closed without an answer.
    Closed,
    /// Anything else the client reported.
    Other(String),
}

impl Failure {
    /// Classifies an error of the upstream client.
    pub fn of(e: &crate::pool::SendError) -> Self {
        use crate::pool::SendError;
        match e {
            SendError::Connect(_) => Failure::Connect(chain(e)),
            SendError::Closed => Failure::Closed,
            SendError::Io(io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                Failure::Closed
            }
            SendError::Io(_) | SendError::Wire(_) | SendError::Request(_) => {
                Failure::Other(chain(e))
            }
        }
    }

    /// The `kind` label of `prefix_router_upstream_errors_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Connect(_) => "connect",
            Failure::Closed => "closed",
            Failure::Other(_) => "other",
        }
    }

    /// Whether another instance may be tried. Only a refused connection is certain not to
    /// have reached an engine; a request that an engine closed on may crash the next one too,
    /// and one that timed out may still be running.
    pub fn retryable(&self) -> bool {
        matches!(self, Failure::Connect(_))
    }

    /// Whether it counts toward passive ejection.
    pub fn ejects(&self) -> bool {
        matches!(self, Failure::Connect(_) | Failure::Closed)
    }

    /// The request's outcome when this failure ends it.
    pub fn outcome(&self) -> Outcome {
        match self {
            Failure::Timeout => Outcome::Timeout,
            Failure::Connect(_) => Outcome::ConnectError,
            Failure::Closed => Outcome::UpstreamClosed,
            Failure::Other(_) => Outcome::UpstreamError,
        }
    }

    /// The client's answer when this failure ends the request at `instance`.
    pub fn answer(&self, instance: &str, first_byte: std::time::Duration) -> ApiError {
        match self {
            Failure::Timeout => ApiError::gateway_timeout(format!(
                "instance {instance} sent no response within {first_byte:?} (timeouts.first_byte_ms)"
            )),
            Failure::Connect(why) => ApiError::bad_gateway(
                "upstream_connect_error",
                format!("cannot connect to instance {instance}: {why}"),
            ),
            Failure::Closed => ApiError::bad_gateway(
                "upstream_closed",
                format!(
                    "instance {instance} closed the connection before answering: the engine may have crashed on this request (see its log); it was not retried elsewhere"
                ),
            ),
            Failure::Other(e) => {
                ApiError::bad_gateway("upstream_error", format!("instance {instance} failed: {e}"))
            }
        }
    }
}

/// The retry reason of an answer that another instance may do better with (nothing of it has
/// reached the client): 503 and 429 say "not now", not "never".
pub fn retryable_status(status: StatusCode) -> Option<&'static str> {
    match status {
        StatusCode::SERVICE_UNAVAILABLE => Some("status_503"),
        StatusCode::TOO_MANY_REQUESTS => Some("status_429"),
        _ => None,
    }
}

/// An error and its causes, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_complete_ordinary_answer_finishes_a_ticket() {
        let all = Outcome::ALL;
        let labels: std::collections::HashSet<_> = all.iter().map(|o| o.label()).collect();
        assert_eq!(labels.len(), all.len(), "labels are distinct");
        for o in all {
            let want = match o {
                Outcome::Ok => End::Finished { usage: None },
                Outcome::Cancelled => End::Cancelled,
                _ => End::Failed,
            };
            assert_eq!(o.end(None), want, "{o:?}");
        }
        assert_eq!(Outcome::of_status(StatusCode::OK), Outcome::Ok);
        assert_eq!(
            Outcome::of_status(StatusCode::NOT_FOUND),
            Outcome::Upstream4xx
        );
        assert_eq!(
            Outcome::of_status(StatusCode::BAD_GATEWAY),
            Outcome::Upstream5xx
        );
    }

    #[test]
    fn only_a_refused_connection_is_retried_and_a_timeout_does_not_eject() {
        let connect = Failure::Connect("refused".into());
        let f = [
            Failure::Timeout,
            connect.clone(),
            Failure::Closed,
            Failure::Other("x".into()),
        ];
        let retried: Vec<_> = f.iter().filter(|x| x.retryable()).collect();
        assert_eq!(retried, [&connect]);
        let ejects: Vec<_> = f.iter().filter(|x| x.ejects()).collect();
        assert_eq!(ejects, [&connect, &Failure::Closed]);
        for x in &f {
            let a = x.answer("i", std::time::Duration::from_secs(1));
            assert!(
                a.status.is_server_error(),
                "{x:?}: an engine's fault is a 5xx"
            );
        }
        assert_eq!(retryable_status(StatusCode::BAD_GATEWAY), None);
    }
}
