//! The admin API, on its own listener and behind a bearer token: list instances, add, drain,
//! remove, change the strategy and its parameters, reload the configuration file.
//!
//! | method and path | body | does |
//! | --- | --- | --- |
//! | `GET /admin/instances` | | every instance: state, in-flight, requests, overflow, errors |
//! | `POST /admin/instances` | `{"url", "weight"?, "models"?}` | adds an instance |
//! | `POST /admin/instances/drain` | `{"url"}` | stops sending it new requests |
//! | `POST /admin/instances/activate` | `{"url"}` | ends a drain: it takes new requests again |
//! | `POST /admin/instances/remove` | `{"url"}` | removes a configured or added instance (its in-flight requests finish); one found by DNS can only be drained |
//! | `GET /admin/routing` | | strategy and parameters in force |
//! | `PUT /admin/routing` | any of `strategy`, `prefix_length`, `concurrency_threshold`, `overflow`, `balance_factor`, `params` | changes them |
//! | `POST /admin/reload` | | reads the configuration file again (like SIGHUP) |
//!
//! `params` is an object of the strategy's own parameters (string or number values) and replaces
//! them all; changing `strategy` without `params` clears them (another strategy's parameters
//! mean nothing to the new one). A change that leaves the strategy's configuration as it was
//! keeps the strategy and what it learned.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{ConcurrencyThreshold, InstanceState, PrefixLength, StrategyKind};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::membership;
use crate::reload;
use crate::settings::{validate_instances, InstanceEntry};
use crate::state::AppState;

#[derive(Clone)]
struct Admin {
    state: Arc<AppState>,
    token: Arc<str>,
}

fn reply(status: StatusCode, value: Value) -> Response {
    (status, axum::Json(value)).into_response()
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status.as_u16()).unwrap_or(StatusCode::BAD_REQUEST);
    reply(status, e.to_json())
}

/// Compares without an early exit, so the time taken does not reveal a matching prefix.
fn same_token(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, b) in expected.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ b);
    }
    diff == 0
}

/// The token of an `Authorization: Bearer <token>` header. The scheme is case-insensitive
/// (RFC 9110 section 11.1) and may be followed by more than one space.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let start = rest.iter().position(|&b| b != b' ')?;
    Some(&rest[start..])
}

/// The one authentication layer in front of every admin route (and unknown paths: nothing is
/// told to a caller without the token, not even which routes exist).
async fn authenticate(
    State(admin): State<Admin>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let given = bearer(req.headers()).unwrap_or_default();
    if same_token(given, admin.token.as_bytes()) {
        return next.run(req).await;
    }
    let mut resp = error(ApiError {
        status: http::StatusCode::UNAUTHORIZED,
        kind: "authentication_error",
        message: "missing or wrong bearer token (send Authorization: Bearer <admin.token>)".into(),
        param: None,
        code: "unauthorized",
        retry_after: None,
    });
    resp.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    resp
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("invalid request body: {e}"), None)
    })
}

async fn list(State(admin): State<Admin>) -> Response {
    let snapshot = admin.state.fleet.snapshot();
    let instances: Vec<Value> = snapshot
        .instances()
        .iter()
        .map(|i| {
            let stats = admin.state.stats.get(i);
            json!({
                "url": i.spec().url,
                "weight": i.weight(),
                "models": i.spec().models,
                "state": i.state().label(),
                "in_flight": i.in_flight(),
                "requests": stats.requests.load(Ordering::Relaxed),
                "overflow": stats.overflow.load(Ordering::Relaxed),
                "errors": stats.errors.load(Ordering::Relaxed),
            })
        })
        .collect();
    reply(StatusCode::OK, json!({ "instances": instances }))
}

