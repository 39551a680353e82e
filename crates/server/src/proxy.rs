//! Proxying a routed request: read the body once, derive the key (and the block chain when the
//! strategy reads one), then per attempt [`route`] it to an instance and send it
//! ([`attempt`]), retrying on another instance while nothing has gone to the client yet, and
//! [`relay`] the answer.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prefix_router_core::extract::{chat_route, completion_route, native_route};
use prefix_router_core::{
    dispatch, Chain, ChainSpec, Dispatched, ExtractError, FleetSnapshot, Instance, KeyHash,
    KeyOptions, RouteRequest, Strategy,
};

use crate::access_log::{unix_now, Entry};
use crate::body::{read_body, ProxyBody};
use crate::error::ApiError;
use crate::guard::InFlightGuard;
use crate::health;
use crate::metrics::{DecisionLabels, ReasonLabels, RequestLabels};
use crate::outcome::{retryable_status, Failure, Outcome};
use crate::pool::Leased;
use crate::routing::with_rng;
use crate::state::AppState;
use crate::stats::InstanceStats;
use crate::stream::RelayBody;
use crate::upstream::{build_request, strip_hop_by_hop};

/// Response header naming the instance that served the request.
pub const INSTANCE_HEADER: &str = "x-prefix-router-instance";
/// Response header with the routing decision's reason (`preferred`, `overflow`, ...).
pub const DECISION_HEADER: &str = "x-prefix-router-decision";
/// Native API group header.
pub const GROUP_HEADER: &str = "x-prefix-aware-id";
/// The reference service's name for the group header, also accepted.
pub const GROUP_HEADER_COMPAT: &str = "x-amzn-sagemaker-prefix-aware-id";

/// Which API a proxied request uses (selects key extraction and the metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /invocations` (native key).
    Invocations,
    /// Any other `/v1/*` route: no key, least-outstanding among the instances serving its
    /// `model` (when the body names one).
    Other,
}

impl Api {
    /// Metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Invocations => "invocations",
            Api::Other => "other",
        }
    }
}

/// Proxies one request; every failure becomes an OpenAI-shaped error response.
pub async fn proxy(
    state: Arc<AppState>,
    api: Api,
    req: Request<Incoming>,
    received: Instant,
) -> Response<ProxyBody> {
    match forward(&state, api, req, received).await {
        Ok(resp) => resp,
        Err(e) => {
            // Failures after an instance was chosen are counted by the in-flight guard; these
            // are the router's own refusals.
            let outcome = match e.status {
                StatusCode::TOO_MANY_REQUESTS => Some("shed"),
                StatusCode::SERVICE_UNAVAILABLE => Some("unavailable"),
                s if s.is_client_error() => Some("client_error"),
                _ => None,
            };
            if let Some(outcome) = outcome {
                state
                    .metrics
                    .requests
                    .get_or_create(&RequestLabels {
                        instance: "none".into(),
                        api: api.label(),
                        outcome,
                    })
                    .inc();
            }
            e.into_response()
        }
    }
}

/// The native API's group id header, under either name. More than one value (the same header
/// twice, or both names) is refused: which of them the client meant is a guess, and the one not
/// taken would go unchecked.
fn group_header(headers: &HeaderMap) -> Result<Option<(&'static str, &[u8])>, ApiError> {
    let mut found = None;
    let mut count = 0;
    for name in [GROUP_HEADER, GROUP_HEADER_COMPAT] {
        for v in headers.get_all(name) {
            count += 1;
            found.get_or_insert((name, v.as_bytes()));
        }
    }
    if count > 1 {
        return Err(ApiError::bad_request(
            "invalid_group_id",
            format!(
                "the group id was sent {count} times (headers '{GROUP_HEADER}' and '{GROUP_HEADER_COMPAT}'); send it once"
            ),
            Some(GROUP_HEADER),
        ));
    }
    Ok(found)
}

/// What routing reads from a request body.
#[derive(Debug, Default)]
struct Extracted {
    key: Option<KeyHash>,
    chain: Chain,
    model: Option<String>,
}

