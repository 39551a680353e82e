//! Prewarming instances that join (`[prewarm] enabled = true`).
//!
//! The proxy counts each keyed request's prompt in [`HotPrefixes`] (its body kept as the example
//! to replay; `Bytes`, so no copy). When an instance joins (admin API, DNS, Kubernetes), it is
//! set to warming before anything is routed to it, and a task plans with the strategy in force
//! which of the hottest prompts would move to it ([`prefix_router_core::prewarm::plan`]),
//! replays each once with `max_tokens: 1` (a few at a time, within the time budget, each through
//! a ticket so that `cache-aware` learns what the instance now holds), and then lets it take its
//! share: healthy when a replay succeeded (the engine answers), else back to where a new member
//! starts (health checks decide). Until then the prompts that will move stay on their old homes.
//!
//! Only OpenAI chat and completion requests are replayed: their answer can be cut to one token.
//! The native API's body is opaque to the router.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use http_body_util::BodyExt;
use prefix_router_core::prewarm::{plan, HotPrefixes, PrewarmConfig};
use prefix_router_core::{
    dispatch_to, End, Instance, InstanceId, InstanceState, KeyHash, Reason, RouteRequest,
};
use tokio::sync::mpsc;

use crate::membership;
use crate::metrics::ReasonLabels;
use crate::pick::{Api, Prepared};
use crate::routing::with_rng;
use crate::state::AppState;
use crate::usage::UsageScanner;

/// A request to replay.
#[derive(Debug, Clone)]
pub struct Example {
    api: Api,
    body: Bytes,
}

/// The proxy's hot prompts and the queue of instances to warm.
#[derive(Debug)]
pub struct Prewarm {
    config: PrewarmConfig,
    hot: Mutex<HotPrefixes<Example>>,
    joins: mpsc::UnboundedSender<InstanceId>,
    queue: Mutex<Option<mpsc::UnboundedReceiver<InstanceId>>>,
}

impl Prewarm {
    /// Prewarming with `config`.
    pub fn new(config: PrewarmConfig) -> Self {
        let (joins, rx) = mpsc::unbounded_channel();
        Self {
            config,
            hot: Mutex::new(HotPrefixes::new(
                config.tracked,
                config.half_life_s,
                config.max_bytes,
            )),
            joins,
            queue: Mutex::new(Some(rx)),
        }
    }

    /// Counts a proxied request (chat and completions only: those can be replayed).
    pub fn record(&self, api: Api, key: Option<KeyHash>, now: f64, body: &Bytes) {
        let (Some(key), Api::Chat | Api::Completions) = (key, api) else {
            return;
        };
        // A copy: the request's body may be a slice of a larger read buffer, which a clone
        // would keep whole, past what the byte budget counts.
        let example = Example {
            api,
            body: Bytes::copy_from_slice(body),
        };
        self.hot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(key, now, example, body.len());
    }

