//! Errors: the OpenAI-shaped error answers sent to clients, and the server's own failures.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use prefix_router_core::{ExtractError, RouteError};

use crate::body::{full, ProxyBody};

/// `Retry-After` of an outage answer (no healthy instance): about the time an ejected instance
/// needs to be checked again and come back.
pub const RETRY_AFTER_S: u64 = 5;

/// An error answered to a client as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI error `type` (`invalid_request_error`, `not_found_error`, ...).
    pub kind: &'static str,
    /// Human-readable message naming what is wrong.
    pub message: String,
    /// The offending field or header, when there is one.
    pub param: Option<String>,
    /// Machine-readable code (`invalid_json`, `body_too_large`, ...).
    pub code: &'static str,
    /// Seconds after which the client may try again (`Retry-After`), on 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 about the request.
    pub fn bad_request(
        code: &'static str,
        message: impl Into<String>,
        param: Option<&str>,
    ) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.map(str::to_string),
            code,
            retry_after: None,
        }
    }

    /// 404 for a path the router does not serve.
    pub fn unknown_route(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            message: format!("unknown route '{path}'"),
            param: None,
            code: "unknown_route",
            retry_after: None,
        }
    }

    /// 405 for a known path asked with the wrong method.
    pub fn method_not_allowed(method: &http::Method, path: &str, allowed: &'static str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            kind: "invalid_request_error",
            message: format!("method {method} is not allowed on '{path}' (allowed: {allowed})"),
            param: None,
            code: "method_not_allowed",
            retry_after: None,
        }
    }

    /// 429: come back in a second (too many connections, instances at their cap).
    fn rate_limited(code: &'static str, message: String) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            message,
            param: None,
            code,
            retry_after: Some(1),
        }
    }

    /// 429 for a connection over the per-address limit.
    pub fn too_many_connections(limit: usize) -> Self {
        Self::rate_limited(
            "too_many_connections",
            format!(
                "too many connections from your address (limit {limit}, limits.max_connections_per_client); reuse connections or close some"
            ),
        )
    }

    /// 429 when every instance that could take the request is at its in-flight cap.
    pub fn at_capacity(cap: u32) -> Self {
        Self::rate_limited(
            "instances_at_capacity",
            format!(
                "every instance that serves this request has {cap} requests in flight (limits.max_in_flight_per_instance); try again shortly"
            ),
        )
    }

    /// 413 for a body over the limit.
    pub fn too_large(limit: u64) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            kind: "invalid_request_error",
            message: format!("request body exceeds the limit of {limit} bytes"),
            param: None,
            code: "body_too_large",
            retry_after: None,
        }
    }

    /// 408 when the client is too slow sending its body.
    pub fn body_timeout() -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            kind: "invalid_request_error",
            message: "timed out reading the request body".into(),
            param: None,
            code: "body_timeout",
            retry_after: None,
        }
    }

    /// 400 when the request body could not be read (the client broke the stream).
    pub fn body_read(err: impl std::fmt::Display) -> Self {
        Self::bad_request(
            "body_read_error",
            format!("could not read the request body: {err}"),
            None,
        )
    }

    /// 502 for an upstream failure.
    pub fn bad_gateway(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            kind: "upstream_error",
            message: message.into(),
            param: None,
            code,
            retry_after: None,
        }
    }

    /// 504 when the upstream did not answer in time.
    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::GATEWAY_TIMEOUT,
            kind: "upstream_error",
            message: message.into(),
            param: None,
            code: "upstream_timeout",
            retry_after: None,
        }
    }

    /// 500 for a router bug that must not take the process down.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "internal_error",
            message: message.into(),
            param: None,
            code: "internal_error",
            retry_after: None,
        }
    }

    /// The JSON body.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// The HTTP response.
    pub fn into_response(self) -> Response<ProxyBody> {
        let body = Bytes::from(self.to_json().to_string());
        let mut resp = Response::new(full(body));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

impl From<ExtractError> for ApiError {
    fn from(e: ExtractError) -> Self {
        let (code, param) = match &e {
            ExtractError::Json(_) => ("invalid_json", None),
            ExtractError::FieldType { field, .. } => ("invalid_type", Some(*field)),
            ExtractError::Missing(field) => ("missing_field", Some(*field)),
            ExtractError::Group(_) => ("invalid_group_id", Some("prompt_cache_key")),
        };
        ApiError::bad_request(code, e.to_string(), param)
    }
}

impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::ModelNotServed(ref model) => ApiError {
                status: StatusCode::NOT_FOUND,
                kind: "not_found_error",
                message: format!(
                    "the model '{model}' is not served by any instance of this fleet (GET /v1/models lists those served)"
                ),
                param: Some("model".into()),
                code: "model_not_found",
                retry_after: None,
            },
            // An outage, not a client error: OpenAI SDKs retry a 503, never a 404.
            RouteError::ModelUnavailable(ref model) => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "service_unavailable",
                message: format!(
                    "the model '{model}' is served by this fleet, but no instance serving it is healthy right now; try again shortly"
                ),
                param: Some("model".into()),
                code: "model_unavailable",
                retry_after: Some(RETRY_AFTER_S),
            },
            // A strategy bug, not the client's fault nor the fleet's.
            RouteError::OutOfRange(_) => ApiError::internal(e.to_string()),
            RouteError::NoHealthyInstance => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "service_unavailable",
                message: format!("{e}; try again shortly"),
                param: None,
                code: "no_healthy_instance",
                retry_after: Some(RETRY_AFTER_S),
            },
        }
    }
}

/// Why the server could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Invalid configuration; the message names the field.
    #[error(transparent)]
    Config(#[from] crate::settings::SettingsError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// Kubernetes discovery is configured and its API cannot be reached at all.
    #[error(transparent)]
    Kubernetes(#[from] crate::kubernetes::KubernetesError),
    /// A signal handler could not be installed.
    #[error("cannot install the {signal} handler: {source}")]
    Signal {
        /// Which signal.
        signal: &'static str,
        /// The cause.
        source: std::io::Error,
    },
    /// The I/O threads (`limits.io_threads`) could not be started.
    #[error("cannot start the I/O threads: {0}")]
    Runtime(std::io::Error),
}