/// Key, block chain (when the strategy reads one) and model of a request body, by API.
fn extract(
    api: Api,
    headers: &HeaderMap,
    body: &[u8],
    opts: &KeyOptions,
) -> Result<Extracted, ApiError> {
    Ok(match api {
        Api::Chat | Api::Completions => {
            let info = if api == Api::Chat {
                chat_route(body, opts)?
            } else {
                completion_route(body, opts)?
            };
            Extracted {
                key: Some(info.key),
                chain: info.chain,
                model: info.model,
            }
        }
        Api::Invocations => {
            let group = group_header(headers)?;
            let (key, chain) =
                native_route(body, group.map(|g| g.1), opts).map_err(|e| match e {
                    ExtractError::Group(g) => ApiError::bad_request(
                        "invalid_group_id",
                        format!("header '{}': {g}", group.map_or(GROUP_HEADER, |g| g.0)),
                        Some(group.map_or(GROUP_HEADER, |g| g.0)),
                    ),
                    other => ApiError::from(other),
                })?;
            Extracted {
                key: Some(key),
                chain,
                model: None,
            }
        }
        Api::Other => Extracted {
            model: other_model(body),
            ..Extracted::default()
        },
    })
}

/// The `model` of another `/v1/*` request (embeddings, ...), when its body is a JSON object
/// naming one: only instances serving it are eligible. Anything else routes as model-less.
fn other_model(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<String>,
    }
    serde_json::from_slice::<Named>(body).ok()?.model
}

/// The snapshot without the instances already tried.
fn without(snapshot: &FleetSnapshot, tried: &[Arc<Instance>]) -> FleetSnapshot {
    FleetSnapshot::new(
        snapshot
            .instances()
            .iter()
            .filter(|i| !tried.iter().any(|t| Arc::ptr_eq(t, i)))
            .cloned()
            .collect(),
    )
}

/// The instances an attempt may go to, when not the whole snapshot (None: all of it, the
/// common case, which allocates nothing): without those already tried and, under admission
/// control, without those at their in-flight cap. When the cap alone leaves no instance for
/// the request, it is shed with 429: the fleet is full, not broken, and the client's retry
/// later costs less than a queue without bound in the engines. The cap is checked, not
/// reserved, so concurrent requests may pass it by a few.
fn candidates(
    state: &AppState,
    snapshot: &FleetSnapshot,
    tried: &[Arc<Instance>],
    model: Option<&str>,
) -> Result<Option<FleetSnapshot>, ApiError> {
    let Some(cap) = state.settings.limits.max_in_flight_per_instance else {
        // No admission control (the default): the first attempt looks at nothing.
        return Ok((!tried.is_empty()).then(|| without(snapshot, tried)));
    };
    let full = |i: &Instance| i.in_flight() >= cap;
    if tried.is_empty() && !snapshot.instances().iter().any(|i| full(i)) {
        return Ok(None);
    }
    let view = without(snapshot, tried);
    if !view.instances().iter().any(|i| full(i)) {
        return Ok(Some(view));
    }
    let open = FleetSnapshot::new(
        view.instances()
            .iter()
            .filter(|i| !full(i))
            .cloned()
            .collect(),
    );
    if open.eligible(model).next().is_none() && view.eligible(model).next().is_some() {
        state
            .metrics
            .shed
            .get_or_create(&ReasonLabels {
                reason: "in_flight_cap",
            })
            .inc();
        return Err(ApiError::at_capacity(cap));
    }
    Ok(Some(open))
}

/// One dispatched attempt: the instance chosen, why, and the guard holding its slot.
struct Routed {
    instance: Arc<Instance>,
    reason: &'static str,
    guard: InFlightGuard,
}

impl Routed {
    /// The instance's id (borrowed: no string built per request).
    fn id(&self) -> &str {
        self.instance.id().as_str()
    }
}

