//! Dispatch of data-plane requests by path and method.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version};
use serde_json::json;

use crate::body::{full, ProxyBody, RequestBody};
use crate::error::ApiError;
use crate::models;
use crate::proxy::{proxy, Api};
use crate::state::AppState;

fn json_response(status: StatusCode, value: serde_json::Value) -> Response<ProxyBody> {
    let mut resp = Response::new(full(value.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `/ready` and `/ping`: 200 while at least one instance takes requests, else 503; 503 while
/// shutting down.
fn ready(state: &AppState) -> Response<ProxyBody> {
    let snapshot = state.fleet.snapshot();
    let healthy = snapshot.eligible(None).count();
    let ready = healthy > 0 && !state.is_shutting_down();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body =
        json!({"ready": ready, "healthy_instances": healthy, "instances": snapshot.len()});
    if state.is_shutting_down() {
        body["shutting_down"] = true.into();
    }
    json_response(status, body)
}

/// `/health`: 200 while the router serves; 503 once it is shutting down (it still serves
/// for `timeouts.shutdown_delay_ms`, so that what checks it stops sending here first).
fn health(state: &AppState) -> Response<ProxyBody> {
    if state.is_shutting_down() {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "shutting_down"}),
        )
    } else {
        json_response(StatusCode::OK, json!({"status": "ok"}))
    }
}

/// 405 with the `Allow` header RFC 9110 requires.
fn not_allowed(method: &Method, path: &str, allow: &'static str) -> Response<ProxyBody> {
    let mut resp = ApiError::method_not_allowed(method, path, allow).into_response();
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    resp
}

/// Refuses a path that could mean another one once an engine normalizes it: dot segments,
/// raw or percent-encoded (`/v1/../admin`, `/v1/%2e%2e/admin`), and encoded slashes,
/// backslashes and NULs (`/v1/..%2fadmin`). Forwarded as they are, they would escape the
/// `/v1/` routes the router lets through.
pub fn check_path(path: &str) -> Result<(), ApiError> {
    let bytes = path.as_bytes();
    // The common path (`/v1/chat/completions`) has none of these: nothing more to look at,
    // and nothing allocated on the way.
    if memchr::memchr3(b'.', b'%', b'\\', bytes).is_none() {
        return Ok(());
    }
    for (i, &b) in bytes.iter().enumerate() {
        match (b, bytes.get(i + 1..i + 3)) {
            (b'\\', _) => return Err(bad_path(path, "a backslash")),
            (b'%', Some([hi, lo])) => match (*hi, lo.to_ascii_lowercase()) {
                (b'2', b'f') => return Err(bad_path(path, "an encoded slash (%2F)")),
                (b'5', b'c') => return Err(bad_path(path, "an encoded backslash (%5C)")),
                (b'0', b'0') => return Err(bad_path(path, "an encoded NUL (%00)")),
                _ => {}
            },
            _ => {}
        }
    }
    if path.split('/').any(is_dot_segment) {
        return Err(bad_path(path, "a dot segment"));
    }
    Ok(())
}

/// Whether `segment` is `.` or `..`, any of its dots percent-encoded (`%2e`, `%2E`).
fn is_dot_segment(segment: &str) -> bool {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        rest = match rest {
            [b'.', tail @ ..] => tail,
            [b'%', b'2', e, tail @ ..] if e.eq_ignore_ascii_case(&b'e') => tail,
            _ => return false,
        };
        dots += 1;
        if dots > 2 {
            return false;
        }
    }
    dots > 0
}

/// Refuses an HTTP/1.1 request without a `Host` header, and any request with more than one:
/// RFC 9112 3.2 says a server MUST answer both with 400. A proxy in front that reads another
/// `Host` than the engine's would route or authorize by a different name. (HTTP/2 carries
/// `:authority` instead; HTTP/1.0 may omit it.)
pub fn check_host(version: Version, headers: &HeaderMap) -> Result<(), ApiError> {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) if version == Version::HTTP_11 => Err(ApiError::bad_request(
            "missing_host",
            "an HTTP/1.1 request must carry a Host header (RFC 9112 3.2); send the router's address in it",
            None,
        )),
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "duplicate_host",
            "the request carries more than one Host header; send exactly one",
            None,
        )),
        _ => Ok(()),
    }
}

