//! Errors of the library (bad settings) and the kinds of failure one request can have.

/// A setting that makes a run impossible; nothing was sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadgenError {
    /// The target URL is unusable.
    #[error("target '{url}': {why}")]
    Target {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// Another setting is out of range.
    #[error("{field}: {why}")]
    Config {
        /// The setting's name.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// Why a request did not complete normally. Counted by kind in the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// No connection could be made (refused, unreachable, DNS).
    Connect,
    /// The request did not finish within the run's per-request timeout.
    Timeout,
    /// The target answered with a 4xx status.
    #[serde(rename = "http-4xx")]
    Http4xx,
    /// The target answered with a 5xx status.
    #[serde(rename = "http-5xx")]
    Http5xx,
    /// The target answered with another non-2xx status (1xx, 3xx).
    HttpOther,
    /// The connection failed after it was made but before a response head arrived.
    Request,
    /// The response body broke off, or the stream carried an error event.
    StreamError,
    /// The response was not a stream we can read: bad SSE data, bad JSON, or no `[DONE]`.
    MalformedStream,
}

impl FailureKind {
    /// Every kind, in reporting order.
    pub const ALL: [FailureKind; 8] = [
        FailureKind::Connect,
        FailureKind::Timeout,
        FailureKind::Http4xx,
        FailureKind::Http5xx,
        FailureKind::HttpOther,
        FailureKind::Request,
        FailureKind::StreamError,
        FailureKind::MalformedStream,
    ];

    /// Short label used in reports (`connect`, `timeout`, `http-4xx`, ...).
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::Http4xx => "http-4xx",
            FailureKind::Http5xx => "http-5xx",
            FailureKind::HttpOther => "http-other",
            FailureKind::Request => "request",
            FailureKind::StreamError => "stream-error",
            FailureKind::MalformedStream => "malformed-stream",
        }
    }

    /// The kind for a non-success HTTP status.
    pub fn from_status(status: u16) -> Self {
        match status {
            400..=499 => FailureKind::Http4xx,
            500..=599 => FailureKind::Http5xx,
            _ => FailureKind::HttpOther,
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes() {
        assert_eq!(FailureKind::from_status(404), FailureKind::Http4xx);
        assert_eq!(FailureKind::from_status(503), FailureKind::Http5xx);
        assert_eq!(FailureKind::from_status(302), FailureKind::HttpOther);
    }

    #[test]
    fn labels_are_unique_and_match_serde() {
        let mut seen = std::collections::HashSet::new();
        for k in FailureKind::ALL {
            assert!(seen.insert(k.label()));
            let json = serde_json::to_string(&k).map_err(|e| e.to_string());
            assert_eq!(json, Ok(format!("\"{}\"", k.label())));
        }
    }
}
