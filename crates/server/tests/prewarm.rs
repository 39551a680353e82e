//! Prewarming over real HTTP on 127.0.0.1: three mock engines warmed by two rounds of 24
//! documents, then a fourth instance joins (as the admin API, DNS or Kubernetes would add it)
//! and a third round follows. Without prewarming the documents rendezvous moves to the new
//! instance miss there; with `[prewarm] enabled` the instance first gets those prompts (one
//! token each) and the hit rate's dip is at least halved.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::StatusCode;
use prefix_router_core::{InstanceSpec, InstanceState, StrategyConfig, StrategyKind};
use prefix_router_mock_engine::DEFAULT_MODEL;
use prefix_router_server::RunningRouter;
use support::*;
use tokio::io::AsyncReadExt;

const DOCS: usize = 24;

fn chat_about(doc: usize, round: usize) -> String {
    let context = format!("document {doc}: ")
        + &format!("section {doc} of the policy says this. ").repeat(160);
    serde_json::json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": format!("{context}\nQuestion {round}?")}],
        "max_tokens": 2
    })
    .to_string()
}

/// Sends documents `0..n` once each (traffic for the hot set).
async fn documents(r: &RunningRouter, n: usize) {
    for doc in 0..n {
        let ans = post(
            r.local_addr(),
            "/v1/chat/completions",
            &[],
            chat_about(doc, 1),
        )
        .await;
        assert_eq!(ans.status, StatusCode::OK);
    }
}

/// Engine-reported cached over prompt tokens of one round, and the instance of each document.
async fn round(r: &RunningRouter, n: usize) -> (f64, Vec<String>) {
    let (mut cached, mut prompt) = (0u64, 0u64);
    let mut homes = Vec::new();
    for doc in 0..DOCS {
        let ans = post(
            r.local_addr(),
            "/v1/chat/completions",
            &[],
            chat_about(doc, n),
        )
        .await;
        assert_eq!(ans.status, StatusCode::OK, "{:?}", ans.body);
        let v = ans.json();
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        homes.push(ans.header("x-prefix-router-instance"));
    }
    (cached as f64 / prompt.max(1) as f64, homes)
}

/// The hit rate's dip after the fourth instance joins, the documents that moved, and the
/// prewarm replays that succeeded.
async fn scale_out(prewarm: bool) -> (f64, usize, f64) {
    let engines = mock_engines(4, 0.05).await;
    // Named, not keyed by their ports: both fleets place every document alike.
    let specs: Vec<InstanceSpec> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| InstanceSpec {
            id: format!("engine-{i}"),
            ..InstanceSpec::from_url(format!("http://{}", e.local_addr()))
        })
        .collect();
    let mut s = settings(&[]);
    s.instances = specs[..3].to_vec();
    s.routing.strategy =
        StrategyConfig::new(StrategyKind::named("prefix-aware").expect("registered"));
    s.prewarm.enabled = prewarm;
    let r = router(s).await;
    round(&r, 1).await;
    let (warm, before) = round(&r, 2).await;
    // The fourth instance joins.
    prefix_router_server::reload::set_members(r.state(), specs.clone()).await;
    let joined = specs[3].id.clone();
    if prewarm {
        // It joins warming, so no request reaches it before its replays (which take at least
        // an engine's answer, far longer than this check).
        let state = r
            .state()
            .fleet
            .snapshot()
            .get(&joined)
            .map(|(_, i)| i.state());
        assert_eq!(state, Some(InstanceState::Warming));
    }
    let state_of = |r: &RunningRouter| {
        r.state()
            .fleet
            .snapshot()
            .get(&joined)
            .map(|(_, i)| i.state())
    };
    eventually("the new instance takes requests", || {
        state_of(&r) == Some(InstanceState::Healthy)
    })
    .await;
    let (after_hit, after) = round(&r, 3).await;
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    assert!(
        after.iter().all(|h| before.contains(h) || *h == joined),
        "{after:?}"
    );
    let replays = metric(
        &metrics_text(r.local_addr()).await,
        "prefix_router_prewarm_replays_total",
        &[("reason", "ok")],
    );
    r.shutdown().await;
    (warm - after_hit, moved, replays)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prewarming_halves_the_dip_when_an_instance_joins() {
    let (cold, moved_cold, none) = scale_out(false).await;
    let (warm, moved_warm, replays) = scale_out(true).await;
    eprintln!(
        "hit-rate dip after the join: {:.1} points without prewarming ({moved_cold} documents moved), {:.1} with ({moved_warm} moved, {replays} replays)",
        100.0 * cold,
        100.0 * warm
    );
    // Instances are named alike in both fleets: rendezvous moves the same documents.
    assert!(
        moved_cold >= 2 && moved_warm == moved_cold,
        "{moved_cold} / {moved_warm}"
    );
    assert_eq!(none, 0.0);
    assert!(
        replays >= moved_warm as f64,
        "every moved document was replayed: {replays}"
    );
    assert!(cold > 0.05, "a join without prewarming dips: {cold}");
    assert!(
        warm <= cold / 2.0,
        "dip {warm} with prewarming against {cold} without"
    );
}