fn bad_path(path: &str, what: &str) -> ApiError {
    let shown: String = path.chars().take(200).collect();
    ApiError::bad_request(
        "invalid_path",
        format!("the path '{shown}' contains {what}; send the normalized path"),
        None,
    )
}

/// `/health`, `/ready` (and `/ping`) and `/metrics`: what an orchestrator or Prometheus asks
/// of a router process whatever answers its traffic (`serve`'s proxy, or the endpoint picker's
/// gRPC, which serves these on its own HTTP listener). `None` for any other path.
pub fn operational(state: &AppState, method: &Method, path: &str) -> Option<Response<ProxyBody>> {
    let get = *method == Method::GET || *method == Method::HEAD;
    Some(match path {
        "/health" | "/ready" | "/ping" | "/metrics" if !get => {
            not_allowed(method, path, "GET, HEAD")
        }
        "/health" => health(state),
        "/ready" | "/ping" => ready(state),
        "/metrics" => {
            let strategy = Arc::clone(&state.routing.load().strategy);
            let text = state
                .metrics
                .render(&state.fleet.snapshot(), strategy.as_ref());
            let mut resp = Response::new(full(text));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        _ => return None,
    })
}

/// Handles one data-plane request. Never fails: errors are answered in the OpenAI shape.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<RequestBody>,
) -> Result<Response<ProxyBody>, Infallible> {
    let received = Instant::now();
    let method = req.method().clone();
    // Borrowed from the request until it is handed on (no copy of the path per request).
    let path = req.uri().path();
    let get_only = |m: &Method| *m == Method::GET || *m == Method::HEAD;
    if let Err(e) = check_path(path).and_then(|()| check_host(req.version(), req.headers())) {
        return Ok(e.into_response());
    }
    if let Some(resp) = operational(&state, &method, path) {
        return Ok(resp);
    }
    let api = match path {
        "/v1/models" if get_only(&method) => return Ok(models::list(&state).await),
        "/v1/models" => return Ok(not_allowed(&method, path, "GET, HEAD")),
        "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/invocations"
            if method != Method::POST =>
        {
            return Ok(not_allowed(&method, path, "POST"))
        }
        p => match Api::of_path(p) {
            Some(api) => api,
            None => return Ok(ApiError::unknown_route(p).into_response()),
        },
    };
    Ok(proxy(state, api, req, received).await)
}

#[cfg(test)]
mod tests {
    use super::{check_host, check_path};
    use http::{HeaderMap, HeaderValue, Version};

    #[test]
    fn host_is_required_once_in_http_1_1_only() {
        let none = HeaderMap::new();
        let mut one = HeaderMap::new();
        one.insert("host", HeaderValue::from_static("router"));
        let mut two = one.clone();
        two.append("host", HeaderValue::from_static("other"));
        let code = |v, h| check_host(v, h).err().map(|e| e.code);
        assert_eq!(code(Version::HTTP_11, &none), Some("missing_host"));
        assert_eq!(code(Version::HTTP_11, &one), None);
        assert_eq!(code(Version::HTTP_11, &two), Some("duplicate_host"));
        // HTTP/1.0 may omit it; HTTP/2 carries :authority instead.
        assert_eq!(code(Version::HTTP_10, &none), None);
        assert_eq!(code(Version::HTTP_2, &none), None);
        assert_eq!(code(Version::HTTP_2, &two), Some("duplicate_host"));
    }

    #[test]
    fn paths_that_normalize_to_another_are_refused() {
        for bad in [
            "/v1/../admin/instances",
            "/v1/./models",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2e/admin",
            "/v1/.%2e/admin",
            "/v1/..%2fadmin",
            "/v1/..%2Fadmin",
            "/v1/%5c..",
            "/v1\\..\\admin",
            "/v1/models%00",
            "/v1/..",
        ] {
            let e = check_path(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} passed"));
            assert_eq!((e.status.as_u16(), e.code), (400, "invalid_path"), "{bad}");
        }
        for ok in [
            "/v1/chat/completions",
            "/v1/models/my.model",
            "/v1/files/a..b",
            "/v1/x/...",
            "/v1/%41bc",
            "/health",
            "/",
        ] {
            assert!(check_path(ok).is_ok(), "{ok}");
        }
    }
}