    /// Whether any prompt was seen: before that (the instances found at start) there is
    /// nothing to replay, and instances join as they would without prewarming.
    pub fn has_traffic(&self) -> bool {
        !self
            .hot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// `inst` just joined (warming, as [`crate::reload::edit_members`] adds it): it is warmed
    /// before it takes anything, if `warm` (some other member takes requests meanwhile).
    pub fn joined(&self, state: &AppState, inst: &Instance, warm: bool) {
        let warming = inst.state() == InstanceState::Warming
            || (warm
                && self.has_traffic()
                && membership::transition(
                    state,
                    inst,
                    &[InstanceState::Unknown, InstanceState::Healthy],
                    InstanceState::Warming,
                ));
        if warming {
            let _ = self.joins.send(inst.id().clone());
        }
    }
}

/// Warms the instances that join (each on its own task), until aborted.
pub async fn run(state: Arc<AppState>) {
    let Some(p) = state.prewarm.as_ref() else {
        return;
    };
    let Some(mut joins) = p.queue.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    while let Some(id) = joins.recv().await {
        // Each joining instance warms on its own: a scale-out of several must not queue them.
        let state = Arc::clone(&state);
        tokio::spawn(async move { warm(&state, &id).await });
    }
}

/// `body` with `max_tokens: 1` and no streaming: the prefill is what warms the cache. What
/// would contradict one token goes: vLLM refuses `min_tokens` above `max_tokens` (400), and
/// `ignore_eos` or several choices (`n`, `best_of`) only cost decode steps.
fn one_token(body: &[u8]) -> Option<Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let o = v.as_object_mut()?;
    o.insert("max_tokens".into(), 1.into());
    for extra in [
        "max_completion_tokens",
        "min_tokens",
        "ignore_eos",
        "n",
        "best_of",
    ] {
        o.remove(extra);
    }
    o.insert("stream".into(), false.into());
    o.remove("stream_options");
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// Replays one example to `inst`; true when the engine answered 2xx. Owns what it uses: the
/// replays run as tasks.
async fn replay(
    state: Arc<AppState>,
    inst: Arc<Instance>,
    prepared: Prepared,
    body: Bytes,
) -> bool {
    let path = prepared.api.path().unwrap_or("/v1/completions");
    let (mut parts, ()) = http::Request::new(()).into_parts();
    parts.method = http::Method::POST;
    parts.uri = http::Uri::from_static(path);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let mut ticket = {
        // One token, asked unstreamed: the answer's head comes when the prefill ends, so it
        // stands for the first token whatever the example asked.
        let route = RouteRequest {
            whole_answer: false,
            ..prepared.request(&state, state.now_s())
        };
        dispatch_to(
            &prepared.strategy,
            &route,
            Arc::clone(&inst),
            Reason::Prewarm,
        )
    };
    let sent = tokio::time::timeout(
        state.settings.timeouts.first_byte,
        state.client.send(&inst.spec().url, &parts, &body),
    )
    .await;
    let Ok(Ok(resp)) = sent else {
        ticket.finish(End::Failed, state.now_s());
        return false;
    };
    // An error's head is no first token: a 404 from an engine that has not loaded the model
    // yet would teach the strategy that this instance prefills for free.
    let ok = resp.status().is_success();
    if ok {
        ticket.first_token(state.now_s());
    }
    let mut scanner = UsageScanner::new();
    let mut body = resp.into_body();
    // One token: the body follows the head at once. One that breaks or never ends is a
    // failure, not an answer.
    let read = tokio::time::timeout(state.settings.timeouts.idle_stream, async {
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame.ok()?.data_ref() {
                scanner.feed(data);
            }
        }
        Some(())
    })
    .await;
    let ok = ok && matches!(read, Ok(Some(())));
    let end = if ok {
        End::Finished {
            usage: scanner.finish(),
        }
    } else {
        End::Failed
    };
    ticket.finish(end, state.now_s());
    ok
}

/// How often a warm-up looks whether its instance is still warming.
const WATCH: std::time::Duration = std::time::Duration::from_millis(100);