/// A joining instance that answers its replays with an error (the model not loaded yet) teaches
/// the strategy nothing about its speed: the replays are failures, never first tokens.
#[tokio::test]
async fn replays_answered_with_an_error_are_no_first_tokens() {
    use prefix_router_core::strategies::recording::{Call, Pick, Recording};
    use prefix_router_core::Feedback;
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Status(404), &[]).await;
    let mut s = settings(&[a.url()]);
    s.prewarm.enabled = true;
    let r = router(s).await;
    documents(&r, 4).await;
    // From here every request (and the plan) goes to the last instance: the joining one.
    let recorder = std::sync::Arc::new(Recording::new(Pick::Last));
    let current = r.state().routing.load_full();
    r.state().routing.store(std::sync::Arc::new(
        prefix_router_server::routing::Routing {
            config: current.config.clone(),
            prefix_length: current.prefix_length,
            strategy: recorder.clone(),
        },
    ));
    let specs = vec![
        InstanceSpec::from_url(a.url()),
        InstanceSpec::from_url(b.url()),
    ];
    prefix_router_server::reload::set_members(r.state(), specs).await;
    let b_url = b.url();
    let warming = |r: &RunningRouter| {
        r.state()
            .fleet
            .snapshot()
            .get(&b_url)
            .map(|(_, i)| i.state())
            == Some(InstanceState::Warming)
    };
    eventually("the replays ended", || !warming(&r)).await;
    let failed = metric(
        &metrics_text(r.local_addr()).await,
        "prefix_router_prewarm_replays_total",
        &[("reason", "failed")],
    );
    assert!(failed >= 1.0, "{failed}");
    let told: Vec<Feedback> = recorder
        .take()
        .into_iter()
        .filter_map(|c| match c {
            Call::Feedback {
                instance, event, ..
            } if instance.as_str() == b.url() => Some(event),
            _ => None,
        })
        .collect();
    assert!(!told.is_empty(), "no replay was told");
    assert!(told.iter().all(|e| *e == Feedback::Failed), "{told:?}");
    r.shutdown().await;
}

