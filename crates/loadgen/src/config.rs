//! What a run does: where to send, how to pace, when to stop.

use std::time::Duration;

use http::Uri;

use crate::LoadgenError;

/// Path appended to the target's base URL.
pub const CHAT_PATH: &str = "/v1/chat/completions";
/// How long `bench` waits for a target that is not up yet: long enough for a script that
/// starts a router and then `bench` at once, short enough for a mistyped port.
pub const DEFAULT_WAIT_FOR_TARGET: Duration = Duration::from_secs(5);

/// Where the target lists the models it serves.
pub const MODELS_PATH: &str = "/v1/models";

/// Default per-request timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum LoadMode {
    /// Each request is sent at its scheduled time (the workload's `arrival_s`, relative to the
    /// first request), independently of responses. With `rate`, the arrival times are first
    /// stretched or squeezed, keeping their shape, to a mean of `rate` requests per second.
    OpenLoop {
        /// Mean send rate to rescale the workload's arrivals to, requests per second.
        rate: Option<f64>,
    },
    /// `concurrency` workers, each sending the workload's next unsent request as soon as its
    /// previous one ends; arrival times are ignored.
    ClosedLoop {
        /// Concurrent workers (≥ 1).
        concurrency: u32,
    },
}

/// Settings of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// Base URL of an OpenAI-compatible server (`http://host:port`, optionally with a path
    /// prefix; a trailing `/v1` is accepted and not doubled). Only `http` is supported.
    pub target: String,
    /// Pacing.
    pub mode: LoadMode,
    /// Stop sending new requests this long after the start (in-flight ones still finish,
    /// each bounded by `timeout`).
    pub duration: Option<Duration>,
    /// Send at most this many requests (the workload's first ones).
    pub max_requests: Option<u64>,
    /// Per-request limit, from the send to the last byte; also bounds the wait for requests
    /// still in flight when sending stops.
    pub timeout: Duration,
    /// Replaces every request's `model`.
    pub model: Option<String>,
    /// How long a target that is not up yet (refused connections, or 503 at `/v1/models`: a
    /// router whose engines are not up) is waited for before the run starts.
    pub wait_for_target: Duration,
    /// The share of requests (0 to 1) sent with `stream: false`, as batch or evaluation
    /// traffic is: spread evenly through the run ([`crate::schedule::asks_whole`]). Their
    /// answers come whole, so their TTFT is the whole answer's time.
    pub unstreamed: f64,
}

impl BenchConfig {
    /// A closed-loop run with one worker against `target`, no duration or count limit, the
    /// default timeout and the requests' own models.
    pub fn new(target: impl Into<String>, mode: LoadMode) -> Self {
        BenchConfig {
            target: target.into(),
            mode,
            duration: None,
            max_requests: None,
            timeout: DEFAULT_TIMEOUT,
            model: None,
            wait_for_target: DEFAULT_WAIT_FOR_TARGET,
            unstreamed: 0.0,
        }
    }

    /// Checks every setting and resolves the endpoint; errors name the setting.
    pub fn validate(&self) -> Result<Target, LoadgenError> {
        let config = |field, why: String| Err(LoadgenError::Config { field, why });
        match self.mode {
            LoadMode::OpenLoop { rate: Some(r) } if !(r.is_finite() && r > 0.0) => {
                return config("rate", format!("must be a positive number, got {r}"));
            }
            LoadMode::ClosedLoop { concurrency: 0 } => {
                return config("concurrency", "must be at least 1, got 0".into());
            }
            _ => {}
        }
        if let Some(d) = self.duration {
            if d.is_zero() {
                return config("duration", "must be longer than 0 s".into());
            }
        }
        if self.max_requests == Some(0) {
            return config("requests", "must be at least 1, got 0".into());
        }
        if self.timeout.is_zero() {
            return config("timeout", "must be longer than 0 s".into());
        }
        if !(0.0..=1.0).contains(&self.unstreamed) {
            return config(
                "unstreamed",
                format!("must be a share from 0 to 1, got {}", self.unstreamed),
            );
        }
        if let Some(m) = &self.model {
            if m.is_empty() {
                return config("model", "must not be empty".into());
            }
        }
        Target::parse(&self.target)
    }
}

/// A validated target: the full chat-completions endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL as given.
    pub base: String,
    /// `{base}/v1/chat/completions`.
    pub endpoint: Uri,
    /// `{base}/v1/models`.
    pub models: Uri,
}

impl Target {
    /// Parses a base URL (see [`BenchConfig::target`]).
    pub fn parse(url: &str) -> Result<Target, LoadgenError> {
        let fail = |why: &str| {
            Err(LoadgenError::Target {
                url: url.to_string(),
                why: why.to_string(),
            })
        };
        let uri: Uri = match url.trim().parse() {
            Ok(u) => u,
            Err(_) => return fail("not a URL"),
        };
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return fail("https is not supported; use an http:// URL"),
            Some(_) => return fail("the scheme must be http"),
            None => return fail("missing scheme; use http://HOST:PORT"),
        }
        let Some(authority) = uri.authority() else {
            return fail("missing host");
        };
        if uri.query().is_some() {
            return fail("a base URL takes no query string");
        }
        let path = uri.path().trim_end_matches('/');
        let path = path.strip_suffix("/v1").unwrap_or(path);
        let endpoint = format!("http://{authority}{path}{CHAT_PATH}");
        let models = format!("http://{authority}{path}{MODELS_PATH}");
        match (endpoint.parse(), models.parse()) {
            (Ok(endpoint), Ok(models)) => Ok(Target {
                base: url.to_string(),
                endpoint,
                models,
            }),
            _ => fail("cannot form the endpoint URL"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &str) -> String {
        match Target::parse(url) {
            Ok(t) => t.endpoint.to_string(),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn endpoints() {
        let chat = "http://127.0.0.1:8000/v1/chat/completions";
        assert_eq!(endpoint("http://127.0.0.1:8000"), chat);
        assert_eq!(endpoint("http://127.0.0.1:8000/"), chat);
        assert_eq!(endpoint("http://127.0.0.1:8000/v1"), chat);
        assert_eq!(endpoint("http://127.0.0.1:8000/v1/"), chat);
        assert_eq!(
            endpoint("http://127.0.0.1:8000/proxy"),
            "http://127.0.0.1:8000/proxy/v1/chat/completions"
        );
    }

    #[test]
    fn bad_targets_say_why() {
        assert!(endpoint("https://127.0.0.1").contains("https is not supported"));
        assert!(endpoint("127.0.0.1:8000").contains("scheme"));
        assert!(endpoint("http://127.0.0.1/?a=b").contains("query"));
        assert!(endpoint("not a url").contains("not a URL"));
    }

    #[test]
    fn bad_settings_name_the_field() {
        let mut c = BenchConfig::new(
            "http://127.0.0.1:1",
            LoadMode::ClosedLoop { concurrency: 0 },
        );
        let field = |c: &BenchConfig| match c.validate() {
            Err(LoadgenError::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        };
        assert_eq!(field(&c), "concurrency");
        c.mode = LoadMode::OpenLoop { rate: Some(-1.0) };
        assert_eq!(field(&c), "rate");
        c.mode = LoadMode::OpenLoop { rate: None };
        c.timeout = Duration::ZERO;
        assert_eq!(field(&c), "timeout");
        c.timeout = DEFAULT_TIMEOUT;
        c.max_requests = Some(0);
        assert_eq!(field(&c), "requests");
        c.max_requests = None;
        assert!(c.validate().is_ok());
    }
}