/// Plans and replays for instance `id`, then lets it take its share.
async fn warm(state: &Arc<AppState>, id: &InstanceId) {
    let Some(p) = state.prewarm.as_ref() else {
        return;
    };
    let started = Instant::now();
    let snapshot = state.fleet.snapshot();
    let Some((_, inst)) = snapshot.get(id.as_str()) else {
        return;
    };
    let inst = Arc::clone(inst);
    // The examples, hottest first, read as the proxy reads a request.
    let now = state.now_s();
    let examples: Vec<Example> = p
        .hot
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .hottest(now)
        .into_iter()
        // Enough candidates for the plan (with hashing, about one in N+1 moves), without
        // parsing every tracked body.
        .take(
            p.config
                .max_prefixes
                .saturating_mul(snapshot.len() + 1)
                .saturating_mul(2),
        )
        .map(|(_, e)| e.clone())
        .collect();
    // Read on the blocking pool: a parse per candidate (and a tokenization under kv-aware) is
    // milliseconds each for long prompts, seconds for a plan, which a runtime worker would
    // spend away from every connection it serves.
    let read = {
        let st = Arc::clone(state);
        tokio::task::spawn_blocking(move || {
            examples
                .into_iter()
                .filter_map(|e| {
                    Prepared::new(&st, e.api, &HeaderMap::new(), &e.body, Instant::now())
                        .ok()
                        .map(|p| (p, e))
                })
                .collect::<Vec<(Prepared, Example)>>()
        })
        .await
        // A panic while reading them: nothing to plan, the instance joins as without.
        .unwrap_or_default()
    };
    let (read, examples): (Vec<Prepared>, Vec<Example>) = read.into_iter().unzip();
    let prepared: Vec<(usize, Prepared, &Example)> = read
        .into_iter()
        .zip(examples.iter())
        .enumerate()
        .map(|(i, (pr, e))| (i, pr, e))
        .collect();
    let strategy = Arc::clone(&state.routing.load().strategy);
    let picked: Vec<usize> = with_rng(|rng| {
        plan(
            prepared.iter(),
            p.config.max_prefixes,
            &strategy,
            &snapshot,
            id,
            rng,
            |(_, pr, _)| Some(pr.request(state, now)),
        )
        .into_iter()
        .map(|(i, _, _)| *i)
        .collect()
    });
    let planned = picked.len();
    // Rewritten for one token: the picked ones only (each is a parse and a serialisation).
    let mut slots: Vec<Option<(Prepared, &Example)>> = prepared
        .into_iter()
        .map(|(_, pr, e)| Some((pr, e)))
        .collect();
    let mut queue: VecDeque<(Prepared, Bytes)> = picked
        .into_iter()
        .filter_map(|i| slots.get_mut(i).and_then(Option::take))
        .filter_map(|(pr, e)| one_token(&e.body).map(|b| (pr, b)))
        .collect();
    let deadline =
        tokio::time::Instant::now() + std::time::Duration::from_secs_f64(p.config.budget_s);
    let mut tasks = tokio::task::JoinSet::new();
    let (mut ok, mut done) = (0u64, 0u64);
    // Still warming, and still this member: a drain, a removal or an ejection meanwhile ends
    // the warm-up (a terminating pod got every replay left, and its drain took that long).
    let warming = || inst.state() == InstanceState::Warming && membership::is_member(state, &inst);
    // Another member takes requests: else the prompts have no old home to stay on (the others
    // drained or left meanwhile, as in a one-replica rolling update), and this one takes them
    // now rather than the fleet answering 503 until the budget runs out.
    let others = || {
        state
            .fleet
            .snapshot()
            .eligible(None)
            .any(|(_, m)| !m.same_member(&inst))
    };
    loop {
        if !warming() || !others() {
            tasks.abort_all();
            break;
        }
        while tasks.len() < p.config.concurrency.max(1) {
            let Some((pr, body)) = queue.pop_front() else {
                break;
            };
            tasks.spawn(replay(Arc::clone(state), Arc::clone(&inst), pr, body));
        }
        // Looked at again every so often, so that a drain does not wait for a replay to end.
        let look = (tokio::time::Instant::now() + WATCH).min(deadline);
        match tokio::time::timeout_at(look, tasks.join_next()).await {
            Ok(Some(r)) => {
                done += 1;
                ok += u64::from(r.unwrap_or(false));
            }
            Ok(None) => break,
            Err(_) if tokio::time::Instant::now() < deadline => {}
            Err(_) => {
                // Out of time: it takes its share now; replays in flight are given up.
                tasks.abort_all();
                break;
            }
        }
    }
    let m = &state.metrics.prewarm_replays;
    m.get_or_create(&ReasonLabels { reason: "ok" }).inc_by(ok);
    m.get_or_create(&ReasonLabels { reason: "failed" })
        .inc_by(done - ok);
    // Healthy when the engine answered; else where any new member starts.
    let to = if ok > 0 {
        InstanceState::Healthy
    } else {
        state.settings.health.joins_as()
    };
    membership::transition(state, &inst, &[InstanceState::Warming], to);
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(instance = %id, planned, replayed = ok, ms, "prewarmed; taking requests");
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_replay_asks_for_one_token_without_streaming() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":500,"min_tokens":32,"n":2}"#;
        let out = super::one_token(body).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        assert!(v.get("max_completion_tokens").is_none());
        // vLLM answers 400 to min_tokens above max_tokens.
        assert!(v.get("min_tokens").is_none() && v.get("n").is_none());
        assert_eq!(v["messages"][0]["content"], "hi");
        assert!(super::one_token(b"not json").is_none());
    }

    /// The proxy's bodies count against `max_bytes` by their length.
    #[test]
    fn the_kept_bodies_stay_within_max_bytes() {
        use prefix_router_core::KeyHash;
        let config = prefix_router_core::prewarm::PrewarmConfig {
            max_bytes: 1000,
            ..Default::default()
        };
        let p = super::Prewarm::new(config);
        let body = bytes::Bytes::from(vec![b'x'; 400]);
        for k in 0..5u64 {
            p.record(super::Api::Chat, Some(KeyHash(k)), 0.0, &body);
        }
        let hot = p.hot.lock().unwrap_or_else(|e| e.into_inner());
        assert!(hot.bytes() <= 1000 && hot.bytes() > 0, "{}", hot.bytes());
        assert_eq!(hot.bytes(), 400 * hot.len());
    }
}