async fn add(State(admin): State<Admin>, body: Bytes) -> Response {
    let entry: InstanceEntry = match parse(&body) {
        Ok(e) => e,
        Err(r) => return error(r),
    };
    let spec = match validate_instances(std::slice::from_ref(&entry)) {
        Ok(mut v) if v.len() == 1 => v.remove(0),
        Ok(_) => {
            return error(ApiError::internal(
                "instance validation returned no instance",
            ))
        }
        Err(e) => {
            return error(ApiError::bad_request(
                "invalid_instance",
                e.to_string().replace("instances[0].", ""),
                Some("url"),
            ))
        }
    };
    let url = spec.url.clone();
    let added = reload::edit_members(&admin.state, |m| {
        if m.specs().iter().any(|s| s.id == spec.id) {
            return false;
        }
        m.static_specs.push(spec);
        true
    })
    .await;
    if !added {
        return reply(
            StatusCode::CONFLICT,
            ApiError::bad_request(
                "instance_exists",
                format!("instance '{url}' already exists"),
                Some("url"),
            )
            .to_json(),
        );
    }
    tracing::info!(instance = %url, "instance added through the admin API");
    reply(StatusCode::CREATED, json!({ "added": url }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Target {
    url: String,
}

fn target_id(body: &Bytes) -> Result<String, ApiError> {
    let t: Target = parse(body)?;
    crate::settings::normalize_instance_url(&t.url)
        .map_err(|m| ApiError::bad_request("invalid_instance", m, Some("url")))
}

fn unknown(id: &str) -> Response {
    error(ApiError {
        status: http::StatusCode::NOT_FOUND,
        kind: "not_found_error",
        message: format!("no instance '{id}'"),
        param: Some("url".into()),
        code: "instance_not_found",
        retry_after: None,
    })
}

async fn drain(State(admin): State<Admin>, body: Bytes) -> Response {
    let id = match target_id(&body) {
        Ok(id) => id,
        Err(r) => return error(r),
    };
    let snapshot = admin.state.fleet.snapshot();
    let Some((_, inst)) = snapshot.get(&id) else {
        return unknown(&id);
    };
    // Draining an instance that already drains changes nothing (and tells nobody), but it is
    // held from now on: discovery that drained it on its own must not undrain it.
    admin.state.hold(inst);
    membership::transition(
        &admin.state,
        inst,
        &membership::DRAINABLE,
        InstanceState::Draining,
    );
    tracing::info!(instance = %id, "instance draining");
    let in_flight = inst.in_flight();
    reply(
        StatusCode::OK,
        json!({ "draining": id, "in_flight": in_flight }),
    )
}

async fn activate(State(admin): State<Admin>, body: Bytes) -> Response {
    let id = match target_id(&body) {
        Ok(id) => id,
        Err(r) => return error(r),
    };
    let snapshot = admin.state.fleet.snapshot();
    let Some((_, inst)) = snapshot.get(&id) else {
        return unknown(&id);
    };
    admin.state.release(inst);
    // With active checks it must pass a probe first, as a joining instance does (it may have
    // been drained because it failed, and the checker leaves a draining instance alone). Back
    // to unchecked is not an ejection: the strategy keeps what it learned (membership::
    // transition would announce one, and cache-aware forget the cache); the probe that admits
    // it announces it healthy.
    let moved = if admin.state.settings.health.active {
        inst.transition(&[InstanceState::Draining], InstanceState::Unknown)
    } else {
        membership::transition(
            &admin.state,
            inst,
            &[InstanceState::Draining],
            InstanceState::Healthy,
        )
    };
    if !moved {
        return error(ApiError {
            status: http::StatusCode::CONFLICT,
            kind: "invalid_request_error",
            message: format!("instance '{id}' is {}, not draining", inst.state().label()),
            param: Some("url".into()),
            code: "not_draining",
            retry_after: None,
        });
    }
    tracing::info!(instance = %id, "drain ended through the admin API");
    reply(StatusCode::OK, json!({ "activated": id }))
}

async fn remove(State(admin): State<Admin>, body: Bytes) -> Response {
    let id = match target_id(&body) {
        Ok(id) => id,
        Err(r) => return error(r),
    };
    let (removed, discovered) = reload::edit_members(&admin.state, |m| {
        let before = m.static_specs.len();
        m.static_specs.retain(|s| s.id != id);
        let discovered = m
            .dns
            .values()
            .flatten()
            .chain(&m.kubernetes)
            .any(|s| s.id == id);
        (m.static_specs.len() != before, discovered)
    })
    .await;
    if discovered {
        // Discovery lists it, so it stays (and would come back at the next resolution): a 404
        // said it did not exist, and a 200 would say it was gone.
        return error(ApiError {
            status: http::StatusCode::CONFLICT,
            kind: "invalid_request_error",
            message: format!(
                "instance '{id}' comes from discovery (DNS or Kubernetes) and stays while discovery lists it; drain it instead (POST /admin/instances/drain), or remove it where it is discovered"
            ),
            param: Some("url".into()),
            code: "discovered_instance",
            retry_after: None,
        });
    }
    if !removed {
        return unknown(&id);
    }
    tracing::info!(instance = %id, "instance removed through the admin API");
    reply(StatusCode::OK, json!({ "removed": id }))
}

fn routing_json(state: &AppState) -> Value {
    let r = state.routing.load();
    json!({
        "strategy": r.config.kind.name(),
        "prefix_length": r.prefix_length.get(),
        "concurrency_threshold": r.config.concurrency_threshold.get(),
        "overflow": r.config.overflow.name(),
        "balance_factor": r.config.balance_factor,
        "params": r.config.params,
    })
}

async fn get_routing(State(admin): State<Admin>) -> Response {
    reply(StatusCode::OK, routing_json(&admin.state))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutingChange {
    strategy: Option<String>,
    prefix_length: Option<u64>,
    concurrency_threshold: Option<u64>,
    overflow: Option<String>,
    #[serde(default, with = "double_option")]
    balance_factor: Option<Option<f64>>,
    params: Option<serde_json::Map<String, Value>>,
}

/// `null` clears the balance factor; an absent field keeps it.
mod double_option {
    use serde::{Deserialize, Deserializer};
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
        Option::<f64>::deserialize(d).map(Some)
    }
}

fn apply_change(state: &AppState, c: RoutingChange) -> Result<(), ApiError> {
    let current = state.routing.load();
    let mut config = current.config.clone();
    let mut prefix_length = current.prefix_length;
    let bad = |field: &str, e: String| ApiError::bad_request("invalid_value", e, Some(field));
    if let Some(s) = c.strategy {
        let kind = s
            .parse::<StrategyKind>()
            .map_err(|e| bad("strategy", e.to_string()))?;
        if kind != config.kind {
            config.kind = kind;
            config.params.clear();
        }
    }
    if let Some(n) = c.prefix_length {
        prefix_length = PrefixLength::new(n).map_err(|e| bad("prefix_length", e.to_string()))?;
    }
    if let Some(n) = c.concurrency_threshold {
        config.concurrency_threshold = ConcurrencyThreshold::new(n)
            .map_err(|e| bad("concurrency_threshold", e.to_string()))?;
    }
    if let Some(o) = c.overflow {
        config.overflow = o
            .parse::<OverflowPolicy>()
            .map_err(|e| bad("overflow", e.to_string()))?;
    }
    if let Some(b) = c.balance_factor {
        config.balance_factor = b;
    }
    if let Some(params) = c.params {
        config.params = params
            .into_iter()
            .map(|(name, value)| match value {
                Value::String(s) => Ok((name, s)),
                Value::Number(n) => Ok((name, n.to_string())),
                _ => Err(bad(
                    &format!("params.{name}"),
                    format!("parameter '{name}' must be a string or a number"),
                )),
            })
            .collect::<Result<_, _>>()?;
    }
    reload::set_routing(state, config, prefix_length).map_err(|e| {
        let field = crate::settings::config_field(&e);
        bad(field.trim_start_matches("routing."), e.to_string())
    })
}

async fn put_routing(State(admin): State<Admin>, body: Bytes) -> Response {
    let change: RoutingChange = match parse(&body) {
        Ok(c) => c,
        Err(r) => return error(r),
    };
    match apply_change(&admin.state, change) {
        Ok(()) => {
            tracing::info!(routing = %routing_json(&admin.state), "routing changed through the admin API");
            let mut body = routing_json(&admin.state);
            if let Some(why) = crate::kv_events::blind(&admin.state) {
                tracing::warn!("{why}");
                body["warning"] = Value::String(why);
            }
            reply(StatusCode::OK, body)
        }
        Err(e) => error(e),
    }
}

async fn reload_config(State(admin): State<Admin>) -> Response {
    match reload::reload(&admin.state).await {
        Ok(s) => reply(
            StatusCode::OK,
            json!({"instances": s.instances, "strategy": s.strategy}),
        ),
        Err(e) => error(ApiError::bad_request("invalid_config", e.to_string(), None)),
    }
}

/// `%XX` escapes of a query value decoded (other bytes kept as they are).
fn unescape(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `GET /admin/kv-view?url=INSTANCE[&top=N]`: the router's view of one engine's cache from its
/// KV events (blocks, completeness, lag, the N longest prefixes held).
async fn kv_view(State(admin): State<Admin>, uri: axum::http::Uri) -> Response {
    let mut url = None;
    let mut top = 10usize;
    for pair in uri.query().unwrap_or("").split('&') {
        match pair.split_once('=') {
            Some(("url", v)) => url = unescape(v),
            Some(("top", v)) => match v.parse::<usize>() {
                Ok(n) if n <= 1000 => top = n,
                _ => {
                    return error(ApiError::bad_request(
                        "invalid_top",
                        format!("top: '{v}' is not a number of prefixes in 0..=1000"),
                        Some("top"),
                    ))
                }
            },
            _ => {}
        }
    }
    let Some(url) = url else {
        return error(ApiError::bad_request(
            "missing_url",
            "name the instance: /admin/kv-view?url=http://host:port",
            Some("url"),
        ));
    };
    let id = match crate::settings::normalize_instance_url(&url) {
        Ok(id) => id,
        Err(m) => return error(ApiError::bad_request("invalid_instance", m, Some("url"))),
    };
    let Some(feeds) = admin.state.kv_events.as_ref() else {
        return error(ApiError {
            status: http::StatusCode::NOT_FOUND,
            kind: "not_found_error",
            message: "KV events are not subscribed to (set [kv_events] subscribe = true)".into(),
            param: None,
            code: "kv_events_off",
            retry_after: None,
        });
    };
    match feeds.describe(&id, top) {
        Some(v) => reply(StatusCode::OK, v),
        None => unknown(&id),
    }
}

/// The admin routes.
pub fn router(state: Arc<AppState>, token: &str) -> axum::Router {
    let admin = Admin {
        state,
        token: Arc::from(token),
    };
    // The page holds no data and needs no token; what it shows comes from the JSON below it.
    let page = axum::Router::new().route(
        "/dashboard",
        get(|| async {
            (
                [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
                crate::dashboard::PAGE,
            )
        }),
    );
    let api = axum::Router::new()
        .route("/admin/dashboard.json", get(dashboard_data))
        .route("/admin/instances", get(list).post(add))
        .route("/admin/instances/drain", post(drain))
        .route("/admin/instances/activate", post(activate))
        .route("/admin/instances/remove", post(remove))
        .route("/admin/routing", get(get_routing).put(put_routing))
        .route("/admin/reload", post(reload_config))
        .route("/admin/kv-view", get(kv_view))
        .fallback(|uri: axum::http::Uri| async move { error(ApiError::unknown_route(uri.path())) })
        .layer(axum::middleware::from_fn_with_state(
            admin.clone(),
            authenticate,
        ))
        .with_state(admin);
    page.merge(api)
}

/// `GET /admin/dashboard.json?window=S`: the live page's data, over the last S seconds
/// (1..=300, default 300).
async fn dashboard_data(State(admin): State<Admin>, uri: axum::http::Uri) -> Response {
    let given = uri
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("window="));
    let seconds = match given.map(str::parse::<u64>) {
        None => 300,
        Some(Ok(s)) if (1..=300).contains(&s) => s,
        Some(_) => {
            return error(ApiError::bad_request(
                "invalid_window",
                format!(
                    "window={}: give whole seconds, 1 to 300",
                    given.unwrap_or_default()
                ),
                Some("window"),
            ))
        }
    };
    let window = std::time::Duration::from_secs(seconds);
    reply(StatusCode::OK, crate::dashboard::data(&admin.state, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::AUTHORIZATION,
            axum::http::HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{e}")),
        );
        h
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_nothing_else_passes() {
        for ok in ["Bearer t0k", "bearer t0k", "BEARER   t0k"] {
            assert_eq!(bearer(&auth(ok)), Some(&b"t0k"[..]), "{ok}");
        }
        for bad in ["Basic t0k", "Bearert0k", "Bearer ", "t0k", "Bear t0k"] {
            assert_ne!(bearer(&auth(bad)), Some(&b"t0k"[..]), "{bad}");
        }
        assert_eq!(bearer(&HeaderMap::new()), None);
        assert!(same_token(b"t0k", b"t0k"));
        assert!(!same_token(b"t0", b"t0k") && !same_token(b"t0kk", b"t0k"));
    }
}
