//! Proxying a routed request: read the body once, derive the key (and the block chain when the
//! strategy reads one) with [`Prepared`], then per attempt route it to an instance
//! ([`Prepared::route`]) and send it ([`attempt`]), retrying on another instance while nothing
//! has gone to the client yet, and [`relay`] the answer.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use prefix_router_core::Instance;

use crate::access_log::Entry;
use crate::body::{ProxyBody, RequestBody};
use crate::error::ApiError;
use crate::health;
use crate::metrics::{ReasonLabels, RequestLabels};
use crate::outcome::{retryable_status, Failure, Outcome};
use crate::pick::{candidates, without, Prepared, Routed};
pub use crate::pick::{Api, GROUP_HEADER, GROUP_HEADER_COMPAT};
use crate::pool::Leased;
use crate::state::AppState;
use crate::stream::RelayBody;

pub use prefix_router_core::wire::{DECISION_HEADER, INSTANCE_HEADER};

/// Proxies one request; every failure becomes an OpenAI-shaped error response.
pub async fn proxy(
    state: Arc<AppState>,
    api: Api,
    req: Request<RequestBody>,
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

/// Sends the request to the routed instance and waits for its response head, recording a
/// failure against the instance (metrics, errors, passive health).
async fn attempt(
    state: &Arc<AppState>,
    parts: &http::request::Parts,
    body: &Bytes,
    routed: &mut Routed,
) -> Result<Result<Response<Leased>, Failure>, ApiError> {
    let settings = &state.settings;
    let sent = tokio::time::timeout(
        settings.timeouts.first_byte,
        state.client.send(&routed.instance.spec().url, parts, body),
    )
    .await;
    let failure = match sent {
        Ok(Ok(resp)) => {
            if resp.status().is_server_error() {
                routed.guard.upstream_error("status_5xx");
                health::passive_failure(state, &routed.instance, routed.guard.stats());
            } else {
                health::passive_success(routed.guard.stats());
            }
            return Ok(Ok(resp));
        }
        Ok(Err(e)) => Failure::of(&e),
        Err(_) => Failure::Timeout,
    };
    routed.guard.upstream_error(failure.label());
    routed.guard.fail(failure.outcome());
    if failure.ejects() {
        health::passive_failure(state, &routed.instance, routed.guard.stats());
    }
    Ok(Err(failure))
}

async fn forward(
    state: &Arc<AppState>,
    api: Api,
    req: Request<RequestBody>,
    received: Instant,
) -> Result<Response<ProxyBody>, ApiError> {
    let (parts, body) = req.into_parts();
    let settings = &state.settings;
    let body: Bytes = body
        .read(
            settings.limits.max_body_bytes,
            settings.timeouts.client_body,
        )
        .await?;
    let prepared = Prepared::prepare(state, api, &parts.headers, &body, received)
        .await?
        .for_path(parts.uri.path());
    if let Some(p) = &state.prewarm {
        p.record(api, prepared.key, state.now_s(), &body);
    }
    let logging = state.access_log.is_some();
    let model = prepared.model.as_deref();
    let strategy = &prepared.strategy;

    let snapshot = state.fleet.snapshot();
    let mut tried: Vec<Arc<Instance>> = Vec::new();
    let mut attempt_no = 0u32;
    // The line of a retried attempt, written only if no next attempt starts (the request
    // then ends here, and its line says where it last went).
    let mut retried_line: Option<Box<Entry>> = None;
    loop {
        let routed = candidates(state, &snapshot, &tried, model).and_then(|view| {
            let fleet = view.as_ref().unwrap_or(&snapshot);
            prepared.route(state, fleet)
        });
        let mut routed = match routed {
            Ok(r) => r,
            Err(e) => {
                if let (Some(mut line), Some(log)) = (retried_line, &state.access_log) {
                    line.duration_s = received.elapsed().as_secs_f64();
                    log.log(*line);
                }
                return Err(e);
            }
        };
        if logging {
            let line = prepared.log_entry(&routed, attempt_no);
            routed.guard.log_as(line);
        }
        // Another attempt is possible when retries remain and another instance could take it
        // (only computed on a failure: the common path allocates nothing for it).
        // A stored response lives on its instance only: another would answer 404, hiding why
        // that one did not answer.
        let pinned = routed.is_pinned();
        let can_retry = |tried: &[Arc<Instance>], instance: &Arc<Instance>| {
            !pinned && attempt_no < settings.retries.max_retries && {
                let mut rest = tried.to_vec();
                rest.push(Arc::clone(instance));
                without(&snapshot, &rest).eligible(model).next().is_some()
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
                    // The line says what the instance answered, should no next attempt start.
                    routed.guard.set_status(resp.status().as_u16());
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
        retried_line = guard.take_log();
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
    let (mut parts, mut incoming) = resp.into_parts();
    // The instance's headers come without hop-by-hop ones already (`h1::parse_head`).
    let mut fields = incoming.take_fields();
    parts.version = Version::default();
    fields.push_checked(INSTANCE_HEADER.as_bytes(), routed.id().as_bytes());
    fields.push(DECISION_HEADER.as_bytes(), routed.reason.as_bytes());
    let sse = fields.is_event_stream();
    let mut guard = routed.guard;
    if !sse {
        guard.unstreamed();
    }
    // An event stream framed by a length ends a failure with an error event only if it has no
    // length: the client reads exactly that many bytes, so the event would be cut to what
    // was left and, filling it, make the broken answer look whole on a kept connection.
    let error_event = sse && fields.content_length().is_none();
    let body = RelayBody::new(
        incoming,
        guard,
        settings.timeouts.idle_stream,
        settings.timeouts.first_byte,
        scan_usage,
        error_event,
    );
    Response::from_parts(parts, ProxyBody::relayed(body, fields))
}
