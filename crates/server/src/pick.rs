//! Choosing an instance for a request, the one path `serve`'s proxy and the endpoint picker
//! (`prefix-router epp`) share: read the key, the block chain and the model from the body once
//! ([`Prepared`]), leave out what admission control or earlier attempts rule out
//! ([`candidates`]), and dispatch through the strategy, counting the decision and taking the
//! in-flight slot ([`Prepared::route`]).

use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderMap;
use prefix_router_core::extract::{chat_route, completion_route, native_route, responses_route};
use prefix_router_core::{
    dispatch, dispatch_to, Chain, ChainSpec, Dispatched, ExtractError, FleetSnapshot, Instance,
    InstanceState, KeyHash, KeyOptions, Reason, RouteRequest, Strategy,
};

use crate::error::ApiError;
use crate::guard::InFlightGuard;
use crate::kv_events::Tokenized;
use crate::metrics::ReasonLabels;
use crate::routing::with_rng;
use crate::state::AppState;
use crate::stats::InstanceStats;

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
    /// `POST /v1/responses` (the Responses API).
    Responses,
    /// `POST /invocations` (native key).
    Invocations,
    /// Any other `/v1/*` route: no key, least-outstanding among the instances serving its
    /// `model` (when the body names one).
    Other,
}

impl Api {
    /// Every API, in [`Api::index`] order.
    pub const ALL: [Api; 5] = [
        Api::Chat,
        Api::Completions,
        Api::Responses,
        Api::Invocations,
        Api::Other,
    ];

    /// Position in [`Api::ALL`] (per-API tables).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The API a data-plane path (without its query) is proxied as; `None` for a path that is
    /// not proxied.
    pub fn of_path(path: &str) -> Option<Api> {
        let keyed = [
            Api::Chat,
            Api::Completions,
            Api::Responses,
            Api::Invocations,
        ];
        if let Some(api) = keyed.into_iter().find(|a| a.path() == Some(path)) {
            return Some(api);
        }
        path.starts_with("/v1/").then_some(Api::Other)
    }

    /// The path of a keyed API (what [`Api::of_path`] reads back); `None` for `Other`.
    pub fn path(self) -> Option<&'static str> {
        match self {
            Api::Chat => Some("/v1/chat/completions"),
            Api::Completions => Some("/v1/completions"),
            Api::Responses => Some("/v1/responses"),
            Api::Invocations => Some("/invocations"),
            Api::Other => None,
        }
    }

    /// Metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Responses => "responses",
            Api::Invocations => "invocations",
            Api::Other => "other",
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
    /// The client asked for a whole answer ([`RouteRequest::whole_answer`]).
    whole_answer: bool,
    /// The stored response the request continues (`previous_response_id`).
    stored_response: Option<String>,
    /// A Responses request whose answer the engine stores (`store` not false).
    stores_response: bool,
}

