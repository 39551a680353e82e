//! Dispatch of data-plane requests by path and method.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::body::{full, ProxyBody};
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

/// `/ready` and `/ping`: 200 while at least one instance takes requests, else 503.
fn ready(state: &AppState) -> Response<ProxyBody> {
    let snapshot = state.fleet.snapshot();
    let healthy = snapshot.eligible(None).count();
    let status = if healthy > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_response(
        status,
        json!({"ready": healthy > 0, "healthy_instances": healthy, "instances": snapshot.len()}),
    )
}

/// Handles one data-plane request. Never fails: errors are answered in the OpenAI shape.
pub async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let received = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let get_only = |m: &Method| *m == Method::GET || *m == Method::HEAD;
    let resp = match path.as_str() {
        "/health" if get_only(&method) => json_response(StatusCode::OK, json!({"status": "ok"})),
        "/ready" | "/ping" if get_only(&method) => ready(&state),
        "/metrics" if get_only(&method) => {
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
        "/v1/models" if method == Method::GET => models::list(&state).await,
        "/health" | "/ready" | "/ping" | "/metrics" | "/v1/models" => {
            ApiError::method_not_allowed(&method, &path, "GET").into_response()
        }
        "/v1/chat/completions" | "/v1/completions" | "/invocations" if method != Method::POST => {
            ApiError::method_not_allowed(&method, &path, "POST").into_response()
        }
        "/v1/chat/completions" => proxy(state, Api::Chat, req, received).await,
        "/v1/completions" => proxy(state, Api::Completions, req, received).await,
        "/invocations" => proxy(state, Api::Invocations, req, received).await,
        p if p.starts_with("/v1/") => proxy(state, Api::Other, req, received).await,
        _ => ApiError::unknown_route(&path).into_response(),
    };
    Ok(resp)
}