/// Chooses an instance in `fleet` for `route_req`, counting the decision, and takes a slot on
/// it.
fn route(
    state: &Arc<AppState>,
    strategy: &Arc<dyn Strategy>,
    route_req: &mut RouteRequest<'_>,
    fleet: &FleetSnapshot,
    api: Api,
    received: Instant,
) -> Result<Routed, ApiError> {
    // Each attempt is sent at its own time (the strategy learns time to first token from it).
    route_req.now = state.now_s();
    let started = Instant::now();
    let dispatched = with_rng(|rng| dispatch(strategy, route_req, fleet, rng));
    state
        .metrics
        .decision_latency
        .observe(started.elapsed().as_secs_f64());
    let Dispatched { reason, ticket, .. } = dispatched?;
    let instance = Arc::clone(ticket.instance());
    state
        .metrics
        .decisions
        .get_or_create(&DecisionLabels {
            strategy: strategy.name(),
            reason: reason.label(),
        })
        .inc();
    let guard = InFlightGuard::new(Arc::clone(state), ticket, api.label(), received);
    InstanceStats::bump(&guard.stats().requests);
    if reason.is_overflow() {
        InstanceStats::bump(&guard.stats().overflow);
    }
    Ok(Routed {
        instance,
        reason: reason.label(),
        guard,
    })
}

/// Sends the request to the routed instance and waits for its response head, recording a
/// failure against the instance (metrics, errors, passive health).
async fn attempt(
    state: &Arc<AppState>,
    parts: &http::request::Parts,
    body: &Bytes,
    routed: &mut Routed,
) -> Result<Result<Response<Leased>, Failure>, ApiError> {
    let settings = &state.settings;
    let upstream_req = build_request(parts, body.clone());
    let sent = tokio::time::timeout(
        settings.timeouts.first_byte,
        state.client.send(&routed.instance.spec().url, upstream_req),
    )
    .await;
    let failure = match sent {
        Ok(Ok(resp)) => {
            if resp.status().is_server_error() {
                state.metrics.upstream_error(routed.id(), "status_5xx");
                routed.guard.count_error();
                health::passive_failure(state, &routed.instance, routed.guard.stats());
            } else {
                health::passive_success(routed.guard.stats());
            }
            return Ok(Ok(resp));
        }
        Ok(Err(e)) => Failure::of(&e),
        Err(_) => Failure::Timeout,
    };
    state.metrics.upstream_error(routed.id(), failure.label());
    routed.guard.count_error();
    routed.guard.fail(failure.outcome());
    if failure.ejects() {
        health::passive_failure(state, &routed.instance, routed.guard.stats());
    }
    Ok(Err(failure))
}