/// Key, block chain (when the strategy reads one) and model of a request body, by API.
fn extract(
    api: Api,
    headers: &HeaderMap,
    body: &[u8],
    opts: &KeyOptions,
) -> Result<Extracted, ApiError> {
    Ok(match api {
        Api::Chat | Api::Completions | Api::Responses => {
            let info = match api {
                Api::Chat => chat_route(body, opts)?,
                Api::Completions => completion_route(body, opts)?,
                _ => responses_route(body, opts)?,
            };
            Extracted {
                key: Some(info.key),
                chain: info.chain,
                model: info.model,
                whole_answer: !info.stream,
                stored_response: info.previous_response_id,
                stores_response: info.stores_response,
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
                // The body is not read: its first response byte stands for the first token.
                whole_answer: false,
                stored_response: None,
                stores_response: false,
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
pub fn without(snapshot: &FleetSnapshot, tried: &[Arc<Instance>]) -> FleetSnapshot {
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
pub fn candidates(
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
    // Nobody here could take it even with room (the model's instances are all unhealthy, say):
    // the strategy answers from the whole view, so that the error names an outage (503), not
    // a model this fleet does not serve (404, which the cap's filter would have made of it).
    if !view.instances().iter().any(|i| full(i)) || view.eligible(model).next().is_none() {
        return Ok(Some(view));
    }
    let open = FleetSnapshot::new(
        view.instances()
            .iter()
            .filter(|i| !full(i))
            .cloned()
            .collect(),
    );
    // (The view serves the model: checked above.)
    if open.eligible(model).next().is_none() {
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

impl Routed {
    /// Sent where its stored response lives, the one instance that can answer it: no retry or
    /// fallback elsewhere.
    pub fn is_pinned(&self) -> bool {
        self.reason == Reason::StoredResponse.label()
    }
}

/// One dispatched attempt: the instance chosen, why, and the guard holding its slot.
#[derive(Debug)]
pub struct Routed {
    /// The instance chosen.
    pub instance: Arc<Instance>,
    /// The decision's reason label (`cache_hit`, `overflow`, ...).
    pub reason: &'static str,
    /// Holds the in-flight slot and reports the request's end to the strategy and the metrics.
    pub guard: InFlightGuard,
}

impl Routed {
    /// The instance's id (borrowed: no string built per request).
    pub fn id(&self) -> &str {
        self.instance.id().as_str()
    }
}

impl Prepared {
    /// The access log's line for attempt `attempt` of this request, sent as `routed` says;
    /// status, outcome, times and usage are filled in as the answer goes by.
    pub fn log_entry(&self, routed: &Routed, attempt: u32) -> crate::access_log::Entry {
        crate::access_log::Entry {
            t: crate::access_log::unix_now() - self.received.elapsed().as_secs_f64(),
            api: self.api.label(),
            model: self.model.as_deref().map(Into::into),
            group: self.chain.group,
            prompt_units: self.chain.units,
            block_units: self.chain_spec.map_or(0, |c| c.block_units),
            chain: self.chain.blocks.as_slice().into(),
            instance: Arc::clone(&routed.instance.id().0),
            reason: routed.reason,
            attempt,
            status: 0,
            outcome: "",
            ttft_s: None,
            duration_s: 0.0,
            prompt_tokens: None,
            cached_tokens: None,
            output_tokens: None,
        }
    }
}

/// kv-aware: `body`'s token blocks, computed on the blocking pool once one of the feeds'
/// tokenizing slots is free (`None` where nothing tokenizes it: the strategy then infers).
async fn tokenize_aside(state: &Arc<AppState>, body: &bytes::Bytes) -> Option<Tokenized> {
    let feeds = state.kv_events.as_ref().filter(|f| f.has_tokenizer())?;
    // Held until the tokenization ends, not until this future does: a request given up
    // while its prompt is being tokenized frees nothing the work still uses.
    let slot = feeds.tokenizing_slot().await?;
    let (s, b) = (Arc::clone(state), body.clone());
    let done = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        s.kv_events.as_ref().and_then(|f| f.tokenize(&b))
    })
    .await;
    match done {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "tokenizing a request failed: routed without its token blocks");
            None
        }
    }
}

/// What routing reads from one request, read once and routed on for every attempt.
#[derive(Debug)]
pub struct Prepared {
    /// The API (extraction and the metrics label).
    pub api: Api,
    /// The strategy in force when the request arrived (a reload does not move it mid-way).
    pub strategy: Arc<dyn Strategy>,
    /// The block chain's spec, when the strategy or the access log reads one.
    pub chain_spec: Option<ChainSpec>,
    /// Key, block chain and model.
    pub key: Option<KeyHash>,
    /// The request's block chain (empty when nothing reads it).
    pub chain: Chain,
    /// The `model` the body names.
    pub model: Option<String>,
    /// kv-aware: the request's token blocks.
    tokenized: Option<Tokenized>,
    /// When the request arrived (time to first token counts from here).
    pub received: Instant,
    /// The client asked for a whole answer (`stream` false or absent).
    pub whole_answer: bool,
    /// The stored response the request continues or asks for: it goes where that response
    /// lives, when the router knows ([`crate::responses`]).
    pub stored_response: Option<String>,
    /// Its answer is stored by the engine (a Responses request without `store: false`): the
    /// answer's id is remembered ([`crate::responses`]).
    pub stores_response: bool,
}

impl Prepared {
    /// Reads key, chain, model (and token blocks for a strategy that reads them) from `body`,
    /// tokenizing on the calling thread: for work off the request path (planning a warm-up).
    /// Errors are the client's (4xx).
    pub fn new(
        state: &AppState,
        api: Api,
        headers: &HeaderMap,
        body: &[u8],
        received: Instant,
    ) -> Result<Self, ApiError> {
        let mut p = Self::extracted(state, api, headers, body, received)?;
        if p.strategy.reads_tokens() {
            p.tokenized = state.kv_events.as_ref().and_then(|f| f.tokenize(body));
        }
        Ok(p)
    }

    /// As [`Prepared::new`], for a request: the token blocks are computed on the blocking
    /// pool, at most one tokenization per core at a time. A tokenizer takes milliseconds on
    /// a long prompt (2.9 ms for 16 KiB and 70 ms for 256 KiB with the byte-level BPE in
    /// `data/tokenizers`: `cargo bench -p prefix-router-tokenize`), and on a runtime worker it
    /// held up every other connection that worker serves, streams included.
    pub async fn prepare(
        state: &Arc<AppState>,
        api: Api,
        headers: &HeaderMap,
        body: &bytes::Bytes,
        received: Instant,
    ) -> Result<Self, ApiError> {
        let mut p = Self::extracted(state, api, headers, body, received)?;
        if p.strategy.reads_tokens() {
            p.tokenized = tokenize_aside(state, body).await;
        }
        Ok(p)
    }

    /// Key, chain and model, without token blocks.
    fn extracted(
        state: &AppState,
        api: Api,
        headers: &HeaderMap,
        body: &[u8],
        received: Instant,
    ) -> Result<Self, ApiError> {
        let routing = state.routing.load();
        let strategy = match api {
            Api::Other => Arc::clone(&state.fallback),
            _ => Arc::clone(&routing.strategy),
        };
        // The access log records every request's chain, whether or not the strategy reads one.
        let logging = state.access_log.is_some();
        let opts = KeyOptions {
            prefix_length: routing.prefix_length,
            chain: strategy
                .chain_spec()
                .or_else(|| logging.then(ChainSpec::default)),
        };
        let Extracted {
            key,
            chain,
            model,
            whole_answer,
            stored_response,
            stores_response,
        } = extract(api, headers, body, &opts)?;
        Ok(Self {
            api,
            strategy,
            chain_spec: opts.chain,
            key,
            chain,
            model,
            tokenized: None,
            received,
            whole_answer,
            stored_response,
            stores_response,
        })
    }

    /// A request for a stored response by its path (`GET /v1/responses/{id}`, its `cancel`
    /// and `input_items`, `DELETE`): it goes where the response lives.
    pub fn for_path(mut self, path: &str) -> Self {
        if self.api == Api::Other && self.stored_response.is_none() {
            self.stored_response = crate::responses::id_in_path(path).map(str::to_owned);
        }
        self
    }

    /// The instance in `fleet` that stores the response the request continues, when the
    /// router knows it and it serves the model, healthy or draining (a draining engine still
    /// holds what it stored; nowhere else can answer).
    fn stored_home(
        &self,
        state: &AppState,
        fleet: &FleetSnapshot,
    ) -> Option<(usize, Arc<Instance>)> {
        let home = state
            .response_homes
            .home(self.stored_response.as_deref()?)?;
        let (index, instance) = fleet.get(home.as_str())?;
        let up = matches!(
            instance.state(),
            InstanceState::Healthy | InstanceState::Draining
        );
        (up && instance.serves(self.model.as_deref())).then(|| (index, Arc::clone(instance)))
    }

    /// The strategy's view of the request, at `now`.
    pub fn request<'a>(&'a self, state: &'a AppState, now: f64) -> RouteRequest<'a> {
        let feeds = state.kv_events.as_ref();
        RouteRequest {
            key: self.key,
            chain: &self.chain.blocks,
            prompt_units: self.chain.units,
            model: self.model.as_deref(),
            now,
            tokens: self.tokenized.as_ref().zip(feeds).map(|(t, f)| t.route(f)),
            whole_answer: self.whole_answer,
        }
    }

    /// Chooses an instance in `fleet`, counting the decision, and takes a slot on it.
    pub fn route(&self, state: &Arc<AppState>, fleet: &FleetSnapshot) -> Result<Routed, ApiError> {
        // Each attempt is sent at its own time (the strategy learns time to first token from it).
        let started = Instant::now();
        let req = self.request(state, state.secs_at(started));
        let home = self.stored_home(state, fleet);
        let dispatched = match &home {
            // Only that instance can answer it: no choice to make. The engine's prompt is the
            // stored conversation and then this text, which the router has not seen whole: the
            // strategy counts the request in flight but indexes no blocks for it, and learns
            // nothing from its usage (`InFlightGuard::teach_usage`).
            Some((index, home)) => {
                let req = RouteRequest { chain: &[], ..req };
                Ok(Dispatched {
                    index: *index,
                    reason: Reason::StoredResponse,
                    ticket: dispatch_to(
                        &self.strategy,
                        &req,
                        Arc::clone(home),
                        Reason::StoredResponse,
                    ),
                })
            }
            None => with_rng(|rng| dispatch(&self.strategy, &req, fleet, rng)),
        };
        state
            .metrics
            .decision_latency
            .observe(started.elapsed().as_secs_f64());
        let Dispatched { reason, ticket, .. } = dispatched?;
        let instance = Arc::clone(ticket.instance());
        state.metrics.count_decision(self.strategy.name(), &reason);
        let (units, predicted) = (
            u64::from(ticket.info().prompt_units),
            u64::from(ticket.info().predicted_cached_units),
        );
        let mut guard = InFlightGuard::new(Arc::clone(state), ticket, self.api, self.received);
        if home.is_some() {
            guard.teach_usage(false);
        }
        if self.stores_response {
            guard.remember_response_id();
        }
        let stats = guard.stats();
        InstanceStats::bump(&stats.requests);
        if reason.is_overflow() {
            InstanceStats::bump(&stats.overflow);
        }
        if let Some(c) = stats.reasons.get(reason.index()) {
            InstanceStats::bump(c);
        }
        InstanceStats::add(&stats.prompt_units, units);
        InstanceStats::add(&stats.predicted_cached_units, predicted);
        Ok(Routed {
            instance,
            reason: reason.label(),
            guard,
        })
    }

    /// The proxy went to `instance` after `from` could not be reached (the endpoint picker's
    /// fallbacks): a slot on it, without a routing decision (the one made stands, and counts
    /// once), whatever its state now (it answered).
    pub fn moved_to(
        &self,
        state: &Arc<AppState>,
        from: &Instance,
        instance: Arc<Instance>,
    ) -> Routed {
        let reason = Reason::Fallback {
            from: from.id().clone(),
        };
        let label = reason.label();
        let ticket = {
            let req = self.request(state, state.now_s());
            dispatch_to(&self.strategy, &req, Arc::clone(&instance), reason)
        };
        let mut guard = InFlightGuard::new(Arc::clone(state), ticket, self.api, self.received);
        if self.stores_response {
            guard.remember_response_id();
        }
        InstanceStats::bump(&guard.stats().requests);
        Routed {
            instance,
            reason: label,
            guard,
        }
    }

    /// Where the request would go next if `taken` failed, in order, at most `n` instances: the
    /// strategy's choice on what is left, asked again without each choice. Nothing is counted
    /// and no slot is taken (a fallback the proxy does not use costs nothing).
    pub fn fallbacks(
        &self,
        state: &AppState,
        fleet: &FleetSnapshot,
        taken: &Arc<Instance>,
        n: usize,
    ) -> Vec<Arc<Instance>> {
        let req = self.request(state, state.now_s());
        let mut out: Vec<Arc<Instance>> = Vec::with_capacity(n);
        let mut tried = vec![Arc::clone(taken)];
        while out.len() < n {
            let rest = without(fleet, &tried);
            let Ok(d) = with_rng(|rng| self.strategy.select(&req, &rest, rng)) else {
                break;
            };
            let Some(next) = rest.instances().get(d.index).cloned() else {
                break;
            };
            tried.push(Arc::clone(&next));
            out.push(next);
        }
        out
    }
}
