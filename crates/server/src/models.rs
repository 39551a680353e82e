//! `GET /v1/models`: the union of what the healthy instances list (vLLM lists its loaded LoRA
//! adapters there), plus the models configured for them.

use std::collections::HashSet;
use std::sync::Arc;

use http::{header, HeaderValue, Response};
use prefix_router_core::{Instance, RouteError};
use serde_json::{json, Value};

use crate::body::{full, ProxyBody};
use crate::error::ApiError;
use crate::state::AppState;

/// Largest `/v1/models` answer read from one instance.
const MAX_MODELS_BODY: usize = 4 * 1024 * 1024;

/// The `data` entries an instance lists; `None` when it does not answer well in time.
pub async fn fetch(state: &AppState, inst: &Instance) -> Option<Vec<Value>> {
    let (status, body) = crate::upstream::get(
        &state.client,
        &inst.spec().url,
        "/v1/models",
        MAX_MODELS_BODY,
        state.settings.health.timeout,
    )
    .await?;
    if !status.is_success() {
        return None;
    }
    match serde_json::from_slice::<Value>(&body).ok()?.get("data") {
        Some(Value::Array(items)) => Some(items.clone()),
        _ => None,
    }
}

/// Answers `GET /v1/models`.
pub async fn list(state: &Arc<AppState>) -> Response<ProxyBody> {
    let snapshot = state.fleet.snapshot();
    let healthy: Vec<&Arc<Instance>> = snapshot.eligible(None).map(|(_, i)| i).collect();
    if healthy.is_empty() {
        return ApiError::from(RouteError::NoHealthyInstance).into_response();
    }
    let lists = futures_util::future::join_all(healthy.iter().map(|i| fetch(state, i))).await;
    let mut seen = HashSet::new();
    let mut data = Vec::new();
    for item in lists.into_iter().flatten().flatten() {
        if let Some(id) = item.get("id").and_then(Value::as_str) {
            if seen.insert(id.to_string()) {
                data.push(item);
            }
        }
    }
    for inst in &healthy {
        for m in &inst.spec().models {
            if seen.insert(m.clone()) {
                data.push(json!({"id": m, "object": "model", "owned_by": "prefix-router"}));
            }
        }
    }
    let mut resp = Response::new(full(json!({"object": "list", "data": data}).to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