/// When no member takes requests (a Recreate rollout replaces every engine at once, a scale-up
/// from zero), newcomers are not held back to warm: that kept the whole fleet unroutable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_replaced_at_once_is_not_held_back_to_warm() {
    let old = Upstream::start("old", Mode::Echo, &[]).await;
    let new = Upstream::start("new", Mode::Echo, &[]).await;
    let mut s = settings(&[old.url()]);
    s.prewarm.enabled = true;
    let r = router(s).await;
    documents(&r, 4).await;
    // Every engine is replaced in one edit (a reload, a DNS round that swaps every address).
    prefix_router_server::reload::set_members(r.state(), vec![InstanceSpec::from_url(new.url())])
        .await;
    let state = r
        .state()
        .fleet
        .snapshot()
        .get(&new.url())
        .map(|(_, i)| i.state());
    assert_ne!(state, Some(InstanceState::Warming));
    let ans = post(
        r.local_addr(),
        "/v1/chat/completions",
        &[],
        chat_about(0, 2),
    )
    .await;
    assert_eq!(ans.status, StatusCode::OK);
    assert_eq!(ans.upstream(), "new");
    r.shutdown().await;
}

/// An instance drained while it warms gets no more replays, and those under way are let go
/// (a terminating pod took every replay left, and its drain as long).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_while_warming_ends_the_warm_up() {
    let old = Upstream::start("old", Mode::Echo, &[]).await;
    let (new, asked, gone) = silent_engine().await;
    let r = warming_beside(&old, &new).await;
    eventually("replays under way", || asked.load(Ordering::SeqCst) == 2).await;
    drain(&r, &new, InstanceState::Warming);
    eventually("the replays under way let go", || {
        gone.load(Ordering::SeqCst) == 2
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(asked.load(Ordering::SeqCst), 2, "no replay after the drain");
    r.shutdown().await;
}

/// A one-replica rolling update: the new pod joins and warms while the old one serves, then the
/// old one drains. Its prompts have no home left to stay on: the warm-up ends, and the new pod
/// takes requests instead of the fleet answering 503 until the budget runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_ends_when_no_other_member_takes_requests() {
    let old = Upstream::start("old", Mode::Echo, &[]).await;
    let (new, asked, _) = silent_engine().await;
    let r = warming_beside(&old, &new).await;
    eventually("replays under way", || asked.load(Ordering::SeqCst) == 2).await;
    drain(&r, &old.url(), InstanceState::Healthy);
    let state_of = |r: &RunningRouter| r.state().fleet.snapshot().get(&new).map(|(_, i)| i.state());
    eventually("the new member takes requests", || {
        state_of(&r) == Some(InstanceState::Healthy)
    })
    .await;
    r.shutdown().await;
}

/// Drains the member `url`, which is in state `from` (as the admin API's drain does).
fn drain(r: &RunningRouter, url: &str, from: InstanceState) {
    let snapshot = r.state().fleet.snapshot();
    let inst = snapshot
        .get(url)
        .map(|(_, i)| Arc::clone(i))
        .expect("member");
    assert!(prefix_router_server::membership::transition(
        r.state(),
        &inst,
        &[from],
        InstanceState::Draining
    ));
}

/// An engine that takes each request and never answers: its URL, the requests it was sent, and
/// how many of their connections were closed.
async fn silent_engine() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (asked, gone) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let url = raw_engine({
        let (asked, gone) = (Arc::clone(&asked), Arc::clone(&gone));
        move |mut s| {
            let (asked, gone) = (Arc::clone(&asked), Arc::clone(&gone));
            async move {
                let mut buf = [0u8; 65536];
                let mut counted = false;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) if !counted => {
                            counted = true;
                            asked.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(_) => {}
                    }
                }
                if counted {
                    gone.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    })
    .await;
    (url, asked, gone)
}

/// A router with prewarming (two replays at a time) over `old`, which serves a round of
/// documents; then `new` joins and starts warming.
async fn warming_beside(old: &Upstream, new: &str) -> RunningRouter {
    let mut s = settings(&[old.url()]);
    s.prewarm.enabled = true;
    s.prewarm.concurrency = 2;
    let r = router(s).await;
    documents(&r, DOCS).await;
    let specs = vec![
        InstanceSpec::from_url(old.url()),
        InstanceSpec::from_url(new.to_string()),
    ];
    prefix_router_server::reload::set_members(r.state(), specs).await;
    r
}