async fn forward(
    state: &Arc<AppState>,
    api: Api,
    req: Request<Incoming>,
    received: Instant,
) -> Result<Response<ProxyBody>, ApiError> {
    let (parts, body) = req.into_parts();
    let settings = &state.settings;
    let body: Bytes = read_body(
        body,
        settings.limits.max_body_bytes,
        settings.timeouts.client_body,
    )
    .await?;
    let routing = state.routing.load_full();
    let strategy: &Arc<dyn Strategy> = match api {
        Api::Other => &state.fallback,
        _ => &routing.strategy,
    };
    // The access log records every request's chain, whether or not the strategy reads one.
    let logging = state.access_log.is_some();
    let opts = KeyOptions {
        prefix_length: routing.prefix_length,
        chain: strategy
            .chain_spec()
            .or_else(|| logging.then(ChainSpec::default)),
    };
    let Extracted { key, chain, model } = extract(api, &parts.headers, &body, &opts)?;
    // kv-aware: the request's token blocks, matched against what the engines report.
    let feeds = state.kv_events.as_ref().filter(|_| strategy.reads_tokens());
    let tokenized = feeds.and_then(|f| f.tokenize(&body));
    let mut route_req = RouteRequest {
        key,
        chain: &chain.blocks,
        prompt_units: chain.units,
        model: model.as_deref(),
        now: 0.0,
        tokens: tokenized.as_ref().zip(feeds).map(|(t, f)| t.route(f)),
    };

    let snapshot = state.fleet.snapshot();
    let mut tried: Vec<Arc<Instance>> = Vec::new();
    let mut attempt_no = 0u32;
    loop {
        let view = candidates(state, &snapshot, &tried, model.as_deref())?;
        let fleet = view.as_ref().unwrap_or(&snapshot);
        let mut routed = route(state, strategy, &mut route_req, fleet, api, received)?;
        if logging {
            routed.guard.log_as(Entry {
                t: unix_now() - received.elapsed().as_secs_f64(),
                api: api.label(),
                model: model.as_deref().map(Into::into),
                group: chain.group,
                prompt_units: chain.units,
                block_units: opts.chain.map_or(0, |c| c.block_units),
                chain: chain.blocks.as_slice().into(),
                instance: Arc::clone(&routed.instance.id().0),
                reason: routed.reason,
                attempt: attempt_no,
                status: 0,
                outcome: "",
                ttft_s: None,
                duration_s: 0.0,
                prompt_tokens: None,
                cached_tokens: None,
                output_tokens: None,
            });
        }
        // Another attempt is possible when retries remain and another instance could take it
        // (only computed on a failure: the common path allocates nothing for it).
        let can_retry = |tried: &[Arc<Instance>], instance: &Arc<Instance>| {
            attempt_no < settings.retries.max_retries && {
                let mut rest = tried.to_vec();
                rest.push(Arc::clone(instance));
                without(&snapshot, &rest)
                    .eligible(model.as_deref())
                    .next()
                    .is_some()
            }
        };
        let retry_reason = match attempt(state, &parts, &body, &mut routed).await? {
            Err(failure) => {
                if !(failure.retryable() && can_retry(&tried, &routed.instance)) {
                    return Err(failure.answer(routed.id(), settings.timeouts.first_byte));
                }
                failure.label()
            }
            Ok(resp) => match retryable_status(resp.status()) {
                Some(r) if can_retry(&tried, &routed.instance) => {
                    routed.guard.fail(Outcome::Retried);
                    // Nothing of this answer reached the client. Dropping it closes that
                    // connection rather than waiting for a body that may never end.
                    drop(resp);
                    r
                }
                _ => {
                    let status = resp.status();
                    routed.guard.set_outcome(Outcome::of_status(status));
                    routed.guard.set_status(status.as_u16());
                    tracing::debug!(
                        api = api.label(),
                        instance = %routed.id(),
                        decision = routed.reason,
                        status = status.as_u16(),
                        attempt = attempt_no,
                        "relaying"
                    );
                    // Only a strategy that learns from usage, or the access log, is worth
                    // the scan.
                    let scan_usage = status.is_success() && (strategy.reads_usage() || logging);
                    return Ok(relay(resp, routed, settings, scan_usage));
                }
            },
        };
        state
            .metrics
            .retries
            .get_or_create(&ReasonLabels {
                reason: retry_reason,
            })
            .inc();
        tracing::debug!(instance = %routed.id(), reason = retry_reason, "retrying on another instance");
        let Routed {
            instance, guard, ..
        } = routed;
        // One line per request: the attempt that answers it writes it.
        let mut guard = guard;
        guard.no_log();
        drop(guard);
        tried.push(instance);
        attempt_no += 1;
    }
}

/// The client's response: the instance's head (less hop-by-hop headers, plus the routing
/// headers) and its body streamed through.
fn relay(
    resp: Response<Leased>,
    routed: Routed,
    settings: &crate::settings::Settings,
    scan_usage: bool,
) -> Response<ProxyBody> {
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = Version::default();
    if let Ok(v) = HeaderValue::from_str(routed.id()) {
        parts.headers.insert(INSTANCE_HEADER, v);
    }
    parts
        .headers
        .insert(DECISION_HEADER, HeaderValue::from_static(routed.reason));
    let sse = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.get(..17)
                .is_some_and(|t| t.eq_ignore_ascii_case("text/event-stream"))
        });
    let body = RelayBody::new(
        incoming,
        routed.guard,
        settings.timeouts.idle_stream,
        scan_usage,
        sse,
    )
    .boxed_unsync();
    Response::from_parts(parts, body)
}
